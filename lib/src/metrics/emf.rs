//! CloudWatch Embedded Metric Format (EMF): the relay's measurements as JSON log lines
//! that CloudWatch Logs turns into metrics, with no API call and no agent.
//!
//! [`EmfMetrics`] implements [`RelayMetrics`] by aggregating in memory; [`EmfMetrics::flush`]
//! renders what was aggregated since the previous flush as one or more EMF documents and
//! starts over. Print each document as one line on stdout (the Lambda runtime ships stdout
//! to CloudWatch Logs): [`EmfMetrics::flush_to`] does that.
//!
//! Hand-written on purpose: the `metrics`-facade crates (and their EMF exporters) install
//! one process-wide recorder, which would fight the per-relay [`RelayMetrics`] seam (each
//! relay, and each Lambda invocation, flushes its own aggregate; tests run several relays
//! in one process), and the format is small: JSON documents of a fixed shape.
//!
//! Every document has the namespace (`POWERTOOLS_METRICS_NAMESPACE`, default `Outbox`) and
//! one dimension set: `service` (`POWERTOOLS_SERVICE_NAME`, default `outbox-relay`), `table`
//! and any added with [`EmfMetrics::with_dimension`]. The metrics:
//!
//! | Metric | Unit | Value per flush |
//! |---|---|---|
//! | `Published` | Count | messages published and deleted |
//! | `PublishFailures` | Count | failed publishes (transient and permanent) |
//! | `PublishRejected` | Count | records the broker refused for good (part of `PublishFailures`) |
//! | `PublishNotAuthorized` | Count | publishes the brokers refused the relay's principal (part of `PublishFailures`; retried, never poison); the document names each refusal in its `NotAuthorized` member |
//! | `RefusedWrites` | Count | refused conditional writes, all kinds |
//! | `RefusedWrites.<kind>` | Count | per kind: `heartbeat`, `renew`, `release`, `claim`, `cleanup`, `delete` (exactly-once) |
//! | `LeasesAcquired` / `LeasesLost` | Count | leases claimed / lost |
//! | `OwnedBuckets` | Count | buckets owned after the last acquisition (once one happened) |
//! | `PendingMessages` | Count | sum over the sampled buckets (only the owner of bucket zero samples) |
//! | `OldestPendingAge` | Seconds | the oldest head message seen since the last flush: of every batch's fetch (each owned bucket with messages, every round) and of the backlog samples |
//! | `PoisonItems` | Count | times a bucket was found stuck on an unreadable item |
//! | `QuarantinedItems` | Count | poison items the relay moved to the dead-letter partition (`OUTBOX_POISON_POLICY=quarantine-after=N`) |
//! | `SuccessorFailures` | Count | runs that ended with work left and could not start their successor |
//! | `BatchDuration` / `RoundDuration` | Milliseconds | one value per batch / acquisition round |
//! | `CommitToAckLatency` | Milliseconds | one value per message the broker acknowledged: from its enqueue timestamp (`CreatedAtUtc`, the writer's clock) to the acknowledgement (the relay's clock; zero when the writer's is ahead) |
//! | `ColdStart` | Count | 1 in the first flush after [`EmfMetrics::cold_start`] |
//!
//! The document that carries `PublishNotAuthorized` also carries `NotAuthorized` (no
//! metric, a member of the log event: CloudWatch Logs Insights reads it): one object per
//! refusal since the last flush, `{"Failure", "Topic", "Principal", "Operation", "Count"}`,
//! so that the refused topic and principal are named without a metric per topic.
//!
//! A flush reports only what carries information: CloudWatch bills every metric that
//! received a data point in an hour, so an idle outbox (its relays woken every few minutes
//! by the schedule) would pay for every metric an idle run reported. A counter is emitted
//! only when it is not zero (for a `Sum` a missing data point means zero; alarms on
//! counters treat missing data as not breaching). A flush in which nothing was published,
//! acknowledged, failed, refused, lost, parked, quarantined or found pending, and no batch
//! ran (no pending message in a backlog sample, no fetched head) is idle and renders no
//! document at all: the leases an
//! idle run claims, its rounds, its buckets, its empty backlog and its cold start are not
//! reported, so an idle outbox publishes no metric. Otherwise the gauges (`OwnedBuckets`,
//! `PendingMessages`, `OldestPendingAge`) are emitted whenever they were measured, zero
//! included (a backlog that drained to zero is a value), with the durations and
//! `LeasesAcquired` and `ColdStart`. The specification's limits are kept: at most [`MAX_METRICS_PER_DOCUMENT`]
//! metrics per document, [`MAX_DIMENSIONS`] dimensions per set, and
//! [`MAX_VALUES_PER_METRIC`] values per metric (more duration values go to further
//! documents; past [`MAX_SAMPLES`] per flush a uniform sample of them is kept, past
//! [`MAX_LATENCY_SAMPLES`] for `CommitToAckLatency`).
//!
//! `CommitToAckLatency` is a distribution the way the specification allows one: an array
//! of values, each one sample, so CloudWatch's percentiles (`p50`, `p99`) and
//! `SampleCount` apply; its sample count per flush is the number of acknowledged messages
//! (up to [`MAX_LATENCY_SAMPLES`]). A `Values`/`Counts` object (PutMetricData's histogram
//! form) is not among the specification's target members (a number or an array of
//! numbers), and the project's EMF model (`scripts/alarms.py`) rejects a document with
//! one whole, so it is not used.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::RelayMetrics;
use crate::error::{Error, NotAuthorized, Result};
use crate::protocol::store::WriteKind;

