//! The relay function's handler: one invocation runs one relay instance, with its own relay
//! id, until the invocation's deadline minus a shutdown margin (or a configured maximum run
//! time, whichever comes first), then stops gracefully so that its leases are released
//! before Lambda can time the function out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lambda_runtime::LambdaEvent;
use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

use super::event::Wake;
use super::{FunctionError, LambdaSuccessor};
use crate::accounting::RequestCounter;
use crate::error::{Error, Result};
use crate::host::{EmfExport, ExportMode, HostSettings, OtlpSettings, RelayHost, Telemetry};
use crate::metrics::emf::EmfMetrics;
use crate::notification::{decide, CommitNotification, Decision, Skip, StreamSuccessor, Successor};
use crate::options::{parse_duration, MAX_RELAY_ID_LEN};
use crate::publish::KafkaConfig;
use crate::relay::{RunReport, StopReason};
use crate::{DynamoDbOutboxStore, OutboxOptions, RelayOptions};

/// Environment variables of the relay function (besides the library's).
pub mod env {
    /// [`RelaySettings::max_run_time`](super::RelaySettings::max_run_time).
    pub const MAX_RUN_TIME: &str = "OUTBOX_MAX_RUN_TIME";
    /// [`RelaySettings::shutdown_margin`](super::RelaySettings::shutdown_margin).
    pub const SHUTDOWN_MARGIN: &str = "OUTBOX_SHUTDOWN_MARGIN";
    /// [`RelaySettings::successor`](super::RelaySettings::successor): `stream`, `invoke`
    /// or `none`.
    pub const SUCCESSOR: &str = "OUTBOX_SUCCESSOR";
}

/// How a run that ends with work left starts its successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SuccessorMode {
    /// Writes a continuation item; the table's stream invokes the function for it
    /// ([`crate::notification::StreamSuccessor`]): the function must be mapped to the
    /// table's stream with the continuation's filter. No Lambda API call, so nothing
    /// beyond DynamoDB's endpoint in a VPC.
    Stream,
    /// Invokes this function asynchronously ([`LambdaSuccessor`]): needs
    /// `lambda:InvokeFunction` on itself and, in a VPC, Lambda's interface endpoint or a
    /// NAT gateway.
    Invoke,
    /// None: work left waits for the next wake-up.
    None,
}

impl std::str::FromStr for SuccessorMode {
    type Err = Error;

    fn from_str(v: &str) -> Result<Self> {
        match v.trim() {
            "stream" => Ok(SuccessorMode::Stream),
            "invoke" => Ok(SuccessorMode::Invoke),
            "none" => Ok(SuccessorMode::None),
            other => Err(Error::InvalidOption {
                field: env::SUCCESSOR.into(),
                rule: format!("must be stream, invoke or none, not {other:?}"),
            }),
        }
    }
}

/// Default of [`RelaySettings::max_run_time`].
pub const DEFAULT_MAX_RUN_TIME: Duration = Duration::from_secs(50);
/// Default of [`RelaySettings::shutdown_margin`].
pub const DEFAULT_SHUTDOWN_MARGIN: Duration = Duration::from_secs(3);
/// The function's idle stop when `OUTBOX_IDLE_STOP` is unset (the library's default is
/// never): an invocation whose buckets have all been empty this long stops early.
pub const DEFAULT_IDLE_STOP: Duration = Duration::from_secs(5);

/// Everything the relay function is configured with.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// Where the publish spans go, when an OTLP endpoint is configured
    /// ([`OtlpSettings`] of [`ExportMode::Invocation`]).
    pub spans: Option<OtlpSettings>,
    /// How a run that ends with work left starts its successor (`OUTBOX_SUCCESSOR`;
    /// unset: [`SuccessorMode::Invoke`] inside Lambda, [`SuccessorMode::None`] elsewhere).
    pub successor: SuccessorMode,
}

impl RelaySettings {
    /// Reads the settings from the process environment.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the variable that breaks a rule.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (an environment stand-in) and validates them:
    /// [`HostSettings::from_lookup`] with the function's defaults.
    ///
    /// # Errors
    /// As [`RelaySettings::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let HostSettings {
            outbox,
            mut relay,
            kafka,
        } = HostSettings::from_lookup(&lookup)?;
        if lookup(crate::options::env::IDLE_STOP).is_none() {
            relay.idle_stop = Some(DEFAULT_IDLE_STOP);
        }
        if lookup(crate::options::env::MAX_IN_FLIGHT_BYTES).is_none() {
            // Lambda says the function's memory size: an eighth of it for batches, so
            // the template's 128 MB holds 16 MiB of messages in flight with headroom.
            if let Some(mb) = lookup("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
                .and_then(|v| v.trim().parse::<usize>().ok())
            {
                relay.max_in_flight_bytes = (mb << 20) / 8;
                relay.validate()?;
            }
        }
        let max_run_time = match lookup(env::MAX_RUN_TIME) {
            Some(v) => parse_duration(env::MAX_RUN_TIME, &v)?,
            None => DEFAULT_MAX_RUN_TIME,
        };
        let shutdown_margin = match lookup(env::SHUTDOWN_MARGIN) {
            Some(v) => parse_duration(env::SHUTDOWN_MARGIN, &v)?,
            None => DEFAULT_SHUTDOWN_MARGIN,
        };
        let spans = OtlpSettings::from_lookup(ExportMode::Invocation, &lookup)?;
        let successor = match lookup(env::SUCCESSOR).filter(|v| !v.trim().is_empty()) {
            Some(v) => v.parse()?,
            None if lookup("AWS_LAMBDA_FUNCTION_NAME").is_some() => SuccessorMode::Invoke,
            None => SuccessorMode::None,
        };
        if max_run_time < Duration::from_secs(1) {
            return Err(Error::InvalidOption {
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
            successor,
        })
    }
}

