//! Request accounting against the specification's cost model: requests per published
//! message at steady drain, per enqueue, and of an idle relay per poll and renew interval.

use std::collections::BTreeSet;
use std::time::Duration;

use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Relay, RelayOptions, RunReport};
use tokio::time::Instant;

use crate::classify::{Class, Classifier, Counts};
use crate::support::{self, Hook, Result};

/// Requests of a steady drain, measured and expected.
#[derive(Debug, Clone)]
pub struct SteadyDrain {
    /// Messages published.
    pub messages: u64,
    /// Sequence gaps seeded.
    pub gaps: u64,
    /// Requests by purpose.
    pub counts: Counts,
    /// Fetches the model expects: one per batch (plus the empty one after a last full batch).
    pub expected_fetches: u64,
    /// `BatchWriteItem` the model expects: one per 25 deletes of a batch.
    pub expected_deletes: u64,
    /// The relay's report.
    pub report: RunReport,
}

impl SteadyDrain {
    /// Prints the figures.
    pub fn print(&self) {
        let n = self.messages as f64;
        let c = &self.counts;
        println!(
            "steady drain: {} messages ({} seeded gaps), relay rounds {}, refused writes {}",
            self.messages,
            self.gaps,
            self.report.rounds,
            self.report.refused_total()
        );
        println!("  requests: {}", c.line());
        println!(
            "  items read by queries: {} (per message: fetch {:.2}, backlog sample {:.2})",
            c.reads_line(),
            c.items_read(Class::Fetch) as f64 / n,
            (c.items_read(Class::BacklogCount) + c.items_read(Class::BacklogHead)) as f64 / n,
        );
        println!(
            "  per message: fetch {:.4} (expected {:.4}: one per batch), batch-delete {:.4} (expected {:.4}: one per 25), gap probes {:.4} (expected {:.4}: one per real gap), lease writes {:.5}, probes {:.5}, total {:.4}",
            c.get(Class::Fetch) as f64 / n,
            self.expected_fetches as f64 / n,
            c.get(Class::Delete) as f64 / n,
            self.expected_deletes as f64 / n,
            c.get(Class::GapProbe) as f64 / n,
            self.gaps as f64 / n,
            Class::ALL.iter().filter(|k| k.is_lease_write()).map(|k| c.get(*k)).sum::<u64>() as f64 / n,
            c.get(Class::Probe) as f64 / n,
            c.total() as f64 / n,
        );
        println!(
            "  measured / expected: fetch {}, batch-delete {}, gap probes {}",
            support::ratio(c.get(Class::Fetch) as f64, self.expected_fetches as f64),
            support::ratio(c.get(Class::Delete) as f64, self.expected_deletes as f64),
            support::ratio(c.get(Class::GapProbe) as f64, self.gaps as f64),
        );
    }
}

/// Drains a seeded backlog of `messages` over `buckets` with one relay (batch
/// `batch_size`), with a gap every `gap_every` sequence numbers if given.
pub async fn steady_drain(
    messages: u64,
    buckets: u32,
    batch_size: u32,
    gap_every: Option<u64>,
) -> Result<SteadyDrain> {
    let config = support::sdk_config().await?;
    let plain = support::client(&config, None);
    let options = support::fresh_table(&plain, buckets, 8).await?;
    let publisher = support::publisher().await?;
    let topic = support::fresh_topic(&publisher, 4).await?;
    let seeded = support::seed(&plain, &options, &topic, messages, 1024, 16, gap_every).await?;
    let classifier = Classifier::default();
    let client = support::client(&config, Some(&classifier));
    let hook = Hook::new(None);
    let store = DynamoDbOutboxStore::new(client, options.clone())?;
    let relay_options = RelayOptions::default()
        .with_bucket_count(buckets)
        .with_batch_size(batch_size)
        .with_relay_id("bench-steady");
    let poll = relay_options.poll_interval;
    let relay = Relay::new(store, publisher, relay_options)?.with_metrics(hook.clone());
    // After the last message, a poll interval and a moment more: every bucket fetches once
    // more after its last batch and finds nothing, at once when that batch was full (more
    // may wait), at its next look otherwise (a look after a batch that removed messages is
    // a fetch, not a probe); the model counts that fetch.
    let published = hook.wait_published(seeded.total());
    let after = poll + Duration::from_millis(1500);
    let signal = async move {
        published.await;
        tokio::time::sleep(after).await;
    };
    let bounded = tokio::time::timeout(
        Duration::from_secs(600),
        relay.run_until_shutdown(signal, Duration::from_secs(15)),
    );
    let report = bounded
        .await
        .map_err(|_| "steady drain took over 10 minutes")??;
    let counts = classifier.snapshot();
    support::drop_table(&plain, &options).await;
    let b = batch_size as u64;
    let expected_fetches = seeded.per_bucket.values().map(|n| n.div_ceil(b) + 1).sum();
    let expected_deletes = seeded
        .per_bucket
        .values()
        .map(|n| (n / b) * b.div_ceil(25) + (n % b).div_ceil(25))
        .sum();
    Ok(SteadyDrain {
        messages: hook.published(),
        gaps: seeded.gaps,
        counts,
        expected_fetches,
        expected_deletes,
        report,
    })
}

