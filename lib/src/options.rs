//! Options of the store, the writer and the relay: documented defaults, validation, and
//! the one place that reads them from the environment.

use std::time::Duration;

use crate::attr;
use crate::error::{Error, Result};

/// Environment variable names shared by every binary of the project.
pub mod env {
    /// [`OutboxOptions::table_name`](super::OutboxOptions::table_name).
    pub const TABLE_NAME: &str = "OUTBOX_TABLE_NAME";
    /// [`OutboxOptions::key_prefix`](super::OutboxOptions::key_prefix).
    pub const KEY_PREFIX: &str = "OUTBOX_KEY_PREFIX";
    /// [`OutboxOptions::bucket_count`](super::OutboxOptions::bucket_count).
    pub const BUCKET_COUNT: &str = "OUTBOX_BUCKET_COUNT";
    /// [`OutboxOptions::partition_key_attribute`](super::OutboxOptions::partition_key_attribute).
    pub const PARTITION_KEY_ATTRIBUTE: &str = "OUTBOX_PARTITION_KEY_ATTRIBUTE";
    /// [`OutboxOptions::sort_key_attribute`](super::OutboxOptions::sort_key_attribute).
    pub const SORT_KEY_ATTRIBUTE: &str = "OUTBOX_SORT_KEY_ATTRIBUTE";
    /// [`OutboxOptions::max_concurrency`](super::OutboxOptions::max_concurrency).
    pub const MAX_CONCURRENCY: &str = "OUTBOX_MAX_CONCURRENCY";
    /// [`OutboxOptions::pending_count_limit`](super::OutboxOptions::pending_count_limit).
    pub const PENDING_COUNT_LIMIT: &str = "OUTBOX_PENDING_COUNT_LIMIT";
    /// [`RelayOptions::relay_id`](super::RelayOptions::relay_id).
    pub const RELAY_ID: &str = "OUTBOX_RELAY_ID";
    /// [`RelayOptions::batch_size`](super::RelayOptions::batch_size).
    pub const BATCH_SIZE: &str = "OUTBOX_BATCH_SIZE";
    /// [`RelayOptions::poll_interval`](super::RelayOptions::poll_interval).
    pub const POLL_INTERVAL: &str = "OUTBOX_POLL_INTERVAL";
    /// [`RelayOptions::error_backoff`](super::RelayOptions::error_backoff).
    pub const ERROR_BACKOFF: &str = "OUTBOX_ERROR_BACKOFF";
    /// [`RelayOptions::lease_duration`](super::RelayOptions::lease_duration).
    pub const LEASE_DURATION: &str = "OUTBOX_LEASE_DURATION";
    /// [`RelayOptions::lease_renew_interval`](super::RelayOptions::lease_renew_interval).
    pub const LEASE_RENEW_INTERVAL: &str = "OUTBOX_LEASE_RENEW_INTERVAL";
    /// [`RelayOptions::metrics_name`](super::RelayOptions::metrics_name).
    pub const METRICS_NAME: &str = "OUTBOX_METRICS_NAME";
    /// [`RelayOptions::idle_stop`](super::RelayOptions::idle_stop): a duration, or `never`
    /// (also: empty) for never.
    pub const IDLE_STOP: &str = "OUTBOX_IDLE_STOP";
    /// [`RelayOptions::max_in_flight_bytes`](super::RelayOptions::max_in_flight_bytes).
    pub const MAX_IN_FLIGHT_BYTES: &str = "OUTBOX_MAX_IN_FLIGHT_BYTES";
    /// [`OutboxOptions::allowed_topics`](super::OutboxOptions::allowed_topics): the topics
    /// writers may enqueue to and relays may publish to, comma-separated names and
    /// `prefix*` patterns; unset: every topic.
    pub const ALLOWED_TOPICS: &str = "OUTBOX_ALLOWED_TOPICS";
    /// [`RelayOptions::poison_policy`](super::RelayOptions::poison_policy): `block` (the
    /// default) or `quarantine-after=N`.
    pub const POISON_POLICY: &str = "OUTBOX_POISON_POLICY";
}

/// Options of the table layout, shared by every writer and relay of one outbox.
///
/// Every writer and relay sharing a table must use the same table name, key attribute
/// names, key prefix and bucket count.
///
/// # Examples
/// ```
/// use dynamo_outbox::OutboxOptions;
///
/// let options = OutboxOptions::new("orders-outbox")
///     .with_key_prefix("ORDERS")
///     .with_bucket_count(16);
/// options.validate()?;
/// assert_eq!((options.partition_key_attribute.as_str(), options.bucket_count), ("PK", 16));
/// # Ok::<(), dynamo_outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxOptions {
    /// The table holding the outbox items (required).
    pub table_name: String,
    /// Name of the table's partition key attribute (`PK`); lets the outbox share a
    /// single-table design whose key attributes are named otherwise.
    pub partition_key_attribute: String,
    /// Name of the table's sort key attribute (`SK`).
    pub sort_key_attribute: String,
    /// Prefix of every partition key the outbox writes (`OUTBOX`); distinct prefixes keep
    /// several outboxes, or the outbox and your own items, apart in one table.
    pub key_prefix: String,
    /// Number of buckets (8): the unit of ordering and of relay ownership.
    pub bucket_count: u32,
    /// Concurrent DynamoDB requests of one store call (8): leases are one request each.
    pub max_concurrency: usize,
    /// Messages counted per bucket for one backlog sample (10,000): a count is billed as
    /// a read of every counted item.
    pub pending_count_limit: u32,
    /// The topics this process may write to (a writer, the enqueue service) or publish to
    /// (a relay, whose store carries these options); every topic by default. Unlike the
    /// rest, it need not agree between processes: each enqueue function (one per trust
    /// domain) allows its callers' topics, the relay the union of them. A writer refuses
    /// any other topic before it sends anything ([`Error::InvalidMessage`] naming
    /// `messages[i].topic`); a relay parks the bucket of a message on another topic (one
    /// written straight into the table) as poison instead of publishing it.
    pub allowed_topics: TopicAllowList,
}

