//! The batch pipeline's edges against DynamoDB Local and the local broker: after a failed
//! publish the head goes out alone, so a head the broker rejects does not send the rest of
//! its batch again on every retry.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::publish::{KafkaPublisher, PublishOutcome, Publisher};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Error, Relay};
use outbox_testkit::*;
use tokio::time::Instant;

/// The Kafka publisher, except that the broker "rejects" one message for good: the rest
/// of each batch is produced (other partitions' requests succeed, as with a real broker
/// that rejects one oversized record), and the outcome says nothing was acknowledged
/// before the rejected head.
struct RejectingHead {
    inner: Arc<KafkaPublisher>,
    rejected: String,
    calls: AtomicUsize,
}

impl Publisher for RejectingHead {
    async fn publish(&self, batch: &[StoredMessage]) -> PublishOutcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let Some(at) = batch
            .iter()
            .position(|m| m.message.message_id.to_string() == self.rejected)
        else {
            return self.inner.publish(batch).await;
        };
        let before = self.inner.publish(&batch[..at]).await;
        if before.acknowledged < at {
            return before;
        }
        // What follows the rejected record goes out in its own requests (another partition).
        let _ = self.inner.publish(&batch[at + 1..]).await;
        PublishOutcome::new(
            at,
            Some(Error::KafkaRejected {
                topic: batch[at].message.topic.clone(),
                // a rejection that parks the bucket (a record too large or for a partition
                // the topic lacks is moved aside at once instead)
                reason: dynamo_outbox::error::Rejection::InvalidRecord,
                source: None,
            }),
        )
    }
}

#[tokio::test]
async fn after_a_rejected_head_the_head_goes_out_alone_and_the_rest_is_not_sent_again() {
    let (client, wire) = counted_client().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("head");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let head = writer
        .message(&topic)
        .with_partition(0)
        .with_value("invalid");
    let behind: Vec<_> = (0..5)
        .map(|i| {
            writer
                .message(&topic)
                .with_partition(1)
                .with_value(format!("behind-{i}"))
        })
        .collect();
    let mut all = vec![head.clone()];
    all.extend(behind.iter().cloned());
    writer.enqueue(&all).await.unwrap();

    let publisher = Arc::new(RejectingHead {
        inner: kafka_publisher().await,
        rejected: head.message_id.to_string(),
        calls: AtomicUsize::new(0),
    });
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay = Relay::new(store, publisher.clone(), fast_relay_options("head", 1)).unwrap();
    // Several retries: a poison bucket retries every renew interval (1 s here).
    let report = relay
        .run_until(Instant::now() + Duration::from_secs(6))
        .await
        .unwrap();
    let calls = publisher.calls.load(Ordering::SeqCst);
    assert!(
        calls >= 3,
        "the bucket was retried: {calls} calls, {report:?}"
    );
    // The messages behind the head went out with the first (full) batch only; every
    // retry sent the head alone. Before the rule, each retry sent all five again.
    let records = read_topic(&topic);
    let behind_ids: BTreeSet<String> = id_set(&behind);
    let read = Deliveries::of(&records);
    assert!(read.missing(&behind_ids).is_empty(), "{read:?}");
    let copies = records
        .iter()
        .filter(|r| r.message_id().is_some_and(|id| behind_ids.contains(&id)))
        .count();
    println!("{calls} publish calls; {copies} copies of the 5 messages behind the head");
    assert_eq!(
        copies, 5,
        "messages behind a rejected head went out again: {read:?}"
    );
    assert_eq!(report.published, 0, "{report:?}");
    assert_eq!(pending_messages(&client, &options).await, 6);
    assert_no_refusal_on_the_wire(&wire, "a rejected head");
}

