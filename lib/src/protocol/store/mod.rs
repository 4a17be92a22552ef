//! The store: every DynamoDB request a relay makes, one file per concern.
//!
//! The files are private; their requests are methods of [`DynamoDbOutboxStore`] and the
//! types those take and return are re-exported here.
//!
//! - `leases`: heartbeats, the coordination read, renew / release / claim.
//! - `fetch`: the idle probe, the ordered fetch, gap probes ([`MAX_GAP_PROBES`],
//!   [`MAX_REFETCHES`]).
//! - `delete`: deleting published messages in chunks of 25.
//! - `quarantine`: moving a poison item to the dead-letter partition.
//! - `sample`: backlog metrics reads (pending count, oldest pending age).
//! - `status`: the reads of `outboxctl status` (last message, sequence counter,
//!   dead letters).

pub(crate) mod delete;
pub(crate) mod fetch;
pub(crate) mod inspect;
pub(crate) mod leases;
pub(crate) mod quarantine;
pub(crate) mod sample;

pub use fetch::{Fetched, Gap, MAX_GAP_PROBES, MAX_REFETCHES};
pub use leases::Coverage;
pub use quarantine::{LeaseFence, ORIGINAL_PK, ORIGINAL_SK};
pub use sample::BucketBacklog;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, Select};
use aws_sdk_dynamodb::Client;

use crate::error::{from_sdk, Result};
use crate::options::OutboxOptions;
use crate::protocol::clock::{Clock, SystemClock};
use crate::protocol::schema::Keys;

/// Kinds of conditional write a relay makes; a refusal of any of them is counted by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum WriteKind {
    /// The heartbeat (and the stop stamp), refused when the record has a later timestamp.
    Heartbeat,
    /// A renewal of a held lease, refused when the lease moved on.
    Renew,
    /// A release of a held lease.
    Release,
    /// A claim of a free lease, refused when a peer claimed it first.
    Claim,
    /// The cleanup of a stopped or dead relay's heartbeat record.
    Cleanup,
    /// An exactly-once delete of a published message, refused when its key holds
    /// another message.
    Delete,
}

impl WriteKind {
    /// Every kind, in a fixed order.
    pub const ALL: [WriteKind; 6] = [
        WriteKind::Heartbeat,
        WriteKind::Renew,
        WriteKind::Release,
        WriteKind::Claim,
        WriteKind::Cleanup,
        WriteKind::Delete,
    ];

    /// Lowercase name, as used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Heartbeat => "heartbeat",
            WriteKind::Renew => "renew",
            WriteKind::Release => "release",
            WriteKind::Claim => "claim",
            WriteKind::Cleanup => "cleanup",
            WriteKind::Delete => "delete",
        }
    }

    /// The most likely cause of a refusal of this kind (the spec's telemetry paragraph).
    pub fn likely_cause(self) -> &'static str {
        match self {
            WriteKind::Heartbeat => {
                "the record carries a later timestamp: a clock set back, two processes sharing a relay id, or a request this relay abandoned"
            }
            WriteKind::Renew | WriteKind::Release => {
                "the lease moved on: a stall past the lease duration, clock skew beyond the bound, or relays in several regions"
            }
            WriteKind::Claim => "a peer claimed the bucket first: membership was changing while both planned",
            WriteKind::Cleanup => "another relay cleaned the record up, or the relay came back",
            WriteKind::Delete => {
                "a writer put a new message under a published one's key: its sequence counter was reset, or the table re-created or restored under its old name"
            }
        }
    }
}

/// Refused conditional writes by kind.
#[derive(Debug, Default)]
pub struct RefusedWrites {
    counts: [AtomicU64; WriteKind::ALL.len()],
}

impl RefusedWrites {
    pub(crate) fn add(&self, kind: WriteKind) {
        self.counts[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals of one kind so far.
    pub fn get(&self, kind: WriteKind) -> u64 {
        self.counts[kind as usize].load(Ordering::Relaxed)
    }

    /// All refusals so far.
    pub fn total(&self) -> u64 {
        WriteKind::ALL.iter().map(|k| self.get(*k)).sum()
    }
}

/// Access to the outbox table for relays and operators.
#[derive(Debug, Clone)]
pub struct DynamoDbOutboxStore {
    pub(crate) client: Client,
    pub(crate) options: OutboxOptions,
    pub(crate) keys: Keys,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) refused: Arc<RefusedWrites>,
    /// Whether heartbeats say `Delivery = exactly-once` (a relay over an exactly-once
    /// publisher sets it).
    pub(crate) exactly_once: bool,
}

impl DynamoDbOutboxStore {
    /// A store for the outbox `options` describe; the options are validated here.
    ///
    /// # Errors
    /// [`Error::InvalidOption`](crate::Error::InvalidOption) when `options` break a rule
    /// ([`OutboxOptions::validate`]).
    ///
    /// # Examples
    /// ```no_run
    /// use dynamo_outbox::{DynamoDbOutboxStore, OutboxOptions};
    ///
    /// # async fn example() -> dynamo_outbox::Result<()> {
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let client = dynamo_outbox::client::dynamodb_client(&sdk);
    /// let store = DynamoDbOutboxStore::new(client, OutboxOptions::new("orders-outbox"))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(client: Client, options: OutboxOptions) -> Result<Self> {
        options.validate()?;
        Ok(DynamoDbOutboxStore {
            client,
            keys: Keys::new(&options),
            options,
            clock: Arc::new(SystemClock),
            refused: Arc::new(RefusedWrites::default()),
            exactly_once: false,
        })
    }

    /// Replaces the clock (tests of skew; the default is the system clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The options of this store.
    pub fn options(&self) -> &OutboxOptions {
        &self.options
    }

    /// The key formats of this store.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The table's ARN (one `DescribeTable`): what names an exactly-once relay's Kafka
    /// transactional ids and watermarks (`docs/protocol.md`, section 8.1).
    ///
    /// # Errors
    /// [`crate::Error::DynamoDb`] when the table cannot be described, or
    /// [`crate::Error::Misconfiguration`] when DynamoDB gives no ARN.
    pub async fn table_arn(&self) -> Result<String> {
        let out = self
            .client
            .describe_table()
            .table_name(&self.options.table_name)
            .send()
            .await
            .map_err(|e| from_sdk("DescribeTable", e))?;
        out.table.and_then(|t| t.table_arn).ok_or_else(|| {
            crate::Error::misconfigured(format!(
                "DescribeTable of {} gave no table ARN",
                self.options.table_name
            ))
        })
    }

    /// The DynamoDB client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The clock leases are compared with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A query of one partition of the outbox (`#pk = :pk`); callers add the rest.
    pub(crate) fn query_partition(&self, pk: String) -> QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.options.table_name)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", &self.keys.pk)
            .expression_attribute_values(":pk", AttributeValue::S(pk))
    }

    /// Counts the items of a partition up to `limit` (eventually consistent `COUNT`
    /// queries, following pages): DynamoDB bills a count as a read of every counted item,
    /// so it stops at the limit.
    pub(crate) async fn count_partition(&self, pk: String, limit: u32) -> Result<u32> {
        let mut count: u32 = 0;
        let mut start = None;
        while count < limit {
            let out = self
                .query_partition(pk.clone())
                .select(Select::Count)
                .limit(i32::try_from(limit - count).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| from_sdk("Query", e))?;
            count = count.saturating_add(u32::try_from(out.count()).unwrap_or(0));
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        Ok(count)
    }

    /// Refused conditional writes of this store so far, by kind.
    pub fn refused_writes(&self) -> &Arc<RefusedWrites> {
        &self.refused
    }
}
