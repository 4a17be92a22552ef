//! Large items (values of 300 KB; DynamoDB allows items up to 400 KB) against DynamoDB
//! Local and the local broker: a backlog of several hundred over every bucket drains, no
//! batch step runs past the lease it was started under, and two relays (one joining
//! mid-drain) never own a bucket at the same time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::metrics::RelayMetrics;
use dynamo_outbox::publish::{KafkaPublisher, PublishOutcome, Publisher};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Relay, RelayOptions};
use outbox_testkit::*;
use tokio::time::Instant;

const VALUE_BYTES: usize = 300 * 1024;

/// When each relay started and stopped believing it owns each bucket.
#[derive(Debug, Default)]
struct Ownership {
    events: Mutex<Vec<(String, u32, bool, Instant)>>,
}

#[derive(Debug)]
struct OwnershipOf {
    relay: String,
    log: Arc<Ownership>,
}

impl RelayMetrics for OwnershipOf {
    fn ownership(&self, bucket: u32, owned: bool) {
        self.log
            .events
            .lock()
            .unwrap()
            .push((self.relay.clone(), bucket, owned, Instant::now()));
    }
}

impl Ownership {
    /// Per (relay, bucket): the intervals it owned the bucket (an open one ends at `end`).
    fn intervals(&self, end: Instant) -> BTreeMap<(String, u32), Vec<(Instant, Instant)>> {
        let mut open: HashMap<(String, u32), Instant> = HashMap::new();
        let mut out: BTreeMap<(String, u32), Vec<(Instant, Instant)>> = BTreeMap::new();
        for (relay, bucket, owned, at) in self.events.lock().unwrap().iter() {
            let key = (relay.clone(), *bucket);
            if *owned {
                open.insert(key, *at);
            } else if let Some(from) = open.remove(&key) {
                out.entry(key).or_default().push((from, *at));
            }
        }
        for (key, from) in open {
            out.entry(key).or_default().push((from, end));
        }
        out
    }
}

/// One publish call: relay, bucket, start, end, and the limit it was given.
type Call = (String, u32, Instant, Instant, Instant);

/// The Kafka publisher, recording for each call its bucket, its limit and when it ended.
struct Recording {
    inner: Arc<KafkaPublisher>,
    relay: String,
    calls: Arc<Mutex<Vec<Call>>>,
    acked: Arc<std::sync::atomic::AtomicUsize>,
}

impl Publisher for Recording {
    fn publish<'a>(
        &'a self,
        batch: &'a [StoredMessage],
    ) -> impl std::future::Future<Output = PublishOutcome> + Send + 'a {
        self.inner.publish(batch)
    }

    async fn publish_until(&self, batch: &[StoredMessage], until: Instant) -> PublishOutcome {
        let started = Instant::now();
        let outcome = self.inner.publish_until(batch, until).await;
        self.acked
            .fetch_add(outcome.acknowledged, std::sync::atomic::Ordering::Relaxed);
        let bucket = batch.first().map_or(0, |m| m.message.bucket());
        self.calls.lock().unwrap().push((
            self.relay.clone(),
            bucket,
            started,
            Instant::now(),
            until,
        ));
        outcome
    }
}

fn options(relay_id: &str) -> RelayOptions {
    RelayOptions::default()
        .with_bucket_count(8)
        .with_relay_id(relay_id)
        .with_poll_interval(Duration::from_millis(200))
        .with_error_backoff(Duration::from_millis(500))
        .with_lease_duration(Duration::from_secs(9))
        .with_lease_renew_interval(Duration::from_secs(3))
}

/// The records of `topic` (values cut to their first 32 bytes): message id, key, the
/// value's sequence number and length, in offset order per partition.
fn read_large(topic: &str) -> Vec<(String, String, u64, usize)> {
    try_read_records(&["read", topic, "--value-head", "32", "--timeout", "120"])
        .unwrap()
        .into_iter()
        .map(|r| {
            let id = r.message_id().unwrap();
            let key = String::from_utf8(r.key_bytes().unwrap()).unwrap();
            let head = String::from_utf8_lossy(&r.value_bytes().unwrap()).into_owned();
            let n: u64 = head.split(':').nth(1).unwrap().parse().unwrap();
            (id, key, n, r.value_len.unwrap())
        })
        .collect()
}

