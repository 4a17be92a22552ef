//! Kafka transactions ([KIP-98]): a [`TransactionalProducer`] writes records to several
//! partitions and topics, and a consumer group's offsets, all or none of them; and
//! [`Client::fetch_committed_offset`](super::Client::fetch_committed_offset) reads an offset
//! back, optionally only once no transaction holds a newer one ([KIP-447]).
//!
//! # A transaction
//!
//! ```no_run
//! # async fn run(client: &rskafka::client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use rskafka::client::{partition::Compression, transaction::TransactionError};
//! # let records = vec![];
//!
//! // Fences any earlier producer of "relay-7" and aborts its open transaction.
//! let mut producer = client
//!     .transactional_producer("relay-7", Duration::from_secs(60))
//!     .await?;
//!
//! let outcome = async {
//!     producer.produce("orders", 0, records, Compression::NoCompression).await?;
//!     producer
//!         .send_offsets("relay-progress", "progress", 7, 1234, Some("bucket 7".into()))
//!         .await?;
//!     producer.commit().await
//! }
//! .await;
//! match outcome {
//!     Ok(()) => {}
//!     // Another producer of "relay-7" took over (or this transaction outlived its timeout).
//!     Err(TransactionError::Fenced(_)) => return Ok(()),
//!     // Abort, then try the transaction again.
//!     Err(TransactionError::Abortable(_)) => producer.abort().await?,
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! # Protocol
//!
//! [`Client::transactional_producer`](super::Client::transactional_producer) finds the
//! transaction coordinator of the transactional id (`FindCoordinator`) and asks it for a
//! producer id and epoch (`InitProducerId`). A transaction begins with the first partition or
//! offset added to it: [`TransactionalProducer::produce`] adds its partition
//! (`AddPartitionsToTxn`, once per partition and transaction) and writes one idempotent,
//! transactional record batch (producer id, epoch and the partition's next sequence number;
//! `acks=all`); [`TransactionalProducer::send_offsets`] adds the group
//! (`AddOffsetsToTxn`) and sends the offset to the group's coordinator (`TxnOffsetCommit`);
//! [`TransactionalProducer::commit`] and [`TransactionalProducer::abort`] end it (`EndTxn`).
//!
//! Every request is retried on the errors that say "try again" (a coordinator that moved, is
//! not available or is loading, `CONCURRENT_TRANSACTIONS`, a partition leader that moved, a
//! broken connection) with the client's [`BackoffConfig`], at most [`MAX_ATTEMPTS`] times and
//! within the backoff's deadline. A produce that is retried sends the same batch with the same
//! sequence number, so the broker writes it once.
//!
//! Connections to coordinators and partition leaders are the client's own kind (the same TLS
//! and SASL settings as every other broker connection): one per broker, shared by the
//! client's transactional producers.
//!
//! [KIP-98]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+Transactional+Messaging
//! [KIP-447]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-447%3A+Producer+scalability+for+exactly+once+semantics

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::{
    backoff::{Backoff, BackoffConfig},
    client::{
        error::{Error, RequestContext},
        partition::{Compression, build_produce_request, process_produce_response},
    },
    connection::{BrokerCache, BrokerConnection, BrokerConnector, MetadataLookupMode},
    messenger::RequestError,
    protocol::{
        error::Error as ProtocolError,
        messages::{
            AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
            CoordinatorType, EndTxnRequest, FindCoordinatorRequest, InitProducerIdRequest,
            OffsetFetchRequest, OffsetFetchRequestTopic, TxnOffsetCommitRequest,
            TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
        },
        primitives::{Int32, NullableString},
    },
    record::Record,
};

/// How many times one step of a transaction (one request, with the coordinator lookup it
/// needs) is tried before its error is returned, if the backoff's deadline does not end the
/// retries first.
pub const MAX_ATTEMPTS: usize = 10;

/// How a transactional step failed, and so what the caller does next.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// The producer is fenced: another producer initialised the same transactional id (which
    /// aborted this producer's open transaction), or the transaction coordinator aborted this
    /// producer's transaction because it stayed open longer than its timeout and bumped the
    /// epoch. Either way this producer can write nothing more, and this client does not tell
    /// the two causes apart (Apache Kafka 3.9 refuses the producer's epoch bump after either;
    /// 4.1 would accept one after a timeout). Every later call fails with this error. A caller
    /// that still owns the transactional id by its own reckoning (a lease, say) initialises a
    /// new producer, which fences whoever else holds it.
    #[error("producer fenced: {0}")]
    Fenced(#[source] Error),

    /// The open transaction cannot commit (a record batch was refused or its outcome is
    /// unknown, a partition or group could not join it, ...): call
    /// [`TransactionalProducer::abort`], then the transaction can be tried again.
    #[error("transaction must be aborted: {0}")]
    Abortable(#[source] Error),

    /// A request failed on an error that says "try again" (no coordinator or leader, a broken
    /// connection, the coordinator busy) on every attempt. Nothing was decided: the same call
    /// may be made again later. (After [`TransactionalProducer::commit`] the transaction may
    /// or may not have been prepared; calling `commit` again finds out.)
    #[error("retries exhausted: {0}")]
    Retriable(#[source] Error),

    /// An error no retry or abort mends: authorization of the transactional id or the cluster,
    /// an invalid transaction timeout, a version the broker does not support, a state the
    /// coordinator refuses. Every later call fails too; a new producer may be initialised.
    #[error("fatal transactional error: {0}")]
    Fatal(#[source] Error),
}

impl TransactionError {
    /// The cause.
    pub fn cause(&self) -> &Error {
        match self {
            Self::Fenced(e) | Self::Abortable(e) | Self::Retriable(e) | Self::Fatal(e) => e,
        }
    }

    /// The broker's error code behind this error, if it came from one.
    pub fn protocol_error(&self) -> Option<ProtocolError> {
        match self.cause() {
            Error::ServerError { protocol_error, .. } => Some(*protocol_error),
            _ => None,
        }
    }
}

/// The class of a failure, before it is wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Fenced,
    Abortable,
    Retriable,
    Fatal,
}

impl Class {
    fn wrap(self, e: Error) -> TransactionError {
        match self {
            Self::Fenced => TransactionError::Fenced(e),
            Self::Abortable => TransactionError::Abortable(e),
            Self::Retriable => TransactionError::Retriable(e),
            Self::Fatal => TransactionError::Fatal(e),
        }
    }
}

/// What one attempt of a step came to.
enum Step<T> {
    Done(T),
    /// Try again after a backoff.
    Retry(Error),
    /// Stop with this class of error.
    Fail(Class, Error),
}

impl<T> Step<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Step<U> {
        match self {
            Self::Done(v) => Step::Done(f(v)),
            Self::Retry(e) => Step::Retry(e),
            Self::Fail(class, e) => Step::Fail(class, e),
        }
    }
}

/// A committed offset and its metadata, as [`Client::fetch_committed_offset`](super::Client::fetch_committed_offset)
/// returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The offset (by convention the next one to consume).
    pub offset: i64,

    /// The metadata committed with it.
    pub metadata: Option<String>,
}

