//! `outboxctl relay`'s OpenTelemetry metrics and traces: the library's `dekaf.outbox.*`
//! instruments ([`dynamo_outbox::metrics::otel`]) and its publish spans (one per produce
//! request, linked to each message's trace context) exported over OTLP/HTTP with protobuf,
//! configured by the standard OpenTelemetry environment, and the fan-out that gives the
//! relay several metrics sinks at once (EMF, OTLP, the health endpoint).
//!
//! On when `--otlp` is given or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set; off otherwise, and with `OTEL_SDK_DISABLED=true`
//! or `OTEL_METRICS_EXPORTER=none`. The endpoint: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`
//! as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/metrics`, else
//! `http://localhost:4318/v1/metrics`; `https://` endpoints use TLS with the system's
//! roots. `OTEL_METRIC_EXPORT_INTERVAL` (ms, 60000), `OTEL_EXPORTER_OTLP_TIMEOUT` /
//! `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT` (ms, 10000: one attempt per export, no retry),
//! `OTEL_EXPORTER_OTLP_HEADERS` / `..._METRICS_HEADERS` (never logged), `OTEL_SERVICE_NAME`
//! (default `outbox-relay`) and `OTEL_RESOURCE_ATTRIBUTES` (`service.instance.id`
//! defaults to the relay id). Only the `http/protobuf` protocol is built in.
//!
//! The spans go to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
//! `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`, else `http://localhost:4318/v1/traces`,
//! through the SDK's batch span processor (`OTEL_BSP_*`; every 5 s by default, and at the
//! stop), with the same timeout and headers; `OTEL_TRACES_EXPORTER=none` exports no
//! spans. The tracer provider is installed as the global one, which the library's Kafka
//! publisher records its spans on.
//!
//! The SDK's periodic reader exports from a thread of its own; the HTTP request runs on
//! the relay's tokio runtime (hyper, the client the AWS SDK already brings), and a failed
//! export is logged at `warn` and dropped: metrics never hold the relay up (its stop waits
//! for the last export, at most 5 s: the SDK's bound on a reader's shutdown).

use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::metrics::otel::{OtelMetrics, METER_NAME};
use dynamo_outbox::metrics::RelayMetrics;
use dynamo_outbox::otlp::{self, OtlpHttpClient};
use dynamo_outbox::protocol::store::WriteKind;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::{usage, Failure};

/// The default endpoint (an OpenTelemetry Collector on the same host).
pub(crate) const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names it.
pub(crate) const DEFAULT_SERVICE_NAME: &str = "outbox-relay";
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the environment (and `--otlp`) says about the OTLP export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtlpConfig {
    /// The full metrics URL (`.../v1/metrics`).
    pub(crate) endpoint: String,
    /// The full traces URL (`.../v1/traces`); `None` with `OTEL_TRACES_EXPORTER=none`.
    pub(crate) traces_endpoint: Option<String>,
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
}

fn set(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn millis(
    lookup: &impl Fn(&str) -> Option<String>,
    names: &[&str],
    default: Duration,
) -> Result<Duration, Failure> {
    for name in names {
        if let Some(v) = set(lookup, name) {
            return match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err(usage(format!(
                    "{name}: {v:?} is not a whole number of milliseconds greater than zero"
                ))),
            };
        }
    }
    Ok(default)
}

impl OtlpConfig {
    /// The configuration, or `None` when the export is off; `flag` is `--otlp`.
    pub(crate) fn from_lookup(
        flag: bool,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, Failure> {
        if set(&lookup, "OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match set(&lookup, "OTEL_METRICS_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(usage(format!(
                    "OTEL_METRICS_EXPORTER: {other:?} is not supported by outboxctl (otlp or none)"
                )))
            }
        }
        let signal = set(&lookup, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
        let base = set(&lookup, "OTEL_EXPORTER_OTLP_ENDPOINT");
        if !flag && signal.is_none() && base.is_none() {
            return Ok(None);
        }
        let signal_endpoint = |signal: Option<String>, name: &'static str, path: &str| {
            let (field, endpoint) = match (signal, &base) {
                (Some(s), _) => (name, s),
                (None, Some(b)) => (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("{}/{path}", b.trim_end_matches('/')),
                ),
                (None, None) => ("--otlp", format!("{DEFAULT_ENDPOINT}/{path}")),
            };
            check_url(field, &endpoint).map(|()| endpoint)
        };
        let endpoint =
            signal_endpoint(signal, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "v1/metrics")?;
        let traces_endpoint = match set(&lookup, "OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => Some(signal_endpoint(
                set(&lookup, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "v1/traces",
            )?),
            Some("none") => None,
            Some(other) => {
                return Err(usage(format!(
                    "OTEL_TRACES_EXPORTER: {other:?} is not supported by outboxctl (otlp or none)"
                )))
            }
        };
        for name in [
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = set(&lookup, name) {
                if p != "http/protobuf" {
                    return Err(usage(format!(
                        "{name}: {p:?} is not supported by outboxctl (http/protobuf)"
                    )));
                }
                break;
            }
        }
        Ok(Some(OtlpConfig {
            endpoint,
            traces_endpoint,
            interval: millis(&lookup, &["OTEL_METRIC_EXPORT_INTERVAL"], DEFAULT_INTERVAL)?,
            timeout: millis(
                &lookup,
                &[
                    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
                    "OTEL_EXPORTER_OTLP_TIMEOUT",
                ],
                DEFAULT_TIMEOUT,
            )?,
        }))
    }
}

