//! SASL/SCRAM and SASL/PLAIN credentials: a username and password from the environment
//! (`KAFKA_SASL_USERNAME`, `KAFKA_SASL_PASSWORD`) or from an AWS Secrets Manager secret
//! (`KAFKA_SASL_SECRET_ARN`, Amazon MSK's convention for SCRAM: a JSON secret string with
//! `username` and `password`).
//!
//! A secret is read at the first connect and kept for the life of the process (one Lambda
//! execution environment): the clones of one [`KafkaConfig`](super::KafkaConfig) share
//! what was read. When the brokers refuse the credentials, the publisher forgets them
//! ([`SaslCredentials::forget`]), so the connect after a rotation reads the new value.
//!
//! Neither the password nor the secret's contents appear in `Debug` output, in errors or
//! in this module's logs.

use std::fmt;
use std::sync::Arc;

use super::env;
use crate::error::{Error, Result};

/// A password: its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps `password`.
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }

    /// The password itself, for the SASL exchange.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A username and its password.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UsernamePassword {
    /// The SASL username (shown in `Debug` and in errors: it is not a secret).
    pub username: String,
    /// The password (never shown).
    pub password: Password,
}

/// Where the SASL username and password come from.
#[derive(Clone)]
#[non_exhaustive]
pub enum SaslCredentials {
    /// Given directly (`KAFKA_SASL_USERNAME` and `KAFKA_SASL_PASSWORD`).
    Static(UsernamePassword),
    /// Read from a Secrets Manager secret (`KAFKA_SASL_SECRET_ARN`) once per process.
    SecretsManager(SecretsManagerSecret),
}

impl fmt::Debug for SaslCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaslCredentials::Static(up) => f
                .debug_struct("Static")
                .field("username", &up.username)
                .field("password", &up.password)
                .finish(),
            SaslCredentials::SecretsManager(s) => f.debug_tuple("SecretsManager").field(s).finish(),
        }
    }
}

impl fmt::Debug for SecretsManagerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // the secret's name, never what was read from it
        f.debug_struct("SecretsManagerSecret")
            .field("secret_id", &self.secret_id)
            .finish_non_exhaustive()
    }
}

/// A Secrets Manager secret holding `{"username": ..., "password": ...}`, and what was read
/// from it (shared by the clones).
#[derive(Clone)]
pub struct SecretsManagerSecret {
    secret_id: String,
    read: Arc<tokio::sync::Mutex<Option<UsernamePassword>>>,
}

impl SaslCredentials {
    /// A username and password given directly.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        SaslCredentials::Static(UsernamePassword {
            username: username.into(),
            password: Password::new(password),
        })
    }

    /// The secret `secret_id` (an ARN or a name) of AWS Secrets Manager, read when first
    /// needed with the standard AWS configuration (region, credentials, and the endpoint,
    /// which `AWS_ENDPOINT_URL_SECRETS_MANAGER` overrides).
    pub fn secrets_manager(secret_id: impl Into<String>) -> Self {
        SaslCredentials::SecretsManager(SecretsManagerSecret {
            secret_id: secret_id.into(),
            read: Arc::new(tokio::sync::Mutex::new(None)),
        })
    }

    /// The username and password: the given ones, or the secret's, read from Secrets
    /// Manager on the first call (and after [`forget`](Self::forget)) only.
    pub async fn resolve(&self) -> Result<UsernamePassword> {
        match self {
            SaslCredentials::Static(up) => Ok(up.clone()),
            SaslCredentials::SecretsManager(s) => {
                let mut read = s.read.lock().await;
                if let Some(up) = read.as_ref() {
                    return Ok(up.clone());
                }
                let up = fetch(&s.secret_id).await?;
                *read = Some(up.clone());
                Ok(up)
            }
        }
    }

    /// Drops what was read from the secret, so the next [`resolve`](Self::resolve) reads
    /// it again (the brokers refused it: the secret may have been rotated).
    pub async fn forget(&self) {
        if let SaslCredentials::SecretsManager(s) = self {
            *s.read.lock().await = None;
        }
    }

    /// Where the credentials come from, for errors: the variables to check.
    pub(crate) fn source_hint(&self) -> String {
        match self {
            SaslCredentials::Static(_) => {
                format!("{} and {}", env::SASL_USERNAME, env::SASL_PASSWORD)
            }
            SaslCredentials::SecretsManager(s) => {
                format!("the secret {} ({})", s.secret_id, env::SASL_SECRET_ARN)
            }
        }
    }

    /// A value for tests: as if `up` had been read from `secret_id` already.
    #[cfg(test)]
    pub(crate) fn secrets_manager_read(secret_id: &str, up: UsernamePassword) -> Self {
        SaslCredentials::SecretsManager(SecretsManagerSecret {
            secret_id: secret_id.into(),
            read: Arc::new(tokio::sync::Mutex::new(Some(up))),
        })
    }

    /// Whether a secret's value is held (for tests).
    #[cfg(test)]
    pub(crate) async fn holds_secret(&self) -> bool {
        match self {
            SaslCredentials::Static(_) => false,
            SaslCredentials::SecretsManager(s) => s.read.lock().await.is_some(),
        }
    }
}