/// Enqueues `count` messages of 300 KB over 64 keys; their ids.
async fn backlog(writer: &DynamoDbOutboxWriter, topic: &str, count: u64) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut n = 0;
    while n < count {
        // 10 items of 300 KB per transaction: under its 4 MB.
        let batch: Vec<_> = (n..(n + 10).min(count))
            .map(|i| {
                let key = format!("key-{}", i % 64);
                let mut value = format!("{key}:{i:08}:").into_bytes();
                value.resize(VALUE_BYTES, b'x');
                writer.message(topic).with_key(key).with_value(value)
            })
            .collect();
        writer.enqueue(&batch).await.unwrap();
        ids.extend(id_set(&batch));
        n += batch.len() as u64;
    }
    ids
}

/// Message items left (a keys-only count: a scan of 300 KB items would take seconds).
async fn pending(client: &aws_sdk_dynamodb::Client, table: &dynamo_outbox::OutboxOptions) -> usize {
    let prefix = dynamo_outbox::protocol::schema::Keys::new(table).messages_prefix();
    let mut count = 0;
    let mut start = None;
    loop {
        let out = client
            .scan()
            .table_name(&table.table_name)
            .filter_expression("begins_with(PK, :p)")
            .expression_attribute_values(
                ":p",
                aws_sdk_dynamodb::types::AttributeValue::S(prefix.clone()),
            )
            .select(aws_sdk_dynamodb::types::Select::Count)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        count += out.count() as usize;
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return count,
        }
    }
}

