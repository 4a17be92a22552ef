//! Dead letters: moving an item that blocks its bucket (a poison item) out of the way.
//!
//! A bucket parks at a poison item: an item that cannot be read as a message, a record
//! the broker rejects for good, or a message on a topic outside the relay's allow-list
//! ([`OutboxOptions::allowed_topics`](crate::OutboxOptions::allowed_topics): one written
//! straight into the table, past every writer's check). The relay publishes nothing of
//! the bucket past it, logs it and counts it (`PoisonItems`) until it is moved here
//! (`outboxctl quarantine`, or the relay itself under
//! [`PoisonPolicy::QuarantineAfter`](crate::options::PoisonPolicy::QuarantineAfter), and
//! under every policy at once for a record the broker refuses for a partition its topic
//! does not have or for its size); it is never skipped or dropped.
//!
//! The item moves whole, in one transaction, to the partition `{prefix}#DEADLETTER` with
//! sort key `{bucket, 10 digits}#{sequence, 19 digits}`; its original key is kept in the
//! attributes `OriginalPK` / `OriginalSK`, when and why in `QuarantinedAtUtc` /
//! `QuarantineReason`. Relays never read that partition; [`crate::dead_letters`] lists,
//! redrives and purges what is there.

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem};

use super::DynamoDbOutboxStore;
use crate::attr;
use crate::error::{from_sdk, transaction_error, Error, Result};
use crate::protocol::schema::{self, Item};

/// Attribute holding a dead letter's original partition key.
pub const ORIGINAL_PK: &str = "OriginalPK";
/// Attribute holding a dead letter's original sort key.
pub const ORIGINAL_SK: &str = "OriginalSK";

/// The lease a relay holds on the bucket it quarantines in: the move is conditioned on the
/// lease item still naming the relay with this exact expiry, and that expiry being later
/// than `now` (a ConditionCheck in the same transaction). A relay that lost the bucket
/// moves nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFence {
    /// The relay that must own the bucket (`Owner`).
    pub relay_id: String,
    /// The lease's expiry as the relay last wrote or read it (`ExpiresAtUtc`, ticks): the
    /// lease's version.
    pub expires_at: i64,
    /// The relay's clock when it sends the move (ticks): the lease must not have lapsed.
    pub now: i64,
}

impl DynamoDbOutboxStore {
    /// Moves the message item at `bucket` / `sequence` to the dead-letter partition, with
    /// the reason read from the item itself (it cannot be read as a message, its topic is
    /// outside the allow-list) or, for a readable item, `moved by an operator`.
    /// Fails with [`Error::InvalidMessage`] when there is no such item.
    pub async fn quarantine(&self, bucket: u32, sequence: u64) -> Result<Item> {
        let item = self.message_item_at(bucket, sequence).await?;
        let reason = match schema::parse_message(&self.keys, &item) {
            Err(e) => format!("cannot be read as a message: {}", crate::error::chain(&e)),
            Ok(m) if !self.options.allowed_topics.allows(&m.message.topic) => {
                self.options.allowed_topics.refusal(&m.message.topic)
            }
            Ok(_) => "moved by an operator".to_string(),
        };
        self.move_to_dead_letters(bucket, sequence, item, &reason, None)
            .await
    }

    /// Moves the message item at `bucket` / `sequence` to the dead-letter partition,
    /// recording `reason` in `QuarantineReason`. Fails with [`Error::InvalidMessage`] when
    /// there is no such item.
    pub async fn quarantine_because(
        &self,
        bucket: u32,
        sequence: u64,
        reason: &str,
    ) -> Result<Item> {
        let item = self.message_item_at(bucket, sequence).await?;
        self.move_to_dead_letters(bucket, sequence, item, reason, None)
            .await
    }

    /// [`Self::quarantine_because`] by the relay holding the bucket (the poison policy):
    /// the move happens only while the bucket's lease is `fence`'s. Fails with
    /// [`Error::ConditionFailed`] (operation `quarantine`) when the lease moved on:
    /// nothing moves.
    pub async fn quarantine_fenced(
        &self,
        bucket: u32,
        sequence: u64,
        reason: &str,
        fence: &LeaseFence,
    ) -> Result<Item> {
        let item = self.message_item_at(bucket, sequence).await?;
        self.move_to_dead_letters(bucket, sequence, item, reason, Some(fence))
            .await
    }

