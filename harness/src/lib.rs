//! A Jepsen-style fault-injection harness for the outbox, on the local stack
//! (DynamoDB Local and Apache Kafka, started by `scripts/stack.sh`).
//!
//! Each scenario creates a fresh table and two topics, starts `outboxctl relay`
//! processes, runs writers that enqueue continuously (each value carries its key and a
//! per-key counter; every acknowledged enqueue is logged with its message id, bucket and
//! sequence), injects its fault into the relay processes, then stops the writers, drains
//! the table with a healthy relay, stops every relay gracefully and reads every topic from
//! offset 0 with the independent client (`scripts/kafka.py`). The checker
//! ([`check::check`]) turns that history into the figures; [`Outcome::missed`] compares
//! them with the scenario's [`Targets`].
//!
//! # Layout
//! - [`check`]: the history and the checker (pure).
//! - [`fleet`]: relay processes, faults (SIGKILL, SIGSTOP/SIGCONT, SIGTERM), log parsing.
//! - [`proxy`]: the fault-injecting HTTP proxy in front of DynamoDB Local.
//! - [`broker`]: the stack's broker behind a fault-injecting TCP proxy (cut, stall, refuse).
//! - this file: scenarios, profiles, writers, the run of one scenario, the report.

pub mod broker;
pub mod check;
pub mod fleet;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::{DynamoDbOutboxWriter, OutboxMessage};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use check::{Ack, Delivery, Figures, History};
use fleet::{now_us, Fleet};

/// How long each scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Profile {
    /// A few seconds of writes per scenario: the test suite's run (about 4 to 5 minutes).
    Short,
    /// About 45 s of writes per scenario, more faults: the documented figures.
    Long,
}

impl Profile {
    fn drain_timeout(self) -> Duration {
        match self {
            Profile::Short => Duration::from_secs(15),
            Profile::Long => Duration::from_secs(30),
        }
    }

    fn writes_for(self) -> Duration {
        match self {
            Profile::Short => Duration::from_secs(7),
            Profile::Long => Duration::from_secs(45),
        }
    }
}

/// A fault, injected while the writers run.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Nothing.
    None,
    /// `kill -9` of a random relay every 1.5 to 3 s, replaced after 0 to 1 s.
    Kill9,
    /// `SIGSTOP` of a relay that owns buckets, for `stop_for`, then `SIGCONT`; again every
    /// `every` (long profile).
    Stall {
        /// How long the relay stays stopped.
        stop_for: Duration,
        /// Pause between stalls.
        every: Duration,
    },
    /// Graceful stop (SIGTERM) of the oldest relay, then the start of a new one: a rolling
    /// update. With `settle`, the fleet settles (every bucket owned, 1.5 s without a change)
    /// after the stop and after the start; without, the new relay starts as soon as the old
    /// one exited, and the next restart follows `every` later.
    Rolling {
        /// Pause between restarts (without `settle`).
        every: Duration,
        /// Let the fleet settle between a stop and the next start.
        settle: bool,
    },
    /// The relays reach DynamoDB through [`proxy::HttpFaultProxy`] with this mix (the
    /// writers do not); the proxy forwards faithfully again for the final drain.
    DynamoProxy(proxy::FaultMix),
    /// The relays reach the stack's broker (a proxy slot of it) through
    /// [`broker::TcpFaultProxy`], which every 1.5 to 3 s cuts every connection, stalls
    /// them for 1 to 4 s, or refuses connections for 1 to 3 s.
    KafkaProxy,
    /// Graceful stops among three or more relays (none may cause a refused claim), while
    /// the DynamoDB proxy holds every release of a graceful stop for a random time in
    /// `hold`, so that a leaver's releases land in random order around its peers' re-reads.
    /// In a loop, at least once each: one stop after another (SIGTERM to the oldest relay,
    /// the fleet settles, a new relay starts, the fleet settles); two overlapping stops
    /// (SIGTERM to the two oldest at once); a stop with a deadline overlapping a SIGTERM (a
    /// relay run with `--for` joins, announces its stop in its heartbeats, and stops on its
    /// own within 300 ms of a SIGTERM to the oldest relay). Starts happen only in a settled
    /// fleet.
    Stops {
        /// Range of the hold of each stop release.
        hold: (Duration, Duration),
    },
    /// Relays join and leave gracefully (and, with `kill`, are killed with SIGKILL), one
    /// change every 1 to 2.5 s after the fleet settled from the last one, never fewer
    /// than one nor more than four; at least one join and one leave. The relays reach
    /// DynamoDB through the proxy with `mix`.
    Churn {
        /// Also SIGKILL relays.
        kill: bool,
        /// The proxy's faults while the writers run.
        mix: proxy::FaultMix,
    },
    /// After `after`, a graceful restart of relay `index` (among the initial relays).
    RestartOne {
        /// When.
        after: Duration,
        /// Which initial relay.
        index: usize,
    },
}

impl Fault {
    /// The faults the DynamoDB proxy injects into the relays' requests while the writers
    /// run, if any.
    fn proxy_mix(&self) -> Option<proxy::FaultMix> {
        match self {
            Fault::DynamoProxy(mix) | Fault::Churn { mix, .. } => Some(*mix),
            Fault::Stops { hold } => Some(proxy::FaultMix {
                hold_stop_releases: Some(*hold),
                ..proxy::FaultMix::default()
            }),
            _ => None,
        }
    }
}

/// The writers' load.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Load {
    /// Keys per bucket (one writer task each).
    pub keys_per_bucket: usize,
    /// Pause between two enqueues of a key.
    pub pace: Duration,
    /// Size of each value in bytes (the JSON value padded to exactly this size); 0: the
    /// unpadded JSON value (about 30 bytes).
    pub value_bytes: usize,
    /// Per key, the first messages are enqueued without a pause: a backlog written as fast
    /// as DynamoDB takes it.
    pub burst: u64,
}

/// Two keys per bucket, one enqueue every 60 ms per key, small values.
const SMALL_VALUES: Load = Load {
    keys_per_bucket: 2,
    pace: Duration::from_millis(60),
    value_bytes: 0,
    burst: 0,
};

/// The size of the large items' values: 300 KB (DynamoDB's item limit is 400 KB).
pub const LARGE_VALUE_BYTES: usize = 300 * 1024;

/// What a scenario must show.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Targets {
    /// Overlapping ownership is expected (a stall, a clock beyond the bound): measured.
    pub overlap_allowed: bool,
    /// Order inversions are accepted by the spec here: measured.
    pub inversions_allowed: bool,
    /// No refused conditional write at all.
    pub zero_refused: bool,
}

