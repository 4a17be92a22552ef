//! The fault-injection harness's short profile: every scenario for a few seconds
//! against `outboxctl relay` processes on the local stack. Fails when a target is missed
//! (and, like every integration test here, outside the stack). The long profile, with the
//! documented figures, is `scripts/harness.sh --long` (see docs/RELIABILITY.md).

use std::path::PathBuf;

use outbox_harness::{markdown_table, run, Config, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_fault_injection_profile_meets_every_target() {
    let out_dir = std::env::temp_dir().join(format!(
        "outbox-harness-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    ));
    let config = Config {
        outboxctl: PathBuf::from(env!("CARGO_BIN_EXE_outboxctl")),
        profile: Profile::Short,
        only: Vec::new(),
        out_dir: out_dir.clone(),
        seed: 6,
    };
    let outcomes = run(&config)
        .await
        .unwrap_or_else(|e| panic!("the harness could not run: {e}"));
    println!("{}", markdown_table(&outcomes));
    let missed: Vec<String> = outcomes.iter().flat_map(|o| o.missed()).collect();
    assert!(
        missed.is_empty(),
        "targets missed (histories and relay logs in {}):\n{}",
        out_dir.display(),
        missed.join("\n")
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}
