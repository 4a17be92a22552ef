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

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::{info, warn};

use super::state::RunState;
use super::Relay;
use crate::error::Result;
use crate::publish::Publisher;

impl<P: Publisher> Relay<P> {
    /// Announces the stop, probes every owned bucket, and says whether the run may stop
    /// now (`true`), or found work and goes on (`false`, with the announcement taken back).
    pub(super) async fn confirm_idle(&self, state: &mut RunState) -> Result<bool> {
        let me = self.options.relay_id.as_str();
        let now = self.store.clock().now_ticks();
        if !self.store.heartbeat(me, now, Some(now)).await? {
            warn!("idle: the stop announcement was refused; running on");
            return Ok(false);
        }
        state.last_heartbeat = Some(Instant::now());
        let owned: Vec<u32> = state.owned.keys().copied().collect();
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
        state.last_activity = Some(Instant::now());
        // Take the announcement back (peers would otherwise wait for a handover).
        let beat_at = self.store.clock().now_ticks();
        if let Err(e) = self
            .store
            .heartbeat(me, beat_at, self.announced_stop(state, beat_at))
            .await
        {
            warn!(error = %e, "idle: taking the stop announcement back failed; the next round writes it");
        }
        Ok(false)
    }
}
