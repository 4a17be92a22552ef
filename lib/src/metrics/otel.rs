//! OpenTelemetry: the relay's measurements as the instruments of the reference
//! implementation's `Dekaf.Outbox` meter, so that a fleet mixing this relay and the .NET
//! one shares dashboards and alerts (feature `otel`).
//!
//! [`OtelMetrics`] implements [`RelayMetrics`] on any [`Meter`]: the process that runs the
//! relay owns the meter provider and its exporter (`outboxctl relay` exports over
//! OTLP/HTTP). Every measurement carries one attribute, `outbox.name`
//! ([`RelayOptions::metrics_name`](crate::RelayOptions::metrics_name), `OUTBOX_METRICS_NAME`,
//! default `outbox`): the same name for every relay of one outbox, another for another
//! outbox; relay ids belong in the resource (`service.instance.id`), not in attributes.
//! One exception names what an operator must fix: a failed publish the brokers refused
//! for authorization (retried, never poison) also carries `error.type` (the broker's error
//! code, `TOPIC_AUTHORIZATION_FAILED`), `messaging.destination.name` (the topic) and
//! `outbox.kafka.principal` (who the relay authenticates as).
//!
//! | Instrument | Kind, unit | Value |
//! |---|---|---|
//! | `dekaf.outbox.publish.acknowledged` | counter, `{message}` | messages the broker acknowledged and the relay deleted |
//! | `dekaf.outbox.publish.failures` | counter, `{attempt}` | failed batches (a publish, or the delete after it) |
//! | `dekaf.outbox.lease.expirations` | counter, `{event}` | leases lost: a refused renewal, a lease a peer holds now (one per bucket) |
//! | `dekaf.outbox.poison.quarantined` | counter, `{message}` | this project: poison items the relay moved to the dead-letter partition (`OUTBOX_POISON_POLICY=quarantine-after=N`) |
//! | `dekaf.outbox.publish.duration` | histogram, `s` | one batch of a bucket: fetch, publish, delete |
//! | `dekaf.outbox.cycle.duration` | histogram, `s` | one acquisition round: heartbeat, read, plan, renew, release, claim |
//! | `dekaf.outbox.owned_buckets` | gauge, `{bucket}` | buckets this relay publishes (its ownership changes, reported after each round; 0 once it stopped) |
//! | `dekaf.outbox.pending.messages` | gauge, `{message}` | the whole table's backlog from the latest sample |
//! | `dekaf.outbox.pending.oldest_age` | gauge, `s` | age of the oldest pending message: the sampled age plus the time since the sample; 0 with an empty backlog |
//! | `dekaf.outbox.pending.available` | gauge, `1` | 1 while this relay has a backlog sample, else 0 |
//! | `dekaf.outbox.commit_to_ack.duration` | histogram, `s` | this project's: per acknowledged message, from its enqueue timestamp (the writer's clock) to the acknowledgement (the relay's), [`LATENCY_BOUNDARIES`] |
//!
//! The backlog is sampled by the owner of bucket zero only (every 30 s, each bucket capped
//! at `OUTBOX_PENDING_COUNT_LIMIT`): the other relays of a fleet report
//! `pending.available` 0 and no `pending.messages` / `pending.oldest_age` point, and a
//! relay that stops owning bucket zero drops its sample. Aggregate the backlog across
//! replicas with `max`, never `sum`.
//!
//! Where this relay's figures differ from the reference's: `publish.acknowledged` counts
//! messages after their delete (the reference counts the acknowledged prefix before
//! it); `publish.duration` times a whole batch, not only the producer call;
//! `lease.expirations` counts lost leases, not lost lease sets; `publish.failures` also
//! counts a batch whose delete failed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::metrics::{Counter, Histogram, Meter, ObservableGauge};
use opentelemetry::KeyValue;

use super::RelayMetrics;
use crate::error::{Error, NotAuthorized, Result};

