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
use crate::notification::{CommitNotification, Handoff, DETAIL_TYPE, SOURCE};
use crate::options::OutboxOptions;
use crate::protocol::schema::Keys;

/// Why a relay invocation was started, as its payload says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Anything that is not a commit notification: the schedule, a manual invoke.
    Tick,
    /// A commit notification from the event bus.
    Notification(CommitNotification),
    /// A doorbell: the table's stream saw messages inserted into these buckets of the
    /// outbox `options` describes (by any writer). Records of other outboxes or of
    /// other items are left out; a doorbell with no bucket left rang for another outbox.
    Doorbell(CommitNotification),
    /// A relay that left with work in its buckets started this one as its successor.
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
            return Ok(Wake::Doorbell(doorbell(payload, options)));
        }
        if let Some(handoff) = super::successor::from_payload(payload)? {
            return Ok(Wake::Successor(handoff));
        }
        Ok(match CommitNotification::from_event(payload)? {
            Some(n) => Wake::Notification(n),
            None => Wake::Tick,
        })
    }
}

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

/// The buckets of the outbox's message items that a stream event reports inserted.
fn doorbell(payload: &Value, options: &OutboxOptions) -> CommitNotification {
    let event = match serde_json::from_value::<StreamEvent>(payload.clone()) {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %crate::error::chain(&e), "a doorbell whose stream records cannot be read: checking every bucket");
            return CommitNotification::new(options, 0..options.bucket_count);
        }
    };
    let keys = Keys::new(options);
    let buckets = event.records.iter().filter_map(|r| {
        if r.event_name != "INSERT" {
            return None;
        }
        if let Some(table) = r.event_source_arn.as_deref().and_then(table_of_stream_arn) {
            if table != options.table_name {
                return None;
            }
        }
        let keys_json = serde_json::to_value(&r.change.keys).ok()?;
        let pk = keys_json.get(&keys.pk)?.get("S")?.as_str()?;
        keys.message_bucket(pk)
            .filter(|b| *b < options.bucket_count)
    });
    CommitNotification::new(options, buckets)
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
        assert_eq!(Wake::from_payload(&tick, &options).unwrap(), Wake::Tick);
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
        json!({
            "eventID": "1", "eventName": name, "eventVersion": "1.1",
            "eventSource": "aws:dynamodb", "awsRegion": "eu-west-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1_764_547_200.0,
                "Keys": {"PK": {"S": pk}, "SK": {"S": "0000000000000000001"}},
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
}
