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
//! 4. When live relays take the buckets over within [`HANDOVER_SETTLE_MAX`] (a scheduled
//!    handover), a pause until then and a look again, so that a handover starts no relay
//!    and writes nothing.
//! 5. The tie-break among simultaneous wake-ups ([`super::wakeup`]): the host writes its
//!    wake-up (an unconditional put into `{prefix}#WAKEUP`), pauses [`WAKEUP_SETTLE`] (at
//!    least twice its write's latency, at most [`WAKEUP_SETTLE_MAX`]) while `prepare` runs
//!    for at most [`PREPARE_BOUND`] (the host connects to Kafka, so that the time between
//!    the second look and its heartbeat is short), then reads the first wake-up of the
//!    last 3 s. Not first: it waits for the first one's relay, looking again every
//!    [`FOLLOW_STEP`], and returns [`Skip::Covered`] once it covers the buckets; when it
//!    has not within 3 s of the first wake-up (that host died, or its relay stopped at
//!    once), it joins. So a burst of wake-ups to an idle fleet starts one relay, whatever
//!    their request ids. A failed write or read ranks the host first.
//! 6. The second read: still uncovered, [`Decision::Join`] (alone when first and no relay
//!    is live); otherwise [`Skip::Covered`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::wakeup::{Rank, WakeUps, WAKEUP_WINDOW};
use super::CommitNotification;
use crate::error::Error;
use crate::options::RelayOptions;
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
        /// When this host's wake-up came first of its moment and its last read found no
        /// live relay: the instant by which its relay's first heartbeat must land for the
        /// relay to read the coordination partition [`ALONE_JOIN_DELAY`](crate::protocol::coordination::ALONE_JOIN_DELAY) after it instead
        /// of the full join delay ([`ALONE_WITHIN`] after that read was sent). A relay that
        /// starts later waits the full delay and reads after this one's claims.
        alone: Option<Instant>,
    },
    /// Return at once.
    Skip {
        /// Why.
        why: Skip,
        /// The uncovered buckets of the last read, when there was a read.
        uncovered: Option<Vec<u32>>,
    },
}

/// The shortest pause between a woken host's wake-up write and its read of the first
/// wake-up (it is at least twice the write's own latency): the writes of wake-ups that
/// started together land before any of them reads.
pub const WAKEUP_SETTLE: Duration = Duration::from_millis(100);
/// The longest such pause (a write slower than half of it is waited for no longer).
pub const WAKEUP_SETTLE_MAX: Duration = Duration::from_secs(1);
/// How long a woken host gives `prepare` (its Kafka connection, a head start) before it
/// goes on without it; its relay connects by itself when it is not done. The hosts that
/// follow it wait [`WAKEUP_WINDOW`] for its relay.
pub const PREPARE_BOUND: Duration = Duration::from_secs(1);
/// How often a woken host that is not the first of its moment looks whether the first
/// one's relay covers the buckets.
pub const FOLLOW_STEP: Duration = Duration::from_millis(250);
/// How soon after a lone host's last read its relay's first heartbeat must land for the
/// shorter first pause ([`ALONE_JOIN_DELAY`](crate::protocol::coordination::ALONE_JOIN_DELAY)): the relay then reads at most this plus
/// that pause after the host's last read, and a relay whose heartbeat that read did not
/// see reads [`crate::protocol::coordination::JOIN_DELAY`] after its own heartbeat,
/// later.
pub const ALONE_WITHIN: Duration = Duration::from_millis(100);