/// The reference implementation's meter name (its instrumentation scope).
pub const METER_NAME: &str = "Dekaf.Outbox";
/// The one attribute of every measurement.
pub const OUTBOX_NAME: &str = "outbox.name";
/// Messages acknowledged (and deleted), counter.
pub const ACKNOWLEDGED: &str = "dekaf.outbox.publish.acknowledged";
/// Failed batches, counter.
pub const FAILURES: &str = "dekaf.outbox.publish.failures";
/// Leases lost, counter.
pub const LEASE_EXPIRATIONS: &str = "dekaf.outbox.lease.expirations";
/// Poison items moved to the dead-letter partition, counter (this project's; the
/// reference relay has no poison policy).
pub const QUARANTINED: &str = "dekaf.outbox.poison.quarantined";
/// Batch durations, histogram in seconds.
pub const PUBLISH_DURATION: &str = "dekaf.outbox.publish.duration";
/// Acquisition round durations, histogram in seconds.
pub const CYCLE_DURATION: &str = "dekaf.outbox.cycle.duration";
/// Buckets owned, gauge.
pub const OWNED_BUCKETS: &str = "dekaf.outbox.owned_buckets";
/// The backlog, gauge.
pub const PENDING_MESSAGES: &str = "dekaf.outbox.pending.messages";
/// Age of the oldest pending message, gauge in seconds.
pub const PENDING_OLDEST_AGE: &str = "dekaf.outbox.pending.oldest_age";
/// Whether a backlog sample is available, gauge (0 or 1).
pub const PENDING_AVAILABLE: &str = "dekaf.outbox.pending.available";
/// Commit-to-ack latency per message, histogram in seconds (this project's instrument).
pub const COMMIT_TO_ACK: &str = "dekaf.outbox.commit_to_ack.duration";
/// The attribute of a refused authorization's failure: the broker's error code.
pub const ERROR_TYPE: &str = "error.type";
/// The attribute of a refused authorization's topic (OpenTelemetry's messaging name).
pub const DESTINATION: &str = "messaging.destination.name";
/// The attribute of a refused authorization's principal (this project's).
pub const PRINCIPAL: &str = "outbox.kafka.principal";
/// Every instrument's name: the reference's, [`QUARANTINED`] and [`COMMIT_TO_ACK`].
pub const INSTRUMENT_NAMES: [&str; 11] = [
    ACKNOWLEDGED,
    FAILURES,
    LEASE_EXPIRATIONS,
    QUARANTINED,
    PUBLISH_DURATION,
    CYCLE_DURATION,
    OWNED_BUCKETS,
    PENDING_MESSAGES,
    PENDING_OLDEST_AGE,
    PENDING_AVAILABLE,
    COMMIT_TO_ACK,
];
/// Histogram bucket boundaries in seconds (5 ms to 10 s): the SDK's default boundaries
/// are meant for milliseconds and would put every batch in the first two buckets.
pub const DURATION_BOUNDARIES: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Boundaries of the commit-to-ack histogram in seconds (5 ms to an hour): a message may
/// wait behind a backlog or an outage for much longer than a batch takes.
pub const LATENCY_BOUNDARIES: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0,
    3600.0,
];
/// Longest `outbox.name`, as in the reference.
pub const MAX_NAME_CHARS: usize = 64;

/// What the gauges report, updated by the relay and read at each collection.
#[derive(Debug, Default)]
struct Gauges {
    /// The buckets this relay publishes, from its ownership changes.
    owned: std::collections::BTreeSet<u32>,
    /// Latest sample per bucket: pending, head age, when it was taken.
    backlog: BTreeMap<u32, (u32, Option<Duration>, Instant)>,
}

impl Gauges {
    /// (pending, oldest age in seconds) of the latest sample at `now`, if there is one.
    fn backlog_at(&self, now: Instant) -> Option<(u64, f64)> {
        if self.backlog.is_empty() {
            return None;
        }
        let pending = self.backlog.values().map(|(p, _, _)| u64::from(*p)).sum();
        let oldest = self
            .backlog
            .values()
            .filter(|(p, _, _)| *p > 0)
            .filter_map(|(_, age, at)| age.map(|a| a + now.saturating_duration_since(*at)))
            .max()
            .unwrap_or_default();
        Some((pending, oldest.as_secs_f64()))
    }
}

/// The relay's measurements as OpenTelemetry instruments (see the [module](self) docs).
#[derive(Debug)]
pub struct OtelMetrics {
    attributes: [KeyValue; 1],
    acknowledged: Counter<u64>,
    failures: Counter<u64>,
    lease_expirations: Counter<u64>,
    quarantined: Counter<u64>,
    publish_duration: Histogram<f64>,
    cycle_duration: Histogram<f64>,
    commit_to_ack: Histogram<f64>,
    gauges: Arc<Mutex<Gauges>>,
    _observed: ObservedGauges,
}

/// The gauges' registrations (owned buckets, pending messages, oldest age, available):
/// kept so that their callbacks stay registered as long as the metrics live.
type ObservedGauges = (
    ObservableGauge<u64>,
    ObservableGauge<u64>,
    ObservableGauge<f64>,
    ObservableGauge<u64>,
);

