//! The reads only `outboxctl status` makes ([`crate::status::read_status`]): the relay
//! never calls them (the template grants the relay no `GetItem`; see
//! functions/relay/tests/template.rs).

use super::DynamoDbOutboxStore;
use crate::attr;
use crate::error::{from_sdk, Result};
use crate::protocol::schema::{self, Item};

// The protocol's steps, for the relay and for tools and tests that drive them: hidden
// from the docs of the type an embedder passes to `Relay::new`.
#[doc(hidden)]
impl DynamoDbOutboxStore {
    /// The newest message item of a bucket: one strongly consistent query, descending,
    /// limit 1.
    pub async fn last_message(&self, bucket: u32) -> Result<Option<Item>> {
        let out = self
            .query_partition(self.keys.message_pk(bucket))
            .consistent_read(true)
            .scan_index_forward(false)
            .limit(1)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        Ok(out.items.unwrap_or_default().into_iter().next())
    }

    /// Counts the items of the dead-letter partition up to the pending count limit; the
    /// flag says whether the count stopped at the limit.
    pub async fn count_dead_letters(&self) -> Result<(u32, bool)> {
        let limit = self.options.pending_count_limit;
        let count = self
            .count_partition(self.keys.dead_letter_pk(), limit)
            .await?;
        Ok((count.min(limit), count >= limit))
    }

    /// A bucket's sequence counter (the last number handed out): one strongly consistent
    /// `GetItem`; `None` when the counter item does not exist.
    pub async fn sequence_counter(&self, bucket: u32) -> Result<Option<u64>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.sequence_pk(bucket), schema::SEQUENCE_SK.into()),
            ))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| from_sdk("GetItem", e))?;
        Ok(out
            .item
            .as_ref()
            .and_then(|i| schema::get_n(i, attr::SEQUENCE)))
    }
}
