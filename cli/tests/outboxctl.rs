//! The `outboxctl` binary: help texts, exit codes, and `enqueue`, `status --json` and
//! `drain` against DynamoDB Local (the tests that need the stack fail outside it).

use std::io::Write;
use std::process::{Command, Output, Stdio};

use dynamo_outbox::DynamoDbOutboxStore;
use outbox_testkit::*;

fn outboxctl(args: &[&str], stdin: Option<&str>) -> Output {
    outboxctl_env(args, stdin, &[("RUST_LOG", "warn")])
}

fn outboxctl_env(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outboxctl");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

#[test]
fn help_explains_every_command_and_usage_errors_exit_2() {
    let help = outboxctl(&["--help"], None);
    assert_eq!(code(&help), 0);
    let help = text(&help.stdout);
    for cmd in [
        "create-table",
        "enqueue",
        "relay",
        "status",
        "drain",
        "demo",
    ] {
        assert!(help.contains(cmd), "--help lists {cmd}: {help}");
    }
    assert!(help.contains("Exit codes"), "{help}");
    let status = text(&outboxctl(&["status", "--help"], None).stdout);
    assert!(
        status.contains("strongly consistent") && status.contains("--json"),
        "{status}"
    );
    let drain = text(&outboxctl(&["drain", "--help"], None).stdout);
    assert!(
        drain.contains("--timeout") && drain.contains("progress bar"),
        "{drain}"
    );
    let enqueue = text(&outboxctl(&["enqueue", "--help"], None).stdout);
    assert!(
        enqueue.contains("value_base64") && enqueue.contains("exits 2"),
        "{enqueue}"
    );

    let quarantine = text(&outboxctl(&["quarantine", "--help"], None).stdout);
    assert!(quarantine.contains("dead-letter"), "{quarantine}");
    let bad = outboxctl(&["quarantine", "99", "1", "--table", "t-123"], None);
    assert_eq!(code(&bad), 2, "{}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("bucket: 99 is not below the bucket count 8"));
    assert_eq!(code(&outboxctl(&["no-such-command"], None)), 2);
    assert_eq!(code(&outboxctl(&["status", "--no-such-flag"], None)), 2);
    let bad = outboxctl(&["drain", "--table", "t-123", "--timeout", "soon"], None);
    assert_eq!(code(&bad), 2, "{}", text(&bad.stderr));
    // A duration flag's error names the flag and the rule (clap parses it).
    assert!(
        text(&bad.stderr).contains("--timeout")
            && text(&bad.stderr).contains("is not a duration like 500ms, 30s"),
        "{}",
        text(&bad.stderr)
    );
    let bad = outboxctl(&["drain", "--table", "t-123", "--interval", "0s"], None);
    assert_eq!(code(&bad), 2, "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("--interval") && text(&bad.stderr).contains("greater than zero"),
        "{}",
        text(&bad.stderr)
    );
}

#[tokio::test]
async fn enqueue_status_and_drain_against_the_stack() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let table = options.table_name.as_str();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let base = ["--table", table, "--bucket-count", "4"];
    let with = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        v.extend(base.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>, stdin: Option<&str>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        outboxctl(&refs, stdin)
    };

    // An empty table drains at once.
    let out = run(with(&["drain", "--timeout", "10s"]), None);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("drained"),
        "{}",
        text(&out.stdout)
    );

    // A rejected request writes nothing, prints the function's error text, exits 2.
    let out = run(
        with(&["enqueue", "-"]),
        Some(r#"{"messages": [{"topic": "orders"}, {"topic": ""}]}"#),
    );
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ValidationError: messages[1].topic: must not be empty"),
        "{}",
        text(&out.stderr)
    );
    let out = run(with(&["enqueue"]), Some("{not json"));
    assert_eq!(code(&out), 2);
    assert!(text(&out.stderr).contains("request: is not valid JSON"));
    assert_eq!(pending_messages(&client, &options).await, 0);

    // A good request from a file: the function's JSON response.
    let file = std::env::temp_dir().join(format!("{}.json", random_name("enqueue")));
    std::fs::write(
        &file,
        r#"{"messages": [
            {"topic": "orders", "key": "customer-42", "value": "{}",
             "headers": [{"key": "type", "value": "created"}]},
            {"topic": "orders", "partition": 3, "value_base64": "AAE="}
        ]}"#,
    )
    .unwrap();
    let out = run(with(&["enqueue", file.to_str().unwrap()]), None);
    std::fs::remove_file(&file).ok();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let response: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let messages = response["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    // customer-42 hashes to bucket 1 of 4 (docs/item-schema.md), partition 3 to bucket 3.
    assert_eq!(messages[0]["bucket"], 1);
    assert_eq!(messages[1]["bucket"], 3);
    assert_eq!(messages[0]["sequence"], 1);
    assert_eq!(pending_messages(&client, &options).await, 2);

    // An idempotency key: the second call writes nothing and answers the first response.
    let request = r#"{"messages": [{"topic": "orders", "key": "customer-42", "value": "again"}],
                      "idempotency_key": "order-1001"}"#;
    let first = run(with(&["enqueue"]), Some(request));
    assert_eq!(code(&first), 0, "{}", text(&first.stderr));
    let second = run(with(&["enqueue", "-"]), Some(request));
    assert_eq!(code(&second), 0, "{}", text(&second.stderr));
    assert_eq!(text(&first.stdout), text(&second.stdout));
    let first: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["messages"][0]["bucket"], 1);
    assert_eq!(first["messages"][0]["sequence"], 2);
    assert_eq!(pending_messages(&client, &options).await, 3);
    // Take it away again, so that the figures below stay simple.
    client
        .delete_item()
        .table_name(table)
        .set_key(Some(store.keys().key(
            store.keys().message_pk(1),
            dynamo_outbox::protocol::schema::message_sk(2),
        )))
        .send()
        .await
        .unwrap();

    // status --json: every figure from the table.
    let out = run(with(&["status", "--json"]), None);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["table"], table);
    assert_eq!(report["buckets"][1]["pending"], 1);
    assert_eq!(report["buckets"][3]["pending"], 1);
    assert_eq!(report["buckets"][0]["pending"], 0);
    let unowned: Vec<u64> = report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "pending_without_owner")
        .map(|w| w["bucket"].as_u64().unwrap())
        .collect();
    assert_eq!(unowned, [1, 3]);

    // The human form.
    let out = run(with(&["status"]), None);
    assert_eq!(code(&out), 0);
    let human = text(&out.stdout);
    assert!(human.contains("never claimed"), "{human}");
    assert!(human.contains("no live owner"), "{human}");
    assert!(human.contains("no relay heartbeats"), "{human}");

    // No relay runs: drain gives up after its timeout with exit 1 (plain lines, as stdout
    // is a pipe here).
    let out = run(
        with(&["drain", "--timeout", "2s", "--interval", "500ms"]),
        None,
    );
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("drain: 2 messages left"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).contains("2 messages still pending"));

    // Drain while the messages go away: exit 0.
    let keys = store.keys().clone();
    let deleter = {
        let client = client.clone();
        let table = table.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            for (bucket, seq) in [(1, 1), (3, 1)] {
                client
                    .delete_item()
                    .table_name(&table)
                    .set_key(Some(keys.key(
                        keys.message_pk(bucket),
                        dynamo_outbox::protocol::schema::message_sk(seq),
                    )))
                    .send()
                    .await
                    .unwrap();
            }
        })
    };
    let args = with(&["drain", "--timeout", "20s", "--interval", "200ms"]);
    let out = tokio::task::spawn_blocking(move || run_owned(args))
        .await
        .unwrap();
    deleter.await.unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("drained: every bucket is empty (2 messages"));
}

