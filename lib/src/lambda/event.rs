//! What a Lambda invocation's payload says, read with the `aws_lambda_events` types:
//! a commit notification delivered by an EventBridge rule, a doorbell (a batch of the
//! table's DynamoDB stream records, delivered by an event source mapping), a leaving
//! relay's request for a successor ([`Handoff`]), or anything else (a schedule tick, a
//! manual invoke). The only place of the crate that parses Lambda's events.

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde_json::Value;
use tracing::warn;

use crate::error::{Error, Result};
use crate::notification::{CommitNotification, ContinuationKey, Handoff, DETAIL_TYPE, SOURCE};
use crate::options::OutboxOptions;
use crate::protocol::schema::Keys;

/// Why a relay invocation was started, as its payload says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Anything that is not a commit notification: the schedule's tick (`scheduled`: the
    /// payload is the template's schedule input, `{"source": "dynamo-outbox.schedule"}`),
    /// a manual invoke.
    Tick {
        /// Whether the schedule sent it.
        scheduled: bool,
    },
    /// A commit notification from the event bus.
    Notification(CommitNotification),
    /// A doorbell: the table's stream saw messages inserted into these buckets of the
    /// outbox `options` describes (by any writer). Records of other outboxes or of
    /// other items are left out; a doorbell with no bucket left rang for another outbox.
    Doorbell(CommitNotification),
    /// A relay that left with work in its buckets started this one as its successor: by
    /// invoking it, or by writing a continuation whose insert the stream delivered
    /// ([`crate::notification::StreamSuccessor`]; the handoff's buckets are then those of
    /// the messages in the same batch, often none).
    Successor(Handoff),
}

impl Wake {
    /// Reads an invocation's payload for the outbox `options` describes. An
    /// [`Error::InvalidMessage`] naming the field when the payload says it is a commit
    /// notification but breaks a rule. A doorbell is never an error (an error would make
    /// Lambda retry the batch and hold up the stream's shard): one whose records cannot be
    /// read rings every bucket.
    pub(crate) fn from_payload(payload: &Value, options: &OutboxOptions) -> Result<Wake> {
        if is_stream_event(payload) {
            let (rung, continuation) = stream_records(payload, options);
            return Ok(match continuation {
                Some(c) => Wake::Successor(
                    Handoff::new(options, &c.predecessor, rung.buckets)
                        .with_run_start_ms(c.run_start_ms),
                ),
                None => Wake::Doorbell(rung),
            });
        }
        if let Some(handoff) = super::successor::from_payload(payload)? {
            return Ok(Wake::Successor(handoff));
        }
        Ok(match CommitNotification::from_event(payload)? {
            Some(n) => Wake::Notification(n),
            None => Wake::Tick {
                scheduled: payload.get("source").and_then(Value::as_str) == Some(SCHEDULE_SOURCE),
            },
        })
    }
}

/// The `source` of the template's schedule input.
pub(crate) const SCHEDULE_SOURCE: &str = "dynamo-outbox.schedule";

/// Whether the payload is a batch of DynamoDB stream records (`Records` whose first
/// record's `eventSource` is `aws:dynamodb`).
fn is_stream_event(payload: &Value) -> bool {
    payload
        .get("Records")
        .and_then(Value::as_array)
        .and_then(|r| r.first())
        .and_then(|r| r.get("eventSource"))
        .and_then(Value::as_str)
        == Some("aws:dynamodb")
}