    /// The item at `bucket` / `sequence`: one strongly consistent `Query` of the key (the
    /// relay, which quarantines under `OUTBOX_POISON_POLICY`, is granted no `GetItem`).
    async fn message_item_at(&self, bucket: u32, sequence: u64) -> Result<Item> {
        let out = self
            .query_partition(self.keys.message_pk(bucket))
            .key_condition_expression("#pk = :pk AND #sk = :sk")
            .expression_attribute_names("#sk", &self.keys.sk)
            .expression_attribute_values(":sk", AttributeValue::S(schema::message_sk(sequence)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        out.items
            .unwrap_or_default()
            .into_iter()
            .next()
            .ok_or_else(|| {
                Error::message(
                    "bucket/sequence",
                    format!("no message item at bucket {bucket}, sequence {sequence}"),
                )
            })
    }

    /// One transaction: put the copy (with its original key, when and why) into the
    /// dead-letter partition under `attribute_not_exists`, delete the original under
    /// `attribute_exists`, and with a `fence`, check the bucket's lease item. A dead letter
    /// already at that place fails it with [`Error::Misconfiguration`], a lease that moved
    /// on with [`Error::ConditionFailed`]: nothing moves.
    async fn move_to_dead_letters(
        &self,
        bucket: u32,
        sequence: u64,
        item: Item,
        reason: &str,
        fence: Option<&LeaseFence>,
    ) -> Result<Item> {
        let key = self
            .keys
            .key(self.keys.message_pk(bucket), schema::message_sk(sequence));
        let mut dead = item;
        dead.insert(
            ORIGINAL_PK.into(),
            AttributeValue::S(self.keys.message_pk(bucket)),
        );
        dead.insert(
            ORIGINAL_SK.into(),
            AttributeValue::S(schema::message_sk(sequence)),
        );
        dead.insert(
            attr::QUARANTINED_AT.into(),
            schema::n(self.clock.now_ticks()),
        );
        dead.insert(attr::QUARANTINE_REASON.into(), schema::s(reason));
        dead.insert(
            self.keys.pk.clone(),
            AttributeValue::S(self.keys.dead_letter_pk()),
        );
        dead.insert(
            self.keys.sk.clone(),
            AttributeValue::S(schema::dead_letter_sk(bucket, sequence)),
        );
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::misconfigured_by("the dead letter's request could not be built", e)
        };
        // Never over an earlier dead letter of the same place (a reset sequence counter
        // hands a number out again): that one would be lost.
        let put = Put::builder()
            .table_name(&self.options.table_name)
            .set_item(Some(dead.clone()))
            .condition_expression("attribute_not_exists(#sk)")
            .expression_attribute_names("#sk", &self.keys.sk)
            .build()
            .map_err(build)?;
        let delete = Delete::builder()
            .table_name(&self.options.table_name)
            .set_key(Some(key))
            .condition_expression("attribute_exists(#sk)")
            .expression_attribute_names("#sk", &self.keys.sk)
            .build()
            .map_err(build)?;
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .transact_items(TransactWriteItem::builder().delete(delete).build());
        if let Some(fence) = fence {
            // The lease as the relay holds it (docs/protocol.md, 4.5: the owner, the exact
            // expiry the relay wrote or read, not lapsed): whenever the relay owns the
            // bucket this holds, so a healthy fleet never has it refused.
            let check = ConditionCheck::builder()
                .table_name(&self.options.table_name)
                .set_key(Some(
                    self.keys
                        .key(self.keys.coordination_pk(), schema::lease_sk(bucket)),
                ))
                .condition_expression("#owner = :me AND #exp = :exp AND #exp > :now")
                .expression_attribute_names("#owner", attr::OWNER)
                .expression_attribute_names("#exp", attr::EXPIRES_AT)
                .expression_attribute_values(":me", AttributeValue::S(fence.relay_id.clone()))
                .expression_attribute_values(":exp", schema::n(fence.expires_at))
                .expression_attribute_values(":now", schema::n(fence.now))
                .build()
                .map_err(build)?;
            request =
                request.transact_items(TransactWriteItem::builder().condition_check(check).build());
        }
        request
            .send()
            .await
            .map_err(transaction_error)
            .map_err(|e| match e {
                Error::TransactionCanceled {
                    ref reasons,
                    ref request_id,
                    ..
                } if reasons
                    .get(2)
                    .is_some_and(|r| r == "ConditionalCheckFailed") =>
                {
                    Error::ConditionFailed {
                        operation: "quarantine",
                        request_id: request_id.clone(),
                        source: Box::new(e),
                    }
                }
                Error::TransactionCanceled { ref reasons, .. }
                    if reasons
                        .first()
                        .is_some_and(|r| r == "ConditionalCheckFailed") =>
                {
                    Error::misconfigured(format!(
                        "a dead letter from bucket {bucket}, sequence {sequence} exists \
                         already: the bucket's sequence counter was reset and handed the \
                         number out again; redrive or purge that one first (`outboxctl \
                         dead-letters show {bucket} {sequence}`); nothing was moved"
                    ))
                }
                other => other,
            })?;
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
