//! A relay host: what a program around a [`Relay`] does besides relaying (feature `host`).
//! `outboxctl relay` and the relay Lambda function ([`crate::lambda`]) are both built on
//! it, and a service that runs a relay of its own can be too.
//!
//! - [`HostSettings`]: the outbox, the relay and Kafka configured from the environment,
//!   with one bucket count.
//! - [`RelayHost`]: the clients of one process (the store, a Kafka publisher that connects
//!   on first use and is rebuilt after a run that could not publish at all), its metrics
//!   sinks, and runs: each run is a [`Relay`] with its own options, its EMF documents
//!   flushed every interval and at its end.
//! - [`EmfExport`]: the measurements as CloudWatch Embedded Metric Format documents.
//! - [`Telemetry`] and [`OtlpSettings`]: metrics and publish spans over OTLP/HTTP,
//!   configured by the standard OpenTelemetry variables.
//!
//! # Examples
//! A relay in a long-lived process, stopped by Ctrl-C:
//! ```no_run
//! use dynamo_outbox::host::{EmfExport, ExportMode, HostSettings, OtlpSettings, RelayHost, Telemetry};
//! use dynamo_outbox::metrics::emf::EmfMetrics;
//! use std::time::Duration;
//!
//! # async fn run() -> dynamo_outbox::Result<()> {
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let settings = HostSettings::from_env()?;
//! let emf = EmfExport::new(EmfMetrics::from_env(&settings.outbox.table_name));
//! let mut host = RelayHost::new(&config, settings)?.with_emf(emf);
//! if let Some(otlp) = OtlpSettings::from_env(ExportMode::Process { asked: false })? {
//!     let relay_id = host.options().relay_id.clone();
//!     let metrics_name = host.options().metrics_name.clone();
//!     host = host.with_telemetry(Telemetry::start(otlp, Some(&relay_id), &metrics_name)?);
//! }
//! let stop = async {
//!     let _ = tokio::signal::ctrl_c().await;
//! };
//! let report = host
//!     .run_until_shutdown(host.options().clone(), stop, Duration::from_secs(10))
//!     .await?;
//! println!("published {}", report.published);
//! host.shutdown().await;
//! # Ok(()) }
//! ```

mod emf;
mod otlp;
mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

pub use emf::{EmfExport, DEFAULT_FLUSH_INTERVAL};
pub use telemetry::{
    ExportMode, OtlpSettings, Telemetry, DEFAULT_ENDPOINT, DEFAULT_INTERVAL,
    DEFAULT_INVOCATION_TIMEOUT, DEFAULT_PROCESS_TIMEOUT, DEFAULT_SERVICE_NAME, FINAL_EXPORT_BOUND,
};

use crate::error::Result;
use crate::metrics::{Fanout, RelayMetrics};
use crate::notification::Successor;
use crate::options::{OutboxOptions, RelayOptions};
use crate::publish::{KafkaConfig, LazyKafkaPublisher};
use crate::relay::{Relay, RunReport};
use crate::DynamoDbOutboxStore;

/// Everything a relay host is configured with: the table, the relay, Kafka.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HostSettings {
    /// The outbox table ([`OutboxOptions::from_lookup`]).
    pub outbox: OutboxOptions,
    /// The relay ([`RelayOptions::from_lookup`]); its bucket count is the table's.
    pub relay: RelayOptions,
    /// The Kafka publisher ([`KafkaConfig::from_lookup`]).
    pub kafka: KafkaConfig,
}

