//! For tests: the example credentials MSK IAM tokens are signed with in tests, and an
//! independent check of such a token (its URL decoded, its SigV4 signature recomputed
//! from the spec on `ring`, without `aws-sigv4`). The signer's tests (`msk_iam.rs`) check
//! their tokens with it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// The SigV4 suite's example access key id.
pub(crate) const ACCESS_KEY: &str = "AKIDEXAMPLE";
/// The SigV4 suite's example secret key.
pub(crate) const SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
/// A session token with characters to encode (`/`, `+`, `=`).
pub(crate) const SESSION_TOKEN: &str = "IQoJb3JpZ2luX2Vj/session+token=";

/// The example credentials, with the session token.
pub(crate) fn static_credentials() -> Credentials {
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
pub(crate) struct DecodedToken {
    pub(crate) url: String,
    pub(crate) host: String,
    pub(crate) path: String,
    pub(crate) params: Vec<(String, String)>,
}

impl DecodedToken {
    pub(crate) fn param(&self, name: &str) -> &str {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} missing from {}", self.url))
    }
}

pub(crate) fn decode_token(token: &str) -> DecodedToken {
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
pub(crate) fn sigv4_encode(s: &str) -> String {
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
pub(crate) fn verify_token(token: &str, region: &str, secret: &str, now: SystemTime) {
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
