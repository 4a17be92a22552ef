//! Request accounting against the cost model: counts DynamoDB attempts with the library's
//! interceptor while enqueuing and draining (the exact-count smoke run of the benchmarks).

use std::collections::HashSet;
use std::time::Duration;

use dynamo_outbox::accounting::RequestCounter;
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Relay};
use outbox_testkit::*;
use tokio::time::Instant;

async fn counted_client(counter: &RequestCounter) -> aws_sdk_dynamodb::Client {
    stack_var("AWS_ENDPOINT_URL_DYNAMODB");
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(counter.clone())
            .build(),
    )
}

#[tokio::test]
async fn an_enqueue_costs_one_update_per_distinct_bucket_and_one_transaction() {
    let plain = dynamodb().await;
    let options = fresh_table(&plain, 8).await;
    let counter = RequestCounter::default();
    let writer = DynamoDbOutboxWriter::new(counted_client(&counter).await, options).unwrap();
    let messages: Vec<_> = (0..20)
        .map(|i| writer.message("t").with_key(format!("k{}", i % 5)))
        .collect();
    let buckets: HashSet<u32> = messages.iter().map(|m| m.bucket()).collect();
    writer.enqueue(&messages).await.unwrap();
    let counts = counter.snapshot();
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert_eq!(counter.get("UpdateItem").ok, buckets.len() as u64);
    assert_eq!(counter.get("TransactWriteItems").ok, 1);
}

#[tokio::test]
async fn draining_costs_one_batch_write_per_25_messages_and_no_refusal() {
    let plain = dynamodb().await;
    let options = fresh_table(&plain, 1).await;
    let topic = random_name("acct");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(plain.clone(), options.clone()).unwrap();
    for chunk in 0..3 {
        let batch: Vec<_> = (0..40)
            .map(|i| writer.message(&topic).with_key(format!("k{chunk}-{i}")))
            .collect();
        writer.enqueue(&batch).await.unwrap();
    }
    let counter = RequestCounter::default();
    let store = DynamoDbOutboxStore::new(counted_client(&counter).await, options.clone()).unwrap();
    let mut relay_options = fast_relay_options("acct", 1);
    relay_options.batch_size = 50;
    let relay = Relay::new(store, kafka_publisher().await, relay_options).unwrap();
    let t0 = Instant::now();
    let report = relay.run_until(t0 + Duration::from_secs(5)).await.unwrap();
    assert_eq!(report.published, 120);
    assert_eq!(pending_messages(&plain, &options).await, 0);
    // Batches of 50, 50 and 20: 2 + 2 + 1 chunks of at most 25 deletes.
    assert_eq!(
        counter.get("BatchWriteItem").ok,
        5,
        "{:?}",
        counter.snapshot()
    );
    let refused: u64 = counter.snapshot().values().map(|a| a.client_error).sum();
    assert_eq!(
        refused,
        0,
        "no refused or failed request: {:?}",
        counter.snapshot()
    );
    // Lease writes: one heartbeat and one claim or renewal per round, plus the stop's stamp and release.
    let updates = counter.get("UpdateItem").ok;
    assert_eq!(
        updates,
        2 * report.rounds + 2,
        "{:?} rounds {}",
        counter.snapshot(),
        report.rounds
    );
}
