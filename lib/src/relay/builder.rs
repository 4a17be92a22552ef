//! [`RelayBuilder`]: a relay from the standard AWS configuration, in one expression.

use std::sync::Arc;

use super::Relay;
use crate::error::Result;
use crate::metrics::RelayMetrics;
use crate::notification::{LocalNotifier, Successor};
use crate::options::{OutboxOptions, RelayOptions};
use crate::protocol::store::DynamoDbOutboxStore;
use crate::publish::{KafkaConfig, LazyKafkaPublisher};

/// Builds a [`Relay`] from an [`aws_config::SdkConfig`] ([`Relay::builder`]): a DynamoDB
/// client with the relay's timeouts ([`crate::client::dynamodb_client`]: a half-open
/// connection never holds a lease renewal past its lease), one bucket count (the table's),
/// and a Kafka publisher that connects on its first publish (a broker that is down at the
/// start is retried as any failed publish). What is not given is read from the
/// environment: [`OutboxOptions::from_env`], [`RelayOptions::from_env`],
/// [`KafkaConfig::from_env`].
#[derive(Debug)]
#[must_use]
pub struct RelayBuilder {
    client: aws_sdk_dynamodb::Client,
    outbox: Option<OutboxOptions>,
    options: Option<RelayOptions>,
    kafka: Option<KafkaConfig>,
    metrics: Option<Arc<dyn RelayMetrics>>,
    notifier: Option<Arc<LocalNotifier>>,
    successor: Option<Arc<dyn Successor>>,
}

impl Relay<LazyKafkaPublisher> {
    /// A builder of a relay whose DynamoDB client is made from `config`.
    ///
    /// # Examples
    /// ```no_run
    /// use dynamo_outbox::{OutboxOptions, Relay};
    /// use tokio::time::{Duration, Instant};
    ///
    /// # async fn run() -> dynamo_outbox::Result<()> {
    /// let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// // The table, the relay and Kafka from the environment (OUTBOX_*, KAFKA_*) ...
    /// let relay = Relay::builder(&config).build()?;
    /// // ... or some of them given.
    /// let relay = Relay::builder(&config)
    ///     .outbox(OutboxOptions::new("orders-outbox"))
    ///     .build()?;
    /// let report = relay.run_until(Instant::now() + Duration::from_secs(50)).await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(config: &aws_config::SdkConfig) -> RelayBuilder {
        RelayBuilder {
            client: crate::client::dynamodb_client(config),
            outbox: None,
            options: None,
            kafka: None,
            metrics: None,
            notifier: None,
            successor: None,
        }
    }
}

impl RelayBuilder {
    /// The outbox table (default: [`OutboxOptions::from_env`]).
    pub fn outbox(mut self, outbox: OutboxOptions) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// The relay's options (default: [`RelayOptions::from_env`]); their bucket count is
    /// replaced by the table's.
    pub fn options(mut self, options: RelayOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// The Kafka publisher's configuration (default: [`KafkaConfig::from_env`]).
    pub fn kafka(mut self, kafka: KafkaConfig) -> Self {
        self.kafka = Some(kafka);
        self
    }

    /// Uses `client` instead of the one made from the configuration (a client with an
    /// interceptor of one's own, say: start from [`crate::client::dynamodb_config`]).
    pub fn client(mut self, client: aws_sdk_dynamodb::Client) -> Self {
        self.client = client;
        self
    }

    /// The metrics sink ([`Relay::with_metrics`]).
    pub fn metrics(mut self, metrics: Arc<dyn RelayMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Wakes the relay on the commits of writers of the same process
    /// ([`Relay::with_notifier`]).
    pub fn notifier(mut self, notifier: Arc<LocalNotifier>) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Starts a successor when a run ends with work left ([`Relay::with_successor`]).
    pub fn successor(mut self, successor: Arc<dyn Successor>) -> Self {
        self.successor = Some(successor);
        self
    }

    /// The relay.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] naming the variable or field that breaks a rule
    /// (read from the environment or given).
    pub fn build(self) -> Result<Relay<LazyKafkaPublisher>> {
        let outbox = match self.outbox {
            Some(o) => o,
            None => OutboxOptions::from_env()?,
        };
        let mut options = match self.options {
            Some(o) => o,
            None => RelayOptions::for_table(&outbox, |name| std::env::var(name).ok())?,
        };
        options.bucket_count = outbox.bucket_count;
        let kafka = match self.kafka {
            Some(k) => k,
            None => KafkaConfig::from_env()?,
        };
        let store = DynamoDbOutboxStore::new(self.client, outbox)?;
        let mut relay = Relay::new(store, Arc::new(LazyKafkaPublisher::new(kafka)), options)?;
        if let Some(metrics) = self.metrics {
            relay = relay.with_metrics(metrics);
        }
        if let Some(notifier) = self.notifier {
            relay = relay.with_notifier(notifier);
        }
        if let Some(successor) = self.successor {
            relay = relay.with_successor(successor);
        }
        Ok(relay)
    }
}
