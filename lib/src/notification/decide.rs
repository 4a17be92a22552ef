//! The wake-up decision: what a relay host woken by a commit notification or a doorbell
//! does about it (join the fleet as a relay, or return at once), made from the
//! coordination partition and nothing else.
//!
//! The rule a wake-up keeps: it is never lost. Whatever goes wrong while deciding (a
//! coverage read throttled past its retries, a 5xx, a timeout after the SDK's retries, a
//! probe that fails) makes the host join, never return an error: the event source that delivered the wake
//! retries nothing useful (a stream mapping would hold up its shard, an EventBridge target
//! gives up), and a relay that joins has its own back-off. Kafka is not touched here; a
//! host that connects before its second look does so through `prepare`, whose failure is
//! not the decision's business (the relay retries the connection as it retries any
//! publish).
//!
//! The steps, each at most once:
//! 1. A notification for another table, key prefix or bucket count, or a doorbell with no
//!    message of this outbox: [`Skip::NotThisOutbox`].
//! 2. One strongly consistent read of the coordination partition
//!    ([`DynamoDbOutboxStore::coverage`]), made again after a growing pause while it is
//!    throttled (at most [`LOOK_ATTEMPTS`] reads); only then does a host join in doubt.
//!    Every notified bucket covered by a live relay: [`Skip::Covered`].
//! 3. The uncovered buckets probed (strongly consistent, one item each); all empty (a
//!    later stream batch of a commit already published): [`Skip::Empty`].
//! 4. `prepare` (the host connects to Kafka, so that the time between the second look
//!    and its heartbeat is short), then a pause: the request's jitter
//!    ([`notification_jitter`], under [`JOIN_DELAY`]), or until live relays
//!    take the buckets over when that is within [`HANDOVER_SETTLE_MAX`]. So a burst of
//!    wake-ups to an idle fleet starts one relay (the first to join writes its heartbeat
//!    first, and the later ones count its round's claims), and a handover starts none.
//! 5. The second read: still uncovered, [`Decision::Join`]; otherwise [`Skip::Covered`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::CommitNotification;
use crate::error::Error;
use crate::options::RelayOptions;
use crate::protocol::coordination::JOIN_DELAY;
use crate::protocol::store::{Coverage, DynamoDbOutboxStore};

/// Longest time a woken host waits for live relays to take uncovered buckets over before
/// it looks again (a successor claims a leaver's buckets a few hundred milliseconds after
/// the announced stop); takers further away than this are not waited for.
pub const HANDOVER_SETTLE_MAX: Duration = Duration::from_millis(1500);

/// Why a woken host returns without running a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skip {
    /// Live relays hold (or, having just joined, are claiming) every notified bucket.
    Covered,
    /// The notified buckets no live relay holds have no message.
    Empty,
    /// The wake-up names another table, key prefix or bucket count, or no bucket at all.
    NotThisOutbox,
}

impl Skip {
    /// The name an operator filters on: `covered`, `empty`, `not_this_outbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Covered => "covered",
            Skip::Empty => "empty",
            Skip::NotThisOutbox => "not_this_outbox",
        }
    }
}

/// What a woken host does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run a relay: these notified buckets have no live relay (all of them when the
    /// decision could not tell, and then `doubt` says why).
    Join {
        /// The notified buckets without a live relay.
        uncovered: Vec<u32>,
        /// Why the decision could not tell (a failed or timed-out read), when it could not.
        doubt: Option<String>,
    },
    /// Return at once.
    Skip {
        /// Why.
        why: Skip,
        /// The uncovered buckets of the last read, when there was a read.
        uncovered: Option<Vec<u32>>,
    },
}

/// How long a woken host that found uncovered buckets waits before it looks again: spread
/// over `[0, JOIN_DELAY)` by its request id, so that the wake-ups of one burst look at
/// different times.
pub fn notification_jitter(request_id: &str) -> Duration {
    let spread = JOIN_DELAY.as_millis() as u64;
    let hash = crate::message::murmur2(request_id.as_bytes()) as u32 as u64;
    Duration::from_millis(hash % spread)
}

/// Decides what a host woken by `n` does (the steps in the module docs), bounded by
/// `deadline`. `request_id` seeds the jitter; `prepare` runs once, only when the host may
/// join, before the second look. Never fails: when it cannot tell, it joins.
pub async fn decide<F>(
    store: &DynamoDbOutboxStore,
    n: &CommitNotification,
    options: &RelayOptions,
    deadline: Instant,
    request_id: &str,
    prepare: F,
) -> Decision
where
    F: Future<Output = ()>,
{
    let mismatch = match n.mismatch(store.options()) {
        Some(why) => Some(why),
        None if n.buckets.is_empty() => Some("no message of this outbox in the wake-up".into()),
        None => None,
    };
    if let Some(why) = mismatch {
        info!(why, "wake-up for another outbox: ignored");
        return Decision::Skip {
            why: Skip::NotThisOutbox,
            uncovered: None,
        };
    }
    let first = match look_patiently(store, &n.buckets, options, deadline, request_id).await {
        Ok(c) => c,
        Err(e) => return join_in_doubt(n.buckets.clone(), &e),
    };
    if first.uncovered.is_empty() {
        return covered(n, Vec::new());
    }
    // Nothing waiting in them (a later stream batch of a commit an earlier relay already
    // published): no relay to run. A commit after the probe rings its own doorbell.
    if all_empty(store, &first.uncovered, deadline).await {
        info!(uncovered = ?first.uncovered, "wake-up: the uncovered buckets are empty, not joining");
        return Decision::Skip {
            why: Skip::Empty,
            uncovered: Some(first.uncovered),
        };
    }
    prepare.await;
    let settle = first
        .settles_in
        .filter(|s| *s <= HANDOVER_SETTLE_MAX)
        .unwrap_or(Duration::ZERO);
    let again = Instant::now() + notification_jitter(request_id).max(settle);
    tokio::time::sleep_until(again.min(deadline)).await;
    let second = match look_patiently(store, &n.buckets, options, deadline, request_id).await {
        Ok(c) => c.uncovered,
        Err(e) => return join_in_doubt(first.uncovered, &e),
    };
    if second.is_empty() {
        return covered(n, second);
    }
    info!(uncovered = ?second, "wake-up: buckets without a live relay, joining");
    Decision::Join {
        uncovered: second,
        doubt: None,
    }
}

