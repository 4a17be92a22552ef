//! Footprint: release binary sizes, and a relay in a process of its own draining a backlog:
//! its peak resident set size, CPU seconds and drain rate.
//!
//! Two kinds of relay process:
//! - by default this benchmark's own child (`outbox-bench relay-proc`, the library of this
//!   build, batches of 500), which reports its own figures (`VmHWM`, `/proc/self/stat`);
//! - with `--outboxctl LABEL=PATH` (repeatable), `PATH relay` with its default options (as a
//!   user runs it), observed from outside: its `--emf` documents (every 100 ms on stdout)
//!   count what it published and deleted; once that is the whole backlog, strongly
//!   consistent one-item queries confirm every bucket is empty, and it gets SIGTERM (its
//!   graceful stop). Its peak RSS is the kernel's `ru_maxrss` as `/usr/bin/time` reports
//!   it, checked against `VmHWM` polled every 50 ms. (The topic's high watermarks cannot
//!   count records: the local broker's offsets do not advance per record.) Several
//!   `--outboxctl` binaries (e.g. before and after a change) alternate run by run on the
//!   same stack, so drift hits them alike; the summary gives medians and ratios.
//!
//! `--value-bytes 1024,102400,307200` runs every size in turn (the "Large items" table of
//! `BENCHMARKS.md`).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Select};
use aws_sdk_dynamodb::Client;
use dynamo_outbox::protocol::schema::Keys;
use dynamo_outbox::publish::KafkaPublisher;
use dynamo_outbox::OutboxOptions;
use rskafka::client::ClientBuilder;
use tokio::time::Instant;

use crate::support::{self, Result};

/// Partitions of the footprint's topic.
const PARTITIONS: i32 = 8;

/// What the footprint benchmark runs.
#[derive(Debug, Clone)]
pub struct FootprintArgs {
    /// Messages of the backlog, one per entry of `value_bytes` (or one for every size).
    pub messages: Vec<u64>,
    /// Bytes per message value; each size is a backlog of its own.
    pub value_bytes: Vec<usize>,
    /// Distinct keys (`key-{i % keys}`); `None`: a key per message.
    pub keys: Option<u64>,
    /// Buckets of the table.
    pub buckets: u32,
    /// External relay binaries (`outboxctl`), labelled; empty: this benchmark's own child.
    pub relays: Vec<(String, PathBuf)>,
    /// Runs per size and relay binary.
    pub runs: usize,
    /// SIGTERM to the relay after this long even if the backlog has not drained.
    pub timeout: Duration,
    /// Run the external relay with `--for DURATION` instead of stopping it when drained.
    pub relay_for: Option<String>,
}

impl FootprintArgs {
    /// The footprint of `BENCHMARKS.md` section 5: `messages` x 1 KB, the in-tree relay once.
    pub fn standard(messages: u64) -> Self {
        FootprintArgs {
            messages: vec![messages],
            value_bytes: vec![1024],
            keys: None,
            buckets: 8,
            relays: Vec::new(),
            runs: 1,
            timeout: Duration::from_secs(900),
            relay_for: None,
        }
    }

    fn messages_for(&self, index: usize) -> u64 {
        self.messages
            .get(index)
            .or(self.messages.last())
            .copied()
            .unwrap_or(20_000)
    }
}

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

/// `BatchWriteItem` requests in flight while seeding: 16, or 4 for values over 16 KB (a
/// request of 25 x 300 KB is 10 MB of JSON for DynamoDB Local to parse).
fn seed_concurrency(size: usize) -> usize {
    if size > 16 * 1024 {
        4
    } else {
        16
    }
}