/// Connections to brokers by node id, the partition leaders and the coordinators, shared by a
/// client's transactional producers and its offset fetches.
#[derive(Debug, Default)]
pub(crate) struct BrokerPool {
    connections: Mutex<HashMap<i32, BrokerConnection>>,
    leaders: Mutex<HashMap<(String, i32), i32>>,
    coordinators: Mutex<HashMap<(bool, String), i32>>,
}

impl BrokerPool {
    /// The connection to broker `id`, made with the client's transport settings if there is
    /// none yet.
    async fn connection(&self, brokers: &BrokerConnector, id: i32) -> Result<BrokerConnection> {
        if let Some(c) = self.connections.lock().get(&id) {
            return Ok(Arc::clone(c));
        }
        let conn = match brokers.connect(id).await? {
            Some(c) => c,
            None => {
                // A broker the client has not seen in metadata yet.
                brokers.refresh_metadata().await?;
                brokers.connect(id).await?.ok_or_else(|| {
                    Error::InvalidResponse(format!("broker {id} is not in the cluster's metadata"))
                })?
            }
        };
        let mut connections = self.connections.lock();
        Ok(Arc::clone(connections.entry(id).or_insert(conn)))
    }

    /// Forgets `conn` (broken) if it is still broker `id`'s.
    fn drop_connection(&self, id: i32, conn: &BrokerConnection) {
        let mut connections = self.connections.lock();
        if connections.get(&id).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            connections.remove(&id);
        }
    }

    /// The leader of a partition, from the cached metadata if it names one.
    async fn leader(&self, brokers: &BrokerConnector, topic: &str, partition: i32) -> Result<i32> {
        let key = (topic.to_owned(), partition);
        if let Some(id) = self.leaders.lock().get(&key) {
            return Ok(*id);
        }
        let (metadata, r#gen) = brokers
            .request_metadata(
                &MetadataLookupMode::CachedArbitrary,
                Some(vec![topic.to_owned()]),
            )
            .await?;
        let context = || RequestContext::Partition(topic.to_owned(), partition);
        let found = metadata
            .topics
            .iter()
            .find(|t| t.name.0 == topic)
            .and_then(|t| match t.error {
                Some(e) => Some(Err(e)),
                None => t
                    .partitions
                    .iter()
                    .find(|p| p.partition_index.0 == partition)
                    .map(|p| p.error.map_or(Ok(p.leader_id.0), Err)),
            });
        let error = match found {
            Some(Ok(leader)) if leader >= 0 => {
                self.leaders.lock().insert(key, leader);
                return Ok(leader);
            }
            Some(Ok(_)) => ProtocolError::LeaderNotAvailable,
            Some(Err(e)) => e,
            None => ProtocolError::UnknownTopicOrPartition,
        };
        if let Some(r#gen) = r#gen {
            brokers
                .invalidate_metadata_cache("transactional produce: no leader in metadata", r#gen);
        }
        Err(Error::ServerError {
            protocol_error: error,
            error_message: None,
            request: context(),
            response: None,
            is_virtual: true,
        })
    }

    fn forget_leader(&self, topic: &str, partition: i32) {
        self.leaders.lock().remove(&(topic.to_owned(), partition));
    }

    /// The coordinator of a group or transactional id: cached, else asked of any broker.
    async fn coordinator(
        &self,
        brokers: &BrokerConnector,
        key_type: CoordinatorType,
        key: &str,
    ) -> Step<i32> {
        let cache_key = (key_type == CoordinatorType::Transaction, key.to_owned());
        if let Some(id) = self.coordinators.lock().get(&cache_key) {
            return Step::Done(*id);
        }
        let (broker, r#gen) = match brokers.get().await {
            Ok(b) => b,
            Err(e) => return Step::Retry(e.into()),
        };
        let request = FindCoordinatorRequest {
            key: key.to_owned(),
            key_type,
        };
        let response = match broker.request(&request).await {
            Ok(r) => r,
            Err(e) => {
                if is_broken(&e) {
                    brokers
                        .invalidate("find coordinator: connection broken", r#gen)
                        .await;
                }
                return request_failed(e);
            }
        };
        throttle(response.throttle_time_ms).await;
        let context = || match key_type {
            CoordinatorType::Group => RequestContext::Group(key.to_owned()),
            CoordinatorType::Transaction => RequestContext::TransactionalId(key.to_owned()),
        };
        match response.error {
            None if response.node_id >= 0 => {
                debug!(?key_type, key, node = response.node_id, "found coordinator");
                self.coordinators.lock().insert(cache_key, response.node_id);
                Step::Done(response.node_id)
            }
            None => Step::Retry(server_error(
                ProtocolError::CoordinatorNotAvailable,
                None,
                context(),
            )),
            Some(e) => {
                let error = server_error(e, response.error_message, context());
                match e {
                    ProtocolError::CoordinatorNotAvailable
                    | ProtocolError::CoordinatorLoadInProgress
                    | ProtocolError::NotCoordinator
                    | ProtocolError::RequestTimedOut => Step::Retry(error),
                    ProtocolError::GroupAuthorizationFailed => Step::Fail(Class::Abortable, error),
                    _ => Step::Fail(Class::Fatal, error),
                }
            }
        }
    }

    fn forget_coordinator(&self, key_type: CoordinatorType, key: &str) {
        self.coordinators
            .lock()
            .remove(&(key_type == CoordinatorType::Transaction, key.to_owned()));
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// What a client's transactional calls share.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub(crate) brokers: Arc<BrokerConnector>,
    pub(crate) pool: Arc<BrokerPool>,
    pub(crate) backoff_config: Arc<BackoffConfig>,
}

impl Context {
    /// Runs `attempt` until it is done or fails, at most [`MAX_ATTEMPTS`] times, with the
    /// client's backoff between attempts.
    async fn retry<T, F, Fut>(&self, what: &'static str, attempt: F) -> Result<T, (Class, Error)>
    where
        F: Fn() -> Fut + Send + Sync,
        Fut: Future<Output = Step<T>> + Send,
    {
        let mut backoff = Backoff::new(&self.backoff_config);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match attempt().await {
                Step::Done(v) => return Ok(v),
                Step::Fail(class, e) => return Err((class, e)),
                Step::Retry(e) => e,
            };
            if attempts >= MAX_ATTEMPTS {
                warn!(what, attempts, %error, "giving up after the last attempt");
                return Err((Class::Retriable, error));
            }
            match backoff.next() {
                Some(pause) => {
                    info!(what, attempts, %error, ?pause, "retrying");
                    tokio::time::sleep(pause).await;
                }
                None => {
                    warn!(what, attempts, %error, "giving up at the backoff's deadline");
                    return Err((Class::Retriable, error));
                }
            }
        }
    }

    /// One request to the coordinator of `key`, its answer judged by `judge`; a coordinator
    /// that moved or is unreachable is looked up again.
    async fn coordinator_request<R, T, J>(
        &self,
        what: &'static str,
        key_type: CoordinatorType,
        key: &str,
        request: &R,
        judge: J,
    ) -> Result<T, (Class, Error)>
    where
        R: crate::protocol::messages::RequestBody
            + crate::protocol::messages::WriteVersionedType<Vec<u8>>
            + Send
            + Sync,
        R::ResponseBody:
            crate::protocol::messages::ReadVersionedType<std::io::Cursor<Vec<u8>>> + Send,
        J: Fn(R::ResponseBody) -> Step<T> + Send + Sync,
    {
        let judge = &judge;
        self.retry(what, || async move {
            let node = match self.pool.coordinator(&self.brokers, key_type, key).await {
                Step::Done(node) => node,
                Step::Retry(e) => return Step::Retry(e),
                Step::Fail(class, e) => return Step::Fail(class, e),
            };
            let conn = match self.pool.connection(&self.brokers, node).await {
                Ok(c) => c,
                Err(e) => {
                    self.pool.forget_coordinator(key_type, key);
                    return connect_failed(e);
                }
            };
            let step = match conn.request(request).await {
                Ok(response) => judge(response),
                Err(e) => {
                    if is_broken(&e) {
                        self.pool.drop_connection(node, &conn);
                    }
                    request_failed(e)
                }
            };
            if let Step::Retry(Error::ServerError {
                protocol_error:
                    ProtocolError::NotCoordinator | ProtocolError::CoordinatorNotAvailable,
                ..
            })
            | Step::Retry(Error::Request(_)) = &step
            {
                self.pool.forget_coordinator(key_type, key);
            }
            step
        })
        .await
    }

    /// `InitProducerId`: a new producer id and epoch, or (with `current`) the next epoch of
    /// the current producer id.
    async fn init_producer_id(
        &self,
        transactional_id: &str,
        transaction_timeout_ms: i32,
        current: Option<(i64, i16)>,
    ) -> Result<(i64, i16), (Class, Error)> {
        let (producer_id, producer_epoch) = current.unwrap_or((-1, -1));
        let request = InitProducerIdRequest {
            transactional_id: Some(transactional_id.to_owned()),
            transaction_timeout_ms,
            producer_id,
            producer_epoch,
        };
        self.coordinator_request(
            "init_producer_id",
            CoordinatorType::Transaction,
            transactional_id,
            &request,
            |response| {
                judge_error(
                    response.error,
                    || RequestContext::TransactionalId(transactional_id.to_owned()),
                    coordinator_error_class,
                )
                .map(|()| (response.producer_id, response.producer_epoch))
            },
        )
        .await
    }

    /// `OffsetFetch` of one partition, retrying `UNSTABLE_OFFSET_COMMIT` while a transaction
    /// holds a newer offset of it.
    pub(crate) async fn fetch_committed_offset(
        &self,
        group_id: &str,
        topic: &str,
        partition: i32,
        require_stable: bool,
    ) -> Result<Option<CommittedOffset>> {
        let request = OffsetFetchRequest {
            group_id: group_id.to_owned(),
            topics: Some(vec![OffsetFetchRequestTopic {
                name: topic.to_owned(),
                partition_indexes: vec![partition],
            }]),
            require_stable,
        };
        let group = || RequestContext::Group(group_id.to_owned());
        let judge = |response: crate::protocol::messages::OffsetFetchResponse| {
            if let Some(e) = response.error {
                let error = server_error(e, None, group());
                return match e {
                    ProtocolError::NotCoordinator
                    | ProtocolError::CoordinatorNotAvailable
                    | ProtocolError::CoordinatorLoadInProgress
                    | ProtocolError::RequestTimedOut => Step::Retry(error),
                    _ => Step::Fail(Class::Fatal, error),
                };
            }
            let found = response
                .topics
                .into_iter()
                .filter(|t| t.name == topic)
                .flat_map(|t| t.partitions)
                .find(|p| p.partition_index == partition);
            let Some(p) = found else {
                return Step::Fail(
                    Class::Fatal,
                    Error::InvalidResponse(format!(
                        "OffsetFetch of group {group_id:?} did not answer for {topic}:{partition}"
                    )),
                );
            };
            match p.error {
                None if p.committed_offset < 0 => Step::Done(None),
                None => Step::Done(Some(CommittedOffset {
                    offset: p.committed_offset,
                    metadata: p.metadata,
                })),
                Some(e) => {
                    let error = server_error(
                        e,
                        None,
                        RequestContext::Partition(topic.to_owned(), partition),
                    );
                    match e {
                        ProtocolError::UnstableOffsetCommit
                        | ProtocolError::NotCoordinator
                        | ProtocolError::CoordinatorNotAvailable
                        | ProtocolError::CoordinatorLoadInProgress
                        | ProtocolError::UnknownTopicOrPartition => Step::Retry(error),
                        _ => Step::Fail(Class::Fatal, error),
                    }
                }
            }
        };
        self.coordinator_request(
            "fetch_committed_offset",
            CoordinatorType::Group,
            group_id,
            &request,
            judge,
        )
        .await
        .map_err(|(_, e)| e)
    }
}

/// Where a producer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Transactions can be added to, committed and aborted.
    Ready,
    /// The open transaction must be aborted.
    Abortable,
    /// Fenced: nothing more can be written.
    Fenced,
    /// Failed for good.
    Fatal(Option<ProtocolError>),
}

#[derive(Debug)]
struct State {
    producer_id: i64,
    producer_epoch: i16,
    phase: Phase,
    /// The coordinator has (or, after a request whose answer was lost, may have) a transaction
    /// of this producer open.
    open: bool,
    /// The partitions in the open transaction.
    partitions: HashSet<(String, i32)>,
    /// The groups whose offsets are in the open transaction.
    groups: HashSet<String>,
    /// A record batch was refused or its outcome is unknown, so the partitions' sequence
    /// numbers are uncertain: the next abort bumps the epoch, which starts them again at 0.
    epoch_bump_required: bool,
}

/// The next sequence number of a partition, locked while a batch to it is in flight so that
/// batches to one partition go one after the other.
type SequenceSlot = Arc<tokio::sync::Mutex<i32>>;

/// Marks the open transaction abortable when dropped before [`Unfinished::finished`]: a
/// request whose future was dropped (by a caller's timeout, say) may or may not have reached
/// the broker. With `bump`, the partitions' sequence numbers are uncertain too.
struct Unfinished<'a> {
    state: &'a Mutex<State>,
    bump: bool,
    armed: bool,
}

impl<'a> Unfinished<'a> {
    fn new(state: &'a Mutex<State>, bump: bool) -> Self {
        Self {
            state,
            bump,
            armed: true,
        }
    }

    fn finished(mut self) {
        self.armed = false;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self.state.lock();
            state.epoch_bump_required |= self.bump;
            if state.phase == Phase::Ready {
                state.phase = Phase::Abortable;
            }
        }
    }
}

