//! The relay against DynamoDB Local and the local Kafka broker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::clock::{OffsetClock, TICKS_PER_SECOND};
use dynamo_outbox::message::{murmur2, to_positive};
use dynamo_outbox::publish::{KafkaPublisher, PublishOutcome, Publisher};
use dynamo_outbox::schema::StoredMessage;
use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, Error, Header, OutboxMessage, OutboxOptions, Relay,
    RelayOptions, RunReport, StopReason,
};
use outbox_testkit::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A relay running in the background until its stop sender fires.
struct Running {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<dynamo_outbox::Result<RunReport>>,
}

impl Running {
    async fn stop(self) -> RunReport {
        let _ = self.stop.send(());
        self.handle.await.expect("relay task").expect("relay run")
    }
}

fn spawn<P: Publisher>(relay: Relay<P>) -> Running {
    let (stop, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        relay
            .run_until_shutdown(
                async move {
                    let _ = rx.await;
                },
                Duration::from_secs(10),
            )
            .await
    });
    Running { stop, handle }
}

async fn relay_with<P: Publisher>(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    publisher: Arc<P>,
    relay_options: RelayOptions,
) -> Relay<P> {
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    Relay::new(store, publisher, relay_options).unwrap()
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn owned_counts(owners: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for o in owners.iter().flatten() {
        *counts.entry(o.clone()).or_default() += 1;
    }
    counts
}

/// Per key, the values of first deliveries must be in enqueue order.
fn assert_per_key_order(records: &[ReadRecord]) {
    let mut seen = HashSet::new();
    let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
    for r in records {
        let id = r.message_id().expect("message id header");
        if !seen.insert(id) {
            continue;
        }
        let value = String::from_utf8(r.value_bytes().unwrap()).unwrap();
        let n: u64 = value.rsplit(':').next().unwrap().parse().unwrap();
        let key = r.key_bytes().unwrap();
        if let Some(prev) = last.insert(key.clone(), n) {
            assert!(
                n > prev,
                "order inversion for key {:?}: {n} after {prev}",
                String::from_utf8_lossy(&key)
            );
        }
    }
}

fn keyed(writer: &DynamoDbOutboxWriter, topic: &str, key: &str, n: u64) -> OutboxMessage {
    writer
        .message(topic)
        .with_key(key)
        .with_value(format!("{key}:{n}"))
        .with_header(Header::new("trace", format!("t-{n}")))
        .with_header(Header::null("nullable"))
}

#[tokio::test]
async fn delivers_in_order_with_headers_and_empties_the_table() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("orders");
    create_topic(&topic, 3);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut sent = Vec::new();
    for n in 0..10u64 {
        let batch: Vec<_> = (0..6)
            .map(|k| keyed(&writer, &topic, &format!("key-{k}"), n))
            .collect();
        writer.enqueue(&batch).await.unwrap();
        sent.extend(batch);
    }
    let (counted, wire) = counted_client().await;
    let relay = relay_with(
        &counted,
        &options,
        kafka_publisher().await,
        fast_relay_options("solo", 4),
    )
    .await;
    let running = spawn(relay);
    wait_until("the table is drained", Duration::from_secs(30), || async {
        pending_messages(&client, &options).await == 0
    })
    .await;
    let report = running.stop().await;

    let records = read_topic(&topic);
    // Each message exactly once on a healthy run: the ids read are the ids written.
    Deliveries::of(&records).assert_exactly_once(&id_set(&sent));
    assert_eq!(records.len(), sent.len());
    assert_per_key_order(&records);
    let by_id: HashMap<String, &OutboxMessage> =
        sent.iter().map(|m| (m.message_id.to_string(), m)).collect();
    for r in &records {
        let m = by_id[&r.message_id().unwrap()];
        assert_eq!(r.key_bytes(), m.key);
        assert_eq!(r.value_bytes(), m.value);
        // the writer's headers in order (the null as null), then the message-id header
        let headers = r.header_list();
        assert_eq!(
            headers,
            [
                ("trace".to_string(), m.headers[0].value.clone()),
                ("nullable".to_string(), None),
                (
                    dynamo_outbox::publish::DEFAULT_MESSAGE_ID_HEADER.to_string(),
                    Some(m.message_id.to_string().into_bytes())
                ),
            ]
        );
        // The Java client's default partitioner.
        assert_eq!(
            r.partition as u32,
            to_positive(murmur2(m.key.as_ref().unwrap())) % 3
        );
    }
    assert_eq!(report.published, sent.len() as u64);
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&wire, "the solo relay");
    assert!(report.released);
    assert_eq!(report.stop_reason, StopReason::Shutdown);
    assert!(
        lease_owners(&client, &options)
            .await
            .iter()
            .all(Option::is_none),
        "leases released"
    );
}

#[tokio::test]
async fn three_relays_split_eight_buckets_without_refused_writes_and_hand_over_on_stop() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 8).await;
    let publisher = kafka_publisher().await;
    // The relays' client: DynamoDB's refusals counted at the wire.
    let (counted, wire) = counted_client().await;
    let mut relays = Vec::new();
    for (i, id) in ["relay-c", "relay-a", "relay-b"].into_iter().enumerate() {
        let mut o = fast_relay_options(id, 8);
        o.lease_duration = Duration::from_secs(6);
        relays.push((
            id,
            spawn(relay_with(&counted, &options, publisher.clone(), o).await),
        ));
        // Scale out: each newcomer joins a fleet that holds every bucket.
        wait_until(
            &format!("{} relays own all buckets fairly", i + 1),
            Duration::from_secs(15),
            || async {
                let owners = lease_owners(&client, &options).await;
                let counts = owned_counts(&owners);
                owners.iter().all(Option::is_some)
                    && counts.len() == i + 1
                    && counts.values().max().unwrap() - counts.values().min().unwrap() <= 1
            },
        )
        .await;
    }
    let counts = owned_counts(&lease_owners(&client, &options).await);
    assert_eq!(
        counts
            .values()
            .copied()
            .collect::<Vec<_>>()
            .iter()
            .sum::<usize>(),
        8
    );
    assert!(counts.values().all(|&c| c == 2 || c == 3), "{counts:?}");

    // Graceful stop of one: the others take its buckets on their next round, not after the
    // lease lapses. Evidence from the leases themselves: the new owner's first seen
    // expiry less the lease duration is the time of its claim or of a later renewal, so
    // when that is before the leaver's own expiry, the bucket was taken before the
    // leaver's lease would have lapsed (no fixed bound against the lease).
    let (leaving_id, leaving) = relays.remove(0);
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let leaver_expiry: BTreeMap<u32, i64> = plain
        .read_coordination()
        .await
        .unwrap()
        .leases
        .iter()
        .filter(|l| l.owner.as_deref() == Some(leaving_id))
        .map(|l| (l.bucket, l.expires_at))
        .collect();
    let report = leaving.stop().await;
    assert!(report.released, "{report:?}");
    let lease_ticks = 6 * TICKS_PER_SECOND;
    let mut first_claim: BTreeMap<u32, i64> = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(30);
    while first_claim.len() < leaver_expiry.len() {
        let c = plain.read_coordination().await.unwrap();
        for &bucket in leaver_expiry.keys() {
            if let Some(l) = c.lease(bucket).filter(|l| l.owner.is_some()) {
                first_claim
                    .entry(bucket)
                    .or_insert(l.expires_at - lease_ticks);
            }
        }
        assert!(Instant::now() < until, "not taken over: {first_claim:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (bucket, lapses_at) in &leaver_expiry {
        assert!(
            first_claim[bucket] < *lapses_at,
            "bucket {bucket} was taken only after the leaver's lease lapsed"
        );
    }
    wait_until(
        "two relays own all eight buckets",
        Duration::from_secs(15),
        || async {
            let owners = lease_owners(&client, &options).await;
            owners.iter().all(Option::is_some) && owned_counts(&owners).len() == 2
        },
    )
    .await;

    let mut refused = report.refused_total();
    for (_, r) in relays {
        refused += r.stop().await.refused_total();
    }
    assert_eq!(
        refused, 0,
        "a healthy fleet makes no refused conditional write"
    );
    assert_no_refusal_on_the_wire(&wire, "three relays scaling out and in");
    assert!(
        wire.get("UpdateItem").ok > 0,
        "the counter saw the lease writes: {:?}",
        wire.snapshot()
    );
}

