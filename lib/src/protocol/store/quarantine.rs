//! Dead letters: moving an item that blocks its bucket (a poison item) out of the way.
//!
//! A bucket parks at a poison item: an item that cannot be read as a message, a record
//! the broker rejects for good, or a message on a topic outside the relay's allow-list
//! ([`OutboxOptions::allowed_topics`](crate::OutboxOptions::allowed_topics): one written
//! straight into the table, past every writer's check). The relay publishes nothing of
//! the bucket past it, logs it and counts it (`PoisonItems`) until it is moved here
//! (`outboxctl quarantine`); it is never skipped or dropped.
//!
//! The item moves whole, in one transaction, to the partition `{prefix}#DEADLETTER` with
//! sort key `{bucket, 10 digits}#{sequence, 19 digits}`; its original key is kept in the
//! attributes `OriginalPK` / `OriginalSK`. Relays never read that partition.

use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, TransactWriteItem};

use super::DynamoDbOutboxStore;
use crate::error::{from_sdk, Error, Result};
use crate::schema::{self, Item};
use crate::writer::transaction_error;

/// Attribute holding a dead letter's original partition key.
pub const ORIGINAL_PK: &str = "OriginalPK";
/// Attribute holding a dead letter's original sort key.
pub const ORIGINAL_SK: &str = "OriginalSK";

impl DynamoDbOutboxStore {
    /// Moves the message item at `bucket` / `sequence` to the dead-letter partition.
    /// Fails with [`Error::InvalidMessage`] when there is no such item.
    pub async fn quarantine(&self, bucket: u32, sequence: u64) -> Result<Item> {
        let key = self
            .keys
            .key(self.keys.message_pk(bucket), schema::message_sk(sequence));
        let item = self
            .client
            .get_item()
            .table_name(&self.options.table_name)
            .set_key(Some(key.clone()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| from_sdk("GetItem", e))?
            .item
            .ok_or_else(|| {
                Error::message(
                    "bucket/sequence",
                    format!("no message item at bucket {bucket}, sequence {sequence}"),
                )
            })?;
        let mut dead = item.clone();
        dead.insert(
            ORIGINAL_PK.into(),
            AttributeValue::S(self.keys.message_pk(bucket)),
        );
        dead.insert(
            ORIGINAL_SK.into(),
            AttributeValue::S(schema::message_sk(sequence)),
        );
        dead.insert(
            self.keys.pk.clone(),
            AttributeValue::S(self.keys.dead_letter_pk()),
        );
        dead.insert(
            self.keys.sk.clone(),
            AttributeValue::S(schema::dead_letter_sk(bucket, sequence)),
        );
        let build = |e: aws_sdk_dynamodb::error::BuildError| Error::Misconfiguration(e.to_string());
        let put = Put::builder()
            .table_name(&self.options.table_name)
            .set_item(Some(dead.clone()))
            .build()
            .map_err(build)?;
        let delete = Delete::builder()
            .table_name(&self.options.table_name)
            .set_key(Some(key))
            .condition_expression("attribute_exists(#sk)")
            .expression_attribute_names("#sk", &self.keys.sk)
            .build()
            .map_err(build)?;
        self.client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .transact_items(TransactWriteItem::builder().delete(delete).build())
            .send()
            .await
            .map_err(transaction_error)?;
        Ok(dead)
    }

    /// Every dead letter (strongly consistent, all pages).
    pub async fn dead_letters(&self) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .query_partition(self.keys.dead_letter_pk())
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| from_sdk("Query", e))?;
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(items),
            }
        }
    }
}
