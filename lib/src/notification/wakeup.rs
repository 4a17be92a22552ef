//! The order of the wake-ups about to join: a tie-break among woken hosts that found the
//! same idle fleet at the same moment, so that a burst of commits starts one relay.
//!
//! A woken host that found uncovered buckets with messages writes one item (an
//! unconditional `PutItem`, never refused) into a partition of its own,
//! `{prefix}#WAKEUP`, whose sort key is its time (Unix ms, 20 digits) and its request id;
//! a short pause later it reads the partition's first item of the last
//! [`WAKEUP_WINDOW`] (one strongly consistent `Query`, `Limit` 1). The host whose item
//! comes first joins; every other one waits for that host's relay to cover the buckets.
//! Every host that reads after the first item landed sees the same first item, so two
//! hosts join together only when one item lands after another host's read while sorting
//! before it (a write slower than the pause).
//!
//! The items carry [`crate::attr::TIME_TO_LIVE`] ([`WAKEUP_LIFETIME`] ahead): DynamoDB's time
//! to live removes them at no cost, and the read's key condition skips any older than the
//! window, so an item that outlives its hour costs storage only. No relay of the
//! specification reads this partition; the stream mapping's filters drop its inserts.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::attr;
use crate::error::{from_sdk, Result};
use crate::protocol::schema;
use crate::protocol::store::DynamoDbOutboxStore;
use crate::ticks::unix_millis;

/// How far back the read looks for an earlier wake-up: one whose relay may still be on
/// its way (connecting to Kafka, writing its first heartbeat).
pub const WAKEUP_WINDOW: Duration = Duration::from_secs(3);
/// How long a wake-up item lives before DynamoDB's time to live may remove it.
pub const WAKEUP_LIFETIME: Duration = Duration::from_secs(3600);

/// Where a woken host stands among the wake-ups of its moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rank {
    /// No earlier wake-up in the window: this host joins.
    First,
    /// An earlier wake-up, written this long before this host's own.
    After(Duration),
}

/// The wake-up partition of `store`'s outbox.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WakeUps<'a> {
    pub(crate) store: &'a DynamoDbOutboxStore,
}

/// A wake-up as written: its time and sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Announced {
    at_ms: u64,
    sk: String,
}

impl WakeUps<'_> {
    /// Writes this host's wake-up, at the time of the store's clock.
    pub(crate) async fn announce(&self, request_id: &str) -> Result<Announced> {
        let keys = self.store.keys();
        let at_ms = unix_millis(self.store.clock().now_ticks());
        let sk = schema::wakeup_sk(at_ms, request_id);
        let mut item = keys.key(keys.wakeup_pk(), sk.clone());
        item.insert(
            attr::TIME_TO_LIVE.into(),
            AttributeValue::N((at_ms / 1000 + WAKEUP_LIFETIME.as_secs()).to_string()),
        );
        self.store
            .client()
            .put_item()
            .table_name(&self.store.options().table_name)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| from_sdk("PutItem", e))?;
        Ok(Announced { at_ms, sk })
    }

    /// Whether `mine` comes first among the wake-ups of the last [`WAKEUP_WINDOW`] before
    /// it (one strongly consistent query for the first item from there on).
    pub(crate) async fn rank(&self, mine: &Announced) -> Result<Rank> {
        let keys = self.store.keys();
        let from = mine.at_ms.saturating_sub(WAKEUP_WINDOW.as_millis() as u64);
        let out = self
            .store
            .client()
            .query()
            .table_name(&self.store.options().table_name)
            .key_condition_expression("#pk = :pk AND #sk >= :from")
            .expression_attribute_names("#pk", &keys.pk)
            .expression_attribute_names("#sk", &keys.sk)
            .expression_attribute_values(":pk", AttributeValue::S(keys.wakeup_pk()))
            .expression_attribute_values(":from", AttributeValue::S(schema::wakeup_sk(from, "")))
            .consistent_read(true)
            .limit(1)
            .send()
            .await
            .map_err(|e| from_sdk("Query", e))?;
        let first = out.items().first().map(|item| keys.key_of(item).1);
        Ok(match first {
            Some(sk) if sk < mine.sk.as_str() => {
                // The item's time, from its first 20 digits; one that does not parse (written
                // by someone else) counts as written at the window's start.
                let at = sk
                    .get(..20)
                    .and_then(|d| d.parse::<u64>().ok())
                    .unwrap_or(from);
                Rank::After(Duration::from_millis(mine.at_ms.saturating_sub(at)))
            }
            _ => Rank::First,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeups_sort_by_time_then_request_id() {
        let a = schema::wakeup_sk(1_700_000_000_000, "b");
        let b = schema::wakeup_sk(1_700_000_000_000, "c");
        let c = schema::wakeup_sk(1_700_000_000_001, "a");
        assert!(a < b && b < c, "{a} {b} {c}");
        assert_eq!(a, "00000001700000000000#b");
        // The window's lower bound sorts before every item of its millisecond.
        assert!(schema::wakeup_sk(1_700_000_000_000, "") < a);
    }
}
