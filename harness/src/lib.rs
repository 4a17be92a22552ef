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
//! Scenario 19 runs one chaos (kills, a stall past the lease, a broker restart, late
//! commits behind holes) once per delivery mode; in exactly-once mode the topics are read
//! as a `read_committed` consumer reads them, and [`delivery_table`] shows both runs side
//! by side. Scenario 20 restores the table from a snapshot mid-run
//! ([`Fault::Restore`], [`check::check_restore`]).
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::publish::Delivery;
use dynamo_outbox::{DynamoDbOutboxWriter, OutboxMessage};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use check::{Ack, Figures, History};
use fleet::{now_us, Fleet};
use outbox_testkit::kafka::PrivateKafka;

/// How long each scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Profile {
    /// A few seconds of writes per scenario: the test suite's run (about 6 minutes).
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
    /// The chaos of scenario 19, on a broker of the scenario's own
    /// ([`outbox_testkit::kafka::PrivateKafka`]): a relay killed with SIGKILL every 1 to
    /// 2 s and replaced 0 to 0.5 s later, all along; once (after 1 s), a relay that owns
    /// buckets stopped (SIGSTOP) for `stop_for`, past its lease, then resumed (SIGCONT);
    /// then (0.5 s after the resume) the broker killed with SIGKILL and started again on
    /// its data, the kills going on meanwhile. The writes go on for half the profile's
    /// time after the broker answers again (at least the profile's time in all). The
    /// schedule goes to `faults.log` in the scenario's directory.
    Chaos {
        /// How long the stalled relay stays stopped.
        stop_for: Duration,
    },
    /// A table restored from a backup (scenario 20). DynamoDB Local has no backups, so:
    /// after `snapshot_after`, every item of the table is read (a consistent scan while the
    /// writers and relays go on, the sequence counters read again last, so that no counter
    /// is below a message it holds: a point-in-time backup's consistency for what the
    /// check needs). The writers of the odd buckets stop just before it and stay quiet
    /// until the restore, so that their buckets' last transactions, which the watermarks
    /// list at the restore, are likely to have published messages of the snapshot; the
    /// even buckets' writers go on. After `restore_after`, the application stops writing (a table being
    /// restored in place does not exist for a while), the relays stop gracefully, the
    /// committed records of the topics and each bucket's watermark are read, the table is
    /// deleted, created again under its name (so under the same ARN) and the snapshot put
    /// back, counters, leases and heartbeats included; then the relays start again and
    /// the writers resume for `writes_after`.
    Restore {
        /// When the snapshot is taken, from the writes' start.
        snapshot_after: Duration,
        /// When the restore begins, from the writes' start.
        restore_after: Duration,
        /// Writes after the restore.
        writes_after: Duration,
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
    /// The second key of each bucket commits late: each of its messages reserves its
    /// sequence number (the counter's `ADD`, `transact_write_item`), waits a random time
    /// in this range (milliseconds), then commits its item with a business write in a
    /// `TransactWriteItems` of its own (docs/protocol.md, section 1.3). Meanwhile its number
    /// is a hole the relays step over.
    pub late_commit_ms: Option<(u64, u64)>,
}

/// Two keys per bucket, one enqueue every 60 ms per key, small values.
const SMALL_VALUES: Load = Load {
    keys_per_bucket: 2,
    pace: Duration::from_millis(60),
    value_bytes: 0,
    burst: 0,
    late_commit_ms: None,
};

/// [`SMALL_VALUES`] with the second key of each bucket committing 100 to 600 ms after its
/// reservation.
const LATE_COMMITS: Load = Load {
    late_commit_ms: Some((100, 600)),
    ..SMALL_VALUES
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
    /// No acknowledged message read twice (exactly-once delivery, read committed).
    pub zero_duplicates: bool,
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
    /// How the relays deliver (`outboxctl relay --delivery`): in exactly-once mode the
    /// scenario creates its own watermark topic (`OUTBOX_WATERMARK_TOPIC`) and reads its
    /// topics as a `read_committed` consumer (and a `read_uncommitted` one, for the count
    /// of aborted copies).
    pub delivery: Delivery,
    /// Seconds of writes in the short profile, when not the profile's (the long profile
    /// always writes for its own time).
    pub short_writes: Option<Duration>,
}

