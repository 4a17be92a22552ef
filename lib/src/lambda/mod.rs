//! Lambda glue shared by the functions (feature `lambda`): the error a handler returns,
//! whose `errorType` is [`Error::error_type`], and the time an invocation has left.

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
