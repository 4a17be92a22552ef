//! What a run reports: why it ended ([`StopReason`]) and what it did ([`RunReport`]).

use std::collections::BTreeMap;

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The deadline arrived; the relay stopped gracefully.
    Deadline,
    /// The shutdown signal fired; the relay stopped gracefully.
    Shutdown,
    /// Work was still in flight at the hard deadline: nothing was released.
    DeadlineMissed,
    /// Every bucket it owned stayed empty for [`RelayOptions::idle_stop`] while live
    /// peers held the rest; the relay stopped gracefully.
    ///
    /// [`RelayOptions::idle_stop`]: crate::RelayOptions::idle_stop
    Idle,
}

impl StopReason {
    /// Short lowercase name for logs and summaries.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Deadline => "deadline",
            StopReason::Shutdown => "shutdown",
            StopReason::DeadlineMissed => "deadline_missed",
            StopReason::Idle => "idle",
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// The relay's id.
    pub relay_id: String,
    /// Messages published and deleted.
    pub published: u64,
    /// Publish attempts that failed.
    pub publish_failures: u64,
    /// Of those, publishes the brokers refused for authorization (a missing ACL or IAM
    /// permission): retried after the error backoff, never poison, never quarantined.
    pub not_authorized: u64,
    /// Poison items this run moved to the dead-letter partition
    /// (`OUTBOX_POISON_POLICY=quarantine-after=N`).
    pub quarantined: u64,
    /// Acquisition rounds run.
    pub rounds: u64,
    /// Most buckets owned at once.
    pub max_owned: usize,
    /// Buckets owned when the run ended (before the stop released them).
    pub owned_at_end: usize,
    /// Leases claimed.
    pub leases_acquired: u64,
    /// Leases lost.
    pub leases_lost: u64,
    /// Refused conditional writes of this run, by kind.
    pub refused: BTreeMap<&'static str, u64>,
    /// Errors (failed requests, failed rounds) that the loop recovered from.
    pub errors: u64,
    /// Why the run ended.
    pub stop_reason: StopReason,
    /// Whether the stop released every lease (re-read until none named the relay).
    pub released: bool,
    /// Whether the run started a successor for the work it left
    /// ([`crate::notification::Successor`]).
    pub successor_started: bool,
    /// Whether it ended with work left and could not start its successor (every attempt
    /// failed or ran out of time): its buckets wait for the next wake-up.
    pub successor_failed: bool,
}

impl RunReport {
    /// Refused conditional writes of every kind.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
}
