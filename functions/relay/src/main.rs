//! Lambda entry point of the relay function: clients are built once per execution
//! environment, then every invocation runs one relay (see the library half).

use std::sync::Arc;

use dynamo_outbox::notification::LambdaSuccessor;
use lambda_runtime::{service_fn, LambdaEvent};
use outbox_relay_function::{RelayFunction, RelaySettings};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Honours the function's LoggingConfig (JSON) and AWS_LAMBDA_LOG_LEVEL / RUST_LOG, as
    // lambda_runtime's default subscriber does; at no level do the SDK's signing and
    // credential internals reach the log (dynamo_outbox::logging).
    dynamo_outbox::logging::init_lambda();
    let settings = RelaySettings::from_env()?;
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    // Every DynamoDB attempt is counted by operation; each summary says its own.
    let requests = dynamo_outbox::accounting::RequestCounter::default();
    let client = dynamo_outbox::client::counted_dynamodb_client(&config, requests.clone());
    let mut function = RelayFunction::new(client, settings)?.with_request_counter(requests);
    // A run that leaves work starts its successor: an asynchronous invocation of this
    // function (Lambda sets its name; AWS_ENDPOINT_URL_LAMBDA points the local emulator's
    // runs at the emulator).
    if let Ok(name) = std::env::var("AWS_LAMBDA_FUNCTION_NAME") {
        let lambda = aws_sdk_lambda::Client::new(&config);
        function = function.with_successor(Arc::new(LambdaSuccessor::new(lambda, name)));
    }
    let function = Arc::new(function);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let function = function.clone();
        // Boxed: the relay's future is deep, and the runtime's future nests it.
        Box::pin(async move { function.handle(event).await })
    }))
    .await
}