/// `outboxctl status` with `OUTBOX_ALLOWED_TOPICS` set names a bucket parked behind a
/// message on a topic outside the list: its bucket, sequence, topic, the reason and the
/// command that moves it to the dead letters, in both forms.
#[tokio::test]
async fn status_names_a_bucket_parked_behind_a_disallowed_topic() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let table = options.table_name.as_str();
    // Written by a writer without an allow-list (another service, or before the list).
    let writer = dynamo_outbox::DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    writer
        .enqueue(&[writer.message("audit").with_partition(2).with_value("v")])
        .await
        .unwrap();
    writer
        .enqueue(&[writer.message("orders").with_partition(2)])
        .await
        .unwrap();
    writer
        .enqueue(&[writer.message("orders").with_partition(1)])
        .await
        .unwrap();
    let env = [
        ("RUST_LOG", "warn"),
        ("OUTBOX_ALLOWED_TOPICS", "orders,billing-*"),
    ];
    let args = ["status", "--json", "--table", table, "--bucket-count", "4"];
    let out = outboxctl_env(&args, None, &env);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let parked: Vec<&serde_json::Value> = report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "disallowed_topic_head")
        .collect();
    assert_eq!(parked.len(), 1, "{report:#}");
    let w = parked[0];
    assert_eq!(w["bucket"], 2, "{w:#}");
    assert_eq!(w["parked"]["sequence"], 1, "{w:#}");
    assert_eq!(w["parked"]["topic"], "audit", "{w:#}");
    let reason = w["parked"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("topic \"audit\" is not allowed here")
            && reason.contains("OUTBOX_ALLOWED_TOPICS: orders,billing-*"),
        "{reason}"
    );
    assert_eq!(w["parked"]["command"], "outboxctl quarantine 2 1", "{w:#}");

    // The human form says the same.
    let human_args = ["status", "--table", table, "--bucket-count", "4"];
    let out = outboxctl_env(&human_args, None, &env);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let human = text(&out.stdout);
    for part in [
        "bucket 2: parked behind",
        "topic \"audit\"",
        "outboxctl quarantine 2 1",
        "outboxctl dead-letters",
    ] {
        assert!(human.contains(part), "{part}: {human}");
    }

    // Without the list, the same table has no parked head.
    let out = outboxctl(&args, None);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !report["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["kind"] == "disallowed_topic_head"),
        "{report:#}"
    );
}

