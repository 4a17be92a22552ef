//! The state of one run, pure: the buckets the relay holds and what it knows of each,
//! what is due, when the loop wakes next, the batch estimate, the one place that applies
//! a batch's result, and the tally that becomes the [`RunReport`].

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::outcome::{BatchResult, Settled};
use super::report::{RunReport, StopReason};
use crate::error::{Error, Result};
use crate::metrics::RelayMetrics;
use crate::options::{PoisonPolicy, RelayOptions};
use crate::protocol::clock::duration_to_ticks;

/// A bucket this relay holds, and what it knows of it.
#[derive(Debug, Clone)]
pub(super) struct Owned {
    /// The lease's expiry as last written or read (UTC ticks).
    pub(super) expires_at: i64,
    /// The same expiry on the monotonic clock (the write's send time plus the lease
    /// duration), so a wall clock that jumps cannot stretch the time the relay publishes.
    pub(super) valid_until: Instant,
    /// Last sequence number this relay removed since it took the bucket.
    pub(super) last_removed: Option<u64>,
    /// The clock is behind the stored expiry: publish nothing until it passes this.
    pub(super) blocked_until: Option<i64>,
    /// Fetch without probing first (more is known to be waiting).
    pub(super) dirty: bool,
    /// The last batch removed messages: the next look, at the poll interval, fetches
    /// without probing first. Under a steady load the bucket has work again by then
    /// nearly always, and a probe followed by the fetch costs 1.5 read units where the
    /// fetch alone costs 1; when it finds nothing the fetch costs half a unit more than
    /// the probe would have, and the looks after it probe again.
    pub(super) fetch_next: bool,
    /// Next idle probe.
    pub(super) next_probe: Instant,
    /// After a failure, no batch before this.
    pub(super) retry_at: Option<Instant>,
    /// The last publish failed: the next batch is the head alone.
    pub(super) head_only: bool,
    /// Stuck behind an item no relay can publish (a poison item, a topic outside the
    /// allow-list) until an operator moves it: not work a successor could do.
    pub(super) parked: bool,
    /// Published (acknowledged by the brokers) but not confirmed deleted: a delete cut at
    /// its limit, or whose answer was lost, may still have landed. The bucket's next
    /// fetch settles them ([`Settled`]): gone ones are counted published then.
    pub(super) unconfirmed: Vec<u64>,
    /// The poison item the bucket is parked behind (its sequence) and how many batches in
    /// a row found it so.
    pub(super) poison: Option<(u64, u32)>,
    /// Under [`PoisonPolicy::QuarantineAfter`]: the poison item to move to the
    /// dead-letter partition now (its sequence, and why), once its attempts reached the
    /// count.
    pub(super) quarantine: Option<(u64, String)>,
    /// Fetches of this bucket ran into their time limit: the next ones read the batch's
    /// byte share halved this many times (one less after each batch that went through).
    pub(super) fetch_halvings: u32,
}

/// Most halvings of a bucket's fetch share: a 4 MiB share comes down to one item.
const MAX_FETCH_HALVINGS: u32 = 16;

impl Owned {
    pub(super) fn new(expires_at: i64, valid_until: Instant, now: Instant) -> Self {
        Owned {
            expires_at,
            valid_until,
            last_removed: None,
            blocked_until: None,
            dirty: true,
            fetch_next: false,
            next_probe: now,
            retry_at: None,
            head_only: false,
            parked: false,
            unconfirmed: Vec::new(),
            fetch_halvings: 0,
            poison: None,
            quarantine: None,
        }
    }

    /// Whether the relay may publish the bucket now: its lease is valid for more than a
    /// renew interval by both the wall clock and the monotonic clock, and the clock is not
    /// behind the stored expiry.
    pub(super) fn publishable(&self, options: &RelayOptions, now: Instant, now_ticks: i64) -> bool {
        let margin = duration_to_ticks(options.lease_renew_interval);
        let lease_ok = self.expires_at.saturating_sub(now_ticks) > margin
            && self.valid_until > now + options.lease_renew_interval;
        let unblocked = self.blocked_until.is_none_or(|t| now_ticks > t);
        lease_ok && unblocked
    }

    /// Whether a batch of the bucket is due now (publishable, past its retry time, and
    /// dirty or due for a probe).
    pub(super) fn due(&self, options: &RelayOptions, now: Instant, now_ticks: i64) -> bool {
        let retry_ok = self.retry_at.is_none_or(|t| now >= t);
        let wanted = self.dirty || now >= self.next_probe;
        self.publishable(options, now, now_ticks) && retry_ok && wanted
    }

    /// When the bucket wants its next batch (ignoring whether it is publishable).
    fn wants_batch_at(&self, now: Instant) -> Instant {
        match (self.dirty, self.retry_at) {
            (_, Some(r)) => r,
            (true, None) => now,
            (false, None) => self.next_probe,
        }
    }

    /// A batch found the bucket empty: nothing waits, the next look is a probe after the
    /// poll interval.
    fn found_empty(&mut self, options: &RelayOptions, now: Instant) {
        self.parked = false;
        self.poison = None;
        self.dirty = false;
        self.fetch_next = false;
        self.retry_at = None;
        self.next_probe = now + options.poll_interval;
    }

