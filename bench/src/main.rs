//! `outbox-bench`: the benchmarks of `BENCHMARKS.md`, on the local stack.
//!
//! Run through `scripts/bench.sh` (which starts the stack and builds in release mode);
//! `--small` runs every benchmark at small sizes for a quick check.

use std::time::Duration;

use clap::{Parser, Subcommand};
use outbox_bench::support::Result;
use outbox_bench::{accounting, compression, delivery, drain, enqueue, footprint, latency, scale};

#[derive(Parser, Debug)]
#[command(
    name = "outbox-bench",
    about = "Benchmarks of the DynamoDB outbox on the local stack"
)]
struct Cli {
    /// Small sizes everywhere (a quick run); explicit sizes still win.
    #[arg(long, global = true)]
    small: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every benchmark below, in order.
    All,
    /// Drain throughput: one relay against the raw loop, then a fleet.
    Drain {
        /// Messages in the backlog (50,000; small: 5,000).
        #[arg(long)]
        messages: Option<u64>,
        /// Bytes per message value.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Buckets.
        #[arg(long, default_value_t = 8)]
        buckets: u32,
        /// Relay batch size (also the raw loop's query limit).
        #[arg(long, default_value_t = 500)]
        batch_size: u32,
        /// Partitions of the topic.
        #[arg(long, default_value_t = 8)]
        partitions: i32,
        /// Max concurrency of the store (buckets published at once).
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Relays of the fleet run (0 or 1 skips it).
        #[arg(long, default_value_t = 3)]
        fleet: usize,
        /// Raw/relay pairs, alternating (2: raw, relay, relay, raw).
        #[arg(long, default_value_t = 4)]
        pairs: usize,
    },
    /// Exactly once against at least once: drain throughput, requests per message, a
    /// fresh relay's first messages.
    Delivery {
        /// Messages in each backlog (20,000; small: 2,000).
        #[arg(long)]
        messages: Option<u64>,
        /// Bytes per message value.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Buckets.
        #[arg(long, default_value_t = 8)]
        buckets: u32,
        /// Partitions of the topic.
        #[arg(long, default_value_t = 8)]
        partitions: i32,
        /// Pairs of runs, alternating.
        #[arg(long, default_value_t = 3)]
        pairs: usize,
        /// Fresh relays timed per mode.
        #[arg(long, default_value_t = 5)]
        fresh: usize,
    },
    /// Request accounting: steady drain, enqueue, idle relay against the formula.
    Accounting {
        /// Messages of the steady drain (10,000; small: 2,000).
        #[arg(long)]
        messages: Option<u64>,
        /// Seconds the idle relay runs (120; small: 15).
        #[arg(long)]
        idle_secs: Option<u64>,
    },
    /// Latency enqueue -> visible in Kafka, with notification and polling only.
    Latency {
        /// Messages per mode (200; small: 40).
        #[arg(long)]
        messages: Option<usize>,
        /// Mean pause between enqueues, in milliseconds.
        #[arg(long, default_value_t = 50)]
        interval_ms: u64,
    },
    /// Scale: acquisition rounds with 8..1024 buckets, 1..16 relays on 64 buckets.
    Scale {
        /// Bucket counts (8,64,256,1024; small: 8,64).
        #[arg(long, value_delimiter = ',')]
        buckets: Option<Vec<u32>>,
        /// Max concurrencies.
        #[arg(long, value_delimiter = ',', default_values_t = vec![8, 64])]
        concurrency: Vec<usize>,
        /// Fleet sizes on 64 buckets (1,2,4,8,16; small: 1,4).
        #[arg(long, value_delimiter = ',')]
        relays: Option<Vec<usize>>,
    },
    /// Footprint: binary sizes, peak RSS, CPU and drain rate of a relay process.
    ///
    /// By default this benchmark's own relay child drains 20,000 x 1 KB. With --outboxctl
    /// LABEL=PATH (repeatable), `PATH relay` with default options drains the backlog and is
    /// stopped with SIGTERM once every bucket is empty; several binaries alternate run by
    /// run. The large-items table of BENCHMARKS.md:
    /// `footprint --value-bytes 1024,102400,307200 --messages 20000,1600,1600 --keys 64
    /// --outboxctl before=PATH --outboxctl after=PATH --runs 2`.
    Footprint {
        /// Messages the relay process drains, one per --value-bytes entry or one for all
        /// (20,000; small: 2,000).
        #[arg(long, value_delimiter = ',')]
        messages: Option<Vec<u64>>,
        /// Bytes per message value; each size is a backlog of its own.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1024])]
        value_bytes: Vec<usize>,
        /// Distinct message keys (`key-{i % keys}`); default a key per message.
        #[arg(long)]
        keys: Option<u64>,
        /// Buckets of the table.
        #[arg(long, default_value_t = 8)]
        buckets: u32,
        /// An external relay binary to measure, `LABEL=PATH` (repeatable).
        #[arg(long = "outboxctl", value_name = "LABEL=PATH")]
        outboxctl: Vec<String>,
        /// Runs per size and binary (binaries alternate: A B, B A, ...).
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Seconds after which the relay is stopped even if the backlog has not drained.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Run the external relay with `--for DURATION` (e.g. 40s) instead of stopping it
        /// with SIGTERM once drained.
        #[arg(long, value_name = "DURATION")]
        relay_for: Option<String>,
    },
    /// Enqueue throughput from concurrent writers.
    Enqueue {
        /// Seconds per configuration (15; small: 3).
        #[arg(long)]
        secs: Option<u64>,
        /// Writer counts (1,4,16; small: 1,4).
        #[arg(long, value_delimiter = ',')]
        writers: Option<Vec<usize>>,
        /// Messages per call.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1, 100])]
        batch: Vec<usize>,
    },
    /// Compression: produce-request bytes and publisher CPU per KAFKA_COMPRESSION codec
    /// for ~1 KB JSON order events (not part of `all`).
    Compression {
        /// Messages per run (10,000; small: 2,000).
        #[arg(long)]
        messages: Option<u64>,
        /// Runs per codec (codecs alternate run by run).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Messages per publish call (the relay's default batch size).
        #[arg(long, default_value_t = 500)]
        batch_size: usize,
        /// Partitions of the topic.
        #[arg(long, default_value_t = 8)]
        partitions: i32,
    },
    /// (internal) The footprint's relay process.
    #[command(hide = true)]
    RelayProc {
        #[arg(long)]
        table: String,
        #[arg(long)]
        buckets: u32,
        #[arg(long)]
        batch_size: u32,
        #[arg(long)]
        expect: u64,
    },
}

