//! The enqueue service: one JSON request of [`crate::enqueue_request`] parsed, checked,
//! written in one transaction (with its idempotency marker when the request has an
//! `idempotency_key`) and announced by a commit notification. The enqueue Lambda function
//! and `outboxctl enqueue` both run it, so that what one accepts and answers, the other
//! does too; a service of your own can run it as well.
//!
//! The request is parsed and checked completely before anything is written; a rejected
//! request fails with [`Error::InvalidMessage`] or [`Error::Limit`] (`errorType`
//! `ValidationError`), naming the field, and writes nothing.
//!
//! # Topic allow-list
//! With [`OUTBOX_ALLOWED_TOPICS`](crate::options::env::ALLOWED_TOPICS) set (read into
//! [`OutboxOptions::allowed_topics`], or [`EnqueueService::with_allowed_topics`]), a
//! request naming any other topic is rejected in that check, before anything is written:
//! [`Error::InvalidMessage`] for `messages[i].topic`, `errorType` `ValidationError`.
//! Unset, every topic is allowed. The relay checks the same list again before it
//! publishes (a message written straight into the table, past this service).
//!
//! # Idempotency
//! A request with an `idempotency_key` writes a marker item in the same transaction as its
//! messages: partition key `{prefix}#IDEMPOTENCY#{key}`, sort key `IDEMPOTENCY` (outside
//! every message, sequence and coordination partition), holding the response as JSON
//! (`Result`, S) and the end of its retention window (`IdempotencyExpiresAtUtc`, N, UTC
//! ticks). The marker's put is conditional on no marker or an expired one; when the
//! condition fails, the transaction writes nothing and the service returns the first
//! call's response from the marker (read back through the cancellation reason, so the
//! caller needs no read permission). A reuse of a key with a different request inside
//! the window also returns the first call's response. Markers are not deleted: an expired
//! one is overwritten by the next call with its key. A request without a key is
//! [`DynamoDbOutboxWriter::enqueue`].
//!
//! # Trace context
//! Every message is stamped with the caller's W3C trace context: its own `traceparent`
//! header, else the request's `traceparent` / `tracestate`, else the fallback the caller of
//! [`EnqueueService::enqueue_json_traced`] gives (the enqueue function: the invocation's
//! X-Ray trace header), else (feature `otel`) the current OpenTelemetry span's
//! ([`crate::trace_context`]).
//!
//! # Commit notification
//! With a notifier (feature `eventbridge`: `EnqueueService::with_notifier`, or
//! [`NOTIFY_EVENT_BUS`](crate::notification::NOTIFY_EVENT_BUS) read by
//! `EnqueueService::from_lookup`), every request that wrote messages sends one
//! EventBridge event after its commit (see [`crate::notification`]). The call never waits
//! for more than `notification::NOTIFY_TIMEOUT` (2 s) on it, nor past the caller's
//! deadline, and never depends on it: a failed send is logged (`commit
//! notification failed`) and the call still succeeds. A replayed idempotent request wrote
//! nothing and sends nothing.

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};
use serde_json::Value;
use tokio::time::Instant;
use tracing::info;
#[cfg(feature = "eventbridge")]
use tracing::warn;
use uuid::Uuid;

use crate::attr;
use crate::enqueue_request::{parse_request, EnqueueRequest, EnqueueResponse, EnqueuedMessage};
use crate::error::{transaction_error, Error, Result};
#[cfg(feature = "eventbridge")]
use crate::notification::{CommitNotification, EventBridgeNotifier, NOTIFY_TIMEOUT};
use crate::options::OutboxOptions;
use crate::protocol::clock::{duration_to_ticks, ticks_from_system_time};
use crate::protocol::schema::{self, Keys};
use crate::trace_context::TraceContext;
use crate::writer::{DynamoDbOutboxWriter, Reserved};

/// The environment variable saying how long an idempotency key answers with the first
/// call's response (default [`DEFAULT_IDEMPOTENCY_RETENTION`]).
pub const IDEMPOTENCY_RETENTION: &str = "OUTBOX_IDEMPOTENCY_RETENTION";

/// Default retention window of an idempotency key.
pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What one enqueue call did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueueOutcome {
    /// The response: each message's id, bucket and sequence, in request order.
    pub response: EnqueueResponse,
    /// Whether the response is the first call's, replayed from its idempotency marker
    /// (this call wrote nothing and sent no notification).
    pub replayed: bool,
}

