//! [`KafkaPublisher`]: the [`Publisher`] on rskafka, with its metadata cache and retries.
//!
//! One rskafka [`Client`] per publisher; it keeps the broker connections and rebuilds a broken
//! one on the next request (its own retries are bounded by
//! [`KafkaConfig::retry_budget`]). Above it the publisher caches each topic's partition count
//! (trusted for [`KafkaConfig::metadata_max_age`]) and one [`PartitionClient`] per partition.
//! A produce that fails with a leader, metadata or connection error drops that partition
//! client and the topic's metadata and tries again, at most
//! [`KafkaConfig::produce_attempts`] times and never past [`KafkaConfig::publish_timeout`].
//!
//! Produce requests use `acks=all` (rskafka always sends `acks = -1`, broker timeout 30 s),
//! the record batch compressed as [`KafkaConfig::compression`] says (none by default), and
//! no idempotence; a retried request may therefore duplicate records, which at-least-once
//! delivery allows (consumers deduplicate on the message-id header).
//!
//! What a failed request means (retry, reject the records, give up) is decided in
//! `classify`; why a connect failed, in words the user can act on, in `diagnose`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::error::{Error as ClientError, ProtocolError};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::classify::{
    client_error, not_authorized, produce_error, protocol_error, verdict, Verdict,
};
use super::config::{Delivery, KafkaAuth, KafkaCompression, KafkaConfig};
use super::diagnose::connect_error;
use super::exactly_once::ExactlyOnce;
use super::msk_iam::MskIamTokenProvider;
use super::record::{estimated_size, to_record};
use super::route::{acknowledged_prefix, chunks, plan, TopicRoute, Unroutable};
use super::span::PublishSpan;
use super::tls::KafkaTls;
use super::{PublishOutcome, Publisher};
use crate::error::{BoxError, Error, Rejection, Result};
use crate::message::StoredMessage;
use crate::protocol::watermark::OutboxIdentity;

/// Publishes outbox batches to Kafka with rskafka. Cheap to clone (one shared client).
#[derive(Clone)]
pub struct KafkaPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: KafkaConfig,
    /// Who the brokers authorize the publisher as ([`KafkaPublisher::principal`]).
    principal: String,
    /// Partition counts by topic, with when they were read.
    topics: Mutex<HashMap<String, TopicMeta>>,
    /// One client per partition, connected to its leader.
    partitions: Mutex<HashMap<(String, i32), Arc<PartitionClient>>>,
    /// Rotates the keyless records' partition from batch to batch.
    sticky: AtomicU32,
    /// Produce requests sent (every attempt), for [`KafkaPublisher::produce_requests`].
    produce_requests: AtomicU64,
    /// The transactional producers and watermarks, with `OUTBOX_DELIVERY=exactly-once`.
    exactly_once: Option<ExactlyOnce>,
}

