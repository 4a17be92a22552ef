//! Exactly-once publishing (`docs/protocol.md`, section 8): one Kafka transaction per batch,
//! from a transactional producer per bucket, with the bucket's watermark committed in the
//! same transaction as the group offset of the bucket's group.
//!
//! Per bucket the publisher keeps the producer and the watermark it read or wrote last.
//! Taking a bucket (the first batch, or the first after any doubt) initialises the producer,
//! which fences every earlier producer of the bucket, and only then reads the watermark.
//! A batch's messages that the watermark covers (same sequence number, same message-id
//! fingerprint) were published in a committed transaction: they count as acknowledged
//! without being sent, so the relay deletes them. The others go out in one transaction whose
//! watermark is the in-doubt set plus them; they count as acknowledged only once `EndTxn`
//! answered success. Any other outcome (a fenced producer, an error inside the transaction,
//! a commit whose answer was lost, the time running out) drops the bucket's producer and
//! watermark, so that the next batch takes the bucket again: one rule for every doubt.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rskafka::client::transaction::{TransactionError, TransactionalProducer};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::classify::{not_authorized, verdict, Verdict};
use super::kafka::{codec, now_millis, KafkaPublisher};
use super::record::{estimated_size, to_record};
use super::route::{chunks, plan, TopicRoute, Unroutable};
use super::PublishOutcome;
use crate::error::{AuthorizationFailure, BoxError, Error, Rejection};
use crate::message::StoredMessage;
use crate::protocol::watermark::{OutboxIdentity, Watermark};

/// Most transactions one publish call runs: the first, and again without a message the
/// broker rejected (or a shorter prefix), as the at-least-once publisher returns the
/// acknowledged prefix before a rejected message.
const MAX_TRANSACTIONS_PER_BATCH: usize = 3;

/// The exactly-once state of a [`KafkaPublisher`].
#[derive(Debug, Default)]
pub(crate) struct ExactlyOnce {
    binding: Mutex<Option<Binding>>,
    buckets: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<BucketTxn>>>>,
    counts: Counters,
}

/// What an exactly-once publisher did, for benchmarks and tests
/// ([`KafkaPublisher::transaction_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionCounts {
    /// Buckets taken: `FindCoordinator` and `InitProducerId` for the transactional id,
    /// `FindCoordinator` and `OffsetFetch` for the group (connections cached aside).
    pub takes: u64,
    /// Transactions committed: each sent `AddPartitionsToTxn`, its produce requests,
    /// `AddOffsetsToTxn`, `TxnOffsetCommit` and `EndTxn`.
    pub commits: u64,
    /// Transactions aborted or abandoned (the bucket then taken again).
    pub aborts: u64,
    /// Messages counted as published because a watermark covered them (not sent).
    pub covered: u64,
}

#[derive(Debug, Default)]
struct Counters {
    takes: std::sync::atomic::AtomicU64,
    commits: std::sync::atomic::AtomicU64,
    aborts: std::sync::atomic::AtomicU64,
    covered: std::sync::atomic::AtomicU64,
}

