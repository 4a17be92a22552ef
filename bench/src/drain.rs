//! Drain throughput: a backlog drained by the relay, against a raw baseline in the same run
//! (the minimal loop with the same SDK client and Kafka publisher: a strongly consistent
//! query of a bucket, produce, `BatchWriteItem` delete; no leases, no gap probes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use aws_sdk_dynamodb::Client;
use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::protocol::schema::{self, Keys};
use dynamo_outbox::publish::{KafkaPublisher, Publisher};
use dynamo_outbox::{DynamoDbOutboxStore, OutboxOptions, Relay, RelayOptions, RunReport};
use futures::stream::{self, StreamExt, TryStreamExt};
use tokio::time::Instant;

use crate::classify::{Classifier, Counts};
use crate::support::{self, Hook, Result};

/// Sizes of a drain benchmark.
#[derive(Debug, Clone)]
pub struct DrainArgs {
    /// Messages in the backlog.
    pub messages: u64,
    /// Bytes per message value.
    pub size: usize,
    /// Buckets.
    pub buckets: u32,
    /// Relay batch size (also the raw loop's query limit).
    pub batch_size: u32,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Max concurrency (buckets published at once; the raw loop drains as many buckets at once).
    pub concurrency: usize,
    /// Relays of the fleet run (0: skip it).
    pub fleet: usize,
    /// Raw/relay pairs; with 2 the order is raw, relay, relay, raw (drift cancels).
    pub pairs: usize,
}

/// One timed drain.
#[derive(Debug, Clone)]
pub struct Drained {
    /// What drained it.
    pub what: String,
    /// Messages published (and deleted).
    pub messages: u64,
    /// From the start of the loop to the last delete.
    pub took: Duration,
    /// Seeding time of its backlog (context).
    pub seeded_in: Duration,
    /// Requests by purpose.
    pub counts: Counts,
    /// The relays' reports (empty for the raw loop).
    pub reports: Vec<RunReport>,
}

impl Drained {
    /// Messages per second.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.took.as_secs_f64().max(1e-9)
    }

    /// One line of output.
    pub fn line(&self) -> String {
        let refused: u64 = self.reports.iter().map(RunReport::refused_total).sum();
        let rounds: u64 = self.reports.iter().map(|r| r.rounds).sum();
        let extra = if self.reports.is_empty() {
            String::new()
        } else {
            format!("; rounds {rounds}, refused writes {refused}")
        };
        format!(
            "{:<18} {:>7} msgs in {:>6.2} s = {:>7.0} msg/s (seeded in {:.1} s){extra}\n{:<18} requests: {}\n{:<18} items read: {}",
            self.what,
            self.messages,
            self.took.as_secs_f64(),
            self.rate(),
            self.seeded_in.as_secs_f64(),
            "",
            self.counts.line(),
            "",
            self.counts.reads_line()
        )
    }
}

/// The whole drain benchmark.
#[derive(Debug, Clone)]
pub struct DrainReport {
    /// Raw runs.
    pub raw: Vec<Drained>,
    /// Single-relay runs.
    pub relay: Vec<Drained>,
    /// The fleet run.
    pub fleet: Option<Drained>,
}

impl DrainReport {
    /// Total relay rate over total raw rate (the runs' mean rates).
    pub fn ratio(&self) -> f64 {
        let mean = |v: &[Drained]| v.iter().map(Drained::rate).sum::<f64>() / v.len().max(1) as f64;
        mean(&self.relay) / mean(&self.raw).max(1e-9)
    }
}

async fn seeded_table(
    config: &aws_config::SdkConfig,
    publisher: &KafkaPublisher,
    args: &DrainArgs,
) -> Result<(Client, OutboxOptions, String, support::Seeded)> {
    let plain = support::client(config, None);
    let options = support::fresh_table(&plain, args.buckets, args.concurrency).await?;
    let topic = support::fresh_topic(publisher, args.partitions).await?;
    let seeded =
        support::seed(&plain, &options, &topic, args.messages, args.size, 16, None).await?;
    Ok((plain, options, topic, seeded))
}

/// Runs the raw loop over a fresh backlog.
pub async fn raw_run(config: &aws_config::SdkConfig, args: &DrainArgs) -> Result<Drained> {
    let publisher = support::publisher().await?;
    let (plain, options, _topic, seeded) = seeded_table(config, &publisher, args).await?;
    let classifier = Classifier::default();
    let client = support::client(config, Some(&classifier));
    let phases = Phases::default();
    let started = Instant::now();
    let messages = raw_drain_timed(
        &client,
        &options,
        &*publisher,
        args.batch_size,
        args.concurrency,
        &phases,
    )
    .await?;
    let took = started.elapsed();
    println!("{:<18} raw loop time by phase: {}", "", phases.line());
    support::drop_table(&plain, &options).await;
    if messages != seeded.total() {
        return Err(format!("raw loop drained {messages} of {}", seeded.total()).into());
    }
    Ok(Drained {
        what: "raw baseline".into(),
        messages,
        took,
        seeded_in: seeded.took,
        counts: classifier.snapshot(),
        reports: Vec::new(),
    })
}

