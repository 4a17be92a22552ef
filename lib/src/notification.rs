//! Commit notifications between processes: what a writer sends after a commit so that a
//! relay wakes up without waiting for its next poll, and how a relay woken by one decides
//! whether it is needed at all.
//!
//! The transport is an Amazon EventBridge event (the enqueue function sends it when
//! `OUTBOX_NOTIFY_EVENT_BUS` is set; an EventBridge rule on the bus invokes the relay
//! function). The event's `source` is [`SOURCE`], its `detail-type` [`DETAIL_TYPE`], and its
//! `detail` a [`CommitNotification`]:
//!
//! ```json
//! {"table": "orders-outbox", "key_prefix": "OUTBOX", "bucket_count": 8, "buckets": [2, 5]}
//! ```
//!
//! A notification is only a hint: the write never depends on it, and a relay that never
//! receives one still finds the messages on its next poll.
//!
//! # No stampede
//! Every commit can send a notification, and every notification can start a relay
//! invocation. A relay started by one first reads the coordination partition once
//! (one strongly consistent `Query`, no write) and returns at once when [`uncovered`]
//! finds every notified bucket held by a live relay; only otherwise does it join the
//! fleet as a relay.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::options::OutboxOptions;
use crate::plan::{self, PlanInput};
use crate::store::leases::{Coordination, RelayRecord};

/// The `source` of a commit notification event.
pub const SOURCE: &str = "dynamo-outbox";
/// The `detail-type` of a commit notification event.
pub const DETAIL_TYPE: &str = "OutboxCommitted";

/// The `detail` of a commit notification: which outbox, and which of its buckets received
/// messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitNotification {
    /// The outbox table's name.
    pub table: String,
    /// The outbox's key prefix.
    pub key_prefix: String,
    /// The writer's bucket count (a relay with another count ignores the notification).
    pub bucket_count: u32,
    /// The buckets that received messages, ascending, without duplicates.
    pub buckets: Vec<u32>,
}

impl CommitNotification {
    /// The notification of a commit to `buckets` of the outbox `options` describes.
    pub fn new(options: &OutboxOptions, buckets: impl IntoIterator<Item = u32>) -> Self {
        let mut buckets: Vec<u32> = buckets.into_iter().collect();
        buckets.sort_unstable();
        buckets.dedup();
        CommitNotification {
            table: options.table_name.clone(),
            key_prefix: options.key_prefix.clone(),
            bucket_count: options.bucket_count,
            buckets,
        }
    }

    /// The event's `detail`, as the JSON text EventBridge's `PutEvents` takes.
    pub fn detail_json(&self) -> String {
        serde_json::to_string(self).expect("a notification always serializes")
    }

    /// Reads an EventBridge event as delivered to a Lambda function. `Ok(None)` when the
    /// event is not a commit notification (a schedule tick, a manual invoke); an
    /// [`Error::InvalidMessage`] naming the field when it says it is one but its `detail`
    /// breaks a rule.
    pub fn from_event(event: &Value) -> Result<Option<Self>> {
        let is_notification = event.get("source").and_then(Value::as_str) == Some(SOURCE)
            && event.get("detail-type").and_then(Value::as_str) == Some(DETAIL_TYPE);
        if !is_notification {
            return Ok(None);
        }
        let detail = event.get("detail").ok_or_else(|| Error::InvalidMessage {
            field: "detail".into(),
            rule: "a commit notification must have a detail".into(),
        })?;
        let notification: CommitNotification =
            serde_json::from_value(detail.clone()).map_err(|e| Error::InvalidMessage {
                field: "detail".into(),
                rule: format!("not a commit notification: {e}"),
            })?;
        if let Some(b) = notification
            .buckets
            .iter()
            .find(|b| **b >= notification.bucket_count)
        {
            return Err(Error::InvalidMessage {
                field: "detail.buckets".into(),
                rule: format!(
                    "bucket {b} is not below the bucket count {}",
                    notification.bucket_count
                ),
            });
        }
        Ok(Some(notification))
    }

    /// `None` when the notification is for the outbox `options` describes; otherwise why
    /// it is not (another table, key prefix or bucket count).
    pub fn mismatch(&self, options: &OutboxOptions) -> Option<String> {
        if self.table != options.table_name {
            Some(format!(
                "for table {:?}, not {:?}",
                self.table, options.table_name
            ))
        } else if self.key_prefix != options.key_prefix {
            Some(format!(
                "for key prefix {:?}, not {:?}",
                self.key_prefix, options.key_prefix
            ))
        } else if self.bucket_count != options.bucket_count {
            Some(format!(
                "for bucket count {}, not {}",
                self.bucket_count, options.bucket_count
            ))
        } else {
            None
        }
    }
}

