//! The relay loop: rounds of acquire / probe / fetch / publish / delete inside a deadline
//! or until a shutdown signal, then the graceful stop.
//!
//! [`Relay::run_until`] and [`Relay::run_until_shutdown`] share one code path. The loop
//! never starts a batch that cannot finish before the deadline minus the stop reserve; the
//! stop then stamps the heartbeat as stopped and releases every lease. A stop that misses
//! its deadline (a batch still in flight) releases nothing: it may still be publishing,
//! so its leases lapse as after a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::{debug, error, info, instrument, warn};

use crate::clock::{duration_to_ticks, ticks_to_duration};
use crate::coordination::Coordination;
use crate::error::{Error, Result};
use crate::metrics::{NoMetrics, RelayMetrics};
use crate::notification::LocalNotifier;
use crate::options::RelayOptions;
use crate::plan::{self, PlanInput};
use crate::publish::{PublishOutcome, Publisher};
use crate::store::{DynamoDbOutboxStore, WriteKind};

/// Default time kept free before the deadline for the graceful stop.
pub const DEFAULT_STOP_RESERVE: Duration = Duration::from_secs(2);
/// Delay after a peer's announced stop before the extra acquisition, and between retries.
pub const HANDOVER_STEP: Duration = Duration::from_millis(300);
/// Pause between a relay's first heartbeat and its first read of the coordination partition.
pub const JOIN_DELAY: Duration = Duration::from_millis(300);
/// How often the owner of bucket zero samples the backlog (counts are billed per item
/// counted, so not every round; never in the first round, before anything is published).
pub const BACKLOG_SAMPLE_INTERVAL: Duration = Duration::from_secs(60);
/// How long past a peer's announced stop the relay keeps looking for its released buckets.
pub const HANDOVER_WATCH: Duration = Duration::from_secs(5);

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The deadline arrived; the relay stopped gracefully.
    Deadline,
    /// The shutdown signal fired; the relay stopped gracefully.
    Shutdown,
    /// Work was still in flight at the hard deadline: nothing was released.
    DeadlineMissed,
    /// The relay faulted (misconfiguration); it stopped gracefully, then returned the error.
    Fault(String),
}

impl StopReason {
    /// Short lowercase name for logs and summaries.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Deadline => "deadline",
            StopReason::Shutdown => "shutdown",
            StopReason::DeadlineMissed => "deadline_missed",
            StopReason::Fault(_) => "fault",
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The relay's id.
    pub relay_id: String,
    /// Messages published and deleted.
    pub published: u64,
    /// Publish attempts that failed.
    pub publish_failures: u64,
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
}

impl RunReport {
    /// Refused conditional writes of every kind.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// A bucket this relay holds, and what it knows of it.
#[derive(Debug, Clone)]
struct Owned {
    /// The lease's expiry as last written or read (UTC ticks).
    expires_at: i64,
    /// The same expiry on the monotonic clock (the write's send time plus the lease
    /// duration), so a wall clock that jumps cannot stretch the time the relay publishes.
    valid_until: Instant,
    /// Last sequence number this relay removed since it took the bucket.
    last_removed: Option<u64>,
    /// The clock is behind the stored expiry: publish nothing until it passes this.
    blocked_until: Option<i64>,
    /// Fetch without probing first (more is known to be waiting).
    dirty: bool,
    /// Next idle probe.
    next_probe: Instant,
    /// After a failure, no batch before this.
    retry_at: Option<Instant>,
}

impl Owned {
    fn new(expires_at: i64, valid_until: Instant, now: Instant) -> Self {
        Owned {
            expires_at,
            valid_until,
            last_removed: None,
            blocked_until: None,
            dirty: true,
            next_probe: now,
            retry_at: None,
        }
    }
}

/// What one bucket's batch did.
#[derive(Debug)]
enum BatchResult {
    /// Nothing waiting (probe or fetch found nothing).
    Idle,
    /// Not started (or stopped before publishing): too close to the lease's end or the
    /// deadline. Nothing changed.
    Skipped,
    /// Published and deleted `deleted` of `fetched` messages, the last removed one being `last`.
    Done {
        fetched: usize,
        deleted: usize,
        last: Option<u64>,
        full: bool,
    },
    /// A retryable failure; try again after the backoff.
    Failed { deleted: usize, last: Option<u64> },
    /// The bucket is stuck on an unreadable item or a record the broker rejects, after
    /// `deleted` messages went through.
    Poison {
        reason: String,
        deleted: usize,
        last: Option<u64>,
    },
}

/// The relay: owns a share of the buckets and moves their messages to Kafka.
pub struct Relay<P: Publisher> {
    store: DynamoDbOutboxStore,
    publisher: Arc<P>,
    options: RelayOptions,
    metrics: Arc<dyn RelayMetrics>,
    notifier: Option<Arc<LocalNotifier>>,
    stop_reserve: Duration,
}

impl<P: Publisher> std::fmt::Debug for Relay<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("relay_id", &self.options.relay_id)
            .field("table", &self.store.options().table_name)
            .field("bucket_count", &self.options.bucket_count)
            .finish_non_exhaustive()
    }
}

