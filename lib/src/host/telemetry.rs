//! The relay's OpenTelemetry export over OTLP/HTTP (protobuf), configured by the standard
//! OpenTelemetry environment: the `dekaf.outbox.*` instruments of
//! [`crate::metrics::otel`] and the Kafka publisher's publish spans (one per produce
//! request, linked to each message's trace context).
//!
//! Two kinds of host read the same variables with their own defaults ([`ExportMode`]):
//! a long-lived process exports metrics and spans periodically and once more at its stop;
//! a Lambda function exports only its spans (its metrics go to CloudWatch as EMF
//! documents, [`super::EmfExport`]) and flushes them before each invocation returns.
//!
//! The variables: `OTEL_SDK_DISABLED=true` turns everything off;
//! `OTEL_METRICS_EXPORTER` / `OTEL_TRACES_EXPORTER` `otlp` or `none`. The endpoints:
//! `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` / `..._TRACES_ENDPOINT` as they are, else
//! `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/metrics` / `/v1/traces`, else (a process started
//! with the export asked for) `http://localhost:4318`; `https://` endpoints use TLS with
//! the system's roots. `OTEL_METRIC_EXPORT_INTERVAL` (ms, 60000),
//! `OTEL_EXPORTER_OTLP_TIMEOUT` and the signals' own (ms; one attempt per export, no
//! retry), `OTEL_EXPORTER_OTLP_HEADERS` (never logged), `OTEL_SERVICE_NAME` (default
//! `outbox-relay`) and `OTEL_RESOURCE_ATTRIBUTES` (`service.instance.id` defaults to the
//! relay id of a process). Only the `http/protobuf` protocol is built in.
//!
//! The SDK's periodic reader and batch span processor export from threads of their own;
//! the HTTP request runs on the tokio runtime the export was started on (hyper, the client
//! the AWS SDK already brings), and a failed export is logged at `warn` and dropped:
//! telemetry never holds the relay up. A process's stop waits for the last export, at
//! most the export timeout per signal; an invocation's flush waits at most its timeout.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{info, warn};

use super::otlp::{self, OtlpHttpClient};
use crate::error::{Error, Result};
use crate::metrics::otel::{OtelMetrics, METER_NAME};

/// The endpoint a process exports to when asked to export and no variable names one (an
/// OpenTelemetry Collector on the same host; the ADOT collector layer in Lambda).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names it.
pub const DEFAULT_SERVICE_NAME: &str = "outbox-relay";
/// A process's default export timeout.
pub const DEFAULT_PROCESS_TIMEOUT: Duration = Duration::from_secs(10);
/// An invocation's default export timeout: short, since the invocation waits for it.
pub const DEFAULT_INVOCATION_TIMEOUT: Duration = Duration::from_secs(2);
/// The default period of the metrics export.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Longest a process's stop waits for its final exports (metrics and spans together).
pub const FINAL_EXPORT_BOUND: Duration = Duration::from_secs(5);

/// What kind of host exports, which sets the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExportMode {
    /// A long-lived process (`outboxctl relay`, a relay inside a service): metrics and
    /// spans, on when `asked` (`outboxctl relay --otlp`) or when a metrics endpoint
    /// variable is set, to [`DEFAULT_ENDPOINT`] when asked without one; export timeout
    /// [`DEFAULT_PROCESS_TIMEOUT`].
    Process {
        /// The export was asked for (a flag) even without an endpoint variable.
        asked: bool,
    },
    /// A Lambda function: spans only, on when a traces endpoint variable is set, flushed
    /// before each invocation returns; export timeout [`DEFAULT_INVOCATION_TIMEOUT`].
    Invocation,
}

/// Where and how the export goes; [`OtlpSettings::from_lookup`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OtlpSettings {
    /// The full metrics URL (`.../v1/metrics`); `None`: no metrics exported.
    pub metrics_endpoint: Option<String>,
    /// The full traces URL (`.../v1/traces`); `None`: no spans exported.
    pub traces_endpoint: Option<String>,
    /// How often metrics are exported.
    pub interval: Duration,
    /// How long one export may take.
    pub timeout: Duration,
}

fn set(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn bad(field: &str, rule: String) -> Error {
    Error::InvalidOption {
        field: field.into(),
        rule,
    }
}

fn millis(
    lookup: &impl Fn(&str) -> Option<String>,
    names: &[&str],
    default: Duration,
) -> Result<Duration> {
    for name in names {
        if let Some(v) = set(lookup, name) {
            return match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err(bad(
                    name,
                    format!("{v:?} is not a whole number of milliseconds greater than zero"),
                )),
            };
        }
    }
    Ok(default)
}