/// One scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name.
    pub name: &'static str,
    /// The number of its fault: the report's `#` column (scenarios of one fault share it).
    pub number: &'static str,
    /// What it shows a user.
    pub meaning: &'static str,
    /// Buckets of its table.
    pub bucket_count: u32,
    /// Clock offsets of the initial relays (`None` = the system clock), started in order.
    pub relays: Vec<Option<&'static str>>,
    /// Pause between starting two initial relays.
    pub stagger: Duration,
    /// The fault.
    pub fault: Fault,
    /// The targets.
    pub targets: Targets,
    /// The writers' load.
    pub load: Load,
    /// Relay settings of this scenario, over the harness's ([`fleet::Fleet::start`]).
    pub relay_env: &'static [(&'static str, &'static str)],
}

/// Pause between starting relays where a scenario is not about a simultaneous start (three
/// relays starting at the same instant on free buckets may refuse a claim once, which the
/// spec accepts; scenario `herd-20` measures that case).
const STAGGER: Duration = Duration::from_millis(1500);

/// How long without an ownership change counts as settled.
const SETTLE_QUIET: Duration = Duration::from_millis(1500);

const STRICT: Targets = Targets {
    overlap_allowed: false,
    inversions_allowed: false,
    zero_refused: true,
};
const MEASURED_REFUSALS: Targets = Targets {
    overlap_allowed: false,
    inversions_allowed: false,
    zero_refused: false,
};
const SPEC_ACCEPTS_OVERLAP: Targets = Targets {
    overlap_allowed: true,
    inversions_allowed: true,
    zero_refused: false,
};

/// Every scenario of a profile, in run order.
pub fn scenarios(profile: Profile) -> Vec<Scenario> {
    let long = profile == Profile::Long;
    vec![
        Scenario {
            name: "baseline-1",
            number: "1",
            meaning: "one relay, no fault: the reference figures",
            bucket_count: 8,
            relays: vec![None],
            stagger: Duration::ZERO,
            fault: Fault::None,
            targets: STRICT,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "baseline-3",
            number: "1",
            meaning: "three relays sharing the buckets, no fault",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: STAGGER,
            fault: Fault::None,
            targets: STRICT,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "kill-9",
            number: "2",
            meaning: "relays killed at random points (mid-publish, between publish and delete, mid-delete) and replaced",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: Duration::ZERO,
            fault: Fault::Kill9,
            targets: MEASURED_REFUSALS,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "sigstop",
            number: "3",
            meaning: "a relay frozen longer than the lease (GC pause, suspended VM), then resumed",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: Duration::ZERO,
            fault: Fault::Stall {
                stop_for: Duration::from_millis(4500),
                every: if long {
                    Duration::from_secs(8)
                } else {
                    Duration::from_secs(30)
                },
            },
            targets: SPEC_ACCEPTS_OVERLAP,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "rolling",
            number: "4",
            meaning: "rolling update: graceful stop (SIGTERM) of the oldest relay, the fleet settles, a new relay starts, the fleet settles; in a loop",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: STAGGER,
            fault: Fault::Rolling {
                every: Duration::ZERO,
                settle: true,
            },
            targets: STRICT,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "rolling-fast",
            number: "4",
            meaning: "rolling update without pauses: each new relay starts the moment the old one exited, every 2 s",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: STAGGER,
            fault: Fault::Rolling {
                every: Duration::from_millis(2000),
                settle: false,
            },
            targets: MEASURED_REFUSALS,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "herd-20",
            number: "4",
            meaning: "20 relays starting at once on 8 buckets (12 standbys)",
            bucket_count: 8,
            relays: vec![None; 20],
            stagger: Duration::ZERO,
            fault: Fault::None,
            targets: MEASURED_REFUSALS,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "dynamodb-faults",
            number: "5",
            meaning: "the relays' DynamoDB requests throttled (5%), failed with 500 (2%), applied with the response dropped (3%), delayed up to 300 ms (10%)",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: STAGGER,
            fault: Fault::DynamoProxy(proxy::FaultMix {
                throttle: 0.05,
                server_error: 0.02,
                drop_response: 0.03,
                slow: 0.10,
                max_latency: Duration::from_millis(300),
                hold_stop_releases: None,
            }),
            targets: MEASURED_REFUSALS,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "kafka-faults",
            number: "6",
            meaning: "the relays' broker connections cut, stalled (1-4 s) or refused (1-3 s), one fault every 1.5-3 s",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: STAGGER,
            fault: Fault::KafkaProxy,
            targets: MEASURED_REFUSALS,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "clock-within",
            number: "7",
            meaning: "relay clocks +0.9 s and -0.9 s off (1.8 s apart, inside the 2 s bound), one restart",
            bucket_count: 8,
            relays: vec![Some("+900ms"), None, Some("-900ms")],
            stagger: Duration::ZERO,
            fault: Fault::RestartOne {
                after: Duration::from_secs(3),
                index: 1,
            },
            targets: MEASURED_REFUSALS,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "clock-ahead-5s",
            number: "7",
            meaning: "a relay whose clock is 5 s ahead joins two healthy relays (beyond the bound)",
            bucket_count: 8,
            relays: vec![None, None, Some("+5s")],
            stagger: Duration::from_millis(1500),
            fault: Fault::None,
            targets: SPEC_ACCEPTS_OVERLAP,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "clock-behind-5s",
            number: "7",
            meaning: "a relay whose clock is 5 s behind owns every bucket when two healthy relays join (beyond the bound)",
            bucket_count: 8,
            relays: vec![Some("-5s"), None, None],
            stagger: Duration::from_millis(1500),
            fault: Fault::None,
            targets: SPEC_ACCEPTS_OVERLAP,
            load: SMALL_VALUES,
            relay_env: &[],
        },
        Scenario {
            name: "graceful-stops",
            number: "I2.1",
            meaning: "graceful stops among five relays on 20 buckets, one after another, two at once, and a deadline stop overlapping a SIGTERM, every stop's releases held 250-450 ms",
            bucket_count: 20,
            relays: vec![None; 5],
            stagger: STAGGER,
            fault: Fault::Stops {
                hold: (Duration::from_millis(250), Duration::from_millis(450)),
            },
            targets: STRICT,
            load: Load {
                keys_per_bucket: 1,
                ..SMALL_VALUES
            },
            relay_env: &[],
        },
        Scenario {
            name: "large-items",
            number: "18",
            meaning: "300 KB values (8 keys): a backlog written as fast as DynamoDB takes it, then one per key every 500 ms, while relays join and leave and 10% of the relays' DynamoDB requests are delayed up to 300 ms; lease 6 s, renew interval 2 s, 8 MiB in flight (1 MiB a batch)",
            bucket_count: 8,
            relays: vec![None; 2],
            stagger: STAGGER,
            fault: Fault::Churn {
                kill: false,
                mix: proxy::FaultMix {
                    slow: 0.10,
                    max_latency: Duration::from_millis(300),
                    ..proxy::FaultMix::default()
                },
            },
            targets: STRICT,
            load: Load {
                keys_per_bucket: 1,
                pace: Duration::from_millis(500),
                value_bytes: LARGE_VALUE_BYTES,
                burst: if long { 40 } else { 10 },
            },
            // A batch of 300 KB items (up to 4 MiB by default) takes DynamoDB Local and
            // the broker on this 2-core machine longer than the harness's 1 s renew interval
            // leaves a produce request (a renew interval before the lease's validity):
            // twice the harness's timings, still ten times shorter than the defaults.
            relay_env: &[
                ("OUTBOX_LEASE_DURATION", "6s"),
                ("OUTBOX_LEASE_RENEW_INTERVAL", "2s"),
                // 8 MiB in flight, 1 MiB (three items) a batch. With the default (32 MiB,
                // 4 MiB a batch) a fetch that outlasts its wave is dropped and retried at
                // the same size: at a load average of 12 here nothing was published.
                ("OUTBOX_MAX_IN_FLIGHT_BYTES", "8388608"),
            ],
        },
    ]
}