#[tokio::test]
async fn a_crashed_relays_buckets_are_taken_over_after_its_leases_lapse() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let a = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("a", 4),
        )
        .await,
    );
    wait_until("a owns all", Duration::from_secs(10), || async {
        lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("a"))
    })
    .await;
    let b = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("b", 4),
        )
        .await,
    );
    wait_until("a and b split", Duration::from_secs(10), || async {
        owned_counts(&lease_owners(&client, &options).await).get("b") == Some(&2)
    })
    .await;
    // Crash: the task is dropped mid-flight; nothing is released.
    b.handle.abort();
    let _ = b.stop;
    // b's leases as stored at the crash: a takes each one only once it has lapsed. Each
    // bucket is watched until a holds it; the time a's lease is first seen is after a's
    // claim, which must come after b's expiry (no fixed sleep against the lease).
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let mut pending: BTreeMap<u32, i64> = plain
        .read_coordination()
        .await
        .unwrap()
        .leases
        .iter()
        .filter(|l| l.owner.as_deref() == Some("b"))
        .map(|l| (l.bucket, l.expires_at))
        .collect();
    assert_eq!(pending.len(), 2, "{pending:?}");
    let until = Instant::now() + Duration::from_secs(30);
    while !pending.is_empty() {
        let c = plain.read_coordination().await.unwrap();
        let seen_at = plain.clock().now_ticks();
        pending.retain(|&bucket, &mut lapses_at| {
            let taken = c.lease(bucket).and_then(|l| l.owner.as_deref()) == Some("a");
            assert!(
                !taken || seen_at >= lapses_at,
                "bucket {bucket} taken {} ms before b's lease lapsed",
                (lapses_at - seen_at) / (TICKS_PER_SECOND / 1000)
            );
            !taken
        });
        assert!(Instant::now() < until, "not taken over: {pending:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = a.stop().await;
    assert_eq!(report.refused_total(), 0, "{report:?}");
    // The takeover claims lapsed leases: DynamoDB refused none of either relay's writes.
    assert_no_refusal_on_the_wire(&wire, "a crash and a takeover");
}

#[tokio::test]
async fn more_relays_than_buckets_leaves_standbys_that_write_no_lease() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let mut running = Vec::new();
    let m_only = vec![Some("pod-m".to_string()); 2];
    let expected = vec![Some("pod-m".to_string()), Some("pod-n".to_string())];
    running.push(spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("pod-m", 2),
        )
        .await,
    ));
    wait_until("pod-m holds both", Duration::from_secs(15), || async {
        lease_owners(&client, &options).await == m_only
    })
    .await;
    running.push(spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("pod-n", 2),
        )
        .await,
    ));
    wait_until(
        "pod-m and pod-n hold one bucket each",
        Duration::from_secs(15),
        || async { lease_owners(&client, &options).await == expected },
    )
    .await;
    // Two more join a fleet whose split is already fair: nothing moves, though pod-a sorts first.
    for id in ["pod-a", "pod-q"] {
        running.push(spawn(
            relay_with(
                &counted,
                &options,
                publisher.clone(),
                fast_relay_options(id, 2),
            )
            .await,
        ));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        lease_owners(&client, &options).await,
        expected,
        "incumbents keep their buckets"
    );
    // Stop the standbys first: once an incumbent stops and hands its bucket
    // back, a standby taking it over is the protocol working, not a fault.
    let mut refused = 0;
    let mut acquired = BTreeMap::new();
    let mut stopping: Vec<_> = running
        .into_iter()
        .zip(["pod-m", "pod-n", "pod-a", "pod-q"])
        .collect();
    stopping.rotate_left(2);
    for (r, id) in stopping {
        let report = r.stop().await;
        refused += report.refused_total();
        acquired.insert(id, report.leases_acquired);
    }
    assert_eq!(refused, 0);
    assert_no_refusal_on_the_wire(&wire, "two incumbents and two standbys");
    assert_eq!(
        acquired["pod-a"] + acquired["pod-q"],
        0,
        "standbys never wrote a lease: {acquired:?}"
    );
}

#[tokio::test]
async fn a_clock_set_back_neither_renews_backwards_nor_publishes() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("clock");
    create_topic(&topic, 1);
    let clock = OffsetClock::new(0);
    let (counted, wire) = counted_client().await;
    let store = DynamoDbOutboxStore::new(counted, options.clone())
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let relay = Relay::new(
        store.clone(),
        kafka_publisher().await,
        fast_relay_options("skewed", 2),
    )
    .unwrap();
    let refused = store.refused_writes().clone();
    let running = spawn(relay);
    wait_until("it owns both", Duration::from_secs(10), || async {
        lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("skewed"))
    })
    .await;
    // Set the clock back by 10 s, more than the renew interval (1 s) and the lease (3 s).
    clock.set_offset_ticks(-10 * TICKS_PER_SECOND);
    let expiry_before = expiries(&store).await;
    // Its next round (renew interval 1 s) notices; a message enqueued after that waits.
    wait_until(
        "its heartbeat is refused",
        Duration::from_secs(5),
        || async { refused.get(dynamo_outbox::store::WriteKind::Heartbeat) >= 1 },
    )
    .await;
    // The wire counted it before the relay did (the interceptor runs inside the request).
    assert!(
        wire.refused("UpdateItem").total() >= 1,
        "DynamoDB's refusal of the heartbeat, at the wire: {:?}",
        wire.refusals()
    );
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let waiting = keyed(&writer, &topic, "k", 1);
    writer
        .enqueue(std::slice::from_ref(&waiting))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // kafka.py blocks: off this current-thread runtime, so that the relay keeps running.
    let read = {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || read_topic(&topic))
            .await
            .unwrap()
    };
    assert!(
        read.is_empty(),
        "published while its clock was behind the stored expiry"
    );
    // Lease by lease: not one expiry moved backwards.
    let expiry_after = expiries(&store).await;
    for (bucket, before) in &expiry_before {
        let after = expiry_after.get(bucket).copied().unwrap_or(0);
        assert!(
            after >= *before,
            "bucket {bucket}: expiry moved backwards from {before} to {after}"
        );
    }
    assert_eq!(
        refused.get(dynamo_outbox::store::WriteKind::Renew),
        0,
        "no backwards renewal was even sent"
    );
    assert!(
        refused.get(dynamo_outbox::store::WriteKind::Heartbeat) >= 1,
        "its heartbeat is refused"
    );
    // Clock fixed: it resumes once its clock passes the stored expiry.
    clock.set_offset_ticks(0);
    wait_for_ids(&topic, &id_set([&waiting]), Duration::from_secs(15)).await;
    let report = running.stop().await;
    // The refusals DynamoDB answered are the ones the relay counted: none it failed to
    // count, none counted twice.
    let relay_refused = refused.total();
    assert_eq!(report.refused_total(), relay_refused, "{report:?}");
    assert_eq!(
        wire.refused_total(),
        relay_refused,
        "wire {:?}, relay {report:?}",
        wire.refusals()
    );
}

/// Every lease's expiry, by bucket.
async fn expiries(store: &DynamoDbOutboxStore) -> std::collections::BTreeMap<u32, i64> {
    store
        .read_coordination()
        .await
        .unwrap()
        .leases
        .iter()
        .map(|l| (l.bucket, l.expires_at))
        .collect()
}

#[tokio::test]
async fn a_message_stamped_with_another_bucket_count_faults_the_relay_and_stays() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let other =
        DynamoDbOutboxWriter::new(client.clone(), options.clone().with_bucket_count(8)).unwrap();
    other
        .enqueue(&[other.message("t").with_key("k")])
        .await
        .unwrap();
    let relay = relay_with(
        &client,
        &options,
        kafka_publisher().await,
        fast_relay_options("r", 4),
    )
    .await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        relay.run_until(Instant::now() + Duration::from_secs(15)),
    )
    .await
    .expect("the relay stops on its own");
    let err = result.unwrap_err();
    assert!(matches!(err, Error::Misconfiguration(_)), "{err}");
    assert!(
        err.to_string().contains("stamped with bucket count 8"),
        "{err}"
    );
    assert_eq!(
        pending_messages(&client, &options).await,
        1,
        "nothing deleted"
    );
    // And a relay whose own count differs from the store's refuses to start.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let err = Relay::new(store, kafka_publisher().await, fast_relay_options("r", 8)).unwrap_err();
    assert!(matches!(err, Error::Misconfiguration(_)));
}