/// A transactional producer of one transactional id: made by
/// [`Client::transactional_producer`](super::Client::transactional_producer).
///
/// Calls that add to a transaction take `&self`, so that several partitions can be written
/// at once (`futures::future::try_join_all` over [`produce`](Self::produce) calls); batches to
/// the same partition are sent one after the other. [`commit`](Self::commit) and
/// [`abort`](Self::abort) take `&mut self`: no produce can be in flight when the transaction
/// ends.
///
/// A [`produce`](Self::produce) or [`send_offsets`](Self::send_offsets) future dropped before
/// it finished (a caller's timeout) leaves the transaction to abort: what it sent may or may
/// not have arrived. A dropped `commit` is like one that failed with
/// [`Retriable`](TransactionError::Retriable): call `commit` again.
pub struct TransactionalProducer {
    transactional_id: String,
    transaction_timeout_ms: i32,
    context: Context,
    state: Mutex<State>,
    sequences: Mutex<HashMap<(String, i32), SequenceSlot>>,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("TransactionalProducer")
            .field("transactional_id", &self.transactional_id)
            .field("producer_id", &state.producer_id)
            .field("producer_epoch", &state.producer_epoch)
            .field("phase", &state.phase)
            .finish_non_exhaustive()
    }
}

impl TransactionalProducer {
    /// `InitProducerId` for `transactional_id`; see
    /// [`Client::transactional_producer`](super::Client::transactional_producer).
    pub(crate) async fn new(
        context: Context,
        transactional_id: String,
        transaction_timeout: Duration,
    ) -> Result<Self, TransactionError> {
        let context_of = || RequestContext::TransactionalId(transactional_id.clone());
        let transaction_timeout_ms = match i32::try_from(transaction_timeout.as_millis()) {
            Ok(ms) if ms > 0 => ms,
            _ => {
                return Err(TransactionError::Fatal(virtual_error(
                    ProtocolError::InvalidTransactionTimeout,
                    format!(
                        "a transaction timeout of {transaction_timeout:?} is not 1 ms to i32::MAX ms"
                    ),
                    context_of(),
                )));
            }
        };
        let (producer_id, producer_epoch) = context
            .init_producer_id(&transactional_id, transaction_timeout_ms, None)
            .await
            .map_err(|(class, e)| class.wrap(e))?;
        info!(
            transactional_id,
            producer_id, producer_epoch, "initialised transactional producer"
        );
        Ok(Self {
            transactional_id,
            transaction_timeout_ms,
            context,
            state: Mutex::new(State {
                producer_id,
                producer_epoch,
                phase: Phase::Ready,
                open: false,
                partitions: HashSet::new(),
                groups: HashSet::new(),
                epoch_bump_required: false,
            }),
            sequences: Mutex::new(HashMap::new()),
        })
    }

