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
use crate::options::RelayOptions;
use crate::publish::{PublishOutcome, Publisher};
use crate::schema::{StoredMessage, MAX_ITEM_BYTES};

/// What one bucket's batch did.
#[derive(Debug)]
pub(super) enum BatchResult {
    /// Nothing waiting (probe or fetch found nothing).
    Idle,
    /// Not started (or stopped before publishing): too close to the lease's end or the
    /// deadline. Nothing changed.
    Skipped,
    /// The fetch ran into the batch's time limit, or ended with none of it left (items
    /// this large, a slow table): nothing was published; the bucket's next fetches read
    /// half as many bytes.
    FetchCut,
    /// Published and deleted `deleted` of `fetched` messages, the last removed one being `last`.
    Done {
        fetched: usize,
        deleted: usize,
        last: Option<u64>,
        full: bool,
    },
    /// A retryable failure; try again after the backoff (with the head alone when the
    /// publish failed).
    Failed {
        deleted: usize,
        last: Option<u64>,
        publish_failed: bool,
    },
    /// The bucket is stuck on an unreadable item or a record the broker rejects, after
    /// `deleted` messages went through.
    Poison {
        /// What is wrong: the unreadable item ([`Error::Corrupt`]), a topic outside the
        /// allow-list ([`Error::InvalidMessage`]), the broker's refusal
        /// ([`Error::KafkaRejected`], with the client's error as its source).
        error: Error,
        /// The message the bucket is stuck on (its id and sequence), when it could be read.
        at: Option<(String, u64)>,
        deleted: usize,
        last: Option<u64>,
    },
}

/// How long past its limit an in-flight request may take to answer before the batch stops
/// waiting for it (it is bounded by its own limit; this only covers the answer's way back).
const PUBLISH_GRACE: Duration = Duration::from_millis(250);

/// How far past the end of work (the deadline minus the stop reserve) the last wave's
/// deletes may run.
const DELETE_PAST_WORK: Duration = Duration::from_millis(500);

/// The time limits of one batch, all within the lease's validity (by the monotonic clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BatchLimits {
    /// Nothing is fetched or published after this: the end of the wave, and a renew
    /// interval before the lease's validity ends.
    pub(super) publish: Instant,
    /// Nothing is deleted after this: a quarter of a renew interval past `publish`, a
    /// quarter of a renew interval before the lease's validity ends, and at most
    /// [`DELETE_PAST_WORK`] past the end of work (the stop keeps the rest of its reserve).
    pub(super) delete: Instant,
}

