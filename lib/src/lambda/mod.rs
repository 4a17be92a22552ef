//! The relay in a Lambda function of your own (feature `lambda`): the handler the
//! project's relay function runs ([`RelayHandler`], [`run`]), and the glue the functions
//! share (the error a handler returns, whose `errorType` is [`Error::error_type`], and the
//! time an invocation has left).
//!
//! One invocation runs one relay instance, with its own relay id, until the invocation's
//! deadline minus a shutdown margin (or a maximum run time, whichever comes first), then
//! stops gracefully so that its leases are released before Lambda can time the function
//! out. The DynamoDB client is built once per execution environment, before the runtime
//! loop; the Kafka publisher connects on first use and is reused by the warm invocations,
//! and is dropped (to be rebuilt by the next publish) when a run published nothing but
//! failed to publish. The invocation's EMF documents go to stdout (CloudWatch Logs) every
//! minute of a run and at its end.
//!
//! # Events
//! - A schedule tick, a manual invoke, any payload that is none of the below: the
//!   invocation runs a relay. With [`SuccessorMode::Stream`] the template's schedule tick
//!   (`{"source": "dynamo-outbox.schedule"}`) is a safety net behind the stream: it first
//!   decides for every bucket as a doorbell does, and adds a relay only for buckets no live
//!   relay holds that have messages.
//! - A commit notification (an EventBridge event of source
//!   [`crate::notification::SOURCE`], delivered by a rule on the bus) or a doorbell (a
//!   batch of the table's DynamoDB stream records, delivered by an event source mapping):
//!   the invocation decides first whether it is needed
//!   ([`crate::notification::decide`]); it returns at once (`stop_reason` `covered`,
//!   `empty` or `not_this_outbox`, no write) when live relays hold the notified buckets or
//!   nothing waits in them, and runs a relay otherwise. The decision never fails: a
//!   coverage read that fails (a throttle, a 5xx, a timeout) makes the invocation join,
//!   and Kafka is connected while deciding only as a head start. So a wake-up is never lost
//!   to a function error.
//! - A successor request: a run that reaches its deadline minus
//!   [`crate::notification::SUCCESSOR_LEAD`] with work left in its buckets (or finds some
//!   at its last look, [`crate::relay::SUCCESSOR_LAST_LOOK`] before its end of work)
//!   starts its successor, once per run, which runs a relay at once: it takes its share of
//!   the buckets as it joins and the rest at the leaver's stop. With
//!   [`SuccessorMode::Stream`] the request is a continuation item whose insert the table's
//!   stream delivers (a batch of stream records holding one starts a successor, never
//!   answered `covered`); with [`SuccessorMode::Invoke`] an asynchronous invocation of the
//!   same function ([`LambdaSuccessor`]) whose payload is this crate's own.
//!
//! # Environment
//! Everything [`HostSettings::from_lookup`](crate::host::HostSettings::from_lookup) reads,
//! and:
//! - [`env::MAX_RUN_TIME`] (`OUTBOX_MAX_RUN_TIME`, default 50s): longest run of one
//!   invocation, and the run time used when the invocation has no usable deadline.
//! - [`env::SHUTDOWN_MARGIN`] (`OUTBOX_SHUTDOWN_MARGIN`, default 3s): time left unused
//!   before the invocation's deadline; the graceful stop ends before it.
//! - [`env::SUCCESSOR`] (`OUTBOX_SUCCESSOR`: `stream`, `invoke` or `none`): how a run
//!   with work left starts its successor ([`SuccessorMode`]); unset, `invoke` inside Lambda.
//! - The standard OpenTelemetry variables ([`crate::host::OtlpSettings`] of
//!   [`crate::host::ExportMode::Invocation`]): with an OTLP endpoint (the ADOT collector
//!   layer's `http://localhost:4318`), the relay's publish spans are exported, flushed
//!   before each invocation returns.
//! - `OUTBOX_IDLE_STOP` defaults to [`DEFAULT_IDLE_STOP`] here (the library's default is
//!   never), and `OUTBOX_MAX_IN_FLIGHT_BYTES` to an eighth of the function's memory
//!   (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`; 16 MiB at the template's 128 MB).
//!
//! # Examples
//! A function of your own whose `main` runs the relay handler (the project's relay
//! function is this; `lib/examples/relay_in_your_own_lambda.rs` adds to it):
//! ```no_run
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     dynamo_outbox::logging::init_lambda();
//!     let handler = dynamo_outbox::lambda::RelayHandler::from_env().await?;
//!     dynamo_outbox::lambda::run(handler).await
//! }
//! ```

mod event;
mod handler;
mod successor;

pub use handler::{
    env, relay_id, run, run_deadline, DeadlineSource, Ending, RelayHandler, RelaySettings,
    RelaySummary, SuccessorMode, Trigger, DEFAULT_IDLE_STOP, DEFAULT_MAX_RUN_TIME,
    DEFAULT_SHUTDOWN_MARGIN,
};
pub use successor::LambdaSuccessor;

use std::fmt;
use std::time::{Duration, SystemTime};

use lambda_runtime::Diagnostic;

use crate::error::{chain, Error};

/// A function error: its `errorType` says what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionError {
    /// [`Error::error_type`]: `ValidationError`, `Misconfiguration`, `DynamoDb`, `Kafka`,
    /// `DeadlineExceeded`.
    pub error_type: &'static str,
    /// The error's text with its sources ([`chain`]); for a `ValidationError`,
    /// `field: rule`.
    pub message: String,
}

impl fmt::Display for FunctionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error_type, self.message)
    }
}

impl std::error::Error for FunctionError {}

impl From<Error> for FunctionError {
    fn from(e: Error) -> Self {
        FunctionError {
            error_type: e.error_type(),
            message: chain(&e),
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

/// The time an invocation has left at `now`, before its deadline `deadline_ms` (Unix
/// milliseconds, as `lambda_runtime::Context::deadline` says it); `None` when the
/// invocation has no usable deadline: zero (a local emulator) or not after `now`.
pub fn time_left(deadline_ms: u64, now: SystemTime) -> Option<Duration> {
    let deadline = SystemTime::UNIX_EPOCH + Duration::from_millis(deadline_ms);
    match deadline.duration_since(now) {
        Ok(left) if deadline_ms > 0 && !left.is_zero() => Some(left),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_or_past_deadline_leaves_no_time() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        };
        assert_eq!(
            time_left(ms(now + Duration::from_millis(1500)), now),
            Some(Duration::from_millis(1500))
        );
        for deadline_ms in [0, 1, ms(now), ms(now) - 5] {
            assert_eq!(time_left(deadline_ms, now), None, "{deadline_ms}");
        }
    }

    #[test]
    fn the_diagnostic_carries_the_error_type_and_the_whole_text() {
        let e = FunctionError::from(Error::InvalidMessage {
            field: "messages[3].topic".into(),
            rule: "must not be empty".into(),
        });
        assert_eq!(
            e.to_string(),
            "ValidationError: messages[3].topic: must not be empty"
        );
        let d = Diagnostic::from(e);
        assert_eq!(
            (d.error_type.as_str(), d.error_message.as_str()),
            ("ValidationError", "messages[3].topic: must not be empty")
        );
    }
}