    /// A batch went through, the last removed message being `last`; `more` may wait (the
    /// fetch was full, or not everything fetched was deleted).
    fn went_through(
        &mut self,
        options: &RelayOptions,
        now: Instant,
        last: Option<u64>,
        more: bool,
    ) {
        if last.is_some() {
            self.last_removed = last;
        }
        self.retry_at = None;
        self.head_only = false;
        self.parked = false;
        self.poison = None;
        self.fetch_halvings = self.fetch_halvings.saturating_sub(1);
        self.dirty = more;
        self.fetch_next = last.is_some();
        self.next_probe = now + options.poll_interval;
    }

    /// A batch failed after removing up to `last`: retry after the error backoff, with the
    /// head alone when the publish failed.
    fn failed(
        &mut self,
        options: &RelayOptions,
        now: Instant,
        last: Option<u64>,
        publish_failed: bool,
    ) {
        if last.is_some() {
            self.last_removed = last;
        }
        self.dirty = true;
        self.head_only = publish_failed;
        self.retry_at = Some(now + options.error_backoff);
    }

    /// A fetch ran into its time limit: the next ones read half as much.
    fn fetch_cut(&mut self) {
        self.fetch_halvings = (self.fetch_halvings + 1).min(MAX_FETCH_HALVINGS);
        self.dirty = true;
    }

    /// The bucket is stuck on an item no relay can publish, after removing up to `last`:
    /// parked, the head alone tried again a renew interval later.
    fn park(&mut self, options: &RelayOptions, now: Instant, last: Option<u64>) {
        if last.is_some() {
            self.last_removed = last;
        }
        self.dirty = true;
        self.head_only = true;
        self.parked = true;
        self.retry_at = Some(now + options.lease_renew_interval);
    }

    /// One more batch parked behind the poison item at `sequence` (`None`: its sequence
    /// cannot be read); how many in a row have now, on that item.
    fn poison_attempt(&mut self, sequence: Option<u64>) -> u32 {
        let attempts = match (self.poison, sequence) {
            (Some((seq, n)), Some(s)) if seq == s => n.saturating_add(1),
            _ => 1,
        };
        self.poison = sequence.map(|s| (s, attempts));
        attempts
    }

    /// The poison item at `sequence` was moved to the dead-letter partition: the bucket
    /// goes on past it at once.
    pub(super) fn quarantined(&mut self, sequence: u64) {
        self.last_removed = Some(self.last_removed.map_or(sequence, |l| l.max(sequence)));
        self.parked = false;
        self.poison = None;
        self.quarantine = None;
        self.head_only = false;
        self.retry_at = None;
        self.dirty = true;
    }

    /// A batch failed before publishing: try again after `backoff`.
    fn retry_after(&mut self, backoff: Duration, now: Instant) {
        self.dirty = true;
        self.retry_at = Some(now + backoff);
    }
}

/// Mutable state of one run.
#[derive(Debug, Default)]
pub(super) struct RunState {
    pub(super) owned: BTreeMap<u32, Owned>,
    pub(super) last_acquire: Option<Instant>,
    /// An extra acquisition: right after a peer's announced stop (its `StopsAtUtc`), or
    /// after the error backoff when a round failed.
    pub(super) early_acquire: Option<Instant>,
    /// When this run stops working (deadline minus the stop reserve), announced to peers.
    pub(super) stops_at: Option<Instant>,
    pub(super) last_heartbeat: Option<Instant>,
    /// When the owner of bucket zero last sampled the backlog.
    pub(super) last_backlog_sample: Option<Instant>,
    pub(super) far_standby: bool,
    pub(super) published: u64,
    pub(super) publish_failures: u64,
    /// Publishes the brokers refused for authorization (counted in `publish_failures`).
    pub(super) not_authorized: u64,
    /// Poison items this run moved to the dead-letter partition.
    pub(super) quarantined: u64,
    pub(super) rounds: u64,
    pub(super) max_owned: usize,
    pub(super) leases_acquired: u64,
    pub(super) leases_lost: u64,
    pub(super) errors: u64,
    pub(super) batch_estimate: Option<Duration>,
    /// The last sign of work: the run's start, a batch that fetched messages (or failed),
    /// a commit notification.
    pub(super) last_activity: Option<Instant>,
    /// Whether the last round found live peers holding every bucket this relay does not.
    pub(super) peers_hold_the_rest: bool,
    /// When the run looks for work left and starts its successor (a relay with a successor
    /// and a deadline); `None` once done, or when there is none to start.
    pub(super) successor_at: Option<Instant>,
    /// Whether it started one.
    pub(super) successor_started: bool,
    /// When the run looks for work left once more if it has started no successor (the
    /// end of work minus [`super::SUCCESSOR_LAST_LOOK`]); `None` once done or when none.
    pub(super) successor_last_look: Option<Instant>,
    /// Whether the last attempt at starting the successor failed (never with
    /// `successor_started`: a start that succeeds, or may have, clears it).
    pub(super) successor_failed: bool,
}

impl RunState {
    /// The expected length of one batch: the running estimate (200 ms before the first),
    /// capped at a quarter of the renew interval, so that a stall or one slow batch cannot
    /// make every later batch look too long to start (a skipped batch never updates it).
    pub(super) fn estimate(&self, options: &RelayOptions) -> Duration {
        self.batch_estimate
            .unwrap_or(Duration::from_millis(200))
            .min(options.lease_renew_interval / 4)
    }