/// Enqueues JSON requests (see the module documentation) into one outbox.
#[derive(Debug, Clone)]
pub struct EnqueueService {
    writer: DynamoDbOutboxWriter,
    keys: Keys,
    idempotency_retention: Duration,
    #[cfg(feature = "eventbridge")]
    notifier: Option<EventBridgeNotifier>,
}

impl EnqueueService {
    /// The service over `client` for the outbox `options` describe (validated here), with
    /// the default idempotency retention and no notifier.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `options` break a rule ([`OutboxOptions::validate`]).
    pub fn new(client: aws_sdk_dynamodb::Client, options: OutboxOptions) -> Result<Self> {
        Ok(EnqueueService {
            keys: Keys::new(&options),
            writer: DynamoDbOutboxWriter::new(client, options)?,
            idempotency_retention: DEFAULT_IDEMPOTENCY_RETENTION,
            #[cfg(feature = "eventbridge")]
            notifier: None,
        })
    }

    /// The service as the environment configures it: the outbox options
    /// ([`OutboxOptions::from_lookup`], the topic allow-list among them),
    /// [`IDEMPOTENCY_RETENTION`] and
    /// [`NOTIFY_EVENT_BUS`](crate::notification::NOTIFY_EVENT_BUS), read through `lookup`
    /// (the process environment, or a stand-in); the clients are built for `config`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the variable and the rule it broke.
    ///
    /// # Examples
    /// ```no_run
    /// use dynamo_outbox::enqueue::EnqueueService;
    ///
    /// # async fn example() -> dynamo_outbox::Result<()> {
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let service = EnqueueService::from_lookup(&sdk, |name| std::env::var(name).ok())?;
    /// let request = serde_json::json!({"messages": [{"topic": "orders", "value": "placed"}]});
    /// let outcome = service.enqueue_json(&request, None).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "eventbridge")]
    pub fn from_lookup(
        config: &aws_config::SdkConfig,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let options = OutboxOptions::from_lookup(&lookup)?;
        let retention = retention_from_lookup(&lookup)?;
        let mut service = Self::new(crate::client::dynamodb_client(config), options)?
            .with_idempotency_retention(retention);
        service.notifier = EventBridgeNotifier::from_lookup(config, &lookup);
        Ok(service)
    }

    /// Rejects every request naming a topic outside `allowed_topics` (see the module
    /// documentation); the options' [`OutboxOptions::allowed_topics`] otherwise.
    pub fn with_allowed_topics(mut self, allowed_topics: crate::options::TopicAllowList) -> Self {
        self.writer = self.writer.with_allowed_topics(allowed_topics);
        self
    }