fn run_owned(args: Vec<String>) -> Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    outboxctl(&refs, None)
}

/// The README's main job, small: every order's message arrives, in per-key order, as an
/// independent Kafka client (confluent-kafka, through scripts/demo_check.py) reads them.
#[test]
fn demo_delivers_every_order_in_per_key_order() {
    let python = std::env::var("OUTBOX_STACK_PYTHON").expect("run inside scripts/stack.sh");
    let scripts = std::env::var("OUTBOX_STACK_SCRIPTS").expect("run inside scripts/stack.sh");
    let suffix = &uuid_like();
    let table = format!("demo-{suffix}");
    let topic = format!("orders-{suffix}");
    let out = outboxctl(
        &[
            "demo", "--table", &table, "--topic", &topic, "--orders", "60", "--keys", "6",
        ],
        None,
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("published 60 messages"), "{stdout}");
    assert!(stdout.contains("refused conditional writes: 0"), "{stdout}");
    let read = Command::new(&python)
        .arg(format!("{scripts}/kafka.py"))
        .args(["read", &topic])
        .output()
        .expect("kafka.py read");
    assert!(read.status.success(), "{}", text(&read.stderr));
    let mut check = Command::new(&python)
        .arg(format!("{scripts}/demo_check.py"))
        .arg("60")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("demo_check.py");
    check.stdin.take().unwrap().write_all(&read.stdout).unwrap();
    let checked = check.wait_with_output().unwrap();
    let report = text(&checked.stdout);
    assert!(
        checked.status.success(),
        "{report}{}",
        text(&checked.stderr)
    );
    assert!(
        report.contains("60 distinct messages over 6 keys; per-key order verified"),
        "{report}"
    );
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:x}", nanos, std::process::id())
}

