//! The relay against DynamoDB Local and the local Kafka broker, by topic (one module
//! each); the helpers they share are here.

mod clocks;
mod handover;
mod heartbeats;
mod leases;
mod ordering;
mod poison;
mod poison_policy;
mod shutdown;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::message::{murmur2, to_positive};
use dynamo_outbox::protocol::clock::{OffsetClock, TICKS_PER_SECOND};
use dynamo_outbox::publish::{KafkaPublisher, PublishOutcome, Publisher};
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

/// When a relay started and stopped publishing each bucket, on the monotonic clock (its
/// `RelayMetrics::ownership` reports).
#[derive(Debug, Default)]
struct OwnershipLog(std::sync::Mutex<Vec<(u32, bool, Instant)>>);

impl dynamo_outbox::metrics::RelayMetrics for OwnershipLog {
    fn ownership(&self, bucket: u32, owned: bool) {
        self.0.lock().unwrap().push((bucket, owned, Instant::now()));
    }
}

impl OwnershipLog {
    /// The buckets first owned at or after `t`, with how long after `t`.
    fn first_owned_after(&self, t: Instant) -> BTreeMap<u32, Duration> {
        let mut taken = BTreeMap::new();
        for &(b, owned, at) in self.0.lock().unwrap().iter() {
            if owned && at >= t {
                taken.entry(b).or_insert(at - t);
            }
        }
        taken
    }

    /// The buckets owned just before `t`.
    fn owned_before(&self, t: Instant) -> std::collections::BTreeSet<u32> {
        let mut owned = std::collections::BTreeSet::new();
        for &(b, is_owned, at) in self.0.lock().unwrap().iter() {
            if at < t {
                if is_owned {
                    owned.insert(b);
                } else {
                    owned.remove(&b);
                }
            }
        }
        owned
    }
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

/// A relay with the fast test options (`fast_relay_options(id, bucket_count)`) on
/// `client`, running until it is stopped.
async fn spawn_fast<P: Publisher>(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    publisher: &Arc<P>,
    id: &str,
    bucket_count: u32,
) -> Running {
    let relay_options = fast_relay_options(id, bucket_count);
    spawn(relay_with(client, options, publisher.clone(), relay_options).await)
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
            AttributeValue::S(
                dynamo_outbox::protocol::schema::Keys::new(options).coordination_pk(),
            ),
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
