//! The relay as an AWS Lambda function: one invocation runs one relay instance, with its
//! own relay id, until the invocation's deadline minus a shutdown margin (or a configured
//! maximum run time, whichever comes first), then stops gracefully so that its leases are
//! released before Lambda can time the function out.
//!
//! The DynamoDB client is built once per execution environment (in `main`, before the
//! runtime loop); the Kafka publisher ([`LazyKafkaPublisher`]) connects on first use and is
//! reused by the warm invocations, and is dropped (to be rebuilt by the next publish) when
//! a run published nothing but failed to publish.
//!
//! # Wake-ups
//! An invocation whose payload is a commit notification (the SAM template's rule on the
//! event bus) or a doorbell (a batch of the table's stream records) decides first whether
//! it is needed, with [`dynamo_outbox::notification::decide`]: it returns at once
//! (`stop_reason` `covered`, `empty` or `not_this_outbox`, no write) when live relays hold
//! the notified buckets or nothing waits in them, and runs a relay otherwise. The decision
//! never fails: a coverage read that fails (a throttle, a 5xx, a timeout) makes the
//! invocation join, and Kafka is connected while deciding only as a head start (a failed
//! connection is retried by the relay, as any failed publish). So a wake-up is never lost
//! to a function error.
//!
//! # Successors
//! A run that reaches its deadline minus [`dynamo_outbox::notification::SUCCESSOR_LEAD`]
//! with work left in its buckets starts its successor: an asynchronous invocation of this
//! function (`AWS_LAMBDA_FUNCTION_NAME`) with a [`dynamo_outbox::notification::Handoff`]
//! payload, which runs a relay at once: it takes its share of the buckets as it joins and
//! the rest at the leaver's stop.
//! So a backlog drains without waiting for the schedule, and a relay that cannot publish
//! tries again in its successor about once a minute ([`dynamo_outbox::notification`] says
//! why that is bounded).
//!
//! # Environment
//! Everything [`OutboxOptions::from_env`], [`RelayOptions::from_env`] and
//! [`KafkaConfig::from_env`] read, and:
//! - [`env::MAX_RUN_TIME`] (`OUTBOX_MAX_RUN_TIME`, default 50s): longest run of one
//!   invocation, and the run time used when the invocation has no usable deadline.
//! - [`env::SHUTDOWN_MARGIN`] (`OUTBOX_SHUTDOWN_MARGIN`, default 3s): time left unused
//!   before the invocation's deadline; the graceful stop ends before it.
//! - The standard OpenTelemetry variables of [`SpanExport`]: with an OTLP endpoint (the
//!   ADOT collector layer's `http://localhost:4318`), the relay's publish spans are
//!   exported, flushed before each invocation returns.
//! - `OUTBOX_IDLE_STOP` defaults to [`DEFAULT_IDLE_STOP`] here (the library's default is
//!   never), and `OUTBOX_MAX_IN_FLIGHT_BYTES` to an eighth of the function's memory
//!   (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`; 16 MiB at the template's 128 MB).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dynamo_outbox::accounting::RequestCounter;
pub use dynamo_outbox::lambda::FunctionError;
use dynamo_outbox::metrics::emf::EmfMetrics;
use dynamo_outbox::notification::event::Wake;
use dynamo_outbox::notification::{decide, Decision, Skip, Successor};
use dynamo_outbox::options::{parse_duration, MAX_RELAY_ID_LEN};
use dynamo_outbox::otlp::{self, OtlpHttpClient};
use dynamo_outbox::publish::{KafkaConfig, LazyKafkaPublisher};
use dynamo_outbox::{
    DynamoDbOutboxStore, OutboxOptions, Relay, RelayOptions, RunReport, StopReason,
};
use lambda_runtime::LambdaEvent;
use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

/// Environment variables of the relay function (besides the library's).
pub mod env {
    /// [`RelaySettings::max_run_time`](super::RelaySettings::max_run_time).
    pub const MAX_RUN_TIME: &str = "OUTBOX_MAX_RUN_TIME";
    /// [`RelaySettings::shutdown_margin`](super::RelaySettings::shutdown_margin).
    pub const SHUTDOWN_MARGIN: &str = "OUTBOX_SHUTDOWN_MARGIN";
}

