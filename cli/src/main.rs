//! `outboxctl`: the operator's command line for the DynamoDB outbox.
//!
//! Configuration comes from the same environment variables as the Lambda functions
//! (`OUTBOX_*`, `KAFKA_*`, and the standard AWS ones); flags override them. Exit codes:
//! 0 ok, 1 operational failure, 2 what the caller must fix (bad usage, bad input, a
//! misconfiguration); [`exit_code`] decides it from the error's type, for every command.

mod args;
mod dead_letters;
mod demo;
mod drain;
mod enqueue;
mod health;
mod quarantine;
mod relay;
mod status;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use dynamo_outbox::publish::{KafkaConfig, KafkaPublisher};
use dynamo_outbox::table::{self, Provisioned};
use dynamo_outbox::{Error, OutboxOptions, RelayOptions};
use tokio::time::Instant;

/// Operate a DynamoDB transactional outbox that publishes to Kafka.
///
/// Configuration comes from the same environment variables as the Lambda functions:
/// OUTBOX_TABLE_NAME, OUTBOX_BUCKET_COUNT, OUTBOX_KEY_PREFIX, OUTBOX_PARTITION_KEY_ATTRIBUTE,
/// OUTBOX_SORT_KEY_ATTRIBUTE, OUTBOX_PENDING_COUNT_LIMIT, the relay's OUTBOX_LEASE_DURATION
/// and friends, KAFKA_* for the broker, and the standard AWS variables (AWS_REGION,
/// AWS_PROFILE, AWS_ENDPOINT_URL_DYNAMODB, ...). Flags override them.
///
/// Exit codes: 0 ok, 1 operational failure (DynamoDB, Kafka, a timeout), 2 what the caller
/// must fix (unknown flags, invalid options, a rejected enqueue request, a misconfiguration
/// such as a table whose key schema does not fit the options).
#[derive(Debug, Parser)]
#[command(name = "outboxctl", version)]
struct Cli {
    /// Outbox table (overrides OUTBOX_TABLE_NAME).
    #[arg(long, global = true)]
    table: Option<String>,
    /// Bucket count (overrides OUTBOX_BUCKET_COUNT); every writer and relay must agree.
    #[arg(long, global = true)]
    bucket_count: Option<u32>,
    /// Key prefix (overrides OUTBOX_KEY_PREFIX).
    #[arg(long, global = true)]
    key_prefix: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the outbox table unless it exists, and wait until it is active.
    ///
    /// The table has a string partition key and a string sort key (PK and SK unless
    /// OUTBOX_PARTITION_KEY_ATTRIBUTE / OUTBOX_SORT_KEY_ATTRIBUTE say otherwise), on-demand
    /// billing, and nothing else. Safe to run from several places at once.
    CreateTable,
    /// Enqueue messages from a JSON request (the enqueue function's contract).
    ///
    /// Reads the request from FILE, or from stdin when FILE is `-` or absent:
    ///
    ///   {"messages": [{"topic": "orders", "key": "order-1", "value": "{...}",
    ///                  "headers": [{"key": "type", "value": "created"}], "partition": 3}],
    ///    "idempotency_key": "optional"}
    ///
    /// key/value are UTF-8 text; key_base64/value_base64 (and value_base64 in a header) take
    /// bytes. 1 to 100 messages, written in one transaction, all or nothing. A request
    /// with an idempotency_key (at most 99 messages) that was already written within
    /// OUTBOX_IDEMPOTENCY_RETENTION (24h) writes nothing and answers the first call's
    /// response. It runs the library's enqueue service, as the enqueue function does:
    /// prints its JSON response (each message's id, bucket and sequence). A rejected
    /// request writes nothing, prints the function's errorType and error text and exits 2.
    #[command(verbatim_doc_comment)]
    Enqueue(enqueue::Args),
    /// Run a long-lived relay: SIGTERM or SIGINT stops it gracefully (leases released).
    ///
    /// The relay takes its fair share of the buckets, publishes their messages in order and
    /// deletes them after the broker acknowledged them. Relay settings come from the
    /// OUTBOX_* relay variables (OUTBOX_RELAY_ID, OUTBOX_LEASE_DURATION, OUTBOX_BATCH_SIZE,
    /// ...), the broker from KAFKA_*.
    Relay(relay::Args),
    /// Show who owns which bucket, the backlog, the relays, and what needs attention.
    ///
    /// One strongly consistent read of the coordination partition (leases and heartbeats)
    /// and, per bucket, a count of its messages (capped at OUTBOX_PENDING_COUNT_LIMIT,
    /// shown as >=N at the cap), its oldest and newest message and its sequence counter.
    /// Every figure is read from the table now; nothing is cached.
    ///
    /// Warnings: buckets with pending messages and no live owner, messages stamped with
    /// another bucket count, a sequence counter behind its messages, relays whose
    /// heartbeat is in the future or that hold leases with a stale heartbeat (refused
    /// heartbeats), leases beyond the bucket count with a live owner, buckets parked behind
    /// an unreadable item or a message on a topic outside OUTBOX_ALLOWED_TOPICS (with its
    /// sequence, topic, reason and the `outboxctl quarantine` that moves it aside),
    /// quarantined items in the dead-letter partition. Warnings do not change the exit code;
    /// scripts read them from --json.
    Status(status::Args),
    /// Wait until every bucket is empty, e.g. before changing the bucket count.
    ///
    /// Counts the messages of every bucket each --interval and shows the messages left and
    /// the rate: a progress bar on a terminal, plain lines otherwise. Exits 0 once every
    /// bucket is empty, 1 when --timeout passes first. Draining needs running relays;
    /// stop the writers first, or it may never finish.
    Drain(drain::Args),
    /// Move a message that blocks its bucket (a poison item) to the dead-letter partition.
    ///
    /// The item moves whole, in one transaction, to `{prefix}#DEADLETTER` with sort key
    /// `{bucket:010}#{sequence:019}`, keeping its original key in OriginalPK / OriginalSK.
    /// Relays never read that partition; `outboxctl dead-letters` lists, redrives and purges
    /// what is there. Find the bucket and sequence in the relay's error log or in
    /// `outboxctl status`.
    Quarantine(quarantine::Args),
    /// The dead-letter partition: list, show, redrive (back at the tail of the original
    /// bucket, same message id) or purge (with --yes) quarantined messages.
    DeadLetters(dead_letters::Args),
    /// The whole path on the local stack: table, topic, business transactions carrying
    /// messages, a relay publishing them; prints what the relay published.
    Demo(demo::Args),
}