/// What a batch of stream records says for this outbox: the buckets of the message items
/// it reports inserted, and the first continuation it reports inserted (a leaving relay
/// asking for its successor: the batch then starts a successor, whatever else it holds).
/// Records of other tables, other prefixes and other items are left out; records that
/// cannot be read ring every bucket.
fn stream_records(
    payload: &Value,
    options: &OutboxOptions,
) -> (CommitNotification, Option<ContinuationKey>) {
    let event = match serde_json::from_value::<StreamEvent>(payload.clone()) {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %crate::error::chain(&e), "a doorbell whose stream records cannot be read: checking every bucket");
            return (
                CommitNotification::new(options, 0..options.bucket_count),
                None,
            );
        }
    };
    let keys = Keys::new(options);
    let mut buckets = Vec::new();
    let mut continuation = None;
    for r in &event.records {
        if r.event_name != "INSERT" {
            continue;
        }
        if let Some(table) = r.event_source_arn.as_deref().and_then(table_of_stream_arn) {
            if table != options.table_name {
                continue;
            }
        }
        let Ok(keys_json) = serde_json::to_value(&r.change.keys) else {
            continue;
        };
        let key = |name: &str| keys_json.get(name)?.get("S")?.as_str();
        let Some(pk) = key(&keys.pk) else {
            continue;
        };
        if let Some(b) = keys
            .message_bucket(pk)
            .filter(|b| *b < options.bucket_count)
        {
            buckets.push(b);
        } else if continuation.is_none() {
            continuation = key(&keys.sk).and_then(|sk| ContinuationKey::parse(&keys, pk, sk));
        }
    }
    (CommitNotification::new(options, buckets), continuation)
}

/// The table name of a stream ARN (`arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/TIME`).
fn table_of_stream_arn(arn: &str) -> Option<&str> {
    let resource = arn.splitn(6, ':').nth(5)?;
    let rest = resource.strip_prefix("table/")?;
    rest.split('/').next()
}

impl CommitNotification {
    /// Reads an EventBridge event as delivered to a Lambda function
    /// (`aws_lambda_events`' `EventBridgeEvent`). `Ok(None)` when the
    /// event is not a commit notification (a schedule tick, a manual invoke); an
    /// [`Error::InvalidMessage`] naming the field when it says it is one but its `detail`
    /// breaks a rule.
    pub fn from_event(event: &Value) -> Result<Option<Self>> {
        let says_notification = event.get("source").and_then(Value::as_str) == Some(SOURCE)
            && event.get("detail-type").and_then(Value::as_str) == Some(DETAIL_TYPE);
        if !says_notification {
            return Ok(None);
        }
        let event =
            serde_json::from_value::<EventBridgeEvent<Value>>(event.clone()).map_err(|e| {
                Error::InvalidMessage {
                    field: "detail".into(),
                    rule: format!("a commit notification must be an EventBridge event: {e}"),
                }
            })?;
        if event.detail.is_null() {
            return Err(Error::InvalidMessage {
                field: "detail".into(),
                rule: "a commit notification must have a detail".into(),
            });
        }
        let notification: CommitNotification =
            serde_json::from_value(event.detail).map_err(|e| Error::InvalidMessage {
                field: "detail".into(),
                rule: format!("not a commit notification: {e}"),
            })?;
        notification.validate()?;
        Ok(Some(notification))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::OutboxOptions;
    use serde_json::json;

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

        assert_eq!(
            Wake::from_payload(&event, &options).unwrap(),
            Wake::Notification(n.clone())
        );
        // A schedule tick or a manual invoke is no notification.
        let tick = json!({"version": "0", "id": "2", "source": "aws.events",
            "detail-type": "Scheduled Event", "detail": {}});
        assert_eq!(
            Wake::from_payload(&tick, &options).unwrap(),
            Wake::Tick { scheduled: false }
        );
        assert_eq!(
            Wake::from_payload(&json!({"source": SCHEDULE_SOURCE}), &options).unwrap(),
            Wake::Tick { scheduled: true }
        );
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

    fn stream_record(arn: &str, name: &str, pk: &str) -> Value {
        stream_record_sk(arn, name, pk, "0000000000000000001")
    }

    fn stream_record_sk(arn: &str, name: &str, pk: &str, sk: &str) -> Value {
        json!({
            "eventID": "1", "eventName": name, "eventVersion": "1.1",
            "eventSource": "aws:dynamodb", "awsRegion": "eu-west-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1_764_547_200.0,
                "Keys": {"PK": {"S": pk}, "SK": {"S": sk}},
                "SequenceNumber": "100", "SizeBytes": 40, "StreamViewType": "KEYS_ONLY"
            },
            "eventSourceARN": arn
        })
    }