/// Where the run's deadline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
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
    match super::time_left(deadline_ms, now) {
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
#[non_exhaustive]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A direct invocation: the schedule's tick, a manual invoke, or any other payload that
    /// is neither a commit notification nor a doorbell.
    Direct,
    /// A commit notification ([`crate::notification::CommitNotification`]) from the event bus.
    Notification,
    /// A doorbell: a batch of the table's DynamoDB stream records (message inserts by any
    /// writer), from the event source mapping.
    Doorbell,
    /// A successor request from a relay that left work in its buckets
    /// ([`crate::notification::Handoff`]).
    Successor,
}

/// How an invocation ended: the stop reason of the relay it ran, or why it ran none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// Whether the run ended with work left and could not start its successor.
    pub successor_failed: bool,
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
            successor_failed: report.successor_failed,
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
            successor_failed: false,
            doubt: None,
            deadline_source: source,
            time_left_ms: millis(time_left),
            dynamodb_requests: BTreeMap::new(),
            dynamodb_consistent_reads: BTreeMap::new(),
        }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// The relay function's handler: the clients of one execution environment (built once,
/// before the runtime loop) and what each invocation does with them.
#[derive(Debug)]
pub struct RelayHandler {
    settings: RelaySettings,
    host: RelayHost,
    /// Counts the DynamoDB client's attempts, when it has the counter attached.
    requests: Option<RequestCounter>,
}

impl RelayHandler {
    /// The handler the deployed function runs: settings from the environment
    /// ([`RelaySettings::from_env`]), the standard AWS configuration, a DynamoDB client with
    /// the relay's timeouts whose attempts each summary counts, and, inside Lambda
    /// (`AWS_LAMBDA_FUNCTION_NAME` set), successors started by invoking this function.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming a variable that breaks a rule; as
    /// [`RelayHandler::new`].
    pub async fn from_env() -> Result<Self> {
        let settings = RelaySettings::from_env()?;
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let requests = RequestCounter::default();
        let client = crate::client::counted_dynamodb_client(&config, requests.clone());
        let mode = settings.successor;
        let mut handler = RelayHandler::new(client, settings)?.with_request_counter(requests);
        // A run that leaves work starts its successor: a continuation item the table's
        // stream delivers, or an asynchronous invocation of this function (Lambda sets its
        // name; AWS_ENDPOINT_URL_LAMBDA points a local emulator's runs at the emulator).
        match mode {
            SuccessorMode::Stream => {
                let successor = StreamSuccessor::new(handler.host.store());
                handler = handler.with_successor(Arc::new(successor));
            }
            SuccessorMode::Invoke => {
                let name = std::env::var("AWS_LAMBDA_FUNCTION_NAME").map_err(|_| {
                    Error::InvalidOption {
                        field: env::SUCCESSOR.into(),
                        rule: "invoke needs AWS_LAMBDA_FUNCTION_NAME (set by Lambda)".into(),
                    }
                })?;
                let lambda = aws_sdk_lambda::Client::new(&config);
                handler = handler.with_successor(Arc::new(LambdaSuccessor::new(lambda, name)));
            }
            SuccessorMode::None => {}
        }
        Ok(handler)
    }

    /// The handler over `client` (built once per execution environment). With
    /// [`RelaySettings::spans`], it installs the global tracer provider exporting the
    /// publish spans; it must then run inside a tokio runtime (the exports run on it).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when the settings break a rule;
    /// [`Error::Misconfiguration`] when the span export cannot start.
    pub fn new(client: aws_sdk_dynamodb::Client, settings: RelaySettings) -> Result<Self> {
        let store = DynamoDbOutboxStore::new(client, settings.outbox.clone())?;
        let metrics = EmfMetrics::from_env(settings.outbox.table_name.clone());
        // The first invocation of this execution environment is its cold start.
        metrics.cold_start();
        let mut host =
            RelayHost::with_store(store, settings.relay.clone(), settings.kafka.clone())?
                .with_emf(EmfExport::new(metrics));
        if let Some(spans) = &settings.spans {
            host = host.with_telemetry(Telemetry::start(
                spans.clone(),
                None,
                &settings.relay.metrics_name,
            )?);
        }
        Ok(RelayHandler {
            settings,
            host,
            requests: None,
        })
    }

