//! The MSK IAM signer and its token provider, on the public API
//! ([`MskIamTokenProvider`]): what a token is (a presigned `kafka-cluster:Connect` URL,
//! checked against AWS's own signer's vector and by an independent SigV4 recomputation,
//! `outbox_testkit::msk_iam`), and when the provider signs again. No stack needed.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use dynamo_outbox::publish::MskIamTokenProvider;
use outbox_testkit::msk_iam::{
    counting, decode_token, sigv4_encode, static_credentials, verify_token, ManualClock,
    ACCESS_KEY, SECRET_KEY, SESSION_TOKEN,
};

/// A token for `region` signed now with `credentials`, as a relay's provider signs it.
async fn sign(region: &str, credentials: &Credentials) -> dynamo_outbox::Result<String> {
    MskIamTokenProvider::new(region, SharedCredentialsProvider::new(credentials.clone()))
        .token()
        .await
}

/// 2024-01-02T03:04:05Z
fn fixed_time() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_164_645)
}

/// The signer's `User-Agent`, appended after signing.
const SIGNER_USER_AGENT: &str = "aws-msk-iam-sasl-signer-rs/";

/// The SigV4 day and timestamp of `t`, as `X-Amz-Date` and the credential scope write them.
fn amz_date(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .unwrap()
        .format("%Y%m%dT%H%M%SZ")
        .to_string()
}

#[tokio::test]
async fn token_is_a_presigned_connect_url() {
    let before = SystemTime::now();
    let token = sign("eu-west-1", &static_credentials()).await.unwrap();
    let t = decode_token(&token);
    let date = t.param("X-Amz-Date").to_owned();
    assert!(
        date >= amz_date(before) && date <= amz_date(SystemTime::now()),
        "signed now: {date}"
    );
    assert_eq!(
        t.param("X-Amz-Credential"),
        format!(
            "AKIDEXAMPLE/{}/eu-west-1/kafka-cluster/aws4_request",
            &date[..8]
        )
    );
    assert_eq!(t.param("X-Amz-Expires"), "900");
    assert_eq!(t.param("X-Amz-Security-Token"), SESSION_TOKEN);
    assert_eq!(t.params[0].0, "Action", "Action comes first: {}", t.url);
    assert_eq!(t.params.last().unwrap().0, "User-Agent");
    assert!(t.param("User-Agent").starts_with(SIGNER_USER_AGENT));
    assert!(t
        .url
        .starts_with("https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"));
    verify_token(&token, "eu-west-1", SECRET_KEY, SystemTime::now());
}

/// The reference token, made by AWS's own signer library: region `eu-west-1`, the
/// SigV4 suite's example keys, session token `session/token+value=` (a `/`, a `+` and a
/// `=` to encode), signed at 2025-12-01T00:00:00Z. Made with
/// aws-msk-iam-sasl-signer-python 1.0.2 (botocore 1.44.8):
/// `generate_auth_token_from_credentials_provider("eu-west-1", provider)` with
/// `botocore.auth.get_current_datetime` patched to return that time.
const AWS_VECTOR_URL: &str = "https://kafka.eu-west-1.amazonaws.com/\
    ?Action=kafka-cluster%3AConnect&X-Amz-Algorithm=AWS4-HMAC-SHA256\
    &X-Amz-Credential=AKIDEXAMPLE%2F20251201%2Feu-west-1%2Fkafka-cluster%2Faws4_request\
    &X-Amz-Date=20251201T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host\
    &X-Amz-Security-Token=session%2Ftoken%2Bvalue%3D\
    &X-Amz-Signature=0894acd9c82e695ea6fe4a908cb9567a4bd10cddf3969eed96a9f3dbf88a7ddd\
    &User-Agent=aws-msk-iam-sasl-signer-python%2F1.0.2";
const AWS_VECTOR_SESSION_TOKEN: &str = "session/token+value=";
const AWS_VECTOR_SIGNATURE: &str =
    "0894acd9c82e695ea6fe4a908cb9567a4bd10cddf3969eed96a9f3dbf88a7ddd";

/// 2025-12-01T00:00:00Z
fn aws_vector_time() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_547_200)
}

fn aws_vector_credentials() -> Credentials {
    Credentials::new(
        ACCESS_KEY,
        SECRET_KEY,
        Some(AWS_VECTOR_SESSION_TOKEN.into()),
        None,
        "test",
    )
}