#[tokio::test]
async fn a_gap_that_never_fills_is_probed_once_and_passed() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // An abandoned reservation: sequence 1 is reserved but never committed.
    let _abandoned = writer
        .transact_write_item(&writer.message("t").with_key("k"))
        .await
        .unwrap();
    writer
        .enqueue(&[writer.message("t").with_key("k").with_value("k:2")])
        .await
        .unwrap();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let fetched = store.fetch(0, None, 500).await.unwrap();
    assert_eq!(
        fetched
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [2]
    );
    assert_eq!((fetched.gap_probes, fetched.fetches), (1, 1));
    // After removing 2, the next fetch starts after it: no probe for the old gap.
    writer
        .enqueue(&[writer.message("t").with_key("k")])
        .await
        .unwrap();
    store
        .delete_messages(0, &[2], Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let fetched = store.fetch(0, Some(2), 500).await.unwrap();
    assert_eq!(
        fetched
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(fetched.gap_probes, 0);
}

/// Commits a held-back transaction the moment the store's first fetch has been answered,
/// so the message appears in a gap between the fetch and its probe.
struct CommitAfterFirstQuery {
    queries: AtomicUsize,
    commit: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for CommitAfterFirstQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitAfterFirstQuery")
    }
}

impl aws_sdk_dynamodb::config::Intercept for CommitAfterFirstQuery {
    fn name(&self) -> &'static str {
        "CommitAfterFirstQuery"
    }

    fn read_after_deserialization(
        &self,
        _context: &aws_sdk_dynamodb::config::interceptors::AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        if self.queries.fetch_add(1, Ordering::SeqCst) == 0 {
            if let Some(commit) = self.commit.lock().unwrap().take() {
                commit();
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_that_fills_late_is_fetched_again_in_order() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let late = writer.message("t").with_key("k").with_value("k:1");
    let late_item = writer.transact_write_item(&late).await.unwrap();
    writer
        .enqueue(&[writer.message("t").with_key("k").with_value("k:2")])
        .await
        .unwrap();

    let commit_client = client.clone();
    let commit: Box<dyn FnOnce() + Send> = Box::new(move || {
        // Runs inside the SDK's synchronous hook: commit on a thread of its own and wait.
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    commit_client
                        .transact_write_items()
                        .transact_items(late_item)
                        .send()
                        .await
                        .unwrap();
                })
        })
        .join()
        .unwrap();
    });
    let interceptor = CommitAfterFirstQuery {
        queries: AtomicUsize::new(0),
        commit: std::sync::Mutex::new(Some(commit)),
    };
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let intercepted = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(interceptor)
            .build(),
    );
    let store = DynamoDbOutboxStore::new(intercepted, options.clone()).unwrap();
    let fetched = store.fetch(0, None, 500).await.unwrap();
    assert_eq!(
        fetched
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [1, 2],
        "the late message comes first"
    );
    assert_eq!(fetched.fetches, 2, "fetched again after the gap filled");
    assert_eq!(fetched.messages[0].message.message_id, late.message_id);
}

/// Fails once in mid-batch: writes only the first `k` records and reports the rest failed.
#[derive(Debug)]
struct FailOnceMidBatch {
    inner: Arc<KafkaPublisher>,
    k: usize,
    failed: AtomicBool,
}

impl Publisher for FailOnceMidBatch {
    async fn publish(&self, batch: &[StoredMessage]) -> PublishOutcome {
        if batch.len() > self.k && !self.failed.swap(true, Ordering::SeqCst) {
            let prefix = self.inner.publish(&batch[..self.k]).await;
            assert!(prefix.error.is_none());
            return PublishOutcome {
                acknowledged: prefix.acknowledged,
                error: Some(Error::Kafka {
                    message: "injected: connection reset".into(),
                    retryable: true,
                    source: None,
                }),
            };
        }
        self.inner.publish(batch).await
    }
}

#[tokio::test]
async fn a_publish_failure_in_mid_batch_loses_nothing_and_keeps_order() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("midbatch");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut sent = Vec::new();
    for n in 0..20u64 {
        let m = keyed(&writer, &topic, &format!("key-{}", n % 4), n);
        writer.enqueue(std::slice::from_ref(&m)).await.unwrap();
        sent.push(m);
    }
    let publisher = Arc::new(FailOnceMidBatch {
        inner: kafka_publisher().await,
        k: 7,
        failed: AtomicBool::new(false),
    });
    let running = spawn(relay_with(&client, &options, publisher, fast_relay_options("r", 1)).await);
    wait_until("drained", Duration::from_secs(30), || async {
        pending_messages(&client, &options).await == 0
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.publish_failures, 1);
    let records = read_topic(&topic);
    // Each exactly once: the ids read are the ids written, none twice.
    Deliveries::of(&records).assert_exactly_once(&id_set(&sent));
    assert_per_key_order(&records);
    // Message n + 1 never went out ahead of n: within each partition, offsets follow enqueue order.
    let position: HashMap<String, usize> = sent
        .iter()
        .enumerate()
        .map(|(i, m)| (m.message_id.to_string(), i))
        .collect();
    let mut by_partition: BTreeMap<i32, Vec<(i64, usize)>> = BTreeMap::new();
    for r in &records {
        by_partition
            .entry(r.partition)
            .or_default()
            .push((r.offset, position[&r.message_id().unwrap()]));
    }
    for (_, mut v) in by_partition {
        v.sort();
        assert!(
            v.windows(2).all(|w| w[0].1 < w[1].1),
            "partition order follows enqueue order: {v:?}"
        );
    }
}

#[tokio::test]
async fn far_back_standbys_skip_every_other_round_but_stay_counted() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let owner = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("a", 1),
        )
        .await,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // b is the first standby (rank 0 < 1 bucket): every round; c is further back: every other.
    let b = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("b", 1),
        )
        .await,
    );
    let c = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("c", 1),
        )
        .await,
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let coordination = store.read_coordination().await.unwrap();
    let now = store.clock().now_ticks();
    let c_record = coordination
        .relays
        .iter()
        .find(|r| r.relay_id == "c")
        .unwrap();
    // Counted: its heartbeat is younger than the lease (3 s), so every plan counts it.
    assert!(
        c_record.is_active(now, 3 * TICKS_PER_SECOND),
        "c is still counted: {c_record:?}"
    );
    let (b, c, owner) = (b.stop().await, c.stop().await, owner.stop().await);
    assert!(c.rounds >= 3, "{c:?}");
    assert!(
        c.rounds * 4 < b.rounds * 3,
        "c ran {} rounds, b {}",
        c.rounds,
        b.rounds
    );
    assert_eq!(
        b.refused_total() + c.refused_total() + owner.refused_total(),
        0
    );
    assert_no_refusal_on_the_wire(&wire, "an owner and two standbys");
    assert_eq!(b.leases_acquired + c.leases_acquired, 0);
}

#[tokio::test]
async fn a_stopped_relays_heartbeat_record_is_deleted_one_lease_duration_later() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let a = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("a", 2),
        )
        .await,
    );
    let z = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("z", 2),
        )
        .await,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = z.stop().await;
    assert!(report.released);
    let stopped = Instant::now();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let record = store
        .read_coordination()
        .await
        .unwrap()
        .relays
        .into_iter()
        .find(|r| r.relay_id == "z");
    assert!(record
        .expect("the stop stamps the record, it does not delete it")
        .stopped_at
        .is_some());
    wait_until("z's record is gone", Duration::from_secs(10), || async {
        !store
            .read_coordination()
            .await
            .unwrap()
            .relays
            .iter()
            .any(|r| r.relay_id == "z")
    })
    .await;
    assert!(
        stopped.elapsed() >= Duration::from_millis(2500),
        "deleted before a lease duration passed"
    );
    assert_eq!(a.stop().await.refused_total(), 0);
    // The stop's stamp, the release and a's cleanup of z's record: none refused.
    assert_no_refusal_on_the_wire(&wire, "a stop and the cleanup of its record");
}