    /// The transactional id.
    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// The producer id and epoch the coordinator gave this producer.
    pub fn producer_id_and_epoch(&self) -> (i64, i16) {
        let state = self.state.lock();
        (state.producer_id, state.producer_epoch)
    }

    /// Whether a transaction is open, or may be: a partition or group was added to it (or a
    /// request to add one went out), and it has not ended.
    pub fn in_transaction(&self) -> bool {
        self.state.lock().open
    }

    /// Adds partitions (topic, partition) to the open transaction, beginning one if none is
    /// open, in one `AddPartitionsToTxn` request; partitions already in it are skipped.
    /// [`produce`](Self::produce) adds its partition itself; this saves a round trip per
    /// partition when a transaction writes several.
    pub async fn add_partitions(&self, partitions: &[(&str, i32)]) -> Result<(), TransactionError> {
        let (producer_id, producer_epoch, missing) = {
            let state = self.state.lock();
            self.check_open(&state)?;
            let mut missing: HashMap<&str, Vec<i32>> = HashMap::new();
            for &(topic, partition) in partitions {
                if !state.partitions.contains(&(topic.to_owned(), partition)) {
                    let list = missing.entry(topic).or_default();
                    if !list.contains(&partition) {
                        list.push(partition);
                    }
                }
            }
            (state.producer_id, state.producer_epoch, missing)
        };
        if missing.is_empty() {
            return Ok(());
        }
        // From the moment the request may reach the coordinator (even if this call's future
        // is dropped), the coordinator may have a transaction open.
        self.state.lock().open = true;
        let request = AddPartitionsToTxnRequest {
            transactional_id: self.transactional_id.clone(),
            producer_id,
            producer_epoch,
            topics: missing
                .iter()
                .map(|(topic, partitions)| AddPartitionsToTxnTopic {
                    name: (*topic).to_owned(),
                    partitions: partitions.clone(),
                })
                .collect(),
        };
        let result = self
            .context
            .coordinator_request(
                "add_partitions_to_txn",
                CoordinatorType::Transaction,
                &self.transactional_id,
                &request,
                |response| {
                    judge_partitions(
                        response.results.into_iter().flat_map(|t| {
                            t.results
                                .into_iter()
                                .map(move |p| (t.name.clone(), p.partition_index, p.error))
                        }),
                        |e| match e {
                            ProtocolError::UnknownTopicOrPartition => None,
                            ProtocolError::TopicAuthorizationFailed => Some(Class::Abortable),
                            e => coordinator_error_class(e),
                        },
                    )
                },
            )
            .await;
        let mut state = self.state.lock();
        match result {
            Ok(()) => {
                for (topic, partitions) in missing {
                    for partition in partitions {
                        state.partitions.insert((topic.to_owned(), partition));
                    }
                }
                Ok(())
            }
            Err((Class::Retriable, e)) => Err(TransactionError::Retriable(e)),
            Err((class, e)) => Err(self.fail(&mut state, class, e)),
        }
    }

