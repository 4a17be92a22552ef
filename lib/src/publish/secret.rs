//! Reading a secret string from AWS Secrets Manager, for the secrets the publisher names
//! (`KAFKA_SASL_SECRET_ARN`, `KAFKA_TLS_CA_SECRET_ARN`, `KAFKA_TLS_CLIENT_SECRET_ARN`).
//!
//! One `GetSecretValue` with the standard AWS configuration (region, credentials, and the
//! endpoint, which `AWS_ENDPOINT_URL_SECRETS_MANAGER` overrides); the SDK's standard retry
//! mode bounds the attempts (3, with backoff), and the publisher's connect timeout bounds
//! the whole read. Errors name the variable and the secret, never what the secret holds.

use crate::error::{Error, Result};

/// The secret string of `secret_id` (an ARN or a name), named by `variable`; `format` says
/// what it must hold, for the error about a binary secret.
pub(crate) async fn secret_string(variable: &str, secret_id: &str, format: &str) -> Result<String> {
    use aws_sdk_secretsmanager::error::ProvideErrorMetadata;

    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let output = client
        .get_secret_value()
        .secret_id(secret_id)
        .send()
        .await
        .map_err(|e| {
            let what = format!(
                "{variable}: reading the secret {secret_id} from AWS Secrets Manager failed"
            );
            match e.code() {
                // the deployment must change: the secret, its policy or its key
                Some(
                    "ResourceNotFoundException"
                    | "AccessDeniedException"
                    | "DecryptionFailure"
                    | "InvalidParameterException"
                    | "InvalidRequestException",
                ) => Error::misconfigured_by(what, e),
                // throttling, a network error, an internal error: another try may do
                _ => Error::Kafka {
                    message: what,
                    retryable: true,
                    source: Some(Box::new(e)),
                },
            }
        })?;
    output.secret_string().map(str::to_owned).ok_or_else(|| {
        Error::misconfigured(format!(
            "{variable}: the secret {secret_id} has no secret string (a binary secret); \
             it must be {format}"
        ))
    })
}