fn lock(gauges: &Mutex<Gauges>) -> std::sync::MutexGuard<'_, Gauges> {
    // A panic elsewhere while holding the lock leaves values that are still valid.
    gauges.lock().unwrap_or_else(|e| e.into_inner())
}

impl OtelMetrics {
    /// The instruments on `meter` (get it from the provider as
    /// `provider.meter(METER_NAME)`), every measurement with `outbox.name` = `name`:
    /// 1 to [`MAX_NAME_CHARS`] characters, not blank.
    pub fn new(meter: &Meter, name: &str) -> Result<Self> {
        if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS {
            return Err(Error::option(
                crate::options::env::METRICS_NAME,
                format!("{name:?}: the outbox.name metric attribute takes 1 to {MAX_NAME_CHARS} characters, not blank"),
            ));
        }
        let attributes = [KeyValue::new(OUTBOX_NAME, name.to_string())];
        let gauges = Arc::new(Mutex::new(Gauges::default()));
        let observed = observe_gauges(meter, &gauges, &attributes);
        let histogram = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(DURATION_BOUNDARIES.to_vec())
                .build()
        };
        let metrics = OtelMetrics {
            acknowledged: meter
                .u64_counter(ACKNOWLEDGED)
                .with_unit("{message}")
                .with_description("Messages the broker acknowledged and the relay deleted.")
                .build(),
            failures: meter
                .u64_counter(FAILURES)
                .with_unit("{attempt}")
                .with_description("Failed batches: a publish, or the delete after it.")
                .build(),
            lease_expirations: meter
                .u64_counter(LEASE_EXPIRATIONS)
                .with_unit("{event}")
                .with_description(
                    "Leases this relay lost: a refused renewal, a lease a peer holds now.",
                )
                .build(),
            quarantined: meter
                .u64_counter(QUARANTINED)
                .with_unit("{message}")
                .with_description(
                    "Poison items this relay moved to the dead-letter partition (OUTBOX_POISON_POLICY).",
                )
                .build(),
            publish_duration: histogram(
                PUBLISH_DURATION,
                "One batch of a bucket: fetch, publish, delete.",
            ),
            cycle_duration: histogram(
                CYCLE_DURATION,
                "One acquisition round: heartbeat, read, plan, renew, release, claim.",
            ),
            commit_to_ack: meter
                .f64_histogram(COMMIT_TO_ACK)
                .with_unit("s")
                .with_description(
                    "Per acknowledged message: from its enqueue timestamp (the writer's clock) \
                     to the broker's acknowledgement (the relay's clock).",
                )
                .with_boundaries(LATENCY_BOUNDARIES.to_vec())
                .build(),
            attributes,
            gauges,
            _observed: observed,
        };
        // Every counter's series exists from the start at 0: a rate or an "increase > 0"
        // alert needs the zero, and a missing series then means a missing relay.
        for counter in [
            &metrics.acknowledged,
            &metrics.failures,
            &metrics.lease_expirations,
            &metrics.quarantined,
        ] {
            counter.add(0, &metrics.attributes);
        }
        Ok(metrics)
    }
}

/// Registers the gauges on `meter`: each reads `gauges` at collection time and reports
/// with `attributes`.
fn observe_gauges(
    meter: &Meter,
    gauges: &Arc<Mutex<Gauges>>,
    attributes: &[KeyValue; 1],
) -> ObservedGauges {
    let owned = {
        let (g, a) = (gauges.clone(), attributes.clone());
        meter
            .u64_observable_gauge(OWNED_BUCKETS)
            .with_unit("{bucket}")
            .with_description("Buckets this relay owns after its last acquisition round.")
            .with_callback(move |o| o.observe(lock(&g).owned.len() as u64, &a))
            .build()
    };
    let pending = {
        let (g, a) = (gauges.clone(), attributes.clone());
        meter
            .u64_observable_gauge(PENDING_MESSAGES)
            .with_unit("{message}")
            .with_description(
                "Pending messages of the whole table, from the latest backlog sample.",
            )
            .with_callback(move |o| {
                if let Some((p, _)) = lock(&g).backlog_at(Instant::now()) {
                    o.observe(p, &a);
                }
            })
            .build()
    };
    let oldest = {
        let (g, a) = (gauges.clone(), attributes.clone());
        meter
            .f64_observable_gauge(PENDING_OLDEST_AGE)
            .with_unit("s")
            .with_description("Age of the oldest pending message; 0 with an empty backlog.")
            .with_callback(move |o| {
                if let Some((_, age)) = lock(&g).backlog_at(Instant::now()) {
                    o.observe(age, &a);
                }
            })
            .build()
    };
    let available = {
        let (g, a) = (gauges.clone(), attributes.clone());
        meter
            .u64_observable_gauge(PENDING_AVAILABLE)
            .with_unit("1")
            .with_description(
                "1 while this relay has a backlog sample (it owns bucket zero), else 0.",
            )
            .with_callback(move |o| o.observe(u64::from(!lock(&g).backlog.is_empty()), &a))
            .build()
    };
    (owned, pending, oldest, available)
}