/// What a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `outboxctl` binary.
    pub outboxctl: PathBuf,
    /// Profile.
    pub profile: Profile,
    /// Scenario names to run (empty: all).
    pub only: Vec<String>,
    /// Where histories and logs go (one directory per scenario).
    pub out_dir: PathBuf,
    /// Seed of the fault schedule.
    pub seed: u64,
}

/// The result of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Scenario name.
    pub name: String,
    /// The number of its fault (the report's `#` column).
    pub number: String,
    /// What it shows.
    pub meaning: String,
    /// The targets it was held to.
    pub targets: Targets,
    /// The figures.
    pub figures: Figures,
    /// Relay processes started.
    pub relays_started: usize,
    /// Faults injected (kills, stalls, restarts).
    pub faults: usize,
    /// The scenario injects faults (all but those whose fault is [`Fault::None`]): then
    /// `faults` must not be zero.
    pub fault_expected: bool,
    /// Relays that did not stop within the grace period.
    pub unclean_stops: usize,
    /// Graceful stops while the writers ran (SIGTERM or a `--for` run's end).
    pub graceful_stops: usize,
    /// Relays that stopped gracefully (exit 0, neither killed nor over the grace period)
    /// but whose final event says `released=false`: their leases lapse instead of being
    /// handed over.
    pub unreleased_stops: Vec<String>,
    /// Releases of graceful stops the DynamoDB proxy held ([`Fault::Stops`]).
    pub held_stop_releases: u64,
    /// The scenario holds releases: then `held_stop_releases` must not be zero.
    pub holds_releases: bool,
    /// Refused writes from the relays' exit summaries (killed relays print none).
    pub summary_refused: u64,
    /// Answers in which DynamoDB refused a condition of a relay's write, counted at the
    /// proxy every relay reaches DynamoDB through (apart from what the relays count).
    pub wire_refused: u64,
    /// Relays that stopped cleanly whose final log event or exit summary counts other
    /// refused writes than their log's refusal events, or lacks the count
    /// ([`fleet::Fleet::refusal_disagreements`]).
    pub refusal_disagreements: Vec<String>,
    /// Seconds of writes.
    pub write_seconds: f64,
    /// Seconds the whole scenario took.
    pub seconds: f64,
    /// ERROR lines or panics in relay logs (first few).
    pub relay_errors: Vec<String>,
    /// What the DynamoDB proxy did (scenario 5).
    pub proxy: Option<serde_json::Value>,
    /// Where its history is.
    pub dir: PathBuf,
}

impl Outcome {
    /// Targets this scenario missed, in words (empty: all met).
    pub fn missed(&self) -> Vec<String> {
        let f = &self.figures;
        let mut m = Vec::new();
        if f.acked == 0 {
            m.push("no enqueue was acknowledged".to_string());
        }
        if f.lost > 0 {
            m.push(format!("{} acknowledged messages lost", f.lost));
            for a in &f.lost_examples {
                m.push(format!(
                    "lost {} (key {} #{}, topic {}, bucket {} sequence {}); the relays' log lines on it:\n{}",
                    a.message_id,
                    a.key,
                    a.counter,
                    a.topic,
                    a.bucket,
                    a.sequence,
                    fleet::trace_message(&self.dir, a.bucket, a.sequence).join("\n")
                ));
            }
        }
        if f.never_drained > 0 {
            m.push(format!("{} messages never drained", f.never_drained));
        }
        if !self.targets.inversions_allowed && f.order_inversions > 0 {
            m.push(format!("{} per-key order inversions", f.order_inversions));
        }
        if !self.targets.overlap_allowed && f.overlaps > 0 {
            m.push(format!(
                "{} overlapping ownership intervals (longest {:.0} ms)",
                f.overlaps, f.overlap_max_ms
            ));
        }
        if self.targets.zero_refused && f.refused_total > 0 {
            m.push(format!("refused conditional writes: {:?}", f.refused));
        }
        if self.targets.zero_refused && self.wire_refused > 0 {
            m.push(format!(
                "DynamoDB refused {} conditional writes (counted at the wire)",
                self.wire_refused
            ));
        }
        // Every refusal a relay logs is an answer it received: fewer answers than logged
        // refusals means the log is misread.
        if self.wire_refused < f.refused_total {
            m.push(format!(
                "the relays' logs show {} refused writes, DynamoDB answered only {} refusals",
                f.refused_total, self.wire_refused
            ));
        }
        m.extend(self.refusal_disagreements.iter().cloned());
        if !self.unreleased_stops.is_empty() {
            m.push(format!(
                "graceful stops that did not release their leases (released=false): {}",
                self.unreleased_stops.join(", ")
            ));
        }
        if self.fault_expected && self.faults == 0 {
            m.push("its fault was never injected".to_string());
        }
        if self.holds_releases && self.held_stop_releases == 0 {
            m.push("no release of a graceful stop was held".to_string());
        }
        // Id sets: every acknowledged message reached Kafka, and nothing else did (no
        // enqueue failed, so every record is of an acknowledged message).
        if f.undelivered > 0 {
            m.push(format!(
                "{} acknowledged messages never reached Kafka",
                f.undelivered
            ));
        }
        if f.unacked_records > 0 && f.failed_enqueues == 0 {
            m.push(format!(
                "{} records of messages never acknowledged (or without a message id)",
                f.unacked_records
            ));
        }
        if f.wrong_size_values > 0 {
            m.push(format!(
                "{} records whose value is not the size written",
                f.wrong_size_values
            ));
        }
        if self.unclean_stops > 0 {
            m.push(format!(
                "{} relays did not stop within the grace period",
                self.unclean_stops
            ));
        }
        m.into_iter()
            .map(|s| format!("{}: {s}", self.name))
            .collect()
    }
}