/// The minimal loop: every bucket (`concurrency` at once) is queried (strongly consistent,
/// ascending, `batch_size`), published, deleted (`BatchWriteItem`, 25 at a time) until empty.
pub async fn raw_drain<P: Publisher>(
    client: &Client,
    options: &OutboxOptions,
    publisher: &P,
    batch_size: u32,
    concurrency: usize,
) -> Result<u64> {
    raw_drain_timed(
        client,
        options,
        publisher,
        batch_size,
        concurrency,
        &Phases::default(),
    )
    .await
}

/// Time spent in each phase of the raw loop, summed over buckets (nanoseconds).
#[derive(Debug, Default)]
pub struct Phases {
    /// The query.
    pub query: AtomicU64,
    /// Parsing the items.
    pub parse: AtomicU64,
    /// Publishing.
    pub publish: AtomicU64,
    /// Deleting.
    pub delete: AtomicU64,
}

impl Phases {
    fn add(slot: &AtomicU64, since: Instant) -> Instant {
        let now = Instant::now();
        slot.fetch_add((now - since).as_nanos() as u64, Ordering::Relaxed);
        now
    }

    /// `query x% parse y% ...` shares of the summed time.
    pub fn line(&self) -> String {
        let v = [
            ("query", self.query.load(Ordering::Relaxed)),
            ("parse", self.parse.load(Ordering::Relaxed)),
            ("publish", self.publish.load(Ordering::Relaxed)),
            ("delete", self.delete.load(Ordering::Relaxed)),
        ];
        let total: u64 = v.iter().map(|(_, n)| n).sum::<u64>().max(1);
        v.iter()
            .map(|(k, n)| format!("{k} {:.0}%", *n as f64 * 100.0 / total as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// [`raw_drain`], adding each phase's time to `phases`.
pub async fn raw_drain_timed<P: Publisher>(
    client: &Client,
    options: &OutboxOptions,
    publisher: &P,
    batch_size: u32,
    concurrency: usize,
    phases: &Phases,
) -> Result<u64> {
    let keys = Keys::new(options);
    let keys = &keys;
    let drains = (0..options.bucket_count).map(|bucket| async move {
        let mut total = 0u64;
        loop {
            let t = Instant::now();
            let out = client
                .query()
                .table_name(&options.table_name)
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", &keys.pk)
                .expression_attribute_values(":pk", AttributeValue::S(keys.message_pk(bucket)))
                .consistent_read(true)
                .scan_index_forward(true)
                .limit(batch_size as i32)
                .send()
                .await?;
            let items = out.items.unwrap_or_default();
            if items.is_empty() {
                return Ok::<u64, support::BoxError>(total);
            }
            let t = Phases::add(&phases.query, t);
            let messages = items
                .iter()
                .map(|i| schema::parse_message(keys, i))
                .collect::<dynamo_outbox::Result<Vec<StoredMessage>>>()?;
            let t = Phases::add(&phases.parse, t);
            let outcome = publisher.publish(&messages).await;
            if let Some(e) = outcome.error {
                return Err(e.into());
            }
            let t = Phases::add(&phases.publish, t);
            for chunk in messages.chunks(25) {
                let deletes = chunk
                    .iter()
                    .map(|m| {
                        Ok(WriteRequest::builder()
                            .delete_request(
                                DeleteRequest::builder()
                                    .set_key(Some(keys.key(
                                        keys.message_pk(bucket),
                                        schema::message_sk(m.sequence),
                                    )))
                                    .build()?,
                            )
                            .build())
                    })
                    .collect::<Result<Vec<_>>>()?;
                support::batch_write(client, &options.table_name, deletes).await?;
            }
            Phases::add(&phases.delete, t);
            total += messages.len() as u64;
        }
    });
    let totals: Vec<u64> = stream::iter(drains)
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await?;
    Ok(totals.into_iter().sum())
}

/// Relay options of the benchmarks: the defaults, with the benchmark's bucket count and
/// batch size.
pub fn relay_options(args: &DrainArgs, id: &str) -> RelayOptions {
    RelayOptions::default()
        .with_bucket_count(args.buckets)
        .with_batch_size(args.batch_size)
        .with_relay_id(id)
}

/// Runs `relays` relays over a fresh backlog until every message is published.
pub async fn relay_run(
    config: &aws_config::SdkConfig,
    args: &DrainArgs,
    relays: usize,
) -> Result<Drained> {
    let publisher = support::publisher().await?;
    let (plain, options, _topic, seeded) = seeded_table(config, &publisher, args).await?;
    let classifier = Classifier::default();
    let client = support::client(config, Some(&classifier));
    let hook = Hook::new(None);
    hook.set_target(seeded.total());
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..relays {
        let store = DynamoDbOutboxStore::new(client.clone(), options.clone())?;
        let relay = Relay::new(
            store,
            publisher.clone(),
            relay_options(args, &format!("bench-relay-{i}")),
        )?
        .with_metrics(hook.clone());
        let signal = hook.wait_published(seeded.total());
        handles.push(tokio::spawn(async move {
            relay
                .run_until_shutdown(signal, Duration::from_secs(15))
                .await
        }));
    }
    let mut reports = Vec::new();
    for h in handles {
        reports.push(h.await??);
    }
    let took = hook
        .done_at()
        .ok_or("the relays stopped before publishing every message")?
        - started;
    support::drop_table(&plain, &options).await;
    Ok(Drained {
        what: if relays == 1 {
            "relay".into()
        } else {
            format!("{relays} relays")
        },
        messages: hook.published(),
        took,
        seeded_in: seeded.took,
        counts: classifier.snapshot(),
        reports,
    })
}

/// The benchmark: raw and relay pairs, then the fleet.
pub async fn run(args: &DrainArgs) -> Result<DrainReport> {
    let config = support::sdk_config().await?;
    println!(
        "== drain: {} messages x {} B over {} buckets, batch {}, {} topic partitions, max concurrency {}",
        args.messages, args.size, args.buckets, args.batch_size, args.partitions, args.concurrency
    );
    let mut report = DrainReport {
        raw: Vec::new(),
        relay: Vec::new(),
        fleet: None,
    };
    if args.pairs > 0 {
        // Warm-up, not reported: the first drain of a fresh DynamoDB Local runs while its
        // JVM still compiles, which would handicap whichever loop goes first.
        let warmup = DrainArgs {
            messages: (args.messages / 10).max(500),
            ..args.clone()
        };
        let w = raw_run(&config, &warmup).await?;
        println!(
            "(warm-up raw drain of {} messages, not counted: {:.0} msg/s)",
            w.messages,
            w.rate()
        );
    }
    let order: Vec<bool> = match args.pairs {
        0 => Vec::new(),
        1 => vec![false, true],
        n => (0..n)
            .flat_map(|i| {
                if i % 2 == 0 {
                    [false, true]
                } else {
                    [true, false]
                }
            })
            .collect(),
    };
    for relay in order {
        let d = if relay {
            relay_run(&config, args, 1).await?
        } else {
            raw_run(&config, args).await?
        };
        println!("{}", d.line());
        if relay {
            report.relay.push(d);
        } else {
            report.raw.push(d);
        }
    }
    if !report.raw.is_empty() && !report.relay.is_empty() {
        println!(
            "relay / raw throughput ratio: {:.2} (goal >= 0.90)",
            report.ratio()
        );
    }
    if args.fleet > 1 {
        let d = relay_run(&config, args, args.fleet).await?;
        println!("{}", d.line());
        let owned: Vec<String> = d
            .reports
            .iter()
            .map(|r| format!("{} max {}", r.relay_id, r.max_owned))
            .collect();
        println!("{:<18} owned: {}", "", owned.join(", "));
        if let Some(raw) = report.raw.first() {
            println!(
                "{} relays / raw throughput ratio: {:.2}",
                args.fleet,
                d.rate() / raw.rate()
            );
        }
        report.fleet = Some(d);
    }
    Ok(report)
}

/// For the footprint child: a relay in this process draining `expect` messages of `table`.
pub async fn relay_until_drained(
    options: OutboxOptions,
    batch_size: u32,
    expect: u64,
) -> Result<(RunReport, Duration)> {
    let config = support::sdk_config().await?;
    let client = dynamo_outbox::client::dynamodb_client(&config);
    let publisher = support::publisher().await?;
    let hook = Hook::new(None);
    hook.set_target(expect);
    let args = DrainArgs {
        messages: expect,
        size: 0,
        buckets: options.bucket_count,
        batch_size,
        partitions: 1,
        concurrency: options.max_concurrency,
        fleet: 0,
        pairs: 0,
    };
    let store = DynamoDbOutboxStore::new(client, options)?;
    let relay = Relay::new(store, publisher, relay_options(&args, "bench-footprint"))?
        .with_metrics(hook.clone());
    let started = Instant::now();
    let report = relay
        .run_until_shutdown(hook.wait_published(expect), Duration::from_secs(15))
        .await?;
    let took = hook.done_at().map_or(started.elapsed(), |d| d - started);
    Ok((report, took))
}
