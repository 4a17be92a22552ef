//! Exactly-once delivery (`OUTBOX_DELIVERY=exactly-once`, docs/protocol.md section 8)
//! against the local stack's Apache Kafka, read back by an independent client
//! (confluent-kafka, whose consumers read committed records only, librdkafka's default):
//! a relay that dies between its commit and its deletes leaves nothing for the next one to
//! publish again (the same in at-least-once mode publishes everything twice); a second
//! producer fences the first; a message committed late into a hole below published ones is
//! published; and an exactly-once relay refuses to share a table with a relay that is not.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::metrics::WriteKind;
use dynamo_outbox::protocol::watermark::OutboxIdentity;
use dynamo_outbox::publish::{Delivery, KafkaConfig, KafkaPublisher, Publisher};
use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, Error, OutboxMessage, OutboxOptions, Relay,
};
use outbox_testkit::{
    create_topic, dynamodb, fast_relay_options, fresh_table, id_set, pending_messages, random_name,
    stack_var, Deliveries, ReadRecord,
};
use tokio::time::Instant;

const COMMITTED: &str = "read_committed";
const UNCOMMITTED: &str = "read_uncommitted";

/// Every record of `topic` as a consumer with `isolation` reads it.
fn read(topic: &str, isolation: &str) -> Vec<ReadRecord> {
    outbox_testkit::try_read_records(&["read", topic, "--isolation", isolation])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A publisher for the local broker delivering as `delivery`, its watermarks against
/// `watermark_topic`.
async fn publisher(delivery: Delivery, watermark_topic: &str) -> Arc<KafkaPublisher> {
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let mut config = KafkaConfig::from_env().expect("KAFKA_* variables of the stack");
    config.delivery = delivery;
    config.watermark_topic = watermark_topic.to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    Arc::new(
        KafkaPublisher::connect(config, deadline)
            .await
            .expect("connect to the local broker"),
    )
}

/// A fresh table, a topic of `partitions`, a watermark topic, and a writer.
async fn setup(
    buckets: u32,
    partitions: u32,
) -> (OutboxOptions, String, String, DynamoDbOutboxWriter) {
    let client = dynamodb().await;
    let options = fresh_table(&client, buckets).await;
    let topic = random_name("eo");
    create_topic(&topic, partitions);
    let watermarks = random_name("eo-watermarks");
    create_topic(&watermarks, 1);
    let writer = DynamoDbOutboxWriter::new(client, options.clone()).unwrap();
    (options, topic, watermarks, writer)
}

async fn enqueue(writer: &DynamoDbOutboxWriter, topic: &str, n: usize) -> Vec<OutboxMessage> {
    let messages: Vec<OutboxMessage> = (0..n)
        .map(|i| {
            writer
                .message(topic)
                .with_key(format!("key-{}", i % 5))
                .with_value(format!("value-{i}"))
        })
        .collect();
    for chunk in messages.chunks(25) {
        writer.enqueue(chunk).await.expect("enqueue");
    }
    messages
}

/// Runs a relay over `client` for `run` (or until it has been idle a moment), with
/// `publisher`.
async fn run_relay(
    client: aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    publisher: Arc<KafkaPublisher>,
    run: Duration,
) -> Result<dynamo_outbox::RunReport, Error> {
    let store = DynamoDbOutboxStore::new(client, options.clone()).unwrap();
    let relay = Relay::new(
        store,
        publisher,
        fast_relay_options(&random_name("relay"), options.bucket_count)
            .with_idle_stop(Duration::from_millis(1500)),
    )
    .unwrap();
    relay.run_until(Instant::now() + run).await
}

/// A relay that published and committed every message of the table and died before its
/// deletes: the publisher, bound to the table as a relay binds it, publishes each bucket's
/// messages as the relay fetches them, and nothing is deleted.
async fn publish_and_die(options: &OutboxOptions, publisher: &KafkaPublisher) {
    let store = DynamoDbOutboxStore::new(dynamodb().await, options.clone()).unwrap();
    let arn = store.table_arn().await.expect("DescribeTable");
    publisher.bind_outbox(
        &OutboxIdentity::new(&arn, &options.key_prefix),
        Duration::from_secs(10),
    );
    for bucket in 0..options.bucket_count {
        let fetched = store.fetch(bucket, None, 100).await.expect("fetch");
        let outcome = publisher
            .publish_until(&fetched.messages, Instant::now() + Duration::from_secs(10))
            .await;
        assert_eq!(
            (outcome.acknowledged, outcome.error.is_none()),
            (fetched.messages.len(), true),
            "{outcome:?}"
        );
    }
}

/// A relay publishes (and commits) everything and dies before its deletes; the next relay
/// finds everything still in the table. In exactly-once mode it deletes what the
/// watermark names without producing anything; in at-least-once mode it publishes
/// everything again. Returns the records a reader saw, the ids read twice, and the produce
/// requests the second relay sent.
async fn die_between_commit_and_delete(delivery: Delivery) -> (usize, usize, u64) {
    let (options, topic, watermarks, writer) = setup(2, 3).await;
    let written = id_set(&enqueue(&writer, &topic, 40).await);

    publish_and_die(&options, &*publisher(delivery, &watermarks).await).await;
    assert_eq!(pending_messages(&dynamodb().await, &options).await, 40);
    Deliveries::of(&read(&topic, COMMITTED)).assert_exactly_once(&written);

    let second_publisher = publisher(delivery, &watermarks).await;
    let second = run_relay(
        dynamodb().await,
        &options,
        second_publisher.clone(),
        Duration::from_secs(15),
    )
    .await
    .expect("second relay");
    assert_eq!(second.published, 40, "{second:?}");
    if let Some(counts) = second_publisher.transaction_counts() {
        // Both buckets taken, every message covered by a watermark, nothing committed.
        assert_eq!(
            (counts.takes, counts.covered, counts.commits),
            (2, 40, 0),
            "{counts:?}"
        );
    }
    assert_eq!(pending_messages(&dynamodb().await, &options).await, 0);
    let records = read(&topic, COMMITTED);
    let deliveries = Deliveries::of(&records);
    deliveries.assert_at_least_once(&written);
    (
        records.len(),
        deliveries.duplicates.len(),
        second_publisher.produce_requests(),
    )
}

#[tokio::test]
async fn a_relay_that_dies_between_commit_and_delete_leaves_no_duplicate_in_exactly_once_mode() {
    let (records, duplicated, second_requests) =
        die_between_commit_and_delete(Delivery::ExactlyOnce).await;
    let (alo_records, alo_duplicated, alo_requests) =
        die_between_commit_and_delete(Delivery::AtLeastOnce).await;
    println!(
        "after a relay died between its broker acknowledgement and its deletes (40 messages): \
         exactly-once: {records} records read, {duplicated} ids twice, the next relay sent \
         {second_requests} produce requests; at-least-once: {alo_records} records read, \
         {alo_duplicated} ids twice, the next relay sent {alo_requests} produce requests"
    );
    assert_eq!((records, duplicated, second_requests), (40, 0, 0));
    assert_eq!((alo_records, alo_duplicated), (80, 40));
    assert!(alo_requests > 0);
}

fn stored(bucket: u32, sequence: u64, message: &OutboxMessage) -> StoredMessage {
    StoredMessage::new(bucket, sequence, message.clone())
}

fn identity(options: &OutboxOptions) -> OutboxIdentity {
    OutboxIdentity::new(
        &format!(
            "arn:aws:dynamodb:ddblocal:000000000000:table/{}",
            options.table_name
        ),
        &options.key_prefix,
    )
}

#[tokio::test]
async fn a_new_producer_fences_the_old_and_covers_what_it_committed() {
    let (options, topic, watermarks, writer) = setup(1, 2).await;
    let messages: Vec<OutboxMessage> = (0..9)
        .map(|i| {
            writer
                .message(&topic)
                .with_key(format!("k{}", i % 3))
                .with_value(format!("v{i}"))
        })
        .collect();
    let at = |range: std::ops::Range<usize>| -> Vec<StoredMessage> {
        range
            .map(|i| stored(0, i as u64 + 1, &messages[i]))
            .collect()
    };
    let lease = Duration::from_secs(10);
    let until = || Instant::now() + Duration::from_secs(10);

    let old = publisher(Delivery::ExactlyOnce, &watermarks).await;
    old.bind_outbox(&identity(&options), lease);
    let first = old.publish_until(&at(0..5), until()).await;
    assert_eq!(
        (first.acknowledged, first.error.is_none()),
        (5, true),
        "{first:?}"
    );

    // A new owner of the bucket: messages 1-5 are still in the table (their deletes never
    // happened); they are covered, only 6-8 are produced.
    let new = publisher(Delivery::ExactlyOnce, &watermarks).await;
    new.bind_outbox(&identity(&options), lease);
    let second = new.publish_until(&at(0..8), until()).await;
    assert_eq!(
        (second.acknowledged, second.error.is_none()),
        (8, true),
        "{second:?}"
    );
    assert!(
        new.produce_requests() <= 2,
        "only 6-8 go out: {} requests",
        new.produce_requests()
    );
    let counts = new.transaction_counts().unwrap();
    assert_eq!(
        (counts.takes, counts.covered, counts.commits),
        (1, 5, 1),
        "{counts:?}"
    );

    // The old producer is fenced: its next transaction fails and commits nothing...
    let stale = old.publish_until(&at(8..9), until()).await;
    assert_eq!(stale.acknowledged, 0, "{stale:?}");
    assert!(stale.error.is_some());
    // ...and taking the bucket again reads the new owner's watermark and goes on.
    let again = old.publish_until(&at(0..9), until()).await;
    assert_eq!(
        (again.acknowledged, again.error.is_none()),
        (9, true),
        "{again:?}"
    );

    Deliveries::of(&read(&topic, COMMITTED)).assert_exactly_once(&id_set(&messages));
}

#[tokio::test]
async fn a_message_committed_late_into_a_hole_is_published_and_the_covered_are_not() {
    let (options, topic, watermarks, writer) = setup(1, 1).await;
    let m: Vec<OutboxMessage> = (0..4)
        .map(|i| {
            writer
                .message(&topic)
                .with_key("k")
                .with_value(format!("v{i}"))
        })
        .collect();
    let lease = Duration::from_secs(10);
    let until = Instant::now() + Duration::from_secs(20);
    let p = publisher(Delivery::ExactlyOnce, &watermarks).await;
    p.bind_outbox(&identity(&options), lease);
    // 5 and 7 published; 6 was a hole the relay stepped over.
    let first = p
        .publish_until(&[stored(0, 5, &m[0]), stored(0, 7, &m[2])], until)
        .await;
    assert_eq!(first.acknowledged, 2, "{first:?}");
    // Another owner finds 6 committed late, 5 and 7 not yet deleted, and 8 new.
    let q = publisher(Delivery::ExactlyOnce, &watermarks).await;
    q.bind_outbox(&identity(&options), lease);
    let batch = [
        stored(0, 5, &m[0]),
        stored(0, 6, &m[1]),
        stored(0, 7, &m[2]),
        stored(0, 8, &m[3]),
    ];
    let second = q.publish_until(&batch, until).await;
    assert_eq!(
        (second.acknowledged, second.error.is_none()),
        (4, true),
        "{second:?}"
    );
    let records = read(&topic, COMMITTED);
    let values: Vec<Vec<u8>> = records.iter().filter_map(|r| r.value_bytes()).collect();
    assert_eq!(
        values,
        [
            b"v0".to_vec(),
            b"v2".to_vec(),
            b"v1".to_vec(),
            b"v3".to_vec()
        ],
        "5 and 7, then the late 6 and the new 8, each once"
    );
}

#[tokio::test]
async fn an_exactly_once_relay_does_not_share_a_table_with_an_at_least_once_relay() {
    let (options, topic, watermarks, writer) = setup(2, 1).await;
    enqueue(&writer, &topic, 4).await;
    let client = dynamodb().await;
    // An at-least-once relay, live for the next few seconds.
    let alo_store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let alo_id = random_name("alo");
    let alo = Relay::new(
        alo_store,
        publisher(Delivery::AtLeastOnce, &watermarks).await,
        fast_relay_options(&alo_id, 2),
    )
    .unwrap();
    let alo_run =
        tokio::spawn(async move { alo.run_until(Instant::now() + Duration::from_secs(6)).await });
    tokio::time::sleep(Duration::from_millis(800)).await;

    let eo_id = random_name("eo");
    let eo_store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let eo = Relay::new(
        eo_store,
        publisher(Delivery::ExactlyOnce, &watermarks).await,
        fast_relay_options(&eo_id, 2),
    )
    .unwrap();
    let refused = eo
        .run_until(Instant::now() + Duration::from_secs(5))
        .await
        .expect_err("an exactly-once relay beside an at-least-once one");
    let text = refused.to_string();
    assert!(
        text.contains("mixed delivery") && text.contains(&alo_id),
        "{text}"
    );
    // It refused before its first heartbeat: the at-least-once relay never counted it.
    let heartbeats = outbox_testkit::scan_all(&client, &options.table_name).await;
    assert!(
        !heartbeats.iter().any(|item| item
            .get(&options.sort_key_attribute)
            .and_then(|v| v.as_s().ok())
            .is_some_and(|sk| sk.contains(&eo_id))),
        "the exactly-once relay wrote a heartbeat"
    );
    let report = alo_run.await.unwrap().unwrap();
    assert_eq!(report.published, 4, "{report:?}");
}

#[tokio::test]
async fn a_rejected_record_aborts_its_transaction_and_only_uncommitted_readers_see_the_copies() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("eo-small");
    outbox_testkit::create_topic_with_config(&topic, 1, &[("max.message.bytes", "2000")]);
    let watermarks = random_name("eo-watermarks");
    create_topic(&watermarks, 1);
    let writer = DynamoDbOutboxWriter::new(client, options.clone()).unwrap();
    let small = writer
        .message(&topic)
        .with_key("k")
        .with_value("small".to_string());
    let large = writer
        .message(&topic)
        .with_key("k")
        .with_value("x".repeat(5000));

    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let mut config = KafkaConfig::from_env().unwrap();
    config.delivery = Delivery::ExactlyOnce;
    config.watermark_topic = watermarks.clone();
    // One record per produce request: the small one is written before the large one is
    // refused, inside the same transaction.
    config.max_request_bytes = 1024;
    let p = KafkaPublisher::connect(config, Instant::now() + Duration::from_secs(30))
        .await
        .unwrap();
    p.bind_outbox(&identity(&options), Duration::from_secs(10));
    let outcome = p
        .publish_until(
            &[stored(0, 1, &small), stored(0, 2, &large)],
            Instant::now() + Duration::from_secs(20),
        )
        .await;
    // As at least once: the prefix before the rejected record, and the rejection.
    assert_eq!(outcome.acknowledged, 1, "{outcome:?}");
    assert!(
        matches!(outcome.error, Some(Error::KafkaRejected { .. })),
        "{outcome:?}"
    );
    let committed = read(&topic, COMMITTED);
    let uncommitted = read(&topic, UNCOMMITTED);
    println!(
        "a batch whose second record the broker refused: read_committed read {} record(s), \
         read_uncommitted {} (the aborted transaction's copy too)",
        committed.len(),
        uncommitted.len()
    );
    assert_eq!(committed.len(), 1);
    assert_eq!(uncommitted.len(), 2);
    let ids: BTreeSet<Option<String>> = uncommitted.iter().map(|r| r.message_id()).collect();
    assert_eq!(ids.len(), 1, "both copies are the small message");
}