    /// Writes the EMF documents to `out` instead of stdout (a test reading them back).
    pub fn with_metrics_output(mut self, out: impl std::io::Write + Send + 'static) -> Self {
        self.host = self.host.map_emf(|emf| emf.with_output(out));
        self
    }

    /// Reports each invocation's DynamoDB attempts from `counter`, which must be attached
    /// to the client the handler was built with
    /// ([`crate::client::counted_dynamodb_client`]).
    pub fn with_request_counter(mut self, counter: RequestCounter) -> Self {
        self.requests = Some(counter);
        self
    }

    /// Starts a successor through `successor` when a run leaves work in its buckets (the
    /// deployed function: [`LambdaSuccessor`], itself).
    pub fn with_successor(mut self, successor: Arc<dyn Successor>) -> Self {
        self.host = self.host.with_successor(successor);
        self
    }

    /// The settings the handler runs with.
    pub fn settings(&self) -> &RelaySettings {
        &self.settings
    }

    /// The relay host the invocations run on (its store, its Kafka publisher).
    pub fn host(&self) -> &RelayHost {
        &self.host
    }

    /// Handles one invocation. A commit notification or a doorbell first decides whether a
    /// relay is needed ([`decide`]) and returns at once (`stop_reason` `covered`, `empty`
    /// or `not_this_outbox`) when it is not; any other payload (a schedule tick, a
    /// successor request, a manual invoke), and a wake-up that joins, runs one relay until
    /// the run deadline, then returns the summary. The spans of the invocation are
    /// exported before it returns.
    ///
    /// # Errors
    /// A [`FunctionError`] whose `errorType` says what the caller can do: a payload that
    /// says it is a commit notification but breaks a rule (`ValidationError`), a run that
    /// could not start (`Misconfiguration`, `DynamoDb`).
    pub async fn handle(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> std::result::Result<RelaySummary, FunctionError> {
        let before = self
            .requests
            .as_ref()
            .map(|c| (c.snapshot(), c.consistent_reads()));
        let result = self.invoke(event).await;
        if let Some(telemetry) = self.host.telemetry() {
            telemetry.flush().await;
        }
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

    async fn invoke(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> std::result::Result<RelaySummary, FunctionError> {
        let start = Instant::now();
        let context = event.context;
        let (deadline, source) = run_deadline(
            context.deadline,
            SystemTime::now(),
            start,
            self.settings.max_run_time,
            self.settings.shutdown_margin,
        );
        let mut options = self.host.options().clone();
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
            // With the stream as the relays' trigger the schedule is a safety net: its tick
            // adds a relay only for buckets no live relay holds (during a long Kafka outage,
            // the successors' chain already holds them).
            Wake::Tick { scheduled: true } if self.settings.successor == SuccessorMode::Stream => (
                Trigger::Direct,
                Some(CommitNotification::new(
                    &self.settings.outbox,
                    0..self.settings.outbox.bucket_count,
                )),
            ),
            Wake::Tick { .. } => (Trigger::Direct, None),
            Wake::Successor(handoff) => {
                info!(predecessor = %handoff.predecessor, buckets = ?handoff.buckets, "started as a successor");
                (Trigger::Successor, None)
            }
            Wake::Notification(n) => (Trigger::Notification, Some(n)),
            Wake::Doorbell(n) => (Trigger::Doorbell, Some(n)),
        };
        let publisher = self.host.publisher();
        let was_connected = publisher.is_connected().await;
        let (uncovered, doubt) = match notified {
            None => (None, None),
            Some(n) => {
                // The head start: connect while deciding, so that the time between the
                // second look and the heartbeat is short. A failure is the relay's to retry.
                let prepare = async {
                    let _ = publisher.connect(deadline).await;
                };
                match decide(
                    self.host.store(),
                    &n,
                    &options,
                    deadline,
                    &context.request_id,
                    prepare,
                )
                .await
                {
                    Decision::Join {
                        uncovered,
                        doubt,
                        alone,
                    } => {
                        // Started alone: its first read need not wait the full join delay
                        // when its heartbeat lands soon enough.
                        options.alone_until = alone;
                        (Some(uncovered), doubt)
                    }
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
        // Every run looks for work left once more before its stop: a doorbell's run holds
        // only its own shard, and the doorbells of commits to buckets on other shards answer
        // `covered` while it owns them.
        let report = self.host.run_until_with(options, deadline, true).await?;
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
            successor_failed = summary.successor_failed,
            time_left_ms = summary.time_left_ms,
            "relay invocation done"
        );
        Ok(summary)
    }
}

/// Runs `handler` under the Lambda runtime (the loop that receives the invocations) until
/// the execution environment ends.
///
/// # Errors
/// The runtime's own: the Runtime API could not be reached.
pub async fn run(handler: RelayHandler) -> std::result::Result<(), lambda_runtime::Error> {
    let handler = Arc::new(handler);
    lambda_runtime::run(lambda_runtime::service_fn(
        move |event: LambdaEvent<serde_json::Value>| {
            let handler = handler.clone();
            // Boxed: the relay's future is deep, and the runtime's future nests it.
            Box::pin(async move { handler.handle(event).await })
        },
    ))
    .await
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
