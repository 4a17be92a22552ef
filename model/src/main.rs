//! Runs the models with larger bounds than the test suite.
//!
//! At least once (the lease protocol):
//! `cargo run -p outbox-model --release -- RELAYS BUCKETS MAX_TIME [stalls]`.
//!
//! Exactly once (section 8 of docs/protocol.md):
//! `cargo run -p outbox-model --release -- exactly-once RELAYS BUCKETS MAX_TIME [OPTION]...`
//! with the options `stalls`, `no-crashes`, `no-lost-responses`, `no-lost-end-txn`,
//! `no-cut-deletes`, `late`, `reset`, `conditional-deletes`, `faults=N` (default 1),
//! `messages=N` (default 2), `batch=N` (default 2), `epochs=N` (most `InitProducerId`s per
//! bucket, default 8), `skew=A,B,...` (ticks per relay; default alternating 0 / +1) and
//! `mutation=NAME` (a [`Mutation`] by its name, e.g. `mutation=ReadBeforeInit`).

use outbox_model::exactly_once::{ExactlyOnceModel, Mutation};
use outbox_model::LeaseModel;
use stateright::{Checker, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "exactly-once") {
        exactly_once(&args[1..]);
        return;
    }
    let number =
        |i: usize, default: u8| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let relays = number(0, 3);
    let model = LeaseModel {
        relays,
        buckets: number(1, 3),
        max_time: number(2, 6),
        skew: (0..relays).map(|r| i8::from(r % 2 == 1)).collect(),
        crashes: true,
        stalls: args.get(3).is_some_and(|a| a == "stalls"),
        lost_responses: true,
    };
    run(model);
}

const MUTATIONS: [Mutation; 10] = [
    Mutation::ReadBeforeInit,
    Mutation::NoFencing,
    Mutation::MatchSequenceOnly,
    Mutation::WatermarkAsBound,
    Mutation::ReconcileFirstFetchOnly,
    Mutation::DropUnreturned,
    Mutation::DeleteBeforeCommit,
    Mutation::AssumeCommitted,
    Mutation::RepublishWithoutRetake,
    Mutation::CommitPastLease,
];

fn exactly_once(args: &[String]) {
    let number =
        |i: usize, default: u8| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let relays = number(0, 2);
    let options = args.get(3..).unwrap_or_default();
    let flag = |name: &str| options.iter().any(|o| o == name);
    let value = |name: &str| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
    };
    let count = |name: &str, default: u8| {
        value(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
    };
    let skew = value("skew").map_or_else(
        || (0..relays).map(|r| i8::from(r % 2 == 1)).collect(),
        |v| {
            v.split(',')
                .map(|x| x.parse().expect("skew: numbers"))
                .collect()
        },
    );
    let mutation = value("mutation").map(|name| {
        *MUTATIONS
            .iter()
            .find(|m| format!("{m:?}") == name)
            .unwrap_or_else(|| panic!("no mutation {name}; one of {MUTATIONS:?}"))
    });
    if let Some(unknown) = options.iter().find(|o| {
        let name = o.split('=').next().unwrap_or_default();
        ![
            "stalls",
            "no-crashes",
            "no-lost-responses",
            "no-lost-end-txn",
            "no-cut-deletes",
            "late",
            "reset",
            "conditional-deletes",
            "faults",
            "messages",
            "batch",
            "epochs",
            "skew",
            "mutation",
        ]
        .contains(&name)
    }) {
        panic!("unknown option {unknown}");
    }
    let model = ExactlyOnceModel {
        relays,
        buckets: number(1, 1),
        max_time: number(2, 7),
        skew,
        crashes: !flag("no-crashes"),
        stalls: flag("stalls"),
        lost_responses: !flag("no-lost-responses"),
        lost_end_txn: !flag("no-lost-end-txn"),
        cut_deletes: !flag("no-cut-deletes"),
        max_faults: count("faults", 1),
        messages: count("messages", 2),
        batch_size: count("batch", 2),
        late: flag("late"),
        reset: flag("reset"),
        conditional_deletes: flag("conditional-deletes"),
        max_epoch: count("epochs", 8),
        mutation,
    };
    run(model);
}

fn run<M>(model: M)
where
    M: Model + std::fmt::Debug + Clone + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync,
{
    let started = std::time::Instant::now();
    let checker = model.clone().checker().spawn_bfs().join();
    println!(
        "{model:?}\n{} unique states, {} in {:.1} s",
        checker.unique_state_count(),
        if checker.is_done() {
            "done"
        } else {
            "not done"
        },
        started.elapsed().as_secs_f64()
    );
    for p in model.properties() {
        let found = checker.discovery(p.name);
        let failure = p.expectation.discovery_is_failure();
        let verdict = match (failure, &found) {
            (false, Some(_)) => "reached",
            (false, None) => "NOT REACHED",
            (true, Some(_)) => "COUNTEREXAMPLE",
            (true, None) => "holds",
        };
        println!("{:<100} {verdict}", p.name);
        // TRACE=1 prints a short counterexample's actions (TRACE=states: and its states),
        // from a search that stops at the first one (the run above keeps the last it met).
        let trace = std::env::var("TRACE").unwrap_or_default();
        if failure && found.is_some() && !trace.is_empty() {
            let path = model
                .clone()
                .checker()
                .finish_when(stateright::HasDiscoveries::AnyOf([p.name].into()))
                .spawn_bfs()
                .join()
                .discovery(p.name)
                .expect("found again");
            for (state, action) in path.into_vec() {
                if trace == "states" {
                    println!("        {state:?}");
                }
                if let Some(action) = action {
                    println!("    {action:?}");
                }
            }
        }
    }
}