/// The stack's variables; an error naming the first one missing.
pub fn check_stack_env() -> Result<(), String> {
    for v in [
        "AWS_ENDPOINT_URL_DYNAMODB",
        "KAFKA_BOOTSTRAP_SERVERS",
        "OUTBOX_STACK_PYTHON",
        "OUTBOX_STACK_SCRIPTS",
    ] {
        if std::env::var_os(v).is_none() {
            return Err(format!(
                "{v} is not set: run inside the local stack (scripts/harness.sh, scripts/test.sh or scripts/stack.sh run -- ...)"
            ));
        }
    }
    Ok(())
}

/// Runs the scenarios of `config`, one after the other.
pub async fn run(config: &Config) -> Result<Vec<Outcome>, String> {
    check_stack_env()?;
    std::fs::create_dir_all(&config.out_dir)
        .map_err(|e| format!("creating {}: {e}", config.out_dir.display()))?;
    let selected: Vec<Scenario> = scenarios(config.profile)
        .into_iter()
        .filter(|s| config.only.is_empty() || config.only.iter().any(|o| o == s.name))
        .collect();
    if selected.is_empty() {
        return Err(format!("no scenario named {:?}", config.only));
    }
    let mut outcomes = Vec::new();
    for (i, s) in selected.iter().enumerate() {
        eprintln!("[harness] scenario {} ({})", s.name, s.meaning);
        let outcome = run_scenario(config, s, config.seed.wrapping_add(i as u64)).await?;
        eprintln!(
            "[harness] {}: {} in {:.1}s",
            s.name,
            if outcome.missed().is_empty() {
                "targets met".to_string()
            } else {
                outcome.missed().join("; ")
            },
            outcome.seconds
        );
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Keys, two per bucket, so every bucket has traffic.
fn pick_keys(bucket_count: u32, per_bucket: usize) -> Vec<(String, u32)> {
    let mut count = vec![0usize; bucket_count as usize];
    let mut keys = Vec::new();
    for i in 0..100_000 {
        let key = format!("key-{i}");
        let b = OutboxMessage::new("t", bucket_count)
            .with_key(key.clone())
            .bucket();
        if count[b as usize] < per_bucket {
            count[b as usize] += 1;
            keys.push((key, b));
        }
        if keys.len() == bucket_count as usize * per_bucket {
            break;
        }
    }
    keys
}

/// The value of message `counter` of `key`: JSON carrying both, padded to exactly
/// `bytes` bytes when `bytes` is larger.
fn value_of(key: &str, counter: u64, bytes: usize) -> String {
    let bare = serde_json::json!({ "key": key, "counter": counter }).to_string();
    let padded = serde_json::json!({ "key": key, "counter": counter, "pad": "" }).to_string();
    if bytes <= padded.len() {
        return bare;
    }
    serde_json::json!({ "key": key, "counter": counter, "pad": "x".repeat(bytes - padded.len()) })
        .to_string()
}

/// Writers: one task per key, enqueuing one message at a time until `stop` (the first
/// `load.burst` of each key without a pause).
async fn write(
    writer: DynamoDbOutboxWriter,
    keys: Vec<(String, String)>,
    load: Load,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
) -> u64 {
    let pace = load.pace;
    let tasks = keys.into_iter().map(|(key, topic)| {
        let writer = writer.clone();
        let stop = stop.clone();
        let acks = acks.clone();
        tokio::spawn(async move {
            let mut failed = 0u64;
            let mut counter = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let value = value_of(&key, counter, load.value_bytes);
                let message = writer
                    .message(topic.clone())
                    .with_key(key.clone())
                    .with_value(value);
                match writer.enqueue(std::slice::from_ref(&message)).await {
                    Ok(done) => {
                        let at = now_us();
                        let mut acks = acks.lock().unwrap_or_else(|e| e.into_inner());
                        for e in done {
                            acks.push(Ack {
                                message_id: e.message_id.to_string(),
                                key: key.clone(),
                                counter,
                                topic: topic.clone(),
                                bucket: e.bucket,
                                sequence: e.sequence,
                                acked_at_us: at,
                            });
                        }
                    }
                    Err(_) => failed += 1,
                }
                counter += 1;
                if counter >= load.burst {
                    tokio::time::sleep(pace).await;
                }
            }
            failed
        })
    });
    let mut failed = 0;
    for t in futures::future::join_all(tasks).await {
        failed += t.unwrap_or(0);
    }
    failed
}

/// How long a fault's stop or start waits for the fleet to settle (or a new relay to join).
const SETTLE_BOUND: Duration = Duration::from_secs(10);

/// One scenario's resources, from its table to its fleet. The fields drop in this order:
/// the proxy, the relays, then the Kafka proxy.
struct Setup {
    /// Every relay reaches DynamoDB through it ([`Fault::proxy_mix`]).
    proxy: proxy::HttpFaultProxy,
    /// Its faults are switched on while the writers run.
    inject_dynamodb_faults: bool,
    fleet: Fleet,
    writer: DynamoDbOutboxWriter,
    /// Each writer's key and topic.
    keys: Vec<(String, String)>,
    /// The Kafka proxy's, when the scenario has one.
    bootstrap: Option<String>,
    kafka_proxy: Option<broker::ProxiedBroker>,
    topics: Vec<String>,
    options: dynamo_outbox::OutboxOptions,
    client: aws_sdk_dynamodb::Client,
    dir: PathBuf,
}

/// What the faults of a scenario counted while the writers ran.
#[derive(Debug, Default)]
struct Injected {
    /// Faults injected (kills, stalls, restarts).
    faults: usize,
    /// Graceful stops (SIGTERM or a `--for` run's end).
    graceful_stops: usize,
}

impl Injected {
    fn faults(faults: usize) -> Self {
        Injected {
            faults,
            graceful_stops: 0,
        }
    }
}

/// What the writers left for the drain and the checks.
struct Written {
    acks: Arc<Mutex<Vec<Ack>>>,
    failed_enqueues: u64,
    writes_started_us: i64,
    write_seconds: f64,
    injected: Injected,
}

/// One scenario, by phase: its resources, the initial relays, the settle wait, the writes
/// under its fault, then the drain and the checks.
async fn run_scenario(config: &Config, s: &Scenario, seed: u64) -> Result<Outcome, String> {
    let started = tokio::time::Instant::now();
    let mut setup = set_up(config, s, seed).await?;
    for (i, offset) in s.relays.iter().enumerate() {
        if i > 0 && !s.stagger.is_zero() {
            tokio::time::sleep(s.stagger).await;
        }
        start_relay(&mut setup.fleet, &config.outboxctl, *offset, None)?;
    }
    settle(&mut setup.fleet, s, &setup.dir).await?;
    let written = write_while_faulted(config, s, seed, &mut setup).await?;
    finish(config, s, setup, written, started).await
}

/// Starts one relay (`--for run_for` when given); the error names the binary.
fn start_relay(
    fleet: &mut Fleet,
    outboxctl: &Path,
    offset: Option<&str>,
    run_for: Option<Duration>,
) -> Result<usize, String> {
    fleet
        .start_for(offset, run_for)
        .map_err(|e| format!("starting {}: {e}", outboxctl.display()))
}

/// The scenario's table, topics, Kafka proxy (scenario 6), writer, DynamoDB proxy and
/// (empty) fleet.
async fn set_up(config: &Config, s: &Scenario, seed: u64) -> Result<Setup, String> {
    let dir = config.out_dir.join(s.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let client = outbox_testkit::dynamodb().await;
    let options = outbox_testkit::fresh_table(&client, s.bucket_count).await;
    let run_tag = &options.table_name["outbox-".len()..];
    let topics: Vec<String> = (0..2)
        .map(|i| format!("harness-{}-{run_tag}-{i}", s.name))
        .collect();
    let kafka_proxy = match &s.fault {
        Fault::KafkaProxy => Some(broker::ProxiedBroker::start().await?),
        _ => None,
    };
    let bootstrap = kafka_proxy.as_ref().map(|b| b.bootstrap());
    for t in &topics {
        create_topic(bootstrap.as_deref(), t, 3)?;
    }
    let keys: Vec<(String, String)> = pick_keys(s.bucket_count, s.load.keys_per_bucket)
        .into_iter()
        .enumerate()
        .map(|(i, (k, _))| (k, topics[i % topics.len()].clone()))
        .collect();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone())
        .map_err(|e| format!("writer: {e}"))?;

    let mut fleet = Fleet::new(
        &config.outboxctl,
        &dir,
        &options.table_name,
        s.bucket_count,
        &format!("{}-{run_tag}", s.name),
    );
    let proxy = start_dynamodb_proxy(s, seed, &mut fleet).await?;
    fleet.kafka_bootstrap = bootstrap.clone();
    fleet.extra_env = s
        .relay_env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(Setup {
        proxy,
        inject_dynamodb_faults: s.fault.proxy_mix().is_some(),
        fleet,
        writer,
        keys,
        bootstrap,
        kafka_proxy,
        topics,
        options,
        client,
        dir,
    })
}

/// Every relay reaches DynamoDB through the proxy, which counts the refused conditions
/// at the wire; it injects faults only in scenario 5, and only while the writers run.
async fn start_dynamodb_proxy(
    s: &Scenario,
    seed: u64,
    fleet: &mut Fleet,
) -> Result<proxy::HttpFaultProxy, String> {
    let endpoint = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").unwrap_or_default();
    let upstream: std::net::SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| format!("AWS_ENDPOINT_URL_DYNAMODB {endpoint:?}: {e}"))?;
    let mix = s.fault.proxy_mix().unwrap_or_default();
    let p = proxy::HttpFaultProxy::start(upstream, mix, seed)
        .await
        .map_err(|e| format!("starting the DynamoDB proxy: {e}"))?;
    p.set_enabled(false);
    fleet.dynamodb_endpoint = Some(p.url());
    Ok(p)
}

