//! What every benchmark shares: clients for the local stack, fresh tables and topics, a
//! backlog seeded directly with `BatchWriteItem`, a metrics hook that tells when a relay
//! published what it should, process statistics, percentiles.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use aws_sdk_dynamodb::Client;
use dynamo_outbox::metrics::RelayMetrics;
use dynamo_outbox::protocol::attr;
use dynamo_outbox::protocol::schema::{self, Keys};
use dynamo_outbox::publish::{KafkaConfig, KafkaPublisher};
use dynamo_outbox::{OutboxMessage, OutboxOptions};
use futures::stream::{self, StreamExt, TryStreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::classify::{Classifier, Counts};

/// The benchmarks' error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The benchmarks' result type.
pub type Result<T> = std::result::Result<T, BoxError>;

/// A variable that `scripts/stack.sh` exports (the test crate's, as the tests read it).
pub fn stack_var(name: &str) -> Result<String> {
    Ok(outbox_testkit::try_stack_var(name)?)
}

/// The shared AWS configuration for DynamoDB Local (the test crate's).
pub async fn sdk_config() -> Result<aws_config::SdkConfig> {
    Ok(outbox_testkit::try_sdk_config().await?)
}

/// A client with the library's timeouts ([`dynamo_outbox::client::dynamodb_config`]) and,
/// when given, the classifier.
pub fn client(config: &aws_config::SdkConfig, classifier: Option<&Classifier>) -> Client {
    let mut builder = dynamo_outbox::client::dynamodb_config(config);
    if let Some(c) = classifier {
        builder = builder.interceptor(c.clone());
    }
    Client::from_conf(builder.build())
}

pub use outbox_testkit::random_name;

/// A fresh, active table for `bucket_count` buckets.
pub async fn fresh_table(
    client: &Client,
    bucket_count: u32,
    max_concurrency: usize,
) -> Result<OutboxOptions> {
    let mut options = OutboxOptions::new(random_name("bench")).with_bucket_count(bucket_count);
    options.max_concurrency = max_concurrency;
    dynamo_outbox::table::create_if_not_exists(client, &options).await?;
    Ok(options)
}

/// Deletes a table (DynamoDB Local keeps everything in memory).
pub async fn drop_table(client: &Client, options: &OutboxOptions) {
    let _ = client
        .delete_table()
        .table_name(&options.table_name)
        .send()
        .await;
}

/// A Kafka publisher for the local broker.
pub async fn publisher() -> Result<Arc<KafkaPublisher>> {
    stack_var("KAFKA_BOOTSTRAP_SERVERS")?;
    let config = KafkaConfig::from_env()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    Ok(Arc::new(KafkaPublisher::connect(config, deadline).await?))
}

/// A fresh topic with `partitions` partitions, visible in the metadata.
pub async fn fresh_topic(publisher: &KafkaPublisher, partitions: i32) -> Result<String> {
    let topic = random_name("bench");
    publisher.create_topic(&topic, partitions, 1).await?;
    Ok(topic)
}

/// A value of `size` bytes that starts with the decimal `index` and a space.
pub fn payload(size: usize, index: u64) -> Vec<u8> {
    let mut v = format!("{index} ").into_bytes();
    v.resize(size.max(v.len()), b'x');
    v
}

/// The index a [`payload`] starts with.
pub fn payload_index(value: &[u8]) -> Option<u64> {
    let end = value.iter().position(|b| *b == b' ')?;
    std::str::from_utf8(&value[..end]).ok()?.parse().ok()
}

/// What [`seed`] wrote.
#[derive(Debug, Clone, Default)]
pub struct Seeded {
    /// Messages per bucket.
    pub per_bucket: BTreeMap<u32, u64>,
    /// Sequence numbers left out on purpose (gaps), over all buckets.
    pub gaps: u64,
    /// How long the seeding took.
    pub took: Duration,
}

impl Seeded {
    /// Every message written.
    pub fn total(&self) -> u64 {
        self.per_bucket.values().sum()
    }
}

/// Seeds a backlog of `count` messages of `size` bytes for `topic`, keyed `key-{i}`, as
/// message items written with `BatchWriteItem` (25 per request, `concurrency` requests at
/// once), then the buckets' counters. With `gap_every = Some(k)`, every `k`-th sequence
/// number of a bucket is left out (a reservation whose transaction never committed).
pub async fn seed(
    client: &Client,
    options: &OutboxOptions,
    topic: &str,
    count: u64,
    size: usize,
    concurrency: usize,
    gap_every: Option<u64>,
) -> Result<Seeded> {
    seed_keys(
        client,
        options,
        topic,
        count,
        size,
        concurrency,
        gap_every,
        None,
    )
    .await
}

/// [`seed`] with the keys drawn from `distinct_keys` ones (`key-{i % distinct_keys}`) when
/// given.
#[allow(clippy::too_many_arguments)]
pub async fn seed_keys(
    client: &Client,
    options: &OutboxOptions,
    topic: &str,
    count: u64,
    size: usize,
    concurrency: usize,
    gap_every: Option<u64>,
    distinct_keys: Option<u64>,
) -> Result<Seeded> {
    let started = Instant::now();
    let keys = Keys::new(options);
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    let mut seeded = Seeded::default();
    let mut placed: Vec<(OutboxMessage, u32, u64)> = Vec::with_capacity(count as usize);
    for i in 0..count {
        let message = OutboxMessage::new(topic, options.bucket_count)
            .with_key(format!("key-{}", distinct_keys.map_or(i, |k| i % k.max(1))))
            .with_value(payload(size, i));
        let bucket = message.bucket();
        let seq = next.entry(bucket).or_insert(0);
        *seq += 1;
        if gap_every.is_some_and(|k| *seq % k == 0) {
            *seq += 1;
            seeded.gaps += 1;
        }
        *seeded.per_bucket.entry(bucket).or_default() += 1;
        placed.push((message, bucket, *seq));
    }
    let table = options.table_name.as_str();
    let requests = placed.chunks(25).map(|chunk| {
        let writes: Result<Vec<WriteRequest>> = chunk
            .iter()
            .map(|(m, b, s)| {
                let item = schema::message_item(&keys, m, *b, *s)?;
                Ok(WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(item)).build()?)
                    .build())
            })
            .collect();
        async move { batch_write(client, table, writes?).await }
    });
    stream::iter(requests)
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    for (bucket, last) in &next {
        let mut item = keys.key(keys.sequence_pk(*bucket), schema::SEQUENCE_SK.into());
        item.insert(attr::SEQUENCE.into(), schema::n(*last));
        client
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await?;
    }
    seeded.took = started.elapsed();
    Ok(seeded)
}