impl RelayMetrics for OtelMetrics {
    fn published(&self, _bucket: u32, count: u64) {
        if count > 0 {
            self.acknowledged.add(count, &self.attributes);
        }
    }

    fn publish_failed(&self, _bucket: u32, _permanent: bool) {
        self.failures.add(1, &self.attributes);
    }

    fn publish_not_authorized(&self, _bucket: u32, denied: &NotAuthorized) {
        let [name] = self.attributes.clone();
        self.failures.add(
            1,
            &[
                name,
                KeyValue::new(ERROR_TYPE, denied.failure.to_string()),
                KeyValue::new(DESTINATION, denied.topic.clone()),
                KeyValue::new(PRINCIPAL, denied.principal.clone()),
            ],
        );
    }

    fn leases_lost(&self, count: usize) {
        if count > 0 {
            self.lease_expirations.add(count as u64, &self.attributes);
        }
    }

    fn quarantined(&self, _bucket: u32) {
        self.quarantined.add(1, &self.attributes);
    }

    fn backlog(&self, bucket: u32, pending: u32, oldest_age: Option<Duration>) {
        lock(&self.gauges)
            .backlog
            .insert(bucket, (pending, oldest_age, Instant::now()));
    }

    fn ownership(&self, bucket: u32, owned: bool) {
        let mut g = lock(&self.gauges);
        if owned {
            g.owned.insert(bucket);
        } else {
            g.owned.remove(&bucket);
            // Only the owner of bucket zero samples: without it, the sample goes stale.
            if bucket == 0 {
                g.backlog.clear();
            }
        }
    }

    fn round_duration(&self, duration: Duration) {
        self.cycle_duration
            .record(duration.as_secs_f64(), &self.attributes);
    }

    fn batch_duration(&self, _bucket: u32, duration: Duration) {
        self.publish_duration
            .record(duration.as_secs_f64(), &self.attributes);
    }

    fn commit_to_ack(&self, _bucket: u32, latency: Duration) {
        self.commit_to_ack
            .record(latency.as_secs_f64(), &self.attributes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The global meter, a no-op while no provider is installed: the constructor's checks
    /// and the gauges' state (cli/tests/otel.rs exports the instruments for real).
    fn noop_meter() -> Meter {
        opentelemetry::global::meter(METER_NAME)
    }

    #[test]
    fn the_name_is_checked_like_the_reference_checks_it() {
        let m = noop_meter();
        assert!(OtelMetrics::new(&m, "orders").is_ok());
        assert!(OtelMetrics::new(&m, &"x".repeat(64)).is_ok());
        for bad in ["", "   ", &"x".repeat(65)] {
            let e = OtelMetrics::new(&m, bad).unwrap_err().to_string();
            assert!(e.contains("OUTBOX_METRICS_NAME"), "{e}");
        }
    }

    #[test]
    fn backlog_sums_the_buckets_ages_the_oldest_and_drops_with_bucket_zero() {
        let metrics = OtelMetrics::new(&noop_meter(), "orders").unwrap();
        let t0 = Instant::now();
        assert_eq!(lock(&metrics.gauges).backlog_at(t0), None);
        metrics.backlog(0, 0, None);
        assert_eq!(
            lock(&metrics.gauges).backlog_at(t0),
            Some((0, 0.0)),
            "an empty backlog is a value"
        );
        metrics.backlog(1, 4, Some(Duration::from_secs(7)));
        metrics.backlog(2, 2, Some(Duration::from_secs(3)));
        metrics.backlog(3, 0, Some(Duration::from_secs(99))); // empty: no head
        let (pending, age) = lock(&metrics.gauges)
            .backlog_at(Instant::now() + Duration::from_secs(5))
            .unwrap();
        assert_eq!(pending, 6);
        assert!(
            (12.0..12.5).contains(&age),
            "7 s at the sample, 5 s since: {age}"
        );
        metrics.ownership(3, false);
        assert!(lock(&metrics.gauges).backlog_at(t0).is_some());
        metrics.ownership(0, false);
        assert_eq!(lock(&metrics.gauges).backlog_at(t0), None);
    }
}