/// DynamoDB slow to delete near the deadline: the last wave's deletes stop at their
/// limit, so the graceful stop still runs inside the deadline and releases every lease
/// (before, a chain of slow delete chunks could run past the hard deadline and leave the
/// leases to lapse, `DeadlineMissed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_deletes_near_the_deadline_still_leave_the_stop_its_time() {
    let plain = dynamodb().await;
    let options = fresh_table(&plain, 1).await;
    let topic = random_name("slow-delete");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(plain.clone(), options.clone()).unwrap();
    // 400 messages in one bucket: 16 delete chunks per full batch.
    let mut written = BTreeSet::new();
    for chunk in 0..4 {
        let batch: Vec<_> = (0..100)
            .map(|i| {
                writer
                    .message(&topic)
                    .with_key("k")
                    .with_value(format!("v-{chunk}-{i}"))
            })
            .collect();
        writer.enqueue(&batch).await.unwrap();
        written.extend(id_set(&batch));
    }
    // Every BatchWriteItem (the relay's deletes) takes 700 ms before it is sent.
    let slow =
        faulty_dynamodb(&Fault::on("BatchWriteItem").delay(Duration::from_millis(700))).await;
    let store = DynamoDbOutboxStore::new(slow, options.clone()).unwrap();
    let relay = Relay::new(
        store,
        kafka_publisher().await,
        fast_relay_options("slow", 1),
    )
    .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(6);
    let report = relay.run_until(deadline).await.unwrap();
    let ended = Instant::now();
    assert_eq!(
        report.stop_reason,
        dynamo_outbox::StopReason::Deadline,
        "{report:?}"
    );
    assert!(report.released, "{report:?}");
    assert!(
        ended <= deadline + Duration::from_millis(200),
        "ended {:?} after the deadline",
        ended - deadline
    );
    assert!(lease_owners(&plain, &options)
        .await
        .iter()
        .all(Option::is_none));
    // What was published and deleted is gone; the rest waits; nothing is lost.
    let prefix = dynamo_outbox::protocol::schema::Keys::new(&options).messages_prefix();
    let remaining: BTreeSet<String> = scan_all(&plain, &options.table_name)
        .await
        .iter()
        .filter(|i| {
            i.get("PK")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|pk| pk.starts_with(&prefix))
        })
        .filter_map(|i| Some(i.get("MessageId")?.as_s().ok()?.clone()))
        .collect();
    println!(
        "{} left of 400 at the deadline, report {report:?}",
        remaining.len()
    );
    assert!(
        !remaining.is_empty(),
        "the slow deletes did not slow anything: {report:?}"
    );
    let read = topic_deliveries(&topic);
    assert!(read.unexpected(&written).is_empty(), "{read:?}");
    let accounted: BTreeSet<String> = read.ids.union(&remaining).cloned().collect();
    assert_eq!(
        accounted, written,
        "a message is neither in Kafka nor in the table"
    );
}

