//! MSK IAM tokens in tests: the example credentials they are signed with, credentials
//! that count how often they are asked for, a clock the test moves by hand, and an
//! independent check of a token (its URL decoded, its SigV4 signature recomputed from the
//! spec on `ring`, without `aws-sigv4`). The signer's tests (`tests/msk_iam.rs`) check
//! their tokens with it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{future, ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use dynamo_outbox::protocol::clock::{ticks_from_system_time, Clock, TICKS_PER_SECOND};

/// A clock the test moves by hand (for [`MskIamTokenProvider::with_clock`], or a store's).
///
/// [`MskIamTokenProvider::with_clock`]: dynamo_outbox::publish::MskIamTokenProvider::with_clock
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `t`.
    pub fn at(t: SystemTime) -> Arc<Self> {
        Arc::new(ManualClock(AtomicI64::new(ticks_from_system_time(t))))
    }

    /// Moves the clock `d` ahead (whole seconds).
    pub fn advance(&self, d: Duration) {
        self.0
            .fetch_add(d.as_secs() as i64 * TICKS_PER_SECOND, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ticks(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Credentials that count how often the provider asks for them (once per signed token).
#[derive(Debug)]
struct CountingCredentials {
    credentials: Credentials,
    calls: Arc<AtomicUsize>,
}

impl ProvideCredentials for CountingCredentials {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        self.calls.fetch_add(1, Ordering::SeqCst);
        future::ProvideCredentials::ready(Ok(self.credentials.clone()))
    }
}

/// A provider of `credentials` that counts the calls, and the count.
pub fn counting(credentials: Credentials) -> (SharedCredentialsProvider, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let provider = SharedCredentialsProvider::new(CountingCredentials {
        credentials,
        calls: Arc::clone(&calls),
    });
    (provider, calls)
}

/// The SigV4 suite's example access key id.
pub const ACCESS_KEY: &str = "AKIDEXAMPLE";
/// The SigV4 suite's example secret key.
pub const SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
/// A session token with characters to encode (`/`, `+`, `=`).
pub const SESSION_TOKEN: &str = "IQoJb3JpZ2luX2Vj/session+token=";

/// The example credentials, with the session token.
pub fn static_credentials() -> Credentials {
    Credentials::new(
        ACCESS_KEY,
        SECRET_KEY,
        Some(SESSION_TOKEN.into()),
        None,
        "test",
    )
}

fn decode_query(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A decoded token: the URL's host and path, and its query parameters in order.
#[derive(Debug)]
pub struct DecodedToken {
    /// The whole URL.
    pub url: String,
    /// Its host.
    pub host: String,
    /// Its path.
    pub path: String,
    /// Its query parameters, decoded, in order.
    pub params: Vec<(String, String)>,
}

impl DecodedToken {
    /// The value of the query parameter `name`; panics when there is none.
    pub fn param(&self, name: &str) -> &str {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} missing from {}", self.url))
    }
}

/// Decodes a token (unpadded base64url of a URL); panics when it is none.
pub fn decode_token(token: &str) -> DecodedToken {
    assert!(!token.contains('='), "padding in {token}");
    assert!(
        !token.contains('+') && !token.contains('/'),
        "not base64url: {token}"
    );
    let url = String::from_utf8(URL_SAFE_NO_PAD.decode(token).unwrap()).unwrap();
    let rest = url.strip_prefix("https://").expect("https url");
    let (authority, path_query) = rest.split_at(rest.find('/').unwrap());
    let (path, query) = path_query.split_once('?').unwrap();
    let params = query
        .split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (decode_query(k), decode_query(v))
        })
        .collect();
    DecodedToken {
        host: authority.to_owned(),
        path: path.to_owned(),
        params,
        url,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&key, data.as_bytes()).as_ref().to_vec()
}

/// SigV4's URI encoding: everything but RFC 3986's unreserved characters.
pub fn sigv4_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Checks a token the way a SigV4 verifier would, independently of `aws-sigv4`: rebuilds
/// the canonical request from the URL (all parameters but the signature and the unsigned
/// `User-Agent`), and recomputes the signature with `secret` (from the SigV4 spec).
pub fn verify_token(token: &str, region: &str, secret: &str, now: SystemTime) {
    let t = decode_token(token);
    assert_eq!(t.host, format!("kafka.{region}.amazonaws.com"));
    assert_eq!(t.path, "/");
    assert_eq!(t.param("Action"), "kafka-cluster:Connect");
    assert_eq!(t.param("X-Amz-Algorithm"), "AWS4-HMAC-SHA256");
    assert_eq!(t.param("X-Amz-SignedHeaders"), "host");
    assert!(!t.param("User-Agent").is_empty(), "{}", t.url);
    let expires: u64 = t.param("X-Amz-Expires").parse().unwrap();
    assert!(expires > 0 && expires <= 900, "expires {expires}");
    let date = t.param("X-Amz-Date");
    let signed = parse_amz_date(date);
    assert!(
        signed <= now && now < signed + Duration::from_secs(expires),
        "token signed at {date} is not valid now"
    );
    let day = &date[..8];
    let credential = t.param("X-Amz-Credential");
    let scope = format!("{day}/{region}/kafka-cluster/aws4_request");
    let (_, cred_scope) = credential.split_once('/').unwrap();
    assert_eq!(cred_scope, scope);

    let mut canonical: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in &t.params {
        if k != "X-Amz-Signature" && k != "User-Agent" {
            canonical.insert(sigv4_encode(k), sigv4_encode(v));
        }
    }
    let query: Vec<String> = canonical.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let empty_hash = hex(ring::digest::digest(&ring::digest::SHA256, b"").as_ref());
    let canonical_request = format!(
        "GET\n/\n{}\nhost:{}\n\nhost\n{empty_hash}",
        query.join("&"),
        t.host
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        hex(ring::digest::digest(&ring::digest::SHA256, canonical_request.as_bytes()).as_ref())
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), day);
    let k_region = hmac(&k_date, region);
    let k_service = hmac(&k_region, "kafka-cluster");
    let k_signing = hmac(&k_service, "aws4_request");
    let expected = hex(&hmac(&k_signing, &string_to_sign));
    assert_eq!(
        t.param("X-Amz-Signature"),
        expected,
        "signature of {}",
        t.url
    );
}

fn parse_amz_date(d: &str) -> SystemTime {
    assert_eq!(d.len(), 16, "{d}");
    let n = |r: std::ops::Range<usize>| d[r].parse::<u64>().unwrap();
    let (y, mo, day, h, mi, s) = (n(0..4), n(4..6), n(6..8), n(9..11), n(11..13), n(13..15));
    // days from civil (Howard Hinnant's algorithm)
    let (y, mo) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    SystemTime::UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3600 + mi * 60 + s)
}