/// Two relays with deadlines, the second starting before the first ends, as consecutive
/// scheduled Lambda invocations do: the buckets change hands at the boundary within a
/// fraction of a second (the leaver announces its stop, the newcomer acquires right after
/// it), not a renew interval later, and no conditional write is refused.
#[tokio::test]
async fn consecutive_invocations_hand_buckets_over_promptly() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let timings = |id: &str| {
        let mut o = fast_relay_options(id, 4);
        o.lease_renew_interval = Duration::from_secs(5);
        o.lease_duration = Duration::from_secs(15);
        o
    };
    let t0 = Instant::now();
    let first = relay_with(
        &counted,
        &options,
        publisher.clone(),
        timings("invocation-1"),
    )
    .await;
    let first = tokio::spawn(async move { first.run_until(t0 + Duration::from_secs(7)).await });
    wait_until(
        "the first owns every bucket",
        Duration::from_secs(5),
        || async {
            lease_owners(&client, &options)
                .await
                .iter()
                .all(Option::is_some)
        },
    )
    .await;
    tokio::time::sleep_until(t0 + Duration::from_secs(3)).await;
    let second = relay_with(
        &counted,
        &options,
        publisher.clone(),
        timings("invocation-2"),
    )
    .await;
    let second = tokio::spawn(async move { second.run_until(t0 + Duration::from_secs(14)).await });

    // Sample ownership every 50 ms across the boundary and record the longest unowned stretch.
    let mut unowned_since: Vec<Option<Instant>> = vec![None; 4];
    let mut longest = Duration::ZERO;
    while Instant::now() < t0 + Duration::from_secs(10) {
        let owners = lease_owners(&client, &options).await;
        let now = Instant::now();
        for (b, owner) in owners.iter().enumerate() {
            match (owner, unowned_since[b]) {
                (None, None) => unowned_since[b] = Some(now),
                (Some(_), Some(since)) => {
                    longest = longest.max(now - since);
                    unowned_since[b] = None;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for since in unowned_since.into_iter().flatten() {
        longest = longest.max(Instant::now() - since);
    }
    let (first, second) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    println!("longest unowned stretch at the invocation boundary: {longest:?}");
    assert!(
        first.released && first.stop_reason == StopReason::Deadline,
        "{first:?}"
    );
    assert_eq!(
        first.refused_total() + second.refused_total(),
        0,
        "{first:?} {second:?}"
    );
    assert_no_refusal_on_the_wire(&wire, "two consecutive invocations");
    // The handover takes a couple of handover steps (300 ms) after the leaver's releases;
    // a newcomer that waited for its next round would leave a bucket unowned for up to the
    // renew interval (5 s). Half of it keeps the claim checkable and leaves a loaded machine
    // four times the designed time.
    assert!(
        longest < Duration::from_millis(2500),
        "buckets unowned for {longest:?} (renew interval 5 s)"
    );
}

#[derive(Debug, Default)]
struct PoisonCounter(AtomicUsize);

impl dynamo_outbox::metrics::RelayMetrics for PoisonCounter {
    fn poison_item(&self, _bucket: u32) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs relay "r" over the 2 buckets of `options` for `run`; its report, and how often it
/// reported a poison item.
async fn run_counting_poison(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    run: Duration,
) -> (RunReport, usize) {
    let metrics = Arc::new(PoisonCounter::default());
    let relay = relay_with(
        client,
        options,
        kafka_publisher().await,
        fast_relay_options("r", 2),
    )
    .await
    .with_metrics(metrics.clone());
    let report = relay.run_until(Instant::now() + run).await.unwrap();
    (report, metrics.0.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_poison_item_stops_only_its_bucket_until_it_is_quarantined() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("poison");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let keys = dynamo_outbox::schema::Keys::new(&options);
    // Bucket 0: an item without MessageId at sequence 1, then a good message.
    client
        .put_item()
        .table_name(&options.table_name)
        .item(
            "PK",
            aws_sdk_dynamodb::types::AttributeValue::S(keys.message_pk(0)),
        )
        .item(
            "SK",
            aws_sdk_dynamodb::types::AttributeValue::S(dynamo_outbox::schema::message_sk(1)),
        )
        .item(
            "Topic",
            aws_sdk_dynamodb::types::AttributeValue::S(topic.clone()),
        )
        .send()
        .await
        .unwrap();
    client
        .update_item()
        .table_name(&options.table_name)
        .key(
            "PK",
            aws_sdk_dynamodb::types::AttributeValue::S(keys.sequence_pk(0)),
        )
        .key(
            "SK",
            aws_sdk_dynamodb::types::AttributeValue::S(dynamo_outbox::schema::SEQUENCE_SK.into()),
        )
        .update_expression("SET #s = :one")
        .expression_attribute_names("#s", "Sequence")
        .expression_attribute_values(
            ":one",
            aws_sdk_dynamodb::types::AttributeValue::N("1".into()),
        )
        .send()
        .await
        .unwrap();
    let stuck = writer
        .message(&topic)
        .with_partition(0)
        .with_value("after the poison");
    let fine = writer
        .message(&topic)
        .with_partition(1)
        .with_value("other bucket");
    writer
        .enqueue(&[stuck.clone(), fine.clone()])
        .await
        .unwrap();

    let (report, poison_reports) =
        run_counting_poison(&client, &options, Duration::from_secs(4)).await;
    assert_eq!(report.published, 1, "the other bucket went on");
    assert_eq!(report.stop_reason, StopReason::Deadline, "no crash loop");
    assert!(poison_reports >= 1, "the poison item is reported");
    let ids: Vec<String> = read_topic(&topic)
        .iter()
        .filter_map(ReadRecord::message_id)
        .collect();
    assert_eq!(ids, [fine.message_id.to_string()]);
    assert_eq!(
        pending_messages(&client, &options).await,
        2,
        "nothing dropped silently"
    );

    // The operator moves it aside; the bucket resumes.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    store.quarantine(0, 1).await.unwrap();
    let dead = store.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0][dynamo_outbox::store::ORIGINAL_SK].as_s().unwrap(),
        &dynamo_outbox::schema::message_sk(1)
    );
    let relay = relay_with(
        &client,
        &options,
        kafka_publisher().await,
        fast_relay_options("r", 2),
    )
    .await;
    let report = relay
        .run_until(Instant::now() + Duration::from_secs(4))
        .await
        .unwrap();
    assert_eq!(report.published, 1);
    assert_eq!(pending_messages(&client, &options).await, 0);
    let err = store.quarantine(0, 1).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("no message item at bucket 0, sequence 1"),
        "{err}"
    );
}

/// Stalls the whole (current-thread) runtime once, like a SIGSTOP in the middle of a batch.
#[derive(Debug)]
struct StallOnce {
    inner: Arc<KafkaPublisher>,
    stalled: AtomicBool,
}

impl Publisher for StallOnce {
    async fn publish(&self, batch: &[StoredMessage]) -> PublishOutcome {
        let outcome = self.inner.publish(batch).await;
        if !self.stalled.swap(true, Ordering::SeqCst) {
            // After the broker's ack, before the relay hears of it.
            std::thread::sleep(Duration::from_millis(2500));
        }
        outcome
    }
}

#[tokio::test]
async fn one_stalled_batch_does_not_stop_later_batches() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("stall");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let first = keyed(&writer, &topic, "k", 1);
    writer.enqueue(std::slice::from_ref(&first)).await.unwrap();
    let publisher = Arc::new(StallOnce {
        inner: kafka_publisher().await,
        stalled: AtomicBool::new(false),
    });
    let running = spawn(relay_with(&client, &options, publisher, fast_relay_options("r", 1)).await);
    wait_for_ids(&topic, &id_set([&first]), Duration::from_secs(15)).await;
    // The batch took longer than the renew interval; later batches still run.
    let mut sent = vec![first];
    for n in 2..=4 {
        let m = keyed(&writer, &topic, "k", n);
        writer.enqueue(std::slice::from_ref(&m)).await.unwrap();
        sent.push(m);
    }
    // Distinct ids, not records: a second copy of the stalled batch is no later message.
    let read = wait_for_ids(&topic, &id_set(&sent), Duration::from_secs(10)).await;
    running.stop().await;
    let copies = read.assert_at_least_once(&id_set(&sent));
    println!(
        "after one stalled batch: {} messages, {copies} extra copies {:?}",
        sent.len(),
        read.duplicates
    );
}

#[tokio::test]
async fn a_record_the_broker_rejects_for_good_stops_only_its_bucket() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("good");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // Bucket 0: a record for a topic that does not exist (and is not auto-created).
    let rejected = writer
        .message(random_name("missing-topic"))
        .with_partition(0);
    let behind = writer
        .message(&topic)
        .with_partition(0)
        .with_value("behind it");
    let fine = writer
        .message(&topic)
        .with_partition(1)
        .with_value("other bucket");
    writer
        .enqueue(&[rejected.clone(), behind.clone(), fine.clone()])
        .await
        .unwrap();
    let (report, poison_reports) =
        run_counting_poison(&client, &options, Duration::from_secs(5)).await;
    assert_eq!(report.published, 1, "{report:?}");
    assert!(poison_reports >= 1, "the rejected record is reported");
    let ids: Vec<String> = read_topic(&topic)
        .iter()
        .filter_map(ReadRecord::message_id)
        .collect();
    assert_eq!(
        ids,
        [fine.message_id.to_string()],
        "nothing overtook the rejected record"
    );
    assert_eq!(pending_messages(&client, &options).await, 2);
    // Quarantined, the bucket resumes in order.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let head = store.backlog(0).await.unwrap().head_sequence.unwrap();
    store.quarantine(0, head).await.unwrap();
    let relay = relay_with(
        &client,
        &options,
        kafka_publisher().await,
        fast_relay_options("r", 2),
    )
    .await;
    relay
        .run_until(Instant::now() + Duration::from_secs(4))
        .await
        .unwrap();
    // Every message of the topic arrived: the one of the other bucket and the one that
    // waited behind the rejected record (which went to no topic of its own).
    let copies = topic_deliveries(&topic).assert_at_least_once(&id_set([&fine, &behind]));
    assert_eq!(copies, 0, "nothing went out twice on a healthy run");
    assert_eq!(pending_messages(&client, &options).await, 0);
}

