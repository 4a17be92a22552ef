//! A Kafka publisher that connects on first use and again after the connection was dropped:
//! a host that must not fail because Kafka is unreachable (a relay woken by a doorbell on
//! a cold start) runs its relay anyway, and the connection is one more thing the relay
//! retries on its back-off.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::{Delivery, KafkaConfig, KafkaPublisher, PublishOutcome, Publisher};
use crate::error::{Error, Result};
use crate::message::StoredMessage;
use crate::protocol::watermark::OutboxIdentity;

/// Longest time one connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed connection attempt, publishes fail at once for this long instead of
/// connecting again (every bucket's retry would otherwise start its own attempt).
pub const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// A [`KafkaPublisher`] made when first needed: publishing connects when there is no
/// connection (one attempt at a time, at most [`CONNECT_TIMEOUT`], none within
/// [`RECONNECT_PAUSE`] of a failed one), and a failed connection is a failed publish
/// (retryable, with the connection's error as its source), never an error of the host.
#[derive(Debug)]
pub struct LazyKafkaPublisher {
    config: KafkaConfig,
    slot: tokio::sync::Mutex<Slot>,
    /// Exactly once: the outbox the relay bound, given to every connection made.
    binding: std::sync::Mutex<Option<(OutboxIdentity, Duration)>>,
}

#[derive(Debug, Default)]
struct Slot {
    publisher: Option<Arc<KafkaPublisher>>,
    failed: Option<(Instant, Arc<Error>)>,
}

impl LazyKafkaPublisher {
    /// A publisher for `config`, not connected yet: the first publish connects. Never
    /// fails; a configuration that cannot connect fails that publish (and is retried).
    ///
    /// # Examples
    /// ```no_run
    /// use std::sync::Arc;
    /// use dynamo_outbox::publish::{KafkaConfig, LazyKafkaPublisher};
    ///
    /// # fn example() -> dynamo_outbox::Result<()> {
    /// let publisher = Arc::new(LazyKafkaPublisher::new(KafkaConfig::from_env()?));
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(config: KafkaConfig) -> Self {
        LazyKafkaPublisher {
            config,
            slot: tokio::sync::Mutex::new(Slot::default()),
            binding: std::sync::Mutex::new(None),
        }
    }

    /// The options it connects with.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The connected publisher, connecting first when there is none (giving up at
    /// `deadline` or after [`CONNECT_TIMEOUT`]).
    ///
    /// # Errors
    /// [`Error::Kafka`] (retryable) when the connect fails, with the connect's error
    /// ([`KafkaPublisher::connect`]) as its source, or within [`RECONNECT_PAUSE`] of a
    /// failed one.
    pub async fn connect(&self, deadline: Instant) -> Result<Arc<KafkaPublisher>> {
        let mut slot = self.slot.lock().await;
        if let Some(p) = &slot.publisher {
            return Ok(p.clone());
        }
        if let Some((at, e)) = &slot.failed {
            if at.elapsed() < RECONNECT_PAUSE {
                return Err(Error::Kafka {
                    message: "not connected (the last attempt failed just now)".into(),
                    retryable: true,
                    source: Some(Box::new(e.clone())),
                });
            }
        }
        let by = deadline.min(Instant::now() + CONNECT_TIMEOUT);
        match KafkaPublisher::connect(self.config.clone(), by).await {
            Ok(p) => {
                let p = Arc::new(p);
                slot.publisher = Some(p.clone());
                slot.failed = None;
                Ok(p)
            }
            Err(e) => {
                warn!(error = %crate::error::chain(&e), "connecting to kafka failed; publishes retry it");
                let e = Arc::new(e);
                slot.failed = Some((Instant::now(), e.clone()));
                Err(Error::Kafka {
                    message: "connecting".into(),
                    retryable: true,
                    source: Some(Box::new(e)),
                })
            }
        }
    }

    /// Whether a connection is there now.
    pub async fn is_connected(&self) -> bool {
        self.slot.lock().await.publisher.is_some()
    }

    /// Drops the connection: the next publish connects anew.
    pub async fn disconnect(&self) {
        self.slot.lock().await.publisher = None;
    }

    async fn publish_by(&self, batch: &[StoredMessage], until: Instant) -> PublishOutcome {
        if batch.is_empty() {
            return PublishOutcome::complete(0);
        }
        match self.connect(until).await {
            Ok(p) => {
                let binding = self
                    .binding
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some((identity, lease_duration)) = binding {
                    p.bind_outbox(&identity, lease_duration);
                }
                p.publish_batch_until(batch, until).await
            }
            Err(e) => PublishOutcome::failed(e),
        }
    }
}

impl Publisher for LazyKafkaPublisher {
    async fn publish(&self, batch: &[StoredMessage]) -> PublishOutcome {
        self.publish_by(batch, Instant::now() + self.config.publish_timeout)
            .await
    }

    async fn publish_until(&self, batch: &[StoredMessage], until: Instant) -> PublishOutcome {
        self.publish_by(batch, until).await
    }

    fn delivery(&self) -> Delivery {
        self.config.delivery
    }

    fn bind_outbox(&self, identity: &OutboxIdentity, lease_duration: Duration) {
        // Given to the connection at each publish: a connection made later gets it too.
        *self.binding.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((identity.clone(), lease_duration));
    }
}
