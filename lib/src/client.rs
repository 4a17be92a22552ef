//! A DynamoDB client with the timeouts a relay needs.
//!
//! The SDK's defaults set only a connect timeout: a half-open connection could then hold a
//! fetch or a lease renewal for as long as the operating system keeps the socket. Every
//! request of the outbox is small, so a few seconds per attempt is generous.

use std::time::Duration;

use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;

/// Bound on one HTTP attempt.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on one operation, the SDK's retries included.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(8);

/// A client for the standard configuration (`aws_config::load_defaults`) with
/// [`ATTEMPT_TIMEOUT`] and [`OPERATION_TIMEOUT`].
pub fn dynamodb_client(config: &aws_config::SdkConfig) -> Client {
    Client::from_conf(dynamodb_config(config).build())
}

/// [`dynamodb_client`] with `counter` attached: every attempt is counted by operation and
/// outcome ([`crate::accounting`]).
pub fn counted_dynamodb_client(
    config: &aws_config::SdkConfig,
    counter: crate::accounting::RequestCounter,
) -> Client {
    Client::from_conf(dynamodb_config(config).interceptor(counter).build())
}

/// The configuration of [`dynamodb_client`], to add to (an interceptor of one's own, say)
/// before building the client.
pub fn dynamodb_config(config: &aws_config::SdkConfig) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::from(config).timeout_config(
        TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .operation_timeout(OPERATION_TIMEOUT)
            .build(),
    )
}

/// Loads the standard AWS configuration (environment, profile, instance or Lambda role)
/// and returns [`dynamodb_client`] for it.
pub async fn dynamodb_client_from_env() -> Client {
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    dynamodb_client(&config)
}
