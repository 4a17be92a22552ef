//! Shared helpers of the integration tests: endpoints of the local stack from the
//! environment (set by `scripts/stack.sh`), clients, random names.
#![allow(unreachable_pub)]

use aws_sdk_dynamodb::Client;
use dynamo_outbox::OutboxOptions;

/// Reads a variable that `scripts/stack.sh` exports; panics with a clear message when the
/// test runs outside the stack (integration tests never skip themselves).
pub fn stack_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through scripts/test.sh (or scripts/stack.sh run -- cargo test)")
    })
}

/// A DynamoDB client for DynamoDB Local (endpoint and dummy credentials from the stack's
/// environment, through the standard AWS configuration chain).
pub async fn dynamodb() -> Client {
    stack_var("AWS_ENDPOINT_URL_DYNAMODB");
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    Client::new(&config)
}

/// A random name with a readable prefix, unique per test.
pub fn random_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Options for a fresh table, created and active.
pub async fn fresh_table(client: &Client, bucket_count: u32) -> OutboxOptions {
    let options = OutboxOptions::new(random_name("outbox")).with_bucket_count(bucket_count);
    dynamo_outbox::table::create_if_not_exists(client, &options)
        .await
        .expect("create table");
    options
}