/// The writers start once the fleet has settled: every relay with the system clock owns
/// a bucket (when there are buckets enough for every relay: no join is still under way),
/// every bucket owned, no ownership change for one and a half renew intervals.
async fn settle(fleet: &mut Fleet, s: &Scenario, dir: &Path) -> Result<(), String> {
    if s.relays.len() <= s.bucket_count as usize {
        let settle_by = tokio::time::Instant::now() + Duration::from_secs(20);
        for (i, offset) in s.relays.iter().enumerate() {
            let left = settle_by.saturating_duration_since(tokio::time::Instant::now());
            if offset.is_none() {
                fleet.wait_joined(i, SETTLE_QUIET, left).await;
            }
        }
    }
    if !fleet
        .wait_settled(SETTLE_QUIET, Duration::from_secs(20))
        .await
    {
        let alive = fleet.alive().len();
        return Err(format!(
            "{}: the fleet did not settle (every bucket owned, 1.5 s without a change) within 20 s ({alive} alive); logs in {}",
            s.name,
            dir.display()
        ));
    }
    Ok(())
}

/// Writers run while the fault is injected; then they stop.
async fn write_while_faulted(
    config: &Config,
    s: &Scenario,
    seed: u64,
    setup: &mut Setup,
) -> Result<Written, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let writes_started_us = now_us();
    let keys = std::mem::take(&mut setup.keys);
    let writer = setup.writer.clone();
    let writers = tokio::spawn(write(writer, keys, s.load, stop.clone(), acks.clone()));
    if setup.inject_dynamodb_faults {
        setup.proxy.set_enabled(true);
    }
    let writes_for = config.profile.writes_for();
    let mut injector = Injector {
        fleet: &mut setup.fleet,
        outboxctl: &config.outboxctl,
        writes_until: tokio::time::Instant::now() + writes_for,
        rng: rand::rngs::StdRng::seed_from_u64(seed),
    };
    let injected = injector
        .inject(&s.fault, s.relays.len(), setup.kafka_proxy.as_ref())
        .await?;
    stop.store(true, Ordering::SeqCst);
    let failed_enqueues = writers.await.unwrap_or(0);
    let write_seconds = (now_us() - writes_started_us) as f64 / 1e6;
    Ok(Written {
        acks,
        failed_enqueues,
        writes_started_us,
        write_seconds,
        injected,
    })
}

/// What every fault injection works with: the fleet, the fault schedule's random numbers
/// (seeded: a seed reproduces the schedule), and when the writes end.
struct Injector<'a> {
    fleet: &'a mut Fleet,
    outboxctl: &'a Path,
    rng: rand::rngs::StdRng,
    writes_until: tokio::time::Instant,
}

