//! Successors through the table's own stream: a leaving relay writes a continuation item,
//! and the stream's event source mapping invokes the relay function for its insert.
//!
//! No Lambda API call, so a relay in a VPC needs nothing beyond DynamoDB's gateway
//! endpoint to keep a backlog moving. The item:
//!
//! - lives in a partition of its own, `{prefix}#CONTINUATION#{relayId}`, with the run's
//!   start (Unix milliseconds, 20 digits) as its sort key: a new key per run, so a write
//!   retried after an ambiguous failure overwrites its own item (a `MODIFY` on the stream,
//!   which the mapping's filter drops) and never starts a second successor, and a write
//!   that did land is never missed;
//! - says everything a successor needs in its key (the stream is `KEYS_ONLY`): which outbox
//!   (the prefix, and the table from the stream's ARN) and which relay left;
//! - carries [`crate::attr::TIME_TO_LIVE`] (epoch seconds, [`CONTINUATION_LIFETIME`] ahead),
//!   so DynamoDB's time to live removes it at no cost; nothing reads it back, so no relay
//!   deletes it.
//!
//! Its shard is set by its key's hash, not by the writer: the successor may run at once
//! beside the leaver (another shard) or after the shard's current invocation ends. Either
//! way it joins as a successor (never answered "covered" by the leaver's leases): it takes
//! its share while the leaver runs and the rest once the leaver stops.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use tracing::warn;

use super::{Handoff, Successor};
use crate::attr;
use crate::error::{from_sdk, Result};
use crate::protocol::clock::Clock;
use crate::protocol::schema::{self, Keys};
use crate::protocol::store::DynamoDbOutboxStore;
use crate::ticks::unix_millis;

/// How long a continuation item lives before DynamoDB's time to live may remove it: far
/// longer than the stream keeps its insert (24 hours), so TTL never races the mapping.
pub const CONTINUATION_LIFETIME: Duration = Duration::from_secs(2 * 24 * 3600);

/// The first pause between two attempts at the write; it doubles per attempt, up to
/// [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two attempts.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Starts a successor by writing a continuation item into the outbox's table.
///
/// [`Successor::start`] retries a failed write (the same item, so never two successors)
/// until it lands or its caller's time runs out: the relay bounds it by the time left
/// before its stop.
#[derive(Debug, Clone)]
pub struct StreamSuccessor {
    client: aws_sdk_dynamodb::Client,
    table: String,
    keys: Keys,
    clock: Arc<dyn Clock>,
}

impl StreamSuccessor {
    /// Writes into the table and key layout of `store`.
    pub fn new(store: &DynamoDbOutboxStore) -> Self {
        StreamSuccessor {
            client: store.client().clone(),
            table: store.options().table_name.clone(),
            keys: store.keys().clone(),
            clock: store.clock().clone(),
        }
    }

    async fn put(&self, handoff: &Handoff) -> Result<()> {
        let mut item = self.keys.key(
            self.keys.continuation_pk(&handoff.predecessor),
            schema::continuation_sk(handoff.run_start_ms),
        );
        let now_secs = unix_millis(self.clock.now_ticks()) / 1000;
        let expires = now_secs + CONTINUATION_LIFETIME.as_secs();
        item.insert(
            attr::TIME_TO_LIVE.into(),
            AttributeValue::N(expires.to_string()),
        );
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| from_sdk("PutItem", e))?;
        Ok(())
    }
}

impl Successor for StreamSuccessor {
    fn start<'a>(
        &'a self,
        handoff: &'a Handoff,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            let mut pause = FIRST_RETRY_PAUSE;
            loop {
                match self.put(handoff).await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.is_retryable() => {
                        warn!(error = %crate::error::chain(&e), "writing the continuation failed; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_RETRY_PAUSE);
                    }
                    Err(e) => return Err(e),
                }
            }
        })
    }

    /// The same handoff writes the same item: a retry never makes a second successor.
    fn idempotent(&self) -> bool {
        true
    }
}

/// A continuation's key read back: which relay left, and when its run started (what the
/// Lambda handler reads from a stream record).
#[cfg(feature = "lambda")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContinuationKey {
    pub(crate) predecessor: String,
    pub(crate) run_start_ms: u64,
}

#[cfg(feature = "lambda")]
impl ContinuationKey {
    /// Reads a stream record's key of the outbox `keys` describes; `None` for any other item
    /// (another prefix, another partition kind, a sort key that is not a run start).
    pub(crate) fn parse(keys: &Keys, pk: &str, sk: &str) -> Option<Self> {
        let predecessor = pk.strip_prefix(&keys.continuations_prefix())?;
        if predecessor.is_empty() || sk.len() != 20 || !sk.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(ContinuationKey {
            predecessor: predecessor.to_owned(),
            run_start_ms: sk.parse().ok()?,
        })
    }
}

#[cfg(all(test, feature = "lambda"))]
mod tests {
    use super::*;
    use crate::options::OutboxOptions;

    #[test]
    fn a_continuation_key_reads_back_and_other_keys_do_not() {
        let keys = Keys::new(&OutboxOptions::new("t"));
        let pk = keys.continuation_pk("relay-fn-3f2a#x");
        let sk = schema::continuation_sk(1_764_547_200_123);
        assert_eq!(pk, "OUTBOX#CONTINUATION#relay-fn-3f2a#x");
        assert_eq!(sk, "00000001764547200123");
        assert_eq!(
            ContinuationKey::parse(&keys, &pk, &sk),
            Some(ContinuationKey {
                predecessor: "relay-fn-3f2a#x".into(),
                run_start_ms: 1_764_547_200_123
            })
        );
        for (pk, sk) in [
            ("OUTBOX#CONTINUATION#", sk.as_str()),
            ("OUTBOX#MESSAGES#3", sk.as_str()),
            ("OTHER#CONTINUATION#r", sk.as_str()),
            (pk.as_str(), "1764547200123"),
            (pk.as_str(), "0000000176454720012x"),
        ] {
            assert_eq!(ContinuationKey::parse(&keys, pk, sk), None, "{pk} {sk}");
        }
    }
}
