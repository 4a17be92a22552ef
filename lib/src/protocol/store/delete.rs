//! Deleting published messages in ascending chunks of 25, failed deletes retried with
//! bounded backoff: by key with `BatchWriteItem`, or (exactly-once delivery) each
//! conditional on its message id with PartiQL's `BatchExecuteStatement`. What cannot be
//! deleted stays and is published again: a duplicate, never a loss.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeValue, BatchStatementErrorCodeEnum, BatchStatementRequest, DeleteRequest, WriteRequest,
};
use tokio::time::Instant;
use tracing::warn;
use uuid::Uuid;

use super::{DynamoDbOutboxStore, WriteKind};
use crate::attr;
use crate::error::{from_sdk, Error, Result};
use crate::protocol::schema;

/// Most delete requests in one `BatchWriteItem`.
pub(crate) const CHUNK: usize = 25;
/// Most attempts per chunk (the first one included).
pub(crate) const MAX_ATTEMPTS: u32 = 5;

/// Longest look at what a cut delete left.
const RECHECK_TIMEOUT: Duration = Duration::from_secs(1);

// The protocol's steps, for the relay and for tools and tests that drive them: hidden
// from the docs of the type an embedder passes to `Relay::new`.
#[doc(hidden)]
impl DynamoDbOutboxStore {
    /// How many leading messages of `chunk` (ascending sequences of `bucket`) are gone, by
    /// one strongly consistent query of their range (keys only), bounded by
    /// [`RECHECK_TIMEOUT`]; `None` when the look failed.
    async fn deleted_prefix(&self, bucket: u32, chunk: &[u64]) -> Option<usize> {
        let (first, last) = (*chunk.first()?, *chunk.last()?);
        let query = self
            .query_partition(self.keys.message_pk(bucket))
            .key_condition_expression("#pk = :pk AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#sk", &self.keys.sk)
            .expression_attribute_values(
                ":from",
                aws_sdk_dynamodb::types::AttributeValue::S(schema::message_sk(first)),
            )
            .expression_attribute_values(
                ":to",
                aws_sdk_dynamodb::types::AttributeValue::S(schema::message_sk(last)),
            )
            .projection_expression("#sk")
            .consistent_read(true)
            .limit(1)
            .send();
        let out = tokio::time::timeout(RECHECK_TIMEOUT, query)
            .await
            .ok()?
            .ok()?;
        let first_left = out
            .items()
            .first()
            .and_then(|i| i.get(&self.keys.sk)?.as_s().ok())
            .and_then(|sk| schema::parse_message_sk(sk));
        Some(match first_left {
            None => chunk.len(),
            Some(seq) => chunk.iter().take_while(|s| **s < seq).count(),
        })
    }

    /// One `DeleteRequest` per message of `chunk` (sequences of `bucket`).
    fn delete_requests(&self, bucket: u32, chunk: &[u64]) -> Vec<WriteRequest> {
        chunk
            .iter()
            .map(|&seq| {
                let key = self
                    .keys
                    .key(self.keys.message_pk(bucket), schema::message_sk(seq));
                WriteRequest::builder()
                    .delete_request(
                        DeleteRequest::builder()
                            .set_key(Some(key))
                            .build()
                            .expect("key is set"),
                    )
                    .build()
            })
            .collect()
    }

    /// The sequences of the messages that `requests` (unprocessed deletes) still delete.
    fn sequences_of(&self, requests: &[WriteRequest]) -> Vec<u64> {
        requests
            .iter()
            .filter_map(|w| w.delete_request())
            .filter_map(|d| d.key().get(&self.keys.sk)?.as_s().ok())
            .filter_map(|sk| schema::parse_message_sk(sk))
            .collect()
    }

