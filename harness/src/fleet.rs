//! Relay processes (`outboxctl relay`), the faults injected into them, and their logs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::check::{OwnershipEvent, RelayHistory};

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Lease timings every relay of the harness runs with.
pub const LEASE_DURATION: &str = "3s";
/// See [`LEASE_DURATION`].
pub const LEASE_RENEW_INTERVAL: &str = "1s";
/// Graceful stop allowed after SIGTERM.
pub const GRACE: Duration = Duration::from_secs(5);
/// How long before the end of a `--for` run the relay stops working and hands its buckets
/// over (the library's default stop reserve).
pub const STOP_RESERVE: Duration = dynamo_outbox::relay::DEFAULT_STOP_RESERVE;

/// One `outboxctl relay` process.
#[derive(Debug)]
pub struct RelayProc {
    /// Relay id (`OUTBOX_RELAY_ID`).
    pub id: String,
    /// `OUTBOX_TEST_CLOCK_OFFSET`, if any.
    pub clock_offset: Option<String>,
    /// `--for`: a run with a deadline, which announces its stop (`StopsAtUtc`) and stops on
    /// its own; it has no signal handler, so [`Fleet::terminate`] waits for it instead of
    /// signalling it.
    pub run_for: Option<Duration>,
    child: Child,
    /// When it was started.
    pub started_at_us: i64,
    /// When it was seen dead (or was killed).
    pub ended_at_us: Option<i64>,
    /// Killed with SIGKILL by the harness.
    pub killed: bool,
    /// Currently SIGSTOPped.
    pub stopped: bool,
    /// Did not stop within the grace period after SIGTERM (then killed).
    pub unclean_stop: bool,
    /// Exit status when it exited.
    pub exit_code: Option<i32>,
    log: PathBuf,
    out: PathBuf,
}

/// The relays of one scenario.
#[derive(Debug)]
pub struct Fleet {
    outboxctl: PathBuf,
    dir: PathBuf,
    table: String,
    bucket_count: u32,
    prefix: String,
    next: usize,
    /// `AWS_ENDPOINT_URL_DYNAMODB` for the relays (default: the harness's own).
    pub dynamodb_endpoint: Option<String>,
    /// `KAFKA_BOOTSTRAP_SERVERS` for the relays (default: the harness's own).
    pub kafka_bootstrap: Option<String>,
    /// Every relay started, alive or not.
    pub relays: Vec<RelayProc>,
    /// More relay settings (variables), set after the harness's own, so they override
    /// them.
    pub extra_env: Vec<(String, String)>,
    /// More arguments of `outboxctl relay` (`--delivery exactly-once`).
    pub extra_args: Vec<String>,
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Fleet {
    /// A fleet writing its logs under `dir`.
    pub fn new(outboxctl: &Path, dir: &Path, table: &str, bucket_count: u32, prefix: &str) -> Self {
        Fleet {
            outboxctl: outboxctl.to_path_buf(),
            dir: dir.to_path_buf(),
            table: table.into(),
            bucket_count,
            prefix: prefix.into(),
            next: 0,
            dynamodb_endpoint: None,
            kafka_bootstrap: None,
            relays: Vec::new(),
            extra_env: Vec::new(),
            extra_args: Vec::new(),
        }
    }

    /// Where the relays' logs go.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts one relay; its stderr (the log) and stdout (the exit summary) go to files.
    pub fn start(&mut self, clock_offset: Option<&str>) -> std::io::Result<usize> {
        self.start_for(clock_offset, None)
    }

    /// Starts one relay, with `--for run_for` when given (a run with a deadline: it
    /// announces its stop in its heartbeats and stops on its own `run_for` after its start,
    /// having stopped working [`STOP_RESERVE`] earlier).
    pub fn start_for(
        &mut self,
        clock_offset: Option<&str>,
        run_for: Option<Duration>,
    ) -> std::io::Result<usize> {
        self.next += 1;
        let id = format!("{}-r{:02}", self.prefix, self.next);
        let log = self.dir.join(format!("{id}.log"));
        let out = self.dir.join(format!("{id}.out"));
        let mut cmd = Command::new(&self.outboxctl);
        cmd.arg("relay")
            .arg("--grace")
            .arg(format!("{}s", GRACE.as_secs()))
            .env("OUTBOX_TABLE_NAME", &self.table)
            .env("OUTBOX_BUCKET_COUNT", self.bucket_count.to_string())
            .env("OUTBOX_RELAY_ID", &id)
            .env("OUTBOX_LEASE_DURATION", LEASE_DURATION)
            .env("OUTBOX_LEASE_RENEW_INTERVAL", LEASE_RENEW_INTERVAL)
            .env("OUTBOX_POLL_INTERVAL", "100ms")
            .env("OUTBOX_ERROR_BACKOFF", "200ms")
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_HARNESS_RELAY_LOG")
                    .unwrap_or_else(|_| DEFAULT_RELAY_LOG.into()),
            )
            .env("NO_COLOR", "1")
            .env_remove("OUTBOX_TEST_CLOCK_OFFSET")
            .stdin(Stdio::null())
            .stdout(File::create(&out)?)
            .stderr(File::create(&log)?);
        cmd.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        cmd.args(&self.extra_args);
        if let Some(d) = run_for {
            cmd.arg("--for").arg(format!("{}ms", d.as_millis()));
        }
        if let Some(b) = &self.kafka_bootstrap {
            cmd.env("KAFKA_BOOTSTRAP_SERVERS", b);
        }
        if let Some(e) = &self.dynamodb_endpoint {
            cmd.env("AWS_ENDPOINT_URL_DYNAMODB", e);
        }
        if let Some(o) = clock_offset {
            cmd.env("OUTBOX_TEST_CLOCK_OFFSET", o);
        }
        let started_at_us = now_us();
        let child = cmd.spawn()?;
        self.relays.push(RelayProc {
            id,
            clock_offset: clock_offset.map(str::to_string),
            run_for,
            child,
            started_at_us,
            ended_at_us: None,
            killed: false,
            stopped: false,
            unclean_stop: false,
            exit_code: None,
            log,
            out,
        });
        Ok(self.relays.len() - 1)
    }