/// Decides what a host woken by `n` does (the steps in the module docs), bounded by
/// `deadline`. `request_id` names the host's wake-up (and spreads its retries); `prepare`
/// runs once, only when the host may join, before the second look. Never fails: when it
/// cannot tell, it joins.
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
    let mut first = match look_patiently(store, &n.buckets, options, deadline, request_id).await {
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
    // A scheduled handover: live relays take the buckets over soon. Wait for it and look
    // again before writing a wake-up, so that a handover costs no write.
    if let Some(settle) = first.settles_in.filter(|s| *s <= HANDOVER_SETTLE_MAX) {
        tokio::time::sleep_until((Instant::now() + settle).min(deadline)).await;
        first = match look_patiently(store, &n.buckets, options, deadline, request_id).await {
            Ok(c) => c,
            Err(e) => return join_in_doubt(first.uncovered, &e),
        };
        if first.uncovered.is_empty() {
            return covered(n, Vec::new());
        }
    }
    // Boxed: a handler's future holds this one, and the stack of a debug build's thread
    // is small.
    let standing = Box::pin(wait_for_the_first(store, deadline, request_id, prepare)).await;
    if let Some(Rank::After(after)) = standing {
        match Box::pin(follow(
            store, &n.buckets, options, deadline, request_id, after,
        ))
        .await
        {
            Ok(None) => return covered(n, Vec::new()),
            Ok(Some(uncovered)) => {
                let doubt = format!(
                    "no relay covers the buckets {} s after the first wake-up of this moment \
                     ({} ms before this one): its host may have died, or its relay stopped",
                    WAKEUP_WINDOW.as_secs(),
                    after.as_millis()
                );
                warn!(uncovered = ?uncovered, "wake-up: {doubt}; joining");
                return Decision::Join {
                    uncovered,
                    doubt: Some(doubt),
                    alone: None,
                };
            }
            Err(e) => return join_in_doubt(first.uncovered, &e),
        }
    }
    let look_sent = Instant::now();
    let second = match look_patiently(store, &n.buckets, options, deadline, request_id).await {
        Ok(c) => c,
        Err(e) => return join_in_doubt(first.uncovered, &e),
    };
    if second.uncovered.is_empty() {
        return covered(n, second.uncovered);
    }
    let alone = (standing == Some(Rank::First) && second.live_relays == 0)
        .then_some(look_sent + ALONE_WITHIN);
    info!(uncovered = ?second.uncovered, alone = alone.is_some(), "wake-up: buckets without a live relay, joining");
    Decision::Join {
        uncovered: second.uncovered,
        doubt: None,
        alone,
    }
}

/// Step 4's write and read, with `prepare` beside the pause: where this host's wake-up
/// stands, or `None` when the write or the read failed (the host then goes on as the
/// first, not knowing whether another joins beside it).
async fn wait_for_the_first<F>(
    store: &DynamoDbOutboxStore,
    deadline: Instant,
    request_id: &str,
    prepare: F,
) -> Option<Rank>
where
    F: Future<Output = ()>,
{
    let wakeups = WakeUps { store };
    let started = Instant::now();
    let announced = bounded(
        deadline,
        "writing the wake-up",
        wakeups.announce(request_id),
    )
    .await;
    // The pause lets the writes of wake-ups that started together land; after a failed
    // write there is nothing to rank, and only the head start is waited for.
    let settle = match announced {
        Some(_) => WAKEUP_SETTLE
            .max(started.elapsed() * 2)
            .min(WAKEUP_SETTLE_MAX),
        None => Duration::ZERO,
    };
    let pause = tokio::time::sleep_until((Instant::now() + settle).min(deadline));
    // The head start is bounded: the other hosts wait for this one's relay.
    let head_start =
        tokio::time::timeout_at((Instant::now() + PREPARE_BOUND).min(deadline), prepare);
    let _ = tokio::join!(head_start, pause);
    let rank = bounded(
        deadline,
        "reading the first wake-up",
        wakeups.rank(&announced?),
    )
    .await;
    if let Some(Rank::After(by)) = rank {
        info!(
            earlier_ms = by.as_millis() as u64,
            "wake-up: another wake-up of this moment came first; waiting for its relay"
        );
    }
    rank
}

/// A step of the tie-break bounded by `deadline`; `None` (logged) when it failed or ran
/// out of time, and the host goes on as the first.
async fn bounded<T>(
    deadline: Instant,
    what: &'static str,
    step: impl Future<Output = crate::error::Result<T>>,
) -> Option<T> {
    let result = tokio::time::timeout_at(deadline, step)
        .await
        .unwrap_or(Err(Error::DeadlineExceeded(what)));
    result
        .map_err(|e| warn!(error = %crate::error::chain(&e), "wake-up: {what} failed; going on as the first"))
        .ok()
}

/// A host that is not the first of its moment: looks every [`FOLLOW_STEP`] until the
/// buckets are covered (`Ok(None)`), or until [`WAKEUP_WINDOW`] has passed since the
/// first wake-up was written, when it returns the buckets still uncovered.
async fn follow(
    store: &DynamoDbOutboxStore,
    buckets: &[u32],
    options: &RelayOptions,
    deadline: Instant,
    request_id: &str,
    after: Duration,
) -> crate::error::Result<Option<Vec<u32>>> {
    let until = (Instant::now() + WAKEUP_WINDOW.saturating_sub(after)).min(deadline);
    loop {
        let next = Instant::now() + FOLLOW_STEP;
        tokio::time::sleep_until(next.min(deadline)).await;
        let uncovered = look_patiently(store, buckets, options, deadline, request_id)
            .await?
            .uncovered;
        if uncovered.is_empty() {
            return Ok(None);
        }
        if Instant::now() >= until {
            return Ok(Some(uncovered));
        }
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
        alone: None,
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
