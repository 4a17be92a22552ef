//! Amazon MSK IAM authentication: the SASL/OAUTHBEARER token and its cache.
//!
//! The token is signed by [`aws_msk_iam_sasl_signer`], the Rust port of AWS's
//! `aws-msk-iam-sasl-signer` libraries (docs/design.md, "The MSK IAM token", says why this
//! crate; BENCHMARKS.md, "MSK IAM signer", what it was measured against): a SigV4 query-presigned
//! `GET https://kafka.{region}.amazonaws.com/?Action=kafka-cluster%3AConnect` (service
//! `kafka-cluster`, signed header `host`, `X-Amz-Expires=900`, the session token signed in
//! the query), with a `User-Agent` parameter appended after signing, the whole URL encoded
//! base64url without padding. The client sends it as `n,,\x01auth=Bearer <token>\x01\x01`.
//! The signer reads the system clock itself (it takes no signing time); the tests pin its
//! output to AWS's signer's vector through an independent verifier (see the tests module).
//!
//! rskafka asks [`MskIamTokenProvider::token`] for a token each time it opens a connection;
//! the provider signs a new one when the cached one has used 80 % of its life (or has less
//! than a minute left), so a fresh connection always gets minutes of validity. rskafka does
//! not re-authenticate open connections (KIP-368): when the session of a connection ends,
//! the broker closes it on the next request, and rskafka reconnects (with a new token) and
//! retries that request.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::Region;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use tokio::sync::Mutex;

use crate::clock::{system_time_from_ticks, Clock, SystemClock};
use crate::error::{Error, Result};

/// How long a token is valid after signing (the signers' `X-Amz-Expires`).
pub(crate) const TOKEN_LIFETIME: Duration = Duration::from_secs(900);
/// Least validity a handed-out token keeps.
const MIN_REMAINING: Duration = Duration::from_secs(60);

/// Signs an MSK IAM token for `region` with `credentials`, at the system's current time (the
/// signer's own clock). The token stays valid 900 s, or until the credentials expire if sooner.
///
/// `region` must be an AWS region name (lowercase ASCII letters, digits and `-`): it becomes
/// the host name the token is signed for.
pub(crate) async fn presign_token(region: &str, credentials: &Credentials) -> Result<String> {
    let valid = !region.is_empty()
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid {
        return Err(Error::Kafka {
            message: format!(
                "MSK IAM token: region {region:?} is not a region name (lowercase letters, \
                 digits and '-', as in eu-west-1)"
            ),
            retryable: false,
            source: None,
        });
    }
    let (token, _expires_ms) =
        aws_msk_iam_sasl_signer::generate_auth_token_from_credentials_provider(
            Region::new(region.to_owned()),
            SharedCredentialsProvider::new(credentials.clone()),
        )
        .await
        .map_err(|e| Error::Kafka {
            message: "MSK IAM token: signing failed".into(),
            retryable: false,
            source: Some(Box::new(e)),
        })?;
    Ok(token)
}

/// When a token signed at `signed_at` and valid until `expires_at` should be replaced: after
/// 80 % of its life, and no later than a minute before it expires.
pub(crate) fn refresh_at(signed_at: SystemTime, expires_at: SystemTime) -> SystemTime {
    let life = expires_at.duration_since(signed_at).unwrap_or_default();
    let margin = (life / 5).max(MIN_REMAINING);
    expires_at
        .checked_sub(margin)
        .unwrap_or(signed_at)
        .max(signed_at)
}

struct Cached {
    token: String,
    refresh_at: SystemTime,
}

/// Makes MSK IAM tokens from the AWS credentials chain and caches them (see the module docs).
pub struct MskIamTokenProvider {
    region: String,
    credentials: SharedCredentialsProvider,
    clock: Arc<dyn Clock>,
    cached: Mutex<Option<Cached>>,
}