/// `endpoint` (from `field`) is an http:// or https:// URL with a host.
fn check_url(field: &str, endpoint: &str) -> Result<(), Failure> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| usage(format!("{field}: {endpoint:?} is not a URL ({e})")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(usage(format!(
            "{field}: {endpoint:?} must be an http:// or https:// URL with a host"
        )));
    }
    Ok(())
}

/// The running export: the relay's sink, and the providers to shut down at the end.
#[derive(Debug)]
pub(crate) struct Otlp {
    pub(crate) metrics: Arc<OtelMetrics>,
    provider: SdkMeterProvider,
    tracer_provider: Option<SdkTracerProvider>,
}

impl Otlp {
    /// Starts the export for the relay `relay_id` reporting as `outbox_name`; `None` when
    /// it is off. Must run inside the tokio runtime (the requests run on it).
    pub(crate) fn start(
        flag: bool,
        relay_id: &str,
        outbox_name: &str,
    ) -> Result<Option<Self>, Failure> {
        let Some(config) = OtlpConfig::from_lookup(flag, |n| std::env::var(n).ok())? else {
            return Ok(None);
        };
        let others: Vec<&str> = config.traces_endpoint.iter().map(String::as_str).collect();
        let client = OtlpHttpClient::new(&config.endpoint, "metrics", &others, config.timeout)?;
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.endpoint.clone())
            .with_timeout(config.timeout)
            .build()
            .map_err(|e| usage(format!("OTLP metrics exporter: {e}")))?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(config.interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(otlp::resource(DEFAULT_SERVICE_NAME, Some(relay_id)))
            .build();
        let metrics = Arc::new(OtelMetrics::new(&provider.meter(METER_NAME), outbox_name)?);
        tracing::info!(
            endpoint = %config.endpoint,
            interval_ms = config.interval.as_millis() as u64,
            "exporting metrics over OTLP/HTTP"
        );
        let tracer_provider = match &config.traces_endpoint {
            None => None,
            Some(endpoint) => {
                let provider = otlp::tracer_provider(
                    &client.for_signal(endpoint, "spans"),
                    otlp::resource(DEFAULT_SERVICE_NAME, Some(relay_id)),
                )?;
                // The library's publish spans go to the global provider.
                opentelemetry::global::set_tracer_provider(provider.clone());
                tracing::info!(endpoint = %endpoint, "exporting publish spans over OTLP/HTTP");
                Some(provider)
            }
        };
        Ok(Some(Otlp {
            metrics,
            provider,
            tracer_provider,
        }))
    }

    /// Exports what is left and stops the reader and the span processor (each bounded by
    /// the export timeout).
    pub(crate) async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "OTLP metrics: the final export failed"),
            Err(e) => tracing::warn!(error = %e, "OTLP metrics: the shutdown did not finish"),
        }
        if let Some(tracer_provider) = self.tracer_provider {
            let done = tokio::task::spawn_blocking(move || tracer_provider.shutdown()).await;
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "OTLP spans: the final export failed"),
                Err(e) => tracing::warn!(error = %e, "OTLP spans: the shutdown did not finish"),
            }
        }
    }
}

/// Several metrics sinks as one.
#[derive(Debug)]
pub(crate) struct Fanout(Vec<Arc<dyn RelayMetrics>>);

impl Fanout {
    /// One sink for `sinks`: none, the only one, or all of them.
    pub(crate) fn of(mut sinks: Vec<Arc<dyn RelayMetrics>>) -> Option<Arc<dyn RelayMetrics>> {
        match sinks.len() {
            0 => None,
            1 => sinks.pop(),
            _ => Some(Arc::new(Fanout(sinks))),
        }
    }
}