impl Scenario {
    fn writes_for(&self, profile: Profile) -> Duration {
        match (profile, self.short_writes) {
            (Profile::Short, Some(d)) => d,
            _ => profile.writes_for(),
        }
    }
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
    zero_duplicates: false,
};
const MEASURED_REFUSALS: Targets = Targets {
    overlap_allowed: false,
    inversions_allowed: false,
    zero_refused: false,
    zero_duplicates: false,
};
const SPEC_ACCEPTS_OVERLAP: Targets = Targets {
    overlap_allowed: true,
    inversions_allowed: true,
    zero_refused: false,
    zero_duplicates: false,
};
/// The chaos of scenario 19 at least once: a stall past the lease makes overlapping
/// ownership (measured); no loss, per-key order kept.
const CHAOS_AT_LEAST_ONCE: Targets = Targets {
    overlap_allowed: true,
    inversions_allowed: false,
    zero_refused: false,
    zero_duplicates: false,
};
/// The same chaos exactly once: no duplicate either.
const CHAOS_EXACTLY_ONCE: Targets = Targets {
    zero_duplicates: true,
    ..CHAOS_AT_LEAST_ONCE
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
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
                late_commit_ms: None,
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
            delivery: Delivery::AtLeastOnce,
            short_writes: None,
        },
        chaos(Delivery::AtLeastOnce),
        chaos(Delivery::ExactlyOnce),
        Scenario {
            name: "restore-exactly-once",
            number: "20",
            meaning: "exactly once, the table restored from a backup under its name (same ARN): a snapshot of every item mid-run, later the relays stopped, the table deleted, created again and the snapshot put back, the relays started again; late commits behind holes",
            bucket_count: 8,
            relays: vec![None; 3],
            stagger: Duration::ZERO,
            fault: Fault::Restore {
                snapshot_after: Duration::from_secs(if long { 15 } else { 3 }),
                restore_after: Duration::from_secs(if long { 30 } else { 6 }),
                writes_after: Duration::from_secs(if long { 15 } else { 4 }),
            },
            targets: MEASURED_REFUSALS,
            load: LATE_COMMITS,
            relay_env: &[],
            delivery: Delivery::ExactlyOnce,
            short_writes: None,
        },
    ]
}