impl fmt::Debug for MskIamTokenProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // never the token nor the credentials
        f.debug_struct("MskIamTokenProvider")
            .field("region", &self.region)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl MskIamTokenProvider {
    /// A provider signing for `region` with `credentials`, on the system clock.
    pub fn new(region: impl Into<String>, credentials: SharedCredentialsProvider) -> Self {
        MskIamTokenProvider {
            region: region.into(),
            credentials,
            clock: Arc::new(SystemClock),
            cached: Mutex::new(None),
        }
    }

    /// Uses `clock` for signing times and expiry (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A token with at least a minute (normally minutes) of validity left.
    pub async fn token(&self) -> Result<String> {
        let mut cached = self.cached.lock().await;
        let now = system_time_from_ticks(self.clock.now_ticks());
        if let Some(c) = cached.as_ref() {
            if now < c.refresh_at {
                return Ok(c.token.clone());
            }
        }
        let credentials =
            self.credentials
                .provide_credentials()
                .await
                .map_err(|e| Error::Kafka {
                    message: "loading AWS credentials for MSK IAM".into(),
                    retryable: true,
                    source: Some(Box::new(e)),
                })?;
        // The signer signs at the system's time; `now` is the provider's clock, the same
        // clock in production (read just before), so the token lives at least until
        // `now + TOKEN_LIFETIME`.
        let token = presign_token(&self.region, &credentials).await?;
        let mut expires_at = now + TOKEN_LIFETIME;
        if let Some(credentials_expiry) = credentials.expiry() {
            expires_at = expires_at.min(credentials_expiry);
        }
        tracing::debug!(region = %self.region, "signed a new msk iam token");
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at: refresh_at(now, expires_at),
        });
        Ok(token)
    }

    /// rskafka's SASL configuration: OAUTHBEARER, asking this provider on every connection.
    pub(crate) fn sasl_config(self: Arc<Self>) -> rskafka::client::SaslConfig {
        let callback: rskafka::client::OauthCallback = Arc::new(move || {
            let provider = Arc::clone(&self);
            Box::pin(async move {
                provider
                    .token()
                    .await
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            })
        });
        rskafka::client::SaslConfig::Oauthbearer(rskafka::client::OauthBearerCredentials {
            callback,
            authz_id: None,
            bearer_kvs: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

    use aws_credential_types::provider::future;

    use crate::clock::{ticks_from_system_time, TICKS_PER_SECOND};
    use crate::publish::token_check::{
        decode_token, sigv4_encode, static_credentials, verify_token, ACCESS_KEY, SECRET_KEY,
        SESSION_TOKEN,
    };

    /// 2024-01-02T03:04:05Z
    fn fixed_time() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_164_645)
    }

    /// A clock the test moves by hand.
    #[derive(Debug)]
    struct ManualClock(AtomicI64);

    impl ManualClock {
        fn at(t: SystemTime) -> Arc<Self> {
            Arc::new(ManualClock(AtomicI64::new(ticks_from_system_time(t))))
        }
        fn advance(&self, d: Duration) {
            self.0
                .fetch_add(d.as_secs() as i64 * TICKS_PER_SECOND, Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now_ticks(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// The signer's `User-Agent`, appended after signing.
    const SIGNER_USER_AGENT: &str = "aws-msk-iam-sasl-signer-rs/";

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

    fn counting(credentials: Credentials) -> (SharedCredentialsProvider, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let provider = SharedCredentialsProvider::new(CountingCredentials {
            credentials,
            calls: Arc::clone(&calls),
        });
        (provider, calls)
    }

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
        let token = presign_token("eu-west-1", &static_credentials())
            .await
            .unwrap();
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
        let token = presign_token("eu-west-1", &aws_vector_credentials())
            .await
            .unwrap();
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
        let token = presign_token("us-east-1", &creds).await.unwrap();
        let t = decode_token(&token);
        assert!(t.params.iter().all(|(k, _)| k != "X-Amz-Security-Token"));
        verify_token(&token, "us-east-1", SECRET_KEY, SystemTime::now());
    }

    #[tokio::test]
    async fn a_region_that_is_no_region_name_is_refused() {
        for region in ["", "eu west 1", "EU-WEST-1", "eu-west-1.evil.example/", "é"] {
            let err = presign_token(region, &static_credentials())
                .await
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("region") && err.contains("lowercase letters"),
                "{region:?}: {err}"
            );
        }
    }

    #[test]
    fn refresh_after_eighty_percent() {
        let t0 = fixed_time();
        assert_eq!(
            refresh_at(t0, t0 + TOKEN_LIFETIME),
            t0 + Duration::from_secs(720)
        );
        // short-lived credentials: at least a minute before expiry
        assert_eq!(
            refresh_at(t0, t0 + Duration::from_secs(200)),
            t0 + Duration::from_secs(140)
        );
        // nearly expired credentials: refresh every time
        assert_eq!(refresh_at(t0, t0 + Duration::from_secs(30)), t0);
        assert_eq!(refresh_at(t0, t0 - Duration::from_secs(30)), t0);
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
}