/// Per key, first deliveries in enqueue order; every record 300 KB.
fn assert_order_and_size(records: &[(String, String, u64, usize)]) {
    let mut seen = BTreeSet::new();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (id, key, n, len) in records {
        assert_eq!(*len, VALUE_BYTES, "value of {id} cut or padded");
        if !seen.insert(id) {
            continue;
        }
        if let Some(prev) = last.insert(key, *n) {
            assert!(*n > prev, "order inversion for {key}: {n} after {prev}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_of_300_kb_messages_drains_with_every_step_inside_its_lease() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (client, wire) = counted_client().await;
    let table = fresh_table(&client, 8).await;
    let topic = random_name("large");
    create_topic(&topic, 4);
    let writer = DynamoDbOutboxWriter::new(client.clone(), table.clone()).unwrap();
    let written = backlog(&writer, &topic, 320).await;
    assert_eq!(written.len(), 320);

    let ownership = Arc::new(Ownership::default());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let kafka = kafka_publisher().await;
    let make = |id: &str| {
        let store = DynamoDbOutboxStore::new(client.clone(), table.clone()).unwrap();
        let publisher = Arc::new(Recording {
            inner: kafka.clone(),
            relay: id.into(),
            calls: calls.clone(),
            acked: acked.clone(),
        });
        Relay::new(store, publisher, options(id))
            .unwrap()
            .with_metrics(Arc::new(OwnershipOf {
                relay: id.into(),
                log: ownership.clone(),
            }))
    };
    let started = Instant::now();
    let run = |relay: Relay<Recording>| {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            relay
                .run_until_shutdown(
                    async move {
                        let _ = stopped.await;
                    },
                    Duration::from_secs(20),
                )
                .await
        });
        (stop, handle)
    };
    let (stop_first, first) = run(make("large-a"));
    // The second joins mid-drain, once the first has published part of the backlog.
    let until = started + Duration::from_secs(120);
    // (Counted at the publisher: a scan of 300 KB items takes seconds.)
    while acked.load(std::sync::atomic::Ordering::Relaxed) < 40 {
        assert!(Instant::now() < until, "the first relay did not get going");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (stop_second, second) = run(make("large-b"));
    loop {
        while acked.load(std::sync::atomic::Ordering::Relaxed) < 320 {
            assert!(Instant::now() < until, "the backlog did not drain in 120 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if pending(&client, &table).await == 0 {
            break;
        }
        assert!(Instant::now() < until, "the backlog did not drain in 120 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let drained = started.elapsed();
    let _ = stop_second.send(());
    let _ = stop_first.send(());
    let a = first.await.unwrap().unwrap();
    let b = second.await.unwrap().unwrap();
    let end = Instant::now();
    println!("drained 320 x 300 KB in {drained:?}: {a:?} {b:?}");
    assert!(a.released && b.released, "{a:?} {b:?}");
    assert_eq!(a.refused_total() + b.refused_total(), 0);
    assert_no_refusal_on_the_wire(&wire, "two relays draining large items");
    assert!(
        b.leases_acquired > 0 && b.published > 0,
        "the second relay never took a share: {b:?}"
    );

    // No publish call ended after the limit it was given (the lease's validity minus a
    // renew interval) beyond the answer's way back.
    let calls = calls.lock().unwrap().clone();
    assert!(!calls.is_empty());
    for r in ["large-a", "large-b"] {
        let n = calls.iter().filter(|c| c.0 == r).count();
        println!("{r}: {n} publish calls");
    }
    for (relay, bucket, from, to, limit) in &calls {
        assert!(
            *to <= *limit + Duration::from_millis(500),
            "{relay} published bucket {bucket} until {:?} past its limit",
            *to - *limit
        );
        let _ = from;
    }
    // Each publish ran while its relay owned the bucket, and the two relays never owned
    // a bucket at the same time.
    let intervals = ownership.intervals(end);
    for (relay, bucket, from, to, _) in &calls {
        let owned = intervals
            .get(&(relay.clone(), *bucket))
            .into_iter()
            .flatten();
        assert!(
            owned
                .clone()
                .any(|(o_from, o_to)| o_from <= from && to <= o_to),
            "{relay} published bucket {bucket} outside its ownership"
        );
    }
    for bucket in 0..8 {
        let of = |r: &str| {
            intervals
                .get(&(r.to_string(), bucket))
                .cloned()
                .unwrap_or_default()
        };
        for (af, at) in of("large-a") {
            for (bf, bt) in of("large-b") {
                assert!(
                    at <= bf || bt <= af,
                    "bucket {bucket} owned by both at once"
                );
            }
        }
    }
    // Every message, 300 KB each, per-key order of first deliveries.
    let topic2 = topic.clone();
    let records = tokio::task::spawn_blocking(move || read_large(&topic2))
        .await
        .unwrap();
    let read: BTreeSet<String> = records.iter().map(|r| r.0.clone()).collect();
    assert_eq!(read, written, "missing or foreign ids");
    assert_order_and_size(&records);
    println!(
        "{} records read for {} messages",
        records.len(),
        written.len()
    );
}

/// Makes DynamoDB slow to return large items: every answered `Query` takes 250 ms more
/// per message item it returns (probes, which project the key alone, are not slowed).
fn slow_large_items() -> Fault {
    Fault::on("Query").after_answer(|answer| {
        let items = answer
            .and_then(|o| o.downcast_ref::<aws_sdk_dynamodb::operation::query::QueryOutput>())
            .map_or(0, |q| q.items().iter().filter(|i| i.len() > 2).count());
        // A worker of the multi-threaded test runtime; the others go on.
        std::thread::sleep(Duration::from_millis(250) * items as u32);
    })
}

/// A table too slow for the default batch share of 300 KB items (4 MiB, 13 items: 3.3 s
/// to read here, where a batch has about 2 s before its lease needs renewing): every fetch
/// runs into its time limit. The relay halves the bucket's share after each cut fetch
/// until one goes through, so the backlog drains (before, each cut fetch was retried at
/// the same size and nothing was ever published).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_too_slow_to_fetch_at_full_size_drains_in_smaller_fetches() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let plain = dynamodb().await;
    let options = fresh_table(&plain, 1).await;
    let topic = random_name("slow-large");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(plain.clone(), options.clone()).unwrap();
    let written = backlog(&writer, &topic, 20).await;
    let slow = faulty_dynamodb(&slow_large_items()).await;
    let relay = Relay::new(
        DynamoDbOutboxStore::new(slow, options.clone()).unwrap(),
        kafka_publisher().await,
        fast_relay_options("slow-large", 1).with_idle_stop(Duration::from_secs(2)),
    )
    .unwrap();
    let report = relay
        .run_until(Instant::now() + Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(
        report.stop_reason,
        dynamo_outbox::StopReason::Idle,
        "drained, then idle: {report:?}"
    );
    // What a user sees: every message in Kafka and none left in the table, and a report
    // that says so: a delete cut at its limit on this slow table, which lands after the
    // relay looked, is counted when the next fetch finds the messages gone.
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_at_least_once(&written);
    assert_eq!(pending(&plain, &options).await, 0, "{report:?}");
    assert_eq!(report.published, written.len() as u64, "{report:?}");
}