/// Scenario 19 in one delivery mode: the same chaos, the same load, the same seed's
/// schedule (each run has its own seed: the schedules differ by their random draws).
fn chaos(delivery: Delivery) -> Scenario {
    let exactly_once = delivery == Delivery::ExactlyOnce;
    Scenario {
        name: if exactly_once {
            "chaos-exactly-once"
        } else {
            "chaos-at-least-once"
        },
        number: "19",
        meaning: if exactly_once {
            "exactly once (`outboxctl relay --delivery exactly-once`), read committed: three relays, one killed with SIGKILL every 1-2 s and replaced, one stopped 4.5 s (past its 3 s lease) and resumed, the broker killed and restarted; writers commit late behind holes"
        } else {
            "the same chaos at least once (the default delivery): the duplicates exactly-once prevents"
        },
        bucket_count: 8,
        relays: vec![None; 3],
        stagger: Duration::ZERO,
        fault: Fault::Chaos {
            stop_for: Duration::from_millis(4500),
        },
        targets: if exactly_once {
            CHAOS_EXACTLY_ONCE
        } else {
            CHAOS_AT_LEAST_ONCE
        },
        load: LATE_COMMITS,
        relay_env: &[],
        delivery,
        short_writes: Some(Duration::from_secs(12)),
    }
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
    /// Of those, by operation (`UpdateItem`, `DeleteItem`, ...).
    pub wire_refused_by_operation: BTreeMap<String, u64>,
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
    /// How the relays delivered (`at-least-once`, `exactly-once`).
    pub delivery: String,
    /// The restore's figures ([`Fault::Restore`]).
    pub restore: Option<check::RestoreFigures>,
    /// Exactly once, from the relays' logs: buckets taken (a transactional producer
    /// initialised, fencing the previous one, then the watermark read), and batches whose
    /// every message a watermark covered (published in a committed transaction whose relay
    /// died, or lost the transaction's outcome, before its deletes: deleted without being
    /// sent again).
    pub exactly_once_log: Option<(usize, usize)>,
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
        if self.targets.zero_duplicates && f.duplicates > 0 {
            m.push(format!(
                "{} duplicates read committed (max {} copies of a message)",
                f.duplicates, f.max_copies
            ));
        }
        if let Some(r) = &self.restore {
            m.extend(r.missed());
            if f.max_copies > 2 {
                m.push(format!(
                    "a message read {} times: a restore replays it once at most",
                    f.max_copies
                ));
            }
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

/// One writer task's key: its topic, and whether it commits late ([`Load::late_commit_ms`]).
#[derive(Debug, Clone)]
struct WriterKey {
    key: String,
    topic: String,
    late: bool,
    /// Its bucket goes quiet from the snapshot to the restore ([`Fault::Restore`]).
    quiet: bool,
}

/// What the writer tasks share with the scenario: stop for good, or pause (a table being
/// restored), and how many enqueues are under way (a late commit counts from its
/// reservation to its commit).
#[derive(Debug, Default)]
struct WriteControl {
    stop: AtomicBool,
    paused: AtomicBool,
    in_flight: AtomicUsize,
    /// The quiet buckets' writers hold off too ([`WriterKey::quiet`]).
    quiet: AtomicBool,
    /// Enqueues of the quiet buckets' writers under way.
    quiet_in_flight: AtomicUsize,
}

impl WriteControl {
    /// Pauses the quiet buckets' writers and waits until none of their enqueues is under
    /// way.
    async fn quieten(&self) {
        self.quiet.store(true, Ordering::SeqCst);
        while self.quiet_in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Pauses the writers and waits until no enqueue is under way.
    async fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn resume(&self) {
        self.quiet.store(false, Ordering::SeqCst);
        self.paused.store(false, Ordering::SeqCst);
    }
}

/// Writers: one task per key, enqueuing one message at a time until `control.stop` (the
/// first `load.burst` of each key without a pause), holding off while paused. A late key
/// reserves, waits, then commits its message with a business write of its own.
async fn write(
    client: aws_sdk_dynamodb::Client,
    writer: DynamoDbOutboxWriter,
    keys: Vec<WriterKey>,
    load: Load,
    control: Arc<WriteControl>,
    acks: Arc<Mutex<Vec<Ack>>>,
    seed: u64,
) -> u64 {
    let pace = load.pace;
    let tasks = keys.into_iter().enumerate().map(|(i, wk)| {
        let writer = writer.clone();
        let client = client.clone();
        let control = control.clone();
        let acks = acks.clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(i as u64));
        tokio::spawn(async move {
            let WriterKey {
                key,
                topic,
                late,
                quiet,
            } = wk;
            let mut failed = 0u64;
            let mut counter = 0u64;
            let done_with = |control: &WriteControl| {
                control.in_flight.fetch_sub(1, Ordering::SeqCst);
                if quiet {
                    control.quiet_in_flight.fetch_sub(1, Ordering::SeqCst);
                }
            };
            while !control.stop.load(Ordering::SeqCst) {
                control.in_flight.fetch_add(1, Ordering::SeqCst);
                if quiet {
                    control.quiet_in_flight.fetch_add(1, Ordering::SeqCst);
                }
                if control.paused.load(Ordering::SeqCst)
                    || (quiet && control.quiet.load(Ordering::SeqCst))
                {
                    done_with(&control);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let value = value_of(&key, counter, load.value_bytes);
                let message = writer
                    .message(topic.clone())
                    .with_key(key.clone())
                    .with_value(value);
                let delay = match (late, load.late_commit_ms) {
                    (true, Some((lo, hi))) => Some(Duration::from_millis(rng.gen_range(lo..hi))),
                    _ => None,
                };
                let done = match delay {
                    None => writer
                        .enqueue(std::slice::from_ref(&message))
                        .await
                        .map(|done| {
                            done.into_iter()
                                .map(|e| (e.message_id.to_string(), e.bucket, e.sequence))
                                .collect::<Vec<_>>()
                        })
                        .map_err(|e| e.to_string()),
                    Some(delay) => commit_late(&client, &writer, &key, counter, &message, delay)
                        .await
                        .map(|one| vec![one]),
                };
                done_with(&control);
                match done {
                    Ok(done) => {
                        let at = now_us();
                        let mut acks = acks.lock().unwrap_or_else(|e| e.into_inner());
                        for (message_id, bucket, sequence) in done {
                            acks.push(Ack {
                                message_id,
                                key: key.clone(),
                                counter,
                                topic: topic.clone(),
                                bucket,
                                sequence,
                                acked_at_us: at,
                                late: delay.is_some(),
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

/// A late commit (docs/protocol.md, section 1.3; item-schema.md): reserves the message's
/// sequence number (the counter's `ADD`), waits `delay`, then commits the message with a
/// business write (the key's latest counter, in the application's own partition of the
/// table) in one `TransactWriteItems`. Its message id, bucket and sequence number.
async fn commit_late(
    client: &aws_sdk_dynamodb::Client,
    writer: &DynamoDbOutboxWriter,
    key: &str,
    counter: u64,
    message: &OutboxMessage,
    delay: Duration,
) -> Result<(String, u32, u64), String> {
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    let options = writer.options();
    let put = writer
        .transact_write_item(message)
        .await
        .map_err(|e| e.to_string())?;
    let stored = put
        .put()
        .ok_or("transact_write_item returned no Put")
        .and_then(|p| {
            dynamo_outbox::protocol::schema::parse_message(
                &dynamo_outbox::protocol::schema::Keys::new(options),
                p.item(),
            )
            .map_err(|_| "the Put's item is no message")
        })?;
    tokio::time::sleep(delay).await;
    let business = Put::builder()
        .table_name(&options.table_name)
        .item(
            &options.partition_key_attribute,
            AttributeValue::S(format!("harness-business#{key}")),
        )
        .item(
            &options.sort_key_attribute,
            AttributeValue::S("latest".into()),
        )
        .item("Counter", AttributeValue::N(counter.to_string()))
        .build()
        .map_err(|e| e.to_string())?;
    client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().put(business).build())
        .transact_items(put)
        .send()
        .await
        .map_err(|e| dynamo_outbox::error::transaction_error(e).to_string())?;
    writer.notify_committed(std::slice::from_ref(message));
    Ok((
        message.message_id.to_string(),
        stored.bucket,
        stored.sequence,
    ))
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
    keys: Vec<WriterKey>,
    /// The Kafka proxy's or the private broker's, when the scenario has one.
    bootstrap: Option<String>,
    kafka_proxy: Option<broker::ProxiedBroker>,
    topics: Vec<String>,
    /// Exactly-once delivery: the scenario's watermark topic.
    watermark_topic: Option<String>,
    options: dynamo_outbox::OutboxOptions,
    client: aws_sdk_dynamodb::Client,
    dir: PathBuf,
    /// The broker of the scenario's own ([`Fault::Chaos`]): dropped (killed, its data
    /// removed) after the relays.
    private_kafka: Option<Arc<Mutex<PrivateKafka>>>,
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
    /// What the restore saw ([`Fault::Restore`]).
    restore: Option<check::RestoreRecord>,
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
    let private_kafka = match &s.fault {
        Fault::Chaos { .. } => Some(
            tokio::task::spawn_blocking(PrivateKafka::start)
                .await
                .map_err(|e| format!("starting a private broker: {e}"))??,
        ),
        _ => None,
    };
    let bootstrap = kafka_proxy
        .as_ref()
        .map(|b| b.bootstrap())
        .or_else(|| private_kafka.as_ref().map(PrivateKafka::bootstrap));
    for t in &topics {
        create_topic(bootstrap.as_deref(), t, 3)?;
    }
    let watermark_topic = (s.delivery == Delivery::ExactlyOnce)
        .then(|| format!("harness-{}-{run_tag}-watermarks", s.name));
    if let Some(t) = &watermark_topic {
        create_topic(bootstrap.as_deref(), t, 1)?;
    }
    let mut per_bucket = vec![0usize; s.bucket_count as usize];
    let keys: Vec<WriterKey> = pick_keys(s.bucket_count, s.load.keys_per_bucket)
        .into_iter()
        .enumerate()
        .map(|(i, (key, bucket))| {
            per_bucket[bucket as usize] += 1;
            WriterKey {
                key,
                topic: topics[i % topics.len()].clone(),
                late: s.load.late_commit_ms.is_some() && per_bucket[bucket as usize] == 2,
                quiet: matches!(s.fault, Fault::Restore { .. }) && bucket % 2 == 1,
            }
        })
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
    fleet.extra_args = vec!["--delivery".into(), s.delivery.to_string()];
    if let Some(t) = &watermark_topic {
        fleet
            .extra_env
            .push(("OUTBOX_WATERMARK_TOPIC".into(), t.clone()));
    }
    Ok(Setup {
        proxy,
        inject_dynamodb_faults: s.fault.proxy_mix().is_some(),
        fleet,
        writer,
        keys,
        bootstrap,
        kafka_proxy,
        topics,
        watermark_topic,
        options,
        client,
        dir,
        private_kafka: private_kafka.map(|k| Arc::new(Mutex::new(k))),
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
    let control = Arc::new(WriteControl::default());
    let acks = Arc::new(Mutex::new(Vec::new()));
    let writes_started_us = now_us();
    let keys = std::mem::take(&mut setup.keys);
    let writers = tokio::spawn(write(
        setup.client.clone(),
        setup.writer.clone(),
        keys,
        s.load,
        control.clone(),
        acks.clone(),
        seed,
    ));
    if setup.inject_dynamodb_faults {
        setup.proxy.set_enabled(true);
    }
    let writes_for = s.writes_for(config.profile);
    let (injected, restore) = match s.fault {
        Fault::Restore {
            snapshot_after,
            restore_after,
            writes_after,
        } => {
            let times = (snapshot_after, restore_after, writes_after);
            let (record, writes_until) = restore_mid_run(config, s, setup, &control, times).await?;
            tokio::time::sleep_until(writes_until).await;
            let injected = Injected {
                faults: 1,
                graceful_stops: s.relays.len(),
            };
            (injected, Some(record))
        }
        _ => {
            let mut injector = Injector {
                fleet: &mut setup.fleet,
                outboxctl: &config.outboxctl,
                writes_until: tokio::time::Instant::now() + writes_for,
                rng: rand::rngs::StdRng::seed_from_u64(seed),
            };
            let injected = injector
                .inject(
                    &s.fault,
                    s.relays.len(),
                    setup.kafka_proxy.as_ref(),
                    setup.private_kafka.as_ref(),
                )
                .await?;
            (injected, None)
        }
    };
    control.stop.store(true, Ordering::SeqCst);
    let failed_enqueues = writers.await.unwrap_or(0);
    let write_seconds = (now_us() - writes_started_us) as f64 / 1e6;
    Ok(Written {
        acks,
        failed_enqueues,
        writes_started_us,
        write_seconds,
        injected,
        restore,
    })
}

/// [`Fault::Restore`]: the snapshot after `times.0`, the restore after `times.1` (see the
/// fault's docs); what it saw, and when the writes end (`times.2` after the restore).
async fn restore_mid_run(
    config: &Config,
    s: &Scenario,
    setup: &mut Setup,
    control: &WriteControl,
    times: (Duration, Duration, Duration),
) -> Result<(check::RestoreRecord, tokio::time::Instant), String> {
    let (snapshot_after, restore_after, writes_after) = times;
    let t0 = tokio::time::Instant::now();
    let (client, options) = (&setup.client, &setup.options);
    let arn_before = table_arn(client, options).await?;
    tokio::time::sleep_until(t0 + snapshot_after).await;
    // Half the buckets go quiet until the restore: their writers stop (what they had under
    // way lands first), so that the last transaction of each, the one its watermark lists
    // at the restore, is likely to publish messages of the snapshot.
    control.quieten().await;
    let snapshot_started_us = now_us();
    let items = snapshot(client, options).await?;
    let snapshot_ended_us = now_us();
    save_jsonl(
        &setup.dir.join("snapshot.jsonl"),
        items.iter().map(item_json),
    );
    tokio::time::sleep_until(t0 + restore_after).await;

    // The application stops writing; the relays stop; what Kafka holds now.
    let restore_started_us = now_us();
    control.pause().await;
    let all = setup.fleet.alive();
    setup.fleet.terminate(&all).await;
    let published = read_topics(
        &setup.topics,
        setup.bootstrap.as_deref(),
        0,
        Some(READ_COMMITTED),
    )?;
    let watermark_topic = setup
        .watermark_topic
        .as_deref()
        .ok_or("the restore scenario runs exactly once")?;
    let identity =
        dynamo_outbox::protocol::watermark::OutboxIdentity::new(&arn_before, &options.key_prefix);
    let watermarks = read_watermarks(
        setup.bootstrap.as_deref(),
        watermark_topic,
        &identity,
        s.bucket_count,
    )
    .await?;
    let _ = std::fs::write(
        setup.dir.join("watermarks-at-restore.json"),
        serde_json::to_string_pretty(
            &watermarks
                .iter()
                .map(|(b, w)| (b.to_string(), w.as_ref().map(|(text, _)| text.clone())))
                .collect::<BTreeMap<_, _>>(),
        )
        .unwrap_or_default(),
    );

    // The restore: the table deleted, created again under its name, the snapshot put back.
    restore_table(client, options, &items).await?;
    let arn_after = table_arn(client, options).await?;
    for _ in 0..s.relays.len() {
        start_relay(&mut setup.fleet, &config.outboxctl, None, None)?;
    }
    // Before the writers resume: every acknowledgement after this is of the new table.
    let restore_ended_us = now_us();
    control.resume();

    let keys = dynamo_outbox::protocol::schema::Keys::new(options);
    let snapshot_messages: Vec<check::SnapshotMessage> = items
        .iter()
        .filter_map(|i| dynamo_outbox::protocol::schema::parse_message(&keys, i).ok())
        .map(|m| {
            let covered = watermarks
                .get(&m.bucket)
                .and_then(Option::as_ref)
                .and_then(|(_, w)| w.as_ref().ok())
                .is_some_and(|w| w.covers(m.sequence, &m.message.message_id));
            check::SnapshotMessage {
                message_id: m.message.message_id.to_string(),
                bucket: m.bucket,
                sequence: m.sequence,
                covered_at_restore: covered,
            }
        })
        .collect();
    let record = check::RestoreRecord {
        snapshot_items: items.len(),
        snapshot: snapshot_messages,
        snapshot_us: (snapshot_started_us, snapshot_ended_us),
        restore_us: (restore_started_us, restore_ended_us),
        published_before: published,
        same_arn: arn_before == arn_after,
        unreadable_watermarks: watermarks
            .iter()
            .filter_map(|(b, w)| match w {
                Some((text, Err(e))) => Some(format!("bucket {b}: {text:?}: {e}")),
                _ => None,
            })
            .collect(),
    };
    Ok((record, tokio::time::Instant::now() + writes_after))
}

/// The table's ARN, as a relay reads it ([`dynamo_outbox::DynamoDbOutboxStore::table_arn`]).
async fn table_arn(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
) -> Result<String, String> {
    let store = dynamo_outbox::DynamoDbOutboxStore::new(client.clone(), options.clone())
        .map_err(|e| e.to_string())?;
    store.table_arn().await.map_err(|e| {
        format!(
            "the ARN of {}: {}",
            options.table_name,
            dynamo_outbox::error::chain(&e)
        )
    })
}

type Item = std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>;

/// Every item of the table whose partition key starts with `prefix` (every item: ""), by a
/// consistent scan.
async fn scan_items(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
    prefix: &str,
) -> Result<Vec<Item>, String> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let mut scan = client
            .scan()
            .table_name(&options.table_name)
            .consistent_read(true)
            .set_exclusive_start_key(start);
        if !prefix.is_empty() {
            scan = scan
                .filter_expression("begins_with(#pk, :prefix)")
                .expression_attribute_names("#pk", &options.partition_key_attribute)
                .expression_attribute_values(":prefix", AttributeValue::S(prefix.into()));
        }
        let out = scan
            .send()
            .await
            .map_err(|e| format!("scanning {}: {e:?}", options.table_name))?;
        items.extend(out.items().iter().cloned());
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return Ok(items),
        }
    }
}

/// The snapshot of [`Fault::Restore`]: every item, then the sequence counters again (a
/// counter only grows, so read last it is at least every number its bucket's items hold,
/// as in a point-in-time backup).
async fn snapshot(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
) -> Result<Vec<Item>, String> {
    let counters_prefix = format!("{}#SEQUENCE#", options.key_prefix);
    let pk = |i: &Item| {
        i.get(&options.partition_key_attribute)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default()
    };
    let mut items = scan_items(client, options, "").await?;
    let counters = scan_items(client, options, &counters_prefix).await?;
    items.retain(|i| !pk(i).starts_with(&counters_prefix));
    items.extend(counters);
    Ok(items)
}

/// The restore of [`Fault::Restore`]: the table deleted, created again under its name, and
/// `items` put back.
async fn restore_table(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
    items: &[Item],
) -> Result<(), String> {
    use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
    let name = &options.table_name;
    client
        .delete_table()
        .table_name(name)
        .send()
        .await
        .map_err(|e| format!("DeleteTable {name}: {e:?}"))?;
    let gone_by = tokio::time::Instant::now() + Duration::from_secs(30);
    while client
        .describe_table()
        .table_name(name)
        .send()
        .await
        .is_ok()
    {
        if tokio::time::Instant::now() >= gone_by {
            return Err(format!("{name} still exists 30 s after DeleteTable"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dynamo_outbox::table::create_if_not_exists(client, options)
        .await
        .map_err(|e| format!("creating {name} again: {e}"))?;
    for chunk in items.chunks(25) {
        let mut requests: Vec<WriteRequest> = chunk
            .iter()
            .map(|i| {
                PutRequest::builder()
                    .set_item(Some(i.clone()))
                    .build()
                    .map(|p| WriteRequest::builder().put_request(p).build())
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
        for _ in 0..20 {
            let out = client
                .batch_write_item()
                .request_items(name, requests.clone())
                .send()
                .await
                .map_err(|e| format!("BatchWriteItem {name}: {e:?}"))?;
            requests = out
                .unprocessed_items
                .and_then(|mut u| u.remove(name))
                .unwrap_or_default();
            if requests.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !requests.is_empty() {
            return Err(format!("BatchWriteItem {name}: items left unprocessed"));
        }
    }
    Ok(())
}

/// A bucket's watermark as read: nothing committed (`None`), or the text and what it
/// decodes to.
type ReadWatermark = Option<(
    String,
    Result<dynamo_outbox::protocol::watermark::Watermark, String>,
)>;

/// Each bucket's watermark, read as the relays read it: rskafka's `OffsetFetch` with
/// `require_stable`, from the broker at `bootstrap` (default: the stack's).
async fn read_watermarks(
    bootstrap: Option<&str>,
    watermark_topic: &str,
    identity: &dynamo_outbox::protocol::watermark::OutboxIdentity,
    bucket_count: u32,
) -> Result<BTreeMap<u32, ReadWatermark>, String> {
    let bootstrap = match bootstrap {
        Some(b) => b.to_string(),
        None => outbox_testkit::try_stack_var("KAFKA_BOOTSTRAP_SERVERS")?,
    };
    let client = rskafka::client::ClientBuilder::new(vec![bootstrap])
        .build()
        .await
        .map_err(|e| format!("connecting to the broker to read the watermarks: {e}"))?;
    let mut watermarks = BTreeMap::new();
    for bucket in 0..bucket_count {
        let group = identity.group_id(bucket);
        let committed = client
            .fetch_committed_offset(&group, watermark_topic, 0, true)
            .await
            .map_err(|e| format!("the watermark of group {group}: {e}"))?;
        let w = committed.and_then(|c| c.metadata).map(|text| {
            let decoded = dynamo_outbox::protocol::watermark::Watermark::decode(&text)
                .map_err(|e| e.to_string());
            (text, decoded)
        });
        watermarks.insert(bucket, w);
    }
    Ok(watermarks)
}

/// An item as JSON (the snapshot's file): each attribute's value as the SDK's debug text.
fn item_json(item: &Item) -> String {
    let map: BTreeMap<&str, String> = item
        .iter()
        .map(|(k, v)| (k.as_str(), format!("{v:?}")))
        .collect();
    serde_json::to_string(&map).unwrap_or_default()
}

fn save_jsonl(path: &Path, lines: impl Iterator<Item = String>) {
    let text: String = lines.map(|l| l + "\n").collect();
    let _ = std::fs::write(path, text);
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
        private_kafka: Option<&Arc<Mutex<PrivateKafka>>>,
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
            Fault::Chaos { stop_for } => self.inject_chaos(*stop_for, private_kafka).await,
            Fault::Restore { .. } => Err("Fault::Restore runs in write_while_faulted".into()),
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

impl Injector<'_> {
    /// [`Fault::Chaos`]: the kills all along, one stall past the lease, one broker restart.
    async fn inject_chaos(
        &mut self,
        stop_for: Duration,
        broker: Option<&Arc<Mutex<PrivateKafka>>>,
    ) -> Result<Injected, String> {
        let broker = broker.ok_or("Fault::Chaos needs the scenario's own broker")?;
        let start = tokio::time::Instant::now();
        // The stall first (while the broker runs, so that the stalled relay may hold an
        // open transaction), then the broker's restart.
        let stall_at = start + Duration::from_secs(1);
        let restart_at = stall_at + stop_for + Duration::from_millis(500);
        // The chaos goes on for the writes' time once the broker is back, at least.
        let chaos_for = self.writes_until.saturating_duration_since(start);
        let mut events = Vec::new();
        let mut event = |what: String| {
            events.push(format!("{} {what}", fleet::now_us()));
        };
        let mut faults = 0;
        let mut stalled: Option<(usize, tokio::time::Instant)> = None;
        let mut stall_done = false;
        let mut broker_back = false;
        let mut restart_begun = false;
        let mut restart: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        let mut next_kill = start + Duration::from_millis(self.rng.gen_range(1000..2000));
        let give_up = start + Duration::from_secs(120);
        loop {
            let now = tokio::time::Instant::now();
            if (now >= self.writes_until && broker_back) || now >= give_up {
                break;
            }
            if let Some((victim, until)) = stalled {
                if now >= until {
                    self.fleet.resume(victim);
                    stalled = None;
                    event(format!("SIGCONT {}", self.fleet.relays[victim].id));
                }
            }
            if !stall_done && now >= stall_at && now + stop_for < self.writes_until {
                // A relay that owns buckets (by its log).
                let owners = self.fleet.current_owners();
                let owning: Vec<usize> = self
                    .fleet
                    .alive()
                    .into_iter()
                    .filter(|&i| {
                        owners
                            .values()
                            .any(|o| o.contains(&self.fleet.relays[i].id))
                    })
                    .collect();
                if let Some(&victim) = owning.get(self.rng.gen_range(0..owning.len().max(1))) {
                    if self.fleet.pause(victim) {
                        faults += 1;
                        stalled = Some((victim, now + stop_for));
                        stall_done = true;
                        event(format!("SIGSTOP {}", self.fleet.relays[victim].id));
                    }
                }
            }
            if !restart_begun && now >= restart_at {
                restart_begun = true;
                let broker = Arc::clone(broker);
                restart = Some(tokio::task::spawn_blocking(move || {
                    broker.lock().unwrap_or_else(|e| e.into_inner()).restart()
                }));
                faults += 1;
                event("broker SIGKILL, restarting".into());
            }
            if let Some(task) = restart.take_if(|t| t.is_finished()) {
                task.await
                    .map_err(|e| format!("restarting the broker: {e}"))?
                    .map_err(|e| format!("restarting the broker: {e}"))?;
                broker_back = true;
                event("broker answers again".into());
                let until = tokio::time::Instant::now() + chaos_for / 2;
                self.writes_until = self.writes_until.max(until);
            }
            if now >= next_kill {
                let stopped = stalled.map(|(v, _)| v);
                let alive: Vec<usize> = self
                    .fleet
                    .alive()
                    .into_iter()
                    .filter(|&i| Some(i) != stopped)
                    .collect();
                if let Some(&victim) = alive.get(self.rng.gen_range(0..alive.len().max(1))) {
                    if self.fleet.kill9(victim) {
                        faults += 1;
                        event(format!("SIGKILL {}", self.fleet.relays[victim].id));
                    }
                    self.sleep_ms(0..500).await;
                    let new = self.start(None)?;
                    event(format!("started {}", self.fleet.relays[new].id));
                }
                next_kill = tokio::time::Instant::now()
                    + Duration::from_millis(self.rng.gen_range(1000..2000));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some((victim, _)) = stalled {
            self.fleet.resume(victim);
            event(format!("SIGCONT {}", self.fleet.relays[victim].id));
        }
        event("chaos over".into());
        let _ = std::fs::write(
            self.fleet.dir().join("faults.log"),
            events.join("\n") + "\n",
        );
        if !stall_done {
            return Err("no relay owned a bucket to stall".into());
        }
        if !broker_back {
            return Err("the broker did not answer again before the writes' end".into());
        }
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
        restore,
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
    let acks = std::mem::take(&mut *acks.lock().unwrap_or_else(|e| e.into_inner()));
    // Exactly once: what a read_committed consumer reads (waiting out the transactions a
    // killed relay left open, which hold the last stable offset back until the next owner
    // of their bucket or the broker's timeout aborts them), and how many records a
    // read_uncommitted consumer reads (the aborted copies too).
    let exactly_once = s.delivery == Delivery::ExactlyOnce;
    let isolation = exactly_once.then_some(READ_COMMITTED);
    let bootstrap = setup.bootstrap.as_deref();
    let mut deliveries = read_topics(&setup.topics, bootstrap, s.load.value_bytes, isolation)?;
    if exactly_once {
        let read_by = tokio::time::Instant::now() + Duration::from_secs(20);
        // A restore's rolled-back messages are in no topic: they are not waited for.
        let expected = match &restore {
            Some(r) => check::restore_truth(&acks, r),
            None => acks.clone(),
        };
        while !every_ack_read(&expected, &deliveries, &left_in_table)
            && tokio::time::Instant::now() < read_by
        {
            eprintln!(
                "[harness] {}: acknowledged messages missing from the read_committed read \
                 (a transaction still open holds the last stable offset back): reading again",
                s.name
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            deliveries = read_topics(&setup.topics, bootstrap, s.load.value_bytes, isolation)?;
        }
    }
    let uncommitted_records = if exactly_once {
        Some(
            read_topics(
                &setup.topics,
                bootstrap,
                s.load.value_bytes,
                Some(READ_UNCOMMITTED),
            )?
            .len(),
        )
    } else {
        None
    };
    let fleet = &mut setup.fleet;
    let mut history = History {
        bucket_count: s.bucket_count,
        acks,
        failed_enqueues,
        deliveries,
        relays: fleet.histories(),
        left_in_table,
        window_us: (writes_started_us, window_end),
        value_bytes: (s.load.value_bytes > 0).then_some(s.load.value_bytes),
        uncommitted_records,
    };
    let dir = &setup.dir;
    save_history(dir, &history);
    // A restore rolls the table back to its snapshot: the messages acknowledged after it
    // and not published before the restore are gone with it (and so are their business
    // writes). The ground truth is the rest.
    let restore = restore.map(|r| {
        let (truth, figures) = check::check_restore(&history, &r);
        history.acks = truth;
        figures
    });
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
        wire_refused_by_operation: stats
            .condition_refused_by_operation
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default(),
        refusal_disagreements: fleet.refusal_disagreements(),
        write_seconds,
        seconds: started.elapsed().as_secs_f64(),
        relay_errors: fleet.errors().into_iter().take(5).collect(),
        proxy: proxy_stats,
        dir: dir.clone(),
        delivery: s.delivery.to_string(),
        restore,
        exactly_once_log: exactly_once.then(|| {
            (
                fleet.count_log_lines("took the bucket's transactional producer"),
                fleet.count_log_lines(
                    "every message of the batch was published in a committed transaction",
                ),
            )
        }),
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

/// `kafka.py read --isolation`: records of committed transactions only (and records
/// written without transactions).
const READ_COMMITTED: &str = "read_committed";
/// `kafka.py read --isolation`: every record, those of aborted transactions too.
const READ_UNCOMMITTED: &str = "read_uncommitted";

/// Every topic read back from offset 0, in parallel (with `isolation`, as a consumer of
/// that isolation level reads it).
fn read_topics(
    topics: &[String],
    bootstrap: Option<&str>,
    value_bytes: usize,
    isolation: Option<&str>,
) -> Result<Vec<check::Delivery>, String> {
    let mut deliveries = Vec::new();
    let reads: Vec<Result<Vec<check::Delivery>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = topics
            .iter()
            .map(|t| scope.spawn(move || read_topic(bootstrap, t, value_bytes > 0, isolation)))
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

/// Whether every acknowledged message not left in the table has a record in `deliveries`.
fn every_ack_read(acks: &[Ack], deliveries: &[check::Delivery], left: &[String]) -> bool {
    let read: std::collections::HashSet<&str> = deliveries
        .iter()
        .filter_map(|d| d.message_id.as_deref())
        .chain(left.iter().map(String::as_str))
        .collect();
    acks.iter().all(|a| read.contains(a.message_id.as_str()))
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
fn read_topic(
    bootstrap: Option<&str>,
    topic: &str,
    large: bool,
    isolation: Option<&str>,
) -> Result<Vec<check::Delivery>, String> {
    let mut args = Vec::new();
    if let Some(b) = bootstrap {
        args.extend(["--bootstrap", b]);
    }
    args.extend(["read", topic, "--timeout", "60"]);
    if large {
        args.extend(["--value-head", "64"]);
    }
    if let Some(level) = isolation {
        args.extend(["--isolation", level]);
    }
    let records = outbox_testkit::try_read_records(&args)?
        .into_iter()
        .map(|r| check::Delivery {
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
        let wire = if o.wire_refused_by_operation.is_empty() {
            o.wire_refused.to_string()
        } else {
            let ops: Vec<String> = o
                .wire_refused_by_operation
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            format!("{}: {}", o.wire_refused, ops.join(", "))
        };
        let refused = if f.refused.values().all(|v| *v == 0) {
            format!("0 (wire {wire})")
        } else {
            f.refused
                .iter()
                .filter(|(_, v)| **v > 0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
                + &format!(" ({} after startup; wire {wire})", f.refused_during_writes)
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
    s.push_str(&delivery_table(outcomes));
    s
}

/// Scenarios 19 and 20 side by side (empty when none ran): what a consumer reads in each
/// delivery mode under the same chaos, and what a restore replays.
pub fn delivery_table(outcomes: &[Outcome]) -> String {
    let chosen: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.number == "19" || o.number == "20")
        .collect();
    if chosen.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n| Scenario | Delivery | Relays started / faults | Acked | Records read (committed) | Records read uncommitted | Lost | Duplicates (max copies) | Order inversions | Left in table | Late commits / holes stepped over | Buckets taken / batches found published | Seconds |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for o in &chosen {
        let f = &o.figures;
        s.push_str(&format!(
            "| {} | {} | {} / {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} / {} | {} | {:.0} |\n",
            o.name,
            o.delivery,
            o.relays_started,
            o.faults,
            f.acked,
            f.records,
            f.uncommitted_records
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
            f.lost,
            f.duplicates,
            f.max_copies,
            f.order_inversions,
            f.never_drained,
            f.late_commits,
            f.holes_stepped_over,
            o.exactly_once_log
                .map_or_else(|| "-".to_string(), |(t, c)| format!("{t} / {c}")),
            o.seconds,
        ));
    }
    for o in &chosen {
        if let Some(r) = &o.restore {
            s.push_str(&format!(
                "\n{}: snapshot of {} items ({} messages); acked before the restore {} (rolled back with the table: {}), after it {}; \
                 snapshot messages published before the restore {} (before the snapshot {}, during it {}, after it {}); \
                 covered by the watermarks at the restore {} (of them without a record: {}); \
                 expected duplicates {}, read twice {} (unexpected {}, expected but read once {}); same ARN: {}\n",
                o.name,
                r.snapshot_items,
                r.snapshot_messages,
                r.acked_before_restore,
                r.rolled_back,
                r.acked_after_restore,
                r.snapshot_published,
                r.published_before_snapshot,
                r.published_during_snapshot,
                r.published_after_snapshot,
                r.covered_by_watermark,
                r.covered_not_published,
                r.expected_duplicates,
                r.duplicates,
                r.unexpected_duplicates,
                r.expected_not_duplicated,
                r.same_arn,
            ));
        }
    }
    s
}