    /// Notes relays that exited on their own.
    pub fn reap(&mut self) {
        for r in &mut self.relays {
            if r.ended_at_us.is_none() {
                if let Ok(Some(status)) = r.child.try_wait() {
                    r.ended_at_us = Some(now_us());
                    r.exit_code = status.code();
                }
            }
        }
    }

    /// Indices of relays still running (stopped ones included).
    pub fn alive(&mut self) -> Vec<usize> {
        self.reap();
        (0..self.relays.len())
            .filter(|&i| self.relays[i].ended_at_us.is_none())
            .collect()
    }

    /// `kill -9`; `true` when the relay was running (a fault was injected).
    pub fn kill9(&mut self, i: usize) -> bool {
        let r = &mut self.relays[i];
        if r.ended_at_us.is_some() {
            return false;
        }
        let _ = r.child.kill();
        r.ended_at_us = Some(now_us());
        r.killed = true;
        let _ = r.child.wait();
        true
    }

    /// SIGSTOP; `true` when the relay was running and not stopped yet (a fault was injected).
    pub fn pause(&mut self, i: usize) -> bool {
        self.reap();
        let r = &mut self.relays[i];
        if r.ended_at_us.is_none() && !r.stopped {
            signal(r.child.id(), "STOP");
            r.stopped = true;
            return true;
        }
        false
    }

    /// SIGCONT.
    pub fn resume(&mut self, i: usize) {
        let r = &mut self.relays[i];
        if r.stopped {
            signal(r.child.id(), "CONT");
            r.stopped = false;
        }
    }

