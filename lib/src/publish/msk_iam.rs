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

use crate::error::{Error, Result};
use crate::protocol::clock::{system_time_from_ticks, Clock, SystemClock};

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

    // The signer's and the provider's tests on the public API, with the independent token
    // check, are `tests/msk_iam.rs`.

    /// 2024-01-02T03:04:05Z
    fn fixed_time() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_164_645)
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
}
