//! `outbox-harness`: runs the fault-injection scenarios on the local stack and prints the
//! figures; exits 1 when a target is missed. Run it through `scripts/harness.sh`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use outbox_harness::{markdown_table, run, scenarios, Config, Profile};

/// Fault-injection harness: records a history (enqueues, relay ownership, Kafka), injects
/// faults into `outboxctl relay` processes, checks the history.
#[derive(Debug, Parser)]
#[command(name = "outbox-harness")]
struct Args {
    /// The long profile (about a minute of writes per scenario) instead of the short one.
    #[arg(long)]
    long: bool,
    /// The outboxctl binary (default: next to this binary).
    #[arg(long)]
    outboxctl: Option<PathBuf>,
    /// Only these scenarios (repeatable); see --list.
    #[arg(long = "scenario")]
    only: Vec<String>,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Where histories and relay logs go (default: a new directory under the temp dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 6)]
    seed: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let profile = if args.long {
        Profile::Long
    } else {
        Profile::Short
    };
    if args.list {
        for s in scenarios(profile) {
            println!("{:<16} ({}) {}", s.name, s.number, s.meaning);
        }
        return ExitCode::SUCCESS;
    }
    let outboxctl = args.outboxctl.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("outboxctl")))
            .unwrap_or_else(|| PathBuf::from("outboxctl"))
    });
    let out_dir = args.out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("outbox-harness-{}", std::process::id()))
    });
    let config = Config {
        outboxctl,
        profile,
        only: args.only,
        out_dir: out_dir.clone(),
        seed: args.seed,
    };
    match run(&config).await {
        Ok(outcomes) => {
            println!("{}", markdown_table(&outcomes));
            let _ = std::fs::write(
                out_dir.join("outcomes.json"),
                serde_json::to_string_pretty(&outcomes).unwrap_or_default(),
            );
            println!("histories and relay logs: {}", out_dir.display());
            let missed: Vec<String> = outcomes.iter().flat_map(|o| o.missed()).collect();
            if missed.is_empty() {
                println!("every target met");
                ExitCode::SUCCESS
            } else {
                for m in &missed {
                    println!("MISSED {m}");
                }
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("outbox-harness: {e}");
            ExitCode::FAILURE
        }
    }
}