    /// Writes `records` (in this order) to a partition as one transactional record batch,
    /// adding the partition to the transaction first if it is not in it yet; returns their
    /// offsets. Nothing is written for no records.
    ///
    /// The records become visible to `read_committed` consumers when the transaction commits,
    /// and never if it aborts.
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<Record>,
        compression: Compression,
    ) -> Result<Vec<i64>, TransactionError> {
        if records.is_empty() {
            return Ok(vec![]);
        }
        self.add_partitions(&[(topic, partition)]).await?;

        let slot = Arc::clone(
            self.sequences
                .lock()
                .entry((topic.to_owned(), partition))
                .or_default(),
        );
        let mut next_sequence = slot.lock().await;
        let (producer_id, producer_epoch) = {
            let state = self.state.lock();
            self.check_open(&state)?;
            (state.producer_id, state.producer_epoch)
        };

        let n = records.len();
        // acks=all, 30 s for the replication, as the partition client's produce.
        let mut request = build_produce_request(partition, topic, records, compression);
        request.transactional_id = NullableString(Some(self.transactional_id.clone()));
        for batch in request
            .topic_data
            .iter_mut()
            .flat_map(|t| t.partition_data.iter_mut())
            .flat_map(|p| p.records.0.iter_mut())
        {
            batch.producer_id = producer_id;
            batch.producer_epoch = producer_epoch;
            batch.base_sequence = *next_sequence;
            batch.is_transactional = true;
        }

        let unfinished = Unfinished::new(&self.state, true);
        let request = &request;
        let context = &self.context;
        let result = context
            .retry("transactional_produce", || async move {
                let leader = match context
                    .pool
                    .leader(&context.brokers, topic, partition)
                    .await
                {
                    Ok(leader) => leader,
                    Err(e) => return produce_error_step(e),
                };
                let conn = match context.pool.connection(&context.brokers, leader).await {
                    Ok(c) => c,
                    Err(e) => {
                        context.pool.forget_leader(topic, partition);
                        return connect_failed(e);
                    }
                };
                let response = match conn.request(request).await {
                    Ok(r) => r,
                    Err(e) => {
                        if is_broken(&e) {
                            context.pool.drop_connection(leader, &conn);
                            context.pool.forget_leader(topic, partition);
                        }
                        return request_failed(e);
                    }
                };
                throttle(response.throttle_time_ms.unwrap_or(Int32(0))).await;
                match process_produce_response(partition, topic, n as i64, response) {
                    Ok(offsets) => Step::Done(offsets),
                    Err(e) => {
                        if let Error::ServerError {
                            protocol_error:
                                ProtocolError::NotLeaderOrFollower
                                | ProtocolError::LeaderNotAvailable
                                | ProtocolError::UnknownTopicOrPartition
                                | ProtocolError::FencedLeaderEpoch,
                            ..
                        } = e
                        {
                            context.pool.forget_leader(topic, partition);
                        }
                        produce_error_step(e)
                    }
                }
            })
            .await;
        unfinished.finished();

        match result {
            Ok(offsets) => {
                *next_sequence = increment_sequence(*next_sequence, n);
                Ok(offsets)
            }
            Err((class, e)) => {
                let mut state = self.state.lock();
                // Whether the broker wrote the batch is unknown, or it refused the sequence:
                // only a new epoch makes the sequences certain again.
                state.epoch_bump_required = true;
                // Retries ran out on a batch whose fate is unknown: the transaction cannot
                // commit without knowing it.
                let class = if class == Class::Retriable {
                    Class::Abortable
                } else {
                    class
                };
                Err(self.fail(&mut state, class, e))
            }
        }
    }

    /// Commits a consumer group's offset of one partition in the open transaction (beginning
    /// one if none is open): `AddOffsetsToTxn` to the transaction coordinator (once per group
    /// and transaction), then `TxnOffsetCommit` to the group's coordinator. The offset (and
    /// `metadata`) become what `OffsetFetch` returns when the transaction commits.
    ///
    /// The producer is not a member of the group (generation -1, no member id), as a producer
    /// that keeps its own progress in a group's offsets is. The offset's topic and partition
    /// must exist (else `UNKNOWN_TOPIC_OR_PARTITION`, retried). The broker limits `metadata`
    /// to `offset.metadata.max.bytes` (4096 by default; it compares the length in UTF-16 code
    /// units, so 4096 ASCII characters fit) and refuses a longer one
    /// (`OFFSET_METADATA_TOO_LARGE`, an abortable error); it keeps `None` as `""`.
    pub async fn send_offsets(
        &self,
        group_id: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        metadata: Option<String>,
    ) -> Result<(), TransactionError> {
        let (producer_id, producer_epoch, group_added) = {
            let state = self.state.lock();
            self.check_open(&state)?;
            (
                state.producer_id,
                state.producer_epoch,
                state.groups.contains(group_id),
            )
        };
        if !group_added {
            self.state.lock().open = true;
            let request = AddOffsetsToTxnRequest {
                transactional_id: self.transactional_id.clone(),
                producer_id,
                producer_epoch,
                group_id: group_id.to_owned(),
            };
            let result = self
                .context
                .coordinator_request(
                    "add_offsets_to_txn",
                    CoordinatorType::Transaction,
                    &self.transactional_id,
                    &request,
                    |response| {
                        judge_error(
                            response.error,
                            || RequestContext::Group(group_id.to_owned()),
                            |e| match e {
                                ProtocolError::GroupAuthorizationFailed => Some(Class::Abortable),
                                e => coordinator_error_class(e),
                            },
                        )
                    },
                )
                .await;
            let mut state = self.state.lock();
            match result {
                Ok(()) => {
                    state.groups.insert(group_id.to_owned());
                }
                Err((Class::Retriable, e)) => return Err(TransactionError::Retriable(e)),
                Err((class, e)) => return Err(self.fail(&mut state, class, e)),
            }
        }

        let request = TxnOffsetCommitRequest {
            transactional_id: self.transactional_id.clone(),
            group_id: group_id.to_owned(),
            producer_id,
            producer_epoch,
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: None,
            topics: vec![TxnOffsetCommitRequestTopic {
                name: topic.to_owned(),
                partitions: vec![TxnOffsetCommitRequestPartition {
                    partition_index: partition,
                    committed_offset: offset,
                    committed_leader_epoch: -1,
                    committed_metadata: metadata,
                }],
            }],
        };
        let unfinished = Unfinished::new(&self.state, false);
        let result = self
            .context
            .coordinator_request(
                "txn_offset_commit",
                CoordinatorType::Group,
                group_id,
                &request,
                |response| {
                    judge_partitions(
                        response.topics.into_iter().flat_map(|t| {
                            t.partitions
                                .into_iter()
                                .map(move |p| (t.name.clone(), p.partition_index, p.error))
                        }),
                        |e| match e {
                            ProtocolError::UnknownTopicOrPartition => None,
                            ProtocolError::GroupAuthorizationFailed
                            | ProtocolError::TopicAuthorizationFailed
                            | ProtocolError::OffsetMetadataTooLarge
                            | ProtocolError::InvalidCommitOffsetSize
                            | ProtocolError::IllegalGeneration
                            | ProtocolError::UnknownMemberId
                            | ProtocolError::FencedInstanceId => Some(Class::Abortable),
                            e => coordinator_error_class(e),
                        },
                    )
                },
            )
            .await;
        unfinished.finished();
        match result {
            Ok(()) => Ok(()),
            Err((Class::Retriable, e)) => Err(TransactionError::Retriable(e)),
            Err((class, e)) => Err(self.fail(&mut self.state.lock(), class, e)),
        }
    }

    /// Commits the open transaction (`EndTxn`): its records become visible to
    /// `read_committed` consumers and its offsets to `OffsetFetch`. Without an open
    /// transaction nothing is sent.
    ///
    /// After an [`Abortable`](TransactionError::Abortable) error the transaction cannot
    /// commit: this fails with that class again, sending nothing. After a
    /// [`Retriable`](TransactionError::Retriable) error of `commit` itself, the coordinator
    /// may have begun to commit: call `commit` again (committing twice is harmless), not
    /// `abort`.
    pub async fn commit(&mut self) -> Result<(), TransactionError> {
        {
            let state = self.state.lock();
            self.check_open(&state)?;
            if !state.open {
                return Ok(());
            }
        }
        self.end_transaction(true).await
    }

    /// Aborts the open transaction (`EndTxn`): its records and offsets are discarded.
    ///
    /// When a produce failed (its batch refused, or its outcome unknown), the partitions'
    /// sequence numbers are uncertain: then the producer also bumps its epoch once the
    /// transaction is aborted ([`bump_epoch`](Self::bump_epoch)). Afterwards the producer is
    /// ready for the next transaction, unless this fails: [`Fenced`](TransactionError::Fenced)
    /// and [`Fatal`](TransactionError::Fatal) end it, a
    /// [`Retriable`](TransactionError::Retriable) error leaves the transaction to abort again.
    pub async fn abort(&mut self) -> Result<(), TransactionError> {
        let bump = {
            let state = self.state.lock();
            if matches!(state.phase, Phase::Fenced | Phase::Fatal(_)) {
                self.check_open(&state)?;
            }
            state.epoch_bump_required
        };
        if self.in_transaction() {
            self.end_transaction(false).await?;
        }
        if bump {
            self.bump_epoch().await?;
        }
        let mut state = self.state.lock();
        if state.phase == Phase::Abortable {
            state.phase = Phase::Ready;
        }
        Ok(())
    }

    /// Aborts the open transaction if there is one, then asks the coordinator for this
    /// producer's next epoch (`InitProducerId` with the current producer id and epoch,
    /// [KIP-360]): the partitions' sequence numbers start again at 0. The coordinator refuses
    /// a producer that is fenced ([`Fenced`](TransactionError::Fenced)).
    ///
    /// [`abort`](Self::abort) does this when it is needed; call it to start afresh after any
    /// other error.
    ///
    /// [KIP-360]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-360%3A+Improve+reliability+of+idempotent%2Ftransactional+producer
    pub async fn bump_epoch(&mut self) -> Result<(), TransactionError> {
        let current = {
            let state = self.state.lock();
            if matches!(state.phase, Phase::Fenced | Phase::Fatal(_)) {
                self.check_open(&state)?;
            }
            (state.producer_id, state.producer_epoch)
        };
        if self.in_transaction() {
            // The coordinator fences a producer that bumps its epoch with a transaction open
            // (it aborts it under a new epoch, which the retry then does not match).
            self.end_transaction(false).await?;
        }
        let result = self
            .context
            .init_producer_id(
                &self.transactional_id,
                self.transaction_timeout_ms,
                Some(current),
            )
            .await;
        let mut state = self.state.lock();
        match result {
            Ok((producer_id, producer_epoch)) => {
                info!(
                    transactional_id = self.transactional_id,
                    producer_id, producer_epoch, "bumped the producer epoch"
                );
                state.producer_id = producer_id;
                state.producer_epoch = producer_epoch;
                state.epoch_bump_required = false;
                state.open = false;
                state.phase = Phase::Ready;
                self.sequences.lock().clear();
                Ok(())
            }
            Err((Class::Retriable, e)) => Err(TransactionError::Retriable(e)),
            Err((class, e)) => Err(self.fail(&mut state, class, e)),
        }
    }

    /// `EndTxn` of the open transaction.
    async fn end_transaction(&mut self, committed: bool) -> Result<(), TransactionError> {
        let (producer_id, producer_epoch, confirmed) = {
            let state = self.state.lock();
            let confirmed = !(state.partitions.is_empty() && state.groups.is_empty());
            (state.producer_id, state.producer_epoch, confirmed)
        };
        let request = EndTxnRequest {
            transactional_id: self.transactional_id.clone(),
            producer_id,
            producer_epoch,
            committed,
        };
        let transactional_id = &self.transactional_id;
        let result = self
            .context
            .coordinator_request(
                if committed { "commit" } else { "abort" },
                CoordinatorType::Transaction,
                transactional_id,
                &request,
                |response| {
                    judge_error(
                        response.error,
                        || RequestContext::TransactionalId(transactional_id.clone()),
                        coordinator_error_class,
                    )
                },
            )
            .await;
        let mut state = self.state.lock();
        match result {
            Ok(()) => {
                debug!(transactional_id, committed, "ended transaction");
                state.open = false;
                state.partitions.clear();
                state.groups.clear();
                state.phase = Phase::Ready;
                Ok(())
            }
            // No partition or group was confirmed in the transaction (only a request whose
            // answer was lost may have begun it), and the coordinator has none open: there is
            // nothing to end.
            Err((
                _,
                Error::ServerError {
                    protocol_error: ProtocolError::InvalidTxnState,
                    ..
                },
            )) if !confirmed => {
                state.open = false;
                state.phase = Phase::Ready;
                Ok(())
            }
            Err((Class::Retriable, e)) => Err(TransactionError::Retriable(e)),
            // A refused end leaves nothing to abort that the coordinator would accept.
            Err((Class::Abortable, e)) => Err(self.fail(&mut state, Class::Fatal, e)),
            Err((class, e)) => Err(self.fail(&mut state, class, e)),
        }
    }

    /// Fails unless a transaction can be added to.
    fn check_open(&self, state: &State) -> Result<(), TransactionError> {
        let context = || RequestContext::TransactionalId(self.transactional_id.clone());
        match state.phase {
            Phase::Ready => Ok(()),
            Phase::Abortable => Err(TransactionError::Abortable(virtual_error(
                ProtocolError::InvalidTxnState,
                "an earlier error left the transaction to abort".into(),
                context(),
            ))),
            Phase::Fenced => Err(TransactionError::Fenced(virtual_error(
                ProtocolError::ProducerFenced,
                "the producer was fenced earlier".into(),
                context(),
            ))),
            Phase::Fatal(e) => Err(TransactionError::Fatal(virtual_error(
                e.unwrap_or(ProtocolError::UnknownServerError),
                "the producer failed earlier".into(),
                context(),
            ))),
        }
    }

    /// Records a failure of `class` in the producer's phase and wraps it.
    fn fail(&self, state: &mut State, class: Class, e: Error) -> TransactionError {
        let phase = match class {
            Class::Fenced => Phase::Fenced,
            Class::Fatal => Phase::Fatal(match &e {
                Error::ServerError { protocol_error, .. } => Some(*protocol_error),
                _ => None,
            }),
            Class::Abortable => Phase::Abortable,
            Class::Retriable => state.phase,
        };
        // A worse phase never turns into a milder one.
        if !matches!(state.phase, Phase::Fenced | Phase::Fatal(_)) {
            state.phase = phase;
        }
        warn!(
            transactional_id = self.transactional_id,
            ?class, %e, "transactional step failed"
        );
        class.wrap(e)
    }
}

