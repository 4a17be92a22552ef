//! The commit notification's transport: one Amazon EventBridge event per committed
//! request ([`super`] describes the event), sent after the commit. Behind the cargo
//! feature `eventbridge`.
//! A failed or late send is logged and otherwise ignored: the messages are committed, and
//! relays find them on their next poll.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{CommitNotification, DETAIL_TYPE, NOTIFY_EVENT_BUS, SOURCE};
use aws_sdk_eventbridge::config::timeout::TimeoutConfig;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use tokio::time::Instant;

/// Longest time one notification may take, EventBridge's retries included.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends commit notifications to one event bus. Clones share the counts.
#[derive(Debug, Clone)]
pub struct EventBridgeNotifier {
    client: aws_sdk_eventbridge::Client,
    bus: String,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl EventBridgeNotifier {
    /// A notifier for `bus` (its name or ARN), with a client for `config` whose attempts
    /// and operations are bounded by [`NOTIFY_TIMEOUT`]. Never fails: a notification that
    /// cannot be sent is counted ([`failed`](Self::failed)) and logged, and the relays'
    /// poll finds the messages anyway.
    ///
    /// # Examples
    /// ```no_run
    /// use dynamo_outbox::notification::{CommitNotification, EventBridgeNotifier, NOTIFY_TIMEOUT};
    /// use dynamo_outbox::OutboxOptions;
    /// use tokio::time::Instant;
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let notifier = EventBridgeNotifier::new(&sdk, "outbox-commits");
    /// // after a commit of messages to buckets 3 and 5
    /// let committed = CommitNotification::new(&OutboxOptions::new("orders-outbox"), [3, 5]);
    /// notifier.send(&committed, Instant::now() + NOTIFY_TIMEOUT).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(config: &aws_config::SdkConfig, bus: impl Into<String>) -> Self {
        let client = aws_sdk_eventbridge::Client::from_conf(
            aws_sdk_eventbridge::config::Builder::from(config)
                .timeout_config(
                    TimeoutConfig::builder()
                        .connect_timeout(Duration::from_secs(1))
                        .operation_attempt_timeout(NOTIFY_TIMEOUT / 2)
                        .operation_timeout(NOTIFY_TIMEOUT)
                        .build(),
                )
                .build(),
        );
        EventBridgeNotifier {
            client,
            bus: bus.into(),
            sent: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// Notifications EventBridge accepted so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Notifications that failed or timed out so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// The notifier the environment asks for: `OUTBOX_NOTIFY_EVENT_BUS` read through
    /// `lookup` (the process environment, or a stand-in); `None` when it is unset or empty.
    ///
    /// # Examples
    /// ```no_run
    /// use dynamo_outbox::notification::EventBridgeNotifier;
    ///
    /// # async fn example() {
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let notifier = EventBridgeNotifier::from_lookup(&sdk, |name| std::env::var(name).ok());
    /// # }
    /// ```
    pub fn from_lookup(
        config: &aws_config::SdkConfig,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Self> {
        lookup(NOTIFY_EVENT_BUS)
            .filter(|b| !b.trim().is_empty())
            .map(|bus| Self::new(config, bus))
    }

    /// The event bus notifications go to.
    pub fn bus(&self) -> &str {
        &self.bus
    }

    /// Sends `notification` as one event; gives up at `by`.
    ///
    /// # Errors
    /// [`NotifyError`]: the request failed (the SDK's error as its source), EventBridge
    /// refused the event, or `by` passed.
    pub async fn send(
        &self,
        notification: &CommitNotification,
        by: Instant,
    ) -> Result<(), NotifyError> {
        let result = self.put(notification, by).await;
        let counter = if result.is_ok() {
            &self.sent
        } else {
            &self.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    async fn put(&self, notification: &CommitNotification, by: Instant) -> Result<(), NotifyError> {
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus)
            .source(SOURCE)
            .detail_type(DETAIL_TYPE)
            .detail(notification.detail_json())
            .build();
        let sent = tokio::time::timeout_at(by, self.client.put_events().entries(entry).send())
            .await
            .map_err(|_| NotifyError::TimedOut)?
            .map_err(|e| NotifyError::Request(Box::new(e)))?;
        if sent.failed_entry_count() > 0 {
            let entry = sent.entries().first();
            return Err(NotifyError::Refused {
                code: entry.and_then(|e| e.error_code()).unwrap_or("?").to_owned(),
                message: entry
                    .and_then(|e| e.error_message())
                    .unwrap_or("")
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// Why a commit notification was not sent ([`EventBridgeNotifier::send`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// `PutEvents` did not answer by the caller's time.
    #[error("PutEvents did not finish in time")]
    TimedOut,
    /// The request failed (its SDK error is the source).
    #[error("PutEvents failed")]
    Request(#[source] crate::error::BoxError),
    /// EventBridge answered and refused the event.
    #[error("EventBridge refused the event: {code} {message}")]
    Refused {
        /// The entry's error code.
        code: String,
        /// The entry's error message.
        message: String,
    },
}
