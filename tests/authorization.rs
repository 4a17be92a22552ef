//! An authorization failure is retried, never treated as poison: against the stack's
//! Apache Kafka (StandardAuthorizer, `allow.everyone.if.no.acl.found=false`), a relay that
//! authenticates with SCRAM-SHA-512 as `nogrant` (no ACL) on a topic nobody granted it,
//! under each poison policy (`block`, the default, and `quarantine-after=1`, which would
//! move a poison head aside at its first attempt):
//!
//! 1. no grant: the brokers refuse the topic's metadata (`DESCRIBE`);
//! 2. `DESCRIBE` granted, not `WRITE`: they refuse the produce;
//!
//! and in both, nothing is published, nothing leaves the table (no delete, no dead letter,
//! no bucket parked, nothing quarantined), and the log line, the EMF document and the run's
//! report name the failure, the topic and the principal. Then the operator grants
//! `WRITE` and `DESCRIBE`: the same run, without a restart, drains the backlog, each key's
//! messages in their order, and the table ends empty.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dynamo_outbox::dead_letters::{self, Filter};
use dynamo_outbox::error::{AuthorizationFailure, NotAuthorized};
use dynamo_outbox::metrics::emf::{EmfMetrics, NOT_AUTHORIZED_MEMBER};
use dynamo_outbox::metrics::RelayMetrics;
use dynamo_outbox::options::PoisonPolicy;
use dynamo_outbox::publish::{env, KafkaConfig, KafkaPublisher};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, OutboxMessage, Relay};
use outbox_testkit::kafka::{grant_topic, SecureListeners};
use outbox_testkit::*;
use tokio::time::Instant;

/// Generous: a loaded two-core machine runs the stack and other tests at once.
const WAIT: Duration = Duration::from_secs(90);
/// Refusals each bucket with messages must see in a stage before the next: more than
/// `quarantine-after=1` would need to move a poison head aside.
const REFUSALS_PER_STAGE: usize = 3;

/// The log lines of this test binary (every test's relays, filtered by topic).
fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| Captured::install_global("warn"))
}

/// What the relay reports, watched while it runs, and passed on to the EMF metrics of a
/// Lambda relay.
#[derive(Debug)]
struct Watch {
    emf: EmfMetrics,
    denied: Mutex<Vec<(u32, NotAuthorized)>>,
    poison: Mutex<u64>,
    quarantined: Mutex<u64>,
    rejected: Mutex<u64>,
}

impl Watch {
    fn new(table: &str) -> Self {
        Watch {
            emf: EmfMetrics::new("Outbox", "outbox-relay", table),
            denied: Mutex::default(),
            poison: Mutex::default(),
            quarantined: Mutex::default(),
            rejected: Mutex::default(),
        }
    }

    /// How many refusals of `operation` each bucket saw.
    fn refusals(&self, operation: &str) -> BTreeMap<u32, usize> {
        let mut by_bucket = BTreeMap::new();
        for (bucket, d) in self.denied.lock().unwrap().iter() {
            if d.operation == operation {
                *by_bucket.entry(*bucket).or_default() += 1;
            }
        }
        by_bucket
    }
}

impl RelayMetrics for Watch {
    fn published(&self, bucket: u32, count: u64) {
        self.emf.published(bucket, count);
    }
    fn publish_failed(&self, bucket: u32, permanent: bool) {
        *self.rejected.lock().unwrap() += u64::from(permanent);
        self.emf.publish_failed(bucket, permanent);
    }
    fn publish_not_authorized(&self, bucket: u32, denied: &NotAuthorized) {
        self.denied.lock().unwrap().push((bucket, denied.clone()));
        self.emf.publish_not_authorized(bucket, denied);
    }
    fn poison_item(&self, bucket: u32) {
        *self.poison.lock().unwrap() += 1;
        self.emf.poison_item(bucket);
    }
    fn quarantined(&self, bucket: u32) {
        *self.quarantined.lock().unwrap() += 1;
        self.emf.quarantined(bucket);
    }
}

/// `KAFKA_AUTH=scram-sha-512` as the principal with no grant, to the SASL_SSL listener,
/// trusting the stack's CA: the configuration as the relay reads it from its environment.
fn nogrant_config(listeners: &SecureListeners) -> KafkaConfig {
    let vars = [
        (env::BOOTSTRAP_SERVERS, listeners.sasl_ssl.clone()),
        (env::AUTH, "scram-sha-512".to_owned()),
        (env::SASL_USERNAME, listeners.nogrant_user.clone()),
        (env::SASL_PASSWORD, listeners.nogrant_password.clone()),
        (env::TLS_CA_FILE, listeners.ca_file.display().to_string()),
    ];
    KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("a valid configuration")
}