/// One `BatchWriteItem`, unprocessed items retried with a short backoff (bounded).
pub async fn batch_write(
    client: &Client,
    table: &str,
    mut writes: Vec<WriteRequest>,
) -> Result<()> {
    let mut pause = Duration::from_millis(10);
    for _ in 0..20 {
        let out = client
            .batch_write_item()
            .request_items(table, writes)
            .send()
            .await?;
        writes = out
            .unprocessed_items
            .and_then(|mut m| m.remove(table))
            .unwrap_or_default();
        if writes.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    Err("BatchWriteItem: items still unprocessed after 20 attempts".into())
}

/// One acquisition round as the metrics hook saw it.
#[derive(Debug, Clone)]
pub struct Round {
    /// When the round ended.
    pub ended: Instant,
    /// How long it took.
    pub duration: Duration,
    /// The classifier's counts when it ended (when the hook has a classifier).
    pub counts: Option<Counts>,
}

/// A [`RelayMetrics`] that counts published messages (and wakes whoever waits for a
/// number), records rounds and refused writes. Share one between relays to count a fleet.
#[derive(Debug)]
pub struct Hook {
    published: watch::Sender<u64>,
    done: Mutex<Option<(u64, Instant)>>,
    target: AtomicU64,
    rounds: Mutex<Vec<Round>>,
    refused: AtomicU64,
    classifier: Option<Classifier>,
    batches: Mutex<Vec<Duration>>,
}

impl Hook {
    /// A hook; with `classifier`, each round records the counts at its end.
    pub fn new(classifier: Option<Classifier>) -> Arc<Self> {
        Arc::new(Hook {
            published: watch::channel(0).0,
            done: Mutex::new(None),
            target: AtomicU64::new(u64::MAX),
            rounds: Mutex::new(Vec::new()),
            refused: AtomicU64::new(0),
            classifier,
            batches: Mutex::new(Vec::new()),
        })
    }

    /// Sets the number whose arrival [`Hook::done_at`] records.
    pub fn set_target(&self, target: u64) {
        self.target.store(target, Ordering::SeqCst);
    }

    /// Messages published so far.
    pub fn published(&self) -> u64 {
        *self.published.borrow()
    }

    /// When the target was reached.
    pub fn done_at(&self) -> Option<Instant> {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|d| d.1)
    }

    /// Waits until `count` messages were published.
    pub fn wait_published(
        self: &Arc<Self>,
        count: u64,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.published.subscribe();
        async move {
            let _ = rx.wait_for(|p| *p >= count).await;
        }
    }

    /// Waits until `count` rounds ended (of every relay sharing the hook).
    pub fn wait_rounds(
        self: &Arc<Self>,
        count: usize,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let hook = self.clone();
        async move {
            while hook.rounds().len() < count {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// The rounds so far.
    pub fn rounds(&self) -> Vec<Round> {
        self.rounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Batch durations so far.
    pub fn batches(&self) -> Vec<Duration> {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Refused conditional writes reported so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl RelayMetrics for Hook {
    fn published(&self, _bucket: u32, count: u64) {
        let mut total = 0;
        self.published.send_modify(|p| {
            *p += count;
            total = *p;
        });
        if total >= self.target.load(Ordering::SeqCst) {
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            if done.is_none() {
                *done = Some((total, Instant::now()));
            }
        }
    }

    fn refused_write(&self, _kind: dynamo_outbox::protocol::store::WriteKind) {
        self.refused.fetch_add(1, Ordering::SeqCst);
    }

    fn round_duration(&self, duration: Duration) {
        let counts = self.classifier.as_ref().map(Classifier::snapshot);
        self.rounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Round {
                ended: Instant::now(),
                duration,
                counts,
            });
    }

    fn batch_duration(&self, _bucket: u32, duration: Duration) {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(duration);
    }
}

/// Peak resident set size of this process (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> Option<u64> {
    status_kib("/proc/self/status", "VmHWM:")
}

/// Peak resident set size (`VmHWM`) of the live process `pid`, in KiB.
pub fn peak_rss_kib_of(pid: u32) -> Option<u64> {
    status_kib(&format!("/proc/{pid}/status"), "VmHWM:")
}

fn status_kib(path: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// User and system CPU seconds of this process so far (`/proc/self/stat`, clock ticks of
/// 10 ms, the kernel's USER_HZ).
pub fn cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // after the command: state is field 3, utime field 14, stime field 15
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime / 100.0, stime / 100.0))
}

/// The `q` quantile (0..=1) of `values` (sorted here), nearest rank.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Milliseconds with one decimal.
pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// `n / d` with two decimals, or `-` for a zero `d`.
pub fn ratio(n: f64, d: f64) -> String {
    if d == 0.0 {
        "-".into()
    } else {
        format!("{:.2}", n / d)
    }
}
