//! Test support of the outbox, shared by the integration tests, the benchmarks and the
//! fault-injection harness: endpoints of the local stack from the environment (set by
//! `scripts/stack.sh`), clients, random names, the independent Kafka reader, Lambda
//! invocations, an OTLP/HTTP receiver ([`otlp::OtlpReceiver`]) and one configurable
//! DynamoDB fault ([`Fault`]). No shipped crate depends on it but as a dev-dependency.
#![allow(unreachable_pub)]

pub mod fake_broker;
pub mod fault;
pub mod kafka;
pub mod lambda;
pub mod msk_iam;
pub mod otlp;

pub use fault::{dynamodb_builder, faulty_dynamodb, Fault};

/// Log output captured in memory: a `Write` (for `with_writer(move || c.clone())`) and a
/// `MakeWriter` for a `tracing_subscriber::fmt` subscriber, read back with [`Captured::text`].
#[derive(Debug, Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Captured {
    type Writer = Captured;
    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

impl Captured {
    /// Installs a `tracing_subscriber::fmt` subscriber with `filter` (an `EnvFilter`
    /// directive, `"warn"` say), without colours, as the process's global default, writing
    /// here; once per test binary (a second call panics).
    pub fn install_global(filter: &str) -> Captured {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        captured
    }

    /// What was written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_dynamodb::Client;
use dynamo_outbox::accounting::RequestCounter;
use dynamo_outbox::OutboxOptions;

/// Reads a variable that `scripts/stack.sh` exports; panics with a clear message when the
/// test runs outside the stack (integration tests never skip themselves).
pub fn stack_var(name: &str) -> String {
    try_stack_var(name).unwrap_or_else(|e| panic!("{e}"))
}

/// [`stack_var`] for callers that report errors instead of panicking (the benchmarks).
pub fn try_stack_var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run through scripts/test.sh or scripts/bench.sh (or scripts/stack.sh run -- ...)")
    })
}

/// The shared AWS configuration for the local stack (endpoints and dummy credentials from
/// the stack's environment, through the standard AWS configuration chain).
pub async fn try_sdk_config() -> Result<aws_config::SdkConfig, String> {
    try_stack_var("AWS_ENDPOINT_URL_DYNAMODB")?;
    Ok(aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await)
}

/// A DynamoDB client for DynamoDB Local (endpoint and dummy credentials from the stack's
/// environment, through the standard AWS configuration chain).
pub async fn dynamodb() -> Client {
    let config = try_sdk_config().await.unwrap_or_else(|e| panic!("{e}"));
    Client::new(&config)
}

/// A DynamoDB client like [`dynamodb`] (the same configuration chain) with `counter`
/// attached: every attempt is counted by operation and outcome, and every answer that
/// refused a condition (`ConditionalCheckFailedException`, or a transaction cancelled by
/// one) is counted from DynamoDB's own answer, independently of what the relay counts.
pub async fn counted_dynamodb(counter: &RequestCounter) -> Client {
    let config = try_sdk_config().await.unwrap_or_else(|e| panic!("{e}"));
    Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&config)
            .interceptor(counter.clone())
            .build(),
    )
}

/// A fresh [`RequestCounter`] and a [`counted_dynamodb`] client reporting to it.
pub async fn counted_client() -> (Client, RequestCounter) {
    let counter = RequestCounter::default();
    (counted_dynamodb(&counter).await, counter)
}

/// Asserts that no answer counted by `counter` refused a condition: the wire's count of
/// refused conditional writes, next to the relays' own (`what` names the run).
#[track_caller]
pub fn assert_no_refusal_on_the_wire(counter: &RequestCounter, what: &str) {
    assert_eq!(
        counter.refused_total(),
        0,
        "{what}: DynamoDB refused conditional writes: {:?} (attempts {:?})",
        counter.refusals(),
        counter.snapshot()
    );
}

/// A random name with a readable prefix, unique per test.
pub fn random_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Options for a fresh table, created and active.
pub async fn fresh_table(client: &Client, bucket_count: u32) -> OutboxOptions {
    let options = OutboxOptions::new(random_name("outbox")).with_bucket_count(bucket_count);
    dynamo_outbox::table::create_if_not_exists(client, &options)
        .await
        .expect("create table");
    options
}