/// Waits until `done` holds, at most [`WAIT`]; panics naming `what` and the last `state`.
async fn wait_until<T: std::fmt::Debug>(what: &str, mut state: impl FnMut() -> (bool, T)) {
    let until = Instant::now() + WAIT;
    loop {
        let (done, seen) = state();
        if done {
            return;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Nothing published, nothing out of the table: every message still pending, no dead
/// letter, no poison head, nothing quarantined, no record in the topic.
async fn nothing_moved(
    what: &str,
    client: &aws_sdk_dynamodb::Client,
    store: &DynamoDbOutboxStore,
    topic: &str,
    written: usize,
    watch: &Watch,
) {
    assert_eq!(
        pending_messages(client, store.options()).await,
        written,
        "{what}: every message is still in the table"
    );
    let (dead, _) = dead_letters::list(store, &Filter::default(), 10)
        .await
        .unwrap();
    assert!(dead.is_empty(), "{what}: dead letters {dead:?}");
    assert_eq!(*watch.poison.lock().unwrap(), 0, "{what}: a bucket parked");
    assert_eq!(*watch.quarantined.lock().unwrap(), 0, "{what}: quarantined");
    assert_eq!(
        *watch.rejected.lock().unwrap(),
        0,
        "{what}: rejected for good"
    );
    let t = topic.to_owned();
    let read = tokio::task::spawn_blocking(move || read_topic(&t))
        .await
        .unwrap();
    assert!(read.is_empty(), "{what}: the topic got records: {read:?}");
}

/// Waits until every bucket in `buckets` saw [`REFUSALS_PER_STAGE`] refusals of
/// `operation`, each naming the failure, the topic and the principal.
async fn refused_in_every_bucket(
    watch: &Watch,
    buckets: &BTreeSet<u32>,
    operation: &'static str,
    topic: &str,
) {
    wait_until(
        &format!("{REFUSALS_PER_STAGE} refusals of {operation} in each of the buckets {buckets:?}"),
        || {
            let seen = watch.refusals(operation);
            let done = buckets
                .iter()
                .all(|b| seen.get(b).copied().unwrap_or(0) >= REFUSALS_PER_STAGE);
            (done, seen)
        },
    )
    .await;
    let expected = NotAuthorized::new(
        topic,
        "User:nogrant",
        operation,
        AuthorizationFailure::Topic,
    );
    for (bucket, d) in watch.denied.lock().unwrap().iter() {
        assert!(buckets.contains(bucket), "{bucket}: {d:?}");
        if d.operation == operation {
            assert_eq!(d, &expected);
        }
    }
}

/// The whole story under `policy`: refused without a grant, refused with `DESCRIBE`
/// only, drained in per-key order after the grant, in one run of one relay.
async fn refused_then_drained_after_the_grant(policy: PoisonPolicy) {
    let logs = logs();
    let listeners = SecureListeners::from_stack();
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("unauthorized");
    let t = topic.clone();
    tokio::task::spawn_blocking(move || create_topic(&t, 2))
        .await
        .unwrap();

    // Several keys, interleaved over four commits: each key's order is its commits' order.
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let keys: Vec<String> = (0..6).map(|k| format!("customer-{k}")).collect();
    let mut written: Vec<OutboxMessage> = Vec::new();
    for round in 0..4 {
        let commit: Vec<OutboxMessage> = keys
            .iter()
            .map(|k| {
                writer
                    .message(&topic)
                    .with_key(k.as_str())
                    .with_value(format!("{k} #{round}"))
            })
            .collect();
        writer.enqueue(&commit).await.unwrap();
        written.extend(commit);
    }
    let buckets: BTreeSet<u32> = written.iter().map(OutboxMessage::bucket).collect();
    let all_ids = id_set(&written);

    let publisher = KafkaPublisher::connect(nogrant_config(&listeners), Instant::now() + WAIT)
        .await
        .expect("nogrant may connect: it is authorized for nothing, not unauthenticated");
    assert_eq!(publisher.principal(), "User:nogrant");
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let watch = Arc::new(Watch::new(&options.table_name));
    let relay = Relay::new(
        store.clone(),
        Arc::new(publisher),
        fast_relay_options(&random_name("relay"), 4).with_poison_policy(policy),
    )
    .unwrap()
    .with_metrics(watch.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        relay
            .run_until_shutdown(
                async move {
                    let _ = stopped.await;
                },
                Duration::from_secs(10),
            )
            .await
    });

    // 1. No grant: the topic's metadata is refused, again and again, and nothing moves.
    refused_in_every_bucket(&watch, &buckets, "DESCRIBE", &topic).await;
    nothing_moved("no grant", &client, &store, &topic, written.len(), &watch).await;

    // 2. DESCRIBE only: the produce is refused.
    let bootstrap = stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let args = [
        "grant",
        "--bootstrap",
        bootstrap.as_str(),
        "--principal",
        "User:nogrant",
        "--topic",
        topic.as_str(),
        "--operation",
        "DESCRIBE",
    ]
    .map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        try_stack_py("kafka_broker.py", &args)
    })
    .await
    .unwrap()
    .expect("grant DESCRIBE");
    refused_in_every_bucket(&watch, &buckets, "WRITE", &topic).await;
    nothing_moved(
        "DESCRIBE only",
        &client,
        &store,
        &topic,
        written.len(),
        &watch,
    )
    .await;

    // 3. The operator grants WRITE and DESCRIBE: the same run drains the backlog.
    let t = topic.clone();
    tokio::task::spawn_blocking(move || grant_topic("User:nogrant", &t))
        .await
        .unwrap()
        .expect("grant WRITE and DESCRIBE");
    let delivered = wait_for_ids(&topic, &all_ids, WAIT).await;
    delivered.assert_at_least_once(&all_ids);
    let until = Instant::now() + WAIT;
    loop {
        let pending = pending_messages(&client, &options).await;
        if pending == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{pending} messages left in the table"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send(()).unwrap();
    let report = run.await.unwrap().unwrap();

    // Each key's messages in their order (the first copy of each, should a lost delete
    // have sent one again).
    let t = topic.clone();
    let mut records = tokio::task::spawn_blocking(move || read_topic(&t))
        .await
        .unwrap();
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut seen = BTreeSet::new();
    let mut by_key: BTreeMap<Vec<u8>, Vec<String>> = BTreeMap::new();
    for r in &records {
        let id = r.message_id().expect("every record carries its id");
        if seen.insert(id.clone()) {
            by_key.entry(r.key_bytes().unwrap()).or_default().push(id);
        }
    }
    for key in &keys {
        let order: Vec<String> = written
            .iter()
            .filter(|m| m.key.as_deref() == Some(key.as_bytes()))
            .map(|m| m.message_id.to_string())
            .collect();
        assert_eq!(by_key[key.as_bytes()], order, "{key}: per-key order");
    }

    // Nothing went aside on the way: no dead letter, nothing quarantined, nothing left.
    assert_eq!(pending_messages(&client, &options).await, 0);
    let (dead, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
    assert_eq!(*watch.poison.lock().unwrap(), 0);
    assert_eq!(*watch.quarantined.lock().unwrap(), 0);
    let refusals = watch.denied.lock().unwrap().len() as u64;
    assert_eq!(report.quarantined, 0, "{report:?}");
    assert_eq!(report.not_authorized, refusals, "{report:?}");
    assert!(report.publish_failures >= refusals, "{report:?}");
    assert_eq!(report.published, written.len() as u64, "{report:?}");

    // The log names the failure, the topic, the principal and the operation refused, and
    // says nothing of poison or quarantine for this topic.
    let text = logs.text();
    let mine: Vec<&str> = text.lines().filter(|l| l.contains(&topic)).collect();
    let refused: Vec<&&str> = mine
        .iter()
        .filter(|l| l.contains("publish not authorized"))
        .collect();
    for operation in ["DESCRIBE", "WRITE"] {
        let line = refused
            .iter()
            .find(|l| l.contains(&format!("operation=\"{operation}\"")))
            .unwrap_or_else(|| panic!("no refusal of {operation} in the log:\n{text}"));
        assert!(
            line.contains("failure=TOPIC_AUTHORIZATION_FAILED")
                && line.contains(&format!("topic={topic}"))
                && line.contains("principal=User:nogrant"),
            "{line}"
        );
    }
    assert!(
        !mine
            .iter()
            .any(|l| l.contains("cannot publish") || l.contains("quarantine")),
        "poison or quarantine lines for {topic}:\n{}",
        mine.join("\n")
    );

    // The EMF document counts the refusals as failed publishes (never rejected ones, no
    // poison) and names each: failure, topic, principal, operation.
    let docs: Vec<serde_json::Value> = watch
        .emf
        .flush()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let sum = |name: &str| -> u64 { docs.iter().filter_map(|d| d[name].as_u64()).sum() };
    assert_eq!(sum("PublishNotAuthorized"), refusals);
    assert!(sum("PublishFailures") >= refusals);
    assert_eq!(
        (
            sum("PublishRejected"),
            sum("PoisonItems"),
            sum("QuarantinedItems")
        ),
        (0, 0, 0)
    );
    let named: Vec<&serde_json::Value> = docs
        .iter()
        .filter_map(|d| d[NOT_AUTHORIZED_MEMBER].as_array())
        .flatten()
        .collect();
    let mut counted = 0;
    for operation in ["DESCRIBE", "WRITE"] {
        let entry = named
            .iter()
            .find(|e| e["Operation"] == operation)
            .unwrap_or_else(|| panic!("{operation} not named: {named:?}"));
        assert_eq!(entry["Failure"], "TOPIC_AUTHORIZATION_FAILED");
        assert_eq!(entry["Topic"], topic.as_str());
        assert_eq!(entry["Principal"], "User:nogrant");
        counted += entry["Count"].as_u64().unwrap();
    }
    assert_eq!(counted, refusals, "{named:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_topic_is_retried_not_parked_and_drains_after_the_grant() {
    refused_then_drained_after_the_grant(PoisonPolicy::Block).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_topic_is_never_quarantined_and_drains_after_the_grant() {
    refused_then_drained_after_the_grant(PoisonPolicy::QuarantineAfter(1)).await;
}
