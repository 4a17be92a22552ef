//! The poison policy's step (`OUTBOX_POISON_POLICY=quarantine-after=N`,
//! [`PoisonPolicy::QuarantineAfter`](crate::options::PoisonPolicy::QuarantineAfter)):
//! after a wave, every owned bucket whose poison head reached the attempt count has it
//! moved to the dead-letter partition (one strongly consistent `Query` of its key, then one
//! `TransactWriteItems`: put the dead letter, delete the item under `attribute_exists`,
//! and check the bucket's lease item: still this relay's, with the expiry it holds, not
//! lapsed), so a relay that lost the bucket moves nothing; then the bucket goes on past
//! it. A refused lease check drops the bucket as a refused renewal does. Under
//! the default policy ([`PoisonPolicy::Block`](crate::options::PoisonPolicy::Block)) only
//! an unpublishable record (a partition its topic does not have, a size above the topic's
//! limit) is ever due, at its first attempt; otherwise this step sends nothing.

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::state::RunState;
use super::Relay;
use crate::error::Error;
use crate::protocol::store::LeaseFence;
use crate::publish::Publisher;

impl<P: Publisher> Relay<P> {
    /// Quarantines the poison heads that are due (see the module's documentation), unless
    /// the end of work (`work_until`) has come. A failure leaves the bucket parked: its
    /// next failed attempt makes it due again.
    pub(super) async fn quarantine_due(&self, state: &mut RunState, work_until: Option<Instant>) {
        let now = Instant::now();
        if work_until.is_some_and(|w| now >= w) {
            return;
        }
        let now_ticks = self.store.clock().now_ticks();
        let due: Vec<(u32, u64, String, i64)> = state
            .owned
            .iter()
            .filter(|(_, o)| o.publishable(&self.options, now, now_ticks))
            .filter_map(|(b, o)| {
                o.quarantine
                    .clone()
                    .map(|(seq, why)| (*b, seq, why, o.expires_at))
            })
            .collect();
        for (bucket, sequence, reason, expires_at) in due {
            let fence = LeaseFence {
                relay_id: self.options.relay_id.clone(),
                expires_at,
                now: self.store.clock().now_ticks(),
            };
            let result = self
                .store
                .quarantine_fenced(bucket, sequence, &reason, &fence)
                .await;
            let Some(o) = state.owned.get_mut(&bucket) else {
                continue;
            };
            match result {
                Ok(_) => {
                    error!(
                        bucket,
                        sequence,
                        reason = %reason,
                        "quarantined a poison item: moved to the dead-letter partition, the bucket goes on past it (`outboxctl dead-letters show {bucket} {sequence}`)"
                    );
                    self.metrics.quarantined(bucket);
                    state.quarantined += 1;
                    o.quarantined(sequence);
                }
                Err(Error::InvalidMessage { .. }) => {
                    // No item at that key any more: an operator moved it first.
                    info!(
                        bucket,
                        sequence, "the poison item is gone already; the bucket goes on"
                    );
                    o.quarantined(sequence);
                }
                Err(Error::ConditionFailed { .. }) => {
                    // The lease moved on: another relay may own the bucket now. Nothing
                    // moved; the bucket is no longer this relay's.
                    warn!(
                        bucket,
                        sequence,
                        "not quarantining a poison item: the bucket's lease is no longer this relay's"
                    );
                    state.owned.remove(&bucket);
                    state.leases_lost += 1;
                    self.metrics.leases_lost(1);
                }
                Err(e) => {
                    warn!(bucket, sequence, error = %crate::error::chain(&e), "quarantining a poison item failed; the bucket stays parked and tries again");
                    state.errors += 1;
                    o.quarantine = None;
                }
            }
        }
    }
}
