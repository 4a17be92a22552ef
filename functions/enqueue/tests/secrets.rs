//! No secret and no payload in either function's log at any level: both handlers invoked
//! under the subscriber their `main` installs (`dynamo_outbox::logging::lambda_subscriber`,
//! JSON, as the template's `LoggingConfig` sets it) with `RUST_LOG=trace` and
//! `AWS_LAMBDA_LOG_LEVEL=TRACE`, against the local stack, with planted credentials, a
//! planted session token and messages whose keys, values and header values carry a planted
//! marker: random markers that cannot occur by chance. None appears in the output, though
//! the messages are enqueued, published and read back. (The relay function's handler is here, not in its own crate, so that one
//! process has one global subscriber for both; run through scripts/stack.sh.)

use std::collections::HashMap;
use std::time::Duration;

use dynamo_outbox::accounting::RequestCounter;
use dynamo_outbox::lambda::{RelayHandler, RelaySettings};
use lambda_runtime::LambdaEvent;
use outbox_enqueue_function::EnqueueFunction;
use outbox_testkit::*;
use serde_json::{json, Value};

fn event(function: &str, payload: Value, time_left: Duration) -> LambdaEvent<Value> {
    outbox_testkit::lambda::invocation_in(function, payload, time_left)
}

fn marker(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// The enqueue function built from `lookup` as its main builds it: a batch, an idempotent
/// request and its replay, then a topic outside the allow-list, refused.
async fn invoke_the_enqueue_function(
    config: &aws_config::SdkConfig,
    lookup: impl Fn(&str) -> Option<String>,
    topic: &str,
    payload: &str,
) {
    let enqueue = EnqueueFunction::from_lookup(config, lookup).unwrap();
    let message = |n: u32| {
        json!({
            "topic": topic,
            "key": format!("{payload}-key-{n}"),
            "value": format!("{{\"card\":\"{payload}-value-{n}\"}}"),
            "headers": [{"key": "customer", "value": format!("{payload}-header-{n}")}],
        })
    };
    for payload in [
        json!({"messages": [message(1), message(2), message(3)]}),
        json!({"messages": [message(4)], "idempotency_key": "once"}),
        json!({"messages": [message(4)], "idempotency_key": "once"}),
    ] {
        enqueue
            .handle(event("outbox-enqueue", payload, Duration::from_secs(10)))
            .await
            .expect("enqueue");
    }
    let e = enqueue
        .handle(event(
            "outbox-enqueue",
            json!({"messages": [{"topic": "payments"}]}),
            Duration::from_secs(10),
        ))
        .await
        .expect_err("a topic outside the allow-list");
    assert_eq!(e.error_type, "ValidationError");
}

/// `text` is a trace log (the SDK's included, with signed requests, and the relay's
/// invocation) in which no `planted` value appears.
fn assert_trace_without(text: &str, planted: &[(&str, String)]) {
    // Trace is really on, the SDK's included, and requests were signed ...
    assert!(text.contains("\"level\":\"TRACE\""), "no trace line");
    assert!(
        text.contains("read_after_signing"),
        "no signed request in the log"
    );
    assert!(text.contains("relay invocation done"));
    // ... and no planted credential is in it.
    for (what, planted) in planted {
        let hits: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(planted.as_str()))
            .collect();
        assert!(
            hits.is_empty(),
            "the {what} is in {} log line(s), e.g. {}",
            hits.len(),
            hits[0].chars().take(600).collect::<String>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_trace_neither_function_logs_the_credentials_the_session_token_or_the_payloads() {
    stack_var("AWS_ENDPOINT_URL_DYNAMODB");
    let (key, secret, token) = (marker("AKIA"), marker(""), marker(""));
    let payload = marker("payload");
    // The credentials the SDK's chain finds in a function's environment, as Lambda sets them.
    std::env::set_var("AWS_ACCESS_KEY_ID", &key);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", &secret);
    std::env::set_var("AWS_SESSION_TOKEN", &token);
    let captured = Captured::default();
    let writer = captured.clone();
    let log_env = HashMap::from([
        ("RUST_LOG", "trace"),
        ("AWS_LAMBDA_LOG_LEVEL", "TRACE"),
        ("AWS_LAMBDA_LOG_FORMAT", "JSON"),
    ]);
    tracing::subscriber::set_global_default(dynamo_outbox::logging::lambda_subscriber(
        |name| log_env.get(name).map(|v| v.to_string()),
        move || writer.clone(),
    ))
    .unwrap();

    // As each function's main builds its clients.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = dynamo_outbox::client::dynamodb_client(&config);
    let options = fresh_table(&client, 4).await;
    let topic = random_name("orders");
    create_topic(&topic, 2);
    let vars: HashMap<&str, String> = HashMap::from([
        ("OUTBOX_TABLE_NAME", options.table_name.clone()),
        ("OUTBOX_BUCKET_COUNT", "4".into()),
        ("OUTBOX_ALLOWED_TOPICS", topic.clone()),
        (
            "KAFKA_BOOTSTRAP_SERVERS",
            stack_var("KAFKA_BOOTSTRAP_SERVERS"),
        ),
        ("OUTBOX_POLL_INTERVAL", "100ms".into()),
        ("OUTBOX_IDLE_STOP", "1s".into()),
        ("OUTBOX_MAX_RUN_TIME", "6s".into()),
    ]);
    let lookup = |n: &str| vars.get(n).cloned();

    // The enqueue function: a batch, an idempotent request and its replay, a rejection.
    invoke_the_enqueue_function(&config, lookup, &topic, &payload).await;

    // The relay function: a scheduled invocation publishes the four messages.
    let requests = RequestCounter::default();
    let relay_client = dynamo_outbox::client::counted_dynamodb_client(&config, requests.clone());
    let relay = RelayHandler::new(relay_client, RelaySettings::from_lookup(lookup).unwrap())
        .unwrap()
        .with_request_counter(requests);
    let summary = relay
        .handle(event(
            "outbox-relay",
            json!({"source": "aws.scheduler"}),
            Duration::from_secs(10),
        ))
        .await
        .expect("relay invocation");
    assert_eq!(summary.published, 4, "{summary:?}");
    // The payloads went through: Kafka has them, markers and all.
    let records = read_topic(&topic);
    assert_eq!(records.len(), 4, "{records:?}");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let values: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8(b64.decode(r.value.as_deref().unwrap()).unwrap()).unwrap())
        .collect();
    assert!(values.iter().all(|v| v.contains(&payload)), "{values:?}");

    let text = captured.text();
    let mut planted = vec![
        ("access key id", key.clone()),
        ("secret access key", secret.clone()),
        ("session token", token.clone()),
        ("message payload (key, value or header)", payload.clone()),
    ];
    // A value's bytes as DynamoDB and Kafka carry them, base64 in a request body.
    planted.extend(
        values
            .iter()
            .map(|v| ("a message value in base64", b64.encode(v))),
    );
    assert_trace_without(&text, &planted);
    println!("{} log lines checked", text.lines().count());
}