impl Injector<'_> {
    /// Injects `fault` until the writes' time is up.
    async fn inject(
        &mut self,
        fault: &Fault,
        initial_relays: usize,
        kafka_proxy: Option<&broker::ProxiedBroker>,
    ) -> Result<Injected, String> {
        match fault {
            Fault::None | Fault::DynamoProxy(_) => {
                self.until_the_end().await;
                Ok(Injected::default())
            }
            Fault::Kill9 => self.inject_kill9().await,
            Fault::Stall { stop_for, every } => Ok(self.inject_stalls(*stop_for, *every).await),
            Fault::Rolling { every, settle } => self.inject_rolling(*every, *settle).await,
            Fault::KafkaProxy => {
                let proxy = &kafka_proxy.expect("started above").proxy;
                Ok(self.inject_kafka_faults(proxy).await)
            }
            Fault::Stops { .. } => self.inject_stops().await,
            Fault::Churn { kill, .. } => self.inject_churn(*kill).await,
            Fault::RestartOne { after, index } => {
                self.restart_one(*after, *index, initial_relays).await
            }
        }
    }

    fn start(&mut self, offset: Option<&str>) -> Result<usize, String> {
        start_relay(self.fleet, self.outboxctl, offset, None)
    }

    /// Starts a relay with the system clock and waits until it owns a bucket.
    async fn start_joined(&mut self) -> Result<usize, String> {
        let new = self.start(None)?;
        self.joined(new).await;
        Ok(new)
    }

    async fn joined(&mut self, i: usize) {
        self.fleet.wait_joined(i, SETTLE_QUIET, SETTLE_BOUND).await;
    }

    async fn settled(&mut self) {
        self.fleet.wait_settled(SETTLE_QUIET, SETTLE_BOUND).await;
    }

    async fn until_the_end(&self) {
        tokio::time::sleep_until(self.writes_until).await;
    }

    /// `false` (once the writes' time is up) when `next` would end past it.
    async fn time_for(&self, next: Duration) -> bool {
        if tokio::time::Instant::now() + next >= self.writes_until {
            self.until_the_end().await;
            return false;
        }
        true
    }

    /// [`Fault::Kill9`].
    async fn inject_kill9(&mut self) -> Result<Injected, String> {
        let mut faults = 0;
        loop {
            let pause = Duration::from_millis(self.rng.gen_range(1500..3000));
            if !self.time_for(pause).await {
                return Ok(Injected::faults(faults));
            }
            tokio::time::sleep(pause).await;
            let alive = self.fleet.alive();
            if let Some(&victim) = alive.get(self.rng.gen_range(0..alive.len().max(1))) {
                if self.fleet.kill9(victim) {
                    faults += 1;
                }
                tokio::time::sleep(Duration::from_millis(self.rng.gen_range(0..1000))).await;
                self.start(None)?;
            }
        }
    }

    /// [`Fault::Stall`].
    async fn inject_stalls(&mut self, stop_for: Duration, every: Duration) -> Injected {
        let mut faults = 0;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        while tokio::time::Instant::now() + stop_for < self.writes_until {
            let owners = self.fleet.current_owners();
            let alive = self.fleet.alive();
            // A relay that owns buckets, chosen at random among those.
            let owning: Vec<usize> = alive
                .iter()
                .copied()
                .filter(|&i| {
                    owners
                        .values()
                        .any(|o| o.contains(&self.fleet.relays[i].id))
                })
                .collect();
            // No owner (by the logs) injects nothing: the scenario then misses
            // "its fault was never injected" rather than passing unfaulted.
            let Some(&victim) = owning.get(self.rng.gen_range(0..owning.len().max(1))) else {
                break;
            };
            if self.fleet.pause(victim) {
                faults += 1;
            }
            tokio::time::sleep(stop_for).await;
            self.fleet.resume(victim);
            let next = tokio::time::Instant::now() + every;
            tokio::time::sleep_until(next.min(self.writes_until)).await;
        }
        self.until_the_end().await;
        Injected::faults(faults)
    }

    /// [`Fault::Rolling`].
    async fn inject_rolling(&mut self, every: Duration, settle: bool) -> Result<Injected, String> {
        let mut faults = 0;
        let cycle = if settle {
            Duration::from_secs(3)
        } else {
            every
        };
        while self.time_for(cycle).await {
            tokio::time::sleep(every).await;
            let alive = self.fleet.alive();
            if let Some(&oldest) = alive.first() {
                self.fleet.terminate(&[oldest]).await;
                faults += 1; // alive() just now: a running relay was stopped
                if settle {
                    self.settled().await;
                }
                let new = self.start(None)?;
                if settle {
                    self.joined(new).await;
                }
            }
        }
        Ok(Injected::faults(faults))
    }

    /// [`Fault::KafkaProxy`].
    async fn inject_kafka_faults(&mut self, proxy: &broker::TcpFaultProxy) -> Injected {
        let mut faults = 0;
        loop {
            let pause = Duration::from_millis(self.rng.gen_range(1500..3000));
            if !self.time_for(pause).await {
                break;
            }
            tokio::time::sleep(pause).await;
            faults += 1;
            match self.rng.gen_range(0..3) {
                0 => proxy.cut(),
                1 => {
                    proxy.stall();
                    self.sleep_ms(1000..4000).await;
                    proxy.pass();
                }
                _ => {
                    proxy.refuse();
                    self.sleep_ms(1000..3000).await;
                    proxy.pass();
                }
            }
        }
        proxy.pass();
        Injected::faults(faults)
    }

    /// Sleeps a random number of milliseconds in `range`.
    async fn sleep_ms(&mut self, range: std::ops::Range<u64>) {
        tokio::time::sleep(Duration::from_millis(self.rng.gen_range(range))).await;
    }

    /// Relays running without a deadline, oldest first.
    fn signalled(&mut self) -> Vec<usize> {
        self.fleet
            .alive()
            .into_iter()
            .filter(|&i| self.fleet.relays[i].run_for.is_none())
            .collect()
    }

    /// [`Fault::Stops`]: every pattern once, then on until the writes' time is up.
    async fn inject_stops(&mut self) -> Result<Injected, String> {
        let mut graceful_stops = 0;
        let mut pattern = 0usize;
        while pattern < 3 || tokio::time::Instant::now() < self.writes_until {
            self.sleep_ms(0..500).await;
            let alive = self.signalled();
            graceful_stops += match pattern % 3 {
                0 => self.stop_one_after_another(&alive).await?,
                1 => self.stop_two_at_once(&alive).await?,
                _ => self.stop_by_deadline_and_signal().await?,
            };
            pattern += 1;
        }
        Ok(Injected {
            faults: graceful_stops,
            graceful_stops,
        })
    }

    /// One stop after another; the graceful stops.
    async fn stop_one_after_another(&mut self, alive: &[usize]) -> Result<usize, String> {
        let Some(&oldest) = alive.first() else {
            return Ok(0);
        };
        self.fleet.terminate(&[oldest]).await;
        self.settled().await;
        self.start_joined().await?;
        Ok(1)
    }

    /// Two overlapping stops: SIGTERM to both at once; the graceful stops.
    async fn stop_two_at_once(&mut self, alive: &[usize]) -> Result<usize, String> {
        if alive.len() < 2 {
            return Ok(0);
        }
        self.fleet.terminate(&alive[..2]).await;
        self.settled().await;
        for _ in 0..2 {
            self.start_joined().await?;
        }
        Ok(2)
    }

    /// A deadline stop (announced in the heartbeats, so every peer re-reads at once)
    /// overlapping a SIGTERM to the oldest relay; the graceful stops.
    async fn stop_by_deadline_and_signal(&mut self) -> Result<usize, String> {
        let run_for = Duration::from_secs(9);
        let started_at = tokio::time::Instant::now();
        let deadline_run = start_relay(self.fleet, self.outboxctl, None, Some(run_for))?;
        self.joined(deadline_run).await;
        let stops_working = started_at + run_for - fleet::STOP_RESERVE;
        let jitter = self.rng.gen_range(0..600);
        tokio::time::sleep_until(
            stops_working - Duration::from_millis(300) + Duration::from_millis(jitter),
        )
        .await;
        let mut leavers = vec![deadline_run];
        leavers.extend(self.signalled().first());
        self.fleet.terminate(&leavers).await;
        self.settled().await;
        if leavers.len() == 2 {
            self.start_joined().await?;
        }
        Ok(leavers.len())
    }

    /// [`Fault::Churn`]: at least a join and a leave, then on until the writes' time is up.
    async fn inject_churn(&mut self, kill: bool) -> Result<Injected, String> {
        let mut injected = Injected::default();
        let mut step = 0usize;
        while step < 2 || tokio::time::Instant::now() < self.writes_until {
            self.sleep_ms(1000..2500).await;
            let alive = self.fleet.alive();
            // 0 join, 1 graceful leave, 2 kill -9.
            let actions = if kill { 3 } else { 2 };
            let action = match (step, alive.len()) {
                (_, 0 | 1) | (0, _) => 0,
                (1, _) => 1,
                (_, n) if n >= 4 => self.rng.gen_range(1..actions),
                _ => self.rng.gen_range(0..actions),
            };
            if action == 0 {
                self.start_joined().await?;
            } else {
                let victim = alive[self.rng.gen_range(0..alive.len())];
                if action == 1 {
                    self.fleet.terminate(&[victim]).await;
                    injected.graceful_stops += 1;
                    injected.faults += 1;
                } else if self.fleet.kill9(victim) {
                    injected.faults += 1;
                }
            }
            self.settled().await;
            step += 1;
        }
        Ok(injected)
    }

    /// [`Fault::RestartOne`]: a graceful restart of initial relay `index` (of
    /// `initial_relays`) after `after`.
    async fn restart_one(
        &mut self,
        after: Duration,
        index: usize,
        initial_relays: usize,
    ) -> Result<Injected, String> {
        let mut faults = 0;
        tokio::time::sleep(after).await;
        if index < initial_relays {
            // The initial relays are the first started: relay `index` is `index`.
            let i = index;
            let offset = self.fleet.relays[i].clock_offset.clone();
            let was_running = self.fleet.alive().contains(&i);
            self.fleet.terminate(&[i]).await;
            if was_running {
                faults += 1;
            }
            self.start(offset.as_deref())?;
        }
        self.until_the_end().await;
        Ok(Injected::faults(faults))
    }
}

