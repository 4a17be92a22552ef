//! The relay loop: rounds of acquire / probe / fetch / publish / delete inside a deadline
//! or until a shutdown signal, then the graceful stop.
//!
//! One room per phase: this file owns [`Relay`] and the run loop (race a step against the
//! shutdown, apply its outcome, sleep until the state says, then stop); `shutdown` the
//! signal, the grace and the hard deadline; `state` the pure state of a run (what is
//! due, the next wake, applying a batch's result, the tally); `round` the lease round;
//! `batch` one bucket's batch, step by step, and a wave of them; `outcome` what a batch
//! did, which `batch` produces and `state` applies; `poison_policy` moving a poison head
//! aside under `OUTBOX_POISON_POLICY=quarantine-after=N`; `stop` the graceful stop;
//! `report` what a run returns.
//!
//! [`Relay::run_until`] and [`Relay::run_until_shutdown`] share one code path. The loop
//! never starts a batch that cannot finish before the deadline minus the stop reserve; the
//! stop then stamps the heartbeat as stopped and releases every lease. A stop that misses
//! its deadline (a batch still in flight) releases nothing: it may still be publishing,
//! so its leases lapse as after a crash.

mod batch;
mod builder;
mod graceful_stop;
mod idle;
mod outcome;
mod poison_policy;
mod report;
mod round;
mod state;
mod stop_signal;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, instrument, warn};

use crate::error::{Error, Result};
use crate::metrics::{NoMetrics, RelayMetrics};
use crate::notification::{Handoff, LocalNotifier, Successor, SUCCESSOR_LEAD};
use crate::options::RelayOptions;
use crate::protocol::store::{DynamoDbOutboxStore, WriteKind};
use crate::publish::Publisher;

pub use builder::RelayBuilder;
pub use report::{RunReport, StopReason};
use state::RunState;
use stop_signal::Shutdown;

/// Default time kept free before the deadline for the graceful stop.
pub const DEFAULT_STOP_RESERVE: Duration = Duration::from_secs(2);
/// Longest time a relay waits for its successor's start at the lead
/// ([`SUCCESSOR_LEAD`]) before it goes back to work; a start that failed or ran out of
/// time is tried again at the last look.
pub const SUCCESSOR_START_TIMEOUT: Duration = Duration::from_secs(3);
/// How long before the end of work a run that has not started its successor looks for
/// work left once more (what arrived or failed since the lead) and starts it, bounded by
/// the end of work: the stop reserve stays whole.
pub const SUCCESSOR_LAST_LOOK: Duration = Duration::from_secs(1);
pub use crate::protocol::coordination::JOIN_DELAY;
/// How often the owner of bucket zero samples the backlog (counts are billed per item
/// counted, so not every round; never in the first round, before anything is published).
pub const BACKLOG_SAMPLE_INTERVAL: Duration = Duration::from_secs(60);

