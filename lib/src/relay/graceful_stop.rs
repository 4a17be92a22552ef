//! The graceful stop: stamp the heartbeat as stopped, release every lease guarded by
//! owner, and read the leases again until none names this relay.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::warn;

use super::state::RunState;
use super::Relay;
use crate::error::{Error, Result};
use crate::publish::Publisher;

impl<P: Publisher> Relay<P> {
    /// Stamps the heartbeat as stopped, releases every lease guarded by owner, and reads
    /// the leases again until none names this relay (a claim it abandoned may land late).
    pub(super) async fn stop(&self, state: &mut RunState, deadline: Option<Instant>) -> bool {
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
                        .map(|&b| self.store.release(b, me, None::<i64>))
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
                warn!(error = %crate::error::chain(&e), "graceful stop failed: leases will lapse");
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
}