/// The class of a transaction coordinator's (or a group coordinator's) error; `None` for one
/// to retry.
fn coordinator_error_class(e: ProtocolError) -> Option<Class> {
    match e {
        ProtocolError::NotCoordinator
        | ProtocolError::CoordinatorNotAvailable
        | ProtocolError::CoordinatorLoadInProgress
        | ProtocolError::ConcurrentTransactions
        | ProtocolError::RequestTimedOut
        | ProtocolError::NetworkException
        | ProtocolError::NotEnoughReplicas
        | ProtocolError::NotEnoughReplicasAfterAppend => None,
        ProtocolError::ProducerFenced | ProtocolError::InvalidProducerEpoch => Some(Class::Fenced),
        ProtocolError::TransactionalIdAuthorizationFailed
        | ProtocolError::ClusterAuthorizationFailed
        | ProtocolError::InvalidTransactionTimeout
        | ProtocolError::InvalidProducerIdMapping
        | ProtocolError::InvalidTxnState
        | ProtocolError::UnsupportedVersion
        | ProtocolError::UnsupportedForMessageFormat
        | ProtocolError::InvalidRequest
        | ProtocolError::TransactionCoordinatorFenced => Some(Class::Fatal),
        _ => Some(Class::Abortable),
    }
}

/// The step after a produce's error: retry what the leader or the replication say to retry
/// (the same batch, the same sequence), end on the rest.
fn produce_error_step<T>(e: Error) -> Step<T> {
    let Error::ServerError { protocol_error, .. } = &e else {
        return match e {
            Error::Connection(_) | Error::Request(_) => Step::Retry(e),
            e => Step::Fail(Class::Abortable, e),
        };
    };
    match protocol_error {
        ProtocolError::NotLeaderOrFollower
        | ProtocolError::LeaderNotAvailable
        | ProtocolError::FencedLeaderEpoch
        | ProtocolError::UnknownLeaderEpoch
        | ProtocolError::UnknownTopicOrPartition
        | ProtocolError::NotEnoughReplicas
        | ProtocolError::NotEnoughReplicasAfterAppend
        | ProtocolError::RequestTimedOut
        | ProtocolError::NetworkException
        | ProtocolError::KafkaStorageError
        | ProtocolError::CorruptMessage
        | ProtocolError::ConcurrentTransactions
        | ProtocolError::ThrottlingQuotaExceeded => Step::Retry(e),
        ProtocolError::InvalidProducerEpoch | ProtocolError::ProducerFenced => {
            Step::Fail(Class::Fenced, e)
        }
        ProtocolError::TransactionalIdAuthorizationFailed
        | ProtocolError::ClusterAuthorizationFailed
        | ProtocolError::UnsupportedVersion
        | ProtocolError::UnsupportedForMessageFormat => Step::Fail(Class::Fatal, e),
        _ => Step::Fail(Class::Abortable, e),
    }
}