/// `1 KB`, `100 KB`, `300 KB` (KiB, as DynamoDB counts), or bytes.
fn size_name(bytes: usize) -> String {
    if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{} KB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// The footprint benchmark.
pub async fn run(args: &FootprintArgs) -> Result<()> {
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
    if args.relays.is_empty() {
        for (i, size) in args.value_bytes.iter().enumerate() {
            for _ in 0..args.runs.max(1) {
                in_tree(args, *size, args.messages_for(i)).await?;
            }
        }
        return Ok(());
    }
    external_runs(args).await
}

/// One drain by this benchmark's own relay child.
async fn in_tree(args: &FootprintArgs, size: usize, messages: u64) -> Result<()> {
    let config = support::sdk_config().await?;
    let client = support::client(&config, None);
    let options = support::fresh_table(&client, args.buckets, 8).await?;
    let publisher = support::publisher().await?;
    let topic = support::fresh_topic(&publisher, PARTITIONS).await?;
    let seeded = support::seed_keys(
        &client,
        &options,
        &topic,
        messages,
        size,
        seed_concurrency(size),
        None,
        args.keys,
    )
    .await?;
    let exe = std::env::current_exe()?;
    let child = tokio::task::spawn_blocking({
        let table = options.table_name.clone();
        let buckets = args.buckets.to_string();
        move || {
            Command::new(exe)
                .arg("relay-proc")
                .args([
                    "--table",
                    &table,
                    "--buckets",
                    &buckets,
                    "--batch-size",
                    "500",
                ])
                .args(["--expect", &seeded.total().to_string()])
                .output()
        }
    });
    let out = tokio::time::timeout(args.timeout, child)
        .await
        .map_err(|_| "the relay process did not finish in time")???;
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
        "relay process draining {} x {} in batches of 500 ({} buckets): {:.1} s = {:.0} msg/s, {:.1} MB/s; peak RSS {:.1} MiB (connected, before the drain: {:.1} MiB); CPU {:.2} s user + {:.2} s sys = {:.2} s per 10,000 messages",
        figures.published,
        size_name(size),
        args.buckets,
        figures.secs,
        figures.published as f64 / figures.secs.max(1e-9),
        (figures.published as f64 * size as f64) / figures.secs.max(1e-9) / 1e6,
        figures.hwm_kib as f64 / 1024.0,
        figures.hwm_start_kib as f64 / 1024.0,
        figures.user,
        figures.sys,
        cpu * 10_000.0 / figures.published.max(1) as f64,
    );
    Ok(())
}

/// One drain by an external relay binary.
#[derive(Debug, Clone)]
pub struct ExternalRun {
    /// The binary's label.
    pub label: String,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Messages seeded.
    pub messages: u64,
    /// Seconds the seeding took (context).
    pub seeded_secs: f64,
    /// Messages per bucket of the seeded backlog.
    pub per_bucket: Vec<u64>,
    /// Seconds from the relay's spawn until every bucket was seen empty.
    pub drained_secs: Option<f64>,
    /// Whether the drain was seen by the 5-second look at the table while the relay's own
    /// count was short (the drain time is then up to 5 s late).
    pub seen_by_fallback: bool,
    /// Seconds from the spawn until its metrics first counted a published (and deleted)
    /// message: the end of its first batch.
    pub first_secs: Option<f64>,
    /// Messages left in the table after the relay exited (its graceful stop may delete what
    /// a drain that never finished had published: 0 here is not "drained").
    pub left: u64,
    /// Looks at the table that failed (an error, e.g. a timeout of DynamoDB Local).
    pub look_errors: u64,
    /// What its metrics counted as published (and deleted).
    pub published: u64,
    /// Leases its metrics counted as lost.
    pub leases_lost: u64,
    /// Its longest batch (ms), from the metrics' `BatchDuration` values.
    pub longest_batch_ms: f64,
    /// Peak RSS, the kernel's `ru_maxrss` via `/usr/bin/time` (KiB).
    pub maxrss_kib: Option<u64>,
    /// Peak RSS, `VmHWM` as last polled (KiB).
    pub hwm_kib: u64,
    /// User and system CPU seconds of the relay process.
    pub cpu: Option<(f64, f64)>,
    /// The relay's final line (`relay ... stopped (...): ..., leases released: ...`).
    pub stop_line: Option<String>,
    /// Warning lines in the relay's log.
    pub warnings: u64,
    /// How the process ended.
    pub status: String,
    /// Where its output is kept.
    pub log_dir: PathBuf,
}