/// The environment variable naming the namespace (as in Powertools for AWS Lambda).
pub const NAMESPACE_ENV: &str = "POWERTOOLS_METRICS_NAMESPACE";
/// The environment variable naming the `service` dimension (as in Powertools).
pub const SERVICE_ENV: &str = "POWERTOOLS_SERVICE_NAME";
/// The namespace when [`NAMESPACE_ENV`] is not set.
pub const DEFAULT_NAMESPACE: &str = "Outbox";
/// The `service` dimension when [`SERVICE_ENV`] is not set.
pub const DEFAULT_SERVICE: &str = "outbox-relay";
/// EMF: at most 100 metric definitions per directive.
pub const MAX_METRICS_PER_DOCUMENT: usize = 100;
/// EMF: at most 30 dimensions per dimension set.
pub const MAX_DIMENSIONS: usize = 30;
/// EMF: at most 100 values in one metric's array.
pub const MAX_VALUES_PER_METRIC: usize = 100;
/// Duration values kept per metric between two flushes (a uniform sample beyond).
pub const MAX_SAMPLES: usize = 1000;
/// `CommitToAckLatency` values kept between two flushes (a uniform sample beyond): one
/// per acknowledged message up to this many, at most a hundred documents per flush.
pub const MAX_LATENCY_SAMPLES: usize = 10_000;
/// Every metric name a flush may report: 17 names, plus `RefusedWrites.<kind>` for the
/// six kinds of [`WriteKind::ALL`], 23 metrics per dimension set at most.
pub const METRIC_NAMES: [&str; 17] = [
    "Published",
    "PublishFailures",
    "PublishRejected",
    "PublishNotAuthorized",
    "RefusedWrites",
    "LeasesAcquired",
    "LeasesLost",
    "PoisonItems",
    "QuarantinedItems",
    "SuccessorFailures",
    "OwnedBuckets",
    "PendingMessages",
    "OldestPendingAge",
    "BatchDuration",
    "RoundDuration",
    "CommitToAckLatency",
    "ColdStart",
];

/// The member of a document that names the refused authorizations (not a metric).
pub const NOT_AUTHORIZED_MEMBER: &str = "NotAuthorized";

/// A CloudWatch unit, as EMF spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// `Count`.
    Count,
    /// `Milliseconds`.
    Milliseconds,
    /// `Seconds`.
    Seconds,
}

impl Unit {
    /// The unit's name in an EMF document.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Milliseconds => "Milliseconds",
            Unit::Seconds => "Seconds",
        }
    }
}

#[derive(Debug, Default)]
struct State {
    published: u64,
    publish_failures: u64,
    publish_rejected: u64,
    /// Refused authorizations by failure, topic, principal and operation.
    not_authorized: BTreeMap<(String, String, String, &'static str), u64>,
    refused: BTreeMap<WriteKind, u64>,
    leases_acquired: u64,
    leases_lost: u64,
    owned_buckets: Option<usize>,
    /// Latest sample per bucket since the last flush: pending, head age.
    backlog: BTreeMap<u32, (u32, Option<Duration>)>,
    /// Oldest head age per bucket that a batch fetched since the last flush.
    head_ages: BTreeMap<u32, Duration>,
    poison_items: u64,
    quarantined_items: u64,
    successor_failures: u64,
    batch_ms: Samples,
    round_ms: Samples,
    commit_to_ack_ms: Samples,
    cold_start: bool,
}

/// Duration values with a bounded uniform sample (reservoir) past [`MAX_SAMPLES`].
#[derive(Debug, Default)]
struct Samples {
    values: Vec<f64>,
    seen: u64,
}

impl Samples {
    fn add(&mut self, v: f64) {
        self.add_within(v, MAX_SAMPLES);
    }

    /// Adds `v`, keeping at most `cap` values (a uniform sample of all seen).
    fn add_within(&mut self, v: f64, cap: usize) {
        self.seen += 1;
        if self.values.len() < cap {
            self.values.push(v);
        } else {
            let i = rand::random::<u64>() % self.seen;
            if let Some(slot) = self.values.get_mut(i as usize) {
                *slot = v;
            }
        }
    }
}

/// One metric of a document: name, unit, and its value(s).
#[derive(Debug, Clone, PartialEq)]
struct Metric {
    name: String,
    unit: Unit,
    values: Vec<f64>,
}

/// Aggregates the relay's measurements and renders them as EMF documents.
#[derive(Debug)]
pub struct EmfMetrics {
    namespace: String,
    dimensions: Vec<(String, String)>,
    state: Mutex<State>,
}

impl EmfMetrics {
    /// Metrics in `namespace` with the dimensions `service` and `table`.
    pub fn new(
        namespace: impl Into<String>,
        service: impl Into<String>,
        table: impl Into<String>,
    ) -> Self {
        EmfMetrics {
            namespace: namespace.into(),
            dimensions: vec![
                ("service".into(), service.into()),
                ("table".into(), table.into()),
            ],
            state: Mutex::new(State::default()),
        }
    }

