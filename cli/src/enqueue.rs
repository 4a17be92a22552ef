//! `outboxctl enqueue`: the enqueue function's JSON contract from a file or stdin, run
//! through the library's enqueue service ([`dynamo_outbox::enqueue::EnqueueService`]:
//! parsing and checks by [`dynamo_outbox::enqueue_request`], one transaction, the idempotency
//! marker, the commit notification), which the enqueue function runs too, so that what
//! the function accepts and answers, this command does too.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use dynamo_outbox::enqueue::{retention_from_lookup, EnqueueService};
use dynamo_outbox::enqueue_request::parse_request_str;
use dynamo_outbox::notification::{EventBridgeNotifier, NOTIFY_EVENT_BUS};
use dynamo_outbox::Error;

use crate::{dynamodb, error_text, exit_code, failure, outbox_options, usage, Cli, Failure};

/// Flags of `outboxctl enqueue`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The JSON request; `-` or absent reads stdin.
    #[arg(value_name = "FILE|-")]
    file: Option<PathBuf>,
}

/// What the command prints for a rejected or failed request: the function's `errorType`
/// and error text, with the exit code of every command ([`exit_code`]).
pub(crate) fn failure_of(e: &Error) -> Failure {
    Failure {
        code: exit_code(e),
        message: format!("{}: {}", e.error_type(), error_text(e)),
    }
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let options = outbox_options(cli, None)?;
    let text = match args.file.as_deref() {
        None => read_stdin()?,
        Some(p) if p.as_os_str() == "-" => read_stdin()?,
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| usage(format!("cannot read {}: {e}", p.display())))?,
    };
    // The library's parser names the problem as the function would.
    let request = parse_request_str(&text, options.bucket_count).map_err(|e| failure_of(&e))?;
    let retention = retention_from_lookup(|n| std::env::var(n).ok())?;
    let mut service =
        EnqueueService::new(dynamodb().await, options)?.with_idempotency_retention(retention);
    // The commit notification, as the function sends it, when the bus is configured.
    if std::env::var_os(NOTIFY_EVENT_BUS).is_some() {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        if let Some(notifier) = EventBridgeNotifier::from_lookup(&config, |n| std::env::var(n).ok())
        {
            service = service.with_notifier(notifier);
        }
    }
    // No deadline: the SDK's own timeouts bound the write, as in a local emulator.
    let outcome = service
        .enqueue(&request, None)
        .await
        .map_err(|e| failure_of(&e))?;
    let json = serde_json::to_string(&outcome.response)
        .map_err(|e| failure(format!("rendering the response: {e}")))?;
    println!("{json}");
    Ok(())
}

fn read_stdin() -> Result<String, Failure> {
    if std::io::stdin().is_terminal() {
        eprintln!("outboxctl: reading the request from stdin (end it with Ctrl-D)");
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| usage(format!("cannot read stdin: {e}")))?;
    Ok(text)
}