/// Mutable state of one run.
#[derive(Debug, Default)]
struct RunState {
    owned: BTreeMap<u32, Owned>,
    last_acquire: Option<Instant>,
    /// An extra acquisition: right after a peer's announced stop (its `StopsAtUtc`), or
    /// after the error backoff when a round failed.
    early_acquire: Option<Instant>,
    /// When this run stops working (deadline minus the stop reserve), announced to peers.
    stops_at: Option<Instant>,
    last_heartbeat: Option<Instant>,
    /// When the owner of bucket zero last sampled the backlog.
    last_backlog_sample: Option<Instant>,
    far_standby: bool,
    report_published: u64,
    publish_failures: u64,
    rounds: u64,
    max_owned: usize,
    leases_acquired: u64,
    leases_lost: u64,
    errors: u64,
    batch_estimate: Option<Duration>,
}

impl<P: Publisher> Relay<P> {
    /// A relay over `store` publishing with `publisher`. Faults with
    /// [`Error::Misconfiguration`] when the relay's bucket count differs from the store's.
    pub fn new(
        store: DynamoDbOutboxStore,
        publisher: Arc<P>,
        options: RelayOptions,
    ) -> Result<Self> {
        options.validate()?;
        if options.bucket_count != store.options().bucket_count {
            return Err(Error::Misconfiguration(format!(
                "the relay's bucket count is {}, the store's is {}: they must be equal",
                options.bucket_count,
                store.options().bucket_count
            )));
        }
        Ok(Relay {
            store,
            publisher,
            options,
            metrics: Arc::new(NoMetrics),
            notifier: None,
            stop_reserve: DEFAULT_STOP_RESERVE,
        })
    }

