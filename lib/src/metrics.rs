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
