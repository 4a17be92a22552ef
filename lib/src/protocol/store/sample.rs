//! Backlog reads for metrics and `outboxctl status`: a count capped at the pending count
//! limit (DynamoDB bills a count as a read of every counted item) and the head's age.

use super::DynamoDbOutboxStore;
use crate::attr;
use crate::error::{from_sdk, Result};
use crate::protocol::schema::{self};

/// The backlog of one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketBacklog {
    /// The bucket.
    pub bucket: u32,
    /// Pending messages, counted up to the pending count limit.
    pub pending: u32,
    /// Whether the count stopped at the limit (the real backlog may be larger).
    pub capped: bool,
    /// Enqueue time (UTC ticks) of the head message, the one a stalled bucket is stuck on.
    pub oldest_created_at: Option<i64>,
    /// Sequence number of the head message.
    pub head_sequence: Option<u64>,
    /// `BucketCount` stamped on the head message (`None` when there is no head or it is
    /// not stamped).
    pub head_bucket_count: Option<u32>,
    /// Whether the head item cannot be read as a message (a poison item that blocks the
    /// bucket until it is quarantined).
    pub head_unreadable: bool,
    /// Why the head item cannot be read as a message (`None` when it can, or there is
    /// none).
    pub head_unreadable_reason: Option<String>,
    /// `Topic` of the head item, when it has one as a string (read even when the rest of
    /// the item cannot be read).
    pub head_topic: Option<String>,
}

// A bucket's backlog, as `outboxctl status` and `outboxctl drain` show it.
impl DynamoDbOutboxStore {
    /// Counts a bucket's messages up to the pending count limit and reads its head (what
    /// `outboxctl status` and `drain` show per bucket).
    ///
    /// # Errors
    /// [`crate::Error::DynamoDb`] when the queries fail.
    pub async fn backlog(&self, bucket: u32) -> Result<BucketBacklog> {
        let limit = self.options.pending_count_limit;
        let pending = self
            .count_partition(self.keys.message_pk(bucket), limit)
            .await?;
        let head = self
            .query_partition(self.keys.message_pk(bucket))
            .consistent_read(true)
            .limit(1)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        let head = head.items().first();
        let unreadable = head.and_then(|i| schema::parse_message(&self.keys, i).err());
        Ok(BucketBacklog {
            bucket,
            pending: pending.min(limit),
            capped: pending >= limit,
            oldest_created_at: head.and_then(|i| schema::get_n(i, attr::CREATED_AT)),
            head_sequence: head.and_then(|i| schema::parse_message_sk(self.keys.key_of(i).1)),
            head_bucket_count: head.and_then(|i| schema::get_n(i, attr::BUCKET_COUNT)),
            head_unreadable: unreadable.is_some(),
            head_unreadable_reason: unreadable.map(|e| crate::error::unreadable_because(&e)),
            head_topic: head.and_then(|i| schema::get_s(i, attr::TOPIC).map(str::to_string)),
        })
    }
}
