//! Reading a bucket: the idle probe, the ordered fetch, and the gap probes.
//!
//! DynamoDB queries are only read-committed against `TransactWriteItems`: a fetch that
//! runs while a transaction commits can return a later message without an earlier one.
//! So after each fetch the holes in the sequence numbers are probed (at most
//! [`MAX_GAP_PROBES`] per fetch), and the bucket is fetched again when one was filled.

use aws_sdk_dynamodb::types::{AttributeValue, Select};
use tracing::{debug, instrument};

use super::DynamoDbOutboxStore;
use crate::error::{from_sdk, Error, Result};
use crate::message::StoredMessage;
use crate::protocol::schema::{self, Item};

/// Most gap probes per fetch.
pub const MAX_GAP_PROBES: usize = 8;
/// Most fetches of one batch when gaps keep filling.
pub const MAX_REFETCHES: u32 = 3;

/// A range of missing sequence numbers, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// First missing number.
    pub from: u64,
    /// Last missing number.
    pub to: u64,
}

/// The gaps before and between `sequences` (ascending), starting after `last_removed`,
/// or at 1 (the start of the bucket) when nothing was removed since a start or handover.
pub(crate) fn gaps(last_removed: Option<u64>, sequences: &[u64]) -> Vec<Gap> {
    let mut out = Vec::new();
    let mut expected = last_removed.map_or(1, |r| r + 1);
    for &s in sequences {
        if s > expected {
            out.push(Gap {
                from: expected,
                to: s - 1,
            });
        }
        expected = expected.max(s + 1);
    }
    out
}

/// A fetched batch, ready to publish.
#[derive(Debug, Default)]
pub struct Fetched {
    /// The messages, ascending, with no unprobed or filled gap between them.
    pub messages: Vec<StoredMessage>,
    /// Gap probes sent.
    pub gap_probes: u32,
    /// Fetches sent (1 plus refetches after a filled gap).
    pub fetches: u32,
    /// Size of the items the last fetch read ([`schema::item_size`]), before any cut.
    pub bytes: usize,
}

// The protocol's steps, for the relay and for tools and tests that drive them: hidden
// from the docs of the type an embedder passes to `Relay::new`.
#[doc(hidden)]
impl DynamoDbOutboxStore {
    /// Whether the bucket has a message: one eventually consistent, one-item query. A stale
    /// answer only delays a message by one poll; the fetch itself is strongly consistent.
    #[instrument(skip(self), level = "debug")]
    pub async fn probe(&self, bucket: u32) -> Result<bool> {
        let out = self
            .query_partition(self.keys.message_pk(bucket))
            .projection_expression("#pk")
            .limit(1)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        Ok(out.count() > 0)
    }

    /// Whether the bucket has a message, by one strongly consistent one-item query: what a
    /// relay checks before it stops for idleness, so that a commit acknowledged before the
    /// check is seen.
    #[instrument(skip(self), level = "debug")]
    pub async fn probe_consistent(&self, bucket: u32) -> Result<bool> {
        let out = self
            .query_partition(self.keys.message_pk(bucket))
            .projection_expression("#pk")
            .consistent_read(true)
            .limit(1)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        Ok(out.count() > 0)
    }

    /// Up to `limit` message items of a bucket, ascending, strongly consistent, following
    /// pages past DynamoDB's 1 MB.
    pub async fn fetch_items(&self, bucket: u32, limit: u32) -> Result<Vec<Item>> {
        self.fetch_items_bounded(bucket, limit, usize::MAX).await
    }

