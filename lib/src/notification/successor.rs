//! Successors: a relay whose run ends with work left starts the next relay before it
//! leaves, so that a backlog never waits for the next schedule tick.
//!
//! A host with a deadline (a Lambda invocation) cannot outlive it. When the relay reaches
//! its deadline minus [`SUCCESSOR_LEAD`] and a bucket it owns still has messages it could
//! publish (more fetched than it had time for, or a publish that failed and waits for its
//! retry), it asks its [`Successor`] to start one more relay, once per run; a run that
//! found none then looks once more when its work ends, for what arrived since (that
//! successor starts as the leaver stops: a cold start's gap), unless its host says that
//! its wake-ups queue behind it ([`crate::Relay::with_successor_at_end`]). A successor started at the
//! lead joins while the leaver still runs and takes its share of the buckets at once (the lease
//! plan splits them between two live relays); it reads the leaver's announced stop and
//! takes the rest a couple of handover steps after it: the same handover as between any
//! two relays, with no bucket unowned for longer than that.
//!
//! A bucket parked behind an item it cannot publish (a poison item, a topic outside the
//! allow-list) is not work left: no relay can move it until an operator does, and the
//! stuck-outbox and poison alarms say so. A run shorter than [`SUCCESSOR_LEAD`] starts no
//! successor, so a chain of successors starts at most one relay per
//! [`SUCCESSOR_LEAD`] per relay of the fleet; with the Lambda function's defaults (a run
//! of about a minute), about one invocation per relay per minute while nothing can
//! progress (Kafka refusing, a topic not authorized).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::options::OutboxOptions;

/// How long before the end of its work a relay with work left starts its successor: the
/// successor's start (a cold start, the Kafka connection) and its first round fit in it.
pub const SUCCESSOR_LEAD: Duration = Duration::from_secs(10);

/// The key of a successor request in an invocation's payload.
pub const SUCCESSOR_KEY: &str = "outbox_successor";

/// What a leaving relay tells its successor (the payload's [`SUCCESSOR_KEY`] object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Handoff {
    /// The outbox table's name.
    pub table: String,
    /// The outbox's key prefix.
    pub key_prefix: String,
    /// The relay's bucket count.
    pub bucket_count: u32,
    /// The leaving relay's id.
    pub predecessor: String,
    /// The buckets it owned with work left.
    pub buckets: Vec<u32>,
}

impl Handoff {
    /// The handoff of `predecessor`, leaving `buckets` of the outbox `options` describes.
    pub fn new(options: &OutboxOptions, predecessor: &str, buckets: Vec<u32>) -> Self {
        Handoff {
            table: options.table_name.clone(),
            key_prefix: options.key_prefix.clone(),
            bucket_count: options.bucket_count,
            predecessor: predecessor.to_owned(),
            buckets,
        }
    }

    /// The invocation payload that carries it: `{"outbox_successor": {...}}`.
    pub fn to_payload(&self) -> Value {
        serde_json::json!({ SUCCESSOR_KEY: self })
    }

    /// The handoff a payload carries: `Ok(None)` when the payload is not a successor
    /// request; an error naming the field when it says it is one but breaks a rule.
    pub fn from_payload(payload: &Value) -> Result<Option<Self>> {
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
}

/// Starts a successor relay (asynchronously: `start` returns once the start is requested,
/// not when the successor runs).
pub trait Successor: Debug + Send + Sync {
    /// Requests one more relay, which receives `handoff`.
    fn start<'a>(
        &'a self,
        handoff: &'a Handoff,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;
}

#[cfg(feature = "lambda")]
pub use lambda::LambdaSuccessor;

#[cfg(feature = "lambda")]
mod lambda {
    use std::future::Future;
    use std::pin::Pin;

    use aws_sdk_lambda::primitives::Blob;
    use aws_sdk_lambda::types::InvocationType;

    use super::{Handoff, Successor};
    use crate::error::{Error, Result};

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
        ///
        /// # Examples
        /// ```no_run
        /// use std::sync::Arc;
        /// use dynamo_outbox::notification::LambdaSuccessor;
        ///
        /// # async fn example(
        /// #     relay: dynamo_outbox::Relay<dynamo_outbox::publish::LazyKafkaPublisher>,
        /// # ) {
        /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        /// let successor = LambdaSuccessor::new(
        ///     aws_sdk_lambda::Client::new(&sdk),
        ///     std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default(),
        /// );
        /// let relay = relay.with_successor(Arc::new(successor));
        /// # }
        /// ```
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
                    serde_json::to_vec(&handoff.to_payload()).expect("a handoff always serializes");
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_round_trips_through_its_payload_and_bad_ones_name_the_field() {
        let options = OutboxOptions {
            bucket_count: 4,
            ..OutboxOptions::new("orders-outbox")
        };
        let h = Handoff::new(&options, "relay-1", vec![1, 3]);
        let payload = h.to_payload();
        assert_eq!(payload["outbox_successor"]["predecessor"], "relay-1");
        assert_eq!(Handoff::from_payload(&payload).unwrap(), Some(h));
        assert_eq!(
            Handoff::from_payload(&serde_json::json!({"source": "aws.events"})).unwrap(),
            None
        );
        let bad = serde_json::json!({"outbox_successor": {"table": "t"}});
        let e = Handoff::from_payload(&bad).unwrap_err().to_string();
        assert!(e.contains("outbox_successor"), "{e}");
        let mut beyond = payload.clone();
        beyond["outbox_successor"]["buckets"] = serde_json::json!([4]);
        let e = Handoff::from_payload(&beyond).unwrap_err().to_string();
        assert!(
            e.contains("outbox_successor.buckets") && e.contains("bucket 4"),
            "{e}"
        );
    }
}
