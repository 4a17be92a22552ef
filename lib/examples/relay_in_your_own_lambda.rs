//! A relay in a Lambda function of your own: the library's relay handler
//! ([`dynamo_outbox::lambda::RelayHandler`], what the project's relay function runs) with
//! your settings and your own step after each run.
//!
//! Build it for Lambda with `cargo lambda build --release --example
//! relay_in_your_own_lambda --features lambda` (or point SAM's `CodeUri` at your crate),
//! and give the function the relay function's environment (docs/configuration.md): the
//! `OUTBOX_*` variables (`OUTBOX_TABLE_NAME` is required) and `KAFKA_*`. It answers the
//! same events as the relay function: the schedule's tick, commit notifications from the
//! event bus, the table's stream (the doorbell) and its own successors.
//!
//! Here, the function adds two things to the handler: its runs stop after 2 s without work
//! unless `OUTBOX_IDLE_STOP` says otherwise, and each invocation that published logs one
//! line of the service's own (`my-service: the outbox published N messages`), next to the
//! handler's summary. On the local stack, the test command runs it under
//! `scripts/lambda_runtime.py`, the local model of Lambda.

use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::lambda::{FunctionError, RelayHandler, RelaySettings, RelaySummary};
use lambda_runtime::{service_fn, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // The function's log format and level (LoggingConfig), with the SDK's signing and
    // credential internals kept out at any level.
    dynamo_outbox::logging::init_lambda();

    // The relay function's settings from the environment, adjusted in code.
    let mut settings = RelaySettings::from_env()?;
    if std::env::var_os(dynamo_outbox::options::env::IDLE_STOP).is_none() {
        settings.relay.idle_stop = Some(Duration::from_secs(2));
    }

    // Clients are built once per execution environment, before the runtime loop: a
    // DynamoDB client with the relay's timeouts.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = dynamo_outbox::client::dynamodb_client(&config);
    let handler = Arc::new(RelayHandler::new(client, settings)?);

    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let handler = handler.clone();
        // Boxed: the relay's future is deep, and the runtime's future nests it.
        Box::pin(async move {
            let summary = handler.handle(event).await?;
            if summary.published > 0 {
                tracing::info!(
                    published = summary.published,
                    "my-service: the outbox published {} messages",
                    summary.published
                );
            }
            Ok::<RelaySummary, FunctionError>(summary)
        })
    }))
    .await
}
