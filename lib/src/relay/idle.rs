//! The idle stop: a run whose buckets have stayed empty for
//! [`RelayOptions::idle_stop`](crate::RelayOptions::idle_stop) stops early, so that an
//! idle outbox bills almost nothing.
//!
//! The race it closes: a commit that lands just as the relay decides to stop. Before it
//! stops, the relay announces the stop in its heartbeat (`StopsAtUtc` = now), so that a
//! notified invocation reading the coordination partition after the announcement no
//! longer counts it as covering its buckets and joins instead; then it probes every bucket
//! it owns once more, strongly consistent, so that a commit acknowledged before the
//! announcement is seen. A probe that finds a message takes the announcement back and the
//! run goes on. Either way the commit is published: by a relay that joins, or by this one.
//!
//! The idle decision is taken on the coordination read of the last round, up to a renew
//! interval old; in the meantime a peer may have handed this relay buckets (its share, or
//! everything at the peer's stop). So the confirmation reads the partition again after the
//! announcement: unless live peers that stay at least as long as this relay still hold
//! every bucket it does not own, the announcement is taken back and the next round, at
//! once, claims what was handed over.

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::{info, warn};

use super::state::RunState;
use super::Relay;
use crate::error::Result;
use crate::protocol::clock::duration_to_ticks;
use crate::publish::Publisher;

impl<P: Publisher> Relay<P> {
    /// Announces the stop, probes every owned bucket not parked behind an item no relay can
    /// publish, and says whether the run may stop now (`true`), or found work and goes on
    /// (`false`, with the announcement taken back).
    pub(super) async fn confirm_idle(&self, state: &mut RunState) -> Result<bool> {
        let me = self.options.relay_id.as_str();
        let now = self.store.clock().now_ticks();
        if !self.store.heartbeat(me, now, Some(now)).await? {
            warn!("idle: the stop announcement was refused; running on");
            return Ok(false);
        }
        state.last_heartbeat = Some(Instant::now());
        if !self.peers_still_hold_the_rest(state).await {
            info!("idle: buckets were handed over or left unheld since the last round; running on");
            state.peers_hold_the_rest = false;
            state.early_acquire = Some(Instant::now());
            self.take_back_the_announcement(state).await;
            return Ok(false);
        }
        let owned: Vec<u32> = state
            .owned
            .iter()
            .filter(|(_, o)| !o.parked)
            .map(|(b, _)| *b)
            .collect();
        let probes: Vec<(u32, Result<bool>)> = stream::iter(
            owned
                .into_iter()
                .map(|b| async move { (b, self.store.probe_consistent(b).await) })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency)
        .collect()
        .await;
        let mut found = Vec::new();
        for (b, probe) in probes {
            // A failed probe counts as work: stopping must never skip a commit.
            if probe.unwrap_or(true) {
                found.push(b);
            }
        }
        if found.is_empty() {
            info!(
                owned = state.owned.len(),
                "idle: every owned bucket is empty and live peers hold the rest; stopping"
            );
            return Ok(true);
        }
        info!(buckets = ?found, "idle: messages arrived while stopping; running on");
        for b in &found {
            if let Some(o) = state.owned.get_mut(b) {
                o.dirty = true;
            }
        }
        self.take_back_the_announcement(state).await;
        Ok(false)
    }

    /// A fresh read of the coordination partition: whether live peers that stay at least as
    /// long as this relay still hold every bucket it does not own. A failed read counts as
    /// "no": stopping must never leave buckets unheld.
    async fn peers_still_hold_the_rest(&self, state: &RunState) -> bool {
        let coordination = match self.store.read_coordination().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %crate::error::chain(&e), "idle: the coordination read before stopping failed; running on");
                return false;
            }
        };
        let now = self.store.clock().now_ticks();
        coordination.peers_hold(
            self.options.relay_id.as_str(),
            (0..self.options.bucket_count).filter(|b| !state.owned.contains_key(b)),
            now,
            duration_to_ticks(self.options.lease_duration),
            duration_to_ticks(self.options.poll_interval),
            self.announced_stop(state, now),
        )
    }

    /// Takes the stop announcement back (peers would otherwise wait for a handover) and
    /// starts the idle time again, so that a relay that keeps finding reasons to run on
    /// confirms at most once per idle stop.
    async fn take_back_the_announcement(&self, state: &mut RunState) {
        state.last_activity = Some(Instant::now());
        let me = self.options.relay_id.as_str();
        let beat_at = self.store.clock().now_ticks();
        if let Err(e) = self
            .store
            .heartbeat(me, beat_at, self.announced_stop(state, beat_at))
            .await
        {
            warn!(error = %crate::error::chain(&e), "idle: taking the stop announcement back failed; the next round writes it");
        }
    }
}
