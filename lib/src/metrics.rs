//! What the relay reports, behind a small trait so that exporters (CloudWatch EMF in the
//! Lambda, OpenTelemetry in a long-lived process) plug in without the relay knowing them.
//! Every method has a no-op default.

pub mod emf;
#[cfg(feature = "otel")]
pub mod otel;

use std::fmt::Debug;
use std::time::Duration;

use crate::error::NotAuthorized;
/// The kinds of conditional write a relay makes ([`RelayMetrics::refused_write`]), as the
/// lease protocol defines them: stable under this path.
#[doc(inline)]
pub use crate::protocol::store::WriteKind;

/// Receives the relay's measurements.
pub trait RelayMetrics: Debug + Send + Sync {
    /// `count` messages of `bucket` were published and deleted.
    fn published(&self, _bucket: u32, _count: u64) {}
    /// A publish of `bucket` failed; `permanent` when the broker rejected a record for good.
    fn publish_failed(&self, _bucket: u32, _permanent: bool) {}
    /// A publish of `bucket` failed because the brokers refused the relay's principal
    /// (`denied`: the failure, the topic, the principal and the operation): a transient
    /// failure, retried after the error backoff, never poison. Reported instead of
    /// [`RelayMetrics::publish_failed`]; the default reports it as that (not permanent).
    fn publish_not_authorized(&self, bucket: u32, denied: &NotAuthorized) {
        let _ = denied;
        self.publish_failed(bucket, false);
    }
    /// A conditional write of `kind` was refused.
    fn refused_write(&self, _kind: WriteKind) {}
    /// The relay owns `count` buckets after an acquisition.
    fn owned_buckets(&self, _count: usize) {}
    /// The relay claimed `count` leases in an acquisition.
    fn leases_acquired(&self, _count: usize) {}
    /// The relay lost `count` leases it believed it held (a refused renewal, a peer's take).
    fn leases_lost(&self, _count: usize) {}
    /// Backlog of `bucket`: pending messages (capped at the pending count limit) and the age
    /// of its head. Sampled only by the owner of bucket zero.
    fn backlog(&self, _bucket: u32, _pending: u32, _oldest_age: Option<Duration>) {}
    /// A batch found `bucket`'s head message, committed `age` ago (every batch that
    /// fetched messages: a bucket stuck behind its head reports a growing age each retry).
    fn head_age(&self, _bucket: u32, _age: Duration) {}
    /// A bucket is stuck on an item it cannot read (a poison item).
    fn poison_item(&self, _bucket: u32) {}
    /// The relay moved a poison item of `bucket` to the dead-letter partition
    /// (`OUTBOX_POISON_POLICY=quarantine-after=N`).
    fn quarantined(&self, _bucket: u32) {}
    /// The relay started (`owned`) or stopped publishing `bucket`.
    fn ownership(&self, _bucket: u32, _owned: bool) {}
    /// A run ended with work left and could not start its successor (every attempt
    /// failed or ran out of time): its buckets wait for the next wake-up.
    fn successor_failed(&self) {}
    /// One acquisition round took `duration`.
    fn round_duration(&self, _duration: Duration) {}
    /// One batch (fetch, publish, delete) took `duration`.
    fn batch_duration(&self, _bucket: u32, _duration: Duration) {}
    /// The broker acknowledged a message of `bucket` `latency` after its commit: from the
    /// message's enqueue timestamp (`CreatedAtUtc`, the writer's clock) to the relay's
    /// clock when the publish of its batch returned acknowledged; zero when the writer's
    /// clock is ahead. Called once per acknowledged message (a message published again
    /// after a failed delete counts again, as Kafka holds it again).
    fn commit_to_ack(&self, _bucket: u32, _latency: Duration) {}
}

/// Discards every measurement.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetrics;

impl RelayMetrics for NoMetrics {}

/// Several sinks as one: every measurement goes to each of them, in order (EMF, OTLP and
/// a health endpoint at once, say).
#[derive(Debug, Clone, Default)]
pub struct Fanout(Vec<std::sync::Arc<dyn RelayMetrics>>);

impl Fanout {
    /// The sinks `sinks` as one.
    pub fn new(sinks: Vec<std::sync::Arc<dyn RelayMetrics>>) -> Self {
        Fanout(sinks)
    }

    /// Adds `sink`.
    pub fn push(&mut self, sink: std::sync::Arc<dyn RelayMetrics>) {
        self.0.push(sink);
    }

    /// Whether it has no sink.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl RelayMetrics for Fanout {
    fn published(&self, bucket: u32, count: u64) {
        self.0.iter().for_each(|m| m.published(bucket, count));
    }
    fn publish_failed(&self, bucket: u32, permanent: bool) {
        self.0
            .iter()
            .for_each(|m| m.publish_failed(bucket, permanent));
    }
    fn publish_not_authorized(&self, bucket: u32, denied: &NotAuthorized) {
        self.0
            .iter()
            .for_each(|m| m.publish_not_authorized(bucket, denied));
    }
    fn refused_write(&self, kind: WriteKind) {
        self.0.iter().for_each(|m| m.refused_write(kind));
    }
    fn owned_buckets(&self, count: usize) {
        self.0.iter().for_each(|m| m.owned_buckets(count));
    }
    fn leases_acquired(&self, count: usize) {
        self.0.iter().for_each(|m| m.leases_acquired(count));
    }
    fn leases_lost(&self, count: usize) {
        self.0.iter().for_each(|m| m.leases_lost(count));
    }
    fn backlog(&self, bucket: u32, pending: u32, oldest_age: Option<Duration>) {
        self.0
            .iter()
            .for_each(|m| m.backlog(bucket, pending, oldest_age));
    }
    fn head_age(&self, bucket: u32, age: Duration) {
        self.0.iter().for_each(|m| m.head_age(bucket, age));
    }
    fn poison_item(&self, bucket: u32) {
        self.0.iter().for_each(|m| m.poison_item(bucket));
    }
    fn quarantined(&self, bucket: u32) {
        self.0.iter().for_each(|m| m.quarantined(bucket));
    }
    fn ownership(&self, bucket: u32, owned: bool) {
        self.0.iter().for_each(|m| m.ownership(bucket, owned));
    }
    fn successor_failed(&self) {
        self.0.iter().for_each(|m| m.successor_failed());
    }
    fn round_duration(&self, duration: Duration) {
        self.0.iter().for_each(|m| m.round_duration(duration));
    }
    fn batch_duration(&self, bucket: u32, duration: Duration) {
        self.0
            .iter()
            .for_each(|m| m.batch_duration(bucket, duration));
    }
    fn commit_to_ack(&self, bucket: u32, latency: Duration) {
        self.0.iter().for_each(|m| m.commit_to_ack(bucket, latency));
    }
}
