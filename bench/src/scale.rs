//! Scale: one relay's acquisition rounds with 8 to 1024 buckets and max concurrency 8 and
//! 64; then 1 to 16 relays sharing 64 buckets. Round time and requests per round.

use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::{DynamoDbOutboxStore, Relay, RelayOptions, RunReport};
use tokio::time::Instant;

use crate::classify::{Class, Classifier, Counts};
use crate::support::{self, Hook, Result};

const ACQUISITION: [Class; 8] = [
    Class::Coordination,
    Class::Heartbeat,
    Class::Renew,
    Class::Claim,
    Class::Release,
    Class::Cleanup,
    Class::BacklogCount,
    Class::BacklogHead,
];

fn acquisition_line(c: &Counts) -> String {
    ACQUISITION
        .iter()
        .filter(|k| c.get(**k) > 0)
        .map(|k| format!("{k}={}", c.get(*k)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn lease_requests(c: &Counts) -> u64 {
    ACQUISITION[..6].iter().map(|k| c.get(*k)).sum()
}

fn sample_requests(c: &Counts) -> u64 {
    c.get(Class::BacklogCount) + c.get(Class::BacklogHead)
}

/// Relay options of the scale runs: short intervals so that a run takes seconds.
fn options(id: &str, buckets: u32, renew: Duration) -> RelayOptions {
    RelayOptions::default()
        .with_bucket_count(buckets)
        .with_relay_id(id)
        .with_lease_renew_interval(renew)
        .with_lease_duration(renew * 3)
        .with_poll_interval(Duration::from_secs(1))
}

struct Fleet {
    reports: Vec<RunReport>,
    hooks: Vec<Arc<Hook>>,
    classifiers: Vec<Classifier>,
}

/// Runs `relays` relays on a fresh table of `buckets` until each ran `rounds` rounds.
async fn fleet(
    buckets: u32,
    concurrency: usize,
    relays: usize,
    rounds: usize,
    renew: Duration,
) -> Result<Fleet> {
    let config = support::sdk_config().await?;
    let plain = support::client(&config, None);
    let table = support::fresh_table(&plain, buckets, concurrency).await?;
    let publisher = support::publisher().await?;
    let mut handles = Vec::new();
    let mut hooks = Vec::new();
    let mut classifiers = Vec::new();
    for i in 0..relays {
        let classifier = Classifier::default();
        let client = support::client(&config, Some(&classifier));
        let hook = Hook::new(Some(classifier.clone()));
        let store = DynamoDbOutboxStore::new(client, table.clone())?;
        let relay = Relay::new(
            store,
            publisher.clone(),
            options(&format!("bench-scale-{i:02}"), buckets, renew),
        )?
        .with_metrics(hook.clone());
        let signal = hook.wait_rounds(rounds);
        handles.push(tokio::spawn(async move {
            relay.run_until_shutdown(signal, renew * 2).await
        }));
        hooks.push(hook);
        classifiers.push(classifier);
    }
    let mut reports = Vec::new();
    let bound = Instant::now() + renew * (rounds as u32 * 3 + 10) + Duration::from_secs(30);
    for h in handles {
        let r = tokio::time::timeout_at(bound, h)
            .await
            .map_err(|_| "a scale run did not end in time")???;
        reports.push(r);
    }
    support::drop_table(&plain, &table).await;
    Ok(Fleet {
        reports,
        hooks,
        classifiers,
    })
}

/// Per-round deltas of one relay's counts.
fn round_deltas(hook: &Hook) -> Vec<(Duration, Counts)> {
    let mut before = Counts::default();
    hook.rounds()
        .into_iter()
        .map(|r| {
            let now = r.counts.unwrap_or_default();
            let d = now.since(&before);
            before = now;
            (r.duration, d)
        })
        .collect()
}

/// One relay, `buckets` buckets: its first (claiming) and second (renewing) round.
pub async fn one_relay(buckets: u32, concurrency: usize) -> Result<()> {
    let renew = Duration::from_secs(4);
    let f = fleet(buckets, concurrency, 1, 2, renew).await?;
    let rounds = round_deltas(&f.hooks[0]);
    let report = &f.reports[0];
    for (i, (took, c)) in rounds.iter().enumerate() {
        println!(
            "buckets {buckets:>4}, concurrency {concurrency:>2}, round {}: {:>7} ms, lease requests {:>5}, backlog sample {} ({}; the sample is bounded by renew/2 = {:?}); refused {}",
            i + 1,
            support::ms(*took),
            lease_requests(c),
            sample_requests(c),
            acquisition_line(c),
            renew / 2,
            report.refused_total(),
        );
    }
    let _ = &f.classifiers;
    Ok(())
}

/// `relays` relays on 64 buckets: steady rounds (after convergence).
pub async fn relays_on_64(relays: usize, rounds: usize) -> Result<()> {
    let renew = Duration::from_secs(2);
    let f = fleet(64, 8, relays, rounds, renew).await?;
    let mut steady_time = Vec::new();
    let mut lease = 0u64;
    let mut sample = 0u64;
    let mut steady_rounds = 0u64;
    let skip = rounds.saturating_sub(2).max(1);
    for hook in &f.hooks {
        for (took, c) in round_deltas(hook).into_iter().skip(skip) {
            steady_time.push(took);
            lease += lease_requests(&c);
            sample += sample_requests(&c);
            steady_rounds += 1;
        }
    }
    let owned: Vec<usize> = f.reports.iter().map(|r| r.owned_at_end).collect();
    let refused: u64 = f.reports.iter().map(RunReport::refused_total).sum();
    let mut by_kind = std::collections::BTreeMap::new();
    for r in &f.reports {
        for (k, v) in &r.refused {
            *by_kind.entry(*k).or_insert(0u64) += v;
        }
    }
    by_kind.retain(|_, v| *v > 0);
    let total_lease: u64 = f
        .classifiers
        .iter()
        .map(|c| lease_requests(&c.snapshot()))
        .sum();
    let per_round = lease as f64 / (steady_rounds as f64 / relays as f64).max(1.0);
    println!(
        "{relays:>2} relays on 64 buckets: owned at end {:?}; steady round p50 {} ms, max {} ms; lease requests per fleet round {:.1} (formula 2 x relays + 64 = {}); backlog sample per fleet round {:.1}; refused writes {refused} {by_kind:?}; lease requests over the run {total_lease}",
        owned,
        support::ms(support::quantile(&mut steady_time.clone(), 0.5)),
        support::ms(support::quantile(&mut steady_time, 1.0)),
        per_round,
        2 * relays + 64,
        sample as f64 / (steady_rounds as f64 / relays as f64).max(1.0),
    );
    Ok(())
}

/// The scale benchmark.
pub async fn run(bucket_counts: &[u32], concurrencies: &[usize], fleets: &[usize]) -> Result<()> {
    println!("== scale: acquisition rounds (renew 4 s, lease 12 s, poll 1 s)");
    for &b in bucket_counts {
        for &c in concurrencies {
            if let Err(e) = one_relay(b, c).await {
                println!("buckets {b:>4}, concurrency {c:>2}: FAILED: {e}");
            }
        }
    }
    println!("== scale: relays sharing 64 buckets (renew 2 s, lease 6 s, poll 1 s, concurrency 8)");
    for &n in fleets {
        if let Err(e) = relays_on_64(n, 6).await {
            println!("{n:>2} relays on 64 buckets: FAILED: {e}");
        }
    }
    Ok(())
}
