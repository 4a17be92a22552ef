//! What one bucket's batch did ([`BatchResult`]) and what its fetch learned of earlier
//! batches' deletes ([`Settled`]): the batch pipeline (`batch`) produces them, the run's
//! state (`state`) applies them. Pure.

use crate::error::{Error, NotAuthorized};
use crate::message::StoredMessage;

/// What one bucket's batch did.
#[derive(Debug)]
pub(super) enum BatchResult {
    /// Nothing waiting (probe or fetch found nothing).
    Idle,
    /// Not started (or stopped before publishing): too close to the lease's end or the
    /// deadline. Nothing changed.
    Skipped,
    /// The fetch ran into the batch's time limit, or ended with none of it left (items
    /// this large, a slow table): nothing was published; the bucket's next fetches read
    /// half as many bytes.
    FetchCut,
    /// Published and deleted `deleted` of `fetched` messages, the last removed one being `last`.
    Done {
        fetched: usize,
        deleted: usize,
        last: Option<u64>,
        full: bool,
    },
    /// A retryable failure; try again after the backoff (with the head alone when the
    /// publish failed). A publish the brokers refused for authorization is one of these,
    /// never [`BatchResult::Poison`]: `not_authorized` says who was refused what.
    Failed {
        deleted: usize,
        last: Option<u64>,
        publish_failed: bool,
        not_authorized: Option<NotAuthorized>,
    },
    /// The bucket is stuck on an unreadable item or a record the broker rejects for good,
    /// after `deleted` messages went through.
    Poison {
        /// What is wrong: the unreadable item ([`Error::Corrupt`]), a topic outside the
        /// allow-list ([`Error::InvalidMessage`]), the broker's refusal
        /// ([`Error::KafkaRejected`], with the client's error as its source).
        error: Error,
        /// The message the bucket is stuck on (its id and sequence), when it could be read.
        at: Option<(String, u64)>,
        deleted: usize,
        last: Option<u64>,
    },
}

/// What one batch reports: its result, and what it learned of earlier batches' deletes.
#[derive(Debug)]
pub(super) struct BatchReport {
    pub(super) result: BatchResult,
    /// What the batch's fetch settled of the bucket's unconfirmed deletes (`None`: no
    /// fetch completed).
    pub(super) settled: Option<Settled>,
    /// Messages this batch published but could not confirm deleted.
    pub(super) unconfirmed: Vec<u64>,
}

impl BatchReport {
    /// The report of a batch that fetched and stopped before it deleted anything: its
    /// `result`, and what its fetch `settled`.
    pub(super) fn after_fetch(result: BatchResult, settled: Option<Settled>) -> Self {
        BatchReport {
            result,
            settled,
            unconfirmed: Vec::new(),
        }
    }
}

impl From<BatchResult> for BatchReport {
    fn from(result: BatchResult) -> Self {
        BatchReport {
            result,
            settled: None,
            unconfirmed: Vec::new(),
        }
    }
}

/// Published messages whose delete was not confirmed, as a strongly consistent fetch from
/// the bucket's head finds them: `gone` (below its first item, or missing within what it
/// read: deleted, so published and removed), and `unknown` (beyond what it read). The
/// ones it found are neither: they go out again and are counted then.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Settled {
    pub(super) gone: Vec<u64>,
    pub(super) unknown: Vec<u64>,
}

impl Settled {
    pub(super) fn of(unconfirmed: &[u64], fetched: &[StoredMessage]) -> Self {
        let mut settled = Settled::default();
        let (first, last) = match (fetched.first(), fetched.last()) {
            (Some(f), Some(l)) => (f.sequence, l.sequence),
            _ => {
                settled.gone = unconfirmed.to_vec();
                return settled;
            }
        };
        for &s in unconfirmed {
            if s < first || (s <= last && !fetched.iter().any(|m| m.sequence == s)) {
                settled.gone.push(s);
            } else if s > last {
                settled.unknown.push(s);
            }
        }
        settled
    }
}