/// The final drain with a healthy relay, the stop of every relay, the read of every topic
/// from offset 0, and the checks.
async fn finish(
    config: &Config,
    s: &Scenario,
    mut setup: Setup,
    written: Written,
    started: tokio::time::Instant,
) -> Result<Outcome, String> {
    let Written {
        acks,
        failed_enqueues,
        writes_started_us,
        write_seconds,
        injected,
    } = written;
    setup.proxy.set_enabled(false);
    let (proxy_faults, proxy_stats) = fault_proxy_stats(&setup);
    let faults = injected.faults + proxy_faults;
    let left_in_table = drain(config, s, &mut setup).await?;
    let window_end = now_us();
    // Large values take memory in DynamoDB Local (in memory, shared by the whole test
    // run) until their items are deleted; whatever is left goes with the table.
    if s.load.value_bytes > 0 {
        let _ = setup
            .client
            .delete_table()
            .table_name(&setup.options.table_name)
            .send()
            .await;
    }
    let deliveries = read_topics(
        &setup.topics,
        setup.bootstrap.as_deref(),
        s.load.value_bytes,
    )?;
    let acks = std::mem::take(&mut *acks.lock().unwrap_or_else(|e| e.into_inner()));
    let fleet = &mut setup.fleet;
    let history = History {
        bucket_count: s.bucket_count,
        acks,
        failed_enqueues,
        deliveries,
        relays: fleet.histories(),
        left_in_table,
        window_us: (writes_started_us, window_end),
        value_bytes: (s.load.value_bytes > 0).then_some(s.load.value_bytes),
    };
    let dir = &setup.dir;
    save_history(dir, &history);
    let figures = check::check(&history);
    let stats = &setup.proxy.stats;
    let outcome = Outcome {
        name: s.name.into(),
        number: s.number.into(),
        meaning: s.meaning.into(),
        targets: s.targets,
        figures,
        relays_started: fleet.relays.len(),
        faults,
        fault_expected: s.fault != Fault::None,
        unclean_stops: fleet.relays.iter().filter(|r| r.unclean_stop).count(),
        graceful_stops: injected.graceful_stops,
        unreleased_stops: fleet.unreleased_stops(),
        held_stop_releases: stats.held_stop_releases.load(Ordering::Relaxed),
        holds_releases: matches!(s.fault, Fault::Stops { .. }),
        summary_refused: fleet.summary_refused(),
        wire_refused: stats.condition_refused.load(Ordering::Relaxed),
        refusal_disagreements: fleet.refusal_disagreements(),
        write_seconds,
        seconds: started.elapsed().as_secs_f64(),
        relay_errors: fleet.errors().into_iter().take(5).collect(),
        proxy: proxy_stats,
        dir: dir.clone(),
    };
    let _ = std::fs::write(
        dir.join("outcome.json"),
        serde_json::to_string_pretty(&outcome).unwrap_or_default(),
    );
    fleet.kill_all();
    Ok(outcome)
}

/// The faults the DynamoDB proxy injected (when it injects any) and what the fault proxy
/// of the scenario did (the DynamoDB proxy's or the Kafka proxy's).
fn fault_proxy_stats(setup: &Setup) -> (usize, Option<serde_json::Value>) {
    if setup.inject_dynamodb_faults {
        let st = &setup.proxy.stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let faults = (load(&st.throttled)
            + load(&st.server_errors)
            + load(&st.dropped_responses)
            + load(&st.delayed)
            + load(&st.held_stop_releases)) as usize;
        (
            faults,
            Some(serde_json::to_value(&**st).unwrap_or_default()),
        )
    } else {
        let stats = setup
            .kafka_proxy
            .as_ref()
            .map(|b| serde_json::to_value(&*b.proxy.stats).unwrap_or_default());
        (0, stats)
    }
}