impl HostSettings {
    /// Reads the settings from the process environment.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] naming the variable that breaks a rule.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (an environment stand-in). The relay's bucket
    /// count is the table's (`OUTBOX_BUCKET_COUNT` is read once).
    ///
    /// # Errors
    /// As [`HostSettings::from_env`].
    ///
    /// # Examples
    /// ```
    /// use dynamo_outbox::host::HostSettings;
    ///
    /// let vars = |name: &str| match name {
    ///     "OUTBOX_TABLE_NAME" => Some("orders-outbox".to_string()),
    ///     "OUTBOX_BUCKET_COUNT" => Some("16".to_string()),
    ///     "KAFKA_BOOTSTRAP_SERVERS" => Some("b-1.example:9098".to_string()),
    ///     _ => None,
    /// };
    /// let settings = HostSettings::from_lookup(vars).unwrap();
    /// assert_eq!(settings.relay.bucket_count, settings.outbox.bucket_count);
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let outbox = OutboxOptions::from_lookup(&lookup)?;
        let relay = RelayOptions::for_table(&outbox, &lookup)?;
        let kafka = KafkaConfig::from_lookup(&lookup)?;
        Ok(HostSettings {
            outbox,
            relay,
            kafka,
        })
    }
}

/// The clients and sinks of one process, and its relay runs.
#[derive(Debug)]
pub struct RelayHost {
    store: DynamoDbOutboxStore,
    publisher: Arc<LazyKafkaPublisher>,
    options: RelayOptions,
    sinks: Fanout,
    emf: Option<EmfExport>,
    telemetry: Option<Telemetry>,
    successor: Option<Arc<dyn Successor>>,
}

impl RelayHost {
    /// A host over a DynamoDB client built from `config` with the relay's timeouts
    /// ([`crate::client::dynamodb_client`]) and a Kafka publisher that connects on first
    /// use.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] when the options break a rule.
    pub fn new(config: &aws_config::SdkConfig, settings: HostSettings) -> Result<Self> {
        let store =
            DynamoDbOutboxStore::new(crate::client::dynamodb_client(config), settings.outbox)?;
        Self::with_store(store, settings.relay, settings.kafka)
    }