impl OutboxOptions {
    /// Options with the documented defaults for `table_name`.
    pub fn new(table_name: impl Into<String>) -> Self {
        OutboxOptions {
            table_name: table_name.into(),
            partition_key_attribute: "PK".into(),
            sort_key_attribute: "SK".into(),
            key_prefix: "OUTBOX".into(),
            bucket_count: 8,
            max_concurrency: 8,
            pending_count_limit: 10_000,
            allowed_topics: TopicAllowList::all(),
        }
    }

    /// Sets the topics the outbox may write and publish ([`Self::allowed_topics`]).
    pub fn with_allowed_topics(mut self, allowed_topics: TopicAllowList) -> Self {
        self.allowed_topics = allowed_topics;
        self
    }

    /// Sets the bucket count ([`Self::bucket_count`]).
    pub fn with_bucket_count(mut self, bucket_count: u32) -> Self {
        self.bucket_count = bucket_count;
        self
    }

    /// Sets the key prefix ([`Self::key_prefix`]).
    pub fn with_key_prefix(mut self, key_prefix: impl Into<String>) -> Self {
        self.key_prefix = key_prefix.into();
        self
    }

    /// Sets the names of the table's key attributes ([`Self::partition_key_attribute`],
    /// [`Self::sort_key_attribute`]).
    pub fn with_key_attributes(
        mut self,
        partition_key_attribute: impl Into<String>,
        sort_key_attribute: impl Into<String>,
    ) -> Self {
        self.partition_key_attribute = partition_key_attribute.into();
        self.sort_key_attribute = sort_key_attribute.into();
        self
    }

    /// Sets the concurrent requests of one store call ([`Self::max_concurrency`]).
    pub fn with_max_concurrency(mut self, max_concurrency: usize) -> Self {
        self.max_concurrency = max_concurrency;
        self
    }

    /// Sets the messages counted per bucket for one backlog sample
    /// ([`Self::pending_count_limit`]).
    pub fn with_pending_count_limit(mut self, pending_count_limit: u32) -> Self {
        self.pending_count_limit = pending_count_limit;
        self
    }

    /// Reads the options from the process environment (see [`env`](mod@env)) and validates them.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the variable (or the field) and the rule it broke:
    /// [`env::TABLE_NAME`] unset, a number that does not parse, a rule of
    /// [`validate`](Self::validate).
    ///
    /// # Examples
    /// ```no_run
    /// let options = dynamo_outbox::OutboxOptions::from_env()?;
    /// # Ok::<(), dynamo_outbox::Error>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the options through `lookup` (an environment stand-in) and validates them.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    ///
    /// # Examples
    /// ```
    /// use dynamo_outbox::options::{env, OutboxOptions};
    ///
    /// let options = OutboxOptions::from_lookup(|name| match name {
    ///     env::TABLE_NAME => Some("orders-outbox".into()),
    ///     env::BUCKET_COUNT => Some("16".into()),
    ///     _ => None,
    /// })?;
    /// assert_eq!(options, OutboxOptions::new("orders-outbox").with_bucket_count(16));
    /// # Ok::<(), dynamo_outbox::Error>(())
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let table_name = lookup(env::TABLE_NAME).ok_or_else(|| {
            Error::option(env::TABLE_NAME, "is required (the outbox table's name)")
        })?;
        let mut options = OutboxOptions::new(table_name);
        if let Some(v) = lookup(env::KEY_PREFIX) {
            options.key_prefix = v;
        }
        if let Some(v) = lookup(env::PARTITION_KEY_ATTRIBUTE) {
            options.partition_key_attribute = v;
        }
        if let Some(v) = lookup(env::SORT_KEY_ATTRIBUTE) {
            options.sort_key_attribute = v;
        }
        if let Some(v) = lookup(env::BUCKET_COUNT) {
            options.bucket_count = parse_number(env::BUCKET_COUNT, &v)?;
        }
        if let Some(v) = lookup(env::MAX_CONCURRENCY) {
            options.max_concurrency = parse_number(env::MAX_CONCURRENCY, &v)?;
        }
        if let Some(v) = lookup(env::PENDING_COUNT_LIMIT) {
            options.pending_count_limit = parse_number(env::PENDING_COUNT_LIMIT, &v)?;
        }
        if let Some(v) = lookup(env::ALLOWED_TOPICS) {
            options.allowed_topics = TopicAllowList::parse(env::ALLOWED_TOPICS, &v)?;
        }
        options.validate()?;
        Ok(options)
    }

    /// Checks every rule.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the field and the rule it broke.
    pub fn validate(&self) -> Result<()> {
        if self.table_name.len() < 3 || self.table_name.len() > 255 {
            return Err(Error::option(
                "table_name",
                "must be 3 to 255 characters long (DynamoDB's table name rule)",
            ));
        }
        if !self
            .table_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(Error::option(
                "table_name",
                "may contain only a-z, A-Z, 0-9, '_', '-' and '.'",
            ));
        }
        if self.key_prefix.is_empty() {
            return Err(Error::option("key_prefix", "must not be empty"));
        }
        if self.key_prefix.contains('#') {
            return Err(Error::option(
                "key_prefix",
                "must not contain '#' (it separates the parts of every outbox key)",
            ));
        }
        if self.key_prefix.len() > 512 {
            return Err(Error::option("key_prefix", "must be at most 512 bytes"));
        }
        for (field, name) in [
            ("partition_key_attribute", &self.partition_key_attribute),
            ("sort_key_attribute", &self.sort_key_attribute),
        ] {
            if name.is_empty() || name.len() > 255 {
                return Err(Error::option(field, "must be 1 to 255 bytes long"));
            }
            if attr::ALL.contains(&name.as_str()) {
                return Err(Error::option(
                    field,
                    format!("must not be {name:?}, an attribute name the outbox items use"),
                ));
            }
        }
        if self.partition_key_attribute == self.sort_key_attribute {
            return Err(Error::option(
                "sort_key_attribute",
                "must differ from partition_key_attribute",
            ));
        }
        if self.bucket_count < 1 {
            return Err(Error::option("bucket_count", "must be at least 1"));
        }
        if self.bucket_count > 9_999_999 {
            return Err(Error::option("bucket_count", "must be at most 9999999"));
        }
        if self.max_concurrency < 1 {
            return Err(Error::option("max_concurrency", "must be at least 1"));
        }
        if !(1..=1_000_000).contains(&self.pending_count_limit) {
            return Err(Error::option("pending_count_limit", "must be 1 to 1000000"));
        }
        Ok(())
    }
}