impl ExternalRun {
    /// Messages per second, spawn to drained.
    pub fn rate(&self) -> Option<f64> {
        self.drained_secs
            .map(|s| self.messages as f64 / s.max(1e-9))
    }

    /// Value megabytes (10^6 bytes) per second, spawn to drained.
    pub fn mb_rate(&self) -> Option<f64> {
        self.rate().map(|r| r * self.value_bytes as f64 / 1e6)
    }

    /// Peak RSS in MiB: `ru_maxrss` when known, else `VmHWM`.
    pub fn peak_mib(&self) -> f64 {
        self.maxrss_kib.unwrap_or(self.hwm_kib) as f64 / 1024.0
    }

    /// Whether the relay was seen to drain the backlog while running, within the timeout.
    pub fn drained(&self) -> bool {
        self.drained_secs.is_some()
    }

    /// `leases released: true` in the relay's final line.
    pub fn released(&self) -> bool {
        self.stop_line
            .as_deref()
            .is_some_and(|l| l.contains("leases released: true"))
    }

    /// One line of output.
    pub fn line(&self) -> String {
        let opt = |v: Option<f64>, unit: &str, digits: usize| {
            v.map_or("-".to_string(), |v| format!("{v:.digits$}{unit}"))
        };
        format!(
            "{:<8} {:>6} x {:>6}: drained {} in {} ({} msg/s, {} MB/s; first batch deleted at {}); left after the stop {}; published {}, leases lost {}, longest batch {:.0} ms; peak RSS {:.1} MiB (VmHWM {:.1} MiB); CPU {}; {} warnings; {} failed looks; {}; {}",
            self.label,
            self.messages,
            size_name(self.value_bytes),
            match (self.drained(), self.seen_by_fallback) {
                (true, false) => "yes",
                (true, true) => "yes (seen by the 5 s look, the relay counted less)",
                (false, _) => "NO (not seen empty before the timeout)",
            },
            opt(self.drained_secs, " s", 2),
            opt(self.rate(), "", 0),
            opt(self.mb_rate(), "", 1),
            opt(self.first_secs, " s", 2),
            self.left,
            self.published,
            self.leases_lost,
            self.longest_batch_ms,
            self.peak_mib(),
            self.hwm_kib as f64 / 1024.0,
            self.cpu
                .map_or("-".into(), |(u, s)| format!("{u:.2} s user + {s:.2} s sys")),
            self.warnings,
            self.look_errors,
            self.stop_line.as_deref().unwrap_or("no final line"),
            self.status,
        )
    }
}

/// `/proc/{pid}/task/{pid}/children`: the first child of `pid`.
fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// What the relay's EMF documents counted so far (reads the new complete lines of its
/// stdout on each call).
#[derive(Debug, Default)]
struct EmfTail {
    offset: usize,
    published: u64,
    leases_lost: u64,
    longest_batch_ms: f64,
}

impl EmfTail {
    fn read(&mut self, path: &Path) {
        let Ok(text) = std::fs::read(path) else {
            return;
        };
        let Some(end) = text.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        if end < self.offset {
            return;
        }
        let new = String::from_utf8_lossy(&text[self.offset..=end]).into_owned();
        self.offset = end + 1;
        for line in new.lines().filter(|l| l.starts_with('{')) {
            self.published += emf_values(line, "Published").iter().sum::<f64>() as u64;
            self.leases_lost += emf_values(line, "LeasesLost").iter().sum::<f64>() as u64;
            for v in emf_values(line, "BatchDuration") {
                self.longest_batch_ms = self.longest_batch_ms.max(v);
            }
        }
    }
}