/// Coverage reads a woken host makes at most before it joins in doubt; a read that fails
/// with a retryable error (a throttle, a 5xx) is made again after a pause.
pub const LOOK_ATTEMPTS: u32 = 4;
/// The pause after the first failed coverage read; it doubles after each one. Each pause
/// is spread by the request id over its second half, so that the wake-ups of one burst
/// against a throttled partition do not come back together.
pub const LOOK_BACKOFF: Duration = Duration::from_millis(400);

/// The coverage read of a woken host: [`look`], made again after a pause while it fails
/// with a retryable error, at most [`LOOK_ATTEMPTS`] times, all bounded by `deadline`.
/// So a burst of wake-ups against a throttled coordination partition waits for it (the
/// first to read it after the throttle joins, the later ones count its claims) rather than
/// each joining in doubt.
async fn look_patiently(
    store: &DynamoDbOutboxStore,
    buckets: &[u32],
    options: &RelayOptions,
    deadline: Instant,
    request_id: &str,
) -> crate::error::Result<Coverage> {
    let mut pause = LOOK_BACKOFF;
    let mut attempt = 1;
    loop {
        match look(store, buckets, options, deadline).await {
            Err(e) if e.is_retryable() && attempt < LOOK_ATTEMPTS => {
                let spread = crate::message::murmur2(format!("{request_id}#{attempt}").as_bytes())
                    as u32 as u64
                    % (pause.as_millis() as u64 / 2 + 1);
                let wait = pause / 2 + Duration::from_millis(spread);
                warn!(attempt, error = %crate::error::chain(&e), wait_ms = wait.as_millis() as u64, "wake-up: reading the coordination partition failed; looking again");
                if Instant::now() + wait >= deadline {
                    return Err(e);
                }
                tokio::time::sleep(wait).await;
                pause *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// One coverage read, bounded by `deadline`.
async fn look(
    store: &DynamoDbOutboxStore,
    buckets: &[u32],
    options: &RelayOptions,
    deadline: Instant,
) -> crate::error::Result<Coverage> {
    tokio::time::timeout_at(deadline, store.coverage(buckets, options))
        .await
        .map_err(|_| Error::DeadlineExceeded("reading the coordination partition"))?
}

fn covered(n: &CommitNotification, uncovered: Vec<u32>) -> Decision {
    info!(buckets = ?n.buckets, "wake-up: live relays own the notified buckets, not joining");
    Decision::Skip {
        why: Skip::Covered,
        uncovered: Some(uncovered),
    }
}

fn join_in_doubt(uncovered: Vec<u32>, e: &Error) -> Decision {
    let doubt = format!(
        "reading the coordination partition failed: {}",
        crate::error::chain(e)
    );
    warn!(
        uncovered = ?uncovered,
        error = %crate::error::chain(e),
        "wake-up: could not tell whether live relays cover the buckets; joining"
    );
    Decision::Join {
        uncovered,
        doubt: Some(doubt),
    }
}

/// Whether every one of `buckets` has no message (strongly consistent probes, bounded by
/// `deadline`); a probe that fails or runs out of time counts as a message.
async fn all_empty(store: &DynamoDbOutboxStore, buckets: &[u32], deadline: Instant) -> bool {
    for &b in buckets {
        match tokio::time::timeout_at(deadline, store.probe_consistent(b)).await {
            Ok(Ok(false)) => {}
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_jitter_spreads_a_burst_under_the_join_delay() {
        let jitters: Vec<Duration> = (0..1000)
            .map(|i| notification_jitter(&format!("request-{i}")))
            .collect();
        assert!(jitters.iter().all(|j| *j < JOIN_DELAY));
        // Spread over the whole window: every tenth of it gets some.
        let mut tenths = [0; 10];
        for j in &jitters {
            tenths[(j.as_millis() * 10 / JOIN_DELAY.as_millis()) as usize] += 1;
        }
        assert!(tenths.iter().all(|n| *n >= 50), "{tenths:?}");
        // The ids the relay function's idle-burst test relies on.
        let ms = |id: &str| notification_jitter(id).as_millis();
        assert_eq!(
            ["wake-150", "wake-119", "wake-53", "wake-108", "wake-144"].map(ms),
            [0, 56, 112, 167, 224]
        );
    }
}