    /// SIGTERM to each relay in `which`, then waits for them (killing any that overstays
    /// the grace period by more than 5 s, which counts as an unclean stop). A relay run with
    /// `--for` is not signalled (it has no handler: SIGTERM would kill it) but waited for,
    /// up to its run plus 5 s.
    pub async fn terminate(&mut self, which: &[usize]) {
        let mut wait = GRACE;
        for &i in which {
            self.resume(i);
            let r = &self.relays[i];
            if r.ended_at_us.is_none() {
                match r.run_for {
                    None => signal(r.child.id(), "TERM"),
                    Some(d) => {
                        let left = (r.started_at_us + d.as_micros() as i64 - now_us()).max(0);
                        wait = wait.max(Duration::from_micros(left as u64));
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + wait + Duration::from_secs(5);
        loop {
            self.reap();
            if which.iter().all(|&i| self.relays[i].ended_at_us.is_some()) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                for &i in which {
                    if self.relays[i].ended_at_us.is_none() {
                        self.relays[i].unclean_stop = true;
                        self.kill9(i);
                        self.relays[i].killed = false;
                    }
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills whatever still runs (a scenario that failed half-way).
    pub fn kill_all(&mut self) {
        for i in 0..self.relays.len() {
            if self.relays[i].ended_at_us.is_none() {
                self.resume(i);
                self.kill9(i);
            }
        }
    }

    /// The buckets each relay believes it owns now, from the logs so far.
    pub fn current_owners(&self) -> BTreeMap<u32, BTreeSet<String>> {
        let mut owners: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for r in &self.relays {
            if r.ended_at_us.is_some() {
                continue;
            }
            let mut owned = BTreeSet::new();
            for e in parse_log(&read(&r.log)).events {
                if e.owns {
                    owned.insert(e.bucket);
                } else {
                    owned.remove(&e.bucket);
                }
            }
            for b in owned {
                owners.entry(b).or_default().insert(r.id.clone());
            }
        }
        owners
    }

    /// Waits until every bucket has an owner and no relay logged an ownership change for
    /// `quiet` (the fleet settled), at most `timeout`; `true` when it did.
    pub async fn wait_settled(&mut self, quiet: Duration, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            let last_change = self
                .relays
                .iter()
                .filter_map(|r| parse_log(&read(&r.log)).events.last().map(|e| e.at_us))
                .max()
                .unwrap_or(0);
            if self.current_owners().len() as u32 >= self.bucket_count
                && now_us() - last_change >= quiet.as_micros() as i64
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// After relay `i` started: waits until it owns a bucket (by its log), then until the
    /// fleet settled ([`Fleet::wait_settled`]), at most `timeout` in all; `true` when both
    /// happened. Right after a start the fleet still looks settled (the newcomer has
    /// logged nothing yet), so settling alone would not wait for the join.
    pub async fn wait_joined(&mut self, i: usize, quiet: Duration, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let id = self.relays[i].id.clone();
        while !self.current_owners().values().any(|o| o.contains(&id)) {
            if tokio::time::Instant::now() >= deadline || !self.alive().contains(&i) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.wait_settled(quiet, left).await
    }

    /// Each relay's history, from its log and exit summary.
    pub fn histories(&self) -> Vec<RelayHistory> {
        self.relays
            .iter()
            .map(|r| {
                let parsed = parse_log(&read(&r.log));
                RelayHistory {
                    relay_id: r.id.clone(),
                    events: parsed.events,
                    ended_at_us: r.ended_at_us,
                    refused: parsed.refused,
                    refused_at_us: parsed.refused_at_us,
                    released: parsed.released,
                }
            })
            .collect()
    }

    /// Refused writes from the exit summaries (`refused writes N`) of relays that printed one.
    pub fn summary_refused(&self) -> u64 {
        self.relays
            .iter()
            .filter_map(|r| summary_refused(&read(&r.out)))
            .sum()
    }

    /// Each relay that stopped cleanly (exit code 0 after SIGTERM, neither killed nor over
    /// its grace period) counts its refused writes in its final log event (`refused=N`
    /// next to `stop_reason`) and in its exit summary (`refused writes N`): both must be
    /// there and equal the refusal events its log shows. The total comes from the relay's
    /// report, the events one by one from the store, so a refusal event the parser no
    /// longer recognises, or a count it cannot read, shows up here instead of as a silent
    /// zero. The disagreements, in words.
    pub fn refusal_disagreements(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.relays {
            if r.killed || r.unclean_stop || r.exit_code != Some(0) {
                continue;
            }
            let parsed = parse_log(&read(&r.log));
            let events: u64 = parsed.refused.values().sum();
            match parsed.stopped_refused {
                None => out.push(format!(
                    "{} exited cleanly without a final log event carrying stop_reason and refused in {}",
                    r.id,
                    r.log.display()
                )),
                Some(n) if n != events => out.push(format!(
                    "{}: its final log event counts {n} refused writes, its log shows {events} refusal events",
                    r.id
                )),
                Some(_) => {}
            }
            match summary_refused(&read(&r.out)) {
                None => out.push(format!(
                    "{} exited cleanly without a readable exit summary (refused writes N) in {}",
                    r.id,
                    r.out.display()
                )),
                Some(n) if n != events => out.push(format!(
                    "{}: its exit summary counts {n} refused writes, its log shows {events} refusal events",
                    r.id
                )),
                Some(_) => {}
            }
        }
        out
    }

    /// Relays that stopped cleanly (exit code 0, neither killed nor over the grace period)
    /// whose final event says they did not release their leases (`released=false`).
    pub fn unreleased_stops(&self) -> Vec<String> {
        self.relays
            .iter()
            .filter(|r| !r.killed && !r.unclean_stop && r.exit_code == Some(0))
            .filter(|r| parse_log(&read(&r.log)).stopped_released == Some(false))
            .map(|r| r.id.clone())
            .collect()
    }

    /// Lines of every relay's log that contain `text`.
    pub fn count_log_lines(&self, text: &str) -> usize {
        self.relays
            .iter()
            .map(|r| read(&r.log).lines().filter(|l| l.contains(text)).count())
            .sum()
    }

    /// Lines of the relays' logs at ERROR level, or panics (for the report).
    pub fn errors(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.relays {
            for line in read(&r.log).lines() {
                let l = strip_ansi(line);
                if l.contains(" ERROR ") || l.contains("panicked at") {
                    out.push(format!("{}: {l}", r.id));
                }
            }
        }
        out
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The `refused writes N` of an exit summary (the last one in `text`).
fn summary_refused(text: &str) -> Option<u64> {
    let at = text.rfind("refused writes ")?;
    text[at + 15..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse::<u64>()
        .ok()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The relays' log filter unless `OUTBOX_HARNESS_RELAY_LOG` says otherwise: the debug
/// events of each batch (what it fetched, what Kafka acknowledged at which offsets, what
/// it deleted), so that a lost message can be traced ([`trace_message`]).
pub const DEFAULT_RELAY_LOG: &str =
    "info,aws=warn,rskafka=warn,dynamo_outbox::relay::batch=debug,dynamo_outbox::publish::kafka=debug,dynamo_outbox::publish::exactly_once=debug";

/// What a relay log says.
#[derive(Debug, Default, PartialEq)]
pub struct ParsedLog {
    /// `bucket ownership` events.
    pub events: Vec<OwnershipEvent>,
    /// Refused conditional writes by kind: the WARN events whose `kind` field names a lease
    /// write ([`WRITE_KINDS`]), whatever their message says.
    pub refused: BTreeMap<String, u64>,
    /// When each refusal was logged.
    pub refused_at_us: Vec<i64>,
    /// `handed a bucket back` events: (when, bucket).
    pub released: Vec<(i64, u32)>,
    /// The refused-write count of the relay's final event (the INFO event with the fields
    /// `stop_reason` and `refused` that a relay logs once its run ended), if it logged one.
    pub stopped_refused: Option<u64>,
    /// The `released` field of that final event: whether the stop released every lease.
    pub stopped_released: Option<bool>,
}

/// The kinds of conditional write a relay makes (`WriteKind::as_str` of the library), the
/// values of the `kind` field of a refusal event.
pub const WRITE_KINDS: [&str; 6] = [
    "heartbeat",
    "renew",
    "release",
    "claim",
    "cleanup",
    "delete",
];

/// The level of a log line (the word after the timestamp).
fn level(line: &str) -> Option<&str> {
    line.split_whitespace().nth(1)
}

/// The kind of the refused write a log line records, if it records one: a WARN event whose
/// `kind` field names a lease write (the structured field of the store's refusal event; its
/// message is not looked at, and a renamed field shows up in
/// [`Fleet::refusal_disagreements`]).
fn refused_kind(line: &str) -> Option<&str> {
    if level(line) != Some("WARN") {
        return None;
    }
    let kind = field(line, "kind")?;
    WRITE_KINDS.contains(&kind).then_some(kind)
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!(" {name}=");
    let at = line.find(&pat)? + pat.len();
    let rest = &line[at..];
    if let Some(quoted) = rest.strip_prefix('"') {
        quoted.split('"').next()
    } else {
        rest.split([' ', ',', '}']).next()
    }
}

/// Parses the text log of `outboxctl relay` (tracing's default format: an RFC 3339
/// timestamp, the level, spans, the message, then `name=value` fields).
pub fn parse_log(text: &str) -> ParsedLog {
    let mut out = ParsedLog::default();
    for raw in text.lines() {
        let line = strip_ansi(raw);
        let at = line
            .split_whitespace()
            .next()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros());
        if line.contains("bucket ownership") {
            let bucket = field(&line, "bucket").and_then(|b| b.parse().ok());
            let owns = match field(&line, "ownership") {
                Some("owns") => Some(true),
                Some("disowns") => Some(false),
                _ => None,
            };
            if let (Some(at_us), Some(bucket), Some(owns)) = (at, bucket, owns) {
                out.events.push(OwnershipEvent {
                    at_us,
                    bucket,
                    owns,
                });
            }
        } else if line.contains("handed a bucket back") {
            if let (Some(at_us), Some(bucket)) =
                (at, field(&line, "bucket").and_then(|b| b.parse().ok()))
            {
                out.released.push((at_us, bucket));
            }
        } else if let Some(kind) = refused_kind(&line) {
            *out.refused.entry(kind.to_string()).or_default() += 1;
            out.refused_at_us.extend(at);
        } else if field(&line, "stop_reason").is_some() {
            if let Some(n) = field(&line, "refused").and_then(|n| n.parse().ok()) {
                out.stopped_refused = Some(n);
            }
            out.stopped_released = field(&line, "released").and_then(|b| b.parse().ok());
        }
    }
    out
}

/// The lines of the relay logs in `dir` about message `sequence` of `bucket`: the debug
/// events of its bucket ("fetched", "produce acknowledged", "deleted published messages")
/// whose sequence range holds it, and the bucket's ownership events, each prefixed with
/// its log's name (at most 40 lines, those on the message first).
pub fn trace_message(dir: &Path, bucket: u32, sequence: u64) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![format!("(no relay logs in {})", dir.display())];
    };
    let mut logs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let bucket_field = bucket.to_string();
    let deliveries = std::fs::read_to_string(dir.join("deliveries.jsonl")).unwrap_or_default();
    let (mut on_it, mut ownership) = (Vec::new(), Vec::new());
    for log in logs {
        let name = log
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(text) = std::fs::read_to_string(&log) else {
            continue;
        };
        for raw in text.lines() {
            let line = strip_ansi(raw);
            if field(&line, "bucket") != Some(bucket_field.as_str()) {
                continue;
            }
            let num = |name: &str| field(&line, name).and_then(|v| v.parse::<u64>().ok());
            let last = num("last_sequence")
                .or_else(|| num("last_deleted_sequence"))
                .or_else(|| num("first_sequence"));
            let holds = matches!((num("first_sequence"), last), (Some(a), Some(b)) if a <= sequence && sequence <= b);
            if holds {
                on_it.push(format!("  {name}: {line}"));
                if line.contains("produce acknowledged") {
                    on_it.push(kafka_at(&deliveries, &line));
                }
            } else if line.contains("bucket ownership") {
                ownership.push(format!("  {name}: {line}"));
            }
        }
    }
    if on_it.is_empty() {
        on_it.push("  (no relay log line names it: never fetched?)".into());
    }
    on_it.truncate(30);
    on_it.extend(ownership.into_iter().take(40 - on_it.len()));
    on_it
}

/// What the harness read back from Kafka (`deliveries`, the text of the scenario's
/// `deliveries.jsonl`) at the offsets a "produce acknowledged" log line names: each offset
/// with the first 8 characters of its record's message id, or "none".
fn kafka_at(deliveries: &str, produce_line: &str) -> String {
    let topic = field(produce_line, "topic").unwrap_or_default();
    let num = |name: &str| field(produce_line, name).and_then(|v| v.parse::<i64>().ok());
    let (Some(partition), Some(first), Some(last)) =
        (num("partition"), num("first_offset"), num("last_offset"))
    else {
        return "    (the line names no offsets)".into();
    };
    let mut at: BTreeMap<i64, String> = BTreeMap::new();
    for d in deliveries
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let offset = d["offset"].as_i64().unwrap_or(-1);
        if d["topic"] == topic
            && d["partition"].as_i64() == Some(partition)
            && (first..=last).contains(&offset)
        {
            let id = d["message_id"].as_str().unwrap_or("(no id)");
            at.insert(offset, id.chars().take(8).collect());
        }
    }
    let held: Vec<String> = (first..=last)
        .take(50)
        .map(|o| format!("{o}:{}", at.get(&o).map_or("none", String::as_str)))
        .collect();
    format!(
        "    Kafka read back {topic}/{partition}: {}",
        held.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_message_finds_the_batches_that_held_a_message() {
        let dir = std::env::temp_dir().join(format!("harness-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("h-r01.log"),
            "\
2026-11-30T14:35:16.1Z  INFO run: dynamo_outbox::relay: bucket ownership bucket=3 ownership=\"owns\"
2026-11-30T14:35:16.2Z DEBUG run: dynamo_outbox::relay::batch: fetched bucket=3 after=None fetched=5 first_sequence=10 last_sequence=14
2026-11-30T14:35:16.3Z DEBUG run: dynamo_outbox::publish::kafka: produce acknowledged topic=\"t\" partition=1 records=5 first_offset=40 last_offset=44 bucket=3 first_sequence=10 last_sequence=14
2026-11-30T14:35:16.4Z DEBUG run: dynamo_outbox::relay::batch: deleted published messages bucket=3 acknowledged=5 deleted=5 first_sequence=10 last_deleted_sequence=14
2026-11-30T14:35:16.5Z DEBUG run: dynamo_outbox::relay::batch: fetched bucket=3 after=14 fetched=2 first_sequence=15 last_sequence=16
2026-11-30T14:35:16.6Z DEBUG run: dynamo_outbox::relay::batch: fetched bucket=13 after=None fetched=5 first_sequence=10 last_sequence=14
",
        )
        .unwrap();
        std::fs::write(
            dir.join("deliveries.jsonl"),
            "{\"topic\":\"t\",\"partition\":1,\"offset\":40,\"message_id\":\"aaaaaaaa-1\"}\n\
             {\"topic\":\"t\",\"partition\":1,\"offset\":42,\"message_id\":\"cccccccc-1\"}\n\
             {\"topic\":\"t\",\"partition\":2,\"offset\":41,\"message_id\":\"bbbbbbbb-1\"}\n",
        )
        .unwrap();
        let lines = trace_message(&dir, 3, 12);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert!(lines[0].contains("h-r01:") && lines[0].contains("fetched bucket=3 after=None"));
        assert!(lines[1].contains("first_offset=40"));
        assert_eq!(
            lines[2],
            "    Kafka read back t/1: 40:aaaaaaaa 41:none 42:cccccccc 43:none 44:none"
        );
        assert!(lines[3].contains("deleted=5"));
        assert!(lines[4].contains("bucket ownership"));
        let none = trace_message(std::path::Path::new("/nonexistent-harness-dir"), 3, 12);
        assert!(none[0].contains("no relay logs"), "{none:?}");
    }

    #[test]
    fn parses_ownership_and_refusals() {
        let text = "\
2026-11-30T14:35:16.123456Z  INFO run{relay_id=r1}: dynamo_outbox::relay: bucket ownership bucket=3 ownership=\"owns\"
\u{1b}[2m2026-11-30T14:35:17.000001Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m run{relay_id=r1}: dynamo_outbox::relay: bucket ownership \u{1b}[3mbucket\u{1b}[0m\u{1b}[2m=\u{1b}[0m3 \u{1b}[3mownership\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"disowns\"
2026-11-30T14:35:18.5Z  WARN run{relay_id=r1}: dynamo_outbox::protocol::store::leases: conditional write refused kind=\"renew\" relay_id=\"r1\" bucket=3 likely_cause=\"x\"
2026-11-30T14:35:18.6Z  WARN dynamo_outbox::protocol::store::leases: conditional write refused kind=\"claim\" relay_id=\"r1\" bucket=2
";
        let p = parse_log(text);
        assert_eq!(p.events.len(), 2, "{p:?}");
        assert_eq!(p.events[0].bucket, 3);
        assert!(p.events[0].owns);
        assert!(!p.events[1].owns);
        assert_eq!(p.events[1].at_us - p.events[0].at_us, 876_545);
        assert_eq!(p.refused.get("renew"), Some(&1));
        assert_eq!(p.refused.get("claim"), Some(&1));
    }

    #[test]
    fn a_refusal_is_recognised_by_its_fields_not_its_wording() {
        let text = "\
2026-11-30T14:35:18.5Z  WARN run{relay_id=r1}: dynamo_outbox::protocol::store::leases: lease write not applied kind=\"claim\" relay_id=\"r1\" bucket=2 likely_cause=\"a peer claimed it first\"
2026-11-30T14:35:18.6Z  WARN dynamo_outbox::protocol::coordination: something else entirely kind=\"heartbeat\" relay_id=\"r1\" likely_cause=\"x\"
2026-11-30T14:35:18.7Z  WARN dynamo_outbox::relay: heartbeat refused: claiming nothing this round
2026-11-30T14:35:18.8Z DEBUG dynamo_outbox::protocol::store::leases: write already applied by an earlier attempt kind=\"renew\" relay_id=\"r1\" bucket=1
2026-11-30T14:35:18.9Z  WARN dynamo_outbox::relay: publish failed kind=\"transient\" likely_cause=\"broker\"
";
        let p = parse_log(text);
        assert_eq!(
            p.refused,
            BTreeMap::from([("claim".to_string(), 1), ("heartbeat".to_string(), 1)]),
            "{p:?}"
        );
        assert_eq!(p.refused_at_us.len(), 2);
    }

    /// The lines `outboxctl relay` wrote here (a relay whose clock was 10 s behind its own
    /// stored heartbeat), and its exit summary.
    #[test]
    fn parses_a_real_relay_log() {
        let text = "\
2026-12-01T09:34:51.957641Z  WARN run{relay_id=same}: dynamo_outbox::protocol::store::leases: conditional write refused kind=\"heartbeat\" relay_id=\"same\" likely_cause=\"the record carries a later timestamp: a clock set back, two processes sharing a relay id, or a request this relay abandoned\"
2026-12-01T09:34:51.966001Z  WARN run{relay_id=same}: dynamo_outbox::relay: heartbeat refused: claiming nothing this round
2026-12-01T09:34:53.961124Z  WARN run{relay_id=same}: dynamo_outbox::protocol::store::leases: conditional write refused kind=\"heartbeat\" relay_id=\"same\" likely_cause=\"the record carries a later timestamp: a clock set back, two processes sharing a relay id, or a request this relay abandoned\"
2026-12-01T09:34:53.961223Z  WARN run{relay_id=same}: dynamo_outbox::relay: stop stamp refused: leaving the leases to lapse
2026-12-01T09:34:53.961276Z  INFO run{relay_id=same}: dynamo_outbox::relay: relay stopped published=0 refused=2 released=false stop_reason=\"deadline\"
";
        let p = parse_log(text);
        assert_eq!(p.refused, BTreeMap::from([("heartbeat".to_string(), 2)]));
        assert_eq!(p.stopped_refused, Some(2));
        assert_eq!(p.stopped_released, Some(false));
        assert_eq!(
            summary_refused(
                "relay same stopped (deadline): published 0, refused writes 2, leases released: false\n"
            ),
            Some(2)
        );
    }

    #[test]
    fn reads_the_refused_count_of_the_exit_summary() {
        assert_eq!(
            summary_refused(
                "relay r1 stopped (shutdown): published 12, refused writes 3, leases released: true\n"
            ),
            Some(3)
        );
        assert_eq!(summary_refused("{\"_aws\":{}}\n"), None);
    }
}
