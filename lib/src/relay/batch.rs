//! One bucket's batch: probe (unless more is known to wait), fetch, publish within a
//! limit, delete the acknowledged prefix, and say what happened ([`BatchResult`]); and a
//! wave of batches, one per due bucket, several at once.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::warn;

use super::state::{Owned, RunState};
use super::Relay;
use crate::error::{Error, Result};
use crate::publish::{PublishOutcome, Publisher};

/// What one bucket's batch did.
#[derive(Debug)]
pub(super) enum BatchResult {
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

impl<P: Publisher> Relay<P> {
    /// One batch for every bucket that is due, several buckets at once.
    pub(super) async fn work(
        &self,
        state: &mut RunState,
        work_until: Option<Instant>,
    ) -> Result<()> {
        let now = Instant::now();
        let now_ticks = self.store.clock().now_ticks();
        let estimate = state.estimate(&self.options);
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
            .filter(|(_, o)| o.due(&self.options, now, now_ticks))
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
            let applied = state.apply(
                &self.options,
                self.metrics.as_ref(),
                bucket,
                result,
                took,
                Instant::now(),
            );
            fault = fault.or(applied);
        }
        match fault {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
}