/// The topics an outbox may write and publish ([`OutboxOptions::allowed_topics`]), parsed
/// once from [`env::ALLOWED_TOPICS`]: exact names (`orders`) and prefix patterns
/// (`audit-*`: every topic starting with `audit-`; `*` alone: every topic).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicAllowList {
    /// `None`: every topic (the option is unset).
    entries: Option<Vec<TopicPattern>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TopicPattern {
    Exact(String),
    Prefix(String),
}

impl TopicAllowList {
    /// Every topic: the default, as when [`env::ALLOWED_TOPICS`] is unset.
    pub fn all() -> Self {
        TopicAllowList { entries: None }
    }

    /// Parses `value`, comma-separated names and `prefix*` patterns (spaces around an
    /// entry are ignored); `field` names the option in the error. An empty list or entry,
    /// a `*` anywhere but at an entry's end, or a name outside Kafka's topic rules is an
    /// [`Error::InvalidOption`].
    pub fn parse(field: &str, value: &str) -> Result<Self> {
        if value.trim().is_empty() {
            return Err(Error::option(
                field,
                "must name at least one topic or `prefix*` pattern (unset it to allow every topic)",
            ));
        }
        let mut entries = Vec::new();
        for (i, raw) in value.split(',').enumerate() {
            let entry = raw.trim();
            let bad =
                |rule: String| Error::option(field, format!("entry {} ({entry:?}) {rule}", i + 1));
            if entry.is_empty() {
                return Err(bad("is empty (a stray comma?)".into()));
            }
            let (name, prefix) = match entry.strip_suffix('*') {
                Some(p) => (p, true),
                None => (entry, false),
            };
            if name.contains('*') {
                return Err(bad(
                    "has a `*` that is not at its end: only `prefix*` patterns are supported"
                        .into(),
                ));
            }
            if prefix {
                // A prefix is the start of a topic name: Kafka's characters, any length.
                if let Some(c) = name
                    .chars()
                    .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
                {
                    return Err(bad(format!(
                        "may contain only ASCII letters, digits, '.', '_', '-' and a final '*' (found {c:?})"
                    )));
                }
                entries.push(TopicPattern::Prefix(name.to_string()));
            } else {
                crate::message::validate_topic(name)
                    .map_err(|rule| bad(format!("is not a Kafka topic name: {rule}")))?;
                entries.push(TopicPattern::Exact(name.to_string()));
            }
        }
        Ok(TopicAllowList {
            entries: Some(entries),
        })
    }

    /// Whether every topic is allowed (no list is set, or it has `*`).
    pub fn allows_every_topic(&self) -> bool {
        match &self.entries {
            None => true,
            Some(e) => e
                .iter()
                .any(|p| matches!(p, TopicPattern::Prefix(prefix) if prefix.is_empty())),
        }
    }

    /// Whether `topic` is allowed.
    pub fn allows(&self, topic: &str) -> bool {
        match &self.entries {
            None => true,
            Some(entries) => entries.iter().any(|p| match p {
                TopicPattern::Exact(name) => name == topic,
                TopicPattern::Prefix(prefix) => topic.starts_with(prefix.as_str()),
            }),
        }
    }

