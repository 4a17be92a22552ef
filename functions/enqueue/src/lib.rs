//! The enqueue API as an AWS Lambda function: other services invoke it directly (IAM) with
//! the JSON request of [`dynamo_outbox::enqueue_api`] and get each message's id, bucket
//! and sequence back. The request is parsed and checked completely before anything is
//! written; a rejected request fails with `errorType` `ValidationError` and writes nothing.
//!
//! The DynamoDB client is built once per execution environment (in `main`).
//!
//! # Idempotency
//! A request with an `idempotency_key` writes a marker item in the same transaction as its
//! messages: partition key `{prefix}#IDEMPOTENCY#{key}`, sort key `IDEMPOTENCY` (outside
//! every message, sequence and coordination partition), holding the response as JSON
//! (`Result`, S) and the end of its retention window (`IdempotencyExpiresAtUtc`, N, UTC
//! ticks). The marker's put is conditional on no marker or an expired one; when the
//! condition fails, the transaction writes nothing and the function returns the first
//! call's response from the marker (read back through the cancellation reason, so the
//! function needs no read permission). A reuse of a key with a different request inside
//! the window also returns the first call's response. Markers are not deleted: an expired
//! one is overwritten by the next call with its key.
//!
//! # Commit notification
//! With [`env::NOTIFY_EVENT_BUS`] set, every request that wrote messages sends one
//! EventBridge event after its commit (see [`dynamo_outbox::notification`] and
//! [`dynamo_outbox::notification::EventBridgeNotifier`]); an EventBridge rule on that bus invokes the relay function. The response
//! never waits for more than [`NOTIFY_TIMEOUT`] on it and never depends on it: a
//! failed send is logged (`commit notification failed`) and the call still succeeds. A
//! replayed idempotent request wrote nothing and sends nothing.
//!
//! # Environment
//! Everything [`OutboxOptions::from_env`] reads, [`env::IDEMPOTENCY_RETENTION`]
//! (`OUTBOX_IDEMPOTENCY_RETENTION`, default 24h) and [`env::NOTIFY_EVENT_BUS`]
//! (`OUTBOX_NOTIFY_EVENT_BUS`, default none).

use std::fmt;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};
use dynamo_outbox::clock::{duration_to_ticks, ticks_from_system_time};
use dynamo_outbox::enqueue_api::{error_type, parse_request, EnqueueResponse, EnqueuedMessage};
use dynamo_outbox::notification::CommitNotification;
use dynamo_outbox::schema::{self, attr, Keys};
use dynamo_outbox::writer::{transaction_error, Reserved};
use dynamo_outbox::{DynamoDbOutboxWriter, Error, OutboxMessage, OutboxOptions};
use lambda_runtime::{Diagnostic, LambdaEvent};
use tokio::time::Instant;
use tracing::{info, warn};

/// Environment variables of the enqueue function (besides the library's).
pub mod env {
    /// How long an idempotency key answers with the first call's response (24h).
    pub const IDEMPOTENCY_RETENTION: &str = "OUTBOX_IDEMPOTENCY_RETENTION";
    /// Event bus (name or ARN) for commit notifications; unset or empty for none.
    pub const NOTIFY_EVENT_BUS: &str = dynamo_outbox::notification::NOTIFY_EVENT_BUS;
}

use dynamo_outbox::notification::{EventBridgeNotifier, NOTIFY_TIMEOUT};

/// Default retention window of an idempotency key.
pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Time kept free before the invocation's deadline: the write is abandoned then, so the
/// function returns an error instead of being timed out.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// A function error: its `errorType` says what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionError {
    /// `ValidationError`, `Misconfiguration`, `DynamoDb`, `DeadlineExceeded`, ...
    pub error_type: &'static str,
    /// The error's text; for a `ValidationError`, `field: rule`.
    pub message: String,
}

impl fmt::Display for FunctionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error_type, self.message)
    }
}

impl std::error::Error for FunctionError {}

impl From<dynamo_outbox::Error> for FunctionError {
    fn from(e: dynamo_outbox::Error) -> Self {
        FunctionError {
            error_type: error_type(&e),
            message: dynamo_outbox::error::chain(&e),
        }
    }
}