    /// Whether an acquisition round is due at `now`: `(regular, early)`.
    pub(super) fn round_due(&self, options: &RelayOptions, now: Instant) -> (bool, bool) {
        let regular = self
            .last_acquire
            .is_none_or(|t| now >= t + options.lease_renew_interval);
        let early = self.early_acquire.is_some_and(|h| now >= h);
        (regular, early)
    }

    /// A standby far back in line writes nothing every other round, while keeping its
    /// heartbeat younger than three quarters of the lease duration.
    pub(super) fn skip_round(&self, options: &RelayOptions, now: Instant) -> bool {
        if !self.far_standby {
            return false;
        }
        let Some(last) = self.last_heartbeat else {
            return false;
        };
        let next_round_age = now.saturating_duration_since(last) + options.lease_renew_interval;
        next_round_age <= options.lease_duration * 3 / 4
    }

    /// When the loop has something to do next: the next round, the earliest batch a
    /// publishable bucket wants, or the end of work, whichever comes first.
    pub(super) fn next_wake(
        &self,
        options: &RelayOptions,
        now: Instant,
        now_ticks: i64,
        work_until: Option<Instant>,
    ) -> Instant {
        let mut wake = self
            .last_acquire
            .map_or(now, |t| t + options.lease_renew_interval);
        if let Some(h) = self.early_acquire {
            wake = wake.min(h);
        }
        // A batch that could not start before the end of work (the estimate would cross
        // it) is no reason to wake: the loop would spin until the end of work.
        let estimate = self.estimate(options);
        for owned in self
            .owned
            .values()
            .filter(|o| o.publishable(options, now, now_ticks))
        {
            let at = owned.wants_batch_at(now);
            if work_until.is_some_and(|w| at + estimate >= w) {
                continue;
            }
            wake = wake.min(at);
        }
        if let (Some(after), Some(last), true) = (
            options.idle_stop,
            self.last_activity,
            self.peers_hold_the_rest,
        ) {
            wake = wake.min(last + after);
        }
        if let Some(s) = self.successor_at {
            wake = wake.min(s);
        }
        if let Some(s) = self.successor_last_look.filter(|_| !self.successor_started) {
            wake = wake.min(s);
        }
        if let Some(w) = work_until {
            wake = wake.min(w);
        }
        wake
    }

    /// The owned buckets with work a successor could do: messages known or likely to be
    /// waiting (dirty, or a failed batch waiting for its retry), unless parked behind an
    /// item no relay can publish.
    pub(super) fn work_left(&self) -> Vec<u32> {
        self.owned
            .iter()
            .filter(|(_, o)| (o.dirty || o.retry_at.is_some()) && !o.parked)
            .map(|(b, _)| *b)
            .collect()
    }

    /// Settles `bucket`'s unconfirmed deletes with what a batch's fetch found (`settled`;
    /// the gone ones count as published now), then adds the batch's own `unconfirmed`.
    pub(super) fn settle(
        &mut self,
        metrics: &dyn RelayMetrics,
        bucket: u32,
        settled: Option<Settled>,
        unconfirmed: Vec<u64>,
    ) {
        let Some(o) = self.owned.get_mut(&bucket) else {
            return;
        };
        if let Some(settled) = settled {
            if !settled.gone.is_empty() {
                let n = settled.gone.len() as u64;
                self.published += n;
                metrics.published(bucket, n);
                info!(
                    bucket,
                    count = n,
                    "published messages whose delete was not confirmed are gone: counted published"
                );
            }
            o.unconfirmed = settled.unknown;
        }
        o.unconfirmed.extend(unconfirmed);
    }

