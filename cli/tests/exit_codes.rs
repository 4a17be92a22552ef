//! One exit-code rule for every command: what the caller must fix (bad usage, an invalid
//! option or request, a misconfiguration) exits 2, an operational failure exits 1. Run
//! against DynamoDB Local (fails, never skips, outside the stack).

use std::process::{Command, Output};

use outbox_testkit::*;

fn outboxctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .expect("run outboxctl")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn a_misconfiguration_exits_2_in_every_command() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let table = options.table_name.as_str();

    // The table exists with PK/SK; options asking for another partition key are a
    // misconfiguration (Error::Misconfiguration), not an operational failure.
    let out = outboxctl(
        &["create-table", "--table", table],
        &[("OUTBOX_PARTITION_KEY_ATTRIBUTE", "id")],
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("misconfiguration: ") && stderr.contains("the options expect id"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(2), "{stderr}");

    // The same table with the right options: fine.
    let out = outboxctl(&["create-table", "--table", table], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // An invalid option, and a rejected request: 2 as well.
    let file = std::env::temp_dir().join(format!("{}.json", random_name("request")));
    std::fs::write(&file, r#"{"messages": [{"topic": "orders"}]}"#).unwrap();
    let request = file.to_str().unwrap();
    let out = outboxctl(
        &["enqueue", request, "--table", table],
        &[("OUTBOX_IDEMPOTENCY_RETENTION", "a while")],
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("OUTBOX_IDEMPOTENCY_RETENTION: "),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    std::fs::write(&file, r#"{"messages": [{"topic": "bad topic"}]}"#).unwrap();
    let out = outboxctl(&["enqueue", request, "--table", table], &[]);
    std::fs::remove_file(&file).ok();
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ValidationError: messages[0].topic: "),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(pending_messages(&client, &options).await, 0);

    // An operational failure (no such table): 1.
    let out = outboxctl(&["status", "--table", &random_name("missing")], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}
