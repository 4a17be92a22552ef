//! No secret in `outboxctl`'s output at any level: its commands run with `RUST_LOG=trace`
//! against the local stack, with planted credentials and a planted session token (random
//! markers that cannot occur by chance); neither appears in stdout or stderr. Before the
//! filter (`dynamo_outbox::logging`), the access key id was in about 200 lines of such a
//! run (`aws_sigv4::http_request::sign`, `aws_smithy_runtime::client::orchestrator` and
//! its `::auth`). Run through scripts/stack.sh; never skipped.

use std::io::Write;
use std::process::{Command, Stdio};

use outbox_testkit::*;

struct Planted {
    key: String,
    secret: String,
    token: String,
}

fn outboxctl(planted: &Planted, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args(args)
        .env("RUST_LOG", "trace")
        .env("AWS_ACCESS_KEY_ID", &planted.key)
        .env("AWS_SECRET_ACCESS_KEY", &planted.secret)
        .env("AWS_SESSION_TOKEN", &planted.token)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outboxctl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let expect_failure =
        args[0] == "enqueue" && env.iter().any(|(k, _)| *k == "OUTBOX_ALLOWED_TOPICS");
    assert_eq!(
        out.status.success(),
        !expect_failure,
        "outboxctl {args:?}: {}",
        text.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    text
}

#[tokio::test]
async fn at_trace_outboxctl_logs_neither_the_credentials_nor_the_session_token() {
    stack_var("AWS_ENDPOINT_URL_DYNAMODB");
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    // 32 random hex digits each (random_name's suffix is 12).
    let hex = || random_name("m").trim_start_matches("m-").to_string();
    let marker = |prefix: &str| format!("{prefix}{}{}{}", hex(), hex(), &hex()[..8]);
    let planted = Planted {
        key: marker("AKIA"),
        secret: marker(""),
        token: marker(""),
    };
    let table = random_name("outbox");
    let topic = random_name("orders");
    create_topic(&topic, 1);
    let request = format!(r#"{{"messages": [{{"topic": "{topic}", "key": "k", "value": "v"}}]}}"#);
    let refused = r#"{"messages": [{"topic": "payments"}]}"#;
    let allowed = [("OUTBOX_ALLOWED_TOPICS", topic.as_str())];
    let runs = [
        outboxctl(&planted, &["create-table", "--table", &table], "", &[]),
        outboxctl(
            &planted,
            &["enqueue", "-", "--table", &table],
            &request,
            &[],
        ),
        // The allow-list, in outboxctl enqueue too: a ValidationError naming the field.
        outboxctl(
            &planted,
            &["enqueue", "-", "--table", &table],
            refused,
            &allowed,
        ),
        outboxctl(&planted, &["status", "--table", &table], "", &[]),
        outboxctl(
            &planted,
            &["relay", "--table", &table, "--for", "4s"],
            "",
            &allowed,
        ),
    ];
    assert!(
        runs[2]
            .contains("ValidationError: messages[0].topic: topic \"payments\" is not allowed here"),
        "{}",
        runs[2].lines().last().unwrap_or_default()
    );
    let text = runs.concat();
    // Trace is really on, the SDK's included, and requests were signed ...
    assert!(text.contains("TRACE"), "no trace line");
    assert!(
        text.contains("read_after_signing"),
        "no signed request in the log"
    );
    assert_eq!(
        topic_deliveries(&topic).ids.len(),
        1,
        "the relay published the message"
    );
    // ... and no planted credential is in it.
    for (what, planted) in [
        ("access key id", &planted.key),
        ("secret access key", &planted.secret),
        ("session token", &planted.token),
    ] {
        let hits: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(planted.as_str()))
            .collect();
        assert!(
            hits.is_empty(),
            "the {what} is in {} line(s), e.g. {}",
            hits.len(),
            hits[0].chars().take(600).collect::<String>()
        );
    }
    println!("{} lines checked", text.lines().count());
}