    /// `Ok` when `topic` is allowed, else [`Error::InvalidMessage`] for `field` (e.g.
    /// `messages[3].topic`), naming the rule.
    pub fn check(&self, field: &str, topic: &str) -> Result<()> {
        if self.allows(topic) {
            return Ok(());
        }
        Err(Error::message(field, self.refusal(topic)))
    }

    /// Why `topic` is refused: the rule, for an error or a log line.
    pub fn refusal(&self, topic: &str) -> String {
        format!(
            "topic {topic:?} is not allowed here ({}: {self})",
            env::ALLOWED_TOPICS
        )
    }
}

impl std::fmt::Display for TopicAllowList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(entries) = &self.entries else {
            return f.write_str("every topic");
        };
        for (i, p) in entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match p {
                TopicPattern::Exact(name) => f.write_str(name)?,
                TopicPattern::Prefix(prefix) => write!(f, "{prefix}*")?,
            }
        }
        Ok(())
    }
}

/// Options of a relay.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use dynamo_outbox::options::{PoisonPolicy, RelayOptions};
///
/// let options = RelayOptions::default()
///     .with_relay_id("orders-relay-1")
///     .with_batch_size(100)
///     .with_idle_stop(Duration::from_secs(60))
///     .with_poison_policy(PoisonPolicy::QuarantineAfter(5));
/// options.validate()?;
/// # Ok::<(), dynamo_outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayOptions {
    /// Buckets the relay expects (8); must equal the store's, checked at start.
    pub bucket_count: u32,
    /// Most messages fetched, published and deleted as one batch of a bucket (500).
    pub batch_size: u32,
    /// How often an idle relay probes its buckets (1 s).
    pub poll_interval: Duration,
    /// Pause after a failed round before the next one (1 s); greater than zero, so that a
    /// failing relay never retries in a tight loop against DynamoDB or the brokers.
    pub error_backoff: Duration,
    /// How long a lease and a heartbeat stay valid without renewal (30 s).
    pub lease_duration: Duration,
    /// How often leases and the heartbeat are renewed (10 s); less than the lease duration.
    pub lease_renew_interval: Duration,
    /// The relay's identity in lease and heartbeat items: unique per live process.
    pub relay_id: String,
    /// Name under which the relay's metrics tell outboxes apart (`outbox`): the
    /// OpenTelemetry attribute `outbox.name` of `metrics::otel` (feature `otel`), which
    /// `outboxctl relay` builds from it. The relay itself does not read it; the header
    /// carrying the message id is the publisher's
    /// ([`KafkaConfig::message_id_header`](crate::publish::KafkaConfig::message_id_header)).
    pub metrics_name: String,
    /// Stop a run early once every bucket it owns has been empty for this long (no
    /// message fetched, nothing notified) and live peers that announce no earlier stop than
    /// this run's hold every other bucket; `None`
    /// (the default) never stops early. The stop is graceful; the run reports
    /// [`StopReason::Idle`](crate::StopReason::Idle).
    pub idle_stop: Option<Duration>,
    /// Most message bytes (items as DynamoDB sizes them) the relay holds in its batches at
    /// once (32 MiB): each of the store's `max_concurrency` concurrent batches fetches up
    /// to its share, and at least one item. Large items then make smaller batches, so
    /// memory stays bounded whatever the item size; 1 KB messages still make full batches.
    pub max_in_flight_bytes: usize,
    /// What the relay does with an item it cannot publish (a poison item): park its
    /// bucket behind it until an operator moves it ([`PoisonPolicy::Block`], the default),
    /// or move it to the dead-letter partition itself after a number of attempts.
    pub poison_policy: PoisonPolicy,
    /// Set by the Lambda handler for a relay a woken host started alone
    /// ([`Decision::Join`](crate::notification::Decision::Join)'s `alone`), never by an
    /// embedder: when its first heartbeat lands by then, the first read waits
    /// [`ALONE_JOIN_DELAY`](crate::protocol::coordination::ALONE_JOIN_DELAY) instead of
    /// [`JOIN_DELAY`](crate::relay::JOIN_DELAY).
    pub(crate) alone_until: Option<tokio::time::Instant>,
}

/// What a relay does with a poison item: an item that cannot be read as a message, a
/// message on a topic outside the allow-list, a record the broker rejects for good. A
/// refused authorization is never one: under either policy it is retried after the error
/// backoff ([`Error::KafkaNotAuthorized`]).
///
/// `OUTBOX_POISON_POLICY` parses into it ([`FromStr`](std::str::FromStr)): `block` or
/// `quarantine-after=N`; [`Display`](std::fmt::Display) writes that form back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PoisonPolicy {
    /// The bucket stops at it (the specification's rule): nothing of the bucket is
    /// published past it until an operator moves it (`outboxctl quarantine`). It is
    /// logged, counted (`PoisonItems`) and alarmed on.
    #[default]
    Block,
    /// After this many failed attempts on the same head by the relay holding the bucket,
    /// the relay moves it to the dead-letter partition in one transaction, logs it and
    /// counts it (`QuarantinedItems`); the bucket goes on. Later messages of the same key
    /// overtake the quarantined one.
    QuarantineAfter(u32),
}