/// A writer whose sequence counter was reset puts a new message under the key of a
/// published one that a relay already deleted; the first relay's delete of the old
/// message lands late. Exactly once deletes on the message id: the new message stays (a
/// delete by key alone, as at least once makes it, would remove it unpublished).
#[tokio::test]
async fn a_late_delete_leaves_a_new_message_under_a_reused_key() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use dynamo_outbox::protocol::schema::{self, Keys};

    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let keys = Keys::new(&options);
    let old = writer
        .message("t")
        .with_key("k")
        .with_value("old".to_string());
    let placed = writer.enqueue(std::slice::from_ref(&old)).await.unwrap();
    assert_eq!(placed[0].sequence, 1);
    let late = Instant::now() + Duration::from_secs(10);
    // Published, and deleted by the next owner's reconcile.
    assert_eq!(store.delete_messages(0, &[1], late).await.unwrap(), 1);
    // The counter reset by mistake: the next message takes sequence number 1 again.
    client
        .update_item()
        .table_name(&options.table_name)
        .set_key(Some(
            keys.key(keys.sequence_pk(0), schema::SEQUENCE_SK.to_string()),
        ))
        .update_expression("SET #s = :zero")
        .expression_attribute_names("#s", "Sequence")
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .send()
        .await
        .unwrap();
    let new = writer
        .message("t")
        .with_key("k")
        .with_value("new".to_string());
    assert_eq!(
        writer.enqueue(std::slice::from_ref(&new)).await.unwrap()[0].sequence,
        1
    );

    let next = writer
        .message("t")
        .with_key("k")
        .with_value("next".to_string());
    assert_eq!(
        writer.enqueue(std::slice::from_ref(&next)).await.unwrap()[0].sequence,
        2
    );

    // The first relay's late delete of the old message, on its id, in one request with
    // the delete of a message still there (2) and of one already gone (3): the new one
    // stays, the other two are gone, and the one refusal is counted as such.
    let gone = store
        .delete_messages_if_same(
            0,
            &[
                (1, old.message_id),
                (2, next.message_id),
                (3, uuid::Uuid::new_v4()),
            ],
            late,
        )
        .await
        .unwrap();
    assert_eq!(gone, 3, "the old message is gone either way");
    let left = store.fetch(0, None, 10).await.unwrap().messages;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].message.message_id, new.message_id);
    assert_eq!(
        (
            store.refused_writes().get(WriteKind::Delete),
            store.refused_writes().total()
        ),
        (1, 1)
    );
    // A delete by key alone (at least once's) would have removed it, unpublished.
    assert_eq!(store.delete_messages(0, &[1], late).await.unwrap(), 1);
    assert!(store.fetch(0, None, 10).await.unwrap().messages.is_empty());
}