/// `endpoint` (from `field`) is an http:// or https:// URL with a host.
fn check_url(field: &str, endpoint: &str) -> Result<()> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| bad(field, format!("{endpoint:?} is not a URL ({e})")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(bad(
            field,
            format!("{endpoint:?} must be an http:// or https:// URL with a host"),
        ));
    }
    Ok(())
}

/// `OTEL_<SIGNAL>_EXPORTER`: whether the signal is exported (`otlp`, the default) or not
/// (`none`).
fn exporter_on(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Result<bool> {
    match set(lookup, name).as_deref() {
        None | Some("otlp") => Ok(true),
        Some("none") => Ok(false),
        Some(other) => Err(bad(
            name,
            format!("{other:?} is not supported (otlp or none)"),
        )),
    }
}

impl OtlpSettings {
    /// The export the process environment configures for `mode`; `None` when it is off.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the variable: an endpoint that is not an http(s)
    /// URL with a host, an exporter other than `otlp` or `none`, a protocol other than
    /// `http/protobuf`, a timeout or interval that is not a positive number of
    /// milliseconds.
    pub fn from_env(mode: ExportMode) -> Result<Option<Self>> {
        Self::from_lookup(mode, |name| std::env::var(name).ok())
    }

    /// [`OtlpSettings::from_env`] reading the variables through `lookup`.
    ///
    /// # Errors
    /// As [`OtlpSettings::from_env`].
    ///
    /// # Examples
    /// ```
    /// # #[cfg(feature = "host")] {
    /// use dynamo_outbox::host::{ExportMode, OtlpSettings};
    ///
    /// let vars = |name: &str| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://collector:4318".to_string());
    /// let export = OtlpSettings::from_lookup(ExportMode::Invocation, vars).unwrap().unwrap();
    /// assert_eq!(export.traces_endpoint.as_deref(), Some("http://collector:4318/v1/traces"));
    /// assert_eq!(export.metrics_endpoint, None, "a function's metrics go as EMF");
    /// # }
    /// ```
    pub fn from_lookup(
        mode: ExportMode,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>> {
        if set(&lookup, "OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let base = set(&lookup, "OTEL_EXPORTER_OTLP_ENDPOINT");
        let endpoint = |signal_var: &'static str, path: &str, default: bool| {
            let found = match (set(&lookup, signal_var), &base) {
                (Some(s), _) => Some((signal_var, s)),
                (None, Some(b)) => Some((
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("{}/{path}", b.trim_end_matches('/')),
                )),
                (None, None) if default => Some(("--otlp", format!("{DEFAULT_ENDPOINT}/{path}"))),
                (None, None) => None,
            };
            match found {
                Some((field, e)) => check_url(field, &e).map(|()| Some(e)),
                None => Ok(None),
            }
        };
        let (metrics_endpoint, default_timeout, default_traces) = match mode {
            ExportMode::Process { asked } => {
                let metrics_var = set(&lookup, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
                if !asked && metrics_var.is_none() && base.is_none() {
                    return Ok(None);
                }
                let metrics = if exporter_on(&lookup, "OTEL_METRICS_EXPORTER")? {
                    endpoint("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "v1/metrics", true)?
                } else {
                    return Ok(None);
                };
                (metrics, DEFAULT_PROCESS_TIMEOUT, true)
            }
            ExportMode::Invocation => (None, DEFAULT_INVOCATION_TIMEOUT, false),
        };
        let traces_endpoint = if exporter_on(&lookup, "OTEL_TRACES_EXPORTER")? {
            endpoint(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "v1/traces",
                default_traces,
            )?
        } else {
            None
        };
        if metrics_endpoint.is_none() && traces_endpoint.is_none() {
            return Ok(None);
        }
        let signal = if metrics_endpoint.is_some() {
            "METRICS"
        } else {
            "TRACES"
        };
        for name in [
            format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"),
            "OTEL_EXPORTER_OTLP_PROTOCOL".to_string(),
        ] {
            if let Some(p) = set(&lookup, &name) {
                if p != "http/protobuf" {
                    return Err(bad(
                        &name,
                        format!("{p:?} is not supported (http/protobuf)"),
                    ));
                }
                break;
            }
        }
        let signal_timeout = format!("OTEL_EXPORTER_OTLP_{signal}_TIMEOUT");
        Ok(Some(OtlpSettings {
            metrics_endpoint,
            traces_endpoint,
            interval: millis(&lookup, &["OTEL_METRIC_EXPORT_INTERVAL"], DEFAULT_INTERVAL)?,
            timeout: millis(
                &lookup,
                &[signal_timeout.as_str(), "OTEL_EXPORTER_OTLP_TIMEOUT"],
                default_timeout,
            )?,
        }))
    }
}

/// The running export: the relay's metrics sink (when metrics are exported) and the
/// providers to flush and shut down.
#[derive(Debug)]
pub struct Telemetry {
    settings: OtlpSettings,
    metrics: Option<Arc<OtelMetrics>>,
    meter_provider: Option<SdkMeterProvider>,
    tracer_provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Starts the export `settings` describe, for the relay `relay_id` (the resource's
    /// `service.instance.id`, when given) reporting its metrics as `outbox_name`. The
    /// tracer provider is installed as the global one, which the Kafka publisher records
    /// its spans on. Must run inside a tokio runtime (the requests run on it).
    ///
    /// # Errors
    /// [`Error::Misconfiguration`] when an `https://` endpoint finds no trusted root
    /// certificate on the system or an exporter cannot be built; [`Error::InvalidOption`]
    /// for an outbox name the instruments refuse.
    pub fn start(
        settings: OtlpSettings,
        relay_id: Option<&str>,
        outbox_name: &str,
    ) -> Result<Self> {
        let endpoints: Vec<&str> = settings
            .metrics_endpoint
            .iter()
            .chain(settings.traces_endpoint.iter())
            .map(String::as_str)
            .collect();
        let Some((first, others)) = endpoints.split_first() else {
            return Err(Error::misconfigured("OTLP export without an endpoint"));
        };
        let client = OtlpHttpClient::new(first, "telemetry", others, settings.timeout)?;
        let resource = || otlp::resource(DEFAULT_SERVICE_NAME, relay_id);
        let (metrics, meter_provider) = match &settings.metrics_endpoint {
            None => (None, None),
            Some(endpoint) => {
                let exporter = opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_http_client(client.for_signal(endpoint, "metrics"))
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(endpoint.clone())
                    .with_timeout(settings.timeout)
                    .build()
                    .map_err(|e| Error::misconfigured_by("OTLP metrics exporter", e))?;
                let reader = PeriodicReader::builder(exporter)
                    .with_interval(settings.interval)
                    .build();
                let provider = SdkMeterProvider::builder()
                    .with_reader(reader)
                    .with_resource(resource())
                    .build();
                let metrics = Arc::new(OtelMetrics::new(&provider.meter(METER_NAME), outbox_name)?);
                info!(
                    endpoint = %endpoint,
                    interval_ms = settings.interval.as_millis() as u64,
                    "exporting metrics over OTLP/HTTP"
                );
                (Some(metrics), Some(provider))
            }
        };
        let tracer_provider = match &settings.traces_endpoint {
            None => None,
            Some(endpoint) => {
                let provider =
                    otlp::tracer_provider(&client.for_signal(endpoint, "spans"), resource())?;
                opentelemetry::global::set_tracer_provider(provider.clone());
                info!(endpoint = %endpoint, "exporting publish spans over OTLP/HTTP");
                Some(provider)
            }
        };
        Ok(Telemetry {
            settings,
            metrics,
            meter_provider,
            tracer_provider,
        })
    }

    /// The relay's metrics sink, when metrics are exported.
    pub fn metrics(&self) -> Option<Arc<OtelMetrics>> {
        self.metrics.clone()
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &OtlpSettings {
        &self.settings
    }

    /// Exports the spans recorded so far (an invocation's, before it returns: Lambda may
    /// freeze the environment right after), waiting at most the export timeout; a failure
    /// is logged.
    pub async fn flush(&self) {
        let Some(provider) = self.tracer_provider.clone() else {
            return;
        };
        let timeout = self.settings.timeout;
        let flush = tokio::task::spawn_blocking(move || provider.force_flush());
        match tokio::time::timeout(timeout + Duration::from_millis(250), flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "exporting the spans failed"),
            Ok(Err(e)) => warn!(error = %e, "exporting the spans did not finish"),
            Err(_) => warn!(
                timeout_ms = timeout.as_millis() as u64,
                "exporting the spans took too long; the rest goes with the next flush"
            ),
        }
    }

    /// Exports what is left and stops the reader and the span processor, both at once,
    /// waiting at most [`FINAL_EXPORT_BOUND`] for them: an endpoint that never answers holds
    /// a process's stop no longer than that.
    pub async fn shutdown(self) {
        let metrics = async {
            if let Some(provider) = self.meter_provider {
                match tokio::task::spawn_blocking(move || provider.shutdown()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(error = %e, "OTLP metrics: the final export failed"),
                    Err(e) => warn!(error = %e, "OTLP metrics: the shutdown did not finish"),
                }
            }
        };
        let spans = async {
            if let Some(provider) = self.tracer_provider {
                match tokio::task::spawn_blocking(move || provider.shutdown()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(error = %e, "OTLP spans: the final export failed"),
                    Err(e) => warn!(error = %e, "OTLP spans: the shutdown did not finish"),
                }
            }
        };
        if tokio::time::timeout(FINAL_EXPORT_BOUND, futures::future::join(metrics, spans))
            .await
            .is_err()
        {
            warn!(
                bound_ms = FINAL_EXPORT_BOUND.as_millis() as u64,
                "OTLP: the final export did not finish in time; what was left is dropped"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(mode: ExportMode, vars: &[(&str, &str)]) -> Result<Option<OtlpSettings>> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OtlpSettings::from_lookup(mode, |n| vars.get(n).cloned())
    }

    const ASKED: ExportMode = ExportMode::Process { asked: true };
    const NOT_ASKED: ExportMode = ExportMode::Process { asked: false };

    #[test]
    fn a_process_is_off_unless_configured_and_uses_the_standard_endpoints() {
        assert_eq!(settings(NOT_ASKED, &[]).unwrap(), None);
        assert_eq!(
            settings(NOT_ASKED, &[("OTEL_SERVICE_NAME", "x")]).unwrap(),
            None
        );
        let flag = settings(ASKED, &[]).unwrap().unwrap();
        assert_eq!(
            flag.metrics_endpoint.as_deref(),
            Some("http://localhost:4318/v1/metrics")
        );
        assert_eq!(
            flag.traces_endpoint.as_deref(),
            Some("http://localhost:4318/v1/traces")
        );
        assert_eq!(flag.interval, Duration::from_secs(60));
        assert_eq!(flag.timeout, Duration::from_secs(10));
        let base = settings(
            NOT_ASKED,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            base.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(
            base.traces_endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(base.interval, Duration::from_secs(5));
        assert_eq!(base.timeout, Duration::from_millis(2500));
        let signals = settings(
            NOT_ASKED,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                    "https://otlp.example/ingest",
                ),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://otlp.example/spans",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            signals.metrics_endpoint.as_deref(),
            Some("https://otlp.example/ingest"),
            "used as it is"
        );
        assert_eq!(
            signals.traces_endpoint.as_deref(),
            Some("https://otlp.example/spans"),
            "used as it is"
        );
        let no_spans = settings(ASKED, &[("OTEL_TRACES_EXPORTER", "none")])
            .unwrap()
            .unwrap();
        assert_eq!(no_spans.traces_endpoint, None);
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ] {
            assert_eq!(
                settings(
                    ASKED,
                    &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off]
                )
                .unwrap(),
                None,
                "{off:?}"
            );
        }
    }

    #[test]
    fn an_invocation_exports_spans_only_with_an_endpoint() {
        let none = ExportMode::Invocation;
        assert_eq!(
            settings(none, &[]).unwrap(),
            None,
            "off without an endpoint"
        );
        assert_eq!(
            settings(
                none,
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318/")]
            )
            .unwrap(),
            Some(OtlpSettings {
                metrics_endpoint: None,
                traces_endpoint: Some("http://localhost:4318/v1/traces".into()),
                interval: DEFAULT_INTERVAL,
                timeout: DEFAULT_INVOCATION_TIMEOUT,
            })
        );
        let own = settings(
            none,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://otlp.example/spans",
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "750"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            own.traces_endpoint.as_deref(),
            Some("https://otlp.example/spans")
        );
        assert_eq!(own.timeout, Duration::from_millis(750));
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(
                settings(
                    none,
                    &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off]
                )
                .unwrap(),
                None,
                "{off:?}"
            );
        }
    }

    #[test]
    fn bad_settings_name_the_variable() {
        type Case<'a> = (ExportMode, &'a [(&'a str, &'a str)], &'a str);
        let cases: [Case<'_>; 9] = [
            (
                ASKED,
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://c/v1/traces")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ),
            (
                ASKED,
                &[("OTEL_TRACES_EXPORTER", "jaeger")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                ASKED,
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                ASKED,
                &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "ftp://c/v1/metrics")],
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            ),
            (
                ASKED,
                &[("OTEL_METRIC_EXPORT_INTERVAL", "10s")],
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
            (
                ASKED,
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                ASKED,
                &[("OTEL_METRICS_EXPORTER", "prometheus")],
                "OTEL_METRICS_EXPORTER",
            ),
            (
                ExportMode::Invocation,
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                ExportMode::Invocation,
                &[
                    (
                        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                        "http://c:4318/v1/traces",
                    ),
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "2s"),
                ],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
        ];
        for (mode, vars, field) in cases {
            let e = settings(mode, vars).unwrap_err();
            assert!(e.to_string().starts_with(field), "{field}: {e}");
            assert_eq!(e.error_type(), "Misconfiguration");
        }
    }
}
