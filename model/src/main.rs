//! Runs the lease-protocol model with larger bounds than the test suite:
//! `cargo run -p outbox-model --release -- RELAYS BUCKETS MAX_TIME [stalls]`.

use outbox_model::LeaseModel;
use stateright::{Checker, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
        let found = checker.discovery(p.name).is_some();
        println!(
            "{:<60} {}",
            p.name,
            if found { "COUNTEREXAMPLE" } else { "holds" }
        );
    }
}
