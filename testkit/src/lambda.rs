//! Lambda invocations for the function crates' handler tests: one builder of the
//! `LambdaEvent` whose context carries what Lambda sends (request id, deadline, function
//! name).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lambda_runtime::{Config, Context, LambdaEvent};
use serde_json::Value;

/// The Unix milliseconds `time_left` from now, as Lambda's deadline header carries them.
pub fn deadline_in(time_left: Duration) -> u64 {
    (SystemTime::now() + time_left)
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// An invocation of `function` with `payload`, whose context has `request_id` and the
/// deadline `deadline_ms` (Unix milliseconds; 0 or a past one as a local emulator sends).
pub fn invocation(
    function: &str,
    request_id: &str,
    deadline_ms: u64,
    payload: Value,
) -> LambdaEvent<Value> {
    let mut context = Context::default();
    context.request_id = request_id.into();
    context.deadline = deadline_ms;
    context.env_config = Arc::new(Config {
        function_name: function.into(),
        ..Config::default()
    });
    LambdaEvent::new(payload, context)
}

/// An invocation of `function` with a fresh request id and `time_left` until its deadline.
pub fn invocation_in(function: &str, payload: Value, time_left: Duration) -> LambdaEvent<Value> {
    invocation(
        function,
        &uuid::Uuid::new_v4().to_string(),
        deadline_in(time_left),
        payload,
    )
}