/// The lease round's edges: odd heartbeat records and a retried cleanup, leases with an
/// owner but no numeric expiry, a slow handover after the stop stamp, and graceful stops
/// whose releases land in any order among four peers.
mod lease_edges {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextMut;
    use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
    use aws_sdk_dynamodb::types::AttributeValue;
    use dynamo_outbox::accounting::RequestCounter;
    use dynamo_outbox::store::WriteKind;

    use super::*;

    /// Puts one item into the coordination partition of `options` by hand.
    async fn put_coordination(
        client: &aws_sdk_dynamodb::Client,
        options: &OutboxOptions,
        sk: &str,
        attributes: Vec<(&str, AttributeValue)>,
    ) {
        let mut request = client
            .put_item()
            .table_name(&options.table_name)
            .item(
                "PK",
                AttributeValue::S(dynamo_outbox::schema::Keys::new(options).coordination_pk()),
            )
            .item("SK", AttributeValue::S(sk.into()));
        for (name, value) in attributes {
            request = request.item(name, value);
        }
        request.send().await.expect("put by hand");
    }

    fn n(v: i64) -> AttributeValue {
        AttributeValue::N(v.to_string())
    }

    /// Answers the first `DeleteItem` attempt with an injected 500 after DynamoDB applied
    /// it, so the SDK retries a delete that already landed.
    #[derive(Debug, Default)]
    struct LoseFirstDeleteAnswer {
        lost: AtomicBool,
    }

    impl Intercept for LoseFirstDeleteAnswer {
        fn name(&self) -> &'static str {
            "LoseFirstDeleteAnswer"
        }