/// Drains the table with a healthy relay (started if none is left alive), up to the
/// profile's drain timeout, stops every relay gracefully; the message ids left.
async fn drain(config: &Config, s: &Scenario, setup: &mut Setup) -> Result<Vec<String>, String> {
    let fleet = &mut setup.fleet;
    for i in 0..fleet.relays.len() {
        fleet.resume(i);
    }
    let healthy = fleet
        .alive()
        .into_iter()
        .any(|i| fleet.relays[i].clock_offset.is_none());
    if !healthy {
        start_relay(fleet, &config.outboxctl, None, None)?;
    }
    let (client, options) = (&setup.client, &setup.options);
    let drain_until = tokio::time::Instant::now() + config.profile.drain_timeout();
    loop {
        let empty = left_message_ids(client, options)
            .await
            .is_ok_and(|ids| ids.is_empty());
        if empty || tokio::time::Instant::now() >= drain_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all = fleet.alive();
    fleet.terminate(&all).await;
    let mut left_in_table = left_message_ids(client, options).await;
    for _ in 0..3 {
        if left_in_table.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        left_in_table = left_message_ids(client, options).await;
    }
    left_in_table.map_err(|e| format!("{}: {e}", s.name))
}

/// Every topic read back from offset 0, in parallel.
fn read_topics(
    topics: &[String],
    bootstrap: Option<&str>,
    value_bytes: usize,
) -> Result<Vec<Delivery>, String> {
    let mut deliveries = Vec::new();
    let reads: Vec<Result<Vec<Delivery>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = topics
            .iter()
            .map(|t| scope.spawn(|| read_topic(bootstrap, t, value_bytes > 0)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("reader panicked".into())))
            .collect()
    });
    for r in reads {
        deliveries.extend(r?);
    }
    Ok(deliveries)
}

/// Runs scripts/kafka.py (the independent client) with the stack's python; its stdout.
pub fn kafka_py(args: &[&str]) -> Result<String, String> {
    outbox_testkit::try_stack_py("kafka.py", args)
}

fn create_topic(bootstrap: Option<&str>, topic: &str, partitions: u32) -> Result<(), String> {
    let partitions = partitions.to_string();
    let mut args = Vec::new();
    if let Some(b) = bootstrap {
        args.extend(["--bootstrap", b]);
    }
    args.extend(["create-topic", topic, "--partitions", &partitions]);
    kafka_py(&args).map(|_| ())
}

/// Message ids of the message items in the table: a consistent scan of the message
/// partitions that returns only the ids (whole 300 KB items would take DynamoDB Local
/// seconds to send, every 250 ms of the drain, and slow the relays down with it).
async fn left_message_ids(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
) -> Result<Vec<String>, String> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let prefix = dynamo_outbox::protocol::schema::Keys::new(options).messages_prefix();
    let id = dynamo_outbox::protocol::attr::MESSAGE_ID;
    let mut ids = Vec::new();
    let mut start = None;
    loop {
        let out = client
            .scan()
            .table_name(&options.table_name)
            .consistent_read(true)
            .filter_expression("begins_with(#pk, :prefix)")
            .projection_expression("#id")
            .expression_attribute_names("#pk", &options.partition_key_attribute)
            .expression_attribute_names("#id", id)
            .expression_attribute_values(":prefix", AttributeValue::S(prefix.clone()))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| format!("scanning {} for messages left: {e:?}", options.table_name))?;
        ids.extend(out.items().iter().map(|i| {
            i.get(id)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default()
        }));
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return Ok(ids),
        }
    }
}

/// Every record of a topic from offset 0, read by the independent client (kafka.py,
/// confluent-kafka), with its message-id header and timestamp; with `large`, the value's
/// length instead of the value (`--value-head`).
fn read_topic(bootstrap: Option<&str>, topic: &str, large: bool) -> Result<Vec<Delivery>, String> {
    let mut args = Vec::new();
    if let Some(b) = bootstrap {
        args.extend(["--bootstrap", b]);
    }
    args.extend(["read", topic, "--timeout", "60"]);
    if large {
        args.extend(["--value-head", "64"]);
    }
    let records = outbox_testkit::try_read_records(&args)?
        .into_iter()
        .map(|r| Delivery {
            topic: topic.to_string(),
            partition: r.partition,
            offset: r.offset,
            message_id: r.message_id(),
            timestamp_ms: r.timestamp,
            value_len: r.value_len,
        })
        .collect();
    Ok(records)
}

fn save_history(dir: &Path, h: &History) {
    let lines = |items: Vec<String>| items.join("\n") + "\n";
    let _ = std::fs::write(
        dir.join("enqueues.jsonl"),
        lines(
            h.acks
                .iter()
                .filter_map(|a| serde_json::to_string(a).ok())
                .collect(),
        ),
    );
    let _ = std::fs::write(
        dir.join("deliveries.jsonl"),
        lines(
            h.deliveries
                .iter()
                .filter_map(|d| serde_json::to_string(d).ok())
                .collect(),
        ),
    );
    let _ = std::fs::write(
        dir.join("ownership.json"),
        serde_json::to_string_pretty(&h.relays).unwrap_or_default(),
    );
}

/// The figures as a Markdown table.
pub fn markdown_table(outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "| # | Scenario | Relays started / faults | Acked | Lost | Duplicates (rate, max copies) | Order inversions | Never drained | Refused writes by kind | Longest unowned with pending | Overlapping ownership (count, longest) | Ack→first delivery p50 / p99 / max | Writes / whole scenario | Targets |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for o in outcomes {
        let f = &o.figures;
        let refused = if f.refused.values().all(|v| *v == 0) {
            format!("0 (wire {})", o.wire_refused)
        } else {
            f.refused
                .iter()
                .filter(|(_, v)| **v > 0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
                + &format!(
                    " ({} after startup; wire {})",
                    f.refused_during_writes, o.wire_refused
                )
        };
        let missed = o.missed();
        s.push_str(&format!(
            "| {} | {} | {} / {} | {} | {} | {} ({:.2}%, {}) | {} | {} | {} | {:.0} ms | {} ({:.0} ms){} | {:.0} / {:.0} / {:.0} ms | {:.0} s / {:.0} s | {} |\n",
            o.number,
            o.name,
            o.relays_started,
            o.faults,
            f.acked,
            f.lost,
            f.duplicates,
            f.duplicate_rate * 100.0,
            f.max_copies,
            f.order_inversions,
            f.never_drained,
            refused,
            f.max_unowned_pending_ms,
            f.overlaps,
            f.overlap_max_ms,
            if f.release_log_overlaps > 0 {
                format!(
                    "; {} at a release ({:.0} ms)",
                    f.release_log_overlaps, f.release_log_overlap_max_ms
                )
            } else {
                String::new()
            },
            f.latency_p50_ms,
            f.latency_p99_ms,
            f.latency_max_ms,
            o.write_seconds,
            o.seconds,
            if missed.is_empty() { "met".to_string() } else { format!("**missed**: {}", missed.join("; ")) },
        ));
    }
    s
}