/// Reads the secret and parses it. Errors name the variable and the secret, never its
/// contents.
async fn fetch(secret_id: &str) -> Result<UsernamePassword> {
    let text = super::secret::secret_string(
        env::SASL_SECRET_ARN,
        secret_id,
        "a JSON object with \"username\" and \"password\"",
    )
    .await?;
    parse_secret(secret_id, &text)
}

/// Parses MSK's SCRAM secret format: a JSON object with string fields `username` and
/// `password` (other fields are ignored). serde_json's own messages may quote the
/// input, so errors say only which rule was broken.
pub(crate) fn parse_secret(secret_id: &str, text: &str) -> Result<UsernamePassword> {
    let bad = |rule: &str| {
        Error::misconfigured(format!(
            "{}: the secret {secret_id} {rule}",
            env::SASL_SECRET_ARN
        ))
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(|_| {
        bad("is not JSON (it must be a JSON object with \"username\" and \"password\")")
    })?;
    let object = value
        .as_object()
        .ok_or_else(|| bad("is not a JSON object (it must have \"username\" and \"password\")"))?;
    let field = |name: &str| match object.get(name) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(serde_json::Value::String(_)) => Err(bad(&format!("has an empty \"{name}\""))),
        Some(_) => Err(bad(&format!("has a \"{name}\" that is not a string"))),
        None => Err(bad(&format!("has no \"{name}\""))),
    };
    Ok(UsernamePassword {
        username: field("username")?,
        password: Password::new(field("password")?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_format_is_msks() {
        let up = parse_secret(
            "arn:s",
            r#"{"username":"alice","password":"p@ss w0rd","note":1}"#,
        )
        .unwrap();
        assert_eq!(up.username, "alice");
        assert_eq!(up.password.expose(), "p@ss w0rd");
    }

    #[test]
    fn secret_errors_name_the_rule_and_never_the_contents() {
        for (text, rule) in [
            ("hunter2-not-json", "is not JSON"),
            (r#"["hunter2-list"]"#, "is not a JSON object"),
            (r#"{"password":"hunter2-pw"}"#, "has no \"username\""),
            (
                r#"{"username":"u","password":7}"#,
                "\"password\" that is not a string",
            ),
            (
                r#"{"username":"u","password":""}"#,
                "has an empty \"password\"",
            ),
            (
                r#"{"username":"u","pasword":"hunter2-typo"}"#,
                "has no \"password\"",
            ),
        ] {
            let e = parse_secret(
                "arn:aws:secretsmanager:eu-west-1:1:secret:AmazonMSK_x",
                text,
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with(
                    "misconfiguration: KAFKA_SASL_SECRET_ARN: the secret arn:aws:secretsmanager:eu-west-1:1:secret:AmazonMSK_x "
                ) && e.contains(rule),
                "{e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn debug_and_display_never_show_the_password() {
        let c = SaslCredentials::new("alice", "hunter2-secret");
        let s = format!("{c:?}");
        assert!(s.contains("alice") && !s.contains("hunter2"), "{s}");
        let up = UsernamePassword {
            username: "bob".into(),
            password: Password::new("hunter2-secret"),
        };
        let s = format!("{up:?} {} {:?}", up.password, up.password);
        assert!(!s.contains("hunter2"), "{s}");
        let c = SaslCredentials::secrets_manager_read("arn:x", up);
        let s = format!("{c:?}");
        assert!(
            s.contains("arn:x") && !s.contains("hunter2") && !s.contains("bob"),
            "{s}"
        );
    }

    #[tokio::test]
    async fn a_read_secret_is_kept_until_forgotten() {
        let up = UsernamePassword {
            username: "bob".into(),
            password: Password::new("pw"),
        };
        let c = SaslCredentials::secrets_manager_read("arn:x", up.clone());
        let clone = c.clone();
        // no AWS call: the value read is shared by the clones
        assert_eq!(clone.resolve().await.unwrap(), up);
        c.forget().await;
        assert!(!clone.holds_secret().await);
    }
}