        fn modify_before_deserialization(
            &self,
            context: &mut BeforeDeserializationInterceptorContextMut<'_>,
            _: &RuntimeComponents,
            cfg: &mut ConfigBag,
        ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
            let delete = operation_is(cfg, "DeleteItem");
            if delete && !self.lost.swap(true, Ordering::SeqCst) {
                let response = context.response_mut();
                *response.status_mut() = 500u16.try_into().unwrap();
                *response.body_mut() = aws_smithy_types::body::SdkBody::from(
                    r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected: the answer was lost"}"#,
                );
            }
            Ok(())
        }
    }

    /// The ids of the heartbeat records in the table now.
    async fn relay_records(store: &DynamoDbOutboxStore) -> BTreeSet<String> {
        store
            .read_coordination()
            .await
            .unwrap()
            .relays
            .into_iter()
            .map(|r| r.relay_id)
            .collect()
    }

    /// Heartbeat records without a numeric `LastSeenUtc` (another implementation's
    /// stop stamp before its first heartbeat, a bare record, a string) are deleted on
    /// purpose by the cleaning relay, none refused; and an SDK retry of a cleanup whose
    /// first attempt landed is done, not refused.
    #[tokio::test]
    async fn odd_heartbeat_records_are_cleaned_and_a_retried_cleanup_is_done_not_refused() {
        let client = dynamodb().await;
        let options = fresh_table(&client, 2).await;
        let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
        let relay_options = fast_relay_options("a-cleaner", 2);
        let lease = TICKS_PER_SECOND * relay_options.lease_duration.as_secs() as i64;
        let now = store.clock().now_ticks();
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::relay_sk("stamp-only"),
            vec![("StoppedAtUtc", n(now - 2 * lease))],
        )
        .await;
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::relay_sk("bare"),
            vec![],
        )
        .await;
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::relay_sk("text-seen"),
            vec![
                ("LastSeenUtc", AttributeValue::S("yesterday".into())),
                ("StoppedAtUtc", n(now - 2 * lease)),
            ],
        )
        .await;
        let odd: BTreeSet<String> = ["stamp-only", "bare", "text-seen"].map(String::from).into();

        let (counted, wire) = counted_client().await;
        let running = spawn(
            relay_with(
                &counted,
                &options,
                kafka_publisher().await,
                relay_options.clone(),
            )
            .await,
        );
        // The cleaner deletes them in its first rounds; ten renew intervals is generous.
        let until = Instant::now() + relay_options.lease_renew_interval * 10;
        let left = loop {
            let left: Vec<String> = relay_records(&store)
                .await
                .intersection(&odd)
                .cloned()
                .collect();
            if left.is_empty() || Instant::now() >= until {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let report = running.stop().await;
        assert!(
            left.is_empty(),
            "records left after {} rounds: {left:?}; refused by the relay {:?}, at the wire {:?}",
            report.rounds,
            report.refused,
            wire.refusals()
        );
        assert_eq!(report.refused_total(), 0, "{report:?}");
        assert_no_refusal_on_the_wire(&wire, "cleaning odd heartbeat records");

        // A dead relay's record, deleted by a client whose first answer is lost: the SDK
        // retries a delete that landed.
        let seen = now - 11 * lease;
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::relay_sk("gone"),
            vec![("LastSeenUtc", n(seen))],
        )
        .await;
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let lossy_wire = RequestCounter::default();
        let lossy = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .interceptor(LoseFirstDeleteAnswer::default())
                .interceptor(lossy_wire.clone())
                .build(),
        );
        let lossy_store = DynamoDbOutboxStore::new(lossy, options.clone()).unwrap();
        let deleted = lossy_store
            .delete_relay_record("a-cleaner", "gone", seen)
            .await
            .unwrap();
        assert_eq!(
            lossy_wire.get("DeleteItem").total(),
            2,
            "the SDK retried: {:?}",
            lossy_wire.snapshot()
        );
        assert!(
            deleted,
            "a retried cleanup that landed is done; refused {:?}",
            lossy_wire.refusals()
        );
        assert_eq!(lossy_store.refused_writes().get(WriteKind::Cleanup), 0);
        assert_no_refusal_on_the_wire(&lossy_wire, "a retried cleanup");
        assert!(!relay_records(&store).await.contains("gone"));
    }

    /// Lease items with an owner but a missing or non-numeric `ExpiresAtUtc`, some
    /// naming a relay that is gone, some naming the relay itself: it claims the first and
    /// takes back the second, refusing nothing, and publishes every bucket.
    #[tokio::test]
    async fn leases_with_an_owner_but_no_numeric_expiry_are_claimed_and_taken_back() {
        let client = dynamodb().await;
        let options = fresh_table(&client, 4).await;
        let topic = random_name("noexpiry");
        create_topic(&topic, 4);
        let owner = |id: &str| ("Owner", AttributeValue::S(id.into()));
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::lease_sk(0),
            vec![owner("ghost")],
        )
        .await;
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::lease_sk(1),
            vec![
                owner("ghost"),
                ("ExpiresAtUtc", AttributeValue::S("tomorrow".into())),
            ],
        )
        .await;
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::lease_sk(2),
            vec![owner("me")],
        )
        .await;
        put_coordination(
            &client,
            &options,
            &dynamo_outbox::schema::lease_sk(3),
            vec![owner("me"), ("ExpiresAtUtc", AttributeValue::Bool(true))],
        )
        .await;
        // One message per bucket (partition p goes to bucket p of 4).
        let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
        let messages: Vec<OutboxMessage> = (0..4)
            .map(|p| {
                writer
                    .message(&topic)
                    .with_partition(p)
                    .with_value(format!("b{p}"))
            })
            .collect();
        writer.enqueue(&messages).await.unwrap();

        let relay_options = fast_relay_options("me", 4);
        let (counted, wire) = counted_client().await;
        let running = spawn(
            relay_with(
                &counted,
                &options,
                kafka_publisher().await,
                relay_options.clone(),
            )
            .await,
        );
        let all_mine = vec![Some("me".to_string()); 4];
        let until = Instant::now() + relay_options.lease_renew_interval * 10;
        let owners = loop {
            let owners = lease_owners(&client, &options).await;
            if owners == all_mine || Instant::now() >= until {
                break owners;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let published = if owners == all_mine {
            Some(wait_for_ids(&topic, &id_set(&messages), Duration::from_secs(30)).await)
        } else {
            None
        };
        let report = running.stop().await;
        assert_eq!(
            owners,
            all_mine,
            "after {} rounds; refused by the relay {:?}, at the wire {:?}",
            report.rounds,
            report.refused,
            wire.refusals()
        );
        published
            .expect("published")
            .assert_exactly_once(&id_set(&messages));
        assert_eq!(report.refused_total(), 0, "{report:?}");
        assert_no_refusal_on_the_wire(&wire, "leases without a numeric expiry");
    }

    /// The relay id of a graceful stop's release (an `UpdateItem` that removes the owner
    /// guarded by the owner alone; a round's releases also carry the expiry read), from a
    /// request body.
    fn stop_release_of(body: &[u8]) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(body).ok()?;
        let values = &json["ExpressionAttributeValues"];
        (json["UpdateExpression"] == "REMOVE #owner" && values.get(":read").is_none())
            .then(|| values[":me"]["S"].as_str().map(String::from))
            .flatten()
    }

    /// Reads one HTTP/1.1 message (head and body, by Content-Length or chunked), raw, and
    /// the offset of its body.
    fn read_message(r: &mut impl std::io::BufRead) -> std::io::Result<Option<(Vec<u8>, usize)>> {
        let (mut raw, mut length, mut chunked) = (Vec::new(), 0usize, false);
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line)? == 0 {
                return Ok(None);
            }
            raw.extend_from_slice(&line);
            let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
            let text = text.trim_end();
            if text.is_empty() {
                break;
            }
            if let Some(v) = text.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            } else if let Some(v) = text.strip_prefix("transfer-encoding:") {
                chunked = v.contains("chunked");
            }
        }
        let body_at = raw.len();
        if chunked {
            loop {
                let mut size_line = Vec::new();
                r.read_until(b'\n', &mut size_line)?;
                raw.extend_from_slice(&size_line);
                let size = usize::from_str_radix(
                    String::from_utf8_lossy(&size_line)
                        .trim()
                        .split(';')
                        .next()
                        .unwrap_or("0"),
                    16,
                )
                .unwrap_or(0);
                let mut chunk = vec![0; size + 2];
                r.read_exact(&mut chunk)?;
                raw.extend_from_slice(&chunk);
                if size == 0 {
                    break;
                }
            }
        } else {
            let mut body = vec![0; length];
            r.read_exact(&mut body)?;
            raw.extend_from_slice(&body);
        }
        Ok(Some((raw, body_at)))
    }

    /// How long the proxy holds the `k`-th stop release (from 0) of a relay.
    type HoldPolicy = dyn Fn(&str, usize) -> Duration + Send + Sync;

    /// A forwarding HTTP/1.1 proxy in front of DynamoDB Local (loopback, a thread per
    /// connection) that holds every release of a graceful stop for the time `hold` gives
    /// it before forwarding it, and forwards everything else at once. A stop sends its
    /// releases concurrently, each on a connection of its own, so held releases land in
    /// the order their holds make, and nothing else waits for them.
    struct HoldingProxy {
        url: String,
        /// Stop releases held so far, by relay id.
        held: Arc<Mutex<BTreeMap<String, usize>>>,
    }

    impl HoldingProxy {
        fn start(hold: Arc<HoldPolicy>) -> Self {
            let upstream = stack_var("AWS_ENDPOINT_URL_DYNAMODB")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
            let url = format!("http://{}", listener.local_addr().unwrap());
            let held: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
            let counts = held.clone();
            std::thread::spawn(move || {
                for client in listener.incoming().flatten() {
                    let (upstream, hold, counts) = (upstream.clone(), hold.clone(), counts.clone());
                    std::thread::spawn(move || {
                        let _ = Self::serve(client, &upstream, &*hold, &counts);
                    });
                }
            });
            HoldingProxy { url, held }
        }

        fn serve(
            client: std::net::TcpStream,
            upstream: &str,
            hold: &HoldPolicy,
            counts: &Mutex<BTreeMap<String, usize>>,
        ) -> std::io::Result<()> {
            use std::io::Write;
            client.set_nodelay(true)?;
            let mut from_client = std::io::BufReader::new(client.try_clone()?);
            let mut to_client = client;
            let up = std::net::TcpStream::connect(upstream)?;
            up.set_nodelay(true)?;
            let mut from_up = std::io::BufReader::new(up.try_clone()?);
            let mut to_up = up;
            while let Some((request, body_at)) = read_message(&mut from_client)? {
                if let Some(relay) = stop_release_of(&request[body_at..]) {
                    let k = {
                        let mut counts = counts.lock().unwrap();
                        let k = counts.entry(relay.clone()).or_default();
                        *k += 1;
                        *k - 1
                    };
                    std::thread::sleep(hold(&relay, k));
                }
                to_up.write_all(&request)?;
                let Some((response, _)) = read_message(&mut from_up)? else {
                    return Ok(());
                };
                to_client.write_all(&response)?;
            }
            Ok(())
        }

        /// Stop releases of `relay` seen so far.
        fn of(&self, relay: &str) -> usize {
            self.held.lock().unwrap().get(relay).copied().unwrap_or(0)
        }

        /// A client through the proxy, with the wire counter.
        async fn client(&self, counter: &RequestCounter) -> aws_sdk_dynamodb::Client {
            let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
            aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&config)
                    .endpoint_url(&self.url)
                    .interceptor(counter.clone())
                    .build(),
            )
        }
    }

    /// A pseudo-random number below `bound` (a fresh UUID's bits).
    fn random_below(bound: u64) -> u64 {
        (uuid::Uuid::new_v4().as_u128() % u128::from(bound.max(1))) as u64
    }

    /// Samples lease ownership every 50 ms until `done`; every stretch in which a bucket
    /// that had been owned was unowned, as (start, length), stretches still open at the
    /// end included.
    fn sample_unowned(
        client: aws_sdk_dynamodb::Client,
        options: OutboxOptions,
        done: Arc<AtomicBool>,
    ) -> JoinHandle<Vec<(Instant, Duration)>> {
        tokio::spawn(async move {
            let n = options.bucket_count as usize;
            let mut owned_once = vec![false; n];
            let mut since: Vec<Option<Instant>> = vec![None; n];
            let mut stretches = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let owners = lease_owners(&client, &options).await;
                let now = Instant::now();
                for (b, owner) in owners.iter().enumerate() {
                    match (owner, since[b]) {
                        (Some(_), Some(s)) => {
                            stretches.push((s, now - s));
                            since[b] = None;
                        }
                        (Some(_), None) => owned_once[b] = true,
                        (None, None) if owned_once[b] => since[b] = Some(now),
                        _ => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let now = Instant::now();
            stretches.extend(since.into_iter().flatten().map(|s| (s, now - s)));
            stretches
        })
    }

    /// A peer that reads after the leaver stamped its stop but before its releases
    /// landed keeps watching, and takes the buckets within a few handover steps of the
    /// releases, not at its next regular round (a renew interval later). Two consecutive
    /// runs with deadlines (renew interval 5 s); the leaver's releases are held 1.5 s, so
    /// the successor's re-read after the announced stop finds the stamp and every lease
    /// still held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_peer_that_reads_between_the_stamp_and_the_releases_keeps_watching() {
        let client = dynamodb().await;
        let options = fresh_table(&client, 4).await;
        let publisher = kafka_publisher().await;
        let wire = RequestCounter::default();
        let hold_for = Duration::from_millis(1500);
        let proxy = HoldingProxy::start(Arc::new(move |relay: &str, _| {
            if relay == "leaver" {
                hold_for
            } else {
                Duration::ZERO
            }
        }));
        let through = proxy.client(&wire).await;
        let timings = |id: &str| {
            let mut o = fast_relay_options(id, 4);
            o.lease_renew_interval = Duration::from_secs(5);
            o.lease_duration = Duration::from_secs(15);
            o
        };
        let renew = timings("x").lease_renew_interval;
        let t0 = Instant::now();
        let first = relay_with(&through, &options, publisher.clone(), timings("leaver")).await;
        let first = tokio::spawn(async move { first.run_until(t0 + Duration::from_secs(7)).await });
        wait_until(
            "the leaver owns every bucket",
            Duration::from_secs(5),
            || async {
                lease_owners(&client, &options)
                    .await
                    .iter()
                    .all(|o| o.as_deref() == Some("leaver"))
            },
        )
        .await;
        let done = Arc::new(AtomicBool::new(false));
        let sampler = sample_unowned(client.clone(), options.clone(), done.clone());
        tokio::time::sleep_until(t0 + Duration::from_secs(3)).await;
        let second = relay_with(&through, &options, publisher.clone(), timings("successor")).await;
        let second =
            tokio::spawn(async move { second.run_until(t0 + Duration::from_secs(14)).await });
        let first = first.await.unwrap().unwrap();
        // Bounded by the successor's next regular round (a renew interval) and more.
        let until = Instant::now() + renew * 2;
        while Instant::now() < until
            && !lease_owners(&client, &options)
                .await
                .iter()
                .all(|o| o.as_deref() == Some("successor"))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        done.store(true, Ordering::SeqCst);
        let longest = sampler
            .await
            .unwrap()
            .into_iter()
            .map(|(_, d)| d)
            .max()
            .unwrap_or_default();
        let second = second.await.unwrap().unwrap();
        println!(
            "slow handover after the stamp (releases held {hold_for:?}, renew interval {renew:?}): longest unowned {longest:?}"
        );
        assert!(
            first.released && first.stop_reason == StopReason::Deadline,
            "{first:?}"
        );
        assert_eq!(
            proxy.of("leaver"),
            4,
            "the leaver's four releases were held"
        );
        assert_eq!(
            first.refused_total() + second.refused_total(),
            0,
            "{first:?} {second:?}"
        );
        assert_no_refusal_on_the_wire(&wire, "a slow handover after the stamp");
        assert!(
            longest < renew / 2,
            "buckets unowned for {longest:?} after a slow release (renew interval {renew:?})"
        );
    }

    /// Graceful stops among five relays over 60 buckets, run as overlapping
    /// invocations with deadlines (as scheduled Lambda invocations are): every leaver
    /// announces its stop, so its four peers re-read together 300 ms after it, while the
    /// leaver's twelve releases are still landing, in random order (each held 250 to
    /// 450 ms by the proxy, so that they land densely around that re-read). Peers that
    /// read between two landings see different halves of the handover. No claim is
    /// refused, by the relays' count and at the wire. A newcomer joins half a period before
    /// each stop, so every stop leaves four claimers. Ids sort in start order, so the
    /// leaver is always first in rank order: after it leaves, the next relay's range covers
    /// most of the freed buckets and the rest spill to later relays in the plan's second
    /// pass, where plans from different halves of a handover disagree (the worked example
    /// of docs/protocol.md, section 4.6). Before the fix this refused 1 to 4 claims per run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn graceful_stops_with_releases_landing_in_any_order_refuse_no_claim_among_four_relays() {
        const FLEET: usize = 5;
        const BUCKETS: u32 = 60;
        const STOPS: usize = 12;
        let period = Duration::from_secs(5);
        let client = dynamodb().await;
        let options = fresh_table(&client, BUCKETS).await;
        let publisher = kafka_publisher().await;
        let wire = RequestCounter::default();
        let prefix = random_name("invocation");
        // Only the first STOPS leavers' releases are held: the last relays hold more leases
        // each, with fewer peers, and their stops must fit the stop reserve.
        let tested = prefix.clone();
        let proxy = HoldingProxy::start(Arc::new(move |relay: &str, _| {
            let index = relay
                .strip_prefix(tested.as_str())
                .and_then(|i| i.trim_start_matches('-').parse::<usize>().ok());
            if index.is_some_and(|i| i < STOPS) {
                Duration::from_millis(250 + random_below(200))
            } else {
                Duration::ZERO
            }
        }));
        let through = proxy.client(&wire).await;
        let reserve = dynamo_outbox::relay::DEFAULT_STOP_RESERVE;
        // Relay k stops working at stops[k] (its deadline minus the stop reserve); the
        // first FLEET - 1 start 2 s apart, every later one half a period before the stop of
        // the relay FLEET - 1 places ahead of it. The last ones stop on schedule too, with
        // fewer peers.
        let t0 = Instant::now();
        let relays = STOPS + FLEET - 1;
        let first_stop = Duration::from_secs(2) * (FLEET as u32 - 1) + period;
        let stops: Vec<Instant> = (0..relays)
            .map(|k| t0 + first_stop + period * k as u32)
            .collect();
        let starts: Vec<Instant> = (0..relays)
            .map(|i| {
                if i < FLEET - 1 {
                    t0 + Duration::from_secs(2) * i as u32
                } else {
                    stops[i - (FLEET - 1)] - period / 2
                }
            })
            .collect();
        let done = Arc::new(AtomicBool::new(false));
        let sampler = sample_unowned(client.clone(), options.clone(), done.clone());
        let mut running = Vec::new();
        let mut settled = 0;
        for i in 0..relays {
            tokio::time::sleep_until(starts[i]).await;
            // Has the last stop's handover settled: FLEET - 1 relays, the shares apart by
            // at most one?
            if i >= FLEET {
                let counts = owned_counts(&lease_owners(&client, &options).await);
                let (min, max) = (counts.values().min(), counts.values().max());
                if counts.len() == FLEET - 1
                    && counts.values().sum::<usize>() == BUCKETS as usize
                    && max.zip(min).is_some_and(|(max, min)| max - min <= 1)
                {
                    settled += 1;
                }
            }
            // Ids in start order: the leaver, the oldest, is always first in rank order.
            let id = format!("{prefix}-{i:02}");
            let relay = relay_with(
                &through,
                &options,
                publisher.clone(),
                fast_relay_options(&id, BUCKETS),
            )
            .await;
            let deadline = stops[i] + reserve;
            running.push(tokio::spawn(async move { relay.run_until(deadline).await }));
        }
        let mut refused: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut released = 0;
        for r in running {
            let report = r.await.unwrap().unwrap();
            released += usize::from(report.released);
            for (k, v) in &report.refused {
                *refused.entry(k).or_default() += v;
            }
        }
        done.store(true, Ordering::SeqCst);
        let stretches = sampler.await.unwrap();
        // Unowned stretches starting at one of the first STOPS stops (the last ones leave
        // fewer peers, or none, behind).
        let at_stops: Vec<Duration> = stretches
            .iter()
            .filter(|(start, _)| {
                stops[..STOPS]
                    .iter()
                    .any(|s| *start >= *s && *start < *s + period / 2)
            })
            .map(|(_, d)| *d)
            .collect();
        let longest = at_stops.iter().max().copied().unwrap_or_default();
        println!(
            "{STOPS} graceful stops among {FLEET} relays ({settled} settled half a period later), {} releases held: longest unowned at a stop {longest:?} over {} stretches; refused {refused:?}",
            (0..STOPS).map(|i| proxy.of(&format!("{prefix}-{i:02}"))).sum::<usize>(),
            at_stops.len()
        );
        assert_eq!(released, relays, "every run released its leases");
        let held: usize = (0..STOPS)
            .map(|i| proxy.of(&format!("{prefix}-{i:02}")))
            .sum();
        assert!(held >= STOPS * 6, "the stops' releases were held: {held}");
        assert_eq!(
            refused.values().sum::<u64>(),
            0,
            "refused by the relays: {refused:?} (at the wire {:?})",
            wire.refusals()
        );
        assert_no_refusal_on_the_wire(&wire, "graceful stops with releases in any order");
    }
}

