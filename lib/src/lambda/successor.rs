//! A relay function starting its successor with Lambda's `Invoke`.

use std::future::Future;
use std::pin::Pin;

use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::notification::{Handoff, Successor};

/// Starts the successor as an asynchronous invocation (`InvocationType=Event`) of a
/// Lambda function: the relay function invokes itself. Lambda queues the event and
/// answers at once; the function's `EventInvokeConfig` bounds its retries and age.
#[derive(Debug, Clone)]
pub struct LambdaSuccessor {
    client: aws_sdk_lambda::Client,
    function_name: String,
}

impl LambdaSuccessor {
    /// Invokes `function_name` (a name or an ARN) through `client`.
    pub fn new(client: aws_sdk_lambda::Client, function_name: impl Into<String>) -> Self {
        LambdaSuccessor {
            client,
            function_name: function_name.into(),
        }
    }

    /// The function it invokes.
    pub fn function_name(&self) -> &str {
        &self.function_name
    }
}

impl Successor for LambdaSuccessor {
    fn start<'a>(
        &'a self,
        handoff: &'a Handoff,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            let payload =
                serde_json::to_vec(&to_payload(handoff)).expect("a handoff always serializes");
            self.client
                .invoke()
                .function_name(&self.function_name)
                .invocation_type(InvocationType::Event)
                .payload(Blob::new(payload))
                .send()
                .await
                .map_err(|e| Error::Lambda {
                    operation: "Invoke",
                    source: Box::new(e),
                })?;
            Ok(())
        })
    }
}

/// The key of a successor request in an invocation's payload. The payload's shape is this
/// crate's own: a successor request is only ever written by [`LambdaSuccessor`] and read by
/// [`super::RelayHandler`].
pub(crate) const SUCCESSOR_KEY: &str = "outbox_successor";

/// The invocation payload that carries `handoff`: `{"outbox_successor": {...}}`.
pub(crate) fn to_payload(handoff: &Handoff) -> Value {
    serde_json::json!({ SUCCESSOR_KEY: handoff })
}

/// The handoff a payload carries: `Ok(None)` when the payload is not a successor request;
/// an error naming the field when it says it is one but breaks a rule.
pub(crate) fn from_payload(payload: &Value) -> Result<Option<Handoff>> {
    let Some(inner) = payload.get(SUCCESSOR_KEY) else {
        return Ok(None);
    };
    let handoff: Handoff =
        serde_json::from_value(inner.clone()).map_err(|e| Error::InvalidMessage {
            field: SUCCESSOR_KEY.into(),
            rule: format!("must be a successor request: {e}"),
        })?;
    if let Some(b) = handoff.buckets.iter().find(|b| **b >= handoff.bucket_count) {
        return Err(Error::InvalidMessage {
            field: format!("{SUCCESSOR_KEY}.buckets"),
            rule: format!(
                "bucket {b} is not below the bucket count {}",
                handoff.bucket_count
            ),
        });
    }
    Ok(Some(handoff))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::OutboxOptions;

    #[test]
    fn a_handoff_round_trips_through_its_payload_and_bad_ones_name_the_field() {
        let options = OutboxOptions {
            bucket_count: 4,
            ..OutboxOptions::new("orders-outbox")
        };
        let h = Handoff::new(&options, "relay-1", vec![1, 3]);
        let payload = to_payload(&h);
        assert_eq!(payload["outbox_successor"]["predecessor"], "relay-1");
        assert_eq!(from_payload(&payload).unwrap(), Some(h));
        assert_eq!(
            from_payload(&serde_json::json!({"source": "aws.events"})).unwrap(),
            None
        );
        let bad = serde_json::json!({"outbox_successor": {"table": "t"}});
        let e = from_payload(&bad).unwrap_err().to_string();
        assert!(e.contains("outbox_successor"), "{e}");
        let mut beyond = payload.clone();
        beyond["outbox_successor"]["buckets"] = serde_json::json!([4]);
        let e = from_payload(&beyond).unwrap_err().to_string();
        assert!(
            e.contains("outbox_successor.buckets") && e.contains("bucket 4"),
            "{e}"
        );
    }
}
