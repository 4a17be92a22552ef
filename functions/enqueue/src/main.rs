//! Lambda entry point of the enqueue function: the library's enqueue service (its writer
//! and, when configured, the EventBridge notifier) is built once per execution
//! environment, then every invocation enqueues one request (see the library half).

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use outbox_enqueue_function::EnqueueFunction;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Honours the function's LoggingConfig (JSON) and AWS_LAMBDA_LOG_LEVEL / RUST_LOG, as
    // lambda_runtime's default subscriber does; at no level do the SDK's signing and
    // credential internals reach the log (dynamo_outbox::logging).
    dynamo_outbox::logging::init_lambda();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let function = Arc::new(EnqueueFunction::from_lookup(&config, |name| {
        std::env::var(name).ok()
    })?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let function = function.clone();
        Box::pin(async move { function.handle(event).await })
    }))
    .await
}
