//! The relay's topic allow-list (`OUTBOX_ALLOWED_TOPICS`), the backstop behind the
//! writers' check: a message on another topic written straight into the table (a writer
//! with `PutItem` on it, past the enqueue function) is not published; its bucket parks at
//! it as poison (logged, counted, in the run's publish failures, visible in `status`)
//! until it is quarantined, and the rest of the fleet goes on. Against DynamoDB Local and
//! the local Kafka broker (run through scripts/stack.sh; never skipped).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::metrics::RelayMetrics;
use dynamo_outbox::options::TopicAllowList;
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, OutboxMessage, Relay};
use outbox_testkit::*;
use tokio::time::Instant;

/// Counts what the relay reports as poison and as published.
#[derive(Debug, Default)]
struct Counted {
    poison: AtomicU64,
    published: AtomicU64,
}

impl RelayMetrics for Counted {
    fn published(&self, _bucket: u32, count: u64) {
        self.published.fetch_add(count, Ordering::SeqCst);
    }
    fn poison_item(&self, _bucket: u32) {
        self.poison.fetch_add(1, Ordering::SeqCst);
    }
}

/// The log lines of this test binary (every test's relays), for the relay's error line.
fn capture_logs() -> Captured {
    Captured::install_global("warn")
}

/// A key whose messages land in `bucket` (of `bucket_count`), `in_bucket` deciding
/// whether it must or must not.
fn key_for(bucket: u32, bucket_count: u32, in_bucket: bool, n: usize) -> String {
    (0..)
        .map(|i| format!("key-{bucket}-{in_bucket}-{n}-{i}"))
        .find(|k| {
            let b = OutboxMessage::new("t", bucket_count)
                .with_key(k.as_str())
                .bucket();
            (b == bucket) == in_bucket
        })
        .unwrap()
}

#[tokio::test]
async fn a_disallowed_topic_written_straight_into_the_table_is_parked_reported_and_not_published() {
    let logs = capture_logs();
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let allowed = random_name("orders");
    let refused = random_name("payments");
    // Both topics exist: were the relay to publish the refused one, the broker would take it.
    create_topic(&allowed, 2);
    create_topic(&refused, 2);

    // The writer of a service with direct PutItem rights: no allow-list, no enqueue function.
    let direct = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    assert!(options.allowed_topics.allows_every_topic());
    let parked = 1;
    let k = key_for(parked, 4, true, 0);
    let other_in_bucket = key_for(parked, 4, true, 1);
    let elsewhere: Vec<String> = (0..6).map(|n| key_for(parked, 4, false, n)).collect();

    // In the parked bucket: one allowed message before the refused one, then the refused
    // one, then later ones of the same key and of another key of that bucket.
    let before = direct
        .message(&allowed)
        .with_key(k.as_str())
        .with_value("before");
    let bad = direct
        .message(&refused)
        .with_key(k.as_str())
        .with_value("not for you");
    let same_key_after = direct
        .message(&allowed)
        .with_key(k.as_str())
        .with_value("after");
    let other_key_after = direct
        .message(&allowed)
        .with_key(other_in_bucket.as_str())
        .with_value("after");
    let early: Vec<OutboxMessage> = elsewhere
        .iter()
        .map(|key| {
            direct
                .message(&allowed)
                .with_key(key.as_str())
                .with_value("early")
        })
        .collect();
    direct.enqueue(&early).await.unwrap();
    direct.enqueue(std::slice::from_ref(&before)).await.unwrap();
    let bad_seq = direct.enqueue(std::slice::from_ref(&bad)).await.unwrap()[0].sequence;
    direct
        .enqueue(&[same_key_after.clone(), other_key_after.clone()])
        .await
        .unwrap();

    // The relay allows only the allowed topic.
    let list = TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", &allowed).unwrap();
    let relay_store = || {
        DynamoDbOutboxStore::new(
            client.clone(),
            options.clone().with_allowed_topics(list.clone()),
        )
        .unwrap()
    };
    let metrics = Arc::new(Counted::default());
    let relay = Relay::new(
        relay_store(),
        kafka_publisher().await,
        fast_relay_options(&random_name("relay"), 4),
    )
    .unwrap()
    .with_metrics(metrics.clone());
    let run = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(9))
            .await
    });

    // The rest of the fleet goes on: the other buckets, and what lies before the refused
    // message in its own bucket ...
    let mut expected = id_set(early.iter().chain([&before]));
    wait_for_ids(&allowed, &expected, Duration::from_secs(20)).await;
    // ... and later messages of other keys, written while the bucket is parked.
    let later: Vec<OutboxMessage> = elsewhere
        .iter()
        .map(|key| {
            direct
                .message(&allowed)
                .with_key(key.as_str())
                .with_value("later")
        })
        .collect();
    direct.enqueue(&later).await.unwrap();
    expected.extend(id_set(&later));
    wait_for_ids(&allowed, &expected, Duration::from_secs(20)).await;

    let report = run.await.unwrap().unwrap();
    assert!(report.released, "{report:?}");
    // Reported: in the run's summary, its metrics and its log.
    assert!(report.publish_failures >= 1, "{report:?}");
    assert!(metrics.poison.load(Ordering::SeqCst) >= 1);
    assert_eq!(report.published, expected.len() as u64, "{report:?}");
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("bucket stuck on an item it cannot publish"))
        .unwrap_or_else(|| panic!("no poison line in the log:\n{text}"));
    assert!(
        line.contains(&format!("topic \"{refused}\" is not allowed here"))
            && line.contains(&bad.message_id.to_string())
            && line.contains(&format!("sequence={bad_seq}")),
        "{line}"
    );

    // Not published, and nothing lost: the refused message waits at the head of its
    // bucket (status shows the stuck head), and so do the later ones of its bucket
    // (the poison semantics: a bucket's order is never skipped over).
    assert!(
        read_topic(&refused).is_empty(),
        "the refused topic got a record"
    );
    let delivered = topic_deliveries(&allowed);
    let held = id_set([&same_key_after, &other_key_after]);
    assert_eq!(
        delivered.missing(&held),
        held,
        "nothing after the refused message went out"
    );
    assert_eq!(pending_messages(&client, &options).await, 3);
    let status = dynamo_outbox::status::read_status(&relay_store(), Duration::from_secs(3))
        .await
        .unwrap();
    let bucket = &status.buckets[parked as usize];
    assert_eq!(bucket.head_sequence, Some(bad_seq), "{bucket:?}");
    assert!(status
        .buckets
        .iter()
        .filter(|b| b.bucket != parked)
        .all(|b| !b.has_pending()));

    // The operator quarantines it (`outboxctl quarantine`): the bucket goes on, and the
    // refused message is kept in the dead-letter partition, still unpublished.
    relay_store().quarantine(parked, bad_seq).await.unwrap();
    let relay = Relay::new(
        relay_store(),
        kafka_publisher().await,
        fast_relay_options(&random_name("relay"), 4),
    )
    .unwrap();
    let run = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(6))
            .await
    });
    expected.extend(held);
    let delivered = wait_for_ids(&allowed, &expected, Duration::from_secs(20)).await;
    run.await.unwrap().unwrap();
    assert_eq!(delivered.missing(&expected), BTreeSet::new());
    assert!(read_topic(&refused).is_empty());
    assert_eq!(pending_messages(&client, &options).await, 0);
    let dead = relay_store().dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0][dynamo_outbox::protocol::attr::MESSAGE_ID]
            .as_s()
            .unwrap(),
        &bad.message_id.to_string()
    );
}