#[derive(Debug, Clone, Copy)]
struct TopicMeta {
    partition_count: u32,
    read_at: Instant,
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topics = self.inner.topics.lock().map(|t| t.len()).unwrap_or(0);
        f.debug_struct("KafkaPublisher")
            .field("config", &self.inner.config)
            .field("cached_topics", &topics)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Connects to the cluster (bootstrap, TLS, SASL, a first metadata read), giving up at
    /// `deadline`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `config` breaks a rule ([`KafkaConfig::validate`]);
    /// [`Error::Misconfiguration`] for TLS files or secrets that cannot be used (the
    /// reason names the variable, the source says why); [`Error::Kafka`] when the brokers
    /// cannot be reached or refuse the credentials or the certificate (the message says
    /// what to check); [`Error::DeadlineExceeded`] at `deadline`.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use dynamo_outbox::publish::{KafkaConfig, KafkaPublisher};
    /// use tokio::time::Instant;
    ///
    /// # async fn example() -> dynamo_outbox::Result<()> {
    /// let config = KafkaConfig::new(["localhost:9092"]);
    /// let publisher = KafkaPublisher::connect(config, Instant::now() + Duration::from_secs(10)).await?;
    /// println!("publishing as {}", publisher.principal());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(config: KafkaConfig, deadline: Instant) -> Result<Self> {
        config.validate()?;
        match tokio::time::timeout_at(deadline, Self::build(config)).await {
            Ok(result) => result,
            Err(_) => Err(Error::DeadlineExceeded("kafka connect")),
        }
    }

    async fn build(config: KafkaConfig) -> Result<Self> {
        let backoff = BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 3.0,
            deadline: Some(config.retry_budget),
        };
        let mut builder = ClientBuilder::new(config.bootstrap_servers.clone())
            .client_id(config.client_id.as_str())
            .backoff_config(backoff);
        if let KafkaTls::On {
            roots,
            client_certificate,
        } = &config.tls
        {
            let tls = super::tls::client_config(roots, client_certificate.as_ref()).await?;
            builder = builder.tls_config(tls);
        }
        if config.auth == KafkaAuth::MskIam {
            if !config.tls.is_on() {
                warn!("MSK accepts IAM authentication only over TLS, and KAFKA_TLS is off");
            }
            let region = config
                .region
                .clone()
                .ok_or_else(|| Error::option("region", "is required for MSK IAM authentication"))?;
            let credentials = match &config.credentials {
                Some(c) => c.clone(),
                None => default_credentials(&region).await?,
            };
            let provider = Arc::new(MskIamTokenProvider::new(region, credentials));
            builder = builder.sasl_config(provider.sasl_config());
        }
        let mut username = None;
        if config.auth.uses_password() {
            let (sasl, user) = sasl_config(&config).await?;
            builder = builder.sasl_config(sasl);
            username = Some(user);
        }
        let principal = match username {
            Some(user) => format!("User:{user}"),
            None => principal_without_password(&config).await,
        };
        let client = match builder.build().await {
            Ok(client) => client,
            Err(e) => return Err(connect_error(&config, e).await),
        };
        info!(
            servers = ?config.bootstrap_servers,
            auth = ?config.auth,
            tls = config.tls.is_on(),
            principal = %principal,
            "connected to kafka"
        );
        let config_delivery = config.delivery;
        Ok(KafkaPublisher {
            inner: Arc::new(Inner {
                client,
                config,
                principal,
                topics: Mutex::new(HashMap::new()),
                partitions: Mutex::new(HashMap::new()),
                sticky: AtomicU32::new(rand::random()),
                produce_requests: AtomicU64::new(0),
                exactly_once: (config_delivery == Delivery::ExactlyOnce).then(ExactlyOnce::default),
            }),
        })
    }

    /// How many produce requests this publisher has sent (every attempt counts; a request
    /// carries the records of one partition, at most
    /// [`KafkaConfig::max_request_bytes`] of them unless a single record is larger).
    pub fn produce_requests(&self) -> u64 {
        self.inner.produce_requests.load(Ordering::Relaxed)
    }

    /// The options this publisher runs with.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// Who the brokers authorize this publisher as, as far as its configuration says, for
    /// the errors, logs and metrics of a refused authorization
    /// ([`Error::KafkaNotAuthorized`]): `User:NAME` with SCRAM or PLAIN (NAME the SASL
    /// username); with a client certificate and no SASL, `User:` and the certificate's
    /// subject as RFC 2253 writes it (`User:CN=relay,O=Example`, what Kafka's default
    /// `ssl.principal.mapping.rules` make of it; a cluster with other rules maps it to
    /// another name; a text saying so when the subject cannot be read); `msk-iam` with IAM
    /// (the IAM identity of the AWS credentials); `User:ANONYMOUS` without authentication.
    pub fn principal(&self) -> &str {
        &self.inner.principal
    }

    /// Creates a topic through the controller; `Ok(false)` when it already exists. Waits
    /// (a few seconds at most) until the metadata shows it.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication: i16,
    ) -> Result<bool> {
        crate::message::validate_topic(name).map_err(|rule| Error::option("topic", rule))?;
        let controller = self
            .inner
            .client
            .controller_client()
            .map_err(|e| client_error("reaching the controller", e))?;
        let created = match controller
            .create_topic(name, partitions, replication, 10_000)
            .await
        {
            Ok(()) => true,
            Err(ClientError::ServerError {
                protocol_error: ProtocolError::TopicAlreadyExists,
                ..
            }) => false,
            Err(e) => return Err(client_error("creating a topic", e)),
        };
        if created {
            for _ in 0..50 {
                if self.partition_count(name).await?.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(created)
    }

    /// The topic's partition count from fresh metadata; `None` if the cluster does not list it.
    pub async fn partition_count(&self, topic: &str) -> Result<Option<u32>> {
        self.refresh_metadata().await?;
        Ok(self
            .inner
            .topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
            .map(|m| m.partition_count))
    }

    /// Exactly once: what the transactional producers did so far; `None` in at-least-once
    /// mode.
    pub fn transaction_counts(&self) -> Option<super::TransactionCounts> {
        self.inner.exactly_once.as_ref().map(ExactlyOnce::counts)
    }

    /// The rskafka client (exactly once: the transactional producers and offset fetches).
    pub(super) fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Counts one produce request in [`Self::produce_requests`].
    pub(super) fn count_produce_request(&self) {
        self.inner.produce_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The keyless records' partition of each topic for one batch.
    pub(super) fn sticky_partitions<'t>(&self, topics: &[&'t str]) -> HashMap<&'t str, u32> {
        topics
            .iter()
            .map(|&t| (t, self.inner.sticky.fetch_add(1, Ordering::Relaxed)))
            .collect()
    }

    /// Reads every topic's partition count into the cache (replacing it).
    async fn refresh_metadata(&self) -> Result<()> {
        let listed = self
            .inner
            .client
            .list_topics()
            .await
            .map_err(|e| client_error("reading topic metadata", e))?;
        let now = Instant::now();
        // the listing is complete: topics missing from it (deleted) leave the cache too
        let fresh: HashMap<String, TopicMeta> = listed
            .into_iter()
            .filter(|t| !t.partitions.is_empty())
            .map(|t| {
                let meta = TopicMeta {
                    partition_count: t.partitions.len() as u32,
                    read_at: now,
                };
                (t.name, meta)
            })
            .collect();
        *self.inner.topics.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// Partition counts of `wanted`, reading metadata when one is missing or stale. A topic
    /// missing from fresh metadata maps to a rejection; a failed read keeps stale counts and
    /// maps the others to the read's error.
    pub(super) async fn topic_counts(
        &self,
        wanted: &[&str],
        deadline: Instant,
    ) -> HashMap<String, Result<u32, Error>> {
        let max_age = self.inner.config.metadata_max_age;
        let fresh = |topics: &HashMap<String, TopicMeta>, t: &str| {
            topics
                .get(t)
                .filter(|m| m.read_at.elapsed() < max_age)
                .map(|m| m.partition_count)
        };
        let stale = {
            let topics = self.inner.topics.lock().unwrap_or_else(|p| p.into_inner());
            wanted.iter().any(|t| fresh(&topics, t).is_none())
        };
        // one failed read answers for every topic it left without metadata: shared, so each
        // topic's error keeps it as its source
        let refresh_error = if stale {
            match tokio::time::timeout_at(deadline, self.refresh_metadata()).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(Arc::new(e)),
                Err(_) => Some(Arc::new(Error::Kafka {
                    message: "reading topic metadata timed out".into(),
                    retryable: true,
                    source: None,
                })),
            }
        } else {
            None
        };
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let topics = self.inner.topics.lock().unwrap_or_else(|p| p.into_inner());
            for &t in wanted {
                let result = match (topics.get(t), &refresh_error) {
                    (Some(m), None) => Ok(m.partition_count),
                    (Some(m), Some(e)) => {
                        debug!(topic = t, error = %crate::error::chain(&e), "using stale topic metadata");
                        Ok(m.partition_count)
                    }
                    (None, None) => {
                        missing.push(t);
                        continue;
                    }
                    (None, Some(e)) => Err(Error::Kafka {
                        message: format!("no metadata for topic {t}"),
                        retryable: e.is_retryable(),
                        source: Some(Box::new(Arc::clone(e))),
                    }),
                };
                out.insert(t.to_owned(), result);
            }
        }
        for t in missing {
            out.insert(t.to_owned(), self.probe_missing_topic(t, deadline).await);
        }
        out
    }

    /// Why a topic is missing from the cluster's topic list: the list leaves out topics the
    /// principal may not describe, so ask for this one topic and read its error code.
    async fn probe_missing_topic(&self, topic: &str, deadline: Instant) -> Result<u32, Error> {
        let probe = self
            .inner
            .client
            .partition_client(topic, 0, UnknownTopicHandling::Error);
        let rejected = |reason, source: Option<BoxError>| Error::KafkaRejected {
            topic: topic.to_owned(),
            reason,
            source,
        };
        match tokio::time::timeout_at(deadline, probe).await {
            Ok(Err(e)) => match (protocol_error(&e), verdict(&e)) {
                (Some(ProtocolError::UnknownTopicOrPartition), _) => {
                    Err(rejected(Rejection::UnknownTopic, Some(Box::new(e))))
                }
                (_, Verdict::Reject(reason)) => Err(rejected(reason, Some(Box::new(e)))),
                // The principal may not describe it: retried, never a rejection.
                (_, Verdict::NotAuthorized(failure)) => Err(not_authorized(
                    topic,
                    &self.inner.principal,
                    "DESCRIBE",
                    failure,
                    Some(Box::new(e)),
                )),
                _ => Err(client_error("reading the metadata of one topic", e)),
            },
            Ok(Ok(_)) => Err(Error::Kafka {
                message: format!("topic {topic} exists but was missing from the topic list"),
                retryable: true,
                source: None,
            }),
            Err(_) => Err(Error::Kafka {
                message: format!("reading the metadata of topic {topic} timed out"),
                retryable: true,
                source: None,
            }),
        }
    }

    fn forget_topic(&self, topic: &str) {
        self.inner
            .topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(topic);
    }

    fn forget_partition(&self, topic: &str, partition: i32) {
        self.inner
            .partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(topic.to_owned(), partition));
    }

    async fn partition_client(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Arc<PartitionClient>, ClientError> {
        let key = (topic.to_owned(), partition);
        if let Some(c) = self
            .inner
            .partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(Arc::clone(c));
        }
        let client = Arc::new(
            self.inner
                .client
                .partition_client(topic, partition, UnknownTopicHandling::Error)
                .await?,
        );
        let mut partitions = self
            .inner
            .partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Ok(Arc::clone(partitions.entry(key).or_insert(client)))
    }

    /// Produces `records` to one partition in one request, retrying what may succeed; the
    /// offsets the broker gave them.
    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<Record>,
        deadline: Instant,
    ) -> Result<Vec<i64>> {
        let attempts = self.inner.config.produce_attempts.max(1);
        let mut attempt = 1;
        loop {
            let result = tokio::time::timeout_at(deadline, async {
                let client = self.partition_client(topic, partition).await?;
                self.inner.produce_requests.fetch_add(1, Ordering::Relaxed);
                client
                    .produce(records.clone(), codec(self.inner.config.compression))
                    .await
            })
            .await;
            let e = match result {
                Ok(Ok(offsets)) => return Ok(offsets),
                Ok(Err(e)) => e,
                Err(_) => {
                    // the request may still be in flight: not known to be written
                    self.forget_partition(topic, partition);
                    return Err(Error::Kafka {
                        message: format!("producing to {topic}/{partition} timed out"),
                        retryable: true,
                        source: None,
                    });
                }
            };
            let verdict = verdict(&e);
            match verdict {
                Verdict::Retry { refresh_metadata } => {
                    self.forget_partition(topic, partition);
                    if refresh_metadata {
                        self.forget_topic(topic);
                    }
                    if attempt < attempts && Instant::now() < deadline {
                        warn!(topic, partition, attempt, error = %crate::error::chain(&e), "produce failed, retrying");
                        let pause = Duration::from_millis(100 * u64::from(attempt));
                        tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
                        attempt += 1;
                        continue;
                    }
                }
                // A refused authorization waits for an operator: the caller retries it
                // after its backoff, not this request at once.
                Verdict::Reject(_) | Verdict::NotAuthorized(_) | Verdict::Fatal => {}
            }
            return Err(produce_error(
                topic,
                partition,
                &self.inner.principal,
                verdict,
                e,
            ));
        }
    }

    /// Produces one group's records, request after request, stopping at the first failure;
    /// returns the index of the first message not written (with why), if any.
    async fn produce_group(
        &self,
        batch: &[StoredMessage],
        group: super::route::Group<'_>,
        timestamp: DateTime<Utc>,
        deadline: Instant,
        lowest_failure: &AtomicUsize,
    ) -> Option<(usize, Error)> {
        let header = self.inner.config.message_id_header.as_str();
        let mut queue: VecDeque<&[usize]> = chunks(
            &group.indices,
            |i| estimated_size(&batch[i].message, header),
            self.inner.config.max_request_bytes,
        )
        .into();
        while let Some(chunk) = queue.pop_front() {
            if chunk[0] >= lowest_failure.load(Ordering::SeqCst) {
                // an earlier message already failed: nothing here could be acknowledged
                break;
            }
            let records = chunk
                .iter()
                .map(|&i| to_record(&batch[i].message, header, timestamp))
                .collect();
            let span = PublishSpan::start(group.topic, group.partition, batch, chunk);
            let produced = self
                .produce(group.topic, group.partition, records, deadline)
                .await;
            match &produced {
                Ok(offsets) => {
                    debug!(
                        topic = group.topic,
                        partition = group.partition,
                        records = chunk.len(),
                        first_offset = offsets.first().copied(),
                        last_offset = offsets.last().copied(),
                        bucket = batch[chunk[0]].bucket,
                        first_sequence = batch[chunk[0]].sequence,
                        last_sequence = batch[chunk[chunk.len() - 1]].sequence,
                        "produce acknowledged"
                    );
                    span.acknowledged(offsets.first().copied())
                }
                Err(e) => span.failed(e),
            }
            match produced {
                Ok(_) => {}
                Err(Error::KafkaRejected {
                    reason: Rejection::TooLarge | Rejection::InvalidRecord,
                    ..
                }) if chunk.len() > 1 => {
                    // find the record at fault: halves, in order
                    let (a, b) = chunk.split_at(chunk.len() / 2);
                    queue.push_front(b);
                    queue.push_front(a);
                }
                Err(e) => {
                    lowest_failure.fetch_min(chunk[0], Ordering::SeqCst);
                    return Some((chunk[0], e));
                }
            }
        }
        None
    }

    /// Publishes one batch; see [`Publisher::publish`].
    #[tracing::instrument(
        name = "publish",
        skip_all,
        fields(bucket = batch.first().map(|m| m.bucket), messages = batch.len())
    )]
    pub async fn publish_batch(&self, batch: &[StoredMessage]) -> PublishOutcome {
        self.publish_batch_until(batch, Instant::now() + self.inner.config.publish_timeout)
            .await
    }

    /// [`Self::publish_batch`], with every produce request bounded by `until` as well as
    /// the publish timeout: a request not answered by then counts as not acknowledged.
    pub async fn publish_batch_until(
        &self,
        batch: &[StoredMessage],
        until: Instant,
    ) -> PublishOutcome {
        if batch.is_empty() {
            return PublishOutcome::complete(0);
        }
        if let Some(eo) = &self.inner.exactly_once {
            return self.publish_exactly_once(eo, batch, until).await;
        }
        let deadline = until.min(Instant::now() + self.inner.config.publish_timeout);
        let mut wanted: Vec<&str> = Vec::new();
        for m in batch {
            if !wanted.contains(&m.message.topic.as_str()) {
                wanted.push(&m.message.topic);
            }
        }
        let mut counts = self.topic_counts(&wanted, deadline).await;
        let sticky = self.sticky_partitions(&wanted);
        let plan = plan(batch.iter().map(|m| &m.message), |t| match counts.get(t) {
            Some(Ok(n)) => Some(TopicRoute {
                partition_count: *n,
                sticky: sticky.get(t).copied().unwrap_or(0) % n.max(&1),
            }),
            _ => None,
        });

        let mut failures: Vec<(usize, Error)> = Vec::new();
        if let Some((index, why)) = plan.stop {
            let topic = batch[index].message.topic.as_str();
            let error = match why {
                Unroutable::Topic => match counts.remove(topic) {
                    Some(Err(e)) => e,
                    _ => Error::Kafka {
                        message: format!("no route to topic {topic}"),
                        retryable: true,
                        source: None,
                    },
                },
                Unroutable::Partition(reason) => Error::KafkaRejected {
                    topic: topic.to_owned(),
                    reason,
                    source: None,
                },
            };
            failures.push((index, error));
        }
        let lowest_failure = AtomicUsize::new(plan.stop.map_or(batch.len(), |(i, _)| i));
        let timestamp = now_millis();
        let groups = plan.groups.len();
        // futures built up front (not in a stream's closure), which keeps the future `Send`
        let produces: Vec<_> = plan
            .groups
            .into_iter()
            .map(|g| self.produce_group(batch, g, timestamp, deadline, &lowest_failure))
            .collect();
        let results: Vec<_> = futures::stream::iter(produces)
            .buffer_unordered(self.inner.config.max_in_flight.max(1))
            .collect()
            .await;
        failures.extend(results.into_iter().flatten());

        let acknowledged = acknowledged_prefix(batch.len(), failures.iter().map(|(i, _)| *i));
        let error = failures
            .into_iter()
            .find(|(i, _)| *i == acknowledged)
            .map(|(_, e)| e);
        match &error {
            None => debug!(groups, "published batch"),
            Some(e) => warn!(
                groups,
                acknowledged,
                retryable = e.is_retryable(),
                error = %crate::error::chain(&e),
                "batch partly published"
            ),
        }
        PublishOutcome {
            acknowledged,
            error,
        }
    }
}