    /// Sets the metrics sink.
    pub fn with_metrics(mut self, metrics: Arc<dyn RelayMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Wakes the relay on commits notified through `notifier` (give the same notifier to
    /// the writer with [`crate::DynamoDbOutboxWriter::with_notifier`]).
    pub fn with_notifier(mut self, notifier: Arc<LocalNotifier>) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Sets the time kept free before the deadline for the graceful stop.
    pub fn with_stop_reserve(mut self, reserve: Duration) -> Self {
        self.stop_reserve = reserve;
        self
    }

    /// The relay's options.
    pub fn options(&self) -> &RelayOptions {
        &self.options
    }

    /// The relay's store.
    pub fn store(&self) -> &DynamoDbOutboxStore {
        &self.store
    }

    /// Runs until `deadline` (everything, the graceful stop included, ends by then).
    pub async fn run_until(&self, deadline: Instant) -> Result<RunReport> {
        self.run(Some(deadline), None, Duration::ZERO).await
    }

    /// Runs until `signal` completes, then stops gracefully within `grace`.
    pub async fn run_until_shutdown<F>(&self, signal: F, grace: Duration) -> Result<RunReport>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.run(None, Some(Box::pin(signal)), grace).await
    }

    /// Runs until `deadline` or `signal`, whichever comes first.
    #[instrument(skip_all, fields(relay_id = %self.options.relay_id))]
    pub async fn run(
        &self,
        deadline: Option<Instant>,
        mut signal: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        grace: Duration,
    ) -> Result<RunReport> {
        let refused_before = self.refused_snapshot();
        let mut state = RunState {
            stops_at: deadline.map(|d| {
                d.checked_sub(self.stop_reserve)
                    .unwrap_or_else(Instant::now)
            }),
            ..RunState::default()
        };
        let mut hard_deadline = deadline;
        let mut reason = None;
        info!(bucket_count = self.options.bucket_count, "relay starting");
        loop {
            let now = Instant::now();
            let work_until = hard_deadline.map(|d| d.checked_sub(self.stop_reserve).unwrap_or(now));
            if reason.is_some() {
                break;
            }
            if work_until.is_some_and(|w| now >= w) {
                reason = Some(StopReason::Deadline);
                break;
            }
            let outcome = {
                let step = self.step(&mut state, work_until);
                let mut step = std::pin::pin!(step);
                loop {
                    let bounded = async {
                        match hard_deadline {
                            Some(d) => tokio::time::timeout_at(d, &mut step).await.ok(),
                            None => Some((&mut step).await),
                        }
                    };
                    match signal.as_mut() {
                        Some(sig) => {
                            tokio::select! {
                                r = bounded => break r,
                                _ = sig => {
                                    info!("shutdown signal: finishing in-flight work, then stopping");
                                    signal = None;
                                    reason = Some(StopReason::Shutdown);
                                    let stop_by = Instant::now() + grace;
                                    hard_deadline = Some(hard_deadline.map_or(stop_by, |d| d.min(stop_by)));
                                }
                            }
                        }
                        None => break bounded.await,
                    }
                }
            };
            match outcome {
                None => {
                    // In flight at the hard deadline: release nothing.
                    warn!("work still in flight at the deadline: leases are left to lapse");
                    return Ok(self.report(
                        &state,
                        &refused_before,
                        StopReason::DeadlineMissed,
                        false,
                    ));
                }
                Some(Ok(())) => {}
                Some(Err(e @ Error::Misconfiguration(_))) => {
                    error!(error = %e, "relay faulted");
                    self.stop(&mut state, hard_deadline).await;
                    return Err(e);
                }
                Some(Err(e)) => {
                    state.errors += 1;
                    warn!(error = %e, "round failed; backing off");
                    let until = Instant::now() + self.options.error_backoff;
                    let until = work_until.map_or(until, |w| until.min(w));
                    self.sleep_or_signal(
                        until,
                        &mut signal,
                        &mut reason,
                        &mut hard_deadline,
                        grace,
                    )
                    .await;
                }
            }
            if reason.is_none() {
                let wake = self.next_wake(&state, work_until);
                if wake > Instant::now() {
                    self.sleep_or_signal(wake, &mut signal, &mut reason, &mut hard_deadline, grace)
                        .await;
                }
            }
        }
        let reason = reason.unwrap_or(StopReason::Deadline);
        let owned_at_end = state.owned.len();
        let released = self.stop(&mut state, hard_deadline).await;
        let mut report = self.report(&state, &refused_before, reason, released);
        report.owned_at_end = owned_at_end;
        info!(
            published = report.published,
            refused = report.refused_total(),
            released,
            stop_reason = report.stop_reason.as_str(),
            "relay stopped"
        );
        Ok(report)
    }

    async fn sleep_or_signal(
        &self,
        until: Instant,
        signal: &mut Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        reason: &mut Option<StopReason>,
        hard_deadline: &mut Option<Instant>,
        grace: Duration,
    ) {
        let notified = async {
            match &self.notifier {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        match signal.as_mut() {
            Some(sig) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = notified => {}
                    _ = sig => {
                        *signal = None;
                        *reason = Some(StopReason::Shutdown);
                        let stop_by = Instant::now() + grace;
                        *hard_deadline = Some(hard_deadline.map_or(stop_by, |d| d.min(stop_by)));
                    }
                }
            }
            None => {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = notified => {}
                }
            }
        }
    }

    /// When the loop has something to do next.
    fn next_wake(&self, state: &RunState, work_until: Option<Instant>) -> Instant {
        let now = Instant::now();
        let mut wake = state
            .last_acquire
            .map_or(now, |t| t + self.options.lease_renew_interval);
        if let Some(h) = state.early_acquire {
            wake = wake.min(h);
        }
        let now_ticks = self.store.clock().now_ticks();
        for owned in state
            .owned
            .values()
            .filter(|o| self.publishable(o, now, now_ticks))
        {
            let at = match (owned.dirty, owned.retry_at) {
                (_, Some(r)) => r,
                (true, None) => now,
                (false, None) => owned.next_probe,
            };
            wake = wake.min(at);
        }
        if let Some(w) = work_until {
            wake = wake.min(w);
        }
        wake
    }

