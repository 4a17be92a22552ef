//! A Jepsen-style fault-injection harness for the outbox, on the local stack
//! (DynamoDB Local and tansu, started by `scripts/stack.sh`).
//!
//! Each scenario creates a fresh table and two topics, starts `outboxctl relay`
//! processes, runs writers that enqueue continuously (each value carries its key and a
//! per-key counter; every acknowledged enqueue is logged with its message id, bucket and
//! sequence), injects its fault into the relay processes, then stops the writers, drains
//! the table with a healthy relay, stops every relay gracefully and reads every topic from
//! offset 0 with the independent client (`scripts/kafka.py`). The checker
//! ([`check::check`]) turns that history into the figures; [`Outcome::missed`] compares
//! them with the targets of issue 6.
//!
//! # Layout
//! - [`check`]: the history and the checker (pure).
//! - [`fleet`]: relay processes, faults (SIGKILL, SIGSTOP/SIGCONT, SIGTERM), log parsing.
//! - [`proxy`]: the fault-injecting HTTP proxy in front of DynamoDB Local.
//! - [`broker`]: a private tansu behind a fault-injecting TCP proxy (cut, stall, refuse).
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
    /// A few seconds of writes per scenario: the test suite's run (about 3 minutes).
    Short,
    /// About a minute of writes per scenario, more faults: the documented figures.
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
    /// The relays reach a private broker through [`broker::TcpFaultProxy`], which every 1.5
    /// to 3 s cuts every connection, stalls them for 1 to 4 s, or refuses connections for
    /// 1 to 3 s.
    KafkaProxy,
    /// After `after`, a graceful restart of relay `index` (among the initial relays).
    RestartOne {
        /// When.
        after: Duration,
        /// Which initial relay.
        index: usize,
    },
}

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
    /// Issue 6's number of the fault.
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
            }),
            targets: MEASURED_REFUSALS,
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
    /// Issue 6's fault number.
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
        if self.fault_expected && self.faults == 0 {
            m.push("its fault was never injected".to_string());
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

/// Writers: one task per key, enqueuing one message at a time until `stop`.
async fn write(
    writer: DynamoDbOutboxWriter,
    keys: Vec<(String, String)>,
    pace: Duration,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
) -> u64 {
    let tasks = keys.into_iter().map(|(key, topic)| {
        let writer = writer.clone();
        let stop = stop.clone();
        let acks = acks.clone();
        tokio::spawn(async move {
            let mut failed = 0u64;
            let mut counter = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let value = serde_json::json!({ "key": key, "counter": counter }).to_string();
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
                tokio::time::sleep(pace).await;
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

async fn run_scenario(config: &Config, s: &Scenario, seed: u64) -> Result<Outcome, String> {
    let started = tokio::time::Instant::now();
    let dir = config.out_dir.join(s.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let client = outbox_integration_tests::dynamodb().await;
    let options = outbox_integration_tests::fresh_table(&client, s.bucket_count).await;
    let run_tag = &options.table_name["outbox-".len()..];
    let topics: Vec<String> = (0..2)
        .map(|i| format!("harness-{}-{run_tag}-{i}", s.name))
        .collect();
    let private_broker = match &s.fault {
        Fault::KafkaProxy => Some(broker::ProxiedBroker::start(&dir.join("tansu.log")).await?),
        _ => None,
    };
    let bootstrap = private_broker.as_ref().map(|b| b.bootstrap());
    for t in &topics {
        create_topic(bootstrap.as_deref(), t, 3)?;
    }
    let keys: Vec<(String, String)> = pick_keys(s.bucket_count, 2)
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
    // Every relay reaches DynamoDB through the proxy, which counts the refused conditions
    // at the wire; it injects faults only in scenario 5, and only while the writers run.
    let proxy = {
        let endpoint = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").unwrap_or_default();
        let upstream: std::net::SocketAddr = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .map_err(|e| format!("AWS_ENDPOINT_URL_DYNAMODB {endpoint:?}: {e}"))?;
        let mix = match &s.fault {
            Fault::DynamoProxy(mix) => *mix,
            _ => proxy::FaultMix::default(),
        };
        let p = proxy::HttpFaultProxy::start(upstream, mix, seed)
            .await
            .map_err(|e| format!("starting the DynamoDB proxy: {e}"))?;
        p.set_enabled(false);
        fleet.dynamodb_endpoint = Some(p.url());
        p
    };
    let inject_dynamodb_faults = matches!(s.fault, Fault::DynamoProxy(_));
    fleet.kafka_bootstrap = bootstrap.clone();
    let start = |fleet: &mut Fleet, offset: Option<&str>| {
        fleet
            .start(offset)
            .map_err(|e| format!("starting {}: {e}", config.outboxctl.display()))
    };
    for (i, offset) in s.relays.iter().enumerate() {
        if i > 0 && !s.stagger.is_zero() {
            tokio::time::sleep(s.stagger).await;
        }
        start(&mut fleet, *offset)?;
    }
    // The writers start once the fleet has settled: every bucket owned, no ownership change
    // for one and a half renew intervals.
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

    // Writers run while the fault is injected.
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let writes_started_us = now_us();
    let writers = tokio::spawn(write(
        writer,
        keys,
        Duration::from_millis(60),
        stop.clone(),
        acks.clone(),
    ));
    if inject_dynamodb_faults {
        proxy.set_enabled(true);
    }
    let writes_for = config.profile.writes_for();
    let writes_until = tokio::time::Instant::now() + writes_for;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut faults = 0;
    let mut initial: Vec<usize> = (0..s.relays.len()).collect();
    match &s.fault {
        Fault::None | Fault::DynamoProxy(_) => tokio::time::sleep_until(writes_until).await,
        Fault::Kill9 => loop {
            let pause = Duration::from_millis(rng.gen_range(1500..3000));
            if tokio::time::Instant::now() + pause >= writes_until {
                tokio::time::sleep_until(writes_until).await;
                break;
            }
            tokio::time::sleep(pause).await;
            let alive = fleet.alive();
            if let Some(&victim) = alive.get(rng.gen_range(0..alive.len().max(1))) {
                if fleet.kill9(victim) {
                    faults += 1;
                }
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..1000))).await;
                start(&mut fleet, None)?;
            }
        },
        Fault::Stall { stop_for, every } => {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            while tokio::time::Instant::now() + *stop_for < writes_until {
                let owners = fleet.current_owners();
                let alive = fleet.alive();
                // A relay that owns buckets, chosen at random among those.
                let owning: Vec<usize> = alive
                    .iter()
                    .copied()
                    .filter(|&i| owners.values().any(|o| o.contains(&fleet.relays[i].id)))
                    .collect();
                // No owner (by the logs) injects nothing: the scenario then misses
                // "its fault was never injected" rather than passing unfaulted.
                let Some(&victim) = owning.get(rng.gen_range(0..owning.len().max(1))) else {
                    break;
                };
                if fleet.pause(victim) {
                    faults += 1;
                }
                tokio::time::sleep(*stop_for).await;
                fleet.resume(victim);
                let next = tokio::time::Instant::now() + *every;
                tokio::time::sleep_until(next.min(writes_until)).await;
            }
            tokio::time::sleep_until(writes_until).await;
        }
        Fault::Rolling { every, settle } => loop {
            let quiet = SETTLE_QUIET;
            let bound = Duration::from_secs(10);
            let cycle = if *settle {
                Duration::from_secs(3)
            } else {
                *every
            };
            if tokio::time::Instant::now() + cycle >= writes_until {
                tokio::time::sleep_until(writes_until).await;
                break;
            }
            tokio::time::sleep(*every).await;
            let alive = fleet.alive();
            if let Some(&oldest) = alive.first() {
                fleet.terminate(&[oldest]).await;
                faults += 1; // alive() just now: a running relay was stopped
                if *settle {
                    fleet.wait_settled(quiet, bound).await;
                }
                start(&mut fleet, None)?;
                if *settle {
                    fleet.wait_settled(quiet, bound).await;
                }
            }
        },
        Fault::KafkaProxy => {
            let proxy = &private_broker.as_ref().expect("started above").proxy;
            loop {
                let pause = Duration::from_millis(rng.gen_range(1500..3000));
                if tokio::time::Instant::now() + pause >= writes_until {
                    tokio::time::sleep_until(writes_until).await;
                    break;
                }
                tokio::time::sleep(pause).await;
                faults += 1;
                match rng.gen_range(0..3) {
                    0 => proxy.cut(),
                    1 => {
                        proxy.stall();
                        tokio::time::sleep(Duration::from_millis(rng.gen_range(1000..4000))).await;
                        proxy.pass();
                    }
                    _ => {
                        proxy.refuse();
                        tokio::time::sleep(Duration::from_millis(rng.gen_range(1000..3000))).await;
                        proxy.pass();
                    }
                }
            }
            proxy.pass();
        }
        Fault::RestartOne { after, index } => {
            tokio::time::sleep(*after).await;
            if let Some(&i) = initial.get(*index) {
                let offset = fleet.relays[i].clock_offset.clone();
                let was_running = fleet.alive().contains(&i);
                fleet.terminate(&[i]).await;
                if was_running {
                    faults += 1;
                }
                let new = start(&mut fleet, offset.as_deref())?;
                initial[*index] = new;
            }
            tokio::time::sleep_until(writes_until).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let failed_enqueues = writers.await.unwrap_or(0);
    let write_seconds = (now_us() - writes_started_us) as f64 / 1e6;

    // Final drain with a healthy relay.
    proxy.set_enabled(false);
    let proxy_stats = if inject_dynamodb_faults {
        let st = &proxy.stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        faults += (load(&st.throttled)
            + load(&st.server_errors)
            + load(&st.dropped_responses)
            + load(&st.delayed)) as usize;
        Some(serde_json::to_value(&*proxy.stats).unwrap_or_default())
    } else {
        private_broker
            .as_ref()
            .map(|b| serde_json::to_value(&*b.proxy.stats).unwrap_or_default())
    };
    for i in 0..fleet.relays.len() {
        fleet.resume(i);
    }
    let healthy = fleet
        .alive()
        .into_iter()
        .any(|i| fleet.relays[i].clock_offset.is_none());
    if !healthy {
        start(&mut fleet, None)?;
    }
    let drain_until = tokio::time::Instant::now() + config.profile.drain_timeout();
    loop {
        let left = outbox_integration_tests::pending_messages(&client, &options).await;
        if left == 0 || tokio::time::Instant::now() >= drain_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all = fleet.alive();
    fleet.terminate(&all).await;
    let left_in_table = left_message_ids(&client, &options).await;
    let window_end = now_us();

    // Read every topic back from offset 0.
    let mut deliveries = Vec::new();
    let reads: Vec<Result<Vec<Delivery>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = topics
            .iter()
            .map(|t| scope.spawn(|| read_topic(bootstrap.as_deref(), t)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("reader panicked".into())))
            .collect()
    });
    for r in reads {
        deliveries.extend(r?);
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap_or_else(|e| e.into_inner()));
    let history = History {
        bucket_count: s.bucket_count,
        acks,
        failed_enqueues,
        deliveries,
        relays: fleet.histories(),
        left_in_table,
        window_us: (writes_started_us, window_end),
    };
    save_history(&dir, &history);
    let figures = check::check(&history);
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
        summary_refused: fleet.summary_refused(),
        wire_refused: proxy.stats.condition_refused.load(Ordering::Relaxed),
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

/// Runs scripts/kafka.py (the independent client) with the stack's python; its stdout.
pub fn kafka_py(args: &[&str]) -> Result<String, String> {
    outbox_integration_tests::try_stack_py("kafka.py", args)
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

/// Message ids of the message items in the table.
async fn left_message_ids(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
) -> Vec<String> {
    let prefix = format!("{}#MESSAGES#", options.key_prefix);
    outbox_integration_tests::scan_all(client, &options.table_name)
        .await
        .iter()
        .filter(|i| {
            i.get(&options.partition_key_attribute)
                .and_then(|v| v.as_s().ok())
                .is_some_and(|pk| pk.starts_with(&prefix))
        })
        .map(|i| {
            i.get(dynamo_outbox::schema::attr::MESSAGE_ID)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// Every record of a topic from offset 0, read by the independent client (kafka.py,
/// confluent-kafka), with its message-id header and timestamp.
fn read_topic(bootstrap: Option<&str>, topic: &str) -> Result<Vec<Delivery>, String> {
    use base64::Engine;
    let mut args = Vec::new();
    if let Some(b) = bootstrap {
        args.extend(["--bootstrap", b]);
    }
    args.extend(["read", topic, "--timeout", "60"]);
    let out = kafka_py(&args)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut records = Vec::new();
    for line in out.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("kafka.py output {line:?}: {e}"))?;
        let message_id = v["headers"].as_array().and_then(|hs| {
            hs.iter().find_map(|h| {
                (h[0].as_str() == Some("x-outbox-message-id"))
                    .then(|| h[1].as_str())
                    .flatten()
                    .and_then(|b| b64.decode(b).ok())
                    .and_then(|b| String::from_utf8(b).ok())
            })
        });
        records.push(Delivery {
            topic: topic.to_string(),
            partition: v["partition"].as_i64().unwrap_or(-1) as i32,
            offset: v["offset"].as_i64().unwrap_or(-1),
            message_id,
            timestamp_ms: v["timestamp"].as_i64(),
        });
    }
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
        "| # | Scenario | Relays started / faults | Acked | Lost | Duplicates (rate, max copies) | Order inversions | Never drained | Refused writes by kind | Longest unowned with pending | Overlapping ownership (count, longest) | Ack→first delivery p50 / p99 / max | Targets |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
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
            "| {} | {} | {} / {} | {} | {} | {} ({:.2}%, {}) | {} | {} | {} | {:.0} ms | {} ({:.0} ms){} | {:.0} / {:.0} / {:.0} ms | {} |\n",
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
            if missed.is_empty() { "met".to_string() } else { format!("**missed**: {}", missed.join("; ")) },
        ));
    }
    s
}