impl From<FunctionError> for Diagnostic {
    fn from(e: FunctionError) -> Self {
        Diagnostic {
            error_type: e.error_type.to_owned(),
            error_message: e.message,
        }
    }
}

/// The enqueue function: the writer of one execution environment and the handler.
#[derive(Debug, Clone)]
pub struct EnqueueFunction {
    writer: DynamoDbOutboxWriter,
    keys: Keys,
    idempotency_retention: Duration,
    notifier: Option<EventBridgeNotifier>,
}

impl EnqueueFunction {
    /// The function over `client` (built once per execution environment).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        options: OutboxOptions,
    ) -> dynamo_outbox::Result<Self> {
        Ok(EnqueueFunction {
            keys: Keys::new(&options),
            writer: DynamoDbOutboxWriter::new(client, options)?,
            idempotency_retention: DEFAULT_IDEMPOTENCY_RETENTION,
            notifier: None,
        })
    }

    /// The commit notifier, when one is configured.
    pub fn notifier(&self) -> Option<&EventBridgeNotifier> {
        self.notifier.as_ref()
    }

    /// Sends a commit notification through `notifier` after every commit.
    pub fn with_notifier(mut self, notifier: EventBridgeNotifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Sets how long an idempotency key answers with the first call's response.
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.idempotency_retention = retention;
        self
    }

    /// The function as the environment configures it: the outbox options
    /// ([`OutboxOptions::from_lookup`]), [`env::IDEMPOTENCY_RETENTION`] and
    /// [`env::NOTIFY_EVENT_BUS`], read through `lookup` (the process environment, or a
    /// stand-in); the clients are built for `config`.
    pub fn from_lookup(
        config: &aws_config::SdkConfig,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> dynamo_outbox::Result<Self> {
        let options = OutboxOptions::from_lookup(&lookup)?;
        let retention = Self::retention_from_lookup(&lookup)?;
        let mut function = Self::new(dynamo_outbox::client::dynamodb_client(config), options)?
            .with_idempotency_retention(retention);
        function.notifier = EventBridgeNotifier::from_lookup(config, &lookup);
        Ok(function)
    }

    /// Reads [`env::IDEMPOTENCY_RETENTION`] through `lookup` (an environment stand-in).
    pub fn retention_from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> dynamo_outbox::Result<Duration> {
        match lookup(env::IDEMPOTENCY_RETENTION) {
            Some(v) => dynamo_outbox::options::parse_duration(env::IDEMPOTENCY_RETENTION, &v),
            None => Ok(DEFAULT_IDEMPOTENCY_RETENTION),
        }
    }

    /// The writer the function uses.
    pub fn writer(&self) -> &DynamoDbOutboxWriter {
        &self.writer
    }

    /// Handles one invocation: parse, check, enqueue in one transaction, respond.
    pub async fn handle(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<EnqueueResponse, FunctionError> {
        let (payload, context) = event.into_parts();
        let request = parse_request(&payload, self.writer.options().bucket_count)?;
        self.writer.check(&request.messages)?;
        let write = async {
            match &request.idempotency_key {
                None => Ok((
                    EnqueueResponse::from_enqueued(&self.writer.enqueue(&request.messages).await?),
                    true,
                )),
                Some(key) => self.enqueue_idempotent(&request.messages, key).await,
            }
        };
        let deadline = match context.deadline().duration_since(SystemTime::now()) {
            Ok(left) if context.deadline > 0 && !left.is_zero() => {
                Some(Instant::now() + left.saturating_sub(DEADLINE_MARGIN))
            }
            // No usable deadline (a local emulator): the SDK's own timeouts bound the write.
            _ => None,
        };
        let (response, wrote) = match deadline {
            Some(by) => tokio::time::timeout_at(by, write).await.map_err(|_| {
                FunctionError::from(Error::DeadlineExceeded(
                    "enqueue (the write may or may not have committed)",
                ))
            })??,
            None => write.await?,
        };
        info!(
            messages = response.messages.len(),
            request_id = %context.request_id,
            replayed = !wrote,
            "enqueued"
        );
        if let (Some(notifier), true) = (&self.notifier, wrote) {
            let notification = CommitNotification::new(
                self.writer.options(),
                response.messages.iter().map(|m| m.bucket),
            );
            let cap = Instant::now() + NOTIFY_TIMEOUT;
            let by = deadline.map_or(cap, |d| d.min(cap));
            match notifier.send(&notification, by).await {
                Ok(()) => info!(
                    bus = notifier.bus(),
                    buckets = ?notification.buckets,
                    "commit notification sent"
                ),
                Err(e) => warn!(
                    bus = notifier.bus(),
                    error = %e,
                    "commit notification failed (the messages are committed; relays find them on their next poll)"
                ),
            }
        }
        Ok(response)
    }

    /// One transaction: the messages and the idempotency marker; a live marker of the same
    /// key cancels it, and its stored response is returned instead. The flag is whether
    /// this call wrote the messages (false for a replay).
    async fn enqueue_idempotent(
        &self,
        messages: &[OutboxMessage],
        key: &str,
    ) -> dynamo_outbox::Result<(EnqueueResponse, bool)> {
        let reserved = self.writer.reserve(messages).await?;
        let response = response_of(&reserved);
        let now = ticks_from_system_time(SystemTime::now());
        let expires = now.saturating_add(duration_to_ticks(self.idempotency_retention));
        let options = self.writer.options();
        let mut item = self
            .keys
            .key(self.keys.idempotency_pk(key), schema::IDEMPOTENCY_SK.into());
        item.insert(
            attr::RESULT.into(),
            schema::s(serde_json::to_string(&response).map_err(|e| {
                Error::Misconfiguration(format!("cannot serialize the response: {e}"))
            })?),
        );
        item.insert(attr::IDEMPOTENCY_EXPIRES_AT.into(), schema::n(expires));
        let marker = Put::builder()
            .table_name(&options.table_name)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#pk) OR #exp < :now")
            .expression_attribute_names("#pk", &self.keys.pk)
            .expression_attribute_names("#exp", attr::IDEMPOTENCY_EXPIRES_AT)
            .expression_attribute_values(":now", schema::n(now))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| Error::Misconfiguration(e.to_string()))?;
        let mut items = reserved
            .iter()
            .map(Reserved::transact_write_item)
            .collect::<dynamo_outbox::Result<Vec<_>>>()?;
        items.push(TransactWriteItem::builder().put(marker).build());
        let sent = self
            .writer
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(uuid_token())
            .send()
            .await;
        match sent {
            Ok(_) => {
                self.writer.notify_committed(messages);
                Ok((response, true))
            }
            Err(err) => {
                if let Some(TransactWriteItemsError::TransactionCanceledException(e)) =
                    err.as_service_error()
                {
                    let marker_reason = e.cancellation_reasons().last();
                    if let Some(reason) =
                        marker_reason.filter(|r| r.code() == Some("ConditionalCheckFailed"))
                    {
                        let stored = reason
                            .item()
                            .and_then(|i| schema::get_s(i, attr::RESULT))
                            .and_then(|r| serde_json::from_str::<EnqueueResponse>(r).ok())
                            .ok_or_else(|| Error::Corrupt {
                                pk: self.keys.idempotency_pk(key),
                                sk: schema::IDEMPOTENCY_SK.into(),
                                reason: "the idempotency marker has no readable Result".into(),
                            })?;
                        info!(idempotency_key = key, "replayed the first call's response");
                        return Ok((stored, false));
                    }
                }
                Err(transaction_error(err))
            }
        }
    }
}

fn response_of(reserved: &[Reserved]) -> EnqueueResponse {
    EnqueueResponse {
        messages: reserved
            .iter()
            .map(|r| EnqueuedMessage {
                message_id: r.message_id.hyphenated().to_string(),
                bucket: r.bucket,
                sequence: r.sequence,
            })
            .collect(),
    }
}

fn uuid_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_defaults_to_a_day_and_names_bad_values() {
        assert_eq!(
            EnqueueFunction::retention_from_lookup(|_| None).unwrap(),
            DEFAULT_IDEMPOTENCY_RETENTION
        );
        assert_eq!(
            EnqueueFunction::retention_from_lookup(|_| Some("15m".into())).unwrap(),
            Duration::from_secs(900)
        );
        let e = EnqueueFunction::retention_from_lookup(|_| Some("a while".into())).unwrap_err();
        assert!(e.to_string().starts_with(env::IDEMPOTENCY_RETENTION), "{e}");
        assert_eq!(FunctionError::from(e).error_type, "Misconfiguration");
    }
}
