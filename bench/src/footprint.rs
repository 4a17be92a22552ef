//! Footprint: release binary sizes, and a relay in a process of its own draining a backlog
//! in batches of 500 x 1 KB: its peak resident set size and CPU seconds per 10,000 messages.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use dynamo_outbox::OutboxOptions;

use crate::support::{self, Result};

/// The line the child prints, parsed back.
#[derive(Debug, Clone, Default)]
pub struct ChildFigures {
    /// Messages the child's relay published.
    pub published: u64,
    /// Seconds from the relay's start to the last message.
    pub secs: f64,
    /// Peak RSS once connected, before draining (KiB).
    pub hwm_start_kib: u64,
    /// Peak RSS at the end (KiB).
    pub hwm_kib: u64,
    /// User CPU seconds of the whole child process.
    pub user: f64,
    /// System CPU seconds of the whole child process.
    pub sys: f64,
}

const PREFIX: &str = "FOOTPRINT";

/// The child's side: drain `expect` messages of `table`, print one line of figures.
pub async fn child(table: String, buckets: u32, batch_size: u32, expect: u64) -> Result<()> {
    let mut options = OutboxOptions::new(table).with_bucket_count(buckets);
    options.max_concurrency = 8;
    let start_hwm = support::peak_rss_kib().unwrap_or(0);
    let (report, took) = crate::drain::relay_until_drained(options, batch_size, expect).await?;
    let (user, sys) = support::cpu_seconds().unwrap_or((0.0, 0.0));
    println!(
        "{PREFIX} published={} secs={:.3} hwm_start_kib={} hwm_kib={} user={:.2} sys={:.2}",
        report.published,
        took.as_secs_f64(),
        start_hwm,
        support::peak_rss_kib().unwrap_or(0),
        user,
        sys
    );
    Ok(())
}

fn parse(line: &str) -> Option<ChildFigures> {
    let rest = line.strip_prefix(PREFIX)?;
    let mut f = ChildFigures::default();
    for pair in rest.split_whitespace() {
        let (k, v) = pair.split_once('=')?;
        match k {
            "published" => f.published = v.parse().ok()?,
            "secs" => f.secs = v.parse().ok()?,
            "hwm_start_kib" => f.hwm_start_kib = v.parse().ok()?,
            "hwm_kib" => f.hwm_kib = v.parse().ok()?,
            "user" => f.user = v.parse().ok()?,
            "sys" => f.sys = v.parse().ok()?,
            _ => {}
        }
    }
    Some(f)
}

fn binary_size(name: &str) -> Option<(PathBuf, u64)> {
    let target = std::env::var("CARGO_TARGET_DIR").ok()?;
    let path = PathBuf::from(target).join("release").join(name);
    let len = std::fs::metadata(&path).ok()?.len();
    Some((path, len))
}

/// The footprint benchmark.
pub async fn run(messages: u64) -> Result<()> {
    println!("== footprint");
    for name in [
        "outboxctl",
        "outbox-relay-function",
        "outbox-enqueue-function",
        "outbox-bench",
    ] {
        match binary_size(name) {
            Some((path, len)) => println!(
                "release binary {name}: {:.1} MiB ({len} bytes, {})",
                len as f64 / 1048576.0,
                path.display()
            ),
            None => println!("release binary {name}: not built (cargo build --release -p ...)"),
        }
    }
    let config = support::sdk_config().await?;
    let client = support::client(&config, None);
    let options = support::fresh_table(&client, 8, 8).await?;
    let publisher = support::publisher().await?;
    let topic = support::fresh_topic(&publisher, 8).await?;
    let seeded = support::seed(&client, &options, &topic, messages, 1024, 16, None).await?;
    let exe = std::env::current_exe()?;
    let child = tokio::task::spawn_blocking({
        let table = options.table_name.clone();
        move || {
            Command::new(exe)
                .arg("relay-proc")
                .args(["--table", &table, "--buckets", "8", "--batch-size", "500"])
                .args(["--expect", &seeded.total().to_string()])
                .output()
        }
    });
    let out = tokio::time::timeout(Duration::from_secs(900), child)
        .await
        .map_err(|_| "the relay process did not finish in 15 minutes")???;
    support::drop_table(&client, &options).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let figures = stdout.lines().find_map(parse).ok_or_else(|| {
        format!(
            "the relay process printed no figures (status {}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let cpu = figures.user + figures.sys;
    println!(
        "relay process draining {} x 1 KB in batches of 500 (8 buckets): {:.1} s; peak RSS {:.1} MiB (connected, before the drain: {:.1} MiB); CPU {:.2} s user + {:.2} s sys = {:.2} s per 10,000 messages",
        figures.published,
        figures.secs,
        figures.hwm_kib as f64 / 1024.0,
        figures.hwm_start_kib as f64 / 1024.0,
        figures.user,
        figures.sys,
        cpu * 10_000.0 / figures.published.max(1) as f64,
    );
    Ok(())
}