    /// Sets how long an idempotency key answers with the first call's response.
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.idempotency_retention = retention;
        self
    }

    /// Sends a commit notification through `notifier` after every commit.
    #[cfg(feature = "eventbridge")]
    pub fn with_notifier(mut self, notifier: EventBridgeNotifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// The commit notifier, when one is configured.
    #[cfg(feature = "eventbridge")]
    pub fn notifier(&self) -> Option<&EventBridgeNotifier> {
        self.notifier.as_ref()
    }

    /// The writer the service uses.
    pub fn writer(&self) -> &DynamoDbOutboxWriter {
        &self.writer
    }

    /// Parses the JSON request `payload` ([`parse_request`], for this outbox's bucket
    /// count) and enqueues it ([`Self::enqueue`]).
    ///
    /// # Errors
    /// What [`parse_request`] refuses, and as [`Self::enqueue`].
    pub async fn enqueue_json(
        &self,
        payload: &Value,
        deadline: Option<Instant>,
    ) -> Result<EnqueueOutcome> {
        self.enqueue_json_traced(payload, deadline, None).await
    }

    /// [`Self::enqueue_json`], stamping `fallback` (the enqueue function: the invocation's
    /// X-Ray trace header in W3C form) on every message that neither the request's
    /// `traceparent` nor a header of its own gives a trace context.
    ///
    /// # Errors
    /// As [`Self::enqueue_json`].
    pub async fn enqueue_json_traced(
        &self,
        payload: &Value,
        deadline: Option<Instant>,
        fallback: Option<&TraceContext>,
    ) -> Result<EnqueueOutcome> {
        let request = parse_request(payload, self.writer.options().bucket_count)?;
        self.enqueue_traced(request, deadline, fallback).await
    }

    /// [`Self::enqueue_json_traced`] for one Lambda invocation whose request id is
    /// `request_id`: a request without an `idempotency_key` gets
    /// [`invocation_idempotency_key`]`(request_id)`. Lambda gives every retry of an
    /// asynchronous invocation the first attempt's request id (and a function cannot tell
    /// an asynchronous invocation from a synchronous one), so a retry of a call whose write
    /// committed (then timed out, say) replays the first response instead of writing the
    /// messages again under new ids; a synchronous call, whose request id is its own, is
    /// unaffected. Such a request holds at most 99 messages, as with a key of the caller's
    /// (the marker is the transaction's 100th item).
    ///
    /// # Errors
    /// As [`Self::enqueue_json`]; 100 messages without an `idempotency_key` are an
    /// [`Error::InvalidMessage`] naming `messages`.
    pub async fn enqueue_json_for_invocation(
        &self,
        payload: &Value,
        deadline: Option<Instant>,
        fallback: Option<&TraceContext>,
        request_id: &str,
    ) -> Result<EnqueueOutcome> {
        let mut request = parse_request(payload, self.writer.options().bucket_count)?;
        if request.idempotency_key.is_none() {
            let most = crate::protocol::schema::MAX_TRANSACTION_ITEMS - 1;
            if request.messages.len() > most {
                return Err(Error::message(
                    "messages",
                    format!(
                        "must hold at most {most} messages in a call of the enqueue function \
                         (its idempotency marker, keyed by the invocation's request id so that \
                         Lambda's asynchronous retries write nothing twice, is the \
                         transaction's 100th item), got {}",
                        request.messages.len()
                    ),
                ));
            }
            request.idempotency_key = Some(invocation_idempotency_key(request_id));
        }
        self.enqueue_traced(request, deadline, fallback).await
    }

    /// Enqueues `request`, its messages without a trace context of their own stamped with
    /// `fallback` (the invocation's).
    async fn enqueue_traced(
        &self,
        mut request: EnqueueRequest,
        deadline: Option<Instant>,
        fallback: Option<&TraceContext>,
    ) -> Result<EnqueueOutcome> {
        if let Some(context) = fallback {
            request.messages = request
                .messages
                .into_iter()
                .map(|m| m.with_trace_context(context))
                .collect();
        }
        self.enqueue(&request, deadline).await
    }

    /// Checks `request` (the messages, the topic allow-list, DynamoDB's limits), writes it
    /// in one transaction (with its idempotency marker, or a
    /// replay of the first call's response), then sends the commit notification.
    ///
    /// The write gives up at `deadline` with [`Error::DeadlineExceeded`] (it may or may
    /// not have committed); without one, the SDK's own timeouts bound it. The notification
    /// ends by `deadline` too, and never fails the call.
    ///
    /// # Errors
    /// Before anything is written, [`Error::InvalidMessage`] or [`Error::Limit`] naming
    /// the field (`errorType` `ValidationError`); then [`Error::DynamoDb`] or
    /// [`Error::TransactionCanceled`] when the write fails, [`Error::DeadlineExceeded`] at
    /// `deadline`.
    pub async fn enqueue(
        &self,
        request: &EnqueueRequest,
        deadline: Option<Instant>,
    ) -> Result<EnqueueOutcome> {
        self.writer.check(&request.messages)?;
        let write = async {
            match &request.idempotency_key {
                None => Ok(EnqueueOutcome {
                    response: EnqueueResponse::from_enqueued(
                        &self.writer.enqueue(&request.messages).await?,
                    ),
                    replayed: false,
                }),
                Some(key) => self.enqueue_idempotent(&request.messages, key).await,
            }
        };
        let outcome = match deadline {
            Some(by) => tokio::time::timeout_at(by, write).await.map_err(|_| {
                Error::DeadlineExceeded("enqueue (the write may or may not have committed)")
            })??,
            None => write.await?,
        };
        info!(
            messages = outcome.response.messages.len(),
            replayed = outcome.replayed,
            "enqueued"
        );
        if !outcome.replayed {
            self.notify(&outcome.response, deadline).await;
        }
        Ok(outcome)
    }

    /// The commit notification of `response`, bounded by [`NOTIFY_TIMEOUT`] and
    /// `deadline`; a failure is logged.
    #[cfg(feature = "eventbridge")]
    async fn notify(&self, response: &EnqueueResponse, deadline: Option<Instant>) {
        let Some(notifier) = &self.notifier else {
            return;
        };
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
                error = %crate::error::chain(&e),
                "commit notification failed (the messages are committed; relays find them on their next poll)"
            ),
        }
    }

    #[cfg(not(feature = "eventbridge"))]
    async fn notify(&self, _response: &EnqueueResponse, _deadline: Option<Instant>) {}

    /// One transaction: the messages and the idempotency marker; a live marker of the same
    /// key cancels it, and its stored response is returned instead.
    async fn enqueue_idempotent(
        &self,
        messages: &[crate::message::OutboxMessage],
        key: &str,
    ) -> Result<EnqueueOutcome> {
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
            schema::s(
                serde_json::to_string(&response)
                    .map_err(|e| Error::misconfigured_by("cannot serialize the response", e))?,
            ),
        );
        item.insert(attr::IDEMPOTENCY_EXPIRES_AT.into(), schema::n(expires));
        // The same expiry in epoch seconds, which DynamoDB's time to live reads (it cannot
        // read ticks): the table removes the marker some time after it expired.
        item.insert(
            attr::TIME_TO_LIVE.into(),
            schema::n(crate::ticks::epoch_seconds_at_or_after(expires)),
        );
        let marker = Put::builder()
            .table_name(&options.table_name)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#pk) OR #exp < :now")
            .expression_attribute_names("#pk", &self.keys.pk)
            .expression_attribute_names("#exp", attr::IDEMPOTENCY_EXPIRES_AT)
            .expression_attribute_values(":now", schema::n(now))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| {
                Error::misconfigured_by("the idempotency record's request could not be built", e)
            })?;
        let mut items = reserved
            .iter()
            .map(Reserved::transact_write_item)
            .collect::<Result<Vec<_>>>()?;
        items.push(TransactWriteItem::builder().put(marker).build());
        let sent = self
            .writer
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(Uuid::new_v4().to_string())
            .send()
            .await;
        match sent {
            Ok(_) => {
                self.writer.notify_committed(messages);
                Ok(EnqueueOutcome {
                    response,
                    replayed: false,
                })
            }
            Err(err) => {
                if let Some(TransactWriteItemsError::TransactionCanceledException(e)) =
                    err.as_service_error()
                {
                    let marker_reason = e.cancellation_reasons().last();
                    if let Some(reason) =
                        marker_reason.filter(|r| r.code() == Some("ConditionalCheckFailed"))
                    {
                        let stored = match reason
                            .item()
                            .and_then(|i| schema::get_s(i, attr::RESULT))
                            .map(serde_json::from_str::<EnqueueResponse>)
                        {
                            Some(Ok(stored)) => stored,
                            unreadable => {
                                return Err(Error::Corrupt {
                                    pk: self.keys.idempotency_pk(key),
                                    sk: schema::IDEMPOTENCY_SK.into(),
                                    reason: "the idempotency marker has no readable Result".into(),
                                    source: unreadable
                                        .and_then(std::result::Result::err)
                                        .map(|e| Box::new(e) as crate::error::BoxError),
                                })
                            }
                        };
                        info!(idempotency_key = key, "replayed the first call's response");
                        return Ok(EnqueueOutcome {
                            response: stored,
                            replayed: true,
                        });
                    }
                }
                Err(transaction_error(err))
            }
        }
    }
}