    /// Metrics with the namespace and service from the environment ([`NAMESPACE_ENV`],
    /// [`SERVICE_ENV`]; empty counts as unset) and the `table` dimension.
    pub fn from_env(table: impl Into<String>) -> Self {
        Self::from_lookup(table, |name| std::env::var(name).ok())
    }

    /// As [`Self::from_env`], reading variables through `lookup`.
    pub fn from_lookup(table: impl Into<String>, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str, default: &str| {
            lookup(name)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        Self::new(
            get(NAMESPACE_ENV, DEFAULT_NAMESPACE),
            get(SERVICE_ENV, DEFAULT_SERVICE),
            table,
        )
    }

    /// Adds a dimension to every document (for example `function_name`). Fails past
    /// [`MAX_DIMENSIONS`], for a duplicate or empty name, and for a name a metric uses.
    pub fn with_dimension(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self> {
        let name = name.into();
        if self.dimensions.len() >= MAX_DIMENSIONS {
            return Err(Error::option(
                "dimensions",
                format!("EMF allows at most {MAX_DIMENSIONS} dimensions"),
            ));
        }
        if name.is_empty() || name == "_aws" || self.dimensions.iter().any(|(n, _)| *n == name) {
            return Err(Error::option(
                "dimensions",
                format!("{name:?} is empty, reserved or already a dimension"),
            ));
        }
        if METRIC_NAMES.contains(&name.as_str())
            || name.starts_with("RefusedWrites")
            || name == NOT_AUTHORIZED_MEMBER
        {
            return Err(Error::option(
                "dimensions",
                format!(
                    "{name:?} is the name of a metric or of the {NOT_AUTHORIZED_MEMBER} member"
                ),
            ));
        }
        self.dimensions.push((name, value.into()));
        Ok(self)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Marks this process's first invocation: the next flush carries `ColdStart` = 1.
    pub fn cold_start(&self) {
        self.lock().cold_start = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves counters that are still valid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renders what was aggregated since the previous flush as EMF documents (JSON text,
    /// one object each) stamped with the current time, and starts over.
    pub fn flush(&self) -> Vec<String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.flush_at(now)
    }

    /// As [`Self::flush`] with the timestamp `timestamp_ms` (milliseconds since the Unix epoch).
    pub fn flush_at(&self, timestamp_ms: u64) -> Vec<String> {
        let state = std::mem::take(&mut *self.lock());
        let refusals = Self::not_authorized_of(&state);
        let metrics = Self::metrics_of(state);
        self.render(&metrics, timestamp_ms, refusals)
    }

    /// The `NotAuthorized` member: one object per refused authorization (`None`: none).
    fn not_authorized_of(state: &State) -> Option<Value> {
        if state.not_authorized.is_empty() {
            return None;
        }
        Some(Value::Array(
            state
                .not_authorized
                .iter()
                .map(|((failure, topic, principal, operation), count)| {
                    json!({
                        "Failure": failure,
                        "Topic": topic,
                        "Principal": principal,
                        "Operation": operation,
                        "Count": count,
                    })
                })
                .collect(),
        ))
    }

    /// Flushes and writes each document as one line to `out` (stdout in a Lambda function).
    pub fn flush_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        for doc in self.flush() {
            writeln!(out, "{doc}")?;
        }
        out.flush()
    }

    /// Whether a flush of `state` tells anything about the outbox: something was
    /// published, acknowledged, failed, refused, lost, parked or quarantined, a batch ran,
    /// or a message was found pending (a fetched head, a backlog sample with messages).
    /// An idle run's leases, rounds, owned buckets, empty backlog and cold start do not
    /// count. A new counter of trouble belongs here too, or a flush that carries only it
    /// is dropped as idle.
    fn carries_information(state: &State) -> bool {
        state.published != 0
            || state.publish_failures != 0
            || state.publish_rejected != 0
            || !state.not_authorized.is_empty()
            || state.refused.values().any(|n| *n != 0)
            || state.leases_lost != 0
            || state.poison_items != 0
            || state.quarantined_items != 0
            || state.successor_failures != 0
            || !state.head_ages.is_empty()
            || state.backlog.values().any(|(pending, _)| *pending != 0)
            || !state.batch_ms.values.is_empty()
            || !state.commit_to_ack_ms.values.is_empty()
    }

    fn metrics_of(state: State) -> Vec<Metric> {
        if !Self::carries_information(&state) {
            return Vec::new();
        }
        let count = |name: &str, v: u64| Metric {
            name: name.to_string(),
            unit: Unit::Count,
            values: vec![v as f64],
        };
        let mut m = Vec::new();
        // Counters: only when not zero (a missing data point of a Sum is zero).
        let mut counter = |name: &str, v: u64| {
            if v != 0 {
                m.push(count(name, v));
            }
        };
        counter("Published", state.published);
        counter("PublishFailures", state.publish_failures);
        counter("PublishRejected", state.publish_rejected);
        counter("PublishNotAuthorized", state.not_authorized.values().sum());
        counter("RefusedWrites", state.refused.values().sum());
        for kind in WriteKind::ALL {
            counter(
                &format!("RefusedWrites.{}", kind.as_str()),
                state.refused.get(&kind).copied().unwrap_or(0),
            );
        }
        counter("LeasesAcquired", state.leases_acquired);
        counter("LeasesLost", state.leases_lost);
        counter("PoisonItems", state.poison_items);
        counter("QuarantinedItems", state.quarantined_items);
        counter("SuccessorFailures", state.successor_failures);
        // Gauges: whenever measured, zero included.
        if let Some(owned) = state.owned_buckets {
            m.push(count("OwnedBuckets", owned as u64));
        }
        if !state.backlog.is_empty() {
            let pending: u64 = state.backlog.values().map(|(p, _)| u64::from(*p)).sum();
            m.push(count("PendingMessages", pending));
        }
        if !state.backlog.is_empty() || !state.head_ages.is_empty() {
            let oldest = state
                .backlog
                .values()
                .filter_map(|(_, age)| *age)
                .chain(state.head_ages.values().copied())
                .max()
                .unwrap_or_default();
            m.push(Metric {
                name: "OldestPendingAge".into(),
                unit: Unit::Seconds,
                values: vec![oldest.as_secs_f64()],
            });
        }
        for (name, samples) in [
            ("BatchDuration", state.batch_ms),
            ("RoundDuration", state.round_ms),
            ("CommitToAckLatency", state.commit_to_ack_ms),
        ] {
            if !samples.values.is_empty() {
                m.push(Metric {
                    name: name.into(),
                    unit: Unit::Milliseconds,
                    values: samples.values,
                });
            }
        }
        if state.cold_start {
            m.push(count("ColdStart", 1));
        }
        m
    }

    /// Splits `metrics` into documents within the limits and renders them, the first with
    /// the `NotAuthorized` member `refusals`.
    fn render(
        &self,
        metrics: &[Metric],
        timestamp_ms: u64,
        mut refusals: Option<Value>,
    ) -> Vec<String> {
        // A metric with more than MAX_VALUES_PER_METRIC values continues in later documents.
        let mut pieces: Vec<Vec<(&Metric, &[f64])>> = Vec::new();
        for metric in metrics {
            for (i, chunk) in metric.values.chunks(MAX_VALUES_PER_METRIC).enumerate() {
                // Put the chunk in the i-th document that has room and no piece of this metric.
                let mut index = i;
                loop {
                    if index == pieces.len() {
                        pieces.push(Vec::new());
                    }
                    let doc = &pieces[index];
                    if doc.len() < MAX_METRICS_PER_DOCUMENT
                        && !doc.iter().any(|(m, _)| m.name == metric.name)
                    {
                        break;
                    }
                    index += 1;
                }
                pieces[index].push((metric, chunk));
            }
        }
        pieces
            .into_iter()
            .map(|doc| {
                self.document(&doc, timestamp_ms, refusals.take())
                    .to_string()
            })
            .collect()
    }

    fn document(
        &self,
        metrics: &[(&Metric, &[f64])],
        timestamp_ms: u64,
        refusals: Option<Value>,
    ) -> Value {
        let mut root = Map::new();
        let names: Vec<&str> = self.dimensions.iter().map(|(n, _)| n.as_str()).collect();
        let definitions: Vec<Value> = metrics
            .iter()
            .map(|(m, _)| json!({"Name": m.name, "Unit": m.unit.as_str()}))
            .collect();
        root.insert(
            "_aws".into(),
            json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [names],
                    "Metrics": definitions,
                }],
            }),
        );
        for (name, value) in &self.dimensions {
            root.insert(name.clone(), Value::String(value.clone()));
        }
        for (m, values) in metrics {
            let value = match values {
                [one] => number(*one),
                many => Value::Array(many.iter().map(|v| number(*v)).collect()),
            };
            root.insert(m.name.clone(), value);
        }
        if let Some(refusals) = refusals {
            root.insert(NOT_AUTHORIZED_MEMBER.into(), refusals);
        }
        Value::Object(root)
    }
}

fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::from(v as i64)
    } else {
        serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
    }
}

fn millis(d: Duration) -> f64 {
    // Microsecond precision is plenty for a duration metric.
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

impl RelayMetrics for EmfMetrics {
    fn published(&self, _bucket: u32, count: u64) {
        self.lock().published += count;
    }

    fn publish_failed(&self, _bucket: u32, permanent: bool) {
        let mut s = self.lock();
        s.publish_failures += 1;
        if permanent {
            s.publish_rejected += 1;
        }
    }

    fn publish_not_authorized(&self, _bucket: u32, denied: &NotAuthorized) {
        let mut s = self.lock();
        s.publish_failures += 1;
        let key = (
            denied.failure.to_string(),
            denied.topic.clone(),
            denied.principal.clone(),
            denied.operation,
        );
        *s.not_authorized.entry(key).or_default() += 1;
    }

    fn refused_write(&self, kind: WriteKind) {
        *self.lock().refused.entry(kind).or_default() += 1;
    }

    fn owned_buckets(&self, count: usize) {
        self.lock().owned_buckets = Some(count);
    }

    fn leases_acquired(&self, count: usize) {
        self.lock().leases_acquired += count as u64;
    }

    fn leases_lost(&self, count: usize) {
        self.lock().leases_lost += count as u64;
    }

    fn head_age(&self, bucket: u32, age: Duration) {
        let mut state = self.lock();
        let oldest = state.head_ages.entry(bucket).or_default();
        *oldest = (*oldest).max(age);
    }

    fn backlog(&self, bucket: u32, pending: u32, oldest_age: Option<Duration>) {
        self.lock().backlog.insert(bucket, (pending, oldest_age));
    }

    fn poison_item(&self, _bucket: u32) {
        self.lock().poison_items += 1;
    }

    fn quarantined(&self, _bucket: u32) {
        self.lock().quarantined_items += 1;
    }

    fn successor_failed(&self) {
        self.lock().successor_failures += 1;
    }

    fn round_duration(&self, duration: Duration) {
        self.lock().round_ms.add(millis(duration));
    }

    fn batch_duration(&self, _bucket: u32, duration: Duration) {
        self.lock().batch_ms.add(millis(duration));
    }

    fn commit_to_ack(&self, _bucket: u32, latency: Duration) {
        self.lock()
            .commit_to_ack_ms
            .add_within(millis(latency), MAX_LATENCY_SAMPLES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const UNITS: &[&str] = &[
        "Seconds",
        "Microseconds",
        "Milliseconds",
        "Bytes",
        "Kilobytes",
        "Megabytes",
        "Gigabytes",
        "Terabytes",
        "Bits",
        "Kilobits",
        "Megabits",
        "Gigabits",
        "Terabits",
        "Percent",
        "Count",
        "Bytes/Second",
        "Kilobytes/Second",
        "Megabytes/Second",
        "Gigabytes/Second",
        "Terabytes/Second",
        "Bits/Second",
        "Kilobits/Second",
        "Megabits/Second",
        "Gigabits/Second",
        "Terabits/Second",
        "Count/Second",
        "None",
    ];

    /// Checks one document against the EMF specification's structure and limits and
    /// returns its metric values by name.
    fn validate(doc: &str) -> BTreeMap<String, Value> {
        let root: Value = serde_json::from_str(doc).expect("a document is JSON");
        assert!(!doc.contains('\n'), "one line per document");
        assert!(doc.len() < 256 * 1024, "within a log event");
        let root = root.as_object().expect("root is an object");
        let aws = root["_aws"].as_object().expect("_aws is an object");
        let ts = aws["Timestamp"]
            .as_u64()
            .expect("Timestamp: ms since epoch");
        assert!(ts > 1_600_000_000_000, "{ts}");
        let directives = aws["CloudWatchMetrics"]
            .as_array()
            .expect("CloudWatchMetrics is an array");
        assert_eq!(directives.len(), 1);
        let mut values = BTreeMap::new();
        for d in directives {
            let d = d.as_object().unwrap();
            let ns = d["Namespace"].as_str().expect("Namespace string");
            assert!(!ns.is_empty() && ns.len() <= 255);
            let sets = d["Dimensions"].as_array().expect("Dimensions array");
            for set in sets {
                let set = set.as_array().expect("a dimension set is an array");
                assert!(set.len() <= MAX_DIMENSIONS, "at most 30 dimensions");
                for name in set {
                    let name = name.as_str().expect("dimension names are strings");
                    assert!(
                        root[name].is_string(),
                        "dimension {name} has a string value at the root"
                    );
                }
            }
            let metrics = d["Metrics"].as_array().expect("Metrics array");
            assert!(!metrics.is_empty());
            assert!(
                metrics.len() <= MAX_METRICS_PER_DOCUMENT,
                "at most 100 metrics"
            );
            let mut names = HashSet::new();
            for m in metrics {
                let m = m.as_object().unwrap();
                assert!(m
                    .keys()
                    .all(|k| k == "Name" || k == "Unit" || k == "StorageResolution"));
                let name = m["Name"].as_str().expect("Name string");
                assert!(!name.is_empty() && name.len() <= 255);
                assert!(names.insert(name.to_string()), "{name} defined once");
                let unit = m["Unit"].as_str().expect("Unit string");
                assert!(UNITS.contains(&unit), "{unit} is an EMF unit");
                let v = &root[name];
                match v {
                    Value::Number(_) => {}
                    Value::Array(a) => {
                        assert!(!a.is_empty() && a.len() <= MAX_VALUES_PER_METRIC);
                        assert!(a.iter().all(Value::is_number));
                    }
                    other => panic!("{name}: value {other} is not a number or array"),
                }
                values.insert(name.to_string(), v.clone());
            }
        }
        values
    }

    fn table_metrics() -> EmfMetrics {
        EmfMetrics::from_lookup("orders-outbox", |_| None)
    }

    #[test]
    fn renders_valid_documents_with_every_metric() {
        let m = table_metrics();
        m.cold_start();
        m.published(0, 5);
        m.published(3, 2);
        m.publish_failed(1, false);
        m.publish_failed(1, true);
        m.refused_write(WriteKind::Claim);
        m.refused_write(WriteKind::Claim);
        m.refused_write(WriteKind::Heartbeat);
        m.leases_acquired(4);
        m.leases_lost(1);
        m.owned_buckets(3);
        m.owned_buckets(4);
        m.backlog(0, 10, Some(Duration::from_millis(2500)));
        m.backlog(1, 7, Some(Duration::from_secs(9)));
        m.backlog(0, 3, None); // the latest sample of a bucket counts
        m.poison_item(2);
        m.batch_duration(0, Duration::from_micros(12_500));
        m.batch_duration(0, Duration::from_millis(3));
        m.round_duration(Duration::from_millis(40));
        let docs = m.flush_at(1_764_500_000_000);
        assert_eq!(docs.len(), 1);
        let v = validate(&docs[0]);
        let root: Value = serde_json::from_str(&docs[0]).unwrap();
        assert_eq!(root["_aws"]["Timestamp"], 1_764_500_000_000u64);
        assert_eq!(root["_aws"]["CloudWatchMetrics"][0]["Namespace"], "Outbox");
        assert_eq!(
            root["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["service", "table"]])
        );
        assert_eq!(root["service"], "outbox-relay");
        assert_eq!(root["table"], "orders-outbox");
        assert_eq!(v["Published"], json!(7));
        assert_eq!(v["PublishFailures"], json!(2));
        assert_eq!(v["PublishRejected"], json!(1));
        assert_eq!(v["RefusedWrites"], json!(3));
        assert_eq!(v["RefusedWrites.claim"], json!(2));
        assert_eq!(v["RefusedWrites.heartbeat"], json!(1));
        assert!(
            !v.contains_key("RefusedWrites.renew"),
            "zero counters are skipped"
        );
        assert_eq!(v["LeasesAcquired"], json!(4));
        assert_eq!(v["LeasesLost"], json!(1));
        assert_eq!(v["OwnedBuckets"], json!(4));
        assert_eq!(v["PendingMessages"], json!(10));
        assert_eq!(v["OldestPendingAge"], json!(9));
        assert_eq!(v["PoisonItems"], json!(1));
        assert_eq!(v["BatchDuration"], json!([12.5, 3]));
        assert_eq!(v["RoundDuration"], json!(40));
        assert_eq!(v["ColdStart"], json!(1));
        let units: BTreeMap<String, String> = root["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["Name"].as_str().unwrap().to_string(),
                    d["Unit"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(units["OldestPendingAge"], "Seconds");
        assert_eq!(units["BatchDuration"], "Milliseconds");
        assert_eq!(units["Published"], "Count");
    }

    /// A refused authorization is a failed publish (never a rejected one) and names the
    /// failure, the topic, the principal and the operation in the document's
    /// `NotAuthorized` member, one object per refusal with its count.
    #[test]
    fn refused_authorizations_are_counted_and_named() {
        let m = table_metrics();
        m.publish_not_authorized(1, &denied("orders", "User:nogrant"));
        m.publish_not_authorized(2, &denied("orders", "User:nogrant"));
        m.publish_not_authorized(2, &denied("audit", "User:nogrant"));
        m.publish_failed(3, false);
        let docs = m.flush_at(1_764_500_000_000);
        assert_eq!(docs.len(), 1);
        let v = validate(&docs[0]);
        assert_eq!(v["PublishFailures"], json!(4));
        assert_eq!(v["PublishNotAuthorized"], json!(3));
        assert!(!v.contains_key("PublishRejected") && !v.contains_key("PoisonItems"));
        let root: Value = serde_json::from_str(&docs[0]).unwrap();
        assert_eq!(
            root[NOT_AUTHORIZED_MEMBER],
            json!([
                {"Failure": "TOPIC_AUTHORIZATION_FAILED", "Topic": "audit",
                 "Principal": "User:nogrant", "Operation": "WRITE", "Count": 1},
                {"Failure": "TOPIC_AUTHORIZATION_FAILED", "Topic": "orders",
                 "Principal": "User:nogrant", "Operation": "WRITE", "Count": 2},
            ])
        );
        // Only while it happens: the next flush names nothing.
        m.published(0, 1);
        let next: Value = serde_json::from_str(&m.flush_at(1_764_500_060_000)[0]).unwrap();
        assert!(next.get(NOT_AUTHORIZED_MEMBER).is_none(), "{next}");
        assert!(m
            .with_dimension(NOT_AUTHORIZED_MEMBER, "x")
            .unwrap_err()
            .to_string()
            .contains("is the name of a metric or of the NotAuthorized member"));
    }

    #[test]
    fn flush_starts_over_and_skips_zero_counters() {
        let m = table_metrics();
        m.cold_start();
        m.published(0, 1);
        m.refused_write(WriteKind::Renew);
        m.backlog(0, 1, None);
        m.owned_buckets(2);
        let first = validate(&m.flush_at(1_764_500_000_000)[0]);
        assert_eq!(first["Published"], json!(1));
        assert_eq!(first["RefusedWrites.renew"], json!(1));
        assert!(
            !first.contains_key("RefusedWrites.claim"),
            "a kind with no refusal is not reported"
        );
        assert!(!first.contains_key("PublishFailures") && !first.contains_key("LeasesLost"));

        // Nothing since: no document at all.
        assert!(m.flush_at(1_764_500_060_000).is_empty());

        // An idle invocation: it claims its leases, owns buckets, samples an empty
        // backlog and runs acquisition rounds; nothing was published, failed or found
        // pending. Nothing of it carries information: no document, no metric billed.
        m.leases_acquired(8);
        m.owned_buckets(8);
        m.backlog(0, 0, None);
        m.round_duration(Duration::from_millis(12));
        m.round_duration(Duration::from_millis(9));
        m.cold_start();
        assert_eq!(
            m.flush_at(1_764_500_120_000),
            Vec::<String>::new(),
            "an idle flush reports nothing"
        );

        // A relay that finds a message pending (a parked head, Kafka down): the head's
        // age and the gauges measured with it are reported, zeros included.
        m.leases_acquired(8);
        m.owned_buckets(8);
        m.backlog(0, 0, None);
        m.backlog(1, 3, Some(Duration::from_secs(400)));
        m.round_duration(Duration::from_millis(12));
        let docs = m.flush_at(1_764_500_180_000);
        assert_eq!(docs.len(), 1);
        let pending = validate(&docs[0]);
        assert_eq!(pending["OldestPendingAge"], json!(400));
        assert_eq!(pending["PendingMessages"], json!(3));
        assert_eq!(pending["OwnedBuckets"], json!(8));
        assert!(
            !pending.contains_key("Published"),
            "a zero count is not reported"
        );

        // The backlog drained: the run published, and its last sample is empty. The zero
        // age is reported (it tells the stuck alarm that the head moved).
        m.published(1, 3);
        m.backlog(1, 0, None);
        let drained = validate(&m.flush_at(1_764_500_240_000)[0]);
        assert_eq!(drained["OldestPendingAge"], json!(0));
        assert_eq!(drained["PendingMessages"], json!(0));
        assert_eq!(drained["Published"], json!(3));

        // Each kind of news alone makes a flush worth reporting.
        type Event = fn(&EmfMetrics);
        let news: [(&str, Event); 7] = [
            ("PublishFailures", |m| m.publish_failed(0, false)),
            ("RefusedWrites", |m| m.refused_write(WriteKind::Renew)),
            ("LeasesLost", |m| m.leases_lost(1)),
            ("PoisonItems", |m| m.poison_item(0)),
            ("QuarantinedItems", |m| m.quarantined(0)),
            ("SuccessorFailures", |m| m.successor_failed()),
            ("OldestPendingAge", |m| {
                m.head_age(0, Duration::from_secs(2))
            }),
        ];
        for (metric, event) in news {
            m.leases_acquired(1);
            event(&m);
            let docs = m.flush_at(1_764_500_300_000);
            assert_eq!(docs.len(), 1, "{metric}");
            let v = validate(&docs[0]);
            assert!(v.contains_key(metric), "{metric}: {v:?}");
            assert_eq!(v["LeasesAcquired"], json!(1), "{metric}");
        }
    }

    #[test]
    fn commit_to_ack_reports_one_value_per_acknowledged_message() {
        let m = table_metrics();
        m.published(0, 250);
        for i in 0..250u64 {
            m.commit_to_ack(0, Duration::from_micros(1500 + i * 1000));
        }
        let docs = m.flush_at(1_764_500_000_000);
        assert_eq!(docs.len(), 3, "250 values need three documents");
        let mut values = Vec::new();
        for doc in &docs {
            let v = validate(doc);
            match v.get("CommitToAckLatency") {
                Some(Value::Array(a)) => values.extend(a.iter().map(|x| x.as_f64().unwrap())),
                Some(x) => values.push(x.as_f64().unwrap()),
                None => {}
            }
            let root: Value = serde_json::from_str(doc).unwrap();
            let unit = root["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["Name"] == "CommitToAckLatency")
                .map(|d| d["Unit"].clone());
            assert_eq!(unit, Some(json!("Milliseconds")));
        }
        assert_eq!(values.len(), 250, "the sample count is the published count");
        assert_eq!(values[0], 1.5);
        assert_eq!(values[249], 250.5);
        // Past the cap, a bounded uniform sample.
        for _ in 0..(MAX_LATENCY_SAMPLES + 500) {
            m.commit_to_ack(0, Duration::from_millis(3));
        }
        let kept: usize = m
            .flush_at(1_764_500_060_000)
            .iter()
            .map(|d| match validate(d).get("CommitToAckLatency") {
                Some(Value::Array(a)) => a.len(),
                Some(_) => 1,
                None => 0,
            })
            .sum();
        assert_eq!(kept, MAX_LATENCY_SAMPLES);
    }

    fn denied(topic: &str, principal: &str) -> NotAuthorized {
        NotAuthorized {
            topic: topic.into(),
            principal: principal.into(),
            operation: "WRITE",
            failure: crate::error::AuthorizationFailure::Topic,
        }
    }

    #[test]
    fn every_metric_name_is_known_and_the_total_is_23() {
        let m = table_metrics();
        m.cold_start();
        m.published(0, 1);
        m.publish_failed(0, true);
        m.publish_not_authorized(0, &denied("orders", "User:relay"));
        for kind in WriteKind::ALL {
            m.refused_write(kind);
        }
        m.leases_acquired(1);
        m.leases_lost(1);
        m.poison_item(0);
        m.quarantined(0);
        m.successor_failed();
        m.owned_buckets(1);
        m.backlog(0, 1, Some(Duration::from_secs(1)));
        m.batch_duration(0, Duration::from_millis(1));
        m.round_duration(Duration::from_millis(1));
        m.commit_to_ack(0, Duration::from_millis(1));
        let v = validate(&m.flush_at(1_764_500_000_000)[0]);
        assert_eq!(v.len(), METRIC_NAMES.len() + WriteKind::ALL.len());
        assert_eq!(v.len(), 23);
        assert_eq!(v["QuarantinedItems"], json!(1));
        for name in v.keys() {
            assert!(
                METRIC_NAMES.contains(&name.as_str()) || name.starts_with("RefusedWrites."),
                "{name}"
            );
        }
    }

    #[test]
    fn namespace_and_service_from_the_environment() {
        let m = EmfMetrics::from_lookup("t-1", |name| match name {
            NAMESPACE_ENV => Some("Payments".into()),
            SERVICE_ENV => Some("payments-relay".into()),
            _ => None,
        });
        assert_eq!(m.namespace(), "Payments");
        m.published(0, 1);
        let root: Value = serde_json::from_str(&m.flush_at(1_764_500_000_000)[0]).unwrap();
        assert_eq!(
            root["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "Payments"
        );
        assert_eq!(root["service"], "payments-relay");
        let empty = EmfMetrics::from_lookup("t-1", |_| Some(String::new()));
        assert_eq!(empty.namespace(), DEFAULT_NAMESPACE);
    }

    #[test]
    fn many_values_split_into_documents_within_the_limits() {
        let m = table_metrics();
        m.published(0, 1);
        for i in 0..250 {
            m.batch_duration(0, Duration::from_millis(i));
        }
        for i in 0..120 {
            m.round_duration(Duration::from_millis(i));
        }
        let docs = m.flush_at(1_764_500_000_000);
        assert_eq!(docs.len(), 3, "250 values need three documents");
        let mut batch = Vec::new();
        let mut round = Vec::new();
        for (i, doc) in docs.iter().enumerate() {
            let v = validate(doc);
            if i == 0 {
                assert!(
                    v.contains_key("Published"),
                    "counters in the first document"
                );
            } else {
                assert!(!v.contains_key("Published"), "counters only once");
            }
            let collect = |out: &mut Vec<f64>, key: &str| match v.get(key) {
                Some(Value::Array(a)) => out.extend(a.iter().map(|x| x.as_f64().unwrap())),
                Some(x) => out.push(x.as_f64().unwrap()),
                None => {}
            };
            collect(&mut batch, "BatchDuration");
            collect(&mut round, "RoundDuration");
        }
        assert_eq!(batch, (0..250).map(|i| i as f64).collect::<Vec<_>>());
        assert_eq!(round, (0..120).map(|i| i as f64).collect::<Vec<_>>());
    }

    #[test]
    fn samples_stay_bounded() {
        let m = table_metrics();
        for _ in 0..(MAX_SAMPLES * 3) {
            m.batch_duration(0, Duration::from_millis(1));
        }
        let docs = m.flush_at(1_764_500_000_000);
        assert_eq!(docs.len(), MAX_SAMPLES / MAX_VALUES_PER_METRIC);
        for doc in &docs {
            validate(doc);
        }
    }

    #[test]
    fn renderer_keeps_100_metrics_per_document() {
        let m = table_metrics();
        let metrics: Vec<Metric> = (0..250)
            .map(|i| Metric {
                name: format!("M{i}"),
                unit: Unit::Count,
                values: vec![i as f64],
            })
            .collect();
        let docs = m.render(&metrics, 1_764_500_000_000, None);
        assert_eq!(docs.len(), 3);
        let mut seen = 0;
        for doc in &docs {
            seen += validate(doc).len();
        }
        assert_eq!(seen, 250);
    }

    #[test]
    fn dimensions_are_limited_to_30() {
        let mut m = table_metrics();
        for i in 2..MAX_DIMENSIONS {
            m = m.with_dimension(format!("d{i}"), "x").unwrap();
        }
        m.published(0, 1);
        let docs = m.flush_at(1_764_500_000_000);
        validate(&docs[0]);
        let root: Value = serde_json::from_str(&docs[0]).unwrap();
        assert_eq!(
            root["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
                .as_array()
                .unwrap()
                .len(),
            MAX_DIMENSIONS
        );
        assert!(m.with_dimension("one-too-many", "x").is_err());
        assert!(table_metrics().with_dimension("table", "x").is_err());
        assert!(table_metrics().with_dimension("Published", "x").is_err());
        assert!(table_metrics()
            .with_dimension("function_name", "relay")
            .is_ok());
    }
}
