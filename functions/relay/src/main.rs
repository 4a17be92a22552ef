//! The relay Lambda function: one relay per invocation, inside the invocation's deadline,
//! woken by the schedule, commit notifications, the table's stream and its own successors.
//! Everything it does is the library's [`dynamo_outbox::lambda::RelayHandler`]; this is the
//! program around it.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Honours the function's LoggingConfig (JSON) and AWS_LAMBDA_LOG_LEVEL / RUST_LOG, as
    // lambda_runtime's default subscriber does; at no level do the SDK's signing and
    // credential internals reach the log (dynamo_outbox::logging).
    dynamo_outbox::logging::init_lambda();
    let handler = dynamo_outbox::lambda::RelayHandler::from_env().await?;
    dynamo_outbox::lambda::run(handler).await
}
