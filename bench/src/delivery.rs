//! Exactly once against at least once: drain throughput at the default batch size (the
//! same backlog drained by one relay in each mode, runs alternating), the requests each
//! mode sends per 1,000 messages, and how long a fresh relay (a new process: a new
//! connection, no producer taken) takes to publish one message in each of its buckets; and
//! what one delete costs the DynamoDB under test in each mode's way.

use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::protocol::schema::{self, Keys};
use dynamo_outbox::publish::{Delivery, KafkaConfig, KafkaPublisher, TransactionCounts};
use dynamo_outbox::{DynamoDbOutboxStore, Relay, RelayOptions};
use tokio::time::Instant;

use crate::classify::{Classifier, Counts};
use crate::support::{self, Hook, Result};

/// Sizes of the delivery benchmark.
#[derive(Debug, Clone)]
pub struct DeliveryArgs {
    /// Messages in each backlog.
    pub messages: u64,
    /// Bytes per message value.
    pub size: usize,
    /// Buckets.
    pub buckets: u32,
    /// Partitions of the topic.
    pub partitions: i32,
    /// At-least-once / exactly-once pairs, alternating (2: alo, eo, eo, alo).
    pub pairs: usize,
    /// Fresh relays timed per mode for the first message.
    pub fresh: usize,
}

/// One timed drain in one mode.
#[derive(Debug, Clone)]
struct Run {
    delivery: Delivery,
    messages: u64,
    took: Duration,
    dynamodb: Counts,
    produce_requests: u64,
    transactions: Option<TransactionCounts>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.took.as_secs_f64().max(1e-9)
    }
}

async fn publisher(delivery: Delivery, watermark_topic: &str) -> Result<Arc<KafkaPublisher>> {
    support::stack_var("KAFKA_BOOTSTRAP_SERVERS")?;
    let mut config = KafkaConfig::from_env()?;
    config.delivery = delivery;
    config.watermark_topic = watermark_topic.to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    Ok(Arc::new(KafkaPublisher::connect(config, deadline).await?))
}

/// The relay's defaults (batch size 500; exactly once caps its batches at 250).
fn options(buckets: u32, id: &str) -> RelayOptions {
    RelayOptions::default()
        .with_bucket_count(buckets)
        .with_relay_id(id)
}

/// Drains a fresh backlog of `args.messages` with one relay delivering as `delivery`.
async fn drain(
    config: &aws_config::SdkConfig,
    args: &DeliveryArgs,
    delivery: Delivery,
    watermarks: &str,
) -> Result<Run> {
    let publisher = publisher(delivery, watermarks).await?;
    let plain = support::client(config, None);
    let table = support::fresh_table(&plain, args.buckets, 8).await?;
    let topic = support::fresh_topic(&publisher, args.partitions).await?;
    let seeded = support::seed(&plain, &table, &topic, args.messages, args.size, 16, None).await?;
    let classifier = Classifier::default();
    let client = support::client(config, Some(&classifier));
    let hook = Hook::new(None);
    hook.set_target(seeded.total());
    let store = DynamoDbOutboxStore::new(client, table.clone())?;
    let relay = Relay::new(
        store,
        publisher.clone(),
        options(args.buckets, "bench-delivery"),
    )?
    .with_metrics(hook.clone());
    let started = Instant::now();
    let report = relay
        .run_until_shutdown(hook.wait_published(seeded.total()), Duration::from_secs(15))
        .await?;
    let took = hook
        .done_at()
        .ok_or("the relay stopped before publishing every message")?
        - started;
    support::drop_table(&plain, &table).await;
    if report.refused_total() != 0 {
        return Err(format!("{delivery}: {} refused writes", report.refused_total()).into());
    }
    Ok(Run {
        delivery,
        messages: seeded.total(),
        took,
        dynamodb: classifier.snapshot(),
        produce_requests: publisher.produce_requests(),
        transactions: publisher.transaction_counts(),
    })
}

/// Time from a fresh relay's start until one message in each of `buckets` is published.
async fn first_messages(
    config: &aws_config::SdkConfig,
    buckets: u32,
    delivery: Delivery,
    watermarks: &str,
) -> Result<Duration> {
    let plain = support::client(config, None);
    let table = support::fresh_table(&plain, buckets, 8).await?;
    let setup = publisher(Delivery::AtLeastOnce, watermarks).await?;
    let topic = support::fresh_topic(&setup, 8).await?;
    // Enough messages that every bucket has one (keys spread by murmur2).
    let seeded =
        support::seed(&plain, &table, &topic, u64::from(buckets) * 4, 100, 8, None).await?;
    let started = Instant::now();
    // A fresh relay: its own connection, nothing taken, as a fresh Lambda invocation.
    let publisher = publisher(delivery, watermarks).await?;
    let hook = Hook::new(None);
    hook.set_target(seeded.total());
    let store = DynamoDbOutboxStore::new(plain.clone(), table.clone())?;
    let relay =
        Relay::new(store, publisher, options(buckets, "bench-fresh"))?.with_metrics(hook.clone());
    relay
        .run_until_shutdown(hook.wait_published(seeded.total()), Duration::from_secs(15))
        .await?;
    let took = hook.done_at().ok_or("not every message was published")? - started;
    support::drop_table(&plain, &table).await;
    Ok(took)
}

