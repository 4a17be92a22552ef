//! What a Lambda invocation's payload says, read with the `aws_lambda_events` types:
//! a commit notification delivered by an EventBridge rule, or anything else (a schedule
//! tick, a manual invoke). Behind the cargo feature `lambda`.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde_json::Value;

use super::{CommitNotification, DETAIL_TYPE, SOURCE};
use crate::error::{Error, Result};

/// Why a relay invocation was started, as its payload says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Anything that is not a commit notification: the schedule, a manual invoke.
    Tick,
    /// A commit notification from the event bus.
    Notification(CommitNotification),
}

impl Wake {
    /// Reads an invocation's payload. An [`Error::InvalidMessage`] naming the field when
    /// the payload says it is a commit notification but breaks a rule.
    pub fn from_payload(payload: &Value) -> Result<Wake> {
        Ok(match CommitNotification::from_event(payload)? {
            Some(n) => Wake::Notification(n),
            None => Wake::Tick,
        })
    }
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
            Wake::from_payload(&event).unwrap(),
            Wake::Notification(n.clone())
        );
        // A schedule tick or a manual invoke is no notification.
        let tick = json!({"version": "0", "id": "2", "source": "aws.events",
            "detail-type": "Scheduled Event", "detail": {}});
        assert_eq!(Wake::from_payload(&tick).unwrap(), Wake::Tick);
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