/// The relay: owns a share of the buckets and moves their messages to Kafka.
pub struct Relay<P: Publisher> {
    store: DynamoDbOutboxStore,
    publisher: Arc<P>,
    options: RelayOptions,
    metrics: Arc<dyn RelayMetrics>,
    notifier: Option<Arc<LocalNotifier>>,
    successor: Option<Arc<dyn Successor>>,
    successor_at_end: bool,
    stop_reserve: Duration,
    /// Exactly once: set once the publisher knows the outbox it publishes for.
    outbox_bound: tokio::sync::OnceCell<()>,
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

impl<P: Publisher> Relay<P> {
    /// A relay over `store` publishing with `publisher`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `options` break a rule ([`RelayOptions::validate`]);
    /// [`Error::Misconfiguration`] when the relay's bucket count differs from the store's.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use dynamo_outbox::publish::{KafkaConfig, LazyKafkaPublisher};
    /// use dynamo_outbox::{DynamoDbOutboxStore, OutboxOptions, Relay, RelayOptions};
    ///
    /// # async fn example() -> dynamo_outbox::Result<()> {
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let client = dynamo_outbox::client::dynamodb_client(&sdk);
    /// let store = DynamoDbOutboxStore::new(client, OutboxOptions::from_env()?)?;
    /// let publisher = std::sync::Arc::new(LazyKafkaPublisher::new(KafkaConfig::from_env()?));
    /// let relay = Relay::new(store, publisher, RelayOptions::from_env()?)?;
    /// let report = relay
    ///     .run_until_shutdown(
    ///         async {
    ///             let _ = tokio::signal::ctrl_c().await;
    ///         },
    ///         Duration::from_secs(10),
    ///     )
    ///     .await?;
    /// println!("published {} messages", report.published);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(
        store: DynamoDbOutboxStore,
        publisher: Arc<P>,
        options: RelayOptions,
    ) -> Result<Self> {
        options.validate()?;
        if options.bucket_count != store.options().bucket_count {
            return Err(Error::misconfigured(format!(
                "the relay's bucket count is {}, the store's is {}: they must be equal",
                options.bucket_count,
                store.options().bucket_count
            )));
        }
        let mut store = store;
        store.exactly_once = publisher.delivery() == crate::publish::Delivery::ExactlyOnce;
        Ok(Relay {
            store,
            publisher,
            options,
            metrics: Arc::new(NoMetrics),
            notifier: None,
            successor: None,
            successor_at_end: true,
            stop_reserve: DEFAULT_STOP_RESERVE,
            outbox_bound: tokio::sync::OnceCell::new(),
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

    /// Starts a successor through `successor` when a run with a deadline reaches it minus
    /// [`SUCCESSOR_LEAD`] with work left in its buckets (once per run; see
    /// [`crate::notification::Successor`]).
    pub fn with_successor(mut self, successor: Arc<dyn Successor>) -> Self {
        self.successor = Some(successor);
        self
    }

    /// Whether a run that found no work left at its successor lead looks once more when its
    /// work ends (the default). A host whose wake-ups queue behind a running relay (a
    /// stream doorbell holds its shard: the doorbells of later commits wait behind the run
    /// and follow it) turns it off: those doorbells are the successor of what arrived late.
    pub fn with_successor_at_end(mut self, look: bool) -> Self {
        self.successor_at_end = look;
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

    /// Runs until `deadline` (everything, the graceful stop included, ends by then): the
    /// shape of a Lambda invocation, whose deadline is the invocation's.
    ///
    /// Failed requests and rounds are retried after the error backoff and counted in the
    /// report ([`RunReport::errors`]), not returned.
    ///
    /// # Errors
    /// [`Error::Misconfiguration`] when the deployment disagrees with itself (a message
    /// stamped with another bucket count, say): the relay stops gracefully and returns it,
    /// as retrying cannot help.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    ///
    /// # async fn example(
    /// #     relay: dynamo_outbox::Relay<dynamo_outbox::publish::LazyKafkaPublisher>,
    /// # ) -> dynamo_outbox::Result<()> {
    /// let report = relay.run_until(Instant::now() + Duration::from_secs(60)).await?;
    /// println!("{}: {} published", report.stop_reason.as_str(), report.published);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_until(&self, deadline: Instant) -> Result<RunReport> {
        self.run(Some(deadline), None, Duration::ZERO).await
    }

    /// Runs until `signal` completes, then stops gracefully within `grace`: the shape of a
    /// long-lived process (`outboxctl relay`, a container).
    ///
    /// # Errors
    /// As [`run_until`](Self::run_until).
    ///
    /// # Examples
    /// See [`Relay::new`].
    pub async fn run_until_shutdown<F>(&self, signal: F, grace: Duration) -> Result<RunReport>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.run(None, Some(Box::pin(signal)), grace).await
    }

    /// Runs until `deadline` or until `signal` completes, whichever comes first: toward the
    /// deadline it stops as [`Relay::run_until`] does (done by the deadline), on the signal
    /// as [`Relay::run_until_shutdown`] does (within `grace`). A process that runs for a
    /// set time and must also honour SIGTERM (`outboxctl relay --for`, a batch job).
    pub async fn run_until_or_shutdown<F>(
        &self,
        deadline: Instant,
        signal: F,
        grace: Duration,
    ) -> Result<RunReport>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.run(Some(deadline), Some(Box::pin(signal)), grace)
            .await
    }

    /// Runs until `deadline` or `signal`, whichever comes first (the three public entry
    /// points above are its only callers).
    #[instrument(skip_all, fields(relay_id = %self.options.relay_id))]
    async fn run(
        &self,
        deadline: Option<Instant>,
        signal: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        grace: Duration,
    ) -> Result<RunReport> {
        let refused_before = self.refused_snapshot();
        let mut state = RunState {
            stops_at: deadline.map(|d| {
                d.checked_sub(self.stop_reserve)
                    .unwrap_or_else(Instant::now)
            }),
            last_activity: Some(Instant::now()),
            ..RunState::default()
        };
        let mut shutdown = Shutdown::new(deadline, signal, grace);
        let run_start_ms = crate::ticks::unix_millis(self.store.clock().now_ticks());
        state.successor_at = self.successor_due(&shutdown, Instant::now());
        state.successor_last_look = state
            .successor_at
            .filter(|_| self.successor_at_end)
            .and_then(|_| self.work_until(&shutdown, Instant::now()))
            .and_then(|w| w.checked_sub(SUCCESSOR_LAST_LOOK));
        info!(bucket_count = self.options.bucket_count, "relay starting");
        if self.store.exactly_once {
            // Before the first heartbeat, so that peers never count a relay that will not
            // stay; a failed read leaves the check to the first round.
            if let Ok(coordination) = self.store.read_coordination().await {
                self.check_one_delivery_mode(&coordination)?;
            }
        }
        let reason = loop {
            if shutdown.requested() {
                break StopReason::Shutdown;
            }
            let now = Instant::now();
            let work_until = self.work_until(&shutdown, now);
            if work_until.is_some_and(|w| now >= w) {
                break StopReason::Deadline;
            }
            // Boxed: the step's future (round, wave, batch) nested in the race is deep
            // enough to hit the compiler's layout recursion limit in callers' crates.
            let step = Box::pin(self.step(&mut state, work_until));
            match shutdown.race(step).await {
                None => {
                    // In flight at the hard deadline: release nothing.
                    warn!("work still in flight at the deadline: leases are left to lapse");
                    let refused = self.refused_since(&refused_before);
                    let report = state.report(
                        &self.options.relay_id,
                        refused,
                        StopReason::DeadlineMissed,
                        false,
                    );
                    return Ok(report);
                }
                Some(Ok(())) => {}
                Some(Err(e @ Error::Misconfiguration { .. })) => {
                    error!(error = %crate::error::chain(&e), "relay faulted");
                    self.stop(&mut state, shutdown.hard_deadline()).await;
                    return Err(e);
                }
                Some(Err(e)) => {
                    state.errors += 1;
                    warn!(error = %crate::error::chain(&e), "round failed; backing off");
                    let until = Instant::now() + self.options.error_backoff;
                    let until = work_until.map_or(until, |w| until.min(w));
                    shutdown.sleep_until(until, self.notified()).await;
                }
            }
            if self.idle_confirmed(&mut state, &mut shutdown).await {
                break StopReason::Idle;
            }
            let now = Instant::now();
            if state.successor_at.is_some_and(|at| now >= at) {
                state.successor_at = None;
                let bound = now + SUCCESSOR_START_TIMEOUT;
                let bound = work_until.map_or(bound, |w| bound.min(w));
                shutdown
                    .race(self.start_successor(&mut state, run_start_ms, bound))
                    .await;
            }
            if state.successor_last_look.is_some_and(|at| now >= at) {
                state.successor_last_look = None;
                if !state.successor_started {
                    let bound = work_until.unwrap_or(now + SUCCESSOR_START_TIMEOUT);
                    shutdown
                        .race(self.start_successor(&mut state, run_start_ms, bound))
                        .await;
                }
            }
            if !shutdown.requested() {
                self.sleep_until_wake(&state, &mut shutdown).await;
            }
        };
        if state.successor_failed {
            self.metrics.successor_failed();
        }
        Ok(self
            .finish(
                &mut state,
                shutdown.hard_deadline(),
                reason,
                &refused_before,
            )
            .await)
    }

    /// Whether the run stops for idleness: the state says it is idle and a last look,
    /// raced against the shutdown, confirms it (a look that fails counts as activity).
    async fn idle_confirmed(&self, state: &mut RunState, shutdown: &mut Shutdown) -> bool {
        if !state.idle(&self.options, Instant::now()) || shutdown.requested() {
            return false;
        }
        match shutdown.race(self.confirm_idle(state)).await {
            Some(Ok(confirmed)) => confirmed,
            Some(Err(e)) => {
                warn!(error = %crate::error::chain(&e), "idle: checking before the stop failed; running on");
                state.last_activity = Some(Instant::now());
                false
            }
            None => false,
        }
    }

    /// Sleeps until the state's next wake (the next round, a batch due, the end of work),
    /// a commit notification, or the shutdown.
    async fn sleep_until_wake(&self, state: &RunState, shutdown: &mut Shutdown) {
        let now = Instant::now();
        let wake = state.next_wake(
            &self.options,
            now,
            self.store.clock().now_ticks(),
            self.work_until(shutdown, now),
        );
        if wake > now {
            shutdown.sleep_until(wake, self.notified()).await;
        }
    }

    /// The end of a run that left its loop for `reason`: the graceful stop (unless the hard
    /// deadline has passed), then the report. (The deadline, not the [`Shutdown`], is passed
    /// in: a reference to it held across the stop would make the run's future not `Send`.)
    async fn finish(
        &self,
        state: &mut RunState,
        hard_deadline: Option<Instant>,
        reason: StopReason,
        refused_before: &BTreeMap<&'static str, u64>,
    ) -> RunReport {
        let owned_at_end = state.owned.len();
        // A step that overran the hard deadline and still returned (a request stuck out of
        // the runtime's reach, then timed out) leaves no time for the stop: that is a
        // missed deadline too, and nothing is released (the leases lapse).
        let missed = hard_deadline.is_some_and(|d| Instant::now() >= d);
        let (reason, released) = if missed {
            warn!("the hard deadline passed before the stop: leases are left to lapse");
            (StopReason::DeadlineMissed, false)
        } else {
            (reason, self.stop(state, hard_deadline).await)
        };
        let mut report = state.report(
            &self.options.relay_id,
            self.refused_since(refused_before),
            reason,
            released,
        );
        report.owned_at_end = owned_at_end;
        info!(
            published = report.published,
            refused = report.refused_total(),
            released,
            stop_reason = report.stop_reason.as_str(),
            "relay stopped"
        );
        report
    }

    /// When work ends: the hard deadline minus the stop reserve.
    fn work_until(&self, shutdown: &Shutdown, now: Instant) -> Option<Instant> {
        shutdown
            .hard_deadline()
            .map(|d| d.checked_sub(self.stop_reserve).unwrap_or(now))
    }

    /// When a run starting at `now` looks for work left to start its successor: the end
    /// of work minus [`SUCCESSOR_LEAD`], for a relay with a successor and a deadline whose
    /// run is at least that long (so a chain of successors starts at most one relay per
    /// [`SUCCESSOR_LEAD`]).
    fn successor_due(&self, shutdown: &Shutdown, now: Instant) -> Option<Instant> {
        self.successor.as_ref()?;
        let at = self
            .work_until(shutdown, now)?
            .checked_sub(SUCCESSOR_LEAD)?;
        (at >= now + SUCCESSOR_LEAD).then_some(at)
    }

    /// Starts the successor when an owned bucket has work left, waiting for it until
    /// `bound` at most. A start that fails or runs out of time is logged and counted, and
    /// tried again at the last look; a successor that may have started despite a timeout
    /// (one that is not [`Successor::idempotent`]) counts as started: at most one successor
    /// a run.
    async fn start_successor(&self, state: &mut RunState, run_start_ms: u64, bound: Instant) {
        let Some(successor) = &self.successor else {
            return;
        };
        let buckets = state.work_left();
        if buckets.is_empty() {
            info!("no work left in the owned buckets: no successor");
            return;
        }
        let handoff = Handoff::new(self.store.options(), &self.options.relay_id, buckets)
            .with_run_start_ms(run_start_ms);
        match tokio::time::timeout_at(bound, successor.start(&handoff)).await {
            Ok(Ok(())) => {
                state.successor_started = true;
                state.successor_failed = false;
                info!(buckets = ?handoff.buckets, "work left: successor started");
            }
            Ok(Err(e)) => {
                state.errors += 1;
                state.successor_failed = true;
                warn!(error = %crate::error::chain(&e), "starting the successor failed");
            }
            Err(_) if successor.idempotent() => {
                state.errors += 1;
                state.successor_failed = true;
                warn!("starting the successor ran out of time");
            }
            Err(_) => {
                // It may have been accepted: another start could make two successors.
                state.errors += 1;
                state.successor_started = true;
                state.successor_failed = false;
                warn!("starting the successor timed out: it may have started, not trying again");
            }
        }
    }

    /// Completes at the next commit notification (never without a notifier).
    async fn notified(&self) {
        match &self.notifier {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    }

    /// One pass: an acquisition when due, then one batch per publishable bucket.
    async fn step(&self, state: &mut RunState, work_until: Option<Instant>) -> Result<()> {
        if let Some(n) = &self.notifier {
            let notified = n.take();
            if !notified.is_empty() {
                state.last_activity = Some(Instant::now());
            }
            for bucket in notified {
                if let Some(o) = state.owned.get_mut(&bucket) {
                    o.dirty = true;
                }
            }
        }
        self.round_if_due(state).await?;
        self.work(state, work_until).await?;
        self.quarantine_due(state, work_until).await;
        Ok(())
    }

    fn refused_snapshot(&self) -> BTreeMap<&'static str, u64> {
        let refused = self.store.refused_writes();
        WriteKind::ALL
            .iter()
            .map(|k| (k.as_str(), refused.get(*k)))
            .collect()
    }

    /// Refused conditional writes since `before`, by kind.
    fn refused_since(&self, before: &BTreeMap<&'static str, u64>) -> BTreeMap<&'static str, u64> {
        self.refused_snapshot()
            .into_iter()
            .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0)))
            .collect()
    }
}