/// Most attempts [`PoisonPolicy::QuarantineAfter`] takes.
pub const MAX_QUARANTINE_ATTEMPTS: u32 = 1000;

/// Reads [`env::POISON_POLICY`]: `block` or `quarantine-after=N` (N from 1 to
/// [`MAX_QUARANTINE_ATTEMPTS`]); anything else is [`Error::InvalidOption`] naming the
/// variable and the rule.
impl std::str::FromStr for PoisonPolicy {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        let rule = || {
            Error::option(
                env::POISON_POLICY,
                format!(
                    "{value:?} is neither `block` nor `quarantine-after=N` with N a whole \
                     number from 1 to {MAX_QUARANTINE_ATTEMPTS}"
                ),
            )
        };
        let v = value.trim();
        if v.eq_ignore_ascii_case("block") {
            return Ok(PoisonPolicy::Block);
        }
        let n = v
            .strip_prefix("quarantine-after=")
            .ok_or_else(rule)?
            .trim()
            .parse::<u32>()
            .map_err(|_| rule())?;
        if !(1..=MAX_QUARANTINE_ATTEMPTS).contains(&n) {
            return Err(rule());
        }
        Ok(PoisonPolicy::QuarantineAfter(n))
    }
}

impl std::fmt::Display for PoisonPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoisonPolicy::Block => f.write_str("block"),
            PoisonPolicy::QuarantineAfter(n) => write!(f, "quarantine-after={n}"),
        }
    }
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            bucket_count: 8,
            batch_size: 500,
            poll_interval: Duration::from_secs(1),
            error_backoff: Duration::from_secs(1),
            lease_duration: Duration::from_secs(30),
            lease_renew_interval: Duration::from_secs(10),
            relay_id: default_relay_id(),
            metrics_name: "outbox".into(),
            idle_stop: None,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            poison_policy: PoisonPolicy::Block,
            alone_until: None,
        }
    }
}

/// Default of [`RelayOptions::max_in_flight_bytes`]: 32 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 32 << 20;

/// Reads [`env::IDLE_STOP`]: a duration, or `never` (or empty) for none.
pub fn parse_idle_stop(value: &str) -> Result<Option<Duration>> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    let d = parse_duration(env::IDLE_STOP, v)?;
    if d.is_zero() {
        return Err(Error::option(
            env::IDLE_STOP,
            "must be greater than zero (or `never`)",
        ));
    }
    Ok(Some(d))
}

/// Longest relay id: it is part of a sort key and of every lease item.
pub const MAX_RELAY_ID_LEN: usize = 128;