/// The values of `"name":` in one EMF document (a number or an array of numbers).
fn emf_values(doc: &str, name: &str) -> Vec<f64> {
    let key = format!("\"{name}\":");
    let Some(at) = doc.find(&key) else {
        return Vec::new();
    };
    let rest = doc[at + key.len()..].trim_start();
    let body = if let Some(list) = rest.strip_prefix('[') {
        &list[..list.find(']').unwrap_or(list.len())]
    } else {
        &rest[..rest.find([',', '}']).unwrap_or(rest.len())]
    };
    body.split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

/// Whether every bucket is empty: one strongly consistent one-item query each.
async fn table_empty(client: &Client, options: &OutboxOptions) -> Result<bool> {
    let keys = Keys::new(options);
    let keys = &keys;
    let queries = (0..options.bucket_count).map(|bucket| async move {
        let out = client
            .query()
            .table_name(&options.table_name)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", &keys.pk)
            .expression_attribute_values(":pk", AttributeValue::S(keys.message_pk(bucket)))
            .projection_expression("#pk")
            .consistent_read(true)
            .limit(1)
            .send()
            .await?;
        Ok::<bool, support::BoxError>(out.items.unwrap_or_default().is_empty())
    });
    Ok(futures::future::try_join_all(queries)
        .await?
        .into_iter()
        .all(|e| e))
}

/// Messages left in the table (a paginated `COUNT` query per bucket).
async fn count_left(client: &Client, options: &OutboxOptions) -> Result<u64> {
    let keys = Keys::new(options);
    let mut total = 0u64;
    for bucket in 0..options.bucket_count {
        let mut start = None;
        loop {
            let out = client
                .query()
                .table_name(&options.table_name)
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", &keys.pk)
                .expression_attribute_values(":pk", AttributeValue::S(keys.message_pk(bucket)))
                .select(Select::Count)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await?;
            total += out.count.max(0) as u64;
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
    }
    Ok(total)
}

/// `KEY=VALUE` pairs of `/usr/bin/time -f` output.
fn time_figures(path: &Path) -> (Option<u64>, Option<(f64, f64)>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut maxrss = None;
    let (mut user, mut sys) = (None, None);
    for line in text.lines() {
        for pair in line.split_whitespace() {
            match pair.split_once('=') {
                Some(("MAXRSS_KIB", v)) => maxrss = v.parse().ok(),
                Some(("USER", v)) => user = v.parse::<f64>().ok(),
                Some(("SYS", v)) => sys = v.parse::<f64>().ok(),
                _ => {}
            }
        }
    }
    (maxrss, user.zip(sys))
}

/// Seeds a backlog of `messages` x `size` and drains it with `bin relay`.
async fn external(
    config: &aws_config::SdkConfig,
    publisher: &KafkaPublisher,
    label: &str,
    bin: &Path,
    size: usize,
    messages: u64,
    args: &FootprintArgs,
) -> Result<ExternalRun> {
    let client = support::client(config, None);
    let options = support::fresh_table(&client, args.buckets, 8).await?;
    let topic = support::fresh_topic(publisher, PARTITIONS).await?;
    let seeded = support::seed_keys(
        &client,
        &options,
        &topic,
        messages,
        size,
        seed_concurrency(size),
        None,
        args.keys,
    )
    .await?;
    let total = seeded.total();

    let log_dir = std::env::temp_dir().join(support::random_name("footprint"));
    std::fs::create_dir_all(&log_dir)?;
    let time_file = log_dir.join("time.txt");
    let stdout_file = log_dir.join("stdout.txt");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f")
        .arg("MAXRSS_KIB=%M USER=%U SYS=%S ELAPSED=%e")
        .arg("-o")
        .arg(&time_file)
        .arg(bin)
        .args(["relay", "--emf", "--emf-interval", "100ms"]);
    if let Some(d) = &args.relay_for {
        cmd.args(["--for", d]);
    }
    // Default options, as a user runs it: only the table and the bucket count.
    for (k, _) in std::env::vars() {
        if k.starts_with("OUTBOX_") && !k.starts_with("OUTBOX_STACK_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("OUTBOX_TABLE_NAME", &options.table_name)
        .env("OUTBOX_BUCKET_COUNT", args.buckets.to_string())
        .stdout(File::create(&stdout_file)?)
        .stderr(File::create(log_dir.join("stderr.txt"))?);

    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let mut relay_pid = None;
    let mut hwm = 0u64;
    let mut emf = EmfTail::default();
    let mut first = None;
    let mut drained = None;
    let mut signalled: Option<Instant> = None;
    let mut last_look = Instant::now();
    let mut seen_by_fallback = false;
    let mut look_errors = 0u64;
    let status = loop {
        if relay_pid.is_none() {
            relay_pid = first_child(child.id());
        }
        if let Some(pid) = relay_pid {
            hwm = hwm.max(support::peak_rss_kib_of(pid).unwrap_or(0));
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if drained.is_none() {
            emf.read(&stdout_file);
            if first.is_none() && emf.published > 0 {
                first = Some(started.elapsed());
            }
            // Look at the table once the relay counted everything, and every 5 s anyway: a
            // relay may count less than it deleted (a delete cut at its deadline that landed).
            let look = emf.published >= total || last_look.elapsed() >= Duration::from_secs(5);
            if look {
                last_look = Instant::now();
            }
            let empty = if look {
                match table_empty(&client, &options).await {
                    Ok(empty) => empty,
                    Err(e) => {
                        look_errors += 1;
                        if look_errors <= 3 {
                            eprintln!("footprint: looking at the table failed: {e}");
                        }
                        false
                    }
                }
            } else {
                false
            };
            if empty {
                drained = Some(started.elapsed());
                seen_by_fallback = emf.published < total;
                if args.relay_for.is_none() {
                    if let Some(pid) = relay_pid {
                        signal(pid, "-TERM");
                        signalled = Some(Instant::now());
                    }
                }
            }
        }
        if signalled.is_none() && started.elapsed() > args.timeout {
            if let Some(pid) = relay_pid {
                signal(pid, "-TERM");
            }
            signalled = Some(Instant::now());
        }
        if signalled.is_some_and(|at| at.elapsed() > Duration::from_secs(60)) {
            if let Some(pid) = relay_pid {
                signal(pid, "-KILL");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    emf.read(&stdout_file);
    let left = count_left(&client, &options).await?;
    let (maxrss, cpu) = time_figures(&time_file);
    let stdout = std::fs::read_to_string(&stdout_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(log_dir.join("stderr.txt")).unwrap_or_default();
    let stop_line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("relay ") && l.contains(" stopped ("))
        .map(str::to_string);
    // The log is coloured (`\x1b[33m WARN\x1b[0m`) unless NO_COLOR: match the level word.
    let warnings = stderr.lines().filter(|l| l.contains("WARN")).count() as u64;
    support::drop_table(&client, &options).await;
    // The broker keeps every record in memory: drop the topic.
    let bootstrap = support::stack_var("KAFKA_BOOTSTRAP_SERVERS")?;
    if let Ok(kafka) = ClientBuilder::new(bootstrap.split(',').map(str::to_string).collect())
        .build()
        .await
    {
        if let Ok(controller) = kafka.controller_client() {
            let _ = controller.delete_topic(&topic, 5_000).await;
        }
    }
    Ok(ExternalRun {
        label: label.to_string(),
        value_bytes: size,
        messages: total,
        seeded_secs: seeded.took.as_secs_f64(),
        per_bucket: seeded.per_bucket.values().copied().collect(),
        drained_secs: drained.map(|d| d.as_secs_f64()),
        seen_by_fallback,
        first_secs: first.map(|d| d.as_secs_f64()),
        left,
        look_errors,
        published: emf.published,
        leases_lost: emf.leases_lost,
        longest_batch_ms: emf.longest_batch_ms,
        maxrss_kib: maxrss,
        hwm_kib: hwm,
        cpu,
        stop_line,
        warnings,
        status: format!("exit {status}"),
        log_dir,
    })
}

/// The median (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Every size, every run, the binaries alternating (A B, B A, ...), then the summary.
async fn external_runs(args: &FootprintArgs) -> Result<()> {
    let config = support::sdk_config().await?;
    let publisher = support::publisher().await?;
    for (label, path) in &args.relays {
        if !path.is_file() {
            return Err(format!("--outboxctl {label}={}: no such file", path.display()).into());
        }
        println!("relay binary {label}: {}", path.display());
    }
    // Warm-up, not reported: the first drain of a fresh DynamoDB Local runs while its JVM
    // still compiles, which would handicap whichever binary goes first.
    if let (Some((label, path)), Some(size)) = (args.relays.first(), args.value_bytes.first()) {
        let messages = (args.messages_for(0) / 10).max(100);
        let w = external(&config, &publisher, label, path, *size, messages, args).await?;
        println!(
            "(warm-up drain of {} x {} by {label}, not counted: {:.1} s)",
            w.messages,
            size_name(*size),
            w.drained_secs.unwrap_or(f64::NAN)
        );
    }
    let mut all: BTreeMap<(usize, String), Vec<ExternalRun>> = BTreeMap::new();
    for (i, size) in args.value_bytes.iter().enumerate() {
        let messages = args.messages_for(i);
        println!(
            "-- {messages} x {} over {} ({} buckets), topic of {PARTITIONS} partitions, `outboxctl relay --emf --emf-interval 100ms` with default options{} ({})",
            size_name(*size),
            args.keys
                .map_or("a key per message".to_string(), |k| format!("{k} keys")),
            args.buckets,
            args.relay_for
                .as_deref()
                .map_or(", SIGTERM once drained".to_string(), |d| format!(" and --for {d}")),
            std::fs::read_to_string("/proc/loadavg")
                .map(|l| format!("load average {}", l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")))
                .unwrap_or_default(),
        );
        for run in 0..args.runs.max(1) {
            let mut order: Vec<&(String, PathBuf)> = args.relays.iter().collect();
            if run % 2 == 1 {
                order.reverse();
            }
            for (label, path) in order {
                let r = external(&config, &publisher, label, path, *size, messages, args).await?;
                if run == 0 && label == &args.relays[0].0 {
                    println!(
                        "   backlog per bucket: {:?} (seeded in {:.1} s)",
                        r.per_bucket, r.seeded_secs
                    );
                }
                println!("   {}", r.line());
                println!("   {:<8} logs: {}", "", r.log_dir.display());
                all.entry((*size, label.clone())).or_default().push(r);
            }
        }
    }
    println!("-- summary (median of the runs; every run listed in order)");
    for size in &args.value_bytes {
        let mut medians = Vec::new();
        for (label, _) in &args.relays {
            let runs = all
                .get(&(*size, label.clone()))
                .cloned()
                .unwrap_or_default();
            let rates: Vec<f64> = runs.iter().filter_map(ExternalRun::rate).collect();
            let mbs: Vec<f64> = runs.iter().filter_map(ExternalRun::mb_rate).collect();
            let rss: Vec<f64> = runs.iter().map(ExternalRun::peak_mib).collect();
            let list = |v: &[f64], d: usize| {
                v.iter()
                    .map(|x| format!("{x:.d$}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let rate = median(rates.clone());
            let peak = median(rss.clone());
            println!(
                "{:>6} {:<8} msg/s {} (median {}), MB/s median {}, peak RSS MiB {} (median {}, max {:.1}); drained {}/{}, published {}, leases released {}/{}, leases lost {}",
                size_name(*size),
                label,
                list(&rates, 0),
                rate.map_or("-".into(), |r| format!("{r:.0}")),
                median(mbs).map_or("-".into(), |r| format!("{r:.1}")),
                list(&rss, 1),
                peak.map_or("-".into(), |r| format!("{r:.1}")),
                rss.iter().copied().fold(0.0, f64::max),
                runs.iter().filter(|r| r.drained()).count(),
                runs.len(),
                runs.iter()
                    .map(|r| r.published.to_string())
                    .collect::<Vec<_>>()
                    .join(" / "),
                runs.iter().filter(|r| r.released()).count(),
                runs.len(),
                runs.iter()
                    .map(|r| r.leases_lost.to_string())
                    .collect::<Vec<_>>()
                    .join(" / "),
            );
            medians.push((label.clone(), rate, peak));
        }
        if let [(a, ra, Some(pa)), .., (b, rb, Some(pb))] = medians.as_slice() {
            let rate = match (ra, rb) {
                (Some(ra), Some(rb)) => format!("{:.2}", rb / ra),
                _ => "- (not drained by both)".into(),
            };
            println!(
                "{:>6} {b} / {a}: drain rate {rate}, peak RSS {:.2}",
                size_name(*size),
                pb / pa
            );
        }
    }
    Ok(())
}