    #[test]
    fn a_doorbell_rings_the_buckets_of_inserted_messages_of_this_outbox_only() {
        let options = OutboxOptions::new("orders-outbox").with_bucket_count(8);
        let arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders-outbox/stream/2026-12-01T00:00:00.000";
        let other =
            "arn:aws:dynamodb:eu-west-1:123456789012:table/other/stream/2026-12-01T00:00:00.000";
        let event = json!({"Records": [
            stream_record(arn, "INSERT", "OUTBOX#MESSAGES#5"),
            stream_record(arn, "INSERT", "OUTBOX#MESSAGES#2"),
            stream_record(arn, "INSERT", "OUTBOX#MESSAGES#5"),
            stream_record(arn, "REMOVE", "OUTBOX#MESSAGES#3"),
            stream_record(arn, "INSERT", "OUTBOX#SEQUENCE#4"),
            stream_record(arn, "INSERT", "OTHER#MESSAGES#6"),
            stream_record(arn, "INSERT", "OUTBOX#MESSAGES#9"),
            stream_record(other, "INSERT", "OUTBOX#MESSAGES#7"),
        ]});
        let Wake::Doorbell(n) = Wake::from_payload(&event, &options).unwrap() else {
            panic!("not a doorbell");
        };
        assert_eq!(n.buckets, vec![2, 5]);
        assert_eq!(n.mismatch(&options), None);

        // Another outbox's doorbell rings nothing.
        let event = json!({"Records": [stream_record(other, "INSERT", "OUTBOX#MESSAGES#1")]});
        let Wake::Doorbell(n) = Wake::from_payload(&event, &options).unwrap() else {
            panic!("not a doorbell");
        };
        assert!(n.buckets.is_empty());

        // Records that cannot be read ring every bucket, never an error.
        let event = json!({"Records": [{"eventSource": "aws:dynamodb", "dynamodb": 7}]});
        let Wake::Doorbell(n) = Wake::from_payload(&event, &options).unwrap() else {
            panic!("not a doorbell");
        };
        assert_eq!(n.buckets, (0..8).collect::<Vec<_>>());
        assert_eq!(table_of_stream_arn(arn), Some("orders-outbox"));
        assert_eq!(table_of_stream_arn("nonsense"), None);
    }

    #[test]
    fn a_continuation_insert_starts_a_successor_and_its_rewrite_does_not() {
        let options = OutboxOptions::new("orders-outbox").with_bucket_count(8);
        let arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders-outbox/stream/2026-12-01T00:00:00.000";
        let run = "00000001764547200123";
        let event = json!({"Records": [
            stream_record(arn, "INSERT", "OUTBOX#MESSAGES#5"),
            stream_record_sk(arn, "INSERT", "OUTBOX#CONTINUATION#fn-req-1", run),
        ]});
        let Wake::Successor(h) = Wake::from_payload(&event, &options).unwrap() else {
            panic!("not a successor");
        };
        assert_eq!(h.predecessor, "fn-req-1");
        assert_eq!(h.run_start_ms, 1_764_547_200_123);
        assert_eq!(h.buckets, vec![5]);
        // A retried write is a MODIFY: no second successor, only a doorbell (none here).
        let event = json!({"Records": [
            stream_record_sk(arn, "MODIFY", "OUTBOX#CONTINUATION#fn-req-1", run),
        ]});
        let Wake::Doorbell(n) = Wake::from_payload(&event, &options).unwrap() else {
            panic!("not a doorbell");
        };
        assert!(n.buckets.is_empty());
        // Another outbox's continuation (prefix or table) starts nothing here.
        let other =
            "arn:aws:dynamodb:eu-west-1:123456789012:table/other/stream/2026-12-01T00:00:00.000";
        for event in [
            json!({"Records": [stream_record_sk(arn, "INSERT", "BILLING#CONTINUATION#r", run)]}),
            json!({"Records": [stream_record_sk(other, "INSERT", "OUTBOX#CONTINUATION#r", run)]}),
            json!({"Records": [stream_record_sk(arn, "INSERT", "OUTBOX#CONTINUATION#r", "x")]}),
        ] {
            assert!(
                matches!(
                    Wake::from_payload(&event, &options).unwrap(),
                    Wake::Doorbell(_)
                ),
                "{event}"
            );
        }
    }
}