/// The step after a response's one error code: done without one, else retried or failed as
/// `class_of` says (`None`: retried).
fn judge_error(
    error: Option<ProtocolError>,
    context: impl FnOnce() -> RequestContext,
    class_of: impl Fn(ProtocolError) -> Option<Class>,
) -> Step<()> {
    match error {
        None => Step::Done(()),
        Some(e) => match class_of(e) {
            None => Step::Retry(server_error(e, None, context())),
            Some(class) => Step::Fail(class, server_error(e, None, context())),
        },
    }
}

/// The step after a response's error codes by partition (topic, partition, error): the worst
/// decides, a fencing over a fatal error over an abortable one over a retry.
/// `OPERATION_NOT_ATTEMPTED`, which comes with the error that stopped the rest, is skipped.
fn judge_partitions(
    results: impl Iterator<Item = (String, i32, Option<ProtocolError>)>,
    class_of: impl Fn(ProtocolError) -> Option<Class>,
) -> Step<()> {
    let mut worst: Option<(Option<Class>, Error)> = None;
    for (topic, partition, error) in results {
        let Some(e) = error.filter(|e| *e != ProtocolError::OperationNotAttempted) else {
            continue;
        };
        let class = class_of(e);
        if worst.as_ref().is_none_or(|(c, _)| rank(class) > rank(*c)) {
            let error = server_error(e, None, RequestContext::Partition(topic, partition));
            worst = Some((class, error));
        }
    }
    match worst {
        None => Step::Done(()),
        Some((None, e)) => Step::Retry(e),
        Some((Some(class), e)) => Step::Fail(class, e),
    }
}

