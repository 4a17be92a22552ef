//! Commit notifications between processes: what a writer sends after a commit so that a
//! relay wakes up without waiting for its next poll, and how a relay woken by one decides
//! whether it is needed at all.
//!
//! The transport is an Amazon EventBridge event (the enqueue function sends it when
//! `OUTBOX_NOTIFY_EVENT_BUS` is set; an EventBridge rule on the bus invokes the relay
//! function). The event's `source` is [`SOURCE`], its `detail-type` [`DETAIL_TYPE`], and its
//! `detail` a [`CommitNotification`]:
//!
//! ```json
//! {"table": "orders-outbox", "key_prefix": "OUTBOX", "bucket_count": 8, "buckets": [2, 5]}
//! ```
//!
//! A notification is only a hint: the write never depends on it, and a relay that never
//! receives one still finds the messages on its next poll.
//!
//! # No stampede
//! Every commit can send a notification, and every notification can start a relay
//! invocation. A relay started by one first reads the coordination partition once
//! (one strongly consistent `Query`, no write) and returns at once when
//! [`crate::protocol::coordination::Coordination::uncovered`] finds every notified bucket held by a
//! live relay; only otherwise does it join the fleet as a relay, and on an idle fleet only
//! the first wake-up of its moment does (the others wait for its relay): see [`decide`].

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::options::OutboxOptions;

#[cfg(feature = "relay")]
mod continuation;
#[cfg(feature = "relay")]
mod decide;
mod local;
mod successor;
#[cfg(feature = "relay")]
mod wakeup;
#[cfg(feature = "lambda")]
pub(crate) use continuation::ContinuationKey;
#[cfg(feature = "relay")]
pub use continuation::{StreamSuccessor, CONTINUATION_LIFETIME};
#[cfg(feature = "relay")]
pub use decide::{
    decide, Decision, Skip, ALONE_WITHIN, FOLLOW_STEP, HANDOVER_SETTLE_MAX, LOOK_ATTEMPTS,
    LOOK_BACKOFF, PREPARE_BOUND, WAKEUP_SETTLE, WAKEUP_SETTLE_MAX,
};
pub use local::LocalNotifier;
pub use successor::{Handoff, Successor, SUCCESSOR_LEAD};
#[cfg(feature = "relay")]
pub use wakeup::{WAKEUP_LIFETIME, WAKEUP_WINDOW};
#[cfg(feature = "eventbridge")]
mod eventbridge;
#[cfg(feature = "eventbridge")]
pub use eventbridge::{EventBridgeNotifier, NotifyError, NOTIFY_TIMEOUT};

/// The environment variable naming the event bus (name or ARN) for commit notifications;
/// unset or empty for none.
pub const NOTIFY_EVENT_BUS: &str = "OUTBOX_NOTIFY_EVENT_BUS";

/// Wakes relays after a commit. Called only after the transaction committed.
pub trait CommitNotifier: Debug + Send + Sync {
    /// The buckets that received messages.
    fn notify(&self, buckets: &[u32]);
}

/// A notifier that does nothing: relays find the messages on their next poll.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopNotifier;

impl CommitNotifier for NoopNotifier {
    fn notify(&self, _buckets: &[u32]) {}
}

/// The `source` of a commit notification event.
pub const SOURCE: &str = "dynamo-outbox";
/// The `detail-type` of a commit notification event.
pub const DETAIL_TYPE: &str = "OutboxCommitted";

/// The `detail` of a commit notification: which outbox, and which of its buckets received
/// messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CommitNotification {
    /// The outbox table's name.
    pub table: String,
    /// The outbox's key prefix.
    pub key_prefix: String,
    /// The writer's bucket count (a relay with another count ignores the notification).
    pub bucket_count: u32,
    /// The buckets that received messages, ascending, without duplicates.
    pub buckets: Vec<u32>,
}

impl CommitNotification {
    /// The notification of a commit to `buckets` of the outbox `options` describes.
    pub fn new(options: &OutboxOptions, buckets: impl IntoIterator<Item = u32>) -> Self {
        let mut buckets: Vec<u32> = buckets.into_iter().collect();
        buckets.sort_unstable();
        buckets.dedup();
        CommitNotification {
            table: options.table_name.clone(),
            key_prefix: options.key_prefix.clone(),
            bucket_count: options.bucket_count,
            buckets,
        }
    }

    /// The event's `detail`, as the JSON text EventBridge's `PutEvents` takes.
    pub fn detail_json(&self) -> String {
        serde_json::to_string(self).expect("a notification always serializes")
    }

    /// Checks the rules a notification read from the outside world must keep: every
    /// bucket below the bucket count. The error names the field.
    pub fn validate(&self) -> Result<()> {
        match self.buckets.iter().find(|b| **b >= self.bucket_count) {
            Some(b) => Err(Error::InvalidMessage {
                field: "detail.buckets".into(),
                rule: format!(
                    "bucket {b} is not below the bucket count {}",
                    self.bucket_count
                ),
            }),
            None => Ok(()),
        }
    }

    /// `None` when the notification is for the outbox `options` describes; otherwise why
    /// it is not (another table, key prefix or bucket count).
    pub fn mismatch(&self, options: &OutboxOptions) -> Option<String> {
        if self.table != options.table_name {
            Some(format!(
                "for table {:?}, not {:?}",
                self.table, options.table_name
            ))
        } else if self.key_prefix != options.key_prefix {
            Some(format!(
                "for key prefix {:?}, not {:?}",
                self.key_prefix, options.key_prefix
            ))
        } else if self.bucket_count != options.bucket_count {
            Some(format!(
                "for bucket count {}, not {}",
                self.bucket_count, options.bucket_count
            ))
        } else {
            None
        }
    }
}