#[test]
fn the_verifier_reproduces_the_aws_signer_vector() {
    // The independent verifier (SigV4 from its spec, on ring) recomputes AWS's signature
    // of the vector: what it accepts below is signed as AWS's signer signs.
    let token = URL_SAFE_NO_PAD.encode(AWS_VECTOR_URL);
    let t = decode_token(&token);
    assert_eq!(t.param("X-Amz-Signature"), AWS_VECTOR_SIGNATURE);
    assert_eq!(t.param("X-Amz-Security-Token"), AWS_VECTOR_SESSION_TOKEN);
    verify_token(&token, "eu-west-1", SECRET_KEY, aws_vector_time());
    // and it refuses the vector with one signed byte changed
    let tampered = AWS_VECTOR_URL.replace("X-Amz-Expires=900", "X-Amz-Expires=899");
    let refused = std::panic::catch_unwind(|| {
        verify_token(
            &URL_SAFE_NO_PAD.encode(tampered),
            "eu-west-1",
            SECRET_KEY,
            aws_vector_time(),
        )
    });
    assert!(refused.is_err(), "a changed signed parameter passed");
}

#[tokio::test]
async fn the_signer_signs_as_the_aws_signer_vector() {
    // The signer takes no signing time (it reads the system clock), so the vector is pinned
    // in two steps: the token it makes now is the vector's URL, parameter for parameter
    // and byte for byte, but for the time (X-Amz-Date, the credential scope's day), the
    // signature of that time and the User-Agent; and its signature of that time is what the verifier above, which
    // reproduces the vector's signature, computes. (Under `faketime '2025-12-01
    // 00:00:00Z'` the signer makes the vector's signature itself: BENCHMARKS.md, "MSK IAM signer".)
    let token = sign("eu-west-1", &aws_vector_credentials()).await.unwrap();
    let t = decode_token(&token);
    let date = t.param("X-Amz-Date");
    let expected = AWS_VECTOR_URL
        .replace("20251201T000000Z", date)
        .replace("%2F20251201%2F", &format!("%2F{}%2F", &date[..8]))
        .replace(AWS_VECTOR_SIGNATURE, t.param("X-Amz-Signature"))
        .replace(
            "aws-msk-iam-sasl-signer-python%2F1.0.2",
            &sigv4_encode(t.param("User-Agent")),
        );
    // Same parameters, values and encoding; aws-sigv4 puts the signature before the
    // session token, botocore after it (a query's order is not signed): Action first and
    // User-Agent last in both.
    let encoded = |url: &str| {
        let (base, query) = url.split_once('?').unwrap();
        let mut params: Vec<String> = query.split('&').map(String::from).collect();
        let first_and_last = (params[0].clone(), params[params.len() - 1].clone());
        params.sort();
        (base.to_owned(), first_and_last, params)
    };
    assert_eq!(encoded(&t.url), encoded(&expected), "{}", t.url);
    assert!(t.param("User-Agent").starts_with(SIGNER_USER_AGENT));
    verify_token(&token, "eu-west-1", SECRET_KEY, SystemTime::now());
}

#[tokio::test]
async fn token_without_session_token() {
    let creds = Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test");
    let token = sign("us-east-1", &creds).await.unwrap();
    let t = decode_token(&token);
    assert!(t.params.iter().all(|(k, _)| k != "X-Amz-Security-Token"));
    verify_token(&token, "us-east-1", SECRET_KEY, SystemTime::now());
}

#[tokio::test]
async fn a_region_that_is_no_region_name_is_refused() {
    for region in ["", "eu west 1", "EU-WEST-1", "eu-west-1.evil.example/", "é"] {
        let err = sign(region, &static_credentials())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("region") && err.contains("lowercase letters"),
            "{region:?}: {err}"
        );
    }
}

#[tokio::test]
async fn provider_caches_until_the_refresh_point() {
    // The provider's clock decides when to sign again; each signing asks for credentials.
    let clock = ManualClock::at(fixed_time());
    let (credentials, signings) = counting(static_credentials());
    let provider = MskIamTokenProvider::new("eu-west-1", credentials).with_clock(clock.clone());
    let first = provider.token().await.unwrap();
    assert_eq!(signings.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(719));
    assert_eq!(provider.token().await.unwrap(), first);
    assert_eq!(signings.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(1));
    let second = provider.token().await.unwrap();
    assert_eq!(signings.load(Ordering::SeqCst), 2);
    verify_token(&second, "eu-west-1", SECRET_KEY, SystemTime::now());
    let debug = format!("{provider:?}");
    assert!(
        !debug.contains(&second) && !debug.contains(SECRET_KEY),
        "{debug}"
    );
}

#[tokio::test]
async fn provider_respects_credential_expiry() {
    let clock = ManualClock::at(fixed_time());
    let (credentials, signings) = counting(Credentials::new(
        ACCESS_KEY,
        SECRET_KEY,
        Some(SESSION_TOKEN.into()),
        Some(fixed_time() + Duration::from_secs(300)),
        "test",
    ));
    let provider = MskIamTokenProvider::new("eu-west-1", credentials).with_clock(clock.clone());
    let first = provider.token().await.unwrap();
    clock.advance(Duration::from_secs(239));
    assert_eq!(provider.token().await.unwrap(), first);
    assert_eq!(signings.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(1));
    provider.token().await.unwrap();
    assert_eq!(signings.load(Ordering::SeqCst), 2);
}