/// Requests of enqueues, measured and expected.
#[derive(Debug, Clone)]
pub struct EnqueueCost {
    /// Messages per call.
    pub batch: usize,
    /// Calls.
    pub calls: u64,
    /// Requests by purpose.
    pub counts: Counts,
    /// Distinct buckets summed over the calls (the expected reservations).
    pub distinct_buckets: u64,
}

impl EnqueueCost {
    /// Prints the figures.
    pub fn print(&self) {
        let c = &self.counts;
        println!(
            "enqueue of {} message(s) x {} calls: reserve (UpdateItem) {} (expected {}: one per distinct bucket, ratio {}), transact-write {} (expected {}, ratio {}), other {}",
            self.batch,
            self.calls,
            c.get(Class::Reserve),
            self.distinct_buckets,
            support::ratio(c.get(Class::Reserve) as f64, self.distinct_buckets as f64),
            c.get(Class::Transact),
            self.calls,
            support::ratio(c.get(Class::Transact) as f64, self.calls as f64),
            c.total() - c.get(Class::Reserve) - c.get(Class::Transact),
        );
    }
}

/// `calls` sequential enqueues of `batch` messages (random keys) on a fresh table.
pub async fn enqueue_cost(batch: usize, calls: u64) -> Result<EnqueueCost> {
    let config = support::sdk_config().await?;
    let plain = support::client(&config, None);
    let options = support::fresh_table(&plain, 8, 8).await?;
    let classifier = Classifier::default();
    let writer =
        DynamoDbOutboxWriter::new(support::client(&config, Some(&classifier)), options.clone())?;
    let mut distinct = 0u64;
    for call in 0..calls {
        let messages: Vec<_> = (0..batch)
            .map(|i| {
                writer
                    .message("bench")
                    .with_key(format!("k{call}-{i}"))
                    .with_value(support::payload(1024, i as u64))
            })
            .collect();
        distinct += messages
            .iter()
            .map(|m| m.bucket())
            .collect::<BTreeSet<_>>()
            .len() as u64;
        writer.enqueue(&messages).await?;
    }
    let counts = classifier.snapshot();
    support::drop_table(&plain, &options).await;
    Ok(EnqueueCost {
        batch,
        calls,
        counts,
        distinct_buckets: distinct,
    })
}

/// An idle relay's requests, against the specification's formula.
#[derive(Debug, Clone)]
pub struct Idle {
    /// Buckets (all owned by the one relay).
    pub buckets: u32,
    /// The relay's options.
    pub options: RelayOptions,
    /// Working window: the run minus the stop reserve.
    pub window: Duration,
    /// Requests by purpose over the whole run (the stop included).
    pub counts: Counts,
    /// The relay's report.
    pub report: RunReport,
    /// Counts at the end of each round.
    pub per_round: Vec<Counts>,
}

impl Idle {
    /// Rounds run.
    pub fn rounds(&self) -> u64 {
        self.report.rounds
    }

    /// Requests the specification's model names, over the working window (the stop's
    /// requests and the backlog sample left out; the first pass's fetches count as probes,
    /// the first round's claims as the per-bucket writes).
    pub fn measured_model(&self) -> u64 {
        let c = &self.counts;
        c.get(Class::Probe)
            + c.get(Class::Fetch)
            + self.rounds()
            + c.get(Class::Heartbeat)
            + c.get(Class::Renew)
            + c.get(Class::Claim)
    }