/// How recent a relay's heartbeat must be for [`uncovered`] to count the claims of the
/// round that heartbeat started: longer than a round takes from its heartbeat to its
/// claims (the first round of a relay waits [`crate::relay::JOIN_DELAY`] in between).
pub const ROUND_WINDOW: Duration = Duration::from_secs(1);

/// Which of `buckets` no live relay publishes or is about to claim, by one read of the
/// coordination partition at `now` (UTC ticks). Pure.
///
/// A relay counts when it is active (heartbeat younger than `lease_ticks`, not stamped
/// stopped) and does not announce a stop (`StopsAtUtc`) within `soon_ticks`. A bucket is
/// covered when its lease is unlapsed and names such a relay (it probes the bucket every
/// poll interval), or when such a relay is in the middle of an acquisition round (its
/// heartbeat is younger than `round_ticks`) whose plan, computed from this read as that
/// relay computes it, claims the bucket: a relay that has just joined. Every other bucket
/// is uncovered, also one that a live relay would claim only at its next round (up to a
/// renew interval away): the notified invocation joins instead.
pub fn uncovered(
    coordination: &Coordination,
    buckets: &[u32],
    bucket_count: u32,
    now: i64,
    lease_ticks: i64,
    soon_ticks: i64,
    round_ticks: i64,
) -> Vec<u32> {
    let live: Vec<&RelayRecord> = coordination
        .relays
        .iter()
        .filter(|r| {
            r.is_active(now, lease_ticks)
                && r.stops_at
                    .is_none_or(|s| s > now.saturating_add(soon_ticks))
        })
        .collect();
    let mut covered = vec![false; bucket_count as usize];
    for l in &coordination.leases {
        if l.bucket < bucket_count
            && l.expires_at > now
            && l.owner
                .as_deref()
                .is_some_and(|o| live.iter().any(|r| r.relay_id == o))
        {
            covered[l.bucket as usize] = true;
        }
    }
    let active = coordination.active_relays(now, lease_ticks);
    let leases = coordination.lease_views(now);
    for joining in live
        .iter()
        .filter(|r| now.saturating_sub(r.last_seen) <= round_ticks)
    {
        let plan = plan::compute(&PlanInput {
            bucket_count,
            me: &joining.relay_id,
            active_relays: &active,
            leases: &leases,
        });
        for b in plan.claim {
            covered[b as usize] = true;
        }
    }
    buckets
        .iter()
        .copied()
        .filter(|b| !covered.get(*b as usize).copied().unwrap_or(false))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::leases::LeaseRecord;
    use serde_json::json;

    const LEASE: i64 = 30;
    const SOON: i64 = 10;
    const ROUND: i64 = 2;
    const NOW: i64 = 1_000;

    fn relay(id: &str, last_seen: i64) -> RelayRecord {
        RelayRecord {
            relay_id: id.into(),
            last_seen,
            stopped_at: None,
            stops_at: None,
        }
    }

    fn lease(bucket: u32, owner: &str, expires_at: i64) -> LeaseRecord {
        LeaseRecord {
            bucket,
            owner: Some(owner.into()),
            expires_at,
        }
    }

    fn check(c: &Coordination, buckets: &[u32]) -> Vec<u32> {
        uncovered(c, buckets, 4, NOW, LEASE, SOON, ROUND)
    }

    #[test]
    fn live_owners_cover_their_buckets() {
        let c = Coordination {
            leases: (0..4).map(|b| lease(b, "a", NOW + 20)).collect(),
            relays: vec![relay("a", NOW - 5)],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), Vec::<u32>::new());
    }

    #[test]
    fn nobody_alive_covers_nothing() {
        // a's heartbeat is older than the lease duration; its leases have not lapsed yet.
        let c = Coordination {
            leases: (0..4).map(|b| lease(b, "a", NOW + 1)).collect(),
            relays: vec![relay("a", NOW - LEASE)],
        };
        assert_eq!(check(&c, &[1, 3]), vec![1, 3]);
        assert_eq!(check(&Coordination::default(), &[0]), vec![0]);
    }

    #[test]
    fn stopped_or_soon_stopping_relays_do_not_count() {
        let mut stopped = relay("a", NOW - 1);
        stopped.stopped_at = Some(NOW - 1);
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![stopped],
        };
        assert_eq!(check(&c, &[0]), vec![0]);

        let mut leaving = relay("a", NOW - 1);
        leaving.stops_at = Some(NOW + SOON);
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![leaving.clone()],
        };
        assert_eq!(check(&c, &[0]), vec![0]);
        // ...also with a live successor, which takes the bucket over only after the stop.
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![leaving, relay("b", NOW - 1)],
        };
        assert_eq!(check(&c, &[0]), vec![0]);
        // A stop announced further out still counts.
        let mut staying = relay("a", NOW - 1);
        staying.stops_at = Some(NOW + SOON + 1);
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![staying],
        };
        assert_eq!(check(&c, &[0]), Vec::<u32>::new());
    }

    #[test]
    fn free_lapsed_or_dead_relays_buckets_are_uncovered_with_a_fleet_between_rounds() {
        // a holds 0 (live) and 1 (lapsed); 2 has no lease item; 3 is held by a relay
        // without a heartbeat. a is between rounds (heartbeat 5 ticks ago): it would
        // claim 1 and 2 only at its next round, so the notified invocation joins.
        let c = Coordination {
            leases: vec![
                lease(0, "a", NOW + 20),
                lease(1, "a", NOW),
                lease(3, "dead", NOW + 20),
            ],
            relays: vec![relay("a", NOW - 5)],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), vec![1, 2, 3]);
        // A bucket beyond the count is never covered.
        assert_eq!(check(&c, &[7]), vec![7]);
    }

    #[test]
    fn a_relay_in_its_round_covers_what_its_plan_claims() {
        // "new" has just written its first heartbeat and holds nothing: its round is
        // about to claim its share of the free buckets. "a" is between rounds.
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20), lease(3, "dead", NOW + 20)],
            relays: vec![relay("a", NOW - 5), relay("new", NOW - 1)],
        };
        // Shares of 4 buckets over a and new: 2 each; new's range is 2..4. It claims 2
        // (3 is held by the dead relay until it lapses); 1 waits for a's next round.
        assert_eq!(check(&c, &[1, 2, 3]), vec![1, 3]);
        // Alone on an empty table, a joiner covers everything.
        let c = Coordination {
            leases: vec![],
            relays: vec![relay("new", NOW - 1)],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), Vec::<u32>::new());
        // ...unless it is about to stop.
        let mut leaving = relay("new", NOW - 1);
        leaving.stops_at = Some(NOW + 1);
        let c = Coordination {
            leases: vec![],
            relays: vec![leaving],
        };
        assert_eq!(check(&c, &[0]), vec![0]);
    }

    #[test]
    fn a_fleet_holding_every_bucket_covers_them_all_standbys_included() {
        let c = Coordination {
            leases: vec![
                lease(0, "a", NOW + 20),
                lease(1, "b", NOW + 20),
                lease(2, "c", NOW + 20),
                lease(3, "c", NOW + 20),
            ],
            relays: vec![
                relay("a", NOW - 1),
                relay("b", NOW - 1),
                relay("c", NOW - 1),
                relay("standby", NOW - 1),
            ],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), Vec::<u32>::new());
    }

    #[test]
    fn reads_events_and_names_what_is_wrong() {
        let options = OutboxOptions::new("orders-outbox");
        let n = CommitNotification::new(&options, [5, 2, 5]);
        assert_eq!(n.buckets, vec![2, 5]);
        let event = json!({
            "version": "0", "id": "1", "source": SOURCE, "detail-type": DETAIL_TYPE,
            "detail": serde_json::from_str::<Value>(&n.detail_json()).unwrap(),
        });
        assert_eq!(
            CommitNotification::from_event(&event).unwrap(),
            Some(n.clone())
        );
        assert_eq!(n.mismatch(&options), None);
        let other = OutboxOptions::new("other");
        assert!(n.mismatch(&other).unwrap().contains("other"));

        // A schedule tick or a manual invoke is no notification.
        for e in [
            json!({}),
            json!({"source": "dynamo-outbox.schedule"}),
            json!(null),
        ] {
            assert_eq!(CommitNotification::from_event(&e).unwrap(), None);
        }
        let mut bad = event.clone();
        bad["detail"]["buckets"] = json!([8]);
        let e = CommitNotification::from_event(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("detail.buckets:"), "{e}");
        bad["detail"] = json!({"table": 3});
        let e = CommitNotification::from_event(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("detail:"), "{e}");
    }
}