    /// Deletes the messages `sequences` (ascending) of `bucket`; returns how many leading
    /// ones are known deleted. Starts no chunk at or after the deadline, cuts a request
    /// still in flight at it, and stops at the first chunk that cannot be deleted by then
    /// or within `MAX_ATTEMPTS` (5) attempts; an error comes back only when nothing was deleted.
    pub async fn delete_messages(
        &self,
        bucket: u32,
        sequences: &[u64],
        deadline: Instant,
    ) -> Result<usize> {
        let mut deleted = 0;
        for chunk in sequences.chunks(CHUNK) {
            if Instant::now() >= deadline && deleted > 0 {
                warn!(
                    bucket,
                    deleted,
                    left = sequences.len() - deleted,
                    "delete deadline reached; the rest is published again"
                );
                return Ok(deleted);
            }
            let mut pending = self.delete_requests(bucket, chunk);
            let mut pause = Duration::from_millis(25);
            let mut attempt = 0;
            while !pending.is_empty() {
                attempt += 1;
                let request = self
                    .client
                    .batch_write_item()
                    .request_items(&self.options.table_name, pending.clone())
                    .send();
                let Ok(result) = tokio::time::timeout_at(deadline, request).await else {
                    // Cut at the deadline: it may have applied. One strongly consistent
                    // look says how much of the chunk is gone.
                    let gone = self.deleted_prefix(bucket, chunk).await.unwrap_or(0);
                    deleted += gone;
                    if deleted == 0 {
                        return Err(Error::DeadlineExceeded("deleting published messages"));
                    }
                    return Ok(deleted);
                };
                match result {
                    Ok(out) => {
                        pending = out
                            .unprocessed_items
                            .and_then(|mut m| m.remove(&self.options.table_name))
                            .unwrap_or_default();
                    }
                    Err(e) => {
                        let err = from_sdk("BatchWriteItem", e);
                        if !err.is_retryable() && deleted == 0 {
                            return Err(err);
                        }
                        warn!(bucket, error = %crate::error::chain(&err), attempt, "delete failed");
                    }
                }
                if pending.is_empty() {
                    break;
                }
                if attempt >= MAX_ATTEMPTS || Instant::now() + pause > deadline {
                    // Count the leading ones of this chunk that went through.
                    let left = self.sequences_of(&pending);
                    deleted += chunk.iter().position(|s| left.contains(s)).unwrap_or(0);
                    warn!(
                        bucket,
                        deleted,
                        left = left.len(),
                        "giving up on deletes; the rest is published again"
                    );
                    if deleted == 0 {
                        return Err(Error::DynamoDb {
                            operation: "BatchWriteItem",
                            retryable: true,
                            request_id: None,
                            source: format!(
                                "{} deletes still unprocessed after {attempt} attempts",
                                left.len()
                            )
                            .into(),
                        });
                    }
                    return Ok(deleted);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            deleted += chunk.len();
        }
        Ok(deleted)
    }

    /// The PartiQL statement that deletes one message if its key holds that message or
    /// none: `DELETE FROM "{table}" WHERE "{pk}" = ? AND "{sk}" = ? AND "MessageId" = ?`.
    /// DynamoDB answers a missing item with success and an item whose `MessageId` differs
    /// with `ConditionalCheckFailed` ("PartiQL delete statements for DynamoDB", DynamoDB
    /// developer guide): the condition `attribute_not_exists(PK) OR MessageId = :id`.
    fn delete_if_same_statement(&self) -> String {
        format!(
            "DELETE FROM {} WHERE {} = ? AND {} = ? AND {} = ?",
            partiql_name(&self.options.table_name),
            partiql_name(&self.keys.pk),
            partiql_name(&self.keys.sk),
            partiql_name(attr::MESSAGE_ID),
        )
    }

    /// Deletes the messages `messages` (ascending sequences of `bucket`, each with its
    /// message id), each conditional on its item holding that message or none: a delete
    /// that lands late, after a writer with a reset sequence counter put a new message
    /// under the same key, leaves the new message instead of deleting it unpublished.
    /// Exactly-once delivery deletes so (`docs/protocol.md`, section 8.4). Up to [`CHUNK`]
    /// deletes go in one PartiQL `BatchExecuteStatement` (each statement succeeds or fails
    /// on its own; failed ones are retried). A refused condition counts the message as
    /// gone (it is: another message holds its key) and as a refused conditional write of
    /// kind [`WriteKind::Delete`]. Returns how many leading ones are known gone, with the
    /// deadline and attempts of [`Self::delete_messages`].
    pub async fn delete_messages_if_same(
        &self,
        bucket: u32,
        messages: &[(u64, Uuid)],
        deadline: Instant,
    ) -> Result<usize> {
        let statement = self.delete_if_same_statement();
        let pk = self.keys.message_pk(bucket);
        let mut deleted = 0;
        for chunk in messages.chunks(CHUNK) {
            if Instant::now() >= deadline && deleted > 0 {
                return Ok(deleted);
            }
            // Per message: gone (deleted, absent or replaced) or not yet.
            let mut gone = vec![false; chunk.len()];
            let mut last_error = None;
            let mut pause = Duration::from_millis(25);
            for attempt in 1..=MAX_ATTEMPTS {
                let pending: Vec<usize> = (0..chunk.len()).filter(|i| !gone[*i]).collect();
                let statements = pending
                    .iter()
                    .map(|&i| {
                        let (seq, id) = chunk[i];
                        BatchStatementRequest::builder()
                            .statement(&statement)
                            .parameters(AttributeValue::S(pk.clone()))
                            .parameters(AttributeValue::S(schema::message_sk(seq)))
                            .parameters(AttributeValue::S(id.hyphenated().to_string()))
                            .build()
                            .expect("statement is set")
                    })
                    .collect();
                let request = self
                    .client
                    .batch_execute_statement()
                    .set_statements(Some(statements))
                    .send();
                let Ok(result) = tokio::time::timeout_at(deadline, request).await else {
                    // Cut at the deadline: it may have applied. One strongly consistent
                    // look says how much of the chunk is gone (a replaced message counts
                    // as still there: published again, never lost).
                    let sequences: Vec<u64> = chunk.iter().map(|(seq, _)| *seq).collect();
                    let prefix = self.deleted_prefix(bucket, &sequences).await.unwrap_or(0);
                    gone.iter_mut().take(prefix).for_each(|g| *g = true);
                    last_error = Some(Error::DeadlineExceeded("deleting published messages"));
                    break;
                };
                match result {
                    Ok(out) => {
                        for (&i, response) in pending.iter().zip(out.responses()) {
                            match response.error() {
                                None => gone[i] = true,
                                Some(e) => match e.code() {
                                    Some(BatchStatementErrorCodeEnum::ConditionalCheckFailed) => {
                                        // Another message holds the key: it is left in
                                        // place, and the published one is gone.
                                        self.refused.add(WriteKind::Delete);
                                        warn!(
                                            kind = WriteKind::Delete.as_str(),
                                            bucket,
                                            sequence = chunk[i].0,
                                            likely_cause = WriteKind::Delete.likely_cause(),
                                            "conditional write refused"
                                        );
                                        gone[i] = true;
                                    }
                                    code => last_error = Some(statement_error(code, e.message())),
                                },
                            }
                        }
                    }
                    Err(e) => last_error = Some(from_sdk("BatchExecuteStatement", e)),
                }
                let failed_for_good = last_error.as_ref().is_some_and(|e| !e.is_retryable());
                if gone.iter().all(|g| *g)
                    || failed_for_good
                    || attempt == MAX_ATTEMPTS
                    || Instant::now() + pause > deadline
                {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            let prefix = gone.iter().take_while(|g| **g).count();
            deleted += prefix;
            if prefix < chunk.len() {
                warn!(
                    bucket,
                    deleted, "giving up on deletes; the rest is published again"
                );
                return match (deleted, last_error) {
                    (0, Some(e)) => Err(e),
                    _ => Ok(deleted),
                };
            }
        }
        Ok(deleted)
    }
}

/// `name` as a PartiQL quoted identifier (a double quote inside doubled).
fn partiql_name(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The error of one statement of a `BatchExecuteStatement`: retryable when DynamoDB says
/// the statement may succeed later (throttling, a conflict, an internal error).
fn statement_error(code: Option<&BatchStatementErrorCodeEnum>, message: Option<&str>) -> Error {
    use BatchStatementErrorCodeEnum as Code;
    let retryable = matches!(
        code,
        Some(
            Code::ThrottlingError
                | Code::ProvisionedThroughputExceeded
                | Code::RequestLimitExceeded
                | Code::TransactionConflict
                | Code::InternalServerError
        )
    );
    let code = code.map_or("unknown", |c| c.as_str());
    Error::DynamoDb {
        operation: "BatchExecuteStatement",
        retryable,
        request_id: None,
        source: format!("{code}: {}", message.unwrap_or("no message")).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partiql_names_are_quoted_with_inner_quotes_doubled() {
        assert_eq!(partiql_name("orders.outbox-1"), "\"orders.outbox-1\"");
        assert_eq!(partiql_name("P\"K"), "\"P\"\"K\"");
    }

    #[test]
    fn throttled_statements_are_retried_and_refused_ones_are_not() {
        let throttled = statement_error(Some(&BatchStatementErrorCodeEnum::ThrottlingError), None);
        assert!(throttled.is_retryable());
        let denied = statement_error(
            Some(&BatchStatementErrorCodeEnum::AccessDenied),
            Some("not authorized to perform dynamodb:PartiQLDelete"),
        );
        assert!(!denied.is_retryable());
        assert!(crate::error::chain(&denied).contains("AccessDenied: not authorized"));
    }
}
