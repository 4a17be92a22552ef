//! Why a connect to the brokers failed, in words the user can act on: the brokers'
//! certificate not trusted or the client certificate refused (TLS), the credentials
//! refused (SASL, then forgotten so that a rotated secret is read again), a mechanism the
//! listener does not enable; anything else is classified as any failed request is.

use rskafka::client::error::{Error as ClientError, ProtocolError};

use super::classify::client_error;
use super::config::{KafkaAuth, KafkaConfig};
use super::env;
use super::sasl::SaslCredentials;
use super::tls::{ClientCertificate, KafkaTls, TrustedRoots};
use crate::error::Error;

/// The error of a failed connect, saying what the user can check: refused credentials
/// (which are then forgotten, so the next connect reads a rotated secret again).
pub(super) async fn connect_error(config: &KafkaConfig, e: ClientError) -> Error {
    if let Some(message) = tls_failure(&config.tls, &e) {
        // a certificate refused or not trusted: the next connect reads the TLS secrets
        // again, in case they were rotated
        for secret in config.tls.secrets() {
            secret.forget().await;
        }
        return Error::Kafka {
            message,
            retryable: false,
            source: Some(Box::new(e)),
        };
    }
    if sasl_refused(&e) {
        let mechanism = match config.auth {
            KafkaAuth::MskIam => "OAUTHBEARER (MSK IAM)",
            KafkaAuth::ScramSha256 => "SCRAM-SHA-256",
            KafkaAuth::ScramSha512 => "SCRAM-SHA-512",
            KafkaAuth::Plain => "PLAIN",
            KafkaAuth::None | KafkaAuth::Mtls => "",
        };
        let check = match &config.sasl {
            Some(source) => {
                source.forget().await;
                let user = match source {
                    SaslCredentials::Static(up) => format!(" as user {:?}", up.username),
                    SaslCredentials::SecretsManager(_) => String::new(),
                };
                format!("{user}: check the username and password in {}", source.source_hint())
            }
            None => ": check the role's kafka-cluster:Connect permission and the cluster's IAM access control".into(),
        };
        return Error::Kafka {
            message: format!("the brokers refused SASL/{mechanism} authentication{check}"),
            retryable: false,
            source: Some(Box::new(e)),
        };
    }
    if let Some(refused) = scram_refused(&e) {
        // a broker's SCRAM message broke RFC 5802 or the iteration ceiling: a broken or
        // hostile broker, refused before any work was done on it
        return Error::Kafka {
            message: format!(
                "the SASL/{} exchange with the brokers was refused: {refused}",
                config.auth.name().to_ascii_uppercase()
            ),
            retryable: false,
            source: Some(Box::new(e)),
        };
    }
    if connect_failure_text(&e).contains("SaslFailed(") {
        // the handshake failed: a mechanism the brokers do not enable, or a broken exchange
        return Error::Kafka {
            message: format!(
                "the SASL/{} exchange with the brokers failed (is KAFKA_AUTH={} enabled on this listener?)",
                config.auth.name().to_ascii_uppercase(),
                config.auth.name()
            ),
            retryable: false,
            source: Some(Box::new(e)),
        };
    }
    client_error("connecting to the brokers", e)
}

/// The text that finds a connect failure's cause. A failed connect reaches us as
/// `RetryFailed(DeadlineExceded { source: MultiError([...]) })`, and rskafka's
/// `MultiError` keeps its errors private (no `source()`, no accessor), so the only way to
/// their kind is their `Debug` text, which names the variants.
fn connect_failure_text(e: &ClientError) -> String {
    format!("{e:?}")
}