/// How often a running invocation writes its metrics (and once more at its end): the
/// alarms evaluate one-minute periods, so a long run reports in every one of them.
pub const METRICS_FLUSH_INTERVAL: Duration = Duration::from_secs(60);
/// `service.name` of the exported spans when `OTEL_SERVICE_NAME` does not name one.
pub const DEFAULT_SERVICE_NAME: &str = "outbox-relay";
/// Default of [`RelaySettings::max_run_time`].
pub const DEFAULT_MAX_RUN_TIME: Duration = Duration::from_secs(50);
/// Default of [`RelaySettings::shutdown_margin`].
pub const DEFAULT_SHUTDOWN_MARGIN: Duration = Duration::from_secs(3);
/// The function's idle stop when `OUTBOX_IDLE_STOP` is unset (the library's default is
/// never): an invocation whose buckets have all been empty this long stops early.
pub const DEFAULT_IDLE_STOP: Duration = Duration::from_secs(5);

/// Everything the relay function is configured with.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// The outbox table.
    pub outbox: OutboxOptions,
    /// The relay's options; its `relay_id` is replaced per invocation.
    pub relay: RelayOptions,
    /// The Kafka publisher's options.
    pub kafka: KafkaConfig,
    /// Longest run of one invocation (50 s); also the run time when the invocation's
    /// deadline is missing or already past (the local emulator's constant).
    pub max_run_time: Duration,
    /// Time kept free before the invocation's deadline (3 s).
    pub shutdown_margin: Duration,
    /// Where the publish spans go, when an OTLP endpoint is configured ([`SpanExport`]).
    pub spans: Option<SpanExport>,
}