/// A relay id from the host or function name and a random suffix.
pub fn default_relay_id() -> String {
    let base = std::env::var("AWS_LAMBDA_FUNCTION_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "relay".into());
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let mut base: String = base.chars().take(MAX_RELAY_ID_LEN - 13).collect();
    base.push('-');
    base.push_str(suffix);
    base
}

impl RelayOptions {
    /// Sets the buckets the relay expects ([`Self::bucket_count`]): the store's.
    pub fn with_bucket_count(mut self, bucket_count: u32) -> Self {
        self.bucket_count = bucket_count;
        self
    }

    /// Sets the most messages of one batch ([`Self::batch_size`]).
    pub fn with_batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Sets how often an idle relay probes its buckets ([`Self::poll_interval`]).
    pub fn with_poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// Sets the pause after a failed round ([`Self::error_backoff`]).
    pub fn with_error_backoff(mut self, error_backoff: Duration) -> Self {
        self.error_backoff = error_backoff;
        self
    }

    /// Sets how long a lease stays valid ([`Self::lease_duration`]).
    pub fn with_lease_duration(mut self, lease_duration: Duration) -> Self {
        self.lease_duration = lease_duration;
        self
    }

    /// Sets how often leases are renewed ([`Self::lease_renew_interval`]).
    pub fn with_lease_renew_interval(mut self, lease_renew_interval: Duration) -> Self {
        self.lease_renew_interval = lease_renew_interval;
        self
    }

    /// Sets the relay's identity ([`Self::relay_id`]).
    pub fn with_relay_id(mut self, relay_id: impl Into<String>) -> Self {
        self.relay_id = relay_id.into();
        self
    }

    /// Sets the name the metrics tell outboxes apart by ([`Self::metrics_name`]).
    pub fn with_metrics_name(mut self, metrics_name: impl Into<String>) -> Self {
        self.metrics_name = metrics_name.into();
        self
    }

    /// Sets when an idle run stops early ([`Self::idle_stop`]): a duration, or `None` for
    /// never.
    pub fn with_idle_stop(mut self, idle_stop: impl Into<Option<Duration>>) -> Self {
        self.idle_stop = idle_stop.into();
        self
    }

    /// Sets the most message bytes held in batches at once
    /// ([`Self::max_in_flight_bytes`]).
    pub fn with_max_in_flight_bytes(mut self, max_in_flight_bytes: usize) -> Self {
        self.max_in_flight_bytes = max_in_flight_bytes;
        self
    }

    /// Sets what happens to a poison item ([`Self::poison_policy`]).
    pub fn with_poison_policy(mut self, poison_policy: PoisonPolicy) -> Self {
        self.poison_policy = poison_policy;
        self
    }

    /// Reads the options from the process environment (see [`env`](mod@env)); the bucket count
    /// comes from [`env::BUCKET_COUNT`], the store's variable, so both agree.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the variable (or the field) and the rule it broke: a
    /// number or duration that does not parse, a zero [`env::ERROR_BACKOFF`], a rule of
    /// [`validate`](Self::validate).
    ///
    /// # Examples
    /// ```no_run
    /// let options = dynamo_outbox::RelayOptions::from_env()?;
    /// # Ok::<(), dynamo_outbox::Error>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the options through `lookup` (an environment stand-in) and validates them.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use dynamo_outbox::options::{env, RelayOptions};
    ///
    /// let options = RelayOptions::from_lookup(|name| {
    ///     (name == env::POLL_INTERVAL).then(|| "250ms".to_string())
    /// })?;
    /// assert_eq!(options.poll_interval, Duration::from_millis(250));
    /// let err = RelayOptions::from_lookup(|name| {
    ///     (name == env::ERROR_BACKOFF).then(|| "0s".to_string())
    /// })
    /// .unwrap_err();
    /// assert!(err.to_string().starts_with("OUTBOX_ERROR_BACKOFF: must be greater than zero"));
    /// # Ok::<(), dynamo_outbox::Error>(())
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        Self::from_lookup_inner(lookup)
    }

    /// [`RelayOptions::from_lookup`] for the table `outbox` describes: the bucket count is
    /// the table's (`OUTBOX_BUCKET_COUNT` is read once, by the table's options), so the
    /// two cannot disagree.
    ///
    /// # Errors
    /// As [`RelayOptions::from_lookup`].
    pub fn for_table(
        outbox: &OutboxOptions,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let count = outbox.bucket_count.to_string();
        Self::from_lookup_inner(|name| {
            if name == env::BUCKET_COUNT {
                Some(count.clone())
            } else {
                lookup(name)
            }
        })
    }

    fn from_lookup_inner(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut o = RelayOptions::default();
        if let Some(v) = lookup(env::BUCKET_COUNT) {
            o.bucket_count = parse_number(env::BUCKET_COUNT, &v)?;
        }
        if let Some(v) = lookup(env::BATCH_SIZE) {
            o.batch_size = parse_number(env::BATCH_SIZE, &v)?;
        }
        if let Some(v) = lookup(env::POLL_INTERVAL) {
            o.poll_interval = parse_duration(env::POLL_INTERVAL, &v)?;
        }
        if let Some(v) = lookup(env::ERROR_BACKOFF) {
            o.error_backoff = parse_duration(env::ERROR_BACKOFF, &v)?;
            if o.error_backoff.is_zero() {
                return Err(Error::option(env::ERROR_BACKOFF, ERROR_BACKOFF_RULE));
            }
        }
        if let Some(v) = lookup(env::LEASE_DURATION) {
            o.lease_duration = parse_duration(env::LEASE_DURATION, &v)?;
        }
        if let Some(v) = lookup(env::LEASE_RENEW_INTERVAL) {
            o.lease_renew_interval = parse_duration(env::LEASE_RENEW_INTERVAL, &v)?;
        }
        if let Some(v) = lookup(env::RELAY_ID) {
            o.relay_id = v;
        }
        if let Some(v) = lookup(env::METRICS_NAME) {
            o.metrics_name = v;
        }
        if let Some(v) = lookup(env::IDLE_STOP) {
            o.idle_stop = parse_idle_stop(&v)?;
        }
        if let Some(v) = lookup(env::MAX_IN_FLIGHT_BYTES) {
            o.max_in_flight_bytes = parse_number(env::MAX_IN_FLIGHT_BYTES, &v)?;
        }
        if let Some(v) = lookup(env::POISON_POLICY) {
            o.poison_policy = v.parse()?;
        }
        o.validate()?;
        Ok(o)
    }

    /// Checks every rule.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the field and the rule it broke.
    pub fn validate(&self) -> Result<()> {
        if self.bucket_count < 1 {
            return Err(Error::option("bucket_count", "must be at least 1"));
        }
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(Error::option("batch_size", "must be 1 to 10000"));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::option("poll_interval", "must be greater than zero"));
        }
        if self.error_backoff.is_zero() {
            return Err(Error::option("error_backoff", ERROR_BACKOFF_RULE));
        }
        if self.lease_renew_interval.is_zero() {
            return Err(Error::option(
                "lease_renew_interval",
                "must be greater than zero",
            ));
        }
        if self.lease_renew_interval >= self.lease_duration {
            return Err(Error::option(
                "lease_renew_interval",
                "must be less than lease_duration",
            ));
        }
        if self.relay_id.is_empty() || self.relay_id.chars().count() > MAX_RELAY_ID_LEN {
            return Err(Error::option(
                "relay_id",
                format!("must be 1 to {MAX_RELAY_ID_LEN} characters long"),
            ));
        }
        if self.relay_id.chars().any(char::is_control) {
            return Err(Error::option(
                "relay_id",
                "must not contain control characters",
            ));
        }
        if self.max_in_flight_bytes < crate::attr::MAX_ITEM_BYTES {
            return Err(Error::option(
                "max_in_flight_bytes",
                format!(
                    "must be at least {} (one item of DynamoDB's largest size)",
                    crate::attr::MAX_ITEM_BYTES
                ),
            ));
        }
        if self.idle_stop.is_some_and(|d| d.is_zero()) {
            return Err(Error::option(
                "idle_stop",
                "must be greater than zero (leave it unset to never stop early)",
            ));
        }
        if let PoisonPolicy::QuarantineAfter(n) = self.poison_policy {
            if !(1..=MAX_QUARANTINE_ATTEMPTS).contains(&n) {
                return Err(Error::option(
                    "poison_policy",
                    format!("quarantine-after must be 1 to {MAX_QUARANTINE_ATTEMPTS} attempts"),
                ));
            }
        }
        Ok(())
    }
}