/// What went wrong in a TLS handshake that failed for a reason the user must fix: the
/// brokers' certificate not trusted, or the client certificate missing or refused.
fn tls_failure(tls: &KafkaTls, e: &ClientError) -> Option<String> {
    let roots = tls.roots()?;
    let text = connect_failure_text(e);
    // the variant's argument, as rustls' Debug names it: `InvalidCertificate(UnknownIssuer)`
    let argument = |variant: &str| {
        text.split_once(variant).map(|(_, rest)| {
            let mut depth = 0usize;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' | '{' | '[' => depth += 1,
                        ')' | '}' | ']' if depth == 0 => return true,
                        ')' | '}' | ']' => depth -= 1,
                        _ => {}
                    }
                    false
                })
                .map_or(rest.len(), |(i, _)| i);
            rest[..end].to_owned()
        })
    };
    let roots = match roots {
        TrustedRoots::File(path) => {
            format!("the roots of {} ({})", env::TLS_CA_FILE, path.display())
        }
        TrustedRoots::Secret(secret) => format!(
            "the roots of {} ({})",
            env::TLS_CA_SECRET_ARN,
            secret.secret_id()
        ),
        TrustedRoots::System => format!(
            "the system's roots ({} and {} are unset)",
            env::TLS_CA_FILE,
            env::TLS_CA_SECRET_ARN
        ),
    };
    if let Some(why) = argument("InvalidCertificate(") {
        return Some(format!(
            "TLS with the brokers failed: their certificate is not trusted ({why}) by {roots}"
        ));
    }
    let alert = argument("AlertReceived(")?;
    let client_cert = match tls.client_certificate() {
        Some(ClientCertificate::Files { certificate, .. }) => Some(format!(
            "{} ({})",
            env::TLS_CERT_FILE,
            certificate.display()
        )),
        Some(ClientCertificate::Secret(secret)) => Some(format!(
            "{} ({})",
            env::TLS_CLIENT_SECRET_ARN,
            secret.secret_id()
        )),
        None => None,
    };
    match (alert.as_str(), client_cert) {
        // Java's TLS 1.3 server (Kafka's, MSK's) refuses an empty certificate message
        // with bad_certificate.
        ("CertificateRequired" | "HandshakeFailure" | "BadCertificate", None) => Some(format!(
            "TLS with the brokers failed: they require a client certificate (alert {alert}): \
             set {} (or {} and {})",
            env::TLS_CLIENT_SECRET_ARN,
            env::TLS_CERT_FILE,
            env::TLS_KEY_FILE
        )),
        (
            "BadCertificate"
            | "UnknownCA"
            | "CertificateUnknown"
            | "CertificateExpired"
            | "CertificateRevoked"
            | "UnsupportedCertificate"
            | "AccessDenied"
            | "HandshakeFailure"
            | "DecryptError",
            Some(source),
        ) => Some(format!(
            "TLS with the brokers failed: they refused the client certificate of {source} \
             (alert {alert})"
        )),
        _ => Some(format!(
            "TLS with the brokers failed: they sent the alert {alert}"
        )),
    }
}

/// The SCRAM server message the client refused (RFC 5802's form, the iteration ceiling
/// [`rskafka::SCRAM_MAX_ITERATIONS`]), as its `Display` says it; found through the error's
/// sources, else in the `Debug` text of the failed connect (whose `MultiError` hides them).
fn scram_refused(e: &ClientError) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(rskafka::SaslError::MalformedScram(m)) =
            err.downcast_ref::<rskafka::SaslError>()
        {
            return Some(m.to_string());
        }
        current = err.source();
    }
    // `MalformedScram(ScramMessageError { message: "server-first", rule: "..." })`: the
    // rules hold no quote, so each field ends at the next one
    let text = connect_failure_text(e);
    let (_, rest) = text.split_once("MalformedScram(ScramMessageError { message: \"")?;
    let (message, rest) = rest.split_once('"')?;
    let (_, rest) = rest.split_once("rule: \"")?;
    let (rule, _) = rest.split_once('"')?;
    Some(
        rskafka::ScramMessageError {
            message: if message == "server-first" {
                "server-first"
            } else {
                "server-final"
            },
            rule: rule.to_owned(),
        }
        .to_string(),
    )
}

/// Whether the brokers answered the SASL exchange with `SASL_AUTHENTICATION_FAILED`.
fn sasl_refused(e: &ClientError) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(rskafka::SaslError::ApiError(ProtocolError::SaslAuthenticationFailed)) =
            err.downcast_ref::<rskafka::SaslError>()
        {
            return true;
        }
        current = err.source();
    }
    connect_failure_text(e).contains("SaslFailed(ApiError(SaslAuthenticationFailed))")
}