/// One record read back from the broker by the independent client (confluent-kafka).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ReadRecord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key, base64.
    pub key: Option<String>,
    /// Value, base64.
    pub value: Option<String>,
    /// Headers: name and base64 value (or null).
    pub headers: Vec<(String, Option<String>)>,
    /// Timestamp (Unix milliseconds).
    #[serde(default)]
    pub timestamp: Option<i64>,
    /// `create` or `log_append`.
    #[serde(default)]
    pub timestamp_type: Option<String>,
    /// The value's full length, when read with `--value-head` (the value is cut then).
    #[serde(default)]
    pub value_len: Option<usize>,
}

/// A [`ReadRecord`] with its key, value and headers decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key (`None`: null).
    pub key: Option<Vec<u8>>,
    /// Value (`None`: null).
    pub value: Option<Vec<u8>>,
    /// Headers in the record's order, values `None` when null.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Timestamp (Unix milliseconds).
    pub timestamp: Option<i64>,
    /// `create` or `log_append`.
    pub timestamp_type: Option<String>,
}

/// Parses what `kafka.py read` prints: one JSON record per line (the one parser of it).
pub fn parse_records(out: &str) -> Result<Vec<ReadRecord>, String> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("kafka.py output {l:?}: {e}")))
        .collect()
}

/// Runs `kafka.py ARGS` (a `read` with its options: `--bootstrap`, `--expect`,
/// `--value-head`, `--timeout`) and parses the records it prints.
pub fn try_read_records(args: &[&str]) -> Result<Vec<ReadRecord>, String> {
    parse_records(&try_stack_py("kafka.py", args)?)
}

impl ReadRecord {
    /// The decoded key.
    pub fn key_bytes(&self) -> Option<Vec<u8>> {
        self.key.as_ref().map(|k| b64(k))
    }

    /// The decoded value.
    pub fn value_bytes(&self) -> Option<Vec<u8>> {
        self.value.as_ref().map(|v| b64(v))
    }

    /// Headers, decoded.
    pub fn header_list(&self) -> Vec<(String, Option<Vec<u8>>)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_ref().map(|v| b64(v))))
            .collect()
    }

    /// Key, value and headers decoded.
    pub fn decoded(&self) -> DecodedRecord {
        DecodedRecord {
            partition: self.partition,
            offset: self.offset,
            key: self.key_bytes(),
            value: self.value_bytes(),
            headers: self.header_list(),
            timestamp: self.timestamp,
            timestamp_type: self.timestamp_type.clone(),
        }
    }

    /// The value of the message-id header.
    pub fn message_id(&self) -> Option<String> {
        self.header_list()
            .into_iter()
            .find(|(k, _)| k == dynamo_outbox::publish::DEFAULT_MESSAGE_ID_HEADER)
            .and_then(|(_, v)| String::from_utf8(v?).ok())
    }
}

/// What a topic holds, by message id: the distinct ids, the ids read more than once (with
/// their copies) and the records without a message-id header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deliveries {
    /// Every message id read, once.
    pub ids: BTreeSet<String>,
    /// Ids read more than once, with how many copies.
    pub duplicates: BTreeMap<String, usize>,
    /// Records without a message-id header.
    pub without_id: usize,
    /// Records read.
    pub records: usize,
}

impl Deliveries {
    /// Groups `records` by their message-id header.
    pub fn of(records: &[ReadRecord]) -> Self {
        let mut copies: BTreeMap<String, usize> = BTreeMap::new();
        let mut without_id = 0;
        for r in records {
            match r.message_id() {
                Some(id) => *copies.entry(id).or_default() += 1,
                None => without_id += 1,
            }
        }
        Deliveries {
            ids: copies.keys().cloned().collect(),
            duplicates: copies.into_iter().filter(|(_, n)| *n > 1).collect(),
            without_id,
            records: records.len(),
        }
    }