/// Reads [`IDEMPOTENCY_RETENTION`] through `lookup` (the process environment, or a
/// stand-in); [`DEFAULT_IDEMPOTENCY_RETENTION`] when it is unset.
pub fn retention_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Duration> {
    match lookup(IDEMPOTENCY_RETENTION) {
        Some(v) => crate::options::parse_duration(IDEMPOTENCY_RETENTION, &v),
        None => Ok(DEFAULT_IDEMPOTENCY_RETENTION),
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

/// The idempotency key of a call of the enqueue function that gave none: `lambda-request:`
/// and the invocation's request id (which Lambda keeps across the retries of an
/// asynchronous invocation).
pub fn invocation_idempotency_key(request_id: &str) -> String {
    format!("lambda-request:{request_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_defaults_to_a_day_and_names_bad_values() {
        assert_eq!(
            retention_from_lookup(|_| None).unwrap(),
            DEFAULT_IDEMPOTENCY_RETENTION
        );
        assert_eq!(
            retention_from_lookup(|_| Some("15m".into())).unwrap(),
            Duration::from_secs(900)
        );
        let e = retention_from_lookup(|_| Some("a while".into())).unwrap_err();
        assert!(e.to_string().starts_with(IDEMPOTENCY_RETENTION), "{e}");
        assert_eq!(e.error_type(), "Misconfiguration");
    }
}