impl Publisher for KafkaPublisher {
    fn publish<'a>(
        &'a self,
        batch: &'a [StoredMessage],
    ) -> impl std::future::Future<Output = PublishOutcome> + Send + 'a {
        self.publish_batch(batch)
    }

    fn publish_until<'a>(
        &'a self,
        batch: &'a [StoredMessage],
        until: Instant,
    ) -> impl std::future::Future<Output = PublishOutcome> + Send + 'a {
        self.publish_batch_until(batch, until)
    }

    fn delivery(&self) -> Delivery {
        self.inner.config.delivery
    }

    fn bind_outbox(&self, identity: &OutboxIdentity, lease_duration: Duration) {
        if let Some(eo) = &self.inner.exactly_once {
            eo.bind(identity, lease_duration);
        }
    }
}

/// rskafka's codec for `compression` (the workspace enables all four of its codecs).
pub(super) fn codec(compression: KafkaCompression) -> Compression {
    match compression {
        KafkaCompression::None => Compression::NoCompression,
        KafkaCompression::Gzip => Compression::Gzip,
        KafkaCompression::Snappy => Compression::Snappy,
        KafkaCompression::Lz4 => Compression::Lz4,
        KafkaCompression::Zstd => Compression::Zstd,
    }
}

pub(super) fn now_millis() -> DateTime<Utc> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// rskafka's SASL configuration for SCRAM or PLAIN, with the credentials resolved (the
/// secret read once per process), and the username.
async fn sasl_config(config: &KafkaConfig) -> Result<(rskafka::client::SaslConfig, String)> {
    use rskafka::client::{Credentials, SaslConfig};
    let source = config.sasl.as_ref().ok_or_else(|| {
        Error::option(
            "sasl",
            format!(
                "is required for {} (a username and password)",
                config.auth.name()
            ),
        )
    })?;
    let up = source.resolve().await?;
    let username = up.username.clone();
    let credentials = Credentials::new(up.username, up.password.expose().to_owned());
    let sasl = match config.auth {
        KafkaAuth::ScramSha256 => SaslConfig::ScramSha256(credentials),
        KafkaAuth::ScramSha512 => SaslConfig::ScramSha512(credentials),
        _ => SaslConfig::Plain(credentials),
    };
    Ok((sasl, username))
}

/// [`KafkaPublisher::principal`] of a configuration without a SASL username: MSK IAM,
/// a client certificate, or nobody.
async fn principal_without_password(config: &KafkaConfig) -> String {
    if config.auth == KafkaAuth::MskIam {
        return "msk-iam".into();
    }
    match super::tls::client_subject(&config.tls).await {
        Some(Some(subject)) => format!("User:{subject}"),
        Some(None) => "the client certificate (its subject could not be read)".into(),
        None => "User:ANONYMOUS".into(),
    }
}

/// The standard AWS credentials chain (environment, profile, web identity, ECS, IMDS).
async fn default_credentials(
    region: &str,
) -> Result<aws_credential_types::provider::SharedCredentialsProvider> {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_owned()))
        .load()
        .await;
    sdk.credentials_provider().ok_or_else(|| {
        Error::misconfigured("MSK IAM: the AWS configuration has no credentials provider")
    })
}