/// The OTLP/HTTP export of the relay's publish spans (one per produce request, linked to
/// each message's trace context), configured by the standard OpenTelemetry variables: on
/// when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is) or `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (+ `/v1/traces`) is set, off with `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
/// Every invocation flushes its spans before it returns (Lambda may freeze the execution
/// environment right after), each request bounded by [`SpanExport::timeout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanExport {
    /// The full traces URL (`.../v1/traces`); the ADOT collector layer listens on
    /// `http://localhost:4318`.
    pub endpoint: String,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` /
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, milliseconds; [`DEFAULT_SPAN_EXPORT_TIMEOUT`]): the
    /// flush at the end of an invocation waits at most this long, inside the shutdown
    /// margin.
    pub timeout: Duration,
}

/// Default of [`SpanExport::timeout`]: short, since an invocation waits for it.
pub const DEFAULT_SPAN_EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

impl SpanExport {
    /// The export the variables read through `lookup` configure; `None` when off.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> dynamo_outbox::Result<Option<Self>> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let bad = |field: &str, rule: String| dynamo_outbox::Error::InvalidOption {
            field: field.into(),
            rule,
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match get("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(bad(
                    "OTEL_TRACES_EXPORTER",
                    format!("{other:?} is not supported by the relay function (otlp or none)"),
                ))
            }
        }
        let (field, endpoint) = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(e), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e),
            (None, Some(b)) => (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("{}/v1/traces", b.trim_end_matches('/')),
            ),
            (None, None) => return Ok(None),
        };
        let scheme_ok = ["http://", "https://"].iter().any(|p| {
            endpoint
                .strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
        });
        if !scheme_ok {
            return Err(bad(
                field,
                format!("{endpoint:?} must be an http:// or https:// URL with a host"),
            ));
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = get(name) {
                if p != "http/protobuf" {
                    return Err(bad(
                        name,
                        format!("{p:?} is not supported by the relay function (http/protobuf)"),
                    ));
                }
                break;
            }
        }
        let mut timeout = DEFAULT_SPAN_EXPORT_TIMEOUT;
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ] {
            if let Some(v) = get(name) {
                timeout = match v.parse::<u64>() {
                    Ok(ms) if ms > 0 => Duration::from_millis(ms),
                    _ => {
                        return Err(bad(
                            name,
                            format!(
                                "{v:?} is not a whole number of milliseconds greater than zero"
                            ),
                        ))
                    }
                };
                break;
            }
        }
        Ok(Some(SpanExport { endpoint, timeout }))
    }
}

impl RelaySettings {
    /// Reads the settings from the process environment.
    pub fn from_env() -> dynamo_outbox::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (an environment stand-in) and validates them.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> dynamo_outbox::Result<Self> {
        let outbox = OutboxOptions::from_lookup(&lookup)?;
        let mut relay = RelayOptions::from_lookup(&lookup)?;
        if lookup(dynamo_outbox::options::env::IDLE_STOP).is_none() {
            relay.idle_stop = Some(DEFAULT_IDLE_STOP);
        }
        if lookup(dynamo_outbox::options::env::MAX_IN_FLIGHT_BYTES).is_none() {
            // Lambda says the function's memory size: an eighth of it for batches, so
            // the template's 128 MB holds 16 MiB of messages in flight with headroom.
            if let Some(mb) = lookup("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
                .and_then(|v| v.trim().parse::<usize>().ok())
            {
                relay.max_in_flight_bytes = (mb << 20) / 8;
                relay.validate()?;
            }
        }
        let kafka = KafkaConfig::from_lookup(&lookup)?;
        let max_run_time = match lookup(env::MAX_RUN_TIME) {
            Some(v) => parse_duration(env::MAX_RUN_TIME, &v)?,
            None => DEFAULT_MAX_RUN_TIME,
        };
        let shutdown_margin = match lookup(env::SHUTDOWN_MARGIN) {
            Some(v) => parse_duration(env::SHUTDOWN_MARGIN, &v)?,
            None => DEFAULT_SHUTDOWN_MARGIN,
        };
        let spans = SpanExport::from_lookup(&lookup)?;
        if max_run_time < Duration::from_secs(1) {
            return Err(dynamo_outbox::Error::InvalidOption {
                field: env::MAX_RUN_TIME.into(),
                rule: "must be at least 1s".into(),
            });
        }
        Ok(RelaySettings {
            outbox,
            relay,
            kafka,
            max_run_time,
            shutdown_margin,
            spans,
        })
    }
}

/// Where the run's deadline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineSource {
    /// The invocation's deadline minus the shutdown margin.
    Invocation,
    /// The start plus the maximum run time, earlier than the invocation's deadline.
    MaxRunTime,
    /// The invocation had no usable deadline (zero or already past): the maximum run time.
    Fallback,
}

/// When one run must end: `min(invocation deadline - margin, start + max run time)`, or
/// `start + max run time` when the invocation's deadline (`deadline_ms`, Unix
/// milliseconds) is zero or not after `now`.
pub fn run_deadline(
    deadline_ms: u64,
    now: SystemTime,
    start: Instant,
    max_run_time: Duration,
    shutdown_margin: Duration,
) -> (Instant, DeadlineSource) {
    let by_max = start + max_run_time;
    match dynamo_outbox::lambda::time_left(deadline_ms, now) {
        Some(left) => {
            let by_invocation = start + left.saturating_sub(shutdown_margin);
            if by_invocation <= by_max {
                (by_invocation, DeadlineSource::Invocation)
            } else {
                (by_max, DeadlineSource::MaxRunTime)
            }
        }
        None => (by_max, DeadlineSource::Fallback),
    }
}

/// The function's name: the invocation context's, else the runtime's variable.
fn function_name(context: &lambda_runtime::Context) -> String {
    if context.env_config.function_name.is_empty() {
        std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default()
    } else {
        context.env_config.function_name.clone()
    }
}

/// The relay id of one invocation: function name and request id, at most 128 characters,
/// without control characters.
pub fn relay_id(function_name: &str, request_id: &str) -> String {
    let name = if function_name.is_empty() {
        "outbox-relay"
    } else {
        function_name
    };
    let request = if request_id.is_empty() {
        "local"
    } else {
        request_id
    };
    format!("{name}-{request}")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_RELAY_ID_LEN)
        .collect()
}

/// What started an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A direct invocation: the schedule's tick, a manual invoke, or any other payload that
    /// is neither a commit notification nor a doorbell.
    Direct,
    /// A commit notification ([`dynamo_outbox::notification::CommitNotification`]) from the event bus.
    Notification,
    /// A doorbell: a batch of the table's DynamoDB stream records (message inserts by any
    /// writer), from the event source mapping.
    Doorbell,
    /// A successor request from a relay that left work in its buckets
    /// ([`dynamo_outbox::notification::Handoff`]).
    Successor,
}

/// How an invocation ended: the stop reason of the relay it ran, or why it ran none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A relay ran and stopped for this reason.
    Ran(StopReason),
    /// A notified invocation returned without running a relay.
    Skipped(Skip),
}

impl Ending {
    /// The name in the summary's `stop_reason` (one field, so that an operator filters the
    /// function's answers on one key): the relay's [`StopReason::as_str`], or `covered`,
    /// `empty`, `not_this_outbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Ran(reason) => reason.as_str(),
            Ending::Skipped(skip) => skip.as_str(),
        }
    }

    /// Whether the invocation ran a relay.
    pub fn ran(self) -> bool {
        matches!(self, Ending::Ran(_))
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Ending {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// What one invocation returns (and logs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelaySummary {
    /// The invocation's relay id.
    pub relay_id: String,
    /// What started the invocation.
    pub trigger: Trigger,
    /// For a notification: the notified buckets that no live relay took care of (the
    /// invocation joined the fleet when there was one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncovered: Option<Vec<u32>>,
    /// Messages published and deleted.
    pub published: u64,
    /// Publish attempts that failed.
    pub publish_failures: u64,
    /// Most buckets owned at once.
    pub buckets_owned: usize,
    /// Buckets owned when the run ended, before the stop released them.
    pub owned_at_end: usize,
    /// Refused conditional writes of this run.
    pub refused_writes: u64,
    /// The same, by kind.
    pub refused: BTreeMap<String, u64>,
    /// Errors the loop recovered from.
    pub errors: u64,
    /// Whether the invocation used the Kafka client of an earlier (warm) invocation;
    /// `false` when it connected a new one (a cold start, or a rebuild after a warm
    /// invocation that could not publish).
    pub kafka_client_reused: bool,
    /// Why the run ended, or why a notified invocation did not run ([`Ending`]; in JSON
    /// its name: `deadline`, `idle`, `deadline_missed`, ..., or `covered`, `empty`,
    /// `not_this_outbox`).
    pub stop_reason: Ending,
    /// Whether every lease was released at the end.
    pub released: bool,
    /// Whether the run started a successor for the work it left.
    pub successor_started: bool,
    /// Why a woken invocation joined without knowing whether it was needed (a failed
    /// coverage read), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doubt: Option<String>,
    /// Where the run's deadline came from.
    pub deadline_source: DeadlineSource,
    /// Milliseconds left when the handler returned: before the invocation's deadline, or
    /// before the fallback deadline when the invocation had none.
    pub time_left_ms: u64,
    /// DynamoDB attempts this invocation made, by operation (`Query`, `UpdateItem`, ...),
    /// when the function counts them (the deployed binary does; DynamoDB bills attempts).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub dynamodb_requests: BTreeMap<String, u64>,
    /// Of those, the strongly consistent reads, by operation (a strongly consistent read
    /// costs twice an eventually consistent one of the same size).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub dynamodb_consistent_reads: BTreeMap<String, u64>,
}

impl RelaySummary {
    fn new(
        report: &RunReport,
        kafka_client_reused: bool,
        trigger: Trigger,
        uncovered: Option<Vec<u32>>,
        source: DeadlineSource,
        time_left: Duration,
    ) -> Self {
        RelaySummary {
            relay_id: report.relay_id.clone(),
            trigger,
            uncovered,
            published: report.published,
            publish_failures: report.publish_failures,
            buckets_owned: report.max_owned,
            owned_at_end: report.owned_at_end,
            refused_writes: report.refused_total(),
            refused: report
                .refused
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            errors: report.errors,
            kafka_client_reused,
            stop_reason: Ending::Ran(report.stop_reason),
            released: report.released,
            successor_started: report.successor_started,
            doubt: None,
            deadline_source: source,
            time_left_ms: millis(time_left),
            dynamodb_requests: BTreeMap::new(),
            dynamodb_consistent_reads: BTreeMap::new(),
        }
    }

    /// The summary of a notified invocation that returned without running a relay.
    fn skipped(
        relay_id: String,
        trigger: Trigger,
        uncovered: Option<Vec<u32>>,
        skip: Skip,
        source: DeadlineSource,
        time_left: Duration,
    ) -> Self {
        RelaySummary {
            relay_id,
            trigger,
            uncovered,
            published: 0,
            publish_failures: 0,
            buckets_owned: 0,
            owned_at_end: 0,
            refused_writes: 0,
            refused: BTreeMap::new(),
            errors: 0,
            kafka_client_reused: false,
            stop_reason: Ending::Skipped(skip),
            released: true,
            successor_started: false,
            doubt: None,
            deadline_source: source,
            time_left_ms: millis(time_left),
            dynamodb_requests: BTreeMap::new(),
            dynamodb_consistent_reads: BTreeMap::new(),
        }
    }
}

/// Where the EMF documents go: stdout (CloudWatch Logs), or the writer given to
/// [`RelayFunction::with_metrics_output`].
#[derive(Clone, Default)]
struct MetricsOutput(Option<Arc<std::sync::Mutex<dyn std::io::Write + Send>>>);

impl std::fmt::Debug for MetricsOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "writer" } else { "stdout" })
    }
}