    /// Applies one bucket's batch result (`took` long) at `now`; a misconfiguration is
    /// handed back for the loop to fault with.
    pub(super) fn apply(
        &mut self,
        options: &RelayOptions,
        metrics: &dyn RelayMetrics,
        bucket: u32,
        result: Result<BatchResult>,
        took: Duration,
        now: Instant,
    ) -> Option<Error> {
        let o = self.owned.get_mut(&bucket)?;
        if !matches!(result, Ok(BatchResult::Idle | BatchResult::Skipped)) {
            self.last_activity = Some(now);
        }
        match result {
            Ok(BatchResult::Idle) => {
                // An empty bucket has no waiting head: its age is zero, so the stuck-outbox
                // alarm sees the outbox move again once a stuck bucket is cleared.
                metrics.head_age(bucket, Duration::ZERO);
                o.found_empty(options, now);
            }
            Ok(BatchResult::Done {
                fetched,
                deleted,
                last,
                full,
            }) => {
                self.published += deleted as u64;
                metrics.published(bucket, deleted as u64);
                metrics.batch_duration(bucket, took);
                self.batch_estimate = Some(smoothed_estimate(self.batch_estimate, took, options));
                o.went_through(options, now, last, full || deleted < fetched);
            }
            Ok(BatchResult::Failed {
                deleted,
                last,
                publish_failed,
                not_authorized,
            }) => {
                self.published += deleted as u64;
                metrics.published(bucket, deleted as u64);
                if let Some(denied) = &not_authorized {
                    // Transient like any failed publish: no poison count, nothing parked.
                    self.publish_failures += 1;
                    self.not_authorized += 1;
                    metrics.publish_not_authorized(bucket, denied);
                } else if publish_failed {
                    self.publish_failures += 1;
                    metrics.publish_failed(bucket, false);
                } else {
                    // The publish went through; its delete did not (all of it): an error
                    // the loop recovers from, not a failed publish.
                    self.errors += 1;
                }
                o.failed(options, now, last, publish_failed);
            }
            Ok(BatchResult::Skipped) => {}
            Ok(BatchResult::FetchCut) => {
                o.fetch_cut();
                warn!(
                    bucket,
                    halvings = o.fetch_halvings,
                    "a fetch ran into the batch's time limit: the next fetches of this bucket read half as much"
                );
            }
            Ok(BatchResult::Poison {
                error,
                at,
                deleted,
                last,
            }) => {
                self.published += deleted as u64;
                metrics.published(bucket, deleted as u64);
                let sequence = poison_sequence(&error, at.as_ref());
                let at_once = unpublishable(&error);
                log_poison(bucket, &error, at, options.poison_policy, at_once);
                metrics.poison_item(bucket);
                metrics.publish_failed(bucket, matches!(error, Error::KafkaRejected { .. }));
                self.publish_failures += 1;
                o.park(options, now, last);
                let attempts = o.poison_attempt(sequence);
                if let (Some(rejection), Some(seq)) = (at_once, sequence) {
                    // Unpublishable as written, whoever wrote it: moved aside at once under
                    // every policy, so that no writer can stop its bucket for the others.
                    o.quarantine = Some((
                        seq,
                        format!(
                            "unpublishable ({rejection}): {} (relay {}, moved at once under every poison policy)",
                            crate::error::chain(&error),
                            options.relay_id
                        ),
                    ));
                } else if let (PoisonPolicy::QuarantineAfter(n), Some(seq)) =
                    (options.poison_policy, sequence)
                {
                    if attempts >= n {
                        o.quarantine = Some((
                            seq,
                            format!(
                                "{} (relay {}, after {attempts} attempt(s), {})",
                                crate::error::chain(&error),
                                options.relay_id,
                                options.poison_policy
                            ),
                        ));
                    }
                }
            }
            Err(e @ Error::Misconfiguration { .. }) => return Some(e),
            Err(e) => {
                warn!(bucket, error = %crate::error::chain(&e), "batch failed");
                self.errors += 1;
                o.retry_after(options.error_backoff, now);
            }
        }
        None
    }

    /// Whether the run may stop for idleness at `now`: an idle stop is set, the relay has
    /// run a round, nothing happened for that long, every bucket it owns has been checked
    /// and found empty (none dirty, none waiting for a retry) or is parked behind an item
    /// no relay can publish, and live peers hold the rest. A parked bucket is not a reason
    /// to stay: the next wake-up retries its head and reports it again.
    pub(super) fn idle(&self, options: &RelayOptions, now: Instant) -> bool {
        let Some(after) = options.idle_stop else {
            return false;
        };
        self.rounds > 0
            && self.peers_hold_the_rest
            && self.last_activity.is_none_or(|t| now >= t + after)
            && self
                .owned
                .values()
                .all(|o| o.parked || (!o.dirty && o.retry_at.is_none()))
    }

    /// The report of the run, from the tally.
    pub(super) fn report(
        &self,
        relay_id: &str,
        refused: BTreeMap<&'static str, u64>,
        stop_reason: StopReason,
        released: bool,
    ) -> RunReport {
        RunReport {
            relay_id: relay_id.to_owned(),
            published: self.published,
            publish_failures: self.publish_failures,
            not_authorized: self.not_authorized,
            quarantined: self.quarantined,
            rounds: self.rounds,
            max_owned: self.max_owned,
            owned_at_end: self.owned.len(),
            leases_acquired: self.leases_acquired,
            leases_lost: self.leases_lost,
            refused,
            errors: self.errors,
            stop_reason,
            released,
            successor_started: self.successor_started,
            successor_failed: self.successor_failed,
        }
    }
}

/// The running batch estimate after a batch that went through in `took` (capped at a
/// quarter of the renew interval): three parts the old estimate, one part the new batch.
fn smoothed_estimate(
    estimate: Option<Duration>,
    took: Duration,
    options: &RelayOptions,
) -> Duration {
    let took = took.min(options.lease_renew_interval / 4);
    match estimate {
        Some(e) => (e * 3 + took) / 4,
        None => took,
    }
}

/// The sequence of the poison item a batch stopped at: the message it names, or the sort
/// key of the unreadable item.
fn poison_sequence(error: &Error, at: Option<&(String, u64)>) -> Option<u64> {
    match (at, error) {
        (Some((_, seq)), _) => Some(*seq),
        (None, Error::Corrupt { sk, .. }) => crate::protocol::schema::parse_message_sk(sk),
        (None, _) => None,
    }
}

/// Whether the broker refused the record for what the record itself says, so that no
/// retry, grant or operator action can publish it as written: an explicit partition the
/// topic does not have, or a size above the topic's `max.message.bytes`. Such a record is
/// moved to the dead-letter partition at once under every poison policy (a writer, through
/// the enqueue API or the library, cannot stop its bucket for the others); the rejection.
pub(super) fn unpublishable(error: &Error) -> Option<crate::error::Rejection> {
    use crate::error::Rejection;
    match error {
        Error::KafkaRejected {
            reason: reason @ (Rejection::UnknownPartition | Rejection::TooLarge),
            ..
        } => Some(*reason),
        _ => None,
    }
}