/// The rule [`RelayOptions::error_backoff`] breaks at zero.
const ERROR_BACKOFF_RULE: &str =
    "must be greater than zero (a failing relay would retry at once, in a tight loop)";

fn parse_number<T: std::str::FromStr>(field: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::option(field, format!("{value:?} is not a whole number in range")))
}

/// Parses `500ms`, `30s`, `2m`, `1h` (a bare number means seconds).
pub fn parse_duration(field: &str, value: &str) -> Result<Duration> {
    let v = value.trim();
    let split = v
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let bad = || {
        Error::option(
            field,
            format!("{value:?} is not a duration like 500ms, 30s, 2m or 1h"),
        )
    };
    let n: f64 = number.parse().map_err(|_| bad())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn defaults_match_the_spec() {
        let o = OutboxOptions::from_lookup(lookup(&[(env::TABLE_NAME, "orders-outbox")])).unwrap();
        assert_eq!(o, OutboxOptions::new("orders-outbox"));
        assert_eq!(
            (o.bucket_count, o.max_concurrency, o.pending_count_limit),
            (8, 8, 10_000)
        );
        assert_eq!(
            (
                o.partition_key_attribute.as_str(),
                o.sort_key_attribute.as_str()
            ),
            ("PK", "SK")
        );
        assert_eq!(o.key_prefix, "OUTBOX");
        let r = RelayOptions::from_lookup(lookup(&[])).unwrap();
        assert_eq!(r.batch_size, 500);
        assert_eq!(r.lease_duration, Duration::from_secs(30));
        assert_eq!(r.lease_renew_interval, Duration::from_secs(10));
        assert!(r.relay_id.len() <= MAX_RELAY_ID_LEN);
    }

    #[test]
    fn errors_name_the_field_and_rule() {
        let e = OutboxOptions::from_lookup(lookup(&[])).unwrap_err();
        assert!(
            e.to_string().starts_with("OUTBOX_TABLE_NAME: is required"),
            "{e}"
        );
        let e = OutboxOptions::from_lookup(lookup(&[
            (env::TABLE_NAME, "t-1"),
            (env::BUCKET_COUNT, "0"),
        ]))
        .unwrap_err();
        assert_eq!(e.to_string(), "bucket_count: must be at least 1");
        let e = OutboxOptions::from_lookup(lookup(&[
            (env::TABLE_NAME, "t-1"),
            (env::BUCKET_COUNT, "x"),
        ]))
        .unwrap_err();
        assert!(e.to_string().starts_with("OUTBOX_BUCKET_COUNT:"), "{e}");
        let e = OutboxOptions::from_lookup(lookup(&[
            (env::TABLE_NAME, "t-1"),
            (env::KEY_PREFIX, "A#B"),
        ]))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("key_prefix: must not contain '#'"),
            "{e}"
        );
        let e = OutboxOptions::from_lookup(lookup(&[
            (env::TABLE_NAME, "t-1"),
            (env::PARTITION_KEY_ATTRIBUTE, "Topic"),
        ]))
        .unwrap_err();
        assert!(e.to_string().starts_with("partition_key_attribute:"), "{e}");
        let e = OutboxOptions::from_lookup(lookup(&[(env::TABLE_NAME, "a b c")])).unwrap_err();
        assert!(e.to_string().starts_with("table_name:"), "{e}");
        let e = RelayOptions::from_lookup(lookup(&[
            (env::LEASE_DURATION, "10s"),
            (env::LEASE_RENEW_INTERVAL, "10s"),
        ]))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "lease_renew_interval: must be less than lease_duration"
        );
        let long = "x".repeat(129);
        let e = RelayOptions::from_lookup(lookup(&[(env::RELAY_ID, &long)])).unwrap_err();
        assert!(e.to_string().starts_with("relay_id:"), "{e}");
    }

    #[test]
    fn a_zero_error_backoff_is_refused_naming_the_field() {
        let zero = RelayOptions {
            error_backoff: Duration::ZERO,
            ..RelayOptions::default()
        };
        match zero.validate().unwrap_err() {
            Error::InvalidOption { field, rule } => {
                assert_eq!(field, "error_backoff");
                assert!(rule.starts_with("must be greater than zero"), "{rule}");
            }
            other => panic!("{other:?}"),
        }
        for value in ["0", "0s", "0ms"] {
            let e = RelayOptions::from_lookup(lookup(&[(env::ERROR_BACKOFF, value)])).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidOption { field, .. } if field == env::ERROR_BACKOFF),
                "{value}: {e:?}"
            );
            assert_eq!(
                e.to_string(),
                "OUTBOX_ERROR_BACKOFF: must be greater than zero (a failing relay would retry \
                 at once, in a tight loop)"
            );
        }
        let o = RelayOptions::from_lookup(lookup(&[(env::ERROR_BACKOFF, "250ms")])).unwrap();
        assert_eq!(o.error_backoff, Duration::from_millis(250));
    }

    #[test]
    fn the_topic_allow_list_parses_once_and_names_bad_entries() {
        // Unset: every topic, as before the option existed.
        let o = OutboxOptions::from_lookup(lookup(&[(env::TABLE_NAME, "t-1")])).unwrap();
        assert_eq!(o.allowed_topics, TopicAllowList::all());
        assert!(o.allowed_topics.allows("payments") && o.allowed_topics.allows_every_topic());

        let o = OutboxOptions::from_lookup(lookup(&[
            (env::TABLE_NAME, "t-1"),
            (env::ALLOWED_TOPICS, " orders , audit-*,billing.v1"),
        ]))
        .unwrap();
        let list = &o.allowed_topics;
        assert_eq!(list.to_string(), "orders,audit-*,billing.v1");
        assert!(!list.allows_every_topic());
        for ok in ["orders", "audit-", "audit-eu", "billing.v1"] {
            assert!(list.allows(ok), "{ok}");
        }
        for refused in [
            "payments",
            "orders2",
            "order",
            "audit",
            "billing.v12",
            "xaudit-1",
        ] {
            assert!(!list.allows(refused), "{refused}");
        }
        let e = list.check("messages[3].topic", "payments").unwrap_err();
        assert_eq!(
            e.to_string(),
            "messages[3].topic: topic \"payments\" is not allowed here (OUTBOX_ALLOWED_TOPICS: orders,audit-*,billing.v1)"
        );
        assert_eq!(e.error_type(), "ValidationError");
        assert!(TopicAllowList::parse("f", "*")
            .unwrap()
            .allows_every_topic());

        for (bad, rule) in [
            ("", "must name at least one topic"),
            ("  ", "must name at least one topic"),
            ("orders,", "entry 2 (\"\") is empty"),
            ("orders,,audit-*", "entry 2 (\"\") is empty"),
            (
                "au*dit",
                "entry 1 (\"au*dit\") has a `*` that is not at its end",
            ),
            (
                "orders,*-audit",
                "entry 2 (\"*-audit\") has a `*` that is not at its end",
            ),
            (
                "orders,a**",
                "entry 2 (\"a**\") has a `*` that is not at its end",
            ),
            ("or ders", "entry 1 (\"or ders\") is not a Kafka topic name"),
            ("a/b*", "entry 1 (\"a/b*\") may contain only"),
        ] {
            let e = OutboxOptions::from_lookup(lookup(&[
                (env::TABLE_NAME, "t-1"),
                (env::ALLOWED_TOPICS, bad),
            ]))
            .unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("OUTBOX_ALLOWED_TOPICS: {rule}")),
                "{bad:?}: {text}"
            );
            assert_eq!(e.error_type(), "Misconfiguration", "{bad:?}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(
            parse_duration("f", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("f", "30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("f", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(
            parse_duration("f", "1h").unwrap(),
            Duration::from_secs(3600)
        );
        assert_eq!(parse_duration("f", "7").unwrap(), Duration::from_secs(7));
        for bad in ["", "s", "-1s", "1d", "1e400s", "NaNs"] {
            assert!(parse_duration("f", bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod poison_policy_tests {
    use super::*;

    #[test]
    fn the_poison_policy_is_block_or_quarantine_after_a_bounded_count() {
        assert_eq!(RelayOptions::default().poison_policy, PoisonPolicy::Block);
        let read = |v: &str| {
            RelayOptions::from_lookup(|name| (name == env::POISON_POLICY).then(|| v.to_string()))
                .map(|o| o.poison_policy)
        };
        assert_eq!(read("block").unwrap(), PoisonPolicy::Block);
        assert_eq!(
            read(" quarantine-after=3 ").unwrap(),
            PoisonPolicy::QuarantineAfter(3)
        );
        assert_eq!(
            read("quarantine-after=1000").unwrap(),
            PoisonPolicy::QuarantineAfter(1000)
        );
        for bad in [
            "",
            "skip",
            "quarantine-after",
            "quarantine-after=",
            "quarantine-after=0",
            "quarantine-after=1001",
            "quarantine-after=-1",
            "quarantine-after=two",
        ] {
            let e = read(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("OUTBOX_POISON_POLICY: ")
                    && e.contains("`block` nor `quarantine-after=N`")
                    && e.contains("from 1 to 1000"),
                "{bad:?}: {e}"
            );
        }
        assert_eq!(
            PoisonPolicy::QuarantineAfter(3).to_string(),
            "quarantine-after=3"
        );
        let zero = RelayOptions {
            poison_policy: PoisonPolicy::QuarantineAfter(0),
            ..RelayOptions::default()
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("poison_policy"));
    }
}
