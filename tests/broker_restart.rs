//! The broker killed with SIGKILL and started again while a relay drains: every message
//! reaches Kafka, in per-key order, and the table ends empty. The broker is one of the
//! test's own (`outbox_testkit::kafka::PrivateKafka`: the stack's Kafka version, its own
//! process and data directory), so that killing it touches no other test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::publish::{env, KafkaConfig, KafkaPublisher};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Relay};
use outbox_testkit::kafka::PrivateKafka;
use outbox_testkit::*;
use tokio::time::Instant;

const MESSAGES: usize = 3_000;
const KEYS: usize = 40;
const BUCKETS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_killed_and_restarted_mid_drain_loses_nothing_and_keeps_key_order() {
    let client = dynamodb().await;
    let options = fresh_table(&client, BUCKETS).await;
    let mut broker = tokio::task::spawn_blocking(PrivateKafka::start)
        .await
        .unwrap()
        .expect("a private broker");
    let bootstrap = broker.bootstrap();
    let topic = random_name("restart");
    try_stack_py(
        "kafka.py",
        &[
            "--bootstrap",
            &bootstrap,
            "create-topic",
            &topic,
            "--partitions",
            "4",
        ],
    )
    .unwrap();

    // The backlog: KEYS keys, each key's messages in the order written.
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut written: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let messages: Vec<_> = (0..MESSAGES)
        .map(|i| {
            let key = format!("customer-{}", i % KEYS);
            let m = writer
                .message(&topic)
                .with_key(key.as_str())
                .with_value(format!("{{\"n\":{i}}}"));
            written
                .entry(key)
                .or_default()
                .push(m.message_id.to_string());
            m
        })
        .collect();
    for chunk in messages.chunks(50) {
        writer.enqueue(chunk).await.unwrap();
    }

    let vars = [(env::BOOTSTRAP_SERVERS, bootstrap.clone())];
    let config = KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    let kafka = KafkaPublisher::connect(config, Instant::now() + Duration::from_secs(30))
        .await
        .unwrap();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay = Relay::new(
        store,
        Arc::new(kafka),
        fast_relay_options("restart", BUCKETS),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        relay
            .run_until_shutdown(
                async {
                    let _ = stopped.await;
                },
                Duration::from_secs(10),
            )
            .await
    });

    // Kill the broker once a tenth of the backlog has left the table.
    let until = Instant::now() + Duration::from_secs(180);
    let mut left = pending_messages(&client, &options).await;
    while left > MESSAGES - MESSAGES / 10 {
        assert!(
            Instant::now() < until,
            "the relay did not start draining: {left} left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = pending_messages(&client, &options).await;
    }
    broker.kill();
    let at_kill = pending_messages(&client, &options).await;
    println!("broker killed with {at_kill} of {MESSAGES} messages left in the table");
    assert!(at_kill > 0, "the kill came after the drain, not during it");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let while_down = pending_messages(&client, &options).await;
    broker = tokio::task::spawn_blocking(move || broker.restart().map(|()| broker))
        .await
        .unwrap()
        .expect("the broker starts again");

    // The rest drains after the restart without anything else restarting.
    let until = Instant::now() + Duration::from_secs(240);
    loop {
        let left = pending_messages(&client, &options).await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{left} messages still in the table 240 s after the broker came back"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = stop.send(());
    let report = run.await.unwrap().unwrap();
    println!("left while the broker was down: {while_down}; {report:?}");

    let out = try_stack_py("kafka.py", &["--bootstrap", &bootstrap, "read", &topic]).unwrap();
    let records = parse_records(&out).unwrap();
    let all: BTreeSet<String> = written.values().flatten().cloned().collect();
    let extra = Deliveries::of(&records).assert_at_least_once(&all);
    // Per key, the first copy of each message in the order the broker holds them is the
    // order written (copies sent again after the restart may follow; none comes first).
    let mut first_seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for r in &records {
        let (Some(key), Some(id)) = (r.key_bytes(), r.message_id()) else {
            panic!("a record without key or id: {r:?}");
        };
        if seen.insert(id.clone()) {
            first_seen
                .entry(String::from_utf8(key).unwrap())
                .or_default()
                .push(id);
        }
    }
    assert_eq!(
        first_seen, written,
        "per-key order broken across the restart"
    );
    println!(
        "{} records for {MESSAGES} messages ({extra} copies sent again), per-key order kept",
        records.len()
    );
    drop(broker);
}