/// How bad a class is, for picking the one error of a response with several.
fn rank(class: Option<Class>) -> u8 {
    match class {
        None => 0,
        Some(Class::Retriable) => 1,
        Some(Class::Abortable) => 2,
        Some(Class::Fatal) => 3,
        Some(Class::Fenced) => 4,
    }
}

/// Whether the connection is unusable after this error.
fn is_broken(e: &RequestError) -> bool {
    matches!(e, RequestError::Poisoned(_) | RequestError::IO(_))
}

/// A request that got no answer: retried on a broken connection, fatal otherwise (no version
/// in common, a response that does not parse).
fn request_failed<T>(e: RequestError) -> Step<T> {
    if is_broken(&e) {
        Step::Retry(Error::Request(e))
    } else {
        Step::Fail(Class::Fatal, Error::Request(e))
    }
}

/// A connection that could not be made: retried, unless the broker refused the credentials.
fn connect_failed<T>(e: Error) -> Step<T> {
    let refused = matches!(
        &e,
        Error::Connection(crate::connection::Error::SaslFailed(
            crate::messenger::SaslError::ApiError(ProtocolError::SaslAuthenticationFailed)
        ))
    );
    if refused {
        Step::Fail(Class::Fatal, e)
    } else {
        Step::Retry(e)
    }
}

fn server_error(
    protocol_error: ProtocolError,
    error_message: Option<String>,
    request: RequestContext,
) -> Error {
    Error::ServerError {
        protocol_error,
        error_message,
        request,
        response: None,
        is_virtual: false,
    }
}

/// An error the client raises as the broker would.
fn virtual_error(protocol_error: ProtocolError, message: String, request: RequestContext) -> Error {
    Error::ServerError {
        protocol_error,
        error_message: Some(message),
        request,
        response: None,
        is_virtual: true,
    }
}

/// Waits as long as the broker asked (it answers a throttled request at once, and expects the
/// client to wait before the next one).
async fn throttle(throttle_time_ms: Int32) {
    if let Ok(ms) = u64::try_from(throttle_time_ms.0) {
        if ms > 0 {
            info!(ms, "broker asked to throttle");
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// The sequence number after `n` records from `sequence`: it wraps from `i32::MAX` to 0, as
/// the broker's does.
fn increment_sequence(sequence: i32, n: usize) -> i32 {
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    ((i64::from(sequence) + n) % (i64::from(i32::MAX) + 1)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_request_leaves_the_transaction_to_abort() {
        let state = Mutex::new(State {
            producer_id: 1,
            producer_epoch: 0,
            phase: Phase::Ready,
            open: true,
            partitions: HashSet::new(),
            groups: HashSet::new(),
            epoch_bump_required: false,
        });
        Unfinished::new(&state, true).finished();
        assert_eq!(state.lock().phase, Phase::Ready);
        drop(Unfinished::new(&state, false));
        assert_eq!(state.lock().phase, Phase::Abortable);
        assert!(!state.lock().epoch_bump_required);
        drop(Unfinished::new(&state, true));
        assert!(state.lock().epoch_bump_required);
        state.lock().phase = Phase::Fenced;
        drop(Unfinished::new(&state, true));
        assert_eq!(state.lock().phase, Phase::Fenced);
    }

    #[test]
    fn sequences_wrap_as_the_broker_does() {
        assert_eq!(increment_sequence(0, 1), 1);
        assert_eq!(increment_sequence(5, 10), 15);
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
    }

    #[test]
    fn coordinator_errors_are_classed() {
        assert_eq!(
            coordinator_error_class(ProtocolError::ConcurrentTransactions),
            None
        );
        assert_eq!(coordinator_error_class(ProtocolError::NotCoordinator), None);
        assert_eq!(
            coordinator_error_class(ProtocolError::CoordinatorLoadInProgress),
            None
        );
        assert_eq!(
            coordinator_error_class(ProtocolError::ProducerFenced),
            Some(Class::Fenced)
        );
        assert_eq!(
            coordinator_error_class(ProtocolError::InvalidProducerEpoch),
            Some(Class::Fenced)
        );
        assert_eq!(
            coordinator_error_class(ProtocolError::TransactionalIdAuthorizationFailed),
            Some(Class::Fatal)
        );
        assert_eq!(
            coordinator_error_class(ProtocolError::InvalidTransactionTimeout),
            Some(Class::Fatal)
        );
        assert_eq!(
            coordinator_error_class(ProtocolError::OffsetMetadataTooLarge),
            Some(Class::Abortable)
        );
    }

    #[test]
    fn produce_errors_are_classed() {
        let step = |e| match produce_error_step::<()>(server_error(
            e,
            None,
            RequestContext::Partition("t".into(), 0),
        )) {
            Step::Done(()) => unreachable!(),
            Step::Retry(_) => None,
            Step::Fail(class, _) => Some(class),
        };
        assert_eq!(step(ProtocolError::NotLeaderOrFollower), None);
        assert_eq!(step(ProtocolError::NotEnoughReplicas), None);
        assert_eq!(
            step(ProtocolError::InvalidProducerEpoch),
            Some(Class::Fenced)
        );
        assert_eq!(
            step(ProtocolError::OutOfOrderSequenceNumber),
            Some(Class::Abortable)
        );
        assert_eq!(step(ProtocolError::InvalidTxnState), Some(Class::Abortable));
        assert_eq!(step(ProtocolError::MessageTooLarge), Some(Class::Abortable));
        assert_eq!(
            step(ProtocolError::TransactionalIdAuthorizationFailed),
            Some(Class::Fatal)
        );
    }
}