/// Runs outboxctl with debug logs and planted credentials.
fn outboxctl_with_secrets(args: &[&str], stdin: Option<&str>) -> Output {
    outboxctl_env(
        args,
        stdin,
        &[
            ("RUST_LOG", "debug"),
            ("AWS_ACCESS_KEY_ID", "AKIAPLANTED7F3A"),
            ("AWS_SECRET_ACCESS_KEY", "secret-planted-7f3a"),
            ("AWS_SESSION_TOKEN", "token-planted-7f3a"),
        ],
    )
}

/// Debug logs of the writer and the relay carry neither the credentials nor the
/// payloads (keys, values, header values) of the messages they move.
#[tokio::test]
async fn logs_never_contain_credentials_tokens_or_payloads() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let table = options.table_name.as_str();
    let topic = random_name("secrets");
    create_topic(&topic, 1);
    let request = format!(
        r#"{{"messages": [{{"topic": "{topic}", "key": "key-planted-7f3a", "value": "value-planted-7f3a",
            "headers": [{{"key": "h", "value": "header-planted-7f3a"}}]}}]}}"#
    );
    let base = ["--table", table, "--bucket-count", "2"];
    let enqueue =
        outboxctl_with_secrets(&[&["enqueue", "-"][..], &base[..]].concat(), Some(&request));
    assert_eq!(code(&enqueue), 0, "{}", text(&enqueue.stderr));
    let relay = outboxctl_with_secrets(&[&["relay", "--for", "4s"][..], &base[..]].concat(), None);
    assert_eq!(code(&relay), 0, "{}", text(&relay.stderr));
    assert!(
        text(&relay.stdout).contains("published 1"),
        "{}",
        text(&relay.stdout)
    );
    let response: serde_json::Value =
        serde_json::from_slice(&enqueue.stdout).expect("enqueue's JSON response");
    let written: std::collections::BTreeSet<String> = response["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["message_id"].as_str().expect("message_id").to_string())
        .collect();
    assert_eq!(written.len(), 1, "{response}");
    // The message went through: its id, and only it, is in the topic.
    topic_deliveries(&topic).assert_exactly_once(&written);
    let logs = [&enqueue.stderr, &relay.stderr, &relay.stdout]
        .iter()
        .map(|b| text(b))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(logs.lines().count() > 20, "debug logs were written: {logs}");
    for planted in ["7f3a", "7F3A"] {
        assert!(
            !logs.contains(planted),
            "a planted secret or payload leaked into the logs"
        );
    }
}

/// `relay --for` is a deadline, not a deafness: SIGTERM before it stops the relay
/// gracefully at once (leases released, stop reason `shutdown`), as without `--for`.
#[tokio::test]
async fn relay_for_a_time_still_stops_gracefully_on_sigterm() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let child = Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args([
            "relay",
            "--table",
            &options.table_name,
            "--bucket-count",
            "4",
        ])
        .args(["--for", "120s"])
        .env("RUST_LOG", "warn")
        .env("OUTBOX_LEASE_DURATION", "3s")
        .env("OUTBOX_LEASE_RENEW_INTERVAL", "1s")
        .env("OUTBOX_POLL_INTERVAL", "100ms")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outboxctl relay");
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !lease_owners(&client, &options)
        .await
        .iter()
        .all(Option::is_some)
    {
        assert!(
            tokio::time::Instant::now() < until,
            "the relay never owned every bucket"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let signalled = std::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    let took = signalled.elapsed();
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 0, "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("(shutdown)") && stdout.contains("leases released: true"),
        "{stdout}"
    );
    assert!(
        took < std::time::Duration::from_secs(10),
        "stopped {took:?} after SIGTERM"
    );
    assert_eq!(lease_owners(&client, &options).await, vec![None; 4]);
}
