//! Successors: a relay whose run ends with work left starts the next relay before it
//! leaves, so that a backlog never waits for the next schedule tick.
//!
//! A host with a deadline (a Lambda invocation) cannot outlive it. When the relay reaches
//! its deadline minus [`SUCCESSOR_LEAD`] and a bucket it owns still has messages it could
//! publish (more fetched than it had time for, or a publish that failed and waits for its
//! retry), it asks its [`Successor`] to start one more relay, once per run; a run that
//! found none then looks once more when its work ends, for what arrived since (that
//! successor starts as the leaver stops: a cold start's gap), unless its host says that
//! its wake-ups queue behind it ([`crate::Relay::with_successor_at_end`]). A successor started at the
//! lead joins while the leaver still runs and takes its share of the buckets at once (the lease
//! plan splits them between two live relays); it reads the leaver's announced stop and
//! takes the rest a couple of handover steps after it: the same handover as between any
//! two relays, with no bucket unowned for longer than that.
//!
//! A bucket parked behind an item it cannot publish (a poison item, a topic outside the
//! allow-list) is not work left: no relay can move it until an operator does, and the
//! stuck-outbox and poison alarms say so. A run shorter than [`SUCCESSOR_LEAD`] starts no
//! successor, so a chain of successors starts at most one relay per
//! [`SUCCESSOR_LEAD`] per relay of the fleet; with the Lambda function's defaults (a run
//! of about a minute), about one invocation per relay per minute while nothing can
//! progress (Kafka refusing, a topic not authorized).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::options::OutboxOptions;

/// How long before the end of its work a relay with work left starts its successor: the
/// successor's start (a cold start, the Kafka connection) and its first round fit in it.
pub const SUCCESSOR_LEAD: Duration = Duration::from_secs(10);

/// What a leaving relay tells its successor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Handoff {
    /// The outbox table's name.
    pub table: String,
    /// The outbox's key prefix.
    pub key_prefix: String,
    /// The relay's bucket count.
    pub bucket_count: u32,
    /// The leaving relay's id.
    pub predecessor: String,
    /// The buckets it owned with work left (empty when the successor was started through
    /// the stream, whose records carry only the continuation's key).
    pub buckets: Vec<u32>,
    /// When the leaving relay's run started, in Unix milliseconds: with the predecessor,
    /// the continuation's key (one successor per run).
    #[serde(default)]
    pub run_start_ms: u64,
}

impl Handoff {
    /// The handoff of `predecessor`, leaving `buckets` of the outbox `options` describes.
    pub fn new(options: &OutboxOptions, predecessor: &str, buckets: Vec<u32>) -> Self {
        Handoff {
            table: options.table_name.clone(),
            key_prefix: options.key_prefix.clone(),
            bucket_count: options.bucket_count,
            predecessor: predecessor.to_owned(),
            buckets,
            run_start_ms: 0,
        }
    }

    /// Sets when the leaving relay's run started (Unix milliseconds).
    pub fn with_run_start_ms(mut self, run_start_ms: u64) -> Self {
        self.run_start_ms = run_start_ms;
        self
    }
}

/// Starts a successor relay (asynchronously: `start` returns once the start is requested,
/// not when the successor runs).
pub trait Successor: Debug + Send + Sync {
    /// Requests one more relay, which receives `handoff`.
    fn start<'a>(
        &'a self,
        handoff: &'a Handoff,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;

    /// Whether starting again with the same handoff after a start that ran out of time
    /// can never make a second successor (the default: no, so such a start is not
    /// repeated).
    fn idempotent(&self) -> bool {
        false
    }
}
