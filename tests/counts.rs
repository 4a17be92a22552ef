//! The relay's counts agree with the table and the topic: what `published` (the run's
//! report, the `Published` metric) says left the table did, and reached Kafka, even when
//! a delete lands but its answer does not.

use std::collections::BTreeSet;
use std::time::Duration;

use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Relay, StopReason};
use outbox_testkit::*;
use tokio::time::Instant;

/// Every answer to the first batch's deletes is lost (each attempt lands, and hears a
/// 500), so the batch gives up with nothing confirmed deleted.
/// The messages were published and are gone: the next fetch of the bucket finds them gone
/// and counts them published then, once. No publish failed (the publish went through);
/// the lost answers are errors the loop recovered from. Nothing is published twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_whose_answers_are_lost_are_counted_once_the_bucket_shows_them_gone() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("counts");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let messages: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|k| writer.message(&topic).with_key(*k).with_value(*k))
        .collect();
    writer.enqueue(&messages).await.unwrap();
    let written: BTreeSet<String> = id_set(&messages);

    // More lost answers than one batch's delete makes: 5 attempts, each a single request
    // (the SDK's own retries off, so the attempts run out well inside the delete's time
    // limit and the delete gives up without a look at the table).
    let lose = Fault::on("BatchWriteItem").times(15).lose_answer();
    let faulty = aws_sdk_dynamodb::Client::from_conf(
        dynamodb_builder()
            .await
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
            .interceptor(lose.clone())
            .build(),
    );
    let store = DynamoDbOutboxStore::new(faulty, options.clone()).unwrap();
    let relay_options = fast_relay_options("counts", 1).with_idle_stop(Duration::from_secs(2));
    let relay = Relay::new(store, kafka_publisher().await, relay_options).unwrap();
    let report = relay
        .run_until(Instant::now() + Duration::from_secs(30))
        .await
        .unwrap();

    assert_eq!(
        lose.hits(),
        5,
        "the first batch's 5 delete attempts lost their answers, and no delete came after"
    );
    assert_eq!(pending_messages(&client, &options).await, 0);
    wait_for_ids(&topic, &written, Duration::from_secs(15))
        .await
        .assert_exactly_once(&written);
    assert_eq!(report.stop_reason, StopReason::Idle, "{report:?}");
    assert_eq!(report.published, 3, "what left the table: {report:?}");
    assert_eq!(report.publish_failures, 0, "no publish failed: {report:?}");
    assert!(
        report.errors >= 1,
        "the lost answers ({} of 15 used): {report:?}",
        lose.hits()
    );
    assert_eq!(report.refused_total(), 0, "{report:?}");
}
