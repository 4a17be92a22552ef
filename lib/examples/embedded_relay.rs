//! A relay embedded in a tokio application, stopped gracefully by Ctrl-C or SIGTERM.
//!
//! The relay takes its fair share of the outbox's buckets (all of them when it runs
//! alone), publishes their messages to Kafka in order, and deletes them once the broker
//! acknowledged them. On Ctrl-C or SIGTERM it finishes the batch in flight, releases its
//! leases so that other relays take the buckets over at once, and prints what it did.
//!
//! It is configured from the environment the way `outboxctl relay` is: the outbox's
//! `OUTBOX_*` variables (`OUTBOX_TABLE_NAME` is required), the relay's (`OUTBOX_RELAY_ID`,
//! `OUTBOX_LEASE_DURATION`, `OUTBOX_POLL_INTERVAL`, ...), `KAFKA_*` for the broker and the
//! standard AWS variables; docs/configuration.md lists them all. `--table NAME`
//! overrides `OUTBOX_TABLE_NAME`. On the local stack, after the `place_orders` example:
//!
//! ```sh
//! scripts/stack.sh run -- bash -c '
//!     export OUTBOX_TABLE_NAME=outbox
//!     cargo run -p outboxctl -- create-table
//!     cargo run -p dynamo-outbox --example place_orders
//!     cargo run -p dynamo-outbox --example embedded_relay'   # Ctrl-C stops it
//! ```
//!
//! The topics must exist: the relay does not create them.

use std::process::ExitCode;
use std::time::Duration;

use dynamo_outbox::options::env;
use dynamo_outbox::{OutboxOptions, Relay};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Time the relay has after the signal to finish its batch and release its leases.
const GRACE: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> ExitCode {
    // Logs to stderr, filtered by RUST_LOG. The library's secrets filter keeps the AWS
    // SDK's signing and credential internals out at any level; add it to your own
    // subscriber the same way.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,aws=warn,rskafka=warn".into()),
        )
        .with_writer(std::io::stderr)
        .finish()
        .with(dynamo_outbox::logging::secrets_filter())
        .init();

    let table = match table_flag(std::env::args().skip(1)) {
        Ok(table) => table,
        Err(message) => {
            eprintln!("embedded_relay: {message}");
            return ExitCode::from(2);
        }
    };
    match run(table).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and its sources; a bad setting names its variable.
            eprintln!(
                "embedded_relay: {}",
                dynamo_outbox::error::chain(e.as_ref())
            );
            exit_code(e.as_ref())
        }
    }
}

/// 2 for what the caller must fix (a bad setting or message), 1 for anything else: the
/// rule of `outboxctl`.
fn exit_code(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    match e.downcast_ref::<dynamo_outbox::Error>() {
        Some(
            dynamo_outbox::Error::InvalidOption { .. }
            | dynamo_outbox::Error::InvalidMessage { .. }
            | dynamo_outbox::Error::Limit { .. }
            | dynamo_outbox::Error::Misconfiguration { .. },
        ) => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

async fn run(table: Option<String>) -> Result<(), BoxError> {
    // The outbox's settings (table, key prefix, bucket count, allowed topics); `--table`
    // overrides OUTBOX_TABLE_NAME.
    let options = OutboxOptions::from_lookup(|name| match name {
        env::TABLE_NAME => table.clone().or_else(|| std::env::var(name).ok()),
        _ => std::env::var(name).ok(),
    })?;
    // The relay from the standard AWS configuration: a DynamoDB client with the relay's
    // timeouts (a half-open connection never holds a lease renewal past the lease), the
    // relay's settings (OUTBOX_RELAY_ID, OUTBOX_LEASE_DURATION, ...) with the table's
    // bucket count, and a Kafka publisher from KAFKA_* (bootstrap servers, TLS, SASL or MSK
    // IAM) that connects on its first publish.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let relay = Relay::builder(&config).outbox(options).build()?;

    // SIGTERM (what ECS, Kubernetes and systemd send) is caught from here on: the relay
    // stops gracefully instead of the process ending at once.
    let mut sigterm = signal(SignalKind::terminate())?;
    println!(
        "relay {} running on table {} ({} buckets); Ctrl-C or SIGTERM stops it",
        relay.options().relay_id,
        relay.store().options().table_name,
        relay.options().bucket_count
    );

    // The application's shutdown signal, shared by every part of it that must stop: the
    // relay here, an HTTP server or queue consumer of yours beside it.
    let (stop_tx, stop_rx) = watch::channel(false);
    let relay_stopped = wait_for_stop(stop_rx);
    let mut relay_task = tokio::spawn(async move {
        // Runs until the signal, then stops gracefully within GRACE.
        relay.run_until_shutdown(relay_stopped, GRACE).await
    });

    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let result = tokio::select! {
        _ = shutdown => {
            let _ = stop_tx.send(true);
            relay_task.await?
        }
        // The relay ends on its own only on a fatal error (a misconfiguration).
        result = &mut relay_task => result?,
    };
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

/// Completes once the application's stop flag is set (or its sender is gone).
async fn wait_for_stop(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// `--table NAME`, the only flag.
fn table_flag(mut argv: impl Iterator<Item = String>) -> Result<Option<String>, String> {
    match (argv.next().as_deref(), argv.next(), argv.next()) {
        (None, _, _) => Ok(None),
        (Some("--table"), Some(table), None) => Ok(Some(table)),
        (Some("--table"), None, _) => Err("--table: needs a value".into()),
        _ => Err("expected no argument or --table NAME".into()),
    }
}