fn bump(counter: &std::sync::atomic::AtomicU64, n: u64) {
    counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

#[derive(Debug, Clone)]
struct Binding {
    identity: OutboxIdentity,
    transaction_timeout: Duration,
}

/// One bucket's producer and watermark; `None` until the bucket is taken, and again after
/// any doubt.
#[derive(Debug, Default)]
struct BucketTxn {
    taken: Option<Taken>,
}

#[derive(Debug)]
struct Taken {
    producer: TransactionalProducer,
    watermark: Watermark,
}

impl ExactlyOnce {
    pub(crate) fn bind(&self, identity: &OutboxIdentity, transaction_timeout: Duration) {
        let mut binding = self.binding.lock().unwrap_or_else(|p| p.into_inner());
        if binding.as_ref().is_some_and(|b| {
            b.identity == *identity && b.transaction_timeout == transaction_timeout
        }) {
            return;
        }
        if binding.as_ref().is_some_and(|b| b.identity != *identity) {
            // Another outbox: what was taken belongs to the old one.
            self.buckets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        *binding = Some(Binding {
            identity: identity.clone(),
            transaction_timeout,
        });
    }

    fn bucket(&self, bucket: u32) -> Arc<tokio::sync::Mutex<BucketTxn>> {
        Arc::clone(
            self.buckets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(bucket)
                .or_default(),
        )
    }

    pub(crate) fn counts(&self) -> TransactionCounts {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        TransactionCounts {
            takes: get(&self.counts.takes),
            commits: get(&self.counts.commits),
            aborts: get(&self.counts.aborts),
            covered: get(&self.counts.covered),
        }
    }

    fn binding(&self) -> Option<Binding> {
        self.binding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Which of a batch's messages the watermark covers, and so how the batch splits.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Split {
    /// Leading messages that are covered: acknowledged whatever the transaction does.
    pub(crate) leading_covered: usize,
    /// Indices of the messages to publish, ascending.
    pub(crate) to_publish: Vec<usize>,
}

/// Drops from `watermark` the entries the batch proves deleted (below its last sequence
/// number and not in it: the batch is a strongly consistent read of everything the bucket
/// holds after the last message the relay removed), then splits the batch.
pub(crate) fn reconcile(watermark: &mut Watermark, batch: &[StoredMessage]) -> Split {
    if let Some(last) = batch.last().map(|m| m.sequence) {
        let present: BTreeSet<u64> = batch.iter().map(|m| m.sequence).collect();
        let gone: Vec<u64> = watermark
            .sequences()
            .filter(|s| *s < last && !present.contains(s))
            .collect();
        for s in gone {
            watermark.remove(s);
        }
    }
    let covered: Vec<bool> = batch
        .iter()
        .map(|m| watermark.covers(m.sequence, &m.message.message_id))
        .collect();
    Split {
        leading_covered: covered.iter().take_while(|c| **c).count(),
        to_publish: (0..batch.len()).filter(|&i| !covered[i]).collect(),
    }
}

/// Why a transaction did not commit.
struct Failed {
    /// Index of the first message (of the batch) it was about, when it was about one.
    at: Option<usize>,
    error: Error,
    /// Whether the bucket must be taken again before the next transaction.
    retake: bool,
}

impl KafkaPublisher {
    /// Publishes one bucket's batch in a transaction; see the module docs.
    pub(crate) async fn publish_exactly_once(
        &self,
        eo: &ExactlyOnce,
        batch: &[StoredMessage],
        until: Instant,
    ) -> PublishOutcome {
        let Some(first) = batch.first() else {
            return PublishOutcome::complete(0);
        };
        let Some(binding) = eo.binding() else {
            return PublishOutcome::failed(Error::misconfigured(
                "exactly-once delivery: the publisher was not bound to an outbox (the relay \
                 binds it before its first batch)",
            ));
        };
        let bucket = first.bucket;
        let slot = eo.bucket(bucket);
        let mut slot = slot.lock().await;
        let deadline = until.min(Instant::now() + self.config().publish_timeout);
        if slot.taken.is_none() {
            bump(&eo.counts.takes, 1);
            match tokio::time::timeout_at(deadline, self.take(&binding, bucket)).await {
                Ok(Ok(taken)) => slot.taken = Some(taken),
                Ok(Err(e)) => return PublishOutcome::failed(e),
                Err(_) => {
                    return PublishOutcome::failed(Error::DeadlineExceeded(
                        "taking a bucket's transactional producer",
                    ))
                }
            }
        }
        let Some(taken) = slot.taken.as_mut() else {
            return PublishOutcome::failed(Error::DeadlineExceeded("taking a bucket"));
        };
        let split = reconcile(&mut taken.watermark, batch);
        let covered = (batch.len() - split.to_publish.len()) as u64;
        bump(&eo.counts.covered, covered);
        if split.to_publish.is_empty() {
            debug!(
                bucket,
                covered = batch.len(),
                "every message of the batch was published in a committed transaction"
            );
            return PublishOutcome::complete(batch.len());
        }
        let mut end = batch.len();
        let mut limit_error = None;
        let fits = taken
            .watermark
            .room_for(split.to_publish.iter().map(|&i| batch[i].sequence));
        if fits < split.to_publish.len() {
            end = split.to_publish[fits];
            limit_error = Some(Error::Kafka {
                message: format!(
                    "the watermark of bucket {bucket} holds no more messages ({} in doubt): the \
                     rest of the batch waits for the deletes",
                    taken.watermark.len()
                ),
                retryable: true,
                source: None,
            });
        }
        for _ in 0..MAX_TRANSACTIONS_PER_BATCH {
            let publish: Vec<usize> = split
                .to_publish
                .iter()
                .copied()
                .filter(|&i| i < end)
                .collect();
            if publish.is_empty() {
                // Everything before `end` was covered.
                return PublishOutcome::new(end, limit_error);
            }
            let attempt = self.transaction(&binding, taken, bucket, batch, &publish, until);
            let result = match tokio::time::timeout_at(deadline, attempt).await {
                Ok(r) => r,
                Err(_) => Err(Failed {
                    at: None,
                    error: Error::DeadlineExceeded("a batch's transaction"),
                    retake: true,
                }),
            };
            let f = match result {
                Ok(()) => {
                    bump(&eo.counts.commits, 1);
                    return PublishOutcome::new(end, limit_error);
                }
                Err(f) => f,
            };
            bump(&eo.counts.aborts, 1);
            if f.retake {
                slot.taken = None;
                return PublishOutcome::new(split.leading_covered, Some(f.error));
            }
            match f.at {
                // A message that cannot be published after the first to publish: the
                // messages before it go out in a new transaction, then it is reported, as
                // the at-least-once publisher reports the prefix before it.
                Some(at) if at > publish[0] => {
                    end = at;
                    limit_error = Some(f.error);
                }
                _ => return PublishOutcome::new(split.leading_covered, Some(f.error)),
            }
        }
        PublishOutcome::new(split.leading_covered, limit_error)
    }

    /// Takes `bucket`: initialises its producer (fencing every earlier one), then reads its
    /// watermark.
    async fn take(&self, binding: &Binding, bucket: u32) -> Result<Taken, Error> {
        let topic = &self.config().watermark_topic;
        let identity = &binding.identity;
        let transactional_id = identity.transactional_id(bucket);
        match self
            .topic_counts(
                &[topic.as_str()],
                Instant::now() + self.config().publish_timeout,
            )
            .await
            .remove(topic.as_str())
        {
            Some(Ok(_)) => {}
            Some(Err(Error::KafkaRejected {
                reason: Rejection::UnknownTopic,
                ..
            }))
            | None => {
                return Err(Error::misconfigured(format!(
                    "exactly-once delivery: the watermark topic {topic} does not exist (create \
                     it with one partition, or set OUTBOX_WATERMARK_TOPIC to one that does)"
                )))
            }
            Some(Err(e)) => return Err(e),
        }
        let producer = self
            .client()
            .transactional_producer(transactional_id.as_str(), binding.transaction_timeout)
            .await
            .map_err(|e| {
                self.transaction_error(&transactional_id, "initialising the producer", e)
            })?;
        let group = identity.group_id(bucket);
        let committed = self
            .client()
            .fetch_committed_offset(&group, topic, 0, true)
            .await
            .map_err(|e| {
                let failure = match verdict(&e) {
                    Verdict::NotAuthorized(f) => Some(f),
                    _ => None,
                };
                match failure {
                    Some(f) => not_authorized(
                        &group,
                        self.principal(),
                        "DESCRIBE (group)",
                        f,
                        Some(Box::new(e)),
                    ),
                    None => Error::Kafka {
                        message: format!("reading the watermark of group {group}"),
                        retryable: true,
                        source: Some(Box::new(e)),
                    },
                }
            })?;
        let watermark = match committed.and_then(|c| c.metadata).filter(|m| !m.is_empty()) {
            None => identity.empty_watermark(bucket),
            Some(text) => {
                let w = Watermark::decode(&text).map_err(|e| {
                    Error::misconfigured_by(
                        format!("exactly-once delivery: the watermark of group {group} cannot be read; nothing of bucket {bucket} is published or deleted"),
                        e,
                    )
                })?;
                w.check_belongs(identity, bucket).map_err(|e| {
                    Error::misconfigured_by(format!("exactly-once delivery: group {group}"), e)
                })?;
                w
            }
        };
        info!(
            bucket,
            transactional_id,
            producer = ?producer.producer_id_and_epoch(),
            in_doubt = watermark.len(),
            "took the bucket's transactional producer"
        );
        Ok(Taken {
            producer,
            watermark,
        })
    }

    /// One transaction: the partitions, the records, the watermark, the commit.
    async fn transaction(
        &self,
        binding: &Binding,
        taken: &mut Taken,
        bucket: u32,
        batch: &[StoredMessage],
        publish: &[usize],
        until: Instant,
    ) -> Result<(), Failed> {
        let header = self.config().message_id_header.as_str();
        let messages: Vec<&crate::message::OutboxMessage> =
            publish.iter().map(|&i| &batch[i].message).collect();
        let mut wanted: Vec<&str> = Vec::new();
        for m in &messages {
            if !wanted.contains(&m.topic.as_str()) {
                wanted.push(&m.topic);
            }
        }
        let mut counts = self.topic_counts(&wanted, until).await;
        let sticky = self.sticky_partitions(&wanted);
        let plan = plan(messages.iter().copied(), |t| match counts.get(t) {
            Some(Ok(n)) => Some(TopicRoute {
                partition_count: *n,
                sticky: sticky.get(t).copied().unwrap_or(0) % n.max(&1),
            }),
            _ => None,
        });
        if let Some((index, why)) = plan.stop {
            // Nothing is sent: the message that cannot be routed decides, as at least once.
            let m = &messages[index];
            let error = match why {
                Unroutable::Topic => match counts.remove(m.topic.as_str()) {
                    Some(Err(e)) => e,
                    _ => Error::Kafka {
                        message: format!("no route to topic {}", m.topic),
                        retryable: true,
                        source: None,
                    },
                },
                Unroutable::Partition(reason) => Error::KafkaRejected {
                    topic: m.topic.clone(),
                    reason,
                    source: None,
                },
            };
            return Err(Failed {
                at: Some(publish[index]),
                error,
                retake: false,
            });
        }
        let producer = &taken.producer;
        let partitions: Vec<(&str, i32)> =
            plan.groups.iter().map(|g| (g.topic, g.partition)).collect();
        let tid = producer.transactional_id().to_owned();
        let abortable =
            |e: TransactionError, what: &str| (self.transaction_error(&tid, what, e), None);
        let step: Result<(), (Error, Option<usize>)> = async {
            producer
                .add_partitions(&partitions)
                .await
                .map_err(|e| abortable(e, "adding the batch's partitions"))?;
            let timestamp = now_millis();
            let compression = codec(self.config().compression);
            let messages = &messages;
            let produces = plan.groups.iter().map(|g| async move {
                let requests = chunks(
                    &g.indices,
                    |i| estimated_size(messages[i], header),
                    self.config().max_request_bytes,
                );
                for chunk in requests {
                    let records = chunk
                        .iter()
                        .map(|&i| to_record(messages[i], header, timestamp))
                        .collect();
                    self.count_produce_request();
                    if let Err(e) = producer
                        .produce(g.topic, g.partition, records, compression)
                        .await
                    {
                        let at = (chunk.len() == 1).then(|| publish[chunk[0]]);
                        let first = publish[chunk[0]];
                        let error = self.produce_failure(g.topic, g.partition, e);
                        // A rejection of a request of several records does not say which:
                        // report it at the first without blaming it.
                        let error = match (error, at) {
                            (e @ Error::KafkaRejected { .. }, None) => Error::Kafka {
                                message: format!(
                                    "the broker refused a request of {} records to {}/{}: the \
                                     messages go out one by one to find the one at fault",
                                    chunk.len(),
                                    g.topic,
                                    g.partition
                                ),
                                retryable: true,
                                source: Some(Box::new(e)),
                            },
                            (e, _) => e,
                        };
                        return Err((error, Some(at.unwrap_or(first))));
                    }
                }
                Ok(())
            });
            futures::future::try_join_all(produces).await?;
            let mut watermark = taken.watermark.clone();
            for &i in publish {
                watermark.insert(batch[i].sequence, &batch[i].message.message_id);
            }
            let offset = watermark
                .highest()
                .map_or(0, |h| i64::try_from(h).unwrap_or(i64::MAX));
            producer
                .send_offsets(
                    &binding.identity.group_id(bucket),
                    &self.config().watermark_topic,
                    0,
                    offset,
                    Some(watermark.encode()),
                )
                .await
                .map_err(|e| abortable(e, "committing the watermark"))?;
            Ok(())
        }
        .await;
        if let Err((error, at)) = step {
            // Abort, so that the producer is ready for the next transaction; a failed abort
            // leaves the bucket to be taken again (which aborts it).
            let aborted = tokio::time::timeout_at(until, taken.producer.abort()).await;
            let retake = !matches!(aborted, Ok(Ok(())));
            let rejected = matches!(error, Error::KafkaRejected { .. });
            return Err(Failed {
                at: if rejected { at } else { None },
                error,
                retake: retake || !rejected,
            });
        }
        if Instant::now() >= until {
            let _ = tokio::time::timeout(Duration::from_secs(1), taken.producer.abort()).await;
            return Err(Failed {
                at: None,
                error: Error::DeadlineExceeded(
                    "a transaction, before its commit (the lease's time ran out)",
                ),
                retake: true,
            });
        }
        // A commit whose answer is lost is sent again once (committing twice is harmless);
        // after that the next owner, or this relay taking the bucket again, settles it.
        let mut committed = taken.producer.commit().await;
        if let Err(TransactionError::Retriable(_)) = &committed {
            committed = taken.producer.commit().await;
        }
        match committed {
            Ok(()) => {
                for &i in publish {
                    taken
                        .watermark
                        .insert(batch[i].sequence, &batch[i].message.message_id);
                }
                debug!(
                    bucket,
                    published = publish.len(),
                    in_doubt = taken.watermark.len(),
                    "transaction committed"
                );
                Ok(())
            }
            Err(e) => Err(Failed {
                at: None,
                error: self.transaction_error(&tid, "committing", e),
                retake: true,
            }),
        }
    }

    /// The error of a transactional step on `transactional_id`.
    fn transaction_error(&self, transactional_id: &str, what: &str, e: TransactionError) -> Error {
        let fenced = matches!(e, TransactionError::Fenced(_));
        let code = e.protocol_error();
        let source: BoxError = Box::new(e);
        match code {
            Some(rskafka::client::error::ProtocolError::TransactionalIdAuthorizationFailed) => {
                not_authorized(
                    transactional_id,
                    self.principal(),
                    "WRITE (transactional id)",
                    AuthorizationFailure::TransactionalId,
                    Some(source),
                )
            }
            Some(rskafka::client::error::ProtocolError::GroupAuthorizationFailed) => {
                not_authorized(
                    transactional_id,
                    self.principal(),
                    "READ (group)",
                    AuthorizationFailure::Group,
                    Some(source),
                )
            }
            Some(rskafka::client::error::ProtocolError::TopicAuthorizationFailed) => {
                not_authorized(
                    &self.config().watermark_topic,
                    self.principal(),
                    "DESCRIBE or WRITE",
                    AuthorizationFailure::Topic,
                    Some(source),
                )
            }
            _ => {
                if fenced {
                    warn!(transactional_id, "producer fenced: another relay took the bucket, or the transaction outlived its timeout");
                }
                Error::Kafka {
                    message: format!("exactly-once delivery: {what} ({transactional_id})"),
                    retryable: true,
                    source: Some(source),
                }
            }
        }
    }

    /// The error of a transactional produce to `topic`/`partition`: a rejection of the
    /// records as at least once, everything else retryable.
    fn produce_failure(&self, topic: &str, partition: i32, e: TransactionError) -> Error {
        let rejection = match verdict(e.cause()) {
            Verdict::Reject(reason) => Some(reason),
            _ => None,
        };
        match rejection {
            Some(reason) => Error::KafkaRejected {
                topic: topic.to_owned(),
                reason,
                source: Some(Box::new(e)),
            },
            None => self.transaction_error(&format!("{topic}/{partition}"), "producing", e),
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::message::OutboxMessage;

    fn identity() -> OutboxIdentity {
        OutboxIdentity::new("arn:aws:dynamodb:us-east-1:123456789012:table/T", "OUTBOX")
    }

    fn stored(sequence: u64, id: u128) -> StoredMessage {
        let mut m = OutboxMessage::new("t", 8);
        m.message_id = Uuid::from_u128(id);
        StoredMessage::new(3, sequence, m)
    }

    #[test]
    fn covered_messages_count_as_published_and_late_ones_go_out() {
        let mut w = identity().empty_watermark(3);
        // Published and committed: 5 and 7; 6 is a hole the relay stepped over.
        w.insert(5, &Uuid::from_u128(5));
        w.insert(7, &Uuid::from_u128(7));
        // The hole filled later (a late commit), and 8 is new.
        let batch = [stored(5, 5), stored(6, 6), stored(7, 7), stored(8, 8)];
        let split = reconcile(&mut w, &batch);
        assert_eq!(
            split,
            Split {
                leading_covered: 1,
                to_publish: vec![1, 3],
            }
        );
    }

    #[test]
    fn a_reused_sequence_number_is_published_and_gone_entries_leave() {
        let mut w = identity().empty_watermark(3);
        w.insert(2, &Uuid::from_u128(2));
        w.insert(4, &Uuid::from_u128(4));
        w.insert(9, &Uuid::from_u128(9));
        // 2 was deleted (absent below the batch's last number); 4 holds another message
        // (a counter reset); 9 lies beyond what the batch read: still in doubt.
        let batch = [stored(4, 40), stored(5, 5)];
        let split = reconcile(&mut w, &batch);
        assert_eq!(split.leading_covered, 0);
        assert_eq!(split.to_publish, vec![0, 1]);
        assert_eq!(w.sequences().collect::<Vec<_>>(), vec![4, 9]);
    }

    #[test]
    fn room_stops_where_the_text_would_outgrow_its_limit() {
        let w = identity().empty_watermark(3);
        let batch: Vec<StoredMessage> = (1..=400u64).map(|s| stored(s, u128::from(s))).collect();
        let all: Vec<usize> = (0..batch.len()).collect();
        let fits = w.room_for(all.iter().map(|&i| batch[i].sequence));
        assert!((280..400).contains(&fits), "{fits}");
        let mut full = w.clone();
        for m in &batch[..fits] {
            full.insert(m.sequence, &m.message.message_id);
        }
        assert!(full.encoded_len() <= crate::protocol::watermark::MAX_WATERMARK_BYTES);
        full.insert(batch[fits].sequence, &batch[fits].message.message_id);
        assert!(full.encoded_len() > crate::protocol::watermark::MAX_WATERMARK_BYTES);
        assert_eq!(w.room_for(all[..10].iter().map(|&i| batch[i].sequence)), 10);
    }
}