    /// The formula: per owned bucket one probe per poll interval; per renew interval one
    /// coordination query, one heartbeat and one write per owned bucket.
    pub fn formula(&self) -> f64 {
        let w = self.window.as_secs_f64();
        let owned = self.buckets as f64;
        owned * w / self.options.poll_interval.as_secs_f64()
            + (w / self.options.lease_renew_interval.as_secs_f64()) * (2.0 + owned)
    }

    /// Prints the figures.
    pub fn print(&self) {
        let c = &self.counts;
        let r = self.rounds();
        let b = self.buckets as u64;
        println!(
            "idle relay: {} buckets, {:.0} s (working window {:.1} s), poll {:?}, renew {:?}: {} rounds, refused writes {} (4xx answers {})",
            self.buckets,
            self.window.as_secs_f64() + 2.0,
            self.window.as_secs_f64(),
            self.options.poll_interval,
            self.options.lease_renew_interval,
            r,
            self.report.refused_total(),
            c.client_errors()
        );
        println!("  requests: {}", c.line());
        println!(
            "  per round: heartbeat {} (expected {r}), coordination queries {} (expected {r} + the stop's re-read), renew+claim {} (expected {}), stop: stamp {}, releases {} (expected {b})",
            c.get(Class::Heartbeat),
            c.get(Class::Coordination),
            c.get(Class::Renew) + c.get(Class::Claim),
            b * r,
            c.get(Class::StopStamp),
            c.get(Class::Release),
        );
        let probes = c.get(Class::Probe) + c.get(Class::Fetch);
        let probe_formula = self.buckets as f64 * self.window.as_secs_f64()
            / self.options.poll_interval.as_secs_f64();
        println!(
            "  probes (first pass fetches included) {probes} vs formula {probe_formula:.0}: ratio {}",
            support::ratio(probes as f64, probe_formula)
        );
        let sample = c.get(Class::BacklogCount) + c.get(Class::BacklogHead);
        println!(
            "  measured / formula: {} / {:.0} = {} (backlog sample on top, not in the spec's model: {} queries = {} per round; {} with it)",
            self.measured_model(),
            self.formula(),
            support::ratio(self.measured_model() as f64, self.formula()),
            sample,
            support::ratio(sample as f64, r as f64),
            support::ratio((self.measured_model() + sample) as f64, self.formula()),
        );
    }
}

/// One relay owning every one of `buckets` buckets, idle for `duration` (`run_until`).
pub async fn idle(buckets: u32, duration: Duration, options: RelayOptions) -> Result<Idle> {
    let config = support::sdk_config().await?;
    let plain = support::client(&config, None);
    let table = support::fresh_table(&plain, buckets, 8).await?;
    let publisher = support::publisher().await?;
    let classifier = Classifier::default();
    let client = support::client(&config, Some(&classifier));
    let hook = Hook::new(Some(classifier.clone()));
    let store = DynamoDbOutboxStore::new(client, table.clone())?;
    let options = options.with_bucket_count(buckets);
    let reserve = dynamo_outbox::relay::DEFAULT_STOP_RESERVE;
    let relay = Relay::new(store, publisher, options.clone())?.with_metrics(hook.clone());
    let started = Instant::now();
    let report = relay.run_until(started + duration).await?;
    let counts = classifier.snapshot();
    support::drop_table(&plain, &table).await;
    let mut per_round = Vec::new();
    let mut before = Counts::default();
    for round in hook.rounds() {
        let now = round.counts.unwrap_or_default();
        per_round.push(now.since(&before));
        before = now;
    }
    Ok(Idle {
        buckets,
        options,
        window: duration.saturating_sub(reserve),
        counts,
        report,
        per_round,
    })
}

/// The accounting benchmark.
pub async fn run(messages: u64, idle_secs: u64) -> Result<()> {
    println!("== request accounting");
    let steady = steady_drain(messages, 8, 500, None).await?;
    steady.print();
    let gappy = steady_drain((messages / 5).max(2_000), 8, 500, Some(100)).await?;
    gappy.print();
    let calls = (messages / 100).clamp(10, 200);
    enqueue_cost(1, calls).await?.print();
    enqueue_cost(100, (calls / 5).max(4)).await?.print();
    let idle = idle(
        8,
        Duration::from_secs(idle_secs),
        RelayOptions::default().with_relay_id("bench-idle"),
    )
    .await?;
    idle.print();
    Ok(())
}