    /// Ids in `written` that were not read.
    pub fn missing(&self, written: &BTreeSet<String>) -> BTreeSet<String> {
        written.difference(&self.ids).cloned().collect()
    }

    /// Ids read that are not in `written`.
    pub fn unexpected(&self, written: &BTreeSet<String>) -> BTreeSet<String> {
        self.ids.difference(written).cloned().collect()
    }

    /// Asserts at-least-once delivery of `written`: the set of ids read equals it (no
    /// message missing, none foreign, every record carries an id); duplicates allowed.
    /// Returns how many extra copies were read (0 when each arrived once).
    #[track_caller]
    pub fn assert_at_least_once(&self, written: &BTreeSet<String>) -> usize {
        assert!(
            self.ids == *written && self.without_id == 0,
            "the ids read are not the ids written: missing {:?}, unexpected {:?}, {} records without an id ({} records, duplicates {:?})",
            self.missing(written),
            self.unexpected(written),
            self.without_id,
            self.records,
            self.duplicates
        );
        self.records - self.ids.len()
    }

    /// Asserts exactly-once delivery of `written`: the set of ids read equals it and no id
    /// was read twice.
    #[track_caller]
    pub fn assert_exactly_once(&self, written: &BTreeSet<String>) {
        self.assert_at_least_once(written);
        assert!(
            self.duplicates.is_empty(),
            "every message once, but duplicates were read: {:?}",
            self.duplicates
        );
    }
}

/// The message ids of `messages`, as the message-id header carries them.
pub fn id_set<'a>(
    messages: impl IntoIterator<Item = &'a dynamo_outbox::OutboxMessage>,
) -> BTreeSet<String> {
    messages
        .into_iter()
        .map(|m| m.message_id.to_string())
        .collect()
}

/// What `topic` holds now, by message id ([`read_topic`] grouped by [`Deliveries::of`]).
pub fn topic_deliveries(topic: &str) -> Deliveries {
    Deliveries::of(&read_topic(topic))
}