/// Lease writes against DynamoDB itself, with explicit times: a claim of a live lease, a
/// renewal from a stale read and a release after a takeover are refused by DynamoDB (the
/// wire sees each refusal, the store counts it); an SDK retry of each applied write (the
/// same request sent again after it landed) is refused by DynamoDB too, but recognised
/// from the old item as this very write: a success, not counted as a refusal.
#[tokio::test]
async fn lease_writes_are_refused_when_stale_and_their_own_retries_are_successes() {
    use dynamo_outbox::store::WriteKind;
    let (client, wire) = counted_client().await;
    let options = fresh_table(&client, 1).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let counted = |kind| store.refused_writes().get(kind);
    let wire_refused = || wire.refused("UpdateItem").total();
    let t0: i64 = 1_000_000_000;
    let d: i64 = 30 * TICKS_PER_SECOND;

    // A claims the free bucket; its retry of the applied claim is a success.
    assert!(store.claim(0, "a", t0, t0 + d).await.unwrap());
    assert!(
        store.claim(0, "a", t0, t0 + d).await.unwrap(),
        "a retried claim"
    );
    assert_eq!((wire_refused(), counted(WriteKind::Claim)), (1, 0));
    // B's claim of the live lease is refused.
    assert!(!store.claim(0, "b", t0 + 1, t0 + 1 + d).await.unwrap());
    assert_eq!((wire_refused(), counted(WriteKind::Claim)), (2, 1));

    // A renews from its read; the retry of that renewal is a success.
    assert!(store.renew(0, "a", t0 + d, t0 + 2 * d, None).await.unwrap());
    assert!(
        store.renew(0, "a", t0 + d, t0 + 2 * d, None).await.unwrap(),
        "a retried renewal"
    );
    assert_eq!((wire_refused(), counted(WriteKind::Renew)), (3, 0));
    // A renewal from a stale read (the expiry before that renewal) is refused.
    assert!(!store.renew(0, "a", t0 + d, t0 + 3 * d, None).await.unwrap());
    assert_eq!((wire_refused(), counted(WriteKind::Renew)), (4, 1));

    // The lease lapses and B takes it over; A's release (of the expiry it read) is refused.
    let lapsed = t0 + 2 * d + 1;
    assert!(store.claim(0, "b", lapsed, lapsed + d).await.unwrap());
    assert!(!store.release(0, "a", Some(t0 + 2 * d)).await.unwrap());
    assert_eq!((wire_refused(), counted(WriteKind::Release)), (5, 1));
    // B releases what it read; the retry of that release is a success.
    assert!(store.release(0, "b", Some(lapsed + d)).await.unwrap());
    assert!(
        store.release(0, "b", Some(lapsed + d)).await.unwrap(),
        "a retried release"
    );
    assert_eq!((wire_refused(), counted(WriteKind::Release)), (6, 1));
    assert_eq!(lease_owners(&client, &options).await, vec![None]);
}