/// Writes the metrics gathered so far as EMF documents to `out` (stdout by default).
fn flush(metrics: &EmfMetrics, out: &MetricsOutput) {
    let written = match &out.0 {
        None => metrics.flush_to(&mut std::io::stdout().lock()),
        Some(out) => {
            let mut guard = out.lock().unwrap_or_else(|e| e.into_inner());
            let mut writer: &mut dyn std::io::Write = &mut *guard;
            metrics.flush_to(&mut writer)
        }
    };
    if let Err(e) = written {
        warn!(error = %e, "writing metrics failed");
    }
}

/// Flushes `metrics` to `out` every `interval`, until aborted.
async fn flush_every(metrics: Arc<EmfMetrics>, out: MetricsOutput, interval: Duration) {
    let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        ticks.tick().await;
        flush(&metrics, &out);
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// The relay function: clients of one execution environment and the handler.
#[derive(Debug)]
pub struct RelayFunction {
    settings: RelaySettings,
    store: DynamoDbOutboxStore,
    publisher: Arc<LazyKafkaPublisher>,
    /// Starts the successor of a run that leaves work (none: the run leaves it to the next
    /// wake-up).
    successor: Option<Arc<dyn Successor>>,
    /// CloudWatch metrics (Embedded Metric Format), flushed to stdout every
    /// [`METRICS_FLUSH_INTERVAL`] of a run and at its end.
    metrics: Arc<EmfMetrics>,
    /// Where the metrics go (stdout unless [`Self::with_metrics_output`] says otherwise).
    metrics_output: MetricsOutput,
    /// Counts the DynamoDB client's attempts, when it has the counter attached.
    requests: Option<RequestCounter>,
    /// The tracer provider exporting the publish spans, when [`RelaySettings::spans`] is
    /// set (installed as the global one, which the Kafka publisher records on).
    tracer: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl RelayFunction {
    /// The function over `client` (built once per execution environment). With
    /// [`RelaySettings::spans`], it installs the global tracer provider exporting the
    /// publish spans; it must then run inside a tokio runtime (the exports run on it).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        settings: RelaySettings,
    ) -> dynamo_outbox::Result<Self> {
        let tracer = match &settings.spans {
            None => None,
            Some(export) => {
                let client = OtlpHttpClient::new(&export.endpoint, "spans", &[], export.timeout)?;
                let provider =
                    otlp::tracer_provider(&client, otlp::resource(DEFAULT_SERVICE_NAME, None))?;
                opentelemetry::global::set_tracer_provider(provider.clone());
                info!(endpoint = %export.endpoint, "exporting publish spans over OTLP/HTTP");
                Some(provider)
            }
        };
        let store = DynamoDbOutboxStore::new(client, settings.outbox.clone())?;
        let metrics = Arc::new(EmfMetrics::from_env(settings.outbox.table_name.clone()));
        // The first invocation of this execution environment is its cold start.
        metrics.cold_start();
        let publisher = Arc::new(LazyKafkaPublisher::new(settings.kafka.clone()));
        Ok(RelayFunction {
            settings,
            store,
            publisher,
            successor: None,
            metrics,
            metrics_output: MetricsOutput::default(),
            requests: None,
            tracer,
        })
    }

    /// Writes the EMF documents to `out` instead of stdout (a test reading them back).
    pub fn with_metrics_output(mut self, out: impl std::io::Write + Send + 'static) -> Self {
        self.metrics_output = MetricsOutput(Some(Arc::new(std::sync::Mutex::new(out))));
        self
    }

    /// Reports each invocation's DynamoDB attempts from `counter`, which must be attached
    /// to the client the function was built with
    /// ([`dynamo_outbox::client::counted_dynamodb_client`]).
    pub fn with_request_counter(mut self, counter: RequestCounter) -> Self {
        self.requests = Some(counter);
        self
    }

    /// Starts a successor through `successor` when a run leaves work in its buckets (the
    /// deployed binary: [`dynamo_outbox::notification::LambdaSuccessor`], itself).
    pub fn with_successor(mut self, successor: Arc<dyn Successor>) -> Self {
        self.successor = Some(successor);
        self
    }

    /// The settings the function runs with.
    pub fn settings(&self) -> &RelaySettings {
        &self.settings
    }

    /// Handles one invocation. A commit notification or a doorbell first decides whether a
    /// relay is needed ([`decide`]) and returns at once (`stop_reason` `covered`, `empty`
    /// or `not_this_outbox`) when it is not; any other payload (a schedule tick, a
    /// successor request, a manual invoke), and a wake-up that joins, runs one relay until
    /// the run deadline, then returns the summary.
    pub async fn handle(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<RelaySummary, FunctionError> {
        let before = self
            .requests
            .as_ref()
            .map(|c| (c.snapshot(), c.consistent_reads()));
        let result = self.invoke(event).await;
        self.flush_spans().await;
        let mut summary = result?;
        if let (Some(counter), Some((before, consistent_before))) = (&self.requests, before) {
            // Lambda runs one invocation at a time per execution environment, so the
            // difference is this invocation's.
            summary.dynamodb_requests = counter
                .snapshot()
                .into_iter()
                .map(|(op, now)| {
                    let was = before.get(&op).copied().unwrap_or_default();
                    (op, now.since(&was).total())
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            summary.dynamodb_consistent_reads = counter
                .consistent_reads()
                .into_iter()
                .map(|(op, now)| {
                    let was = consistent_before.get(&op).copied().unwrap_or_default();
                    (op, now - was)
                })
                .filter(|(_, n)| *n > 0)
                .collect();
        }
        Ok(summary)
    }

    /// Exports the spans of this invocation before it returns (Lambda may freeze the
    /// environment right after): at most the export timeout; a failure is logged.
    async fn flush_spans(&self) {
        let (Some(provider), Some(export)) = (&self.tracer, &self.settings.spans) else {
            return;
        };
        let provider = provider.clone();
        let flush = tokio::task::spawn_blocking(move || provider.force_flush());
        match tokio::time::timeout(export.timeout + Duration::from_millis(250), flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "exporting the invocation's spans failed"),
            Ok(Err(e)) => warn!(error = %e, "exporting the invocation's spans did not finish"),
            Err(_) => warn!(
                timeout_ms = export.timeout.as_millis() as u64,
                "exporting the invocation's spans took too long; the rest goes with the next flush"
            ),
        }
    }

    /// Runs the relay until `deadline`, its metrics flushed every minute and at the end; a
    /// run that published nothing and failed to publish drops the Kafka client.
    async fn run_relay(
        &self,
        options: RelayOptions,
        deadline: Instant,
        trigger: Trigger,
    ) -> Result<RunReport, FunctionError> {
        let mut relay = Relay::new(self.store.clone(), self.publisher.clone(), options)?
            .with_metrics(self.metrics.clone());
        if let Some(successor) = &self.successor {
            // A doorbell's run holds the stream's shard: the doorbells of commits that
            // arrive during it wait behind it and follow it, so it needs no successor for
            // what arrived after its look at the lead (and a successor started then would
            // free the shard, so that every later doorbell answers `covered`).
            relay = relay
                .with_successor(successor.clone())
                .with_successor_at_end(trigger != Trigger::Doorbell);
        }
        // EMF documents on stdout, where CloudWatch Logs picks them up: every
        // METRICS_FLUSH_INTERVAL while the relay runs (the alarms evaluate one-minute
        // periods) and once at the end.
        let flusher = tokio::spawn(flush_every(
            self.metrics.clone(),
            self.metrics_output.clone(),
            METRICS_FLUSH_INTERVAL,
        ));
        let result = relay.run_until(deadline).await;
        flusher.abort();
        flush(&self.metrics, &self.metrics_output);
        let report = result?;
        if report.published == 0 && report.publish_failures > 0 {
            warn!("nothing published and publishing failed: the Kafka client is rebuilt by the next publish");
            self.publisher.disconnect().await;
        }
        Ok(report)
    }

    async fn invoke(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<RelaySummary, FunctionError> {
        let start = Instant::now();
        let context = event.context;
        let (deadline, source) = run_deadline(
            context.deadline,
            SystemTime::now(),
            start,
            self.settings.max_run_time,
            self.settings.shutdown_margin,
        );
        let mut options = self.settings.relay.clone();
        options.relay_id = relay_id(&function_name(&context), &context.request_id);
        let time_left = |source| match source {
            DeadlineSource::Fallback => deadline.saturating_duration_since(Instant::now()),
            _ => context
                .deadline()
                .duration_since(SystemTime::now())
                .unwrap_or_default(),
        };
        let wake = Wake::from_payload(&event.payload, &self.settings.outbox)?;
        let (trigger, notified) = match wake {
            Wake::Tick => (Trigger::Direct, None),
            Wake::Successor(handoff) => {
                info!(predecessor = %handoff.predecessor, buckets = ?handoff.buckets, "started as a successor");
                (Trigger::Successor, None)
            }
            Wake::Notification(n) => (Trigger::Notification, Some(n)),
            Wake::Doorbell(n) => (Trigger::Doorbell, Some(n)),
        };
        let was_connected = self.publisher.is_connected().await;
        let (uncovered, doubt) = match notified {
            None => (None, None),
            Some(n) => {
                // The head start: connect while deciding, so that the time between the
                // second look and the heartbeat is short. A failure is the relay's to retry.
                let prepare = async {
                    let _ = self.publisher.connect(deadline).await;
                };
                match decide(
                    &self.store,
                    &n,
                    &options,
                    deadline,
                    &context.request_id,
                    prepare,
                )
                .await
                {
                    Decision::Join { uncovered, doubt } => (Some(uncovered), doubt),
                    Decision::Skip { why, uncovered } => {
                        return Ok(RelaySummary::skipped(
                            options.relay_id,
                            trigger,
                            uncovered,
                            why,
                            source,
                            time_left(source),
                        ));
                    }
                }
            }
        };
        if source == DeadlineSource::Fallback {
            warn!(
                deadline_ms = context.deadline,
                run_time_ms = self.settings.max_run_time.as_millis() as u64,
                "the invocation has no usable deadline: running for the configured maximum run time"
            );
        }
        let report = self.run_relay(options, deadline, trigger).await?;
        let mut summary = RelaySummary::new(
            &report,
            was_connected,
            trigger,
            uncovered,
            source,
            time_left(source),
        );
        summary.doubt = doubt;
        info!(
            relay_id = %summary.relay_id,
            published = summary.published,
            publish_failures = summary.publish_failures,
            buckets_owned = summary.buckets_owned,
            refused_writes = summary.refused_writes,
            trigger = ?summary.trigger,
            stop_reason = %summary.stop_reason,
            released = summary.released,
            successor_started = summary.successor_started,
            time_left_ms = summary.time_left_ms,
            "relay invocation done"
        );
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn deadline_is_the_earlier_of_invocation_and_max_run_time() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        };
        let start = Instant::now();
        // 60 s left, margin 3 s, max 50 s: max run time wins.
        let (d, src) = run_deadline(ms(now + 60 * S), now, start, 50 * S, 3 * S);
        assert_eq!((d, src), (start + 50 * S, DeadlineSource::MaxRunTime));
        // 30 s left: the invocation minus the margin wins.
        let (d, src) = run_deadline(ms(now + 30 * S), now, start, 50 * S, 3 * S);
        assert_eq!((d, src), (start + 27 * S, DeadlineSource::Invocation));
        // 2 s left, less than the margin: stop at once.
        let (d, src) = run_deadline(ms(now + 2 * S), now, start, 50 * S, 3 * S);
        assert_eq!((d, src), (start, DeadlineSource::Invocation));
        // Missing or past: the configured run time.
        for deadline_ms in [0, 1, ms(now), ms(now) - 5] {
            let (d, src) = run_deadline(deadline_ms, now, start, 50 * S, 3 * S);
            assert_eq!(
                (d, src),
                (start + 50 * S, DeadlineSource::Fallback),
                "{deadline_ms}"
            );
        }
    }

    #[test]
    fn relay_ids_fit_the_limit() {
        assert_eq!(relay_id("fn", "req-1"), "fn-req-1");
        assert_eq!(relay_id("", ""), "outbox-relay-local");
        let long = relay_id(&"f".repeat(100), &"r".repeat(100));
        assert_eq!(long.chars().count(), MAX_RELAY_ID_LEN);
        assert!(long.starts_with(&"f".repeat(100)));
        assert_eq!(relay_id("a\nb", "c"), "ab-c");
        let options = RelayOptions::default().with_relay_id(long);
        options.validate().unwrap();
    }

    #[test]
    fn span_export_follows_the_opentelemetry_variables() {
        let export = |vars: &[(&str, &str)]| {
            let vars: HashMap<&str, &str> = vars.iter().copied().collect();
            SpanExport::from_lookup(|n| vars.get(n).map(|v| v.to_string()))
        };
        assert_eq!(export(&[]).unwrap(), None, "off without an endpoint");
        assert_eq!(
            export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318/")]).unwrap(),
            Some(SpanExport {
                endpoint: "http://localhost:4318/v1/traces".into(),
                timeout: DEFAULT_SPAN_EXPORT_TIMEOUT
            })
        );
        assert_eq!(
            export(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://otlp.example/spans"
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "750"),
            ])
            .unwrap(),
            Some(SpanExport {
                endpoint: "https://otlp.example/spans".into(),
                timeout: Duration::from_millis(750)
            })
        );
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(
                export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off]).unwrap(),
                None,
                "{off:?}"
            );
        }
        for (bad, field) in [
            (
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (("OTEL_TRACES_EXPORTER", "jaeger"), "OTEL_TRACES_EXPORTER"),
            (
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2s"),
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
        ] {
            let vars = [
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://c:4318/v1/traces",
                ),
                bad,
            ];
            let vars = if bad.0 == "OTEL_EXPORTER_OTLP_ENDPOINT" {
                vec![bad]
            } else {
                vars.to_vec()
            };
            let e = export(&vars).unwrap_err();
            assert!(e.to_string().starts_with(field), "{field}: {e}");
            assert_eq!(e.error_type(), "Misconfiguration");
        }
    }

    #[test]
    fn settings_have_defaults_and_name_bad_values() {
        let vars: HashMap<&str, &str> = [
            ("OUTBOX_TABLE_NAME", "orders-outbox"),
            ("KAFKA_BOOTSTRAP_SERVERS", "b-1.example:9098"),
        ]
        .into();
        let s = RelaySettings::from_lookup(|n| vars.get(n).map(|v| v.to_string())).unwrap();
        assert_eq!(s.max_run_time, DEFAULT_MAX_RUN_TIME);
        assert_eq!(s.shutdown_margin, DEFAULT_SHUTDOWN_MARGIN);
        let mut bad = vars.clone();
        bad.insert(env::MAX_RUN_TIME, "soon");
        let e = RelaySettings::from_lookup(|n| bad.get(n).map(|v| v.to_string())).unwrap_err();
        assert!(e.to_string().starts_with("OUTBOX_MAX_RUN_TIME:"), "{e}");
        assert_eq!(e.error_type(), "Misconfiguration");
    }
}
