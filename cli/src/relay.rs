//! `outboxctl relay`: a long-lived relay, stopped by SIGTERM or SIGINT (or after `--for`),
//! with EMF on stdout, OpenTelemetry over OTLP and a health endpoint when asked.

use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::host::{EmfExport, ExportMode, OtlpSettings, RelayHost, Telemetry};
use dynamo_outbox::metrics::emf::EmfMetrics;
use dynamo_outbox::options::parse_duration;
use dynamo_outbox::publish::KafkaConfig;
use dynamo_outbox::DynamoDbOutboxStore;
use tokio::time::Instant;

use crate::{health, outbox_options, relay_options, Cli, Failure};

/// Flags of `outboxctl relay`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Stop after this long (e.g. 30s, 5m), or at a signal if one comes first.
    #[arg(long = "for", value_name = "DURATION", value_parser = crate::args::positive_duration)]
    pub(crate) run_for: Option<Duration>,
    /// Time allowed for the graceful stop after a signal.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::args::duration)]
    pub(crate) grace: Duration,
    /// Print the relay's metrics to stdout as CloudWatch Embedded Metric Format
    /// documents (one JSON line each, as the Lambda relay does; namespace from
    /// POWERTOOLS_METRICS_NAMESPACE, default Outbox) every --emf-interval and at the end.
    /// A log shipper with EMF support (CloudWatch agent, Fluent Bit) turns them into
    /// CloudWatch metrics.
    #[arg(long)]
    pub(crate) emf: bool,
    /// How often --emf flushes.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::args::positive_duration)]
    pub(crate) emf_interval: Duration,
    /// Export the relay's metrics over OTLP/HTTP (protobuf) with the instrument names of
    /// the reference implementation (dekaf.outbox.*, attribute outbox.name from
    /// OUTBOX_METRICS_NAME), and its publish spans (one per produce request, linked to
    /// each message's traceparent; OTEL_TRACES_EXPORTER=none: no spans). Also on without
    /// the flag when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is
    /// set; the standard OTEL_* variables configure it (default endpoint
    /// http://localhost:4318, OTEL_METRIC_EXPORT_INTERVAL 60000 ms, OTEL_SERVICE_NAME
    /// outbox-relay); OTEL_SDK_DISABLED=true turns it off.
    #[arg(long)]
    pub(crate) otlp: bool,
    /// Answer liveness and readiness probes over HTTP on ADDR (e.g. 0.0.0.0:8080):
    /// GET /healthz is 200 while the relay loop runs, GET /readyz is 200 while the relay
    /// is connected and heartbeating (its last lease round completed within a lease
    /// duration, its heartbeat not refused, no owned bucket's latest batch failed).
    #[arg(long, value_name = "ADDR", env = "OUTBOX_HEALTH_LISTEN")]
    pub(crate) health_listen: Option<String>,
    /// How the relay delivers: at-least-once (the default), or exactly-once: one Kafka
    /// transaction per batch, each bucket's producer fenced when its lease moves, so that
    /// read_committed consumers see every message once (docs/protocol.md, section 8; the
    /// watermark topic OUTBOX_WATERMARK_TOPIC must exist). Overrides OUTBOX_DELIVERY.
    #[arg(long, value_name = "MODE")]
    pub(crate) delivery: Option<String>,
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let options = outbox_options(cli, None)?;
    let Args {
        run_for,
        grace,
        emf,
        emf_interval,
        otlp,
        ref health_listen,
        ref delivery,
    } = *args;
    let relay_opts = relay_options(&options)?;
    let health = Arc::new(health::Health::new(relay_opts.lease_duration));
    if let Some(listen) = health_listen {
        health::serve(listen, health.clone()).await?;
    }
    // The client with attempt and operation timeouts (lib/src/client.rs): a
    // half-open connection must not hold a renewal past the lease.
    let client = dynamo_outbox::client::dynamodb_client_from_env().await;
    let store = DynamoDbOutboxStore::new(client, options.clone())?;
    let store = match test_clock_offset()? {
        Some(ticks) => {
            tracing::warn!(
                offset_ticks = ticks,
                "OUTBOX_TEST_CLOCK_OFFSET is set: this relay's lease clock is offset (tests only)"
            );
            store.with_clock(Arc::new(dynamo_outbox::protocol::clock::OffsetClock::new(
                ticks,
            )))
        }
        None => store,
    };
    let mut kafka = KafkaConfig::from_env()?;
    if let Some(mode) = delivery {
        kafka.delivery = mode.parse()?;
    }
    let mut host = RelayHost::with_store(store, relay_opts, kafka)?;
    if emf {
        host = host.with_emf(
            EmfExport::new(EmfMetrics::from_env(&options.table_name)).with_interval(emf_interval),
        );
    }
    if let Some(export) = OtlpSettings::from_env(ExportMode::Process { asked: otlp })? {
        let opts = host.options();
        let telemetry = Telemetry::start(export, Some(&opts.relay_id), &opts.metrics_name)?;
        host = host.with_telemetry(telemetry);
    }
    if health_listen.is_some() {
        host = host.with_metrics(health.clone());
    }
    // A command fails fast on a Kafka it cannot reach: connect before relaying.
    host.publisher()
        .connect(Instant::now() + Duration::from_secs(30))
        .await?;
    health.started();
    let signal = {
        let health = health.clone();
        async move {
            shutdown_signal().await;
            health.stopping();
        }
    };
    let opts = host.options().clone();
    let result = match run_for {
        // Until the time is up or a signal, whichever comes first.
        Some(d) => {
            host.run_until_or_shutdown(opts, Instant::now() + d, signal, grace)
                .await
        }
        None => host.run_until_shutdown(opts, signal, grace).await,
    };
    health.ended();
    host.shutdown().await;
    let report = result?;
    println!(
        "relay {} stopped ({}): published {}, refused writes {}, leases released: {}",
        report.relay_id,
        report.stop_reason.as_str(),
        report.published,
        report.refused_total(),
        report.released
    );
    Ok(())
}

/// The test-only lease clock offset of `outboxctl relay`: `OUTBOX_TEST_CLOCK_OFFSET`, a
/// duration with an optional sign (`-5s`, `+2s`, `1500ms`), in ticks. Used by the
/// fault-injection harness (`harness/`) to run a relay whose clock is off.
fn test_clock_offset() -> Result<Option<i64>, Failure> {
    const VAR: &str = "OUTBOX_TEST_CLOCK_OFFSET";
    match std::env::var(VAR) {
        Ok(value) => Ok(Some(parse_clock_offset(VAR, &value)?)),
        Err(_) => Ok(None),
    }
}

/// A signed duration (`-5s`, `+2s`, `1500ms`) in ticks.
fn parse_clock_offset(field: &str, value: &str) -> Result<i64, Failure> {
    let value = value.trim();
    let (sign, magnitude) = match value.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, value.strip_prefix('+').unwrap_or(value)),
    };
    let d = parse_duration(field, magnitude)?;
    Ok(sign * dynamo_outbox::protocol::clock::duration_to_ticks(d))
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_clock_offsets_take_a_sign() {
        let s = dynamo_outbox::protocol::clock::TICKS_PER_SECOND;
        assert_eq!(parse_clock_offset("x", "-5s").unwrap(), -5 * s);
        assert_eq!(parse_clock_offset("x", "+2s").unwrap(), 2 * s);
        assert_eq!(parse_clock_offset("x", "1500ms").unwrap(), 15 * s / 10);
        assert_eq!(parse_clock_offset("x", "soon").unwrap_err().code, 2);
    }
}