/// What a delete of one message costs this DynamoDB, by key (at least once's
/// `BatchWriteItem`) and conditional on its message id (exactly once's PartiQL
/// `BatchExecuteStatement`): `count` messages of one bucket deleted each way, `rounds`
/// times alternating, through the store's own calls. Totals per way.
async fn delete_costs(
    config: &aws_config::SdkConfig,
    count: u64,
    rounds: usize,
) -> Result<(Duration, Duration)> {
    let plain = support::client(config, None);
    let table = support::fresh_table(&plain, 1, 8).await?;
    let store = DynamoDbOutboxStore::new(plain.clone(), table.clone())?;
    let keys = Keys::new(&table);
    let (mut by_key, mut conditional) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds * 2 {
        support::seed(&plain, &table, "bench-deletes", count, 1024, 16, None).await?;
        let items = store.fetch_items(0, u32::try_from(count)?).await?;
        let messages: Vec<(u64, uuid::Uuid)> = items
            .iter()
            .filter_map(|item| schema::parse_message(&keys, item).ok())
            .map(|m| (m.sequence, m.message.message_id))
            .collect();
        if messages.len() as u64 != count {
            return Err(format!("seeded {count}, read back {}", messages.len()).into());
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        let started = Instant::now();
        let deleted = if (round % 2 == 0) == (round / 2 % 2 == 0) {
            let sequences: Vec<u64> = messages.iter().map(|(seq, _)| *seq).collect();
            let n = store.delete_messages(0, &sequences, deadline).await?;
            by_key += started.elapsed();
            n
        } else {
            let n = store
                .delete_messages_if_same(0, &messages, deadline)
                .await?;
            conditional += started.elapsed();
            n
        };
        if deleted != messages.len() {
            return Err(format!("deleted {deleted} of {}", messages.len()).into());
        }
    }
    support::drop_table(&plain, &table).await;
    Ok((by_key, conditional))
}

/// Requests of `counts` per 1,000 messages of `messages`.
fn per_thousand(n: u64, messages: u64) -> f64 {
    n as f64 * 1000.0 / messages.max(1) as f64
}

/// Runs the benchmark and prints its figures.
pub async fn run(args: &DeliveryArgs) -> Result<()> {
    let config = support::sdk_config().await?;
    let setup = publisher(Delivery::AtLeastOnce, "unused").await?;
    let watermarks = support::random_name("bench-watermarks");
    setup.create_topic(&watermarks, 1, 1).await?;
    println!(
        "delivery: {} x {} B over {} buckets, {} partitions, batch size 500 (exactly once: 250), {} pairs",
        args.messages, args.size, args.buckets, args.partitions, args.pairs
    );
    let mut runs: Vec<Run> = Vec::new();
    for pair in 0..args.pairs {
        let order = if pair % 2 == 0 {
            [Delivery::AtLeastOnce, Delivery::ExactlyOnce]
        } else {
            [Delivery::ExactlyOnce, Delivery::AtLeastOnce]
        };
        for delivery in order {
            let run = drain(&config, args, delivery, &watermarks).await?;
            println!(
                "{:<14} {:>7} msgs in {:>6.2} s = {:>7.0} msg/s; produce requests {}, transactions {:?}\n{:<14} DynamoDB: {}",
                run.delivery.to_string(),
                run.messages,
                run.took.as_secs_f64(),
                run.rate(),
                run.produce_requests,
                run.transactions,
                "",
                run.dynamodb.line()
            );
            runs.push(run);
        }
    }
    let mean = |d: Delivery| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.delivery == d)
            .map(Run::rate)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (alo, eo) = (mean(Delivery::AtLeastOnce), mean(Delivery::ExactlyOnce));
    println!(
        "throughput exactly-once / at-least-once: {:.2} (means {eo:.0} / {alo:.0} msg/s)",
        eo / alo.max(1e-9)
    );
    let (count, rounds) = (args.messages.min(5_000), args.pairs);
    let (by_key, conditional) = delete_costs(&config, count, rounds).await?;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / (count as f64 * rounds as f64);
    println!(
        "deletes on this DynamoDB, per message ({count} x {rounds}, alternating): by key (BatchWriteItem) {:.0} us, conditional (BatchExecuteStatement) {:.0} us: {:.2}x",
        per(by_key),
        per(conditional),
        conditional.as_secs_f64() / by_key.as_secs_f64().max(1e-9)
    );
    for d in [Delivery::AtLeastOnce, Delivery::ExactlyOnce] {
        let Some(r) = runs.iter().find(|r| r.delivery == d) else {
            continue;
        };
        let kafka = match r.transactions {
            // Per committed transaction: AddPartitionsToTxn, AddOffsetsToTxn,
            // TxnOffsetCommit, EndTxn; per take: FindCoordinator x2, InitProducerId,
            // OffsetFetch.
            Some(t) => r.produce_requests + 4 * t.commits + 4 * t.takes,
            None => r.produce_requests,
        };
        let batches = r.transactions.map(|t| t.commits);
        println!(
            "{:<14} per 1,000 messages: Kafka requests {:.1} (produce {:.1}), DynamoDB requests {:.1}; transactions {:?}",
            d.to_string(),
            per_thousand(kafka, r.messages),
            per_thousand(r.produce_requests, r.messages),
            per_thousand(r.dynamodb.total(), r.messages),
            batches
        );
    }
    for d in [Delivery::AtLeastOnce, Delivery::ExactlyOnce] {
        let mut times = Vec::new();
        for _ in 0..args.fresh {
            times.push(first_messages(&config, args.buckets, d, &watermarks).await?);
        }
        let p50 = support::quantile(&mut times, 0.5);
        println!(
            "{:<14} a fresh relay publishes one message in each of {} buckets in {} ms (median of {}: {} ms)",
            d.to_string(),
            args.buckets,
            support::ms(p50),
            times.len(),
            times.iter().map(|t| support::ms(*t)).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}