    /// One pass: an acquisition when due, then one batch per publishable bucket.
    async fn step(&self, state: &mut RunState, work_until: Option<Instant>) -> Result<()> {
        if let Some(n) = &self.notifier {
            for bucket in n.take() {
                if let Some(o) = state.owned.get_mut(&bucket) {
                    o.dirty = true;
                }
            }
        }
        let regular = state
            .last_acquire
            .is_none_or(|t| Instant::now() >= t + self.options.lease_renew_interval);
        let early = state.early_acquire.is_some_and(|h| Instant::now() >= h);
        if regular || early {
            let started = Instant::now();
            state.last_acquire = Some(started);
            state.early_acquire = None;
            if regular && !early && self.skip_round(state) {
                debug!("far-back standby: skipping this round");
            } else {
                // A round is bounded by the time its held leases can still wait for their
                // renewal (lease duration minus one renew interval): a hung request cannot
                // hold the loop past them, and a slow one still gets to renew them.
                let bound = started
                    + self
                        .options
                        .lease_duration
                        .saturating_sub(self.options.lease_renew_interval)
                        .max(self.options.lease_renew_interval);
                let result = match tokio::time::timeout_at(bound, self.acquire(state)).await {
                    Ok(r) => r,
                    Err(_) => Err(Error::DeadlineExceeded("an acquisition round")),
                };
                if let Err(e) = result {
                    state.early_acquire = Some(Instant::now() + self.options.error_backoff);
                    return Err(e);
                }
                state.rounds += 1;
                self.metrics.round_duration(started.elapsed());
            }
        }
        self.work(state, work_until).await
    }

    /// A standby far back in line writes nothing every other round, while keeping its
    /// heartbeat younger than three quarters of the lease duration.
    fn skip_round(&self, state: &RunState) -> bool {
        if !state.far_standby {
            return false;
        }
        let Some(last) = state.last_heartbeat else {
            return false;
        };
        let next_round_age = last.elapsed() + self.options.lease_renew_interval;
        next_round_age <= self.options.lease_duration * 3 / 4
    }