/// Reads `topic` until every id of `written` is in it (distinct ids, not a record count:
/// a duplicate does not stand in for a missing message), at most `timeout`; what was read
/// last, or a panic naming the missing ids.
pub async fn wait_for_ids(
    topic: &str,
    written: &BTreeSet<String>,
    timeout: std::time::Duration,
) -> Deliveries {
    let until = tokio::time::Instant::now() + timeout;
    loop {
        let topic_owned = topic.to_string();
        // kafka.py blocks: off the runtime, so a relay on the same runtime keeps renewing.
        let read = tokio::task::spawn_blocking(move || topic_deliveries(&topic_owned))
            .await
            .expect("reading the topic");
        if read.missing(written).is_empty() {
            return read;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {timeout:?} waiting for {} of {} messages in {topic}: missing {:?}",
            read.missing(written).len(),
            written.len(),
            read.missing(written)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn b64(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64 from kafka.py")
}

fn kafka_py(args: &[&str]) -> String {
    stack_py("kafka.py", args)
}

/// Runs one of the stack's Python helpers (`scripts/NAME`) with the stack's venv python;
/// panics with its stderr when it fails.
fn stack_py(script: &str, args: &[&str]) -> String {
    stack_var("OUTBOX_STACK_PYTHON");
    try_stack_py(script, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs one of the stack's Python helpers (`scripts/NAME`) with the stack's venv python
/// (`OUTBOX_STACK_PYTHON`, `OUTBOX_STACK_SCRIPTS`); its stdout, or an error naming the
/// script, its arguments and its stderr.
pub fn try_stack_py(script: &str, args: &[&str]) -> Result<String, String> {
    let python = std::env::var("OUTBOX_STACK_PYTHON").unwrap_or_default();
    let scripts = std::env::var("OUTBOX_STACK_SCRIPTS").unwrap_or_default();
    let out = std::process::Command::new(&python)
        .arg(format!("{scripts}/{script}"))
        .args(args)
        .output()
        .map_err(|e| format!("running {script} with {python:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{script} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates the event bus `bus` on the stack's EventBridge stand-in (moto) with a rule
/// that sends commit notifications to a fresh SQS queue, and returns the queue's URL.
pub fn watch_notifications(bus: &str) -> String {
    stack_py("events.py", &["watch", bus]).trim().to_owned()
}

/// The events delivered to the queue of [`watch_notifications`] so far (waiting up to
/// `wait_secs` for the first), as a Lambda target would receive them; they are consumed.
pub fn received_notifications(queue_url: &str, wait_secs: u32) -> Vec<serde_json::Value> {
    stack_py(
        "events.py",
        &["receive", queue_url, "--wait", &wait_secs.to_string()],
    )
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(|l| serde_json::from_str(l).expect("event json"))
    .collect()
}

/// Creates a topic with the independent client and waits until it is visible.
pub fn create_topic(name: &str, partitions: u32) {
    kafka_py(&[
        "create-topic",
        name,
        "--partitions",
        &partitions.to_string(),
    ]);
}

/// Creates a topic with topic configs (`("max.message.bytes", "2000")`, say) with the
/// independent client and waits until it is visible.
pub fn create_topic_with_config(name: &str, partitions: u32, configs: &[(&str, &str)]) {
    let partitions = partitions.to_string();
    let configs: Vec<String> = configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut args = vec!["create-topic", name, "--partitions", &partitions];
    for c in &configs {
        args.extend(["--config", c.as_str()]);
    }
    kafka_py(&args);
}

/// Every record of a topic, from offset 0 up to the high watermark, by the independent client.
pub fn read_topic(name: &str) -> Vec<ReadRecord> {
    stack_var("OUTBOX_STACK_PYTHON");
    try_read_records(&["read", name]).unwrap_or_else(|e| panic!("{e}"))
}

/// A Kafka publisher for the local broker (`KAFKA_BOOTSTRAP_SERVERS`).
pub async fn kafka_publisher() -> std::sync::Arc<dynamo_outbox::publish::KafkaPublisher> {
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let config = dynamo_outbox::publish::KafkaConfig::from_env().expect("kafka config");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    std::sync::Arc::new(
        dynamo_outbox::publish::KafkaPublisher::connect(config, deadline)
            .await
            .expect("connect to the local broker"),
    )
}

/// Relay options with short timings, so that lease lapses take seconds in tests.
pub fn fast_relay_options(relay_id: &str, bucket_count: u32) -> dynamo_outbox::RelayOptions {
    use std::time::Duration;
    dynamo_outbox::RelayOptions::default()
        .with_bucket_count(bucket_count)
        .with_relay_id(relay_id)
        .with_poll_interval(Duration::from_millis(100))
        .with_error_backoff(Duration::from_millis(200))
        .with_lease_duration(Duration::from_secs(3))
        .with_lease_renew_interval(Duration::from_millis(1000))
}

/// Every item of a table (scan, all pages).
pub async fn scan_all(
    client: &Client,
    table: &str,
) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let out = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        items.extend(out.items.unwrap_or_default());
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return items,
        }
    }
}

/// Message items left in a table.
pub async fn pending_messages(client: &Client, options: &OutboxOptions) -> usize {
    let prefix = dynamo_outbox::protocol::schema::Keys::new(options).messages_prefix();
    scan_all(client, &options.table_name)
        .await
        .iter()
        .filter(|i| {
            i.get("PK")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|pk| pk.starts_with(&prefix))
        })
        .count()
}

/// The owner of each lease (index = bucket), as the table says now.
pub async fn lease_owners(client: &Client, options: &OutboxOptions) -> Vec<Option<String>> {
    let store = dynamo_outbox::DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let c = store.read_coordination().await.unwrap();
    let now = store.clock().now_ticks();
    (0..options.bucket_count)
        .map(|b| {
            c.lease(b)
                .filter(|l| l.expires_at > now)
                .and_then(|l| l.owner.clone())
        })
        .collect()
}

/// Whether the SDK request an interceptor sees is the DynamoDB operation `name`
/// (`"Query"`, `"UpdateItem"`, ...), from the operation metadata in its config bag.
pub fn operation_is(cfg: &aws_sdk_dynamodb::config::ConfigBag, name: &str) -> bool {
    cfg.load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
        .is_some_and(|m| m.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a bare `cargo test` says about the integration suite: its targets need the
    /// local stack and are built only with the `local-stack` feature, which
    /// `scripts/test.sh` enables once the stack is up; this test says so (ignored, with
    /// the reason) without it, and checks the stack's variables with it.
    #[test]
    #[cfg_attr(
        not(feature = "local-stack"),
        ignore = "the integration tests need the local stack (DynamoDB Local, Apache Kafka, moto): run scripts/test.sh"
    )]
    fn the_local_stack_is_up() {
        for name in ["AWS_ENDPOINT_URL_DYNAMODB", "KAFKA_BOOTSTRAP_SERVERS"] {
            if let Err(e) = try_stack_var(name) {
                panic!("{e}");
            }
        }
    }

    fn record(id: Option<&str>) -> ReadRecord {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        ReadRecord {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            value: None,
            headers: id
                .map(|id| {
                    vec![(
                        dynamo_outbox::publish::DEFAULT_MESSAGE_ID_HEADER.to_string(),
                        Some(b64(id)),
                    )]
                })
                .unwrap_or_default(),
            timestamp: None,
            timestamp_type: None,
            value_len: None,
        }
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_what_kafka_py_prints() {
        let out = concat!(
            r#"{"topic": "t", "partition": 1, "offset": 7, "key": "aw==", "value": null, "#,
            r#""headers": [["n", null], ["x", ""]], "timestamp": 5, "timestamp_type": "create"}"#,
            "\n\n",
            r#"{"topic": "t", "partition": 0, "offset": 0, "key": null, "value": "dg==", "#,
            r#""headers": [], "value_len": 300}"#,
            "\n"
        );
        let records = parse_records(out).unwrap();
        let d = records[0].decoded();
        assert_eq!(
            (d.partition, d.offset, d.key, d.value),
            (1, 7, Some(b"k".to_vec()), None)
        );
        assert_eq!(
            d.headers,
            [("n".to_string(), None), ("x".to_string(), Some(vec![]))]
        );
        assert_eq!(
            (d.timestamp, d.timestamp_type.as_deref()),
            (Some(5), Some("create"))
        );
        assert_eq!(records[1].value_len, Some(300));
        assert!(parse_records("not json")
            .unwrap_err()
            .contains("kafka.py output"));
    }

    #[test]
    fn deliveries_compare_id_sets_not_counts() {
        // One lost and one duplicate: the right count, the wrong set.
        let read = Deliveries::of(&[record(Some("a")), record(Some("a")), record(Some("c"))]);
        let written = set(&["a", "b", "c"]);
        assert_eq!(read.records, written.len());
        assert_eq!(read.missing(&written), set(&["b"]));
        assert_eq!(read.duplicates, BTreeMap::from([("a".to_string(), 2)]));
        let lost = std::panic::catch_unwind(|| read.assert_at_least_once(&written));
        assert!(lost.is_err(), "a lost message fails at-least-once");

        let read = Deliveries::of(&[record(Some("a")), record(Some("b")), record(Some("a"))]);
        let written = set(&["a", "b"]);
        assert_eq!(read.assert_at_least_once(&written), 1);
        let twice = std::panic::catch_unwind(|| read.assert_exactly_once(&written));
        assert!(twice.is_err(), "a duplicate fails exactly-once");

        let read = Deliveries::of(&[record(Some("a")), record(None)]);
        assert_eq!(read.without_id, 1);
        assert!(std::panic::catch_unwind(|| read.assert_at_least_once(&set(&["a"]))).is_err());

        let read = Deliveries::of(&[record(Some("a")), record(Some("z"))]);
        assert_eq!(read.unexpected(&set(&["a"])), set(&["z"]));
        assert!(std::panic::catch_unwind(|| read.assert_exactly_once(&set(&["a"]))).is_err());
        Deliveries::of(&[record(Some("b")), record(Some("a"))])
            .assert_exactly_once(&set(&["a", "b"]));
    }
}
