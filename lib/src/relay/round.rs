//! The lease round: heartbeat, one read of the coordination partition, the plan, then
//! renew / release / claim (each its own function returning outcomes), and the chores of
//! a round (heartbeat cleanup, the backlog sample).

use std::collections::BTreeSet;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::{debug, info, instrument, warn};

use super::state::{Owned, RunState};
use super::{Relay, BACKLOG_SAMPLE_INTERVAL};
use crate::error::{Error, Result};
use crate::protocol::clock::{duration_to_ticks, ticks_to_duration};
use crate::protocol::coordination::{Coordination, LeaseRecord, ReadExpiry};
use crate::protocol::coordination::{ALONE_JOIN_DELAY, HANDOVER_STEP, HANDOVER_WATCH, JOIN_DELAY};
use crate::protocol::plan::{self, Plan, PlanInput};
use crate::protocol::store::WriteKind;
use crate::publish::Publisher;

/// What one renewal found: renewed, refused (the lease moved on), or not sent because the
/// clock is behind the stored expiry (never move an expiry backwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Renewed,
    Refused,
    ClockBehind { stored_expiry: i64 },
}

/// The times every write of one round uses.
#[derive(Debug, Clone, Copy)]
struct RoundTimes {
    /// The reader's clock after the read (UTC ticks).
    now: i64,
    /// The expiry every renewal and claim writes.
    new_expiry: i64,
    /// The same on the monotonic clock.
    valid_until: Instant,
}

impl<P: Publisher> Relay<P> {
    /// One acquisition round when due (skipped by a far-back standby every other time),
    /// bounded by the time its held leases can still wait for their renewal (lease
    /// duration minus one renew interval): a hung request cannot hold the loop past them,
    /// and a slow one still gets to renew them.
    pub(super) async fn round_if_due(&self, state: &mut RunState) -> Result<()> {
        let (regular, early) = state.round_due(&self.options, Instant::now());
        if !(regular || early) {
            return Ok(());
        }
        let started = Instant::now();
        state.last_acquire = Some(started);
        state.early_acquire = None;
        if regular && !early && state.skip_round(&self.options, started) {
            debug!("far-back standby: skipping this round");
            return Ok(());
        }
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
        Ok(())
    }

    /// Exactly once: [`Error::Misconfiguration`] naming the live peers that do not deliver
    /// exactly once (protocol.md, section 8.5). The run then stops gracefully, so the
    /// peers stop counting it and take its buckets.
    pub(super) fn check_one_delivery_mode(&self, coordination: &Coordination) -> Result<()> {
        let now = self.store.clock().now_ticks();
        let peers = coordination.peers_not_exactly_once(
            &self.options.relay_id,
            now,
            duration_to_ticks(self.options.lease_duration),
        );
        if peers.is_empty() {
            return Ok(());
        }
        Err(Error::misconfigured(format!(
            "mixed delivery: live relay(s) {} do not deliver exactly once (no `Delivery = \
             exactly-once` on their heartbeats); an exactly-once relay shares no bucket with \
             them and stops. Run every relay of the table with the same OUTBOX_DELIVERY",
            peers.join(", ")
        )))
    }