    fn refused_snapshot(&self) -> BTreeMap<&'static str, u64> {
        let refused = self.store.refused_writes();
        WriteKind::ALL
            .iter()
            .map(|k| (k.as_str(), refused.get(*k)))
            .collect()
    }

    /// Heartbeat, one read, the plan, then renew / release / claim.
    #[instrument(skip_all, level = "debug")]
    async fn acquire(&self, state: &mut RunState) -> Result<()> {
        let me = self.options.relay_id.as_str();
        let d_ticks = duration_to_ticks(self.options.lease_duration);
        let refused_before = self.refused_snapshot();
        let beat_at = self.store.clock().now_ticks();
        let stops_at = state
            .stops_at
            .map(|s| beat_at + duration_to_ticks(s.saturating_duration_since(Instant::now())));
        // A heartbeat that fails (throttled, timed out) must not keep the leases already
        // held from being renewed: only claims depend on it.
        let heartbeat_ok = match self.store.heartbeat(me, beat_at, stops_at).await {
            Ok(ok) => ok,
            Err(e) => {
                warn!(error = %e, "heartbeat failed: renewing, claiming nothing this round");
                false
            }
        };
        let first_round = state.last_heartbeat.is_none();
        if heartbeat_ok {
            state.last_heartbeat = Some(Instant::now());
        }
        if first_round && heartbeat_ok {
            // Relays that start together (a scheduled fleet, a rollout) give each other's
            // first heartbeats a moment to land, so their first plans count each other
            // instead of claiming into each other's ranges.
            tokio::time::sleep(JOIN_DELAY.min(self.options.lease_renew_interval / 4)).await;
        }
        let coordination = self.store.read_coordination().await?;
        let mut owned_before: BTreeSet<u32> = state.owned.keys().copied().collect();
        let now = self.store.clock().now_ticks();
        let active = coordination.active_relays(now, d_ticks);
        let leases = coordination.lease_views(now);
        let plan = plan::compute(&PlanInput {
            bucket_count: self.options.bucket_count,
            me,
            active_relays: &active,
            leases: &leases,
        });
        state.far_standby = plan
            .standby_rank
            .is_some_and(|r| r >= self.options.bucket_count);
        debug!(
            share = plan.share,
            keep = ?plan.keep,
            release = ?plan.release,
            claim = ?plan.claim,
            active = plan.active_relays,
            "lease plan"
        );

        // Buckets we believed we held but the read says otherwise: lost.
        let planned: BTreeSet<u32> = plan.keep.iter().chain(&plan.release).copied().collect();
        let lost: Vec<u32> = state
            .owned
            .keys()
            .filter(|b| !planned.contains(b))
            .copied()
            .collect();
        for b in &lost {
            warn!(bucket = b, "lease lost: a peer holds it now");
            state.owned.remove(b);
        }

        let new_expiry = now + d_ticks;
        let valid_until = Instant::now() + self.options.lease_duration;
        let concurrency = self.store.options().max_concurrency;
        // 1. renew what it keeps
        let renewals: Vec<(u32, Option<bool>, i64)> = stream::iter(
            plan.keep
                .iter()
                .map(|&b| {
                    let read = coordination.lease(b).map_or(0, |l| l.expires_at);
                    async move {
                        if new_expiry <= read {
                            // The clock is behind the stored expiry: never move it backwards.
                            return Ok::<_, Error>((b, None, read));
                        }
                        let unlapsed = (read > now).then_some(now);
                        let ok = self.store.renew(b, me, read, new_expiry, unlapsed).await?;
                        Ok((b, Some(ok), read))
                    }
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(concurrency)
        .collect::<Vec<Result<_>>>()
        .await
        .into_iter()
        .filter_map(|r| {
            // One failed renewal does not undo the others; its bucket keeps its old
            // validity and the next round tries again.
            r.map_err(|e| warn!(error = %e, "renewal failed")).ok()
        })
        .collect();
        for (b, outcome, read) in renewals {
            match outcome {
                None => {
                    warn!(
                        bucket = b,
                        stored_expiry = read,
                        now,
                        "clock is behind the lease's stored expiry: not renewing, not publishing this bucket until it passes"
                    );
                    let o = state
                        .owned
                        .entry(b)
                        .or_insert_with(|| Owned::new(read, Instant::now(), Instant::now()));
                    o.expires_at = read;
                    o.blocked_until = Some(read);
                }
                Some(true) => {
                    let o = state
                        .owned
                        .entry(b)
                        .or_insert_with(|| Owned::new(new_expiry, valid_until, Instant::now()));
                    o.expires_at = new_expiry;
                    o.valid_until = valid_until;
                    o.blocked_until = None;
                }
                Some(false) => {
                    state.owned.remove(&b);
                    state.leases_lost += 1;
                    self.metrics.leases_lost(1);
                }
            }
        }
        // 2. hand back what exceeds the share
        // (Stop publishing it before the request: a release that times out may still land.)
        for b in &plan.release {
            if state.owned.remove(b).is_some() && owned_before.remove(b) {
                info!(bucket = b, ownership = "disowns", "bucket ownership");
                self.metrics.ownership(*b, false);
            }
        }
        let released: Vec<Result<bool>> = stream::iter(
            plan.release
                .iter()
                .map(|&b| {
                    let read = coordination.lease(b).map_or(0, |l| l.expires_at);
                    async move { self.store.release(b, me, Some(read)).await }
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(concurrency)
        .collect()
        .await;
        for (b, r) in plan.release.iter().zip(released) {
            match r {
                Ok(_) => info!(bucket = b, "handed a bucket back"),
                Err(e) => warn!(bucket = b, error = %e, "release failed; the lease will lapse"),
            }
        }
        // 3. claim what the plan gives it, unless the heartbeat was refused
        if !heartbeat_ok && !plan.claim.is_empty() {
            warn!("heartbeat refused: claiming nothing this round");
        } else {
            let claims: Vec<(u32, bool)> = stream::iter(
                plan.claim
                    .iter()
                    .map(|&b| async move {
                        let ok = self.store.claim(b, me, now, new_expiry).await?;
                        Ok::<_, Error>((b, ok))
                    })
                    .collect::<Vec<_>>(),
            )
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .filter_map(|r| r.map_err(|e| warn!(error = %e, "claim failed")).ok())
            .collect();
            let mut acquired = 0;
            for (b, ok) in claims {
                if ok {
                    acquired += 1;
                    state
                        .owned
                        .insert(b, Owned::new(new_expiry, valid_until, Instant::now()));
                }
            }
            if acquired > 0 {
                info!(claimed = acquired, "claimed buckets");
                state.leases_acquired += acquired as u64;
                self.metrics.leases_acquired(acquired);
            }
        }
        if !lost.is_empty() {
            state.leases_lost += lost.len() as u64;
            self.metrics.leases_lost(lost.len());
        }
        self.log_ownership(&owned_before, state);
        state.max_owned = state.max_owned.max(state.owned.len());
        self.metrics.owned_buckets(state.owned.len());
        for kind in WriteKind::ALL {
            let before = refused_before.get(kind.as_str()).copied().unwrap_or(0);
            for _ in before..self.store.refused_writes().get(kind) {
                self.metrics.refused_write(kind);
            }
        }
        state.early_acquire = self.handover_time(&coordination, now);
        self.cleanup(&coordination, now, d_ticks).await;
        let sample_due = state
            .last_backlog_sample
            .map_or(state.rounds > 0, |t| t.elapsed() >= BACKLOG_SAMPLE_INTERVAL);
        if state.owned.contains_key(&0) && sample_due {
            state.last_backlog_sample = Some(Instant::now());
            // Bounded: a slow count must not delay the next round or the deadline.
            let bound = self.options.lease_renew_interval / 2;
            if tokio::time::timeout(bound, self.sample_backlog(now))
                .await
                .is_err()
            {
                debug!("backlog sample cut short");
            }
        }
        Ok(())
    }

    /// Logs (and reports) every bucket this relay started or stopped publishing, so a
    /// history of who believed it owned what can be checked afterwards.
    fn log_ownership(&self, before: &BTreeSet<u32>, state: &RunState) {
        for b in state.owned.keys().filter(|b| !before.contains(b)) {
            info!(bucket = b, ownership = "owns", "bucket ownership");
            self.metrics.ownership(*b, true);
        }
        for b in before.iter().filter(|b| !state.owned.contains_key(b)) {
            info!(bucket = b, ownership = "disowns", "bucket ownership");
            self.metrics.ownership(*b, false);
        }
    }

    /// When to run an extra acquisition for a peer that announced its stop: just after the
    /// announced time, and again every few hundred milliseconds while it has not stamped
    /// its stop yet (at most [`HANDOVER_WATCH`] past the announced time).
    fn handover_time(&self, coordination: &Coordination, now: i64) -> Option<Instant> {
        coordination
            .handover_at(
                &self.options.relay_id,
                self.options.bucket_count,
                now,
                duration_to_ticks(HANDOVER_STEP),
                duration_to_ticks(HANDOVER_WATCH),
            )
            .map(|at| Instant::now() + ticks_to_duration(at.saturating_sub(now)))
    }

    /// The first active relay in id order deletes heartbeat records of relays that stopped
    /// one lease duration ago or went silent ten lease durations ago.
    async fn cleanup(&self, coordination: &Coordination, now: i64, d_ticks: i64) {
        let me = self.options.relay_id.as_str();
        for r in coordination.stale_records(me, now, d_ticks) {
            match self
                .store
                .delete_relay_record(me, &r.relay_id, r.last_seen)
                .await
            {
                Ok(true) => debug!(relay = %r.relay_id, "deleted a stale heartbeat record"),
                Ok(false) => {}
                Err(e) => debug!(error = %e, "heartbeat cleanup failed; next round retries"),
            }
        }
    }

    async fn sample_backlog(&self, now: i64) {
        let samples: Vec<_> = stream::iter(
            (0..self.options.bucket_count)
                .map(|bucket| self.store.backlog(bucket))
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency)
        .collect()
        .await;
        for sample in samples {
            match sample {
                Ok(b) => {
                    let age = b
                        .oldest_created_at
                        .map(|c| ticks_to_duration(now.saturating_sub(c)));
                    self.metrics.backlog(b.bucket, b.pending, age);
                }
                Err(e) => debug!(error = %e, "backlog sample failed"),
            }
        }
    }

    /// One batch for every bucket that is due, several buckets at once.
    async fn work(&self, state: &mut RunState, work_until: Option<Instant>) -> Result<()> {
        let now = Instant::now();
        let now_ticks = self.store.clock().now_ticks();
        // Capped: a stall or one slow batch must not make every later batch look too long
        // to start (a skipped batch never updates the estimate).
        let estimate = state
            .batch_estimate
            .unwrap_or(Duration::from_millis(200))
            .min(self.options.lease_renew_interval / 4);
        if work_until.is_some_and(|w| now + estimate >= w) {
            return Ok(());
        }
        // One wave of batches ends within a renew interval, so the next acquisition is
        // never held up by more than that; each batch also ends while its lease is valid.
        let wave_end = now + self.options.lease_renew_interval;
        let wave_end = work_until.map_or(wave_end, |w| wave_end.min(w));
        let due: Vec<(u32, Owned)> = state
            .owned
            .iter()
            .filter(|(_, o)| {
                let retry_ok = o.retry_at.is_none_or(|t| now >= t);
                let wanted = o.dirty || now >= o.next_probe;
                self.publishable(o, now, now_ticks) && retry_ok && wanted
            })
            .map(|(b, o)| (*b, o.clone()))
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let results: Vec<(u32, Result<BatchResult>, Duration)> = stream::iter(
            due.into_iter()
                .map(|(b, o)| async move {
                    let started = Instant::now();
                    let limit = wave_end.min(
                        o.valid_until
                            .checked_sub(self.options.lease_renew_interval)
                            .unwrap_or(started),
                    );
                    let r = self.batch(b, &o, limit, estimate).await;
                    (b, r, started.elapsed())
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency)
        .collect()
        .await;
        let mut fault = None;
        for (bucket, result, took) in results {
            let Some(o) = state.owned.get_mut(&bucket) else {
                continue;
            };
            let now = Instant::now();
            match result {
                Ok(BatchResult::Idle) => {
                    o.dirty = false;
                    o.retry_at = None;
                    o.next_probe = now + self.options.poll_interval;
                }
                Ok(BatchResult::Done {
                    fetched,
                    deleted,
                    last,
                    full,
                }) => {
                    state.report_published += deleted as u64;
                    self.metrics.published(bucket, deleted as u64);
                    self.metrics.batch_duration(bucket, took);
                    let took = took.min(self.options.lease_renew_interval / 4);
                    state.batch_estimate = Some(match state.batch_estimate {
                        Some(e) => (e * 3 + took) / 4,
                        None => took,
                    });
                    if last.is_some() {
                        o.last_removed = last;
                    }
                    o.retry_at = None;
                    o.dirty = full || deleted < fetched;
                    o.next_probe = now + self.options.poll_interval;
                }
                Ok(BatchResult::Failed { deleted, last }) => {
                    state.report_published += deleted as u64;
                    state.publish_failures += 1;
                    self.metrics.published(bucket, deleted as u64);
                    self.metrics.publish_failed(bucket, false);
                    if last.is_some() {
                        o.last_removed = last;
                    }
                    o.dirty = true;
                    o.retry_at = Some(now + self.options.error_backoff);
                }
                Ok(BatchResult::Skipped) => {}
                Ok(BatchResult::Poison {
                    reason,
                    deleted,
                    last,
                }) => {
                    state.report_published += deleted as u64;
                    self.metrics.published(bucket, deleted as u64);
                    if last.is_some() {
                        o.last_removed = last;
                    }
                    error!(bucket, reason = %reason, "bucket stuck on an item it cannot publish; quarantine it with `outboxctl quarantine`");
                    self.metrics.poison_item(bucket);
                    state.publish_failures += 1;
                    o.dirty = true;
                    o.retry_at = Some(now + self.options.lease_renew_interval);
                }
                Err(e @ Error::Misconfiguration(_)) => fault = Some(e),
                Err(e) => {
                    warn!(bucket, error = %e, "batch failed");
                    state.errors += 1;
                    o.dirty = true;
                    o.retry_at = Some(now + self.options.error_backoff);
                }
            }
        }
        match fault {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether the relay may publish a bucket now: its lease is valid for more than a
    /// renew interval by both the wall clock and the monotonic clock, and the clock is not
    /// behind the stored expiry.
    fn publishable(&self, o: &Owned, now: Instant, now_ticks: i64) -> bool {
        let margin = duration_to_ticks(self.options.lease_renew_interval);
        let lease_ok = o.expires_at.saturating_sub(now_ticks) > margin
            && o.valid_until > now + self.options.lease_renew_interval;
        let unblocked = o.blocked_until.is_none_or(|t| now_ticks > t);
        lease_ok && unblocked
    }

    /// Probe (unless dirty), fetch, publish, delete the acknowledged prefix; nothing is
    /// started or published after `limit`.
    async fn batch(
        &self,
        bucket: u32,
        owned: &Owned,
        limit: Instant,
        estimate: Duration,
    ) -> Result<BatchResult> {
        if Instant::now() + estimate >= limit {
            return Ok(BatchResult::Skipped);
        }
        if !owned.dirty && !self.store.probe(bucket).await? {
            return Ok(BatchResult::Idle);
        }
        let fetched = match self
            .store
            .fetch(bucket, owned.last_removed, self.options.batch_size)
            .await
        {
            Ok(f) => f,
            Err(e @ Error::Corrupt { .. }) => {
                return Ok(BatchResult::Poison {
                    reason: e.to_string(),
                    deleted: 0,
                    last: None,
                })
            }
            Err(e) => return Err(e),
        };
        if fetched.messages.is_empty() {
            return Ok(BatchResult::Idle);
        }
        if Instant::now() >= limit {
            return Ok(BatchResult::Skipped);
        }
        // Cut short at the limit, a publish counts as nothing acknowledged: the messages
        // stay and go out again (duplicates, never a loss).
        let outcome = tokio::time::timeout_at(limit, self.publisher.publish(&fetched.messages))
            .await
            .unwrap_or_else(|_| {
                PublishOutcome::failed(Error::DeadlineExceeded("publishing a batch"))
            });
        let acked = outcome.acknowledged.min(fetched.messages.len());
        let sequences: Vec<u64> = fetched.messages[..acked]
            .iter()
            .map(|m| m.sequence)
            .collect();
        // Deletes retry until the limit (and at least a short while), then give up: what
        // stays is published again.
        let delete_deadline = limit.max(Instant::now() + Duration::from_millis(500));
        let deleted = if sequences.is_empty() {
            0
        } else {
            let deleting = self
                .store
                .delete_messages(bucket, &sequences, delete_deadline);
            match tokio::time::timeout_at(delete_deadline + Duration::from_secs(2), deleting)
                .await
                .unwrap_or(Err(Error::DeadlineExceeded("deleting a batch")))
            {
                Ok(n) => n,
                Err(e) => {
                    warn!(bucket, error = %e, "deleting published messages failed; they will be published again");
                    0
                }
            }
        };
        let last = deleted.checked_sub(1).map(|i| sequences[i]);
        match outcome.error {
            None if deleted == sequences.len() => Ok(BatchResult::Done {
                fetched: fetched.messages.len(),
                deleted,
                last,
                full: fetched.messages.len() as u32 >= self.options.batch_size,
            }),
            None => Ok(BatchResult::Failed { deleted, last }),
            Some(e @ Error::KafkaRejected { .. }) => {
                let at = fetched.messages.get(acked).map_or_else(String::new, |m| {
                    format!(
                        " (message {}, sequence {})",
                        m.message.message_id, m.sequence
                    )
                });
                Ok(BatchResult::Poison {
                    reason: format!("bucket {bucket}{at}: {e}"),
                    deleted,
                    last,
                })
            }
            Some(e) => {
                warn!(bucket, acknowledged = acked, error = %e, "publish failed");
                Ok(BatchResult::Failed { deleted, last })
            }
        }
    }

    /// Stamps the heartbeat as stopped, releases every lease guarded by owner, and reads
    /// the leases again until none names this relay (a claim it abandoned may land late).
    async fn stop(&self, state: &mut RunState, deadline: Option<Instant>) -> bool {
        let me = self.options.relay_id.as_str();
        let deadline = deadline
            .unwrap_or_else(|| Instant::now() + self.stop_reserve.max(Duration::from_secs(5)));
        // Publishing has ended: from here on this relay believes it owns nothing.
        self.log_ownership(&state.owned.keys().copied().collect(), &RunState::default());
        let attempt = async {
            let now = self.store.clock().now_ticks();
            if !self.store.stamp_stopped(me, now).await? {
                // Peers still count this relay: freed buckets would stay reserved for it.
                // Leave the leases to lapse instead, as after a crash.
                warn!("stop stamp refused: leaving the leases to lapse");
                return Ok::<_, Error>(false);
            }
            let mut held: Vec<u32> = state.owned.keys().copied().collect();
            for _ in 0..5 {
                let releases: Vec<Result<bool>> = stream::iter(
                    held.iter()
                        .map(|&b| self.store.release(b, me, None))
                        .collect::<Vec<_>>(),
                )
                .buffer_unordered(self.store.options().max_concurrency)
                .collect()
                .await;
                releases.into_iter().collect::<Result<Vec<_>>>()?;
                let coordination = self.store.read_coordination().await?;
                held = coordination.held_by(me, self.options.bucket_count);
                if held.is_empty() {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        let released = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(released)) => released,
            Ok(Err(e)) => {
                warn!(error = %e, "graceful stop failed: leases will lapse");
                false
            }
            Err(_) => {
                warn!("graceful stop ran out of time: leases will lapse");
                false
            }
        };
        state.owned.clear();
        released
    }

    fn report(
        &self,
        state: &RunState,
        refused_before: &BTreeMap<&'static str, u64>,
        stop_reason: StopReason,
        released: bool,
    ) -> RunReport {
        let refused = self
            .refused_snapshot()
            .into_iter()
            .map(|(k, v)| (k, v - refused_before.get(k).copied().unwrap_or(0)))
            .collect();
        RunReport {
            relay_id: self.options.relay_id.clone(),
            published: state.report_published,
            publish_failures: state.publish_failures,
            rounds: state.rounds,
            max_owned: state.max_owned,
            owned_at_end: state.owned.len(),
            leases_acquired: state.leases_acquired,
            leases_lost: state.leases_lost,
            refused,
            errors: state.errors,
            stop_reason,
            released,
        }
    }
}
