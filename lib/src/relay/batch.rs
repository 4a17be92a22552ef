//! One bucket's batch: probe (unless more is known to wait, or the last batch removed
//! messages), fetch, publish within a
//! limit, delete the acknowledged prefix, and say what happened ([`BatchResult`]); and a
//! wave of batches, one per due bucket, several at once.

use std::ops::ControlFlow;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::outcome::{BatchReport, BatchResult, Settled};
use super::state::{Owned, RunState};
use super::Relay;
use crate::error::{Error, Result};
use crate::message::StoredMessage;
use crate::options::RelayOptions;
use crate::protocol::schema::MAX_ITEM_BYTES;
use crate::protocol::store::Fetched;
use crate::protocol::watermark::{OutboxIdentity, EXACTLY_ONCE_BATCH_LIMIT};
use crate::publish::{Delivery, PublishOutcome, Publisher};

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
        self.bind_outbox().await?;
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

    /// Exactly once: tells the publisher which outbox it publishes for (the table's ARN
    /// and the key prefix name the buckets' transactional ids), once per relay, before its
    /// first batch. A failed `DescribeTable` fails the wave (retried after the backoff).
    async fn bind_outbox(&self) -> Result<()> {
        if self.publisher.delivery() != Delivery::ExactlyOnce {
            return Ok(());
        }
        self.outbox_bound
            .get_or_try_init(|| async {
                let arn = self.store.table_arn().await?;
                let identity = OutboxIdentity::new(&arn, &self.store.options().key_prefix);
                info!(
                    table_arn = %arn,
                    outbox_id = identity.id(),
                    bucket_0 = %identity.transactional_id(0),
                    "exactly-once delivery: one transactional id per bucket"
                );
                self.publisher
                    .bind_outbox(&identity, self.options.lease_duration);
                Ok::<(), Error>(())
            })
            .await?;
        Ok(())
    }

    /// The share of [`RelayOptions::max_in_flight_bytes`] one batch may fetch: the relay
    /// runs up to the store's `max_concurrency` batches at once.
    ///
    /// [`RelayOptions::max_in_flight_bytes`]: crate::RelayOptions::max_in_flight_bytes
    fn batch_bytes(&self) -> usize {
        self.options.max_in_flight_bytes / self.store.options().max_concurrency.max(1)
    }

    /// One bucket's batch, step by step: probe (unless dirty or just busy), size, fetch, check the
    /// allow-list, publish, delete the acknowledged prefix, classify. Every step is bounded
    /// by the lease's validity ([`BatchLimits`]): nothing is fetched or published after
    /// `limits.publish`, nothing deleted after `limits.delete`; a batch cut short deletes
    /// the acknowledged prefix and leaves the rest for the next batch.
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
        if !owned.dirty && !owned.fetch_next && !self.store.probe(bucket).await? {
            return Ok(BatchResult::Idle.into());
        }
        let size = self.size_for(owned);
        let fetched = match self.fetch_head(bucket, owned, size, limit).await? {
            ControlFlow::Continue(fetched) => fetched,
            ControlFlow::Break(end) => return Ok(end.into()),
        };
        // A strongly consistent read from the bucket's head: it settles what earlier
        // batches published but could not confirm deleted.
        let settled = Some(Settled::of(&owned.unconfirmed, &fetched.messages));
        let Some(head) = fetched.messages.first() else {
            return Ok(BatchReport::after_fetch(BatchResult::Idle, settled));
        };
        self.report_head_age(bucket, head);
        let refused = match self.first_refused(&fetched.messages) {
            Some(Refused {
                index: 0,
                error,
                at,
            }) => {
                let poison = BatchResult::Poison {
                    error,
                    at: Some(at),
                    deleted: 0,
                    last: None,
                };
                return Ok(BatchReport::after_fetch(poison, settled));
            }
            other => other,
        };
        let publishable =
            &fetched.messages[..refused.as_ref().map_or(fetched.messages.len(), |r| r.index)];
        if Instant::now() >= limit {
            // The fetch took the batch's whole time: as good as cut.
            return Ok(BatchReport::after_fetch(BatchResult::FetchCut, settled));
        }
        let outcome = self.publish_within(publishable, limit).await;
        let acked = outcome.acknowledged.min(publishable.len());
        self.report_commit_to_ack(bucket, &publishable[..acked]);
        let sequences: Vec<u64> = publishable[..acked].iter().map(|m| m.sequence).collect();
        let deleted = self
            .delete_published(bucket, &publishable[..acked], limits.delete)
            .await;
        if let Some(first) = sequences.first() {
            debug!(
                bucket,
                acknowledged = sequences.len(),
                deleted,
                first_sequence = first,
                last_deleted_sequence = deleted.checked_sub(1).map(|i| sequences[i]),
                "deleted published messages"
            );
        }
        let full =
            fetched.messages.len() as u32 >= size.count || fetched.bytes >= self.batch_bytes();
        let published = Published {
            sequences: &sequences,
            deleted,
        };
        let result = classify(
            bucket,
            outcome.error,
            published,
            refused,
            &fetched.messages,
            full,
        );
        Ok(BatchReport {
            result,
            settled,
            // Acknowledged by the brokers, not known deleted (a delete cut at its limit may
            // still land): the next fetch of the bucket settles them.
            unconfirmed: sequences[deleted..].to_vec(),
        })
    }

    /// Step one, the size: how many items and bytes the batch asks of the bucket.
    fn size_for(&self, owned: &Owned) -> BatchSize {
        // After a failed publish the head goes out alone first (the reference relay's
        // rule): a poison or oversized head does not send the rest of the batch again on
        // every retry.
        let count = if owned.head_only {
            1
        } else if self.publisher.delivery() == Delivery::ExactlyOnce {
            // A transaction's watermark lists every message it publishes.
            self.options.batch_size.min(EXACTLY_ONCE_BATCH_LIMIT)
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
        BatchSize { count, bytes }
    }

    /// Step two, the fetch: the bucket's messages after the last one removed, `size` of
    /// them, by `limit`. It breaks with the batch's result when the fetch ran into `limit`
    /// ([`BatchResult::FetchCut`]) or the head cannot be read ([`BatchResult::Poison`]).
    async fn fetch_head(
        &self,
        bucket: u32,
        owned: &Owned,
        size: BatchSize,
        limit: Instant,
    ) -> Result<ControlFlow<BatchResult, Fetched>> {
        let fetching = self
            .store
            .fetch_bounded(bucket, owned.last_removed, size.count, size.bytes);
        match tokio::time::timeout_at(limit, fetching).await {
            Err(_) => Ok(ControlFlow::Break(BatchResult::FetchCut)),
            Ok(Ok(f)) => {
                debug!(
                    bucket,
                    after = owned.last_removed,
                    fetched = f.messages.len(),
                    first_sequence = f.messages.first().map(|m| m.sequence),
                    last_sequence = f.messages.last().map(|m| m.sequence),
                    "fetched"
                );
                Ok(ControlFlow::Continue(f))
            }
            Ok(Err(e @ Error::Corrupt { .. })) => Ok(ControlFlow::Break(BatchResult::Poison {
                error: e,
                at: None,
                deleted: 0,
                last: None,
            })),
            Ok(Err(e)) => Err(e),
        }
    }

    /// The head's age, every batch: a bucket stuck behind its head (a poison item,
    /// publishes failing) reports it growing at each retry, which the stuck-outbox alarm
    /// watches.
    fn report_head_age(&self, bucket: u32, head: &StoredMessage) {
        let waited = self
            .store
            .clock()
            .now_ticks()
            .saturating_sub(head.message.created_at_ticks);
        self.metrics.head_age(
            bucket,
            crate::protocol::clock::ticks_to_duration(waited.max(0)),
        );
    }

    /// Each acknowledged message's commit-to-ack latency: from its enqueue timestamp (the
    /// writer's clock) to now (the relay's), zero when the writer's clock is ahead.
    fn report_commit_to_ack(&self, bucket: u32, acknowledged: &[StoredMessage]) {
        if acknowledged.is_empty() {
            return;
        }
        let now = self.store.clock().now_ticks();
        for m in acknowledged {
            let waited = now.saturating_sub(m.message.created_at_ticks).max(0);
            self.metrics
                .commit_to_ack(bucket, crate::protocol::clock::ticks_to_duration(waited));
        }
    }

    /// Step three, the allow-list check: the first message on a topic the relay's
    /// allow-list refuses. The allow-list is the backstop behind every writer's: a message
    /// on another topic (written straight into the table, past the enqueue service) is
    /// never published. The batch stops in front of it, and the bucket parks there as
    /// poison (logged, counted) until an operator quarantines it; the rest of the fleet
    /// goes on.
    fn first_refused(&self, messages: &[StoredMessage]) -> Option<Refused> {
        let allowed = &self.store.options().allowed_topics;
        let index = messages
            .iter()
            .position(|m| !allowed.allows(&m.message.topic))?;
        let m = &messages[index];
        let error = Error::InvalidMessage {
            field: "topic".into(),
            rule: format!("{}; not published", allowed.refusal(&m.message.topic)),
        };
        Some(Refused {
            index,
            error,
            at: (m.message.message_id.to_string(), m.sequence),
        })
    }

    /// Step four, the publish. Each produce request is bounded by `limit` (what was
    /// acknowledged by then is the prefix); a publisher that cannot say is cut at it,
    /// counting nothing acknowledged: the messages stay and go out again (duplicates,
    /// never a loss).
    async fn publish_within(&self, messages: &[StoredMessage], limit: Instant) -> PublishOutcome {
        let publishing = self.publisher.publish_until(messages, limit);
        tokio::time::timeout_at(limit + PUBLISH_GRACE, publishing)
            .await
            .unwrap_or_else(|_| {
                PublishOutcome::failed(Error::DeadlineExceeded("publishing a batch"))
            })
    }

    /// Step five, the delete of the acknowledged messages `acked`: how many leading ones
    /// are known deleted. Deletes retry until `deadline` (no chunk starts after it, one in
    /// flight is cut at it, so the chunks it did delete are counted), then give up: what
    /// stays is published again (exactly once: the watermark covers it). In exactly-once
    /// mode each delete is conditional on the message id
    /// ([`DynamoDbOutboxStore::delete_messages_if_same`]), so that a late delete never
    /// removes a new message under a reused key.
    ///
    /// [`DynamoDbOutboxStore::delete_messages_if_same`]: crate::DynamoDbOutboxStore::delete_messages_if_same
    async fn delete_published(
        &self,
        bucket: u32,
        acked: &[StoredMessage],
        deadline: Instant,
    ) -> usize {
        if acked.is_empty() {
            return 0;
        }
        let exactly_once = self.publisher.delivery() == Delivery::ExactlyOnce;
        let result = if exactly_once {
            let messages: Vec<(u64, uuid::Uuid)> = acked
                .iter()
                .map(|m| (m.sequence, m.message.message_id))
                .collect();
            self.store
                .delete_messages_if_same(bucket, &messages, deadline)
                .await
        } else {
            let sequences: Vec<u64> = acked.iter().map(|m| m.sequence).collect();
            self.store
                .delete_messages(bucket, &sequences, deadline)
                .await
        };
        result.unwrap_or_else(|e| {
            let then = if exactly_once {
                "a watermark covers them"
            } else {
                "they will be published again"
            };
            warn!(bucket, error = %crate::error::chain(&e), "deleting published messages failed; {then}");
            0
        })
    }
}