    /// Heartbeat, one read, the plan, then renew / release / claim.
    #[instrument(skip_all, level = "debug")]
    async fn acquire(&self, state: &mut RunState) -> Result<()> {
        let me = self.options.relay_id.as_str();
        let d_ticks = duration_to_ticks(self.options.lease_duration);
        let refused_before = self.refused_snapshot();
        let heartbeat_ok = self.heartbeat(state).await;
        let coordination = self.store.read_coordination().await?;
        if self.store.exactly_once {
            self.check_one_delivery_mode(&coordination)?;
        }
        let mut owned_before: BTreeSet<u32> = state.owned.keys().copied().collect();
        let now = self.store.clock().now_ticks();
        let plan = plan::compute(&PlanInput {
            bucket_count: self.options.bucket_count,
            me,
            active_relays: &coordination.active_relays(now, d_ticks),
            leases: &coordination.lease_views(now),
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

        let times = RoundTimes {
            now,
            new_expiry: now + d_ticks,
            valid_until: Instant::now() + self.options.lease_duration,
        };
        self.renew_kept(state, &plan, &coordination, times).await;
        self.release_excess(state, &plan, &coordination, &mut owned_before)
            .await;
        // A peer that stamped its stop and still holds leases is releasing them, one request
        // per bucket, landing in any order: a plan made from this read may have seen some
        // releases and a peer's plan others, and two plans from different halves of one
        // handover can claim the same bucket. Claim nothing; the handover time below reads
        // again a step later, and every claim of the handover is planned from all of it.
        let releasing: Vec<&str> = coordination
            .releasing(
                me,
                self.options.bucket_count,
                now,
                duration_to_ticks(HANDOVER_WATCH),
            )
            .into_iter()
            .map(|r| r.relay_id.as_str())
            .collect();
        if !heartbeat_ok && !plan.claim.is_empty() {
            warn!("heartbeat refused: claiming nothing this round");
        } else if !releasing.is_empty() && !plan.claim.is_empty() {
            info!(
                stopping = ?releasing,
                "a stopped peer's releases are still landing: claiming nothing, reading again in a handover step"
            );
        } else {
            self.claim_planned(state, &plan, times).await;
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
        state.peers_hold_the_rest = coordination.peers_hold(
            me,
            (0..self.options.bucket_count).filter(|b| !state.owned.contains_key(b)),
            now,
            d_ticks,
            duration_to_ticks(self.options.poll_interval),
            self.announced_stop(state, now),
        );
        state.early_acquire = self.handover_time(&coordination, now);
        self.cleanup(&coordination, now, d_ticks).await;
        self.sample_backlog_if_due(state, now).await;
        Ok(())
    }

    /// Writes the heartbeat (announcing the planned stop, if the run has a deadline);
    /// whether it landed. A heartbeat that fails (throttled, timed out) must not keep the
    /// leases already held from being renewed: only claims depend on it.
    async fn heartbeat(&self, state: &mut RunState) -> bool {
        let me = self.options.relay_id.as_str();
        let beat_at = self.store.clock().now_ticks();
        let stops_at = self.announced_stop(state, beat_at);
        let ok = match self.store.heartbeat(me, beat_at, stops_at).await {
            Ok(ok) => ok,
            Err(e) => {
                warn!(error = %crate::error::chain(&e), "heartbeat failed: renewing, claiming nothing this round");
                false
            }
        };
        let first_round = state.last_heartbeat.is_none();
        if ok {
            state.last_heartbeat = Some(Instant::now());
        }
        if first_round && ok {
            // Relays that start together (a scheduled fleet, a rollout) give each other's
            // first heartbeats a moment to land, so their first plans count each other
            // instead of claiming into each other's ranges.
            // A relay a woken host started alone, whose heartbeat landed soon after the
            // host's last read, pauses less (RelayOptions::alone_until).
            let alone = self
                .options
                .alone_until
                .is_some_and(|by| Instant::now() <= by);
            let pause = if alone { ALONE_JOIN_DELAY } else { JOIN_DELAY };
            tokio::time::sleep(pause.min(self.options.lease_renew_interval / 4)).await;
        }
        ok
    }

    /// The stop a heartbeat written at `beat_at` announces (`StopsAtUtc`): when the run
    /// stops working, if it has a deadline.
    pub(super) fn announced_stop(&self, state: &RunState, beat_at: i64) -> Option<i64> {
        state
            .stops_at
            .map(|s| beat_at + duration_to_ticks(s.saturating_duration_since(Instant::now())))
    }

    /// Step 1: renews what the plan keeps; one failed renewal does not undo the others
    /// (its bucket keeps its old validity and the next round tries again).
    async fn renew_kept(
        &self,
        state: &mut RunState,
        plan: &Plan,
        coordination: &Coordination,
        times: RoundTimes,
    ) {
        let me = self.options.relay_id.as_str();
        let renewals: Vec<(u32, Renewal)> = stream::iter(
            plan.keep
                .iter()
                .map(|&b| {
                    let read = coordination
                        .lease(b)
                        .map_or(ReadExpiry::from(0), LeaseRecord::read_expiry);
                    async move {
                        if times.new_expiry <= read.ticks {
                            return Ok::<_, Error>((
                                b,
                                Renewal::ClockBehind {
                                    stored_expiry: read.ticks,
                                },
                            ));
                        }
                        // A lease without a usable expiry reads as lapsed: retaken.
                        let unlapsed = (read.ticks > times.now).then_some(times.now);
                        let ok = self
                            .store
                            .renew(b, me, read, times.new_expiry, unlapsed)
                            .await?;
                        Ok((
                            b,
                            if ok {
                                Renewal::Renewed
                            } else {
                                Renewal::Refused
                            },
                        ))
                    }
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency)
        .collect::<Vec<Result<_>>>()
        .await
        .into_iter()
        .filter_map(|r| {
            r.map_err(|e| warn!(error = %crate::error::chain(&e), "renewal failed"))
                .ok()
        })
        .collect();
        for (b, outcome) in renewals {
            match outcome {
                Renewal::ClockBehind { stored_expiry } => {
                    warn!(
                        bucket = b,
                        stored_expiry,
                        now = times.now,
                        "clock is behind the lease's stored expiry: not renewing, not publishing this bucket until it passes"
                    );
                    let o = state.owned.entry(b).or_insert_with(|| {
                        Owned::new(stored_expiry, Instant::now(), Instant::now())
                    });
                    o.expires_at = stored_expiry;
                    o.blocked_until = Some(stored_expiry);
                }
                Renewal::Renewed => {
                    let o = state.owned.entry(b).or_insert_with(|| {
                        Owned::new(times.new_expiry, times.valid_until, Instant::now())
                    });
                    o.expires_at = times.new_expiry;
                    o.valid_until = times.valid_until;
                    o.blocked_until = None;
                }
                Renewal::Refused => {
                    state.owned.remove(&b);
                    state.leases_lost += 1;
                    self.metrics.leases_lost(1);
                }
            }
        }
    }

    /// Step 2: hands back what exceeds the share. It stops publishing a bucket before
    /// the request: a release that times out may still land.
    async fn release_excess(
        &self,
        state: &mut RunState,
        plan: &Plan,
        coordination: &Coordination,
        owned_before: &mut BTreeSet<u32>,
    ) {
        let me = self.options.relay_id.as_str();
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
                    let read = coordination
                        .lease(b)
                        .map_or(ReadExpiry::from(0), LeaseRecord::read_expiry);
                    async move { self.store.release(b, me, Some(read)).await }
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency)
        .collect()
        .await;
        for (b, r) in plan.release.iter().zip(released) {
            match r {
                Ok(_) => info!(bucket = b, "handed a bucket back"),
                Err(e) => {
                    warn!(bucket = b, error = %crate::error::chain(&e), "release failed; the lease will lapse")
                }
            }
        }
    }

    /// Step 3: claims what the plan gives it.
    async fn claim_planned(&self, state: &mut RunState, plan: &Plan, times: RoundTimes) {
        let me = self.options.relay_id.as_str();
        let claims: Vec<(u32, bool)> = stream::iter(
            plan.claim
                .iter()
                .map(|&b| async move {
                    let ok = self.store.claim(b, me, times.now, times.new_expiry).await?;
                    Ok::<_, Error>((b, ok))
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .filter_map(|r| {
            r.map_err(|e| warn!(error = %crate::error::chain(&e), "claim failed"))
                .ok()
        })
        .collect();
        let mut acquired = 0;
        for (b, ok) in claims {
            if ok {
                acquired += 1;
                state.owned.insert(
                    b,
                    Owned::new(times.new_expiry, times.valid_until, Instant::now()),
                );
            }
        }
        if acquired > 0 {
            info!(claimed = acquired, "claimed buckets");
            state.leases_acquired += acquired as u64;
            self.metrics.leases_acquired(acquired);
        }
    }

    /// Logs (and reports) every bucket this relay started or stopped publishing, so a
    /// history of who believed it owned what can be checked afterwards.
    pub(super) fn log_ownership(&self, before: &BTreeSet<u32>, state: &RunState) {
        for b in state.owned.keys().filter(|b| !before.contains(b)) {
            info!(bucket = b, ownership = "owns", "bucket ownership");
            self.metrics.ownership(*b, true);
        }
        for b in before.iter().filter(|b| !state.owned.contains_key(b)) {
            info!(bucket = b, ownership = "disowns", "bucket ownership");
            self.metrics.ownership(*b, false);
        }
    }

    /// When to run an extra acquisition for a peer that announced its stop
    /// ([`Coordination::handover_at`]), on the monotonic clock.
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
                Err(e) => {
                    debug!(error = %crate::error::chain(&e), "heartbeat cleanup failed; next round retries")
                }
            }
        }
    }

    /// The owner of bucket zero samples the backlog once a [`BACKLOG_SAMPLE_INTERVAL`]
    /// (never in the first round), bounded by half a renew interval: a slow count must not
    /// delay the next round or the deadline.
    async fn sample_backlog_if_due(&self, state: &mut RunState, now: i64) {
        let due = state
            .last_backlog_sample
            .map_or(state.rounds > 0, |t| t.elapsed() >= BACKLOG_SAMPLE_INTERVAL);
        if !(state.owned.contains_key(&0) && due) {
            return;
        }
        state.last_backlog_sample = Some(Instant::now());
        let bound = self.options.lease_renew_interval / 2;
        if tokio::time::timeout(bound, self.sample_backlog(now))
            .await
            .is_err()
        {
            debug!("backlog sample cut short");
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
                Err(e) => debug!(error = %crate::error::chain(&e), "backlog sample failed"),
            }
        }
    }
}