    /// A host over `store` (a client of one's own: counted, with a test clock).
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] when `relay` breaks a rule or its bucket count is
    /// not the store's.
    pub fn with_store(
        store: DynamoDbOutboxStore,
        mut relay: RelayOptions,
        kafka: KafkaConfig,
    ) -> Result<Self> {
        relay.bucket_count = store.options().bucket_count;
        relay.validate()?;
        Ok(RelayHost {
            store,
            publisher: Arc::new(LazyKafkaPublisher::new(kafka)),
            options: relay,
            sinks: Fanout::default(),
            emf: None,
            telemetry: None,
            successor: None,
        })
    }

    /// Records every run's measurements as EMF documents, flushed every interval while a
    /// run lasts and at its end.
    pub fn with_emf(mut self, emf: EmfExport) -> Self {
        self.sinks.push(emf.metrics().clone());
        self.emf = Some(emf);
        self
    }

    /// Exports over OTLP (its metrics sink, when it exports metrics, joins the others);
    /// [`RelayHost::shutdown`] ends it.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        if let Some(metrics) = telemetry.metrics() {
            self.sinks.push(metrics);
        }
        self.telemetry = Some(telemetry);
        self
    }

    /// Replaces the EMF export by what `f` makes of it (its output, its interval).
    #[cfg(feature = "lambda")]
    pub(crate) fn map_emf(mut self, f: impl FnOnce(EmfExport) -> EmfExport) -> Self {
        self.emf = self.emf.map(f);
        self
    }

    /// Adds a metrics sink of one's own (a health endpoint, say).
    pub fn with_metrics(mut self, sink: Arc<dyn RelayMetrics>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Starts a successor through `successor` when a run ends with work left in its
    /// buckets ([`Relay::with_successor`]).
    pub fn with_successor(mut self, successor: Arc<dyn Successor>) -> Self {
        self.successor = Some(successor);
        self
    }

    /// The relay options each run starts from.
    pub fn options(&self) -> &RelayOptions {
        &self.options
    }

    /// The table as the runs use it.
    pub fn store(&self) -> &DynamoDbOutboxStore {
        &self.store
    }

    /// The Kafka publisher the runs share.
    pub fn publisher(&self) -> &Arc<LazyKafkaPublisher> {
        &self.publisher
    }

    /// The EMF export, when there is one.
    pub fn emf(&self) -> Option<&EmfExport> {
        self.emf.as_ref()
    }

    /// The OTLP export, when there is one.
    pub fn telemetry(&self) -> Option<&Telemetry> {
        self.telemetry.as_ref()
    }

    /// Runs a relay with `options` until `deadline` ([`Relay::run_until`]).
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] when `options` break a rule; the run's own errors
    /// ([`Relay::run_until`]).
    pub async fn run_until(&self, options: RelayOptions, deadline: Instant) -> Result<RunReport> {
        self.run_until_with(options, deadline, true).await
    }

    /// [`RelayHost::run_until`], looking for work left at the end of the run only when
    /// `successor_at_end` ([`Relay::with_successor_at_end`]).
    pub(crate) async fn run_until_with(
        &self,
        options: RelayOptions,
        deadline: Instant,
        successor_at_end: bool,
    ) -> Result<RunReport> {
        let relay = self.relay(options, successor_at_end)?;
        self.drive(relay.run_until(deadline)).await
    }

    /// Runs a relay with `options` until `signal` completes, then stops it within `grace`
    /// ([`Relay::run_until_shutdown`]).
    ///
    /// # Errors
    /// As [`RelayHost::run_until`].
    pub async fn run_until_shutdown<F>(
        &self,
        options: RelayOptions,
        signal: F,
        grace: Duration,
    ) -> Result<RunReport>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let relay = self.relay(options, true)?;
        self.drive(relay.run_until_shutdown(signal, grace)).await
    }

    /// Runs a relay with `options` until `deadline` or until `signal` completes, whichever
    /// comes first ([`Relay::run_until_or_shutdown`]).
    ///
    /// # Errors
    /// As [`RelayHost::run_until`].
    pub async fn run_until_or_shutdown<F>(
        &self,
        options: RelayOptions,
        deadline: Instant,
        signal: F,
        grace: Duration,
    ) -> Result<RunReport>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let relay = self.relay(options, true)?;
        self.drive(relay.run_until_or_shutdown(deadline, signal, grace))
            .await
    }

    /// Ends the OTLP export: exports what is left, waiting at most [`FINAL_EXPORT_BOUND`].
    pub async fn shutdown(self) {
        if let Some(telemetry) = self.telemetry {
            telemetry.shutdown().await;
        }
    }

    fn relay(
        &self,
        mut options: RelayOptions,
        successor_at_end: bool,
    ) -> Result<Relay<LazyKafkaPublisher>> {
        options.bucket_count = self.store.options().bucket_count;
        let mut relay = Relay::new(self.store.clone(), self.publisher.clone(), options)?;
        if !self.sinks.is_empty() {
            relay = relay.with_metrics(Arc::new(self.sinks.clone()));
        }
        if let Some(successor) = &self.successor {
            relay = relay
                .with_successor(successor.clone())
                .with_successor_at_end(successor_at_end);
        }
        Ok(relay)
    }

    /// Runs `run` with the EMF flush going, flushes once more at its end, and drops the
    /// Kafka client after a run that published nothing and failed to publish (the next
    /// publish connects afresh: a broker's address or a credential may have changed).
    async fn drive(&self, run: impl Future<Output = Result<RunReport>>) -> Result<RunReport> {
        let flusher = self.emf.as_ref().map(EmfExport::start);
        let result = run.await;
        drop(flusher);
        if let Some(emf) = &self.emf {
            emf.flush();
        }
        let report = result?;
        if report.published == 0 && report.publish_failures > 0 {
            warn!("nothing published and publishing failed: the Kafka client is rebuilt by the next publish");
            self.publisher.disconnect().await;
        }
        Ok(report)
    }
}