fn pick<T>(explicit: Option<T>, small: bool, full: T, quick: T) -> T {
    explicit.unwrap_or(if small { quick } else { full })
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let s = cli.small;
    let drain_default = |s: bool| drain::DrainArgs {
        messages: if s { 5_000 } else { 50_000 },
        size: 1024,
        buckets: 8,
        batch_size: 500,
        partitions: 8,
        concurrency: 8,
        fleet: 3,
        pairs: if s { 1 } else { 4 },
    };
    match cli.command {
        Command::All => {
            // One failing benchmark does not stop the others.
            let report = |name: &str, r: Result<()>| {
                if let Err(e) = r {
                    println!("== {name}: FAILED: {e}");
                }
            };
            report("drain", drain::run(&drain_default(s)).await.map(|_| ()));
            report(
                "accounting",
                accounting::run(pick(None, s, 10_000, 2_000), pick(None, s, 120, 15)).await,
            );
            report(
                "latency",
                latency::run(pick(None, s, 200, 40), Duration::from_millis(50)).await,
            );
            report(
                "scale",
                scale::run(
                    &pick(None, s, vec![8, 64, 256, 1024], vec![8, 64]),
                    &[8, 64],
                    &pick(None, s, vec![1, 2, 4, 8, 16], vec![1, 4]),
                )
                .await,
            );
            report(
                "footprint",
                footprint::run(&footprint::FootprintArgs::standard(pick(
                    None, s, 20_000, 2_000,
                )))
                .await,
            );
            report(
                "enqueue",
                enqueue::run(
                    &[1, 100],
                    &pick(None, s, vec![1, 4, 16], vec![1, 4]),
                    Duration::from_secs(pick(None, s, 15, 3)),
                )
                .await,
            );
            report(
                "delivery",
                delivery::run(&delivery::DeliveryArgs {
                    messages: pick(None, s, 20_000, 2_000),
                    size: 1024,
                    buckets: 8,
                    partitions: 8,
                    pairs: pick(None, s, 3, 1),
                    fresh: pick(None, s, 5, 2),
                })
                .await,
            );
        }
        Command::Drain {
            messages,
            size,
            buckets,
            batch_size,
            partitions,
            concurrency,
            fleet,
            pairs,
        } => {
            let args = drain::DrainArgs {
                messages: pick(messages, s, 50_000, 5_000),
                size,
                buckets,
                batch_size,
                partitions,
                concurrency,
                fleet,
                pairs,
            };
            drain::run(&args).await?;
        }
        Command::Delivery {
            messages,
            size,
            buckets,
            partitions,
            pairs,
            fresh,
        } => {
            let args = delivery::DeliveryArgs {
                messages: pick(messages, s, 20_000, 2_000),
                size,
                buckets,
                partitions,
                pairs,
                fresh,
            };
            delivery::run(&args).await?;
        }
        Command::Accounting {
            messages,
            idle_secs,
        } => {
            accounting::run(
                pick(messages, s, 10_000, 2_000),
                pick(idle_secs, s, 120, 15),
            )
            .await?;
        }
        Command::Latency {
            messages,
            interval_ms,
        } => {
            latency::run(
                pick(messages, s, 200, 40),
                Duration::from_millis(interval_ms),
            )
            .await?;
        }
        Command::Scale {
            buckets,
            concurrency,
            relays,
        } => {
            scale::run(
                &pick(buckets, s, vec![8, 64, 256, 1024], vec![8, 64]),
                &concurrency,
                &pick(relays, s, vec![1, 2, 4, 8, 16], vec![1, 4]),
            )
            .await?;
        }
        Command::Footprint {
            messages,
            value_bytes,
            keys,
            buckets,
            outboxctl,
            runs,
            timeout_secs,
            relay_for,
        } => {
            let relays = outboxctl
                .iter()
                .map(|spec| match spec.split_once('=') {
                    Some((label, path)) => Ok((label.to_string(), path.into())),
                    None => Err(format!("--outboxctl {spec}: expected LABEL=PATH")),
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let args = footprint::FootprintArgs {
                messages: pick(messages, s, vec![20_000], vec![2_000]),
                value_bytes,
                keys,
                buckets,
                relays,
                runs,
                timeout: Duration::from_secs(timeout_secs),
                relay_for,
            };
            footprint::run(&args).await?;
        }
        Command::Compression {
            messages,
            runs,
            batch_size,
            partitions,
        } => {
            compression::run(&compression::CompressionArgs {
                messages: pick(messages, s, 10_000, 2_000),
                runs: runs.max(1),
                batch_size: batch_size.max(1),
                partitions,
            })
            .await?;
        }
        Command::Enqueue {
            secs,
            writers,
            batch,
        } => {
            enqueue::run(
                &batch,
                &pick(writers, s, vec![1, 4, 16], vec![1, 4]),
                Duration::from_secs(pick(secs, s, 15, 3)),
            )
            .await?;
        }
        Command::RelayProc {
            table,
            buckets,
            batch_size,
            expect,
        } => {
            footprint::child(table, buckets, batch_size, expect).await?;
        }
    }
    Ok(())
}