/// How much one batch asks of its bucket.
#[derive(Debug, Clone, Copy)]
struct BatchSize {
    /// Items asked of each query.
    count: u32,
    /// Bytes the fetch may read.
    bytes: usize,
}

/// The first fetched message the allow-list refuses: the batch stops in front of it.
#[derive(Debug)]
struct Refused {
    /// Its place in the fetched messages.
    index: usize,
    /// Why it is refused ([`Error::InvalidMessage`] on its topic).
    error: Error,
    /// Its id and sequence.
    at: (String, u64),
}

/// What the publish and the delete did: the brokers acknowledged `sequences` (a prefix of
/// the batch), and the first `deleted` of them are known deleted.
#[derive(Debug, Clone, Copy)]
struct Published<'a> {
    sequences: &'a [u64],
    deleted: usize,
}

/// Step six, the classification: what a batch that published did, from the publisher's
/// `error` (none: everything publishable was acknowledged), what was `published` and
/// deleted, the message the allow-list `refused`, and whether the fetch was `full` (more
/// may wait).
fn classify(
    bucket: u32,
    error: Option<Error>,
    published: Published<'_>,
    refused: Option<Refused>,
    fetched: &[StoredMessage],
    full: bool,
) -> BatchResult {
    let Published { sequences, deleted } = published;
    let acked = sequences.len();
    let last = deleted.checked_sub(1).map(|i| sequences[i]);
    match error {
        None if deleted == acked => match refused {
            // Everything in front of the refused message went through: park at it.
            Some(Refused { error, at, .. }) => BatchResult::Poison {
                error,
                at: Some(at),
                deleted,
                last,
            },
            None => BatchResult::Done {
                fetched: fetched.len(),
                deleted,
                last,
                full,
            },
        },
        None => BatchResult::Failed {
            deleted,
            last,
            publish_failed: false,
            not_authorized: None,
        },
        // An authorization failure is never poison: retried after the backoff under every
        // poison policy, until an operator grants what is missing.
        Some(Error::KafkaNotAuthorized { denied, source }) => {
            let error = Error::KafkaNotAuthorized {
                denied: denied.clone(),
                source,
            };
            warn!(
                bucket,
                acknowledged = acked,
                failure = %denied.failure,
                topic = %denied.topic,
                principal = %denied.principal,
                operation = denied.operation,
                error = %crate::error::chain(&error),
                "publish not authorized; retrying after the backoff, nothing set aside"
            );
            BatchResult::Failed {
                deleted,
                last,
                publish_failed: true,
                not_authorized: Some(denied),
            }
        }
        Some(e @ Error::KafkaRejected { .. }) => BatchResult::Poison {
            error: e,
            at: fetched
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
                not_authorized: None,
            }
        }
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

    fn stored(sequence: u64) -> StoredMessage {
        StoredMessage {
            bucket: 3,
            sequence,
            message: crate::message::OutboxMessage::new("t", 4),
        }
    }

    #[test]
    fn a_batch_is_classified_by_its_publish_and_its_deletes() {
        let fetched: Vec<_> = [5, 6, 7].map(stored).to_vec();
        let published = |sequences: &'static [u64], deleted| Published { sequences, deleted };
        // Everything acknowledged and deleted: done, the last deleted one removed.
        let r = classify(3, None, published(&[5, 6, 7], 3), None, &fetched, true);
        assert!(
            matches!(
                r,
                BatchResult::Done {
                    fetched: 3,
                    deleted: 3,
                    last: Some(7),
                    full: true
                }
            ),
            "{r:?}"
        );
        // Up to the message the allow-list refused: parked at it.
        let refused = Refused {
            index: 2,
            error: Error::InvalidMessage {
                field: "topic".into(),
                rule: "r".into(),
            },
            at: ("m".into(), 7),
        };
        let r = classify(
            3,
            None,
            published(&[5, 6], 2),
            Some(refused),
            &fetched,
            false,
        );
        assert!(
            matches!(
                &r,
                BatchResult::Poison {
                    at: Some((_, 7)),
                    deleted: 2,
                    last: Some(6),
                    ..
                }
            ),
            "{r:?}"
        );
        // Published, not all deleted: a failure, not a failed publish.
        let r = classify(3, None, published(&[5, 6, 7], 1), None, &fetched, false);
        assert!(
            matches!(
                r,
                BatchResult::Failed {
                    deleted: 1,
                    last: Some(5),
                    publish_failed: false,
                    not_authorized: None,
                }
            ),
            "{r:?}"
        );
        // The broker rejected the message after the acknowledged prefix: parked at it.
        let rejected = Error::KafkaRejected {
            topic: "t".into(),
            reason: crate::error::Rejection::TooLarge,
            source: None,
        };
        let r = classify(3, Some(rejected), published(&[5], 1), None, &fetched, false);
        assert!(
            matches!(
                &r,
                BatchResult::Poison {
                    at: Some((_, 6)),
                    deleted: 1,
                    last: Some(5),
                    ..
                }
            ),
            "{r:?}"
        );
        // Any other publish error: retried, the head alone.
        let failed = Error::DeadlineExceeded("publishing a batch");
        let r = classify(3, Some(failed), published(&[], 0), None, &fetched, false);
        assert!(
            matches!(
                r,
                BatchResult::Failed {
                    deleted: 0,
                    last: None,
                    publish_failed: true,
                    not_authorized: None,
                }
            ),
            "{r:?}"
        );
        // A refused authorization after the acknowledged prefix: retried like any failed
        // publish (never parked as poison), naming who was refused what.
        let denied = crate::error::NotAuthorized {
            topic: "t".into(),
            principal: "User:nogrant".into(),
            operation: "WRITE",
            failure: crate::error::AuthorizationFailure::Topic,
        };
        let refused = Error::KafkaNotAuthorized {
            denied: denied.clone(),
            source: None,
        };
        let r = classify(3, Some(refused), published(&[5], 1), None, &fetched, false);
        match r {
            BatchResult::Failed {
                deleted: 1,
                last: Some(5),
                publish_failed: true,
                not_authorized: Some(d),
            } => assert_eq!(d, denied),
            other => panic!("{other:?}"),
        }
    }
}
