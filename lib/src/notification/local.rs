//! The in-process transport: a writer and a relay in one process share a
//! [`LocalNotifier`].

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::CommitNotifier;

/// An in-process commit notifier: the writer marks buckets, the relay in the same process
/// wakes at once instead of waiting for its next poll.
#[derive(Debug, Default)]
pub struct LocalNotifier {
    dirty: Mutex<BTreeSet<u32>>,
    notify: Notify,
}

impl LocalNotifier {
    /// A notifier with nothing marked, to share between the writer and the relay of one
    /// process.
    ///
    /// # Examples
    /// ```no_run
    /// use std::sync::Arc;
    /// use dynamo_outbox::publish::LazyKafkaPublisher;
    /// use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, LocalNotifier, Relay};
    ///
    /// # fn example(
    /// #     writer: DynamoDbOutboxWriter,
    /// #     relay: Relay<LazyKafkaPublisher>,
    /// # ) -> dynamo_outbox::Result<()> {
    /// let notifier = LocalNotifier::new();
    /// let writer = writer.with_notifier(notifier.clone());
    /// let relay = relay.with_notifier(notifier);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Arc<Self> {
        Arc::new(LocalNotifier::default())
    }

    /// Takes the buckets marked since the last call (the relay's side).
    #[cfg(feature = "relay")]
    pub(crate) fn take(&self) -> BTreeSet<u32> {
        std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl LocalNotifier {
    /// Completes at the next notification (or at once if one came since the last wait).
    #[cfg(feature = "relay")]
    pub(crate) async fn notified(&self) {
        self.notify.notified().await
    }
}

impl CommitNotifier for LocalNotifier {
    fn notify(&self, buckets: &[u32]) {
        self.dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(buckets.iter().copied());
        self.notify.notify_one();
    }
}
