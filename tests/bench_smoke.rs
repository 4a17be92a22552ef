//! The benchmarks' smoke run (`outbox-bench`, small sizes): the request-count goals of the
//! cost model, checked exactly by purpose (the benchmark's classifying interceptor), with
//! no timing threshold. Complements `accounting.rs`, which counts by operation.

use std::time::Duration;

use dynamo_outbox::RelayOptions;
use outbox_bench::accounting;
use outbox_bench::classify::Class;

/// One scenario at a time: a drain's seeding next to the idle relay slows its rounds.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn fast_idle_options() -> RelayOptions {
    RelayOptions::default()
        .with_relay_id("bench-smoke-idle")
        .with_poll_interval(Duration::from_millis(250))
        .with_lease_renew_interval(Duration::from_secs(3))
        .with_lease_duration(Duration::from_secs(9))
}

/// An idle relay owning every bucket: per round one heartbeat, one coordination query and
/// one write per owned bucket; at most one probe per owned bucket per poll interval; the
/// stop stamps once and releases each bucket once; nothing refused.
#[tokio::test]
async fn an_idle_relay_costs_what_the_formula_says_per_round() {
    let _serial = SERIAL.lock().await;
    let buckets = 4;
    let idle = accounting::idle(buckets, Duration::from_secs(10), fast_idle_options())
        .await
        .expect("idle run");
    let c = &idle.counts;
    let r = idle.rounds();
    let b = u64::from(buckets);
    let ctx = format!("rounds {r}, counts {}", c.line());
    assert!(r >= 2, "{ctx}");
    assert_eq!(idle.report.errors, 0, "{ctx}");
    assert_eq!(idle.report.refused_total(), 0, "{ctx}");
    assert_eq!(c.client_errors() + c.server_errors(), 0, "{ctx}");
    assert!(idle.report.released, "{ctx}");
    // the rounds
    assert_eq!(c.get(Class::Heartbeat), r, "{ctx}");
    assert_eq!(c.get(Class::Claim), b, "{ctx}");
    assert_eq!(c.get(Class::Renew), b * (r - 1), "{ctx}");
    // one coordination query per round, and the stop's one re-read
    assert_eq!(c.get(Class::Coordination), r + 1, "{ctx}");
    // the stop
    assert_eq!(c.get(Class::StopStamp), 1, "{ctx}");
    assert_eq!(c.get(Class::Release), b, "{ctx}");
    assert_eq!(c.get(Class::Cleanup), 0, "{ctx}");
    // the messages: one first-pass fetch per bucket, then probes only; no gap probe, no delete
    assert_eq!(c.get(Class::Fetch), b, "{ctx}");
    assert_eq!(c.get(Class::GapProbe) + c.get(Class::Delete), 0, "{ctx}");
    let polls = idle.window.as_millis() / idle.options.poll_interval.as_millis();
    assert!(
        u128::from(c.get(Class::Probe)) <= u128::from(b) * polls,
        "at most one probe per bucket per poll interval: {ctx}"
    );
    // each round after the first: exactly the formula's lease requests
    for (i, round) in idle.per_round.iter().enumerate().skip(1) {
        assert_eq!(
            round.get(Class::Heartbeat),
            1,
            "round {i}: {}",
            round.line()
        );
        assert_eq!(
            round.get(Class::Coordination),
            1,
            "round {i}: {}",
            round.line()
        );
        assert_eq!(round.get(Class::Renew), b, "round {i}: {}", round.line());
        assert_eq!(round.get(Class::Claim), 0, "round {i}: {}", round.line());
    }
    // The backlog sample (the owner of bucket 0; not in the spec's model): a count and a
    // head query per bucket per round, unless a slow round cut it short.
    assert!(
        c.get(Class::BacklogCount) <= b * r && c.get(Class::BacklogHead) <= b * r,
        "{ctx}"
    );
}

/// A steady drain: one fetch per batch and one more per bucket after its last (which
/// finds nothing), one `BatchWriteItem` per 25 deletes, one gap probe
/// per real gap (a reserved number whose transaction never committed), nothing refused.
#[tokio::test]
async fn a_drain_costs_one_fetch_per_batch_one_delete_per_25_and_one_probe_per_gap() {
    let _serial = SERIAL.lock().await;
    let drained = accounting::steady_drain(1_200, 4, 100, Some(40))
        .await
        .expect("steady drain");
    let c = &drained.counts;
    let ctx = format!("{} gaps, counts {}", drained.gaps, c.line());
    assert_eq!(drained.messages, 1_200, "{ctx}");
    assert!(drained.gaps > 0, "{ctx}");
    assert_eq!(c.get(Class::Fetch), drained.expected_fetches, "{ctx}");
    assert_eq!(c.get(Class::Delete), drained.expected_deletes, "{ctx}");
    assert_eq!(c.get(Class::GapProbe), drained.gaps, "{ctx}");
    assert_eq!(drained.report.refused_total(), 0, "{ctx}");
    assert_eq!(c.client_errors() + c.server_errors(), 0, "{ctx}");
}
