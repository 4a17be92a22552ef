//! The enqueue API as an AWS Lambda function: other services invoke it directly (IAM) with
//! the JSON request of [`dynamo_outbox::enqueue_api`] and get each message's id, bucket
//! and sequence back. The request is parsed and checked completely before anything is
//! written; a rejected request fails with `errorType` `ValidationError` and writes nothing.
//!
//! The DynamoDB client is built once per execution environment (in `main`).
//!
//! # Environment
//! Everything [`OutboxOptions::from_env`] reads.
//!
//! # Not implemented yet
//! - `idempotency_key` is validated but not honoured: a retried call writes the messages
//!   again (consumers deduplicate on the message-id header as for any at-least-once copy).
//! - The commit notification to EventBridge (`OUTBOX_NOTIFY_EVENT_BUS`).

use std::fmt;
use std::time::{Duration, SystemTime};

use dynamo_outbox::enqueue_api::{error_type, parse_request, EnqueueResponse};
use dynamo_outbox::{DynamoDbOutboxWriter, OutboxOptions};
use lambda_runtime::{Diagnostic, LambdaEvent};
use tokio::time::Instant;
use tracing::{info, warn};

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
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        FunctionError {
            error_type: error_type(&e),
            message,
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
}

impl EnqueueFunction {
    /// The function over `client` (built once per execution environment).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        options: OutboxOptions,
    ) -> dynamo_outbox::Result<Self> {
        Ok(EnqueueFunction {
            writer: DynamoDbOutboxWriter::new(client, options)?,
        })
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
        if request.idempotency_key.is_some() {
            warn!("idempotency_key is not implemented yet: the messages are written as a new call");
        }
        let write = self.writer.enqueue(&request.messages);
        let enqueued = match context.deadline().duration_since(SystemTime::now()) {
            Ok(left) if context.deadline > 0 && !left.is_zero() => {
                let by = Instant::now() + left.saturating_sub(DEADLINE_MARGIN);
                tokio::time::timeout_at(by, write).await.map_err(|_| {
                    FunctionError::from(dynamo_outbox::Error::DeadlineExceeded(
                        "enqueue (the write may or may not have committed)",
                    ))
                })??
            }
            // No usable deadline (a local emulator): the SDK's own timeouts bound the write.
            _ => write.await?,
        };
        let response = EnqueueResponse::from_enqueued(&enqueued);
        info!(
            messages = response.messages.len(),
            request_id = %context.request_id,
            "enqueued"
        );
        Ok(response)
    }
}