impl RelayMetrics for Fanout {
    fn published(&self, bucket: u32, count: u64) {
        self.0.iter().for_each(|m| m.published(bucket, count));
    }
    fn publish_failed(&self, bucket: u32, permanent: bool) {
        self.0
            .iter()
            .for_each(|m| m.publish_failed(bucket, permanent));
    }
    fn publish_not_authorized(&self, bucket: u32, denied: &dynamo_outbox::error::NotAuthorized) {
        self.0
            .iter()
            .for_each(|m| m.publish_not_authorized(bucket, denied));
    }
    fn refused_write(&self, kind: WriteKind) {
        self.0.iter().for_each(|m| m.refused_write(kind));
    }
    fn owned_buckets(&self, count: usize) {
        self.0.iter().for_each(|m| m.owned_buckets(count));
    }
    fn leases_acquired(&self, count: usize) {
        self.0.iter().for_each(|m| m.leases_acquired(count));
    }
    fn leases_lost(&self, count: usize) {
        self.0.iter().for_each(|m| m.leases_lost(count));
    }
    fn backlog(&self, bucket: u32, pending: u32, oldest_age: Option<Duration>) {
        self.0
            .iter()
            .for_each(|m| m.backlog(bucket, pending, oldest_age));
    }
    fn poison_item(&self, bucket: u32) {
        self.0.iter().for_each(|m| m.poison_item(bucket));
    }
    fn quarantined(&self, bucket: u32) {
        self.0.iter().for_each(|m| m.quarantined(bucket));
    }
    fn ownership(&self, bucket: u32, owned: bool) {
        self.0.iter().for_each(|m| m.ownership(bucket, owned));
    }
    fn round_duration(&self, duration: Duration) {
        self.0.iter().for_each(|m| m.round_duration(duration));
    }
    fn batch_duration(&self, bucket: u32, duration: Duration) {
        self.0
            .iter()
            .for_each(|m| m.batch_duration(bucket, duration));
    }
    fn commit_to_ack(&self, bucket: u32, latency: Duration) {
        self.0.iter().for_each(|m| m.commit_to_ack(bucket, latency));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(flag: bool, vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, Failure> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OtlpConfig::from_lookup(flag, |n| vars.get(n).cloned())
    }

    #[test]
    fn off_unless_configured_and_the_standard_endpoints() {
        assert_eq!(config(false, &[]).unwrap(), None);
        assert_eq!(config(false, &[("OTEL_SERVICE_NAME", "x")]).unwrap(), None);
        let flag = config(true, &[]).unwrap().unwrap();
        assert_eq!(flag.endpoint, "http://localhost:4318/v1/metrics");
        assert_eq!(flag.interval, Duration::from_secs(60));
        assert_eq!(flag.timeout, Duration::from_secs(10));
        let base = config(
            false,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(base.endpoint, "http://collector:4318/v1/metrics");
        assert_eq!(
            base.traces_endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            flag.traces_endpoint.as_deref(),
            Some("http://localhost:4318/v1/traces")
        );
        let traces = config(
            false,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://otlp.example/spans",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            traces.traces_endpoint.as_deref(),
            Some("https://otlp.example/spans"),
            "used as it is"
        );
        let no_spans = config(true, &[("OTEL_TRACES_EXPORTER", "none")])
            .unwrap()
            .unwrap();
        assert_eq!(no_spans.traces_endpoint, None);
        assert_eq!(base.interval, Duration::from_secs(5));
        assert_eq!(base.timeout, Duration::from_millis(2500));
        let signal = config(
            false,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                    "https://otlp.example/ingest",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            signal.endpoint, "https://otlp.example/ingest",
            "used as it is"
        );
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ] {
            assert_eq!(
                config(
                    true,
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
        let cases: [(&[(&str, &str)], &str); 7] = [
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://c/v1/traces")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ),
            (
                &[("OTEL_TRACES_EXPORTER", "jaeger")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "ftp://c/v1/metrics")],
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            ),
            (
                &[("OTEL_METRIC_EXPORT_INTERVAL", "10s")],
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                &[("OTEL_METRICS_EXPORTER", "prometheus")],
                "OTEL_METRICS_EXPORTER",
            ),
        ];
        for (vars, field) in cases {
            let e = config(true, vars).unwrap_err();
            assert_eq!(e.code, 2, "{}", e.message);
            assert!(e.message.starts_with(field), "{field}: {}", e.message);
        }
    }
}