/// Work still in flight at the hard deadline releases nothing: the run reports
/// `DeadlineMissed` with `released: false`, its lease still names it, and it is left to
/// lapse, as after a crash; a relay that comes later takes the bucket once it has lapsed
/// and publishes everything, with no refused write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn work_in_flight_at_the_hard_deadline_releases_nothing() {
    let (plain, wire) = counted_client().await;
    let options = fresh_table(&plain, 1).await;
    let topic = random_name("missed");
    create_topic(&topic, 1);
    // Stalls the first Query sent after it is armed for 8 s, blocking the thread that
    // sends it (as a request stuck in a kernel buffer would, out of the relay's reach).
    let stall = Fault::on("Query")
        .disarmed()
        .times(1)
        .delay(Duration::from_secs(8));
    let stalling = faulty_dynamodb(&stall).await;
    let stuck = Relay::new(
        DynamoDbOutboxStore::new(stalling, options.clone()).unwrap(),
        kafka_publisher().await,
        fast_relay_options("stuck", 1),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let stuck = tokio::spawn(async move { stuck.run_until(deadline).await });
    let until = Instant::now() + Duration::from_secs(30);
    while lease_owners(&plain, &options).await != [Some("stuck".to_string())] {
        assert!(Instant::now() < until, "the relay never held the bucket");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its next Query (a probe, a fetch or its round's read) stalls past the deadline.
    stall.arm();
    let writer = DynamoDbOutboxWriter::new(plain.clone(), options.clone()).unwrap();
    let batch: Vec<_> = (0..3)
        .map(|i| {
            writer
                .message(&topic)
                .with_key("k")
                .with_value(format!("v{i}"))
        })
        .collect();
    writer.enqueue(&batch).await.unwrap();
    let written = id_set(&batch);

    let report = stuck.await.unwrap().unwrap();
    assert_eq!(
        report.stop_reason,
        dynamo_outbox::StopReason::DeadlineMissed,
        "{report:?}"
    );
    assert!(!report.released, "{report:?}");
    assert_eq!(stall.hits(), 1, "the stall never ran");
    assert_eq!(
        lease_owners_including_lapsed(&plain, &options).await,
        [Some("stuck".to_string())],
        "the lease was not released"
    );

    // A later relay takes the bucket once the lease has lapsed and publishes all of it.
    let next = Relay::new(
        DynamoDbOutboxStore::new(plain.clone(), options.clone()).unwrap(),
        kafka_publisher().await,
        fast_relay_options("next", 1),
    )
    .unwrap();
    let next = tokio::spawn(async move {
        next.run_until(Instant::now() + Duration::from_secs(20))
            .await
    });
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);
    let next = next.await.unwrap().unwrap();
    assert_eq!((next.published, next.leases_acquired), (3, 1), "{next:?}");
    assert_eq!(next.refused_total(), 0, "{next:?}");
    assert_no_refusal_on_the_wire(&wire, "a relay taking over a lapsed lease");
}

/// Every bucket's lease owner as stored, lapsed or not.
async fn lease_owners_including_lapsed(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
) -> Vec<Option<String>> {
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let c = store.read_coordination().await.unwrap();
    (0..options.bucket_count)
        .map(|b| c.lease(b).and_then(|l| l.owner.clone()))
        .collect()
}

/// A one-bucket outbox holding 21 messages of one key with every even sequence number
/// deleted: ten one-number gaps (2, 4, ..., 20) between the odd ones.
async fn bucket_with_ten_gaps(
    client: &aws_sdk_dynamodb::Client,
) -> (dynamo_outbox::OutboxOptions, Vec<u64>) {
    let options = fresh_table(client, 1).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let batch: Vec<_> = (1..=21)
        .map(|i| {
            writer
                .message("gaps")
                .with_key("k")
                .with_value(format!("v{i}"))
        })
        .collect();
    let enqueued = writer.enqueue(&batch).await.unwrap();
    assert_eq!(
        enqueued.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (1..=21).collect::<Vec<u64>>()
    );
    let keys = dynamo_outbox::protocol::schema::Keys::new(&options);
    for seq in (2..=20).step_by(2) {
        client
            .delete_item()
            .table_name(&options.table_name)
            .set_key(Some(keys.key(
                keys.message_pk(0),
                dynamo_outbox::protocol::schema::message_sk(seq),
            )))
            .send()
            .await
            .unwrap();
    }
    (options, (1..=21).step_by(2).collect())
}

/// More gaps in one fetch than the relay probes: it probes eight, none filled, and the
/// batch stops before the ninth (at 18), publishing nothing past a gap nobody looked into.
#[tokio::test]
async fn more_than_eight_gaps_in_one_fetch_stop_the_batch_before_the_ninth() {
    let client = dynamodb().await;
    let (options, present) = bucket_with_ten_gaps(&client).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options).unwrap();
    let fetched = store.fetch(0, None, 100).await.unwrap();
    let sequences: Vec<u64> = fetched.messages.iter().map(|m| m.sequence).collect();
    let before_the_ninth: Vec<u64> = present.iter().copied().filter(|&s| s < 18).collect();
    assert_eq!(sequences, before_the_ninth);
    assert_eq!(
        (fetched.gap_probes, fetched.fetches),
        (dynamo_outbox::protocol::store::MAX_GAP_PROBES as u32, 1)
    );
}

/// Answers every gap probe (a strongly consistent COUNT query) as if the gap had filled
/// meanwhile, by widening its range down to the bucket's first message.
fn every_gap_fills() -> Fault {
    Fault::on("Query").edit(|input| {
        use aws_sdk_dynamodb::operation::query::QueryInput;
        use aws_sdk_dynamodb::types::{AttributeValue, Select};
        let Some(q) = input.downcast_mut::<QueryInput>() else {
            return false;
        };
        let Some(values) = q.expression_attribute_values.as_mut() else {
            return false;
        };
        if q.select != Some(Select::Count) {
            return false;
        }
        values.insert(
            ":from".into(),
            AttributeValue::S(dynamo_outbox::protocol::schema::message_sk(1)),
        );
        true
    })
}

/// A gap that is found filled on every fetch: the relay fetches again, at most
/// `MAX_REFETCHES` times, and then stops the batch before that gap (here: only the
/// message before the first gap), never past it.
#[tokio::test]
async fn a_gap_that_fills_on_every_refetch_stops_at_the_refetch_bound() {
    let plain = dynamodb().await;
    let (options, _) = bucket_with_ten_gaps(&plain).await;
    let filling = every_gap_fills();
    let client = faulty_dynamodb(&filling).await;
    let store = DynamoDbOutboxStore::new(client, options).unwrap();
    let fetched = store.fetch(0, None, 100).await.unwrap();
    let sequences: Vec<u64> = fetched.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [1], "nothing past the gap at 2");
    let bound = dynamo_outbox::protocol::store::MAX_REFETCHES;
    assert_eq!(
        (fetched.fetches, fetched.gap_probes),
        (1 + bound, 1 + bound),
        "one probe per fetch, each found filled"
    );
    assert_eq!(filling.hits(), 1 + bound as usize);
}
