//! `outboxctl enqueue`: the enqueue function's JSON contract from a file or stdin, run
//! through the enqueue function's own handler ([`outbox_enqueue_function::EnqueueFunction`]:
//! parsing and checks by [`dynamo_outbox::enqueue_api`], one transaction, the idempotency
//! marker), so that what the function accepts and answers, this command does too.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use dynamo_outbox::enqueue_api::parse_request_str;
use dynamo_outbox::notification::EventBridgeNotifier;
use lambda_runtime::{Context, LambdaEvent};
use outbox_enqueue_function::{env, EnqueueFunction, FunctionError};

use crate::{dynamodb, failure, outbox_options, usage, Cli, Failure};

/// Flags of `outboxctl enqueue`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The JSON request; `-` or absent reads stdin.
    #[arg(value_name = "FILE|-")]
    file: Option<PathBuf>,
}

/// What the command prints for a rejected or failed request: the function's `errorType`
/// and error text, with exit code 2 for what the caller must fix (`ValidationError`,
/// `Misconfiguration`) and 1 otherwise.
fn rejected(e: FunctionError) -> Failure {
    let code = match e.error_type {
        "ValidationError" | "Misconfiguration" => 2,
        _ => 1,
    };
    Failure {
        code,
        message: e.to_string(),
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
    let payload: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        // The library's parser names the problem as the function would.
        Err(_) => {
            let e = parse_request_str(&text, options.bucket_count)
                .expect_err("text that is not JSON is rejected");
            return Err(rejected(FunctionError::from(e)));
        }
    };
    let retention = EnqueueFunction::retention_from_lookup(|n| std::env::var(n).ok())?;
    let mut function =
        EnqueueFunction::new(dynamodb().await, options)?.with_idempotency_retention(retention);
    // The commit notification, as the function sends it, when the bus is configured.
    if std::env::var_os(env::NOTIFY_EVENT_BUS).is_some() {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        if let Some(notifier) = EventBridgeNotifier::from_lookup(&config, |n| std::env::var(n).ok())
        {
            function = function.with_notifier(notifier);
        }
    }
    // No deadline in the context: the SDK's own timeouts bound the write, as in a local
    // emulator.
    let response = function
        .handle(LambdaEvent::new(payload, Context::default()))
        .await
        .map_err(rejected)?;
    let json = serde_json::to_string(&response)
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