    /// Like [`Self::fetch_items`], also stopping at the page that brings the items' size
    /// ([`schema::item_size`]) to `max_bytes` (so at most one page, 1 MB, beyond it).
    pub async fn fetch_items_bounded(
        &self,
        bucket: u32,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<Item>> {
        let mut items: Vec<Item> = Vec::new();
        let mut bytes = 0usize;
        let mut start = None;
        while (items.len() as u32) < limit && bytes < max_bytes {
            let out = self
                .query_partition(self.keys.message_pk(bucket))
                .consistent_read(true)
                .scan_index_forward(true)
                .limit((limit - items.len() as u32) as i32)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| from_sdk("Query", e))?;
            for item in out.items.unwrap_or_default() {
                // Always the first item, however large; the rest while under the budget.
                if !items.is_empty() && bytes >= max_bytes {
                    return Ok(items);
                }
                bytes = bytes.saturating_add(schema::item_size(&item));
                items.push(item);
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        Ok(items)
    }

    /// Whether any message exists in `gap`: one strongly consistent `COUNT` query, limit 1.
    pub async fn probe_gap(&self, bucket: u32, gap: Gap) -> Result<bool> {
        let out = self
            .query_partition(self.keys.message_pk(bucket))
            .key_condition_expression("#pk = :pk AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#sk", &self.keys.sk)
            .expression_attribute_values(":from", AttributeValue::S(schema::message_sk(gap.from)))
            .expression_attribute_values(":to", AttributeValue::S(schema::message_sk(gap.to)))
            .consistent_read(true)
            .select(Select::Count)
            .limit(1)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        Ok(out.count() > 0)
    }

    /// Fetches the next batch of a bucket in order and probes its gaps.
    ///
    /// Fails with [`Error::Misconfiguration`] when an item is stamped with another bucket
    /// count, and with [`Error::Corrupt`] when the head item cannot be read; an unreadable
    /// item further back ends the batch before it.
    #[instrument(skip(self), level = "debug")]
    pub async fn fetch(
        &self,
        bucket: u32,
        last_removed: Option<u64>,
        limit: u32,
    ) -> Result<Fetched> {
        self.fetch_bounded(bucket, last_removed, limit, usize::MAX)
            .await
    }

    /// [`Self::fetch`] of at most `max_bytes` of items (and at least one item).
    #[instrument(skip(self), level = "debug")]
    pub async fn fetch_bounded(
        &self,
        bucket: u32,
        last_removed: Option<u64>,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Fetched> {
        let mut fetched = Fetched::default();
        loop {
            fetched.fetches += 1;
            let items = self.fetch_items_bounded(bucket, limit, max_bytes).await?;
            fetched.bytes = items.iter().map(schema::item_size).sum();
            let mut messages = Vec::with_capacity(items.len());
            for item in &items {
                if let Some(count) = schema::get_n::<u32>(item, crate::attr::BUCKET_COUNT) {
                    if count != self.options.bucket_count {
                        let (pk, sk) = self.keys.key_of(item);
                        return Err(Error::misconfigured(format!(
                            "message {pk}/{sk} is stamped with bucket count {count}, but this relay's is {}: \
                             every writer and relay of a table must use the same count (drain the table before changing it)",
                            self.options.bucket_count
                        )));
                    }
                }
            }
            for item in &items {
                match schema::parse_message(&self.keys, item) {
                    Ok(m) => messages.push(m),
                    Err(e) if messages.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            let sequences: Vec<u64> = messages.iter().map(|m| m.sequence).collect();
            let found = gaps(last_removed, &sequences);
            let mut keep = messages.len();
            let mut filled = false;
            for (i, gap) in found.iter().enumerate() {
                if i == MAX_GAP_PROBES {
                    // Never publish past a gap nobody looked into.
                    keep = messages
                        .iter()
                        .position(|m| m.sequence > gap.to)
                        .unwrap_or(keep);
                    break;
                }
                fetched.gap_probes += 1;
                if self.probe_gap(bucket, *gap).await? {
                    debug!(
                        bucket,
                        from = gap.from,
                        to = gap.to,
                        "gap filled while fetching"
                    );
                    filled = true;
                    keep = messages
                        .iter()
                        .position(|m| m.sequence > gap.to)
                        .unwrap_or(keep);
                    break;
                }
            }
            messages.truncate(keep);
            if !filled || fetched.fetches > MAX_REFETCHES {
                fetched.messages = messages;
                return Ok(fetched);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_ranges() {
        assert_eq!(gaps(None, &[]), vec![]);
        assert_eq!(gaps(None, &[1, 2, 3]), vec![]);
        assert_eq!(gaps(None, &[3, 4]), vec![Gap { from: 1, to: 2 }]);
        assert_eq!(gaps(Some(2), &[3, 4]), vec![]);
        assert_eq!(
            gaps(Some(2), &[5, 6, 9]),
            vec![Gap { from: 3, to: 4 }, Gap { from: 7, to: 8 }]
        );
        // numbers at or below the last removed one are not gaps
        assert_eq!(gaps(Some(10), &[4, 11]), vec![]);
    }
}