/// A running relay deletes the heartbeat records of relays silent for ten lease durations
/// and of relays stopped a lease duration ago, and keeps a record silent for less (it may
/// be a relay paused for a while that comes back).
#[tokio::test]
async fn a_relay_cleans_up_records_of_relays_silent_for_ten_lease_durations() {
    let (client, wire) = counted_client().await;
    let options = fresh_table(&client, 1).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay_options = fast_relay_options("a-cleaner", 1);
    let lease = relay_options.lease_duration.as_secs() as i64 * TICKS_PER_SECOND;
    let now = store.clock().now_ticks();
    assert!(store
        .heartbeat("silent-11", now - 11 * lease, None)
        .await
        .unwrap());
    assert!(store
        .heartbeat("silent-9", now - 9 * lease, None)
        .await
        .unwrap());
    assert!(store
        .heartbeat("stopped", now - 3 * lease, None)
        .await
        .unwrap());
    assert!(store
        .stamp_stopped("stopped", now - 2 * lease)
        .await
        .unwrap());
    let records = |c: dynamo_outbox::coordination::Coordination| -> Vec<String> {
        c.relays.into_iter().map(|r| r.relay_id).collect()
    };
    assert_eq!(
        records(store.read_coordination().await.unwrap()),
        ["silent-11", "silent-9", "stopped"]
    );

    let relay = Relay::new(
        DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap(),
        kafka_publisher().await,
        relay_options,
    )
    .unwrap();
    let running = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(30))
            .await
    });
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let left = records(store.read_coordination().await.unwrap());
        if left == ["a-cleaner", "silent-9"] {
            break;
        }
        assert!(Instant::now() < until, "records left: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.abort();
    assert_no_refusal_on_the_wire(&wire, "the cleanup");
}

/// Every bucket's lease owner as stored, lapsed or not.
async fn raw_owners(store: &DynamoDbOutboxStore, buckets: u32) -> Vec<Option<String>> {
    let c = store.read_coordination().await.unwrap();
    (0..buckets)
        .map(|b| c.lease(b).and_then(|l| l.owner.clone()))
        .collect()
}

/// A relay whose clock is set back claims nothing while its heartbeat is refused, even a
/// bucket a peer has just handed back (a claim would succeed at DynamoDB, written with
/// an expiry already in the past); once its clock is right again it takes the buckets.
#[tokio::test]
async fn a_relay_whose_clock_is_set_back_stops_claiming() {
    use dynamo_outbox::store::WriteKind;
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let (counted, wire) = counted_client().await;
    let clock = OffsetClock::new(0);
    let store = DynamoDbOutboxStore::new(counted.clone(), options.clone())
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let refused = store.refused_writes().clone();
    let publisher = kafka_publisher().await;
    let skewed = spawn(
        Relay::new(
            store.clone(),
            publisher.clone(),
            fast_relay_options("a-skewed", 2),
        )
        .unwrap(),
    );
    let peer = spawn(
        relay_with(
            &counted,
            &options,
            publisher.clone(),
            fast_relay_options("b-peer", 2),
        )
        .await,
    );
    let both = vec![Some("a-skewed".to_string()), Some("b-peer".to_string())];
    wait_until("one bucket each", Duration::from_secs(20), || async {
        let mut owners = lease_owners(&client, &options).await;
        owners.sort();
        owners == both
    })
    .await;
    // 10 s back: its heartbeat is refused until its clock passes the last one it wrote.
    clock.set_offset_ticks(-10 * TICKS_PER_SECOND);
    wait_until(
        "its heartbeat is refused",
        Duration::from_secs(5),
        || async { refused.get(WriteKind::Heartbeat) >= 1 },
    )
    .await;
    let peer_report = peer.stop().await;
    assert!(peer_report.released, "{peer_report:?}");
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let handed_back: Vec<u32> = raw_owners(&plain, 2)
        .await
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_none())
        .map(|(b, _)| b as u32)
        .collect();
    assert!(!handed_back.is_empty(), "the peer handed nothing back");
    // Three seconds (three rounds) with its clock still behind: nothing claimed.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let owners = raw_owners(&plain, 2).await;
        for &b in &handed_back {
            assert_eq!(owners[b as usize], None, "claimed with its clock set back");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refused.get(WriteKind::Claim), 0);
    // Clock right again: it takes every bucket.
    clock.set_offset_ticks(0);
    wait_until("it takes both buckets", Duration::from_secs(20), || async {
        lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("a-skewed"))
    })
    .await;
    let report = skewed.stop().await;
    // The only refusals: its heartbeats while its clock was behind.
    assert_eq!(
        (report.refused_total(), wire.refused_total()),
        (
            refused.get(WriteKind::Heartbeat),
            refused.get(WriteKind::Heartbeat)
        ),
        "{report:?} {:?}",
        wire.refusals()
    );
}

/// Fails every `UpdateItem` (renewals, heartbeats) while armed, as an outage of writes.
#[derive(Debug, Clone, Default)]
struct FailUpdates {
    armed: Arc<AtomicBool>,
}

impl aws_sdk_dynamodb::config::Intercept for FailUpdates {
    fn name(&self) -> &'static str {
        "FailUpdates"
    }

    fn read_before_transmit(
        &self,
        _: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let update = operation_is(cfg, "UpdateItem");
        if update && self.armed.load(Ordering::SeqCst) {
            return Err("injected: UpdateItem unavailable".into());
        }
        Ok(())
    }
}

/// The lease's validity is measured on the monotonic clock, from the start of the last
/// renewal that landed, never from the stored expiry: with its wall clock a minute ahead
/// (the stored expiry a minute away) and its renewals failing, the relay stops publishing
/// one lease duration after its last renewal, and resumes once a renewal lands again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wall_clock_ahead_does_not_stretch_publishing_past_the_monotonic_validity() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("ahead");
    create_topic(&topic, 1);
    let failing = FailUpdates::default();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let faulty = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(failing.clone())
            .build(),
    );
    let clock = OffsetClock::new(0);
    let store = DynamoDbOutboxStore::new(faulty, options.clone())
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let relay_options = fast_relay_options("ahead", 1);
    let lease = relay_options.lease_duration;
    let running = spawn(Relay::new(store, kafka_publisher().await, relay_options).unwrap());
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    wait_until("it holds the bucket", Duration::from_secs(10), || async {
        lease_owners(&client, &options).await == [Some("ahead".to_string())]
    })
    .await;
    // A minute ahead: its next renewal stores an expiry a minute away.
    clock.set_offset_ticks(60 * TICKS_PER_SECOND);
    wait_until(
        "a renewal a minute ahead",
        Duration::from_secs(10),
        || async {
            let now = plain.clock().now_ticks();
            expiries(&plain).await[&0] > now + 30 * TICKS_PER_SECOND
        },
    )
    .await;
    // Its writes fail from here on; the stored expiry still says the lease is good for
    // almost a minute, by its clock and by the real one.
    failing.armed.store(true, Ordering::SeqCst);
    let armed_at = Instant::now();
    tokio::time::sleep_until(armed_at + lease + Duration::from_millis(500)).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let waiting = keyed(&writer, &topic, "k", 1);
    writer
        .enqueue(std::slice::from_ref(&waiting))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        read_topic(&topic).is_empty(),
        "published past the lease's monotonic validity"
    );
    let now = plain.clock().now_ticks();
    assert!(
        expiries(&plain).await[&0] > now + 20 * TICKS_PER_SECOND,
        "the stored expiry alone would have allowed it"
    );
    // Writes work again: a renewal lands (from the expiry it read) and it publishes.
    failing.armed.store(false, Ordering::SeqCst);
    wait_for_ids(&topic, &id_set([&waiting]), Duration::from_secs(15))
        .await
        .assert_exactly_once(&id_set([&waiting]));
    let report = running.stop().await;
    assert_eq!((report.published, report.leases_lost), (1, 0), "{report:?}");
}