/// A failure with its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure {
            code: exit_code(&e),
            message: error_text(&e),
        }
    }
}

/// The exit code of a command that failed with `e`, the one rule of every command: 2 for
/// what the caller must fix before a retry can help (an invalid option, message or
/// request, a limit, a misconfiguration: `errorType` `ValidationError` or
/// `Misconfiguration` in the functions), 1 for an operational failure (DynamoDB, Kafka, a
/// deadline, an unreadable item).
pub(crate) fn exit_code(e: &Error) -> u8 {
    match e {
        Error::InvalidOption { .. }
        | Error::InvalidMessage { .. }
        | Error::Limit { .. }
        | Error::Misconfiguration { .. } => 2,
        _ => 1,
    }
}

/// An error's text with its source chain, as the Lambda functions report it.
pub(crate) fn error_text(e: &Error) -> String {
    dynamo_outbox::error::chain(e)
}

pub(crate) fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        message: message.into(),
    }
}

pub(crate) fn failure(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // RUST_LOG (default info,aws=warn,rskafka=warn) to stderr; at no level do the SDK's
    // signing and credential internals reach it (dynamo_outbox::logging).
    dynamo_outbox::logging::init_cli();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("outboxctl: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

pub(crate) fn outbox_options(
    cli: &Cli,
    default_table: Option<&str>,
) -> Result<OutboxOptions, Failure> {
    let table = cli.table.clone();
    let default_table = default_table.map(str::to_string);
    let bucket_count = cli.bucket_count.map(|c| c.to_string());
    let key_prefix = cli.key_prefix.clone();
    let options = OutboxOptions::from_lookup(|name| match name {
        dynamo_outbox::options::env::TABLE_NAME => table
            .clone()
            .or_else(|| std::env::var(name).ok())
            .or_else(|| default_table.clone()),
        dynamo_outbox::options::env::BUCKET_COUNT => {
            bucket_count.clone().or_else(|| std::env::var(name).ok())
        }
        dynamo_outbox::options::env::KEY_PREFIX => {
            key_prefix.clone().or_else(|| std::env::var(name).ok())
        }
        _ => std::env::var(name).ok(),
    })?;
    Ok(options)
}

pub(crate) fn relay_options(options: &OutboxOptions) -> Result<RelayOptions, Failure> {
    Ok(RelayOptions::for_table(options, |name| {
        std::env::var(name).ok()
    })?)
}

pub(crate) async fn dynamodb() -> aws_sdk_dynamodb::Client {
    dynamo_outbox::client::dynamodb_client_from_env().await
}

pub(crate) async fn kafka(deadline: Instant) -> Result<Arc<KafkaPublisher>, Failure> {
    let config = KafkaConfig::from_env()?;
    Ok(Arc::new(KafkaPublisher::connect(config, deadline).await?))
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::CreateTable => create_table(&cli).await,
        Command::Enqueue(args) => enqueue::run(&cli, args).await,
        Command::Status(args) => status::run(&cli, args).await,
        Command::Drain(args) => drain::run(&cli, args).await,
        Command::Relay(args) => relay::run(&cli, args).await,
        Command::Quarantine(args) => quarantine::run(&cli, args).await,
        Command::DeadLetters(args) => dead_letters::run(&cli, args).await,
        Command::Demo(args) => demo::run(&cli, args).await,
    }
}

/// `outboxctl create-table`.
async fn create_table(cli: &Cli) -> Result<(), Failure> {
    let options = outbox_options(cli, None)?;
    let outcome = table::create_if_not_exists(&dynamodb().await, &options).await?;
    match outcome {
        Provisioned::Created => println!("created table {}", options.table_name),
        Provisioned::Existed => println!("table {} exists", options.table_name),
    }
    Ok(())
}

/// Formats a duration for people: `850ms`, `12s`, `3m 4s`, `2h 3m`, `4d 5h`.
pub(crate) fn human_duration(seconds: f64) -> String {
    let s = seconds.abs();
    if s < 1.0 {
        return format!("{}ms", (s * 1000.0).round() as u64);
    }
    let s = s.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_takes_the_exit_code_from_the_error_type() {
        let errors = [
            Error::Misconfiguration {
                reason: "table t: partition key is PK, but the options expect id".into(),
                source: None,
            },
            Error::InvalidMessage {
                field: "messages[0].topic".into(),
                rule: "must not be empty".into(),
            },
            Error::Limit {
                what: "items in one transaction".into(),
                actual: 101,
                limit: 100,
            },
            Error::DeadlineExceeded("enqueue"),
            Error::Corrupt {
                pk: "OUTBOX#SEQUENCE#3".into(),
                sk: "SEQUENCE".into(),
                reason: "Sequence is missing or not a whole number after ADD".into(),
                source: None,
            },
        ];
        let codes: Vec<(u8, u8)> = errors
            .into_iter()
            .map(|e| (enqueue::failure_of(&e).code, Failure::from(e).code))
            .collect();
        assert_eq!(codes, [(2, 2), (2, 2), (2, 2), (1, 1), (1, 1)]);
    }

    #[test]
    fn durations_for_people() {
        assert_eq!(human_duration(0.25), "250ms");
        assert_eq!(human_duration(12.4), "12s");
        assert_eq!(human_duration(-3.0), "3s");
        assert_eq!(human_duration(184.0), "3m 4s");
        assert_eq!(human_duration(7380.0), "2h 3m");
        assert_eq!(human_duration(4.0 * 86_400.0 + 5.0 * 3600.0), "4d 5h");
    }
}