impl BatchLimits {
    pub(super) fn new(
        options: &RelayOptions,
        owned: &Owned,
        wave_end: Instant,
        work_until: Option<Instant>,
        now: Instant,
    ) -> Self {
        let renew = options.lease_renew_interval;
        let publish = wave_end.min(owned.valid_until.checked_sub(renew).unwrap_or(now));
        let mut delete =
            (publish + renew / 4).min(owned.valid_until.checked_sub(renew / 4).unwrap_or(now));
        if let Some(w) = work_until {
            // The last wave leaves the stop its reserve.
            delete = delete.min(w + DELETE_PAST_WORK);
        }
        BatchLimits {
            publish,
            delete: delete.max(publish),
        }
    }
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
        // Each result is applied as its batch ends, not when the whole wave has: a wave cut
        // by the hard deadline keeps the counts of the batches that finished.
        let mut results = stream::iter(
            due.into_iter()
                .map(|(b, o)| async move {
                    let started = Instant::now();
                    let limits = BatchLimits::new(&self.options, &o, wave_end, work_until, started);
                    let r = self.batch(b, &o, limits, estimate).await;
                    (b, r, started.elapsed())
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.store.options().max_concurrency);
        let mut fault = None;
        while let Some((bucket, result, took)) = results.next().await {
            let result = result.map(|report| {
                state.settle(
                    self.metrics.as_ref(),
                    bucket,
                    report.settled,
                    report.unconfirmed,
                );
                report.result
            });
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

    /// The share of [`RelayOptions::max_in_flight_bytes`] one batch may fetch: the relay
    /// runs up to the store's `max_concurrency` batches at once.
    ///
    /// [`RelayOptions::max_in_flight_bytes`]: crate::RelayOptions::max_in_flight_bytes
    fn batch_bytes(&self) -> usize {
        self.options.max_in_flight_bytes / self.store.options().max_concurrency.max(1)
    }

    /// Probe (unless dirty), fetch, publish, delete the acknowledged prefix. Every step is
    /// bounded by the lease's validity ([`BatchLimits`]): nothing is fetched or published
    /// after `limits.publish`, nothing deleted after `limits.delete`; a batch cut short
    /// deletes the acknowledged prefix and leaves the rest for the next batch.
    async fn batch(
        &self,
        bucket: u32,
        owned: &Owned,
        limits: BatchLimits,
        estimate: Duration,
    ) -> Result<BatchReport> {
        let limit = limits.publish;
        if Instant::now() + estimate >= limit {
            return Ok(BatchResult::Skipped.into());
        }
        if !owned.dirty && !self.store.probe(bucket).await? {
            return Ok(BatchResult::Idle.into());
        }
        // After a failed publish the head goes out alone first (the reference relay's
        // rule): a poison or oversized head does not send the rest of the batch again on
        // every retry.
        let count = if owned.head_only {
            1
        } else {
            self.options.batch_size
        };
        // After fetches cut at their time limit, a smaller share, in bytes and in items
        // asked of each query (as many as fit the share at DynamoDB's largest item size,
        // at least one): a backlog of large items drains however slow the table.
        let bytes = (self.batch_bytes() >> owned.fetch_halvings).max(1);
        let count = if owned.fetch_halvings > 0 {
            count.min(u32::try_from((bytes / MAX_ITEM_BYTES).max(1)).unwrap_or(u32::MAX))
        } else {
            count
        };
        let fetching = self
            .store
            .fetch_bounded(bucket, owned.last_removed, count, bytes);
        let fetched = match tokio::time::timeout_at(limit, fetching).await {
            Err(_) => return Ok(BatchResult::FetchCut.into()),
            Ok(Ok(f)) => f,
            Ok(Err(e @ Error::Corrupt { .. })) => {
                return Ok(BatchResult::Poison {
                    error: e,
                    at: None,
                    deleted: 0,
                    last: None,
                }
                .into())
            }
            Ok(Err(e)) => return Err(e),
        };
        // A strongly consistent read from the bucket's head: it settles what earlier
        // batches published but could not confirm deleted.
        let settled = Some(Settled::of(&owned.unconfirmed, &fetched.messages));
        if fetched.messages.is_empty() {
            return Ok(BatchReport {
                result: BatchResult::Idle,
                settled,
                unconfirmed: Vec::new(),
            });
        }
        // The head's age, every batch: a bucket stuck behind its head (a poison item,
        // publishes failing) reports it growing at each retry, which the stuck-outbox alarm
        // watches.
        let head = &fetched.messages[0];
        let waited = self
            .store
            .clock()
            .now_ticks()
            .saturating_sub(head.message.created_at_ticks);
        self.metrics
            .head_age(bucket, crate::clock::ticks_to_duration(waited.max(0)));
        // The relay's topic allow-list, the backstop behind every writer's: a message on
        // another topic (written straight into the table, past the enqueue service) is
        // never published. The batch stops in front of it, and the bucket parks there as
        // poison (logged, counted) until an operator quarantines it; the rest of the fleet
        // goes on.
        let allowed = &self.store.options().allowed_topics;
        let refused = fetched
            .messages
            .iter()
            .position(|m| !allowed.allows(&m.message.topic))
            .map(|i| {
                let m = &fetched.messages[i];
                let error = Error::InvalidMessage {
                    field: "topic".into(),
                    rule: format!("{}; not published", allowed.refusal(&m.message.topic)),
                };
                (i, error, (m.message.message_id.to_string(), m.sequence))
            });
        let refused = match refused {
            Some((0, error, at)) => {
                return Ok(BatchReport {
                    result: BatchResult::Poison {
                        error,
                        at: Some(at),
                        deleted: 0,
                        last: None,
                    },
                    settled,
                    unconfirmed: Vec::new(),
                });
            }
            other => other,
        };
        let publishable =
            &fetched.messages[..refused.as_ref().map_or(fetched.messages.len(), |r| r.0)];
        if Instant::now() >= limit {
            // The fetch took the batch's whole time: as good as cut.
            return Ok(BatchReport {
                result: BatchResult::FetchCut,
                settled,
                unconfirmed: Vec::new(),
            });
        }
        // Each produce request is bounded by the limit (what was acknowledged by then is the
        // prefix); a publisher that cannot say is cut at it, counting nothing acknowledged:
        // the messages stay and go out again (duplicates, never a loss).
        let publishing = self.publisher.publish_until(publishable, limit);
        let outcome = tokio::time::timeout_at(limit + PUBLISH_GRACE, publishing)
            .await
            .unwrap_or_else(|_| {
                PublishOutcome::failed(Error::DeadlineExceeded("publishing a batch"))
            });
        let acked = outcome.acknowledged.min(publishable.len());
        let sequences: Vec<u64> = publishable[..acked].iter().map(|m| m.sequence).collect();
        // Deletes retry until the delete limit, then give up: what stays is published again.
        let delete_deadline = limits.delete;
        let deleted = if sequences.is_empty() {
            0
        } else {
            // Bounded by the delete limit itself (no chunk starts after it, one in
            // flight is cut at it), so the chunks it did delete are counted.
            match self
                .store
                .delete_messages(bucket, &sequences, delete_deadline)
                .await
            {
                Ok(n) => n,
                Err(e) => {
                    warn!(bucket, error = %crate::error::chain(&e), "deleting published messages failed; they will be published again");
                    0
                }
            }
        };
        let last = deleted.checked_sub(1).map(|i| sequences[i]);
        // Acknowledged by the brokers, not known deleted (a delete cut at its limit may
        // still land): the next fetch of the bucket settles them.
        let unconfirmed = sequences[deleted..].to_vec();
        let result = match outcome.error {
            // Everything in front of the refused message went through: park at it.
            None if deleted == sequences.len() && refused.is_some() => {
                let (_, error, at) = refused.expect("checked in the guard");
                BatchResult::Poison {
                    error,
                    at: Some(at),
                    deleted,
                    last,
                }
            }
            None if deleted == sequences.len() => BatchResult::Done {
                fetched: fetched.messages.len(),
                deleted,
                last,
                full: fetched.messages.len() as u32 >= count || fetched.bytes >= self.batch_bytes(),
            },
            None => BatchResult::Failed {
                deleted,
                last,
                publish_failed: false,
            },
            Some(e @ Error::KafkaRejected { .. }) => BatchResult::Poison {
                error: e,
                at: fetched
                    .messages
                    .get(acked)
                    .map(|m| (m.message.message_id.to_string(), m.sequence)),
                deleted,
                last,
            },
            Some(e) => {
                warn!(bucket, acknowledged = acked, error = %crate::error::chain(&e), "publish failed");
                BatchResult::Failed {
                    deleted,
                    last,
                    publish_failed: true,
                }
            }
        };
        Ok(BatchReport {
            result,
            settled,
            unconfirmed,
        })
    }
}

/// What one batch reports: its result, and what it learned of earlier batches' deletes.
#[derive(Debug)]
pub(super) struct BatchReport {
    pub(super) result: BatchResult,
    /// What the batch's fetch settled of the bucket's unconfirmed deletes (`None`: no
    /// fetch completed).
    pub(super) settled: Option<Settled>,
    /// Messages this batch published but could not confirm deleted.
    pub(super) unconfirmed: Vec<u64>,
}

impl From<BatchResult> for BatchReport {
    fn from(result: BatchResult) -> Self {
        BatchReport {
            result,
            settled: None,
            unconfirmed: Vec::new(),
        }
    }
}

/// Published messages whose delete was not confirmed, as a strongly consistent fetch from
/// the bucket's head finds them: `gone` (below its first item, or missing within what it
/// read: deleted, so published and removed), and `unknown` (beyond what it read). The
/// ones it found are neither: they go out again and are counted then.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Settled {
    pub(super) gone: Vec<u64>,
    pub(super) unknown: Vec<u64>,
}

impl Settled {
    pub(super) fn of(unconfirmed: &[u64], fetched: &[StoredMessage]) -> Self {
        let mut settled = Settled::default();
        let (first, last) = match (fetched.first(), fetched.last()) {
            (Some(f), Some(l)) => (f.sequence, l.sequence),
            _ => {
                settled.gone = unconfirmed.to_vec();
                return settled;
            }
        };
        for &s in unconfirmed {
            if s < first || (s <= last && !fetched.iter().any(|m| m.sequence == s)) {
                settled.gone.push(s);
            } else if s > last {
                settled.unknown.push(s);
            }
        }
        settled
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn every_step_ends_inside_the_lease_and_the_last_wave_leaves_the_stop_its_reserve() {
        let o = RelayOptions {
            lease_duration: 9000 * MS,
            lease_renew_interval: 3000 * MS,
            ..RelayOptions::default()
        };
        let now = Instant::now();
        let owned = Owned::new(0, now + 9000 * MS, now);
        // A fresh lease: the wave ends first (a renew interval), deletes a quarter later.
        let l = BatchLimits::new(&o, &owned, now + 3000 * MS, None, now);
        assert_eq!((l.publish, l.delete), (now + 3000 * MS, now + 3750 * MS));
        // An old lease (valid 4 s more): publishing ends a renew interval before it,
        // deleting a quarter of one before it.
        let old = Owned::new(0, now + 4000 * MS, now);
        let l = BatchLimits::new(&o, &old, now + 3000 * MS, None, now);
        assert_eq!((l.publish, l.delete), (now + 1000 * MS, now + 1750 * MS));
        let l = BatchLimits::new(
            &o,
            &Owned::new(0, now + 3500 * MS, now),
            now + 3000 * MS,
            None,
            now,
        );
        assert_eq!((l.publish, l.delete), (now + 500 * MS, now + 1250 * MS));
        // The last wave: deletes end at most half a second past the end of work.
        let l = BatchLimits::new(&o, &owned, now + 1000 * MS, Some(now + 1000 * MS), now);
        assert_eq!((l.publish, l.delete), (now + 1000 * MS, now + 1500 * MS));
        // A lease already too short to publish: both limits passed or about to.
        let l = BatchLimits::new(
            &o,
            &Owned::new(0, now + 1000 * MS, now),
            now + 3000 * MS,
            None,
            now,
        );
        assert!(l.publish <= now && l.delete <= now + 250 * MS, "{l:?}");
    }
}