/// The log line of a bucket stuck on an item it cannot publish (`at`: its id and sequence,
/// when it could be read; `at_once`: the rejection that moves it aside at once).
fn log_poison(
    bucket: u32,
    error: &Error,
    at: Option<(String, u64)>,
    policy: PoisonPolicy,
    at_once: Option<crate::error::Rejection>,
) {
    let (message_id, sequence) = at.map_or((None, None), |(id, seq)| (Some(id), Some(seq)));
    let what = match policy {
        _ if at_once.is_some() => {
            "an unpublishable item heads its bucket; the relay moves it to the dead-letter partition now"
        }
        PoisonPolicy::Block => {
            "bucket stuck on an item it cannot publish; quarantine it with `outboxctl quarantine`"
        }
        PoisonPolicy::QuarantineAfter(_) => {
            "bucket stuck on an item it cannot publish; the relay quarantines it after the attempts OUTBOX_POISON_POLICY allows"
        }
    };
    error!(
        bucket,
        message_id,
        sequence,
        error = %crate::error::chain(error),
        "{what}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::NoMetrics;

    const MS: Duration = Duration::from_millis(1);

    fn options() -> RelayOptions {
        RelayOptions {
            poll_interval: 100 * MS,
            error_backoff: 200 * MS,
            lease_duration: 3000 * MS,
            lease_renew_interval: 1000 * MS,
            ..RelayOptions::default()
        }
    }

    fn stored(sequence: u64) -> crate::message::StoredMessage {
        crate::message::StoredMessage {
            bucket: 3,
            sequence,
            message: crate::message::OutboxMessage::new("t", 4),
        }
    }

    /// Published messages whose delete was not confirmed: the next fetch from the head
    /// counts the ones it no longer finds as published (once), forgets the ones it finds
    /// (they go out again and count then), and keeps the ones beyond what it read.
    #[test]
    fn unconfirmed_deletes_are_counted_when_a_fetch_finds_them_gone() {
        let fetched: Vec<_> = [7, 8, 10].map(stored).to_vec();
        assert_eq!(
            Settled::of(&[5, 6, 8, 9, 12], &fetched),
            Settled {
                gone: vec![5, 6, 9],
                unknown: vec![12],
            }
        );
        assert_eq!(
            Settled::of(&[5, 6], &[]),
            Settled {
                gone: vec![5, 6],
                unknown: vec![],
            }
        );

        let o = options();
        let m = NoMetrics;
        let now = Instant::now();
        let mut s = holding(3, now, 0);
        // A publish that went through and a delete that did not (cut at its limit): not a
        // failed publish, an error recovered from; the sequences wait to be settled.
        let cut = BatchResult::Failed {
            deleted: 0,
            last: None,
            publish_failed: false,
            not_authorized: None,
        };
        s.settle(&m, 3, None, vec![5, 6]);
        s.apply(&o, &m, 3, Ok(cut), 40 * MS, now);
        assert_eq!((s.published, s.publish_failures, s.errors), (0, 0, 1));
        assert_eq!(s.owned[&3].unconfirmed, [5, 6]);
        // The next fetch finds the bucket empty: both landed.
        s.settle(&m, 3, Some(Settled::of(&[5, 6], &[])), vec![]);
        s.apply(&o, &m, 3, Ok(BatchResult::Idle), 40 * MS, now);
        assert_eq!(s.published, 2);
        assert!(s.owned[&3].unconfirmed.is_empty());
        // Settled once: a later fetch counts nothing more.
        s.settle(&m, 3, Some(Settled::of(&[], &[])), vec![]);
        assert_eq!(s.published, 2);
    }

    /// A state holding `bucket` with a lease valid for the whole lease duration from `now`.
    fn holding(bucket: u32, now: Instant, now_ticks: i64) -> RunState {
        let o = options();
        let mut s = RunState {
            last_acquire: Some(now),
            ..RunState::default()
        };
        s.owned.insert(
            bucket,
            Owned::new(
                now_ticks + duration_to_ticks(o.lease_duration),
                now + o.lease_duration,
                now,
            ),
        );
        s
    }

    #[test]
    fn a_bucket_is_publishable_while_its_lease_has_more_than_a_renew_interval() {
        let o = options();
        let now = Instant::now();
        let s = holding(0, now, 1_000_000_000);
        let b = &s.owned[&0];
        assert!(b.publishable(&o, now, 1_000_000_000));
        // By the monotonic clock: 2 s in, one renew interval is left.
        assert!(!b.publishable(&o, now + 2000 * MS, 1_000_000_000));
        // By the wall clock, even when the monotonic clock says otherwise.
        let late = 1_000_000_000 + duration_to_ticks(2000 * MS);
        assert!(!b.publishable(&o, now, late));
        // Blocked until the clock passes the stored expiry.
        let mut blocked = b.clone();
        blocked.blocked_until = Some(1_000_000_000 + 5);
        assert!(!blocked.publishable(&o, now, 1_000_000_000));
        assert!(blocked.publishable(&o, now, 1_000_000_006));
    }

    #[test]
    fn the_loop_wakes_for_the_earliest_of_round_batch_and_end_of_work() {
        let o = options();
        let now = Instant::now();
        let ticks = 1_000_000_000;
        let mut s = holding(0, now, ticks);
        // Dirty: now.
        assert_eq!(s.next_wake(&o, now, ticks, None), now);
        // ...but not when a batch could no longer end before the end of work (the
        // estimate, 200 ms, would cross it): the end of work, no busy loop until then.
        assert_eq!(
            s.next_wake(&o, now, ticks, Some(now + 150 * MS)),
            now + 150 * MS
        );
        // Idle: its next probe.
        s.owned.get_mut(&0).unwrap().dirty = false;
        s.owned.get_mut(&0).unwrap().next_probe = now + 100 * MS;
        assert_eq!(s.next_wake(&o, now, ticks, None), now + 100 * MS);
        // Retrying: its retry time, even when dirty.
        let b = s.owned.get_mut(&0).unwrap();
        b.dirty = true;
        b.retry_at = Some(now + 300 * MS);
        assert_eq!(s.next_wake(&o, now, ticks, None), now + 300 * MS);
        // The end of work comes first.
        assert_eq!(
            s.next_wake(&o, now, ticks, Some(now + 50 * MS)),
            now + 50 * MS
        );
        // A bucket that is not publishable wants nothing: the next round.
        s.owned.get_mut(&0).unwrap().blocked_until = Some(i64::MAX);
        assert_eq!(
            s.next_wake(&o, now, ticks, None),
            now + o.lease_renew_interval
        );
        // An early acquisition before it.
        s.early_acquire = Some(now + 400 * MS);
        assert_eq!(s.next_wake(&o, now, ticks, None), now + 400 * MS);
    }

    #[test]
    fn a_cut_fetch_halves_the_buckets_next_fetches_and_a_batch_through_doubles_them_back() {
        let o = options();
        let now = Instant::now();
        let mut s = holding(3, now, 1_000_000_000);
        let m = NoMetrics;
        for expected in 1..=3 {
            s.apply(&o, &m, 3, Ok(BatchResult::FetchCut), 40 * MS, now);
            assert_eq!(s.owned[&3].fetch_halvings, expected);
            assert!(s.owned[&3].dirty, "the backlog is still there");
        }
        assert_eq!(
            s.last_activity,
            Some(now),
            "a cut fetch is work, not idleness"
        );
        for _ in 0..40 {
            s.apply(&o, &m, 3, Ok(BatchResult::FetchCut), 40 * MS, now);
        }
        assert_eq!(s.owned[&3].fetch_halvings, MAX_FETCH_HALVINGS);
        let done = || BatchResult::Done {
            fetched: 1,
            deleted: 1,
            last: Some(7),
            full: true,
        };
        s.apply(&o, &m, 3, Ok(done()), 40 * MS, now);
        assert_eq!(s.owned[&3].fetch_halvings, MAX_FETCH_HALVINGS - 1);
        for _ in 0..40 {
            s.apply(&o, &m, 3, Ok(done()), 40 * MS, now);
        }
        assert_eq!(s.owned[&3].fetch_halvings, 0);
    }

    #[test]
    fn batch_results_update_the_bucket_and_the_tally() {
        let o = options();
        let now = Instant::now();
        let mut s = holding(3, now, 1_000_000_000);
        let m = NoMetrics;
        let done = BatchResult::Done {
            fetched: 10,
            deleted: 10,
            last: Some(41),
            full: false,
        };
        assert!(s.apply(&o, &m, 3, Ok(done), 40 * MS, now).is_none());
        let b = &s.owned[&3];
        assert_eq!(
            (b.dirty, b.last_removed, b.retry_at),
            (false, Some(41), None)
        );
        assert_eq!(b.next_probe, now + o.poll_interval);
        assert!(
            b.fetch_next,
            "it removed messages: the next look fetches at once"
        );
        assert_eq!((s.published, s.batch_estimate), (10, Some(40 * MS)));
        s.apply(&o, &m, 3, Ok(BatchResult::Idle), 40 * MS, now);
        assert!(!s.owned[&3].fetch_next, "found empty: the next look probes");

        // A partial delete leaves it dirty; a full batch too.
        let partial = BatchResult::Done {
            fetched: 10,
            deleted: 4,
            last: Some(45),
            full: false,
        };
        s.apply(&o, &m, 3, Ok(partial), 40 * MS, now);
        assert!(s.owned[&3].dirty);

        let failed = BatchResult::Failed {
            deleted: 2,
            last: Some(47),
            publish_failed: true,
            not_authorized: None,
        };
        s.apply(&o, &m, 3, Ok(failed), 40 * MS, now);
        let b = &s.owned[&3];
        assert_eq!(
            (b.last_removed, b.retry_at),
            (Some(47), Some(now + o.error_backoff))
        );
        // After a failed publish the head goes out alone.
        assert!(b.head_only);
        assert_eq!((s.published, s.publish_failures), (16, 1));

        let poison = BatchResult::Poison {
            error: Error::misconfigured("bad"),
            at: None,
            deleted: 0,
            last: None,
        };
        s.apply(&o, &m, 3, Ok(poison), 40 * MS, now);
        let b = &s.owned[&3];
        assert_eq!(
            (b.last_removed, b.retry_at),
            (Some(47), Some(now + o.lease_renew_interval))
        );

        s.apply(&o, &m, 3, Err(Error::DeadlineExceeded("x")), 40 * MS, now);
        assert_eq!(s.errors, 1);
        let fault = s.apply(&o, &m, 3, Err(Error::misconfigured("m")), 40 * MS, now);
        assert!(matches!(fault, Some(Error::Misconfiguration { .. })));
        // A bucket lost meanwhile: nothing applies.
        assert!(s.apply(&o, &m, 9, Ok(BatchResult::Idle), MS, now).is_none());
    }

    #[test]
    fn a_poison_head_is_due_for_quarantine_after_the_policys_attempts_on_the_same_item() {
        let poison = |seq: u64| BatchResult::Poison {
            error: Error::InvalidMessage {
                field: "topic".into(),
                rule: "not allowed".into(),
            },
            at: Some(("id".into(), seq)),
            deleted: 0,
            last: None,
        };
        let now = Instant::now();
        let m = NoMetrics;
        // Block (the default): never due.
        let o = options();
        let mut s = holding(3, now, 1_000_000_000);
        for _ in 0..5 {
            s.apply(&o, &m, 3, Ok(poison(9)), MS, now);
        }
        assert_eq!(s.owned[&3].quarantine, None);
        assert_eq!(s.owned[&3].poison, Some((9, 5)));

        let o = RelayOptions {
            poison_policy: PoisonPolicy::QuarantineAfter(3),
            ..options()
        };
        let mut s = holding(3, now, 1_000_000_000);
        s.apply(&o, &m, 3, Ok(poison(9)), MS, now);
        s.apply(&o, &m, 3, Ok(poison(9)), MS, now);
        assert_eq!(s.owned[&3].quarantine, None);
        // Another item: counted from one again.
        s.apply(&o, &m, 3, Ok(poison(10)), MS, now);
        s.apply(&o, &m, 3, Ok(poison(10)), MS, now);
        assert_eq!(s.owned[&3].quarantine, None);
        s.apply(&o, &m, 3, Ok(poison(10)), MS, now);
        let (seq, why) = s.owned[&3].quarantine.clone().unwrap();
        assert_eq!(seq, 10);
        assert!(
            why.contains("not allowed") && why.contains("after 3 attempt(s), quarantine-after=3"),
            "{why}"
        );
        // Moved: the bucket goes on at once past it.
        let b = s.owned.get_mut(&3).unwrap();
        b.quarantined(10);
        assert_eq!(
            (b.parked, b.dirty, b.retry_at, b.poison, b.last_removed),
            (false, true, None, None, Some(10))
        );
        // An unreadable head is named by its sort key.
        let corrupt = BatchResult::Poison {
            error: Error::Corrupt {
                pk: "OUTBOX#MESSAGES#3".into(),
                sk: "0000000000000000011".into(),
                reason: "MessageId is missing".into(),
                source: None,
            },
            at: None,
            deleted: 0,
            last: None,
        };
        let o1 = RelayOptions {
            poison_policy: PoisonPolicy::QuarantineAfter(1),
            ..options()
        };
        s.apply(&o1, &m, 3, Ok(corrupt), MS, now);
        assert_eq!(s.owned[&3].quarantine.as_ref().map(|q| q.0), Some(11));
        // A batch that goes through forgets the count.
        let mut s = holding(3, now, 1_000_000_000);
        s.apply(&o, &m, 3, Ok(poison(9)), MS, now);
        s.apply(&o, &m, 3, Ok(BatchResult::Idle), MS, now);
        assert_eq!(s.owned[&3].poison, None);
    }

    #[test]
    fn an_unknown_partition_or_a_record_too_large_is_due_at_once_under_every_policy() {
        use crate::error::Rejection;
        let rejected = |reason: Rejection| BatchResult::Poison {
            error: Error::KafkaRejected {
                topic: "orders".into(),
                reason,
                source: None,
            },
            at: Some(("id".into(), 9)),
            deleted: 0,
            last: None,
        };
        let now = Instant::now();
        let m = NoMetrics;
        for policy in [PoisonPolicy::Block, PoisonPolicy::QuarantineAfter(1000)] {
            let o = RelayOptions {
                poison_policy: policy,
                ..options()
            };
            for (reason, named) in [
                (
                    Rejection::UnknownPartition,
                    "unpublishable (unknown partition)",
                ),
                (Rejection::TooLarge, "unpublishable (record too large)"),
            ] {
                let mut s = holding(3, now, 1_000_000_000);
                s.apply(&o, &m, 3, Ok(rejected(reason)), MS, now);
                let (seq, why) = s.owned[&3].quarantine.clone().expect("due at once");
                assert_eq!(seq, 9);
                assert!(why.starts_with(named), "{why}");
            }
            // what an operator can fix (a missing topic, a broker's policy) still parks
            for reason in [Rejection::UnknownTopic, Rejection::InvalidRecord] {
                let mut s = holding(3, now, 1_000_000_000);
                s.apply(&o, &m, 3, Ok(rejected(reason)), MS, now);
                assert_eq!(s.owned[&3].quarantine, None, "{reason:?} under {policy}");
                assert!(s.owned[&3].parked);
            }
        }
    }

    /// A publish the brokers refused for authorization is a transient failure under every
    /// poison policy: the bucket retries after the error backoff (the head alone), stays
    /// unparked (work a successor could do), counts no poison attempt and is never due for
    /// quarantine however often it happens; the metrics hear who was refused what, once
    /// per failure, instead of a plain failed publish. After the grant the bucket goes on.
    #[test]
    fn a_refused_authorization_is_retried_under_every_policy_and_never_poison() {
        use crate::error::{AuthorizationFailure, NotAuthorized};

        #[derive(Debug, Default)]
        struct Seen {
            denied: std::sync::Mutex<Vec<(u32, NotAuthorized)>>,
            other: std::sync::atomic::AtomicU64,
        }
        impl RelayMetrics for Seen {
            fn publish_not_authorized(&self, bucket: u32, denied: &NotAuthorized) {
                self.denied.lock().unwrap().push((bucket, denied.clone()));
            }
            fn publish_failed(&self, _bucket: u32, _permanent: bool) {
                self.other.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            fn poison_item(&self, _bucket: u32) {
                self.other.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            fn quarantined(&self, _bucket: u32) {
                self.other.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let denied = NotAuthorized {
            topic: "orders".into(),
            principal: "User:nogrant".into(),
            operation: "WRITE",
            failure: AuthorizationFailure::Topic,
        };
        let refused = || BatchResult::Failed {
            deleted: 0,
            last: None,
            publish_failed: true,
            not_authorized: Some(denied.clone()),
        };
        for policy in [PoisonPolicy::Block, PoisonPolicy::QuarantineAfter(1)] {
            let o = RelayOptions {
                poison_policy: policy,
                ..options()
            };
            let m = Seen::default();
            let now = Instant::now();
            let mut s = holding(3, now, 1_000_000_000);
            for _ in 0..5 {
                assert!(s.apply(&o, &m, 3, Ok(refused()), MS, now).is_none());
            }
            let b = &s.owned[&3];
            assert_eq!(
                (b.parked, b.poison, b.quarantine.clone(), b.head_only),
                (false, None, None, true),
                "{policy}"
            );
            assert_eq!(b.retry_at, Some(now + o.error_backoff), "{policy}");
            assert_eq!(
                (s.publish_failures, s.not_authorized, s.quarantined),
                (5, 5, 0),
                "{policy}"
            );
            assert_eq!(s.work_left(), [3], "{policy}: work a successor could do");
            assert!(
                !s.idle(&o, now + 60_000 * MS),
                "{policy}: a retry is pending"
            );
            assert_eq!(*m.denied.lock().unwrap(), vec![(3, denied.clone()); 5]);
            assert_eq!(m.other.load(std::sync::atomic::Ordering::SeqCst), 0);
            // Granted: the next batch goes through and the bucket goes on.
            let done = BatchResult::Done {
                fetched: 1,
                deleted: 1,
                last: Some(1),
                full: false,
            };
            s.apply(&o, &m, 3, Ok(done), MS, now);
            let b = &s.owned[&3];
            assert_eq!(
                (b.head_only, b.retry_at, b.last_removed),
                (false, None, Some(1))
            );
        }
    }

    #[test]
    fn idle_only_after_the_idle_time_with_everything_checked_and_the_rest_held() {
        let mut o = options();
        let now = Instant::now();
        let mut s = holding(0, now, 1_000_000_000);
        s.rounds = 1;
        s.peers_hold_the_rest = true;
        s.last_activity = Some(now);
        assert!(!s.idle(&o, now + 60_000 * MS), "no idle stop configured");
        o.idle_stop = Some(2000 * MS);
        // Dirty (claimed, not checked yet).
        assert!(!s.idle(&o, now + 3000 * MS));
        s.apply(&o, &NoMetrics, 0, Ok(BatchResult::Idle), MS, now);
        assert!(!s.idle(&o, now + 1999 * MS));
        assert!(s.idle(&o, now + 2000 * MS));
        // A batch with messages is activity.
        let done = BatchResult::Done {
            fetched: 1,
            deleted: 1,
            last: Some(1),
            full: false,
        };
        s.apply(&o, &NoMetrics, 0, Ok(done), MS, now + 1000 * MS);
        assert!(!s.idle(&o, now + 2500 * MS));
        assert!(s.idle(&o, now + 3000 * MS));
        // A retry pending is work.
        s.owned.get_mut(&0).unwrap().retry_at = Some(now);
        assert!(!s.idle(&o, now + 9000 * MS));
        s.owned.get_mut(&0).unwrap().retry_at = None;
        // A bucket parked behind an item no relay can publish is no reason to stay.
        let parked = s.owned.get_mut(&0).unwrap();
        (parked.retry_at, parked.dirty, parked.parked) = (Some(now), true, true);
        assert!(s.idle(&o, now + 9000 * MS));
        s.owned.get_mut(&0).unwrap().parked = false;
        assert!(!s.idle(&o, now + 9000 * MS));
        let unparked = s.owned.get_mut(&0).unwrap();
        (unparked.retry_at, unparked.dirty) = (None, false);
        // Buckets nobody live holds: the relay will claim them.
        s.peers_hold_the_rest = false;
        assert!(!s.idle(&o, now + 9000 * MS));
        // Owning nothing while live peers hold everything is idle too.
        s.owned.clear();
        s.peers_hold_the_rest = true;
        assert!(s.idle(&o, now + 9000 * MS));
    }

    #[test]
    fn the_estimate_is_capped_and_smoothed() {
        let o = options();
        let mut s = RunState::default();
        assert_eq!(s.estimate(&o), 200 * MS);
        s.batch_estimate = Some(5000 * MS);
        assert_eq!(s.estimate(&o), o.lease_renew_interval / 4);
    }

    #[test]
    fn a_far_standby_skips_every_other_round_while_its_heartbeat_stays_young() {
        let o = options();
        let now = Instant::now();
        let mut s = RunState {
            far_standby: true,
            last_heartbeat: Some(now),
            ..RunState::default()
        };
        // Heartbeat 1 s old at the next round (of a 3 s lease): skip.
        assert!(s.skip_round(&o, now));
        // 1.5 s old now: at the next round 2.5 s > 2.25 s: do not skip.
        assert!(!s.skip_round(&o, now + 1500 * MS));
        s.far_standby = false;
        assert!(!s.skip_round(&o, now));
    }
}
