//! The enqueue API as an AWS Lambda function: other services invoke it directly (IAM) with
//! the JSON request of [`dynamo_outbox::enqueue_request`] and get each message's id, bucket
//! and sequence back. The function is the Lambda glue around the library's
//! [`EnqueueService`] (parsing and checks, one transaction, the idempotency marker, the
//! commit notification: see [`dynamo_outbox::enqueue`]), which `outboxctl enqueue` runs
//! too. A rejected request fails with `errorType` `ValidationError` and writes nothing.
//!
//! Each message carries the caller's trace context as `traceparent` / `tracestate`
//! headers: the request's `traceparent` field when it has one (a malformed one is a
//! `ValidationError`), else the invocation's X-Ray trace header (`Lambda-Runtime-Trace-Id`:
//! `Root=1-{8 hex}-{24 hex};Parent={16 hex};Sampled=1` becomes `00-{the 32 hex}-{parent}-01`;
//! a malformed header is dropped with one warning per invocation, quoting at most 64 bytes
//! of it), else none; a message with a `traceparent` header of its own keeps it.
//!
//! The DynamoDB client is built once per execution environment (in `main`). The write
//! gives up [`DEADLINE_MARGIN`] before the invocation's deadline, so that the function
//! returns an error instead of being timed out; the commit notification never waits for
//! more than [`NOTIFY_TIMEOUT`], never past that deadline, and never fails the call.
//!
//! # Environment
//! Everything [`OutboxOptions::from_env`] reads, [`env::IDEMPOTENCY_RETENTION`]
//! (`OUTBOX_IDEMPOTENCY_RETENTION`, default 24h) and [`env::NOTIFY_EVENT_BUS`]
//! (`OUTBOX_NOTIFY_EVENT_BUS`, default none).

use std::time::{Duration, SystemTime};

use dynamo_outbox::enqueue::EnqueueService;
use dynamo_outbox::enqueue_request::EnqueueResponse;
pub use dynamo_outbox::lambda::FunctionError;
use dynamo_outbox::notification::EventBridgeNotifier;
#[cfg(doc)]
use dynamo_outbox::notification::NOTIFY_TIMEOUT;
#[cfg(doc)]
use dynamo_outbox::OutboxOptions;
use dynamo_outbox::TraceContext;
use lambda_runtime::LambdaEvent;
use tokio::time::Instant;
use tracing::Instrument;

/// Environment variables of the enqueue function (besides the library's).
pub mod env {
    /// How long an idempotency key answers with the first call's response (24h).
    pub const IDEMPOTENCY_RETENTION: &str = dynamo_outbox::enqueue::IDEMPOTENCY_RETENTION;
    /// Event bus (name or ARN) for commit notifications; unset or empty for none.
    pub const NOTIFY_EVENT_BUS: &str = dynamo_outbox::notification::NOTIFY_EVENT_BUS;
}

/// Time kept free before the invocation's deadline: the write is abandoned then, so the
/// function returns an error instead of being timed out.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// The enqueue function: the enqueue service of one execution environment and the handler.
#[derive(Debug, Clone)]
pub struct EnqueueFunction {
    service: EnqueueService,
}

impl EnqueueFunction {
    /// The function over `client` (built once per execution environment).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        options: dynamo_outbox::OutboxOptions,
    ) -> dynamo_outbox::Result<Self> {
        Ok(EnqueueFunction {
            service: EnqueueService::new(client, options)?,
        })
    }

    /// The function as the environment configures it ([`EnqueueService::from_lookup`]):
    /// the outbox options, [`env::IDEMPOTENCY_RETENTION`] and [`env::NOTIFY_EVENT_BUS`],
    /// read through `lookup` (the process environment, or a stand-in); the clients are
    /// built for `config`.
    pub fn from_lookup(
        config: &aws_config::SdkConfig,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> dynamo_outbox::Result<Self> {
        Ok(EnqueueFunction {
            service: EnqueueService::from_lookup(config, lookup)?,
        })
    }

    /// Sends a commit notification through `notifier` after every commit.
    pub fn with_notifier(mut self, notifier: EventBridgeNotifier) -> Self {
        self.service = self.service.with_notifier(notifier);
        self
    }

    /// Sets how long an idempotency key answers with the first call's response.
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.service = self.service.with_idempotency_retention(retention);
        self
    }

    /// The commit notifier, when one is configured.
    pub fn notifier(&self) -> Option<&EventBridgeNotifier> {
        self.service.notifier()
    }

    /// The enqueue service the function runs.
    pub fn service(&self) -> &EnqueueService {
        &self.service
    }

    /// Handles one invocation: the payload through
    /// [`EnqueueService::enqueue_json_for_invocation`] (a request without an
    /// `idempotency_key` is keyed by the invocation's request id, which Lambda's
    /// asynchronous retries keep), bounded by the invocation's deadline minus
    /// [`DEADLINE_MARGIN`].
    pub async fn handle(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<EnqueueResponse, FunctionError> {
        let (payload, context) = event.into_parts();
        // No usable deadline (a local emulator): the SDK's own timeouts bound the write.
        let deadline = dynamo_outbox::lambda::time_left(context.deadline, SystemTime::now())
            .map(|left| Instant::now() + left.saturating_sub(DEADLINE_MARGIN));
        // The caller's trace: the request's traceparent when it has one, else the
        // invocation's X-Ray trace header in W3C form (a malformed one is dropped with one
        // warning per invocation).
        let xray = context
            .xray_trace_id
            .as_deref()
            .and_then(TraceContext::from_invocation_xray);
        // Without a caller's idempotency key, the request id is the key: the retries of an
        // asynchronous invocation carry the first attempt's, so a write that committed is
        // not written again under new message ids.
        let outcome = self
            .service
            .enqueue_json_for_invocation(&payload, deadline, xray.as_ref(), &context.request_id)
            .instrument(tracing::info_span!("enqueue", request_id = %context.request_id))
            .await?;
        Ok(outcome.response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_retention_is_a_misconfiguration() {
        let e =
            dynamo_outbox::enqueue::retention_from_lookup(|_| Some("a while".into())).unwrap_err();
        assert!(e.to_string().starts_with(env::IDEMPOTENCY_RETENTION), "{e}");
        assert_eq!(FunctionError::from(e).error_type, "Misconfiguration");
    }
}
