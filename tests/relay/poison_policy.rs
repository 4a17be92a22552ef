//! `OUTBOX_POISON_POLICY=quarantine-after=N`: the relay that owns a bucket parked behind a
//! poison item moves it to the dead-letter partition after N attempts, counts it
//! (`QuarantinedItems` in the EMF output) and goes on with the bucket; no conditional
//! write is refused on the way.

use super::*;
use dynamo_outbox::dead_letters::{self, Filter};
use dynamo_outbox::metrics::emf::EmfMetrics;
use dynamo_outbox::options::{PoisonPolicy, TopicAllowList};

#[tokio::test]
async fn quarantine_after_n_attempts_moves_the_poison_head_aside_and_the_bucket_goes_on() {
    let (client, counter) = counted_client().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("orders");
    create_topic(&topic, 1);
    // A writer without the allow-list (direct PutItem rights) puts a message on a topic the
    // relay refuses between two allowed ones of the same key.
    let direct = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let msg = |t: &str, v: &str| {
        direct
            .message(t)
            .with_partition(0)
            .with_key("k")
            .with_value(v.to_string())
    };
    let before = msg(&topic, "before");
    let bad = msg("audit", "not for Kafka");
    let after = msg(&topic, "after");
    let placed = direct
        .enqueue(&[before.clone(), bad.clone(), after.clone()])
        .await
        .unwrap();
    let bad_seq = placed[1].sequence;

    let list = TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", &topic).unwrap();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone().with_allowed_topics(list))
        .unwrap();
    let metrics = Arc::new(EmfMetrics::new("Outbox", "test", &options.table_name));
    let relay = Relay::new(
        store.clone(),
        kafka_publisher().await,
        fast_relay_options(&random_name("relay"), 2)
            .with_poison_policy(PoisonPolicy::QuarantineAfter(3)),
    )
    .unwrap()
    .with_metrics(metrics.clone());
    let started = Instant::now();
    let run = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(8))
            .await
    });
    // The bucket goes on: the message behind the poison item arrives.
    let delivered = wait_for_ids(&topic, &id_set([&before, &after]), Duration::from_secs(20)).await;
    let took = started.elapsed();
    let report = run.await.unwrap().unwrap();

    delivered.assert_exactly_once(&id_set([&before, &after]));
    assert_eq!(report.quarantined, 1, "{report:?}");
    assert_eq!(report.published, 2, "{report:?}");
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&counter, "quarantine-after");
    // Not before its third attempt: the head alone is retried every renew interval (1 s).
    assert!(took >= Duration::from_secs(2), "{took:?}");

    // The item is in the dead-letter partition, whole, with when and why.
    let (dead, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!((d.bucket, d.sequence), (Some(0), Some(bad_seq)));
    assert_eq!(d.message.as_ref().unwrap(), &bad);
    let reason = d.reason.as_deref().unwrap();
    assert!(
        reason.contains("topic \"audit\" is not allowed here")
            && reason.contains("after 3 attempt(s), quarantine-after=3"),
        "{reason}"
    );
    assert!(d.quarantined_at.is_some());
    assert_eq!(pending_messages(&client, &options).await, 0);

    // Counted: three poison attempts, one quarantined item.
    let (docs, sum) = flushed_sums(&metrics);
    assert_eq!(sum("QuarantinedItems"), 1, "{docs:?}");
    assert_eq!(sum("PoisonItems"), 3, "{docs:?}");
    assert_eq!(sum("Published"), 2, "{docs:?}");
}

/// A broker that is down or slow is not a poison item, whatever the policy: with
/// `quarantine-after=1`, a relay whose broker refuses connections, then holds every byte,
/// moves nothing to the dead-letter partition, keeps every message in the table, and
/// publishes them all once the broker answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_is_down_or_slow_quarantines_nothing_under_quarantine_after_1() {
    let (client, counter) = counted_client().await;
    let options = fresh_table(&client, 2).await;
    let broker = outbox_harness::broker::ProxiedBroker::start()
        .await
        .expect("the stack's broker behind the fault proxy");
    let topic = random_name("down");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let messages: Vec<_> = (0..6)
        .map(|i| {
            writer
                .message(&topic)
                .with_key(format!("k{}", i % 3))
                .with_value(format!("v{i}"))
        })
        .collect();
    writer.enqueue(&messages).await.unwrap();

    // Down from the start: every connection refused.
    broker.proxy.refuse();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let kafka = dynamo_outbox::publish::KafkaConfig::new([broker.bootstrap()]);
    let relay = Relay::new(
        store.clone(),
        Arc::new(dynamo_outbox::publish::LazyKafkaPublisher::new(kafka)),
        fast_relay_options(&random_name("relay"), 2)
            .with_poison_policy(PoisonPolicy::QuarantineAfter(1)),
    )
    .unwrap();
    let run = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(30))
            .await
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Then slow: connections accepted, every byte held.
    broker.proxy.pass();
    broker.proxy.stall();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (dead, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert!(
        dead.is_empty(),
        "quarantined while the broker was down or slow: {dead:?}"
    );
    assert_eq!(pending_messages(&client, &options).await, 6);

    // Back: everything is published, nothing was moved aside.
    broker.proxy.pass();
    let delivered = wait_for_ids(&topic, &id_set(&messages), Duration::from_secs(25)).await;
    delivered.assert_exactly_once(&id_set(&messages));
    let report = run.await.unwrap().unwrap();
    assert!(report.publish_failures > 0, "{report:?}");
    assert_eq!(report.quarantined, 0, "{report:?}");
    let (dead, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
    assert_eq!(pending_messages(&client, &options).await, 0);
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(
        &counter,
        "a broker down, then slow, under quarantine-after=1",
    );
}

/// Under the default policy (`block`), a record that names a partition its topic does not
/// have, and one larger than the topic's `max.message.bytes`, are moved to the dead-letter
/// partition at once, with the reason: the other messages of their bucket go out in order,
/// and each move is counted (`QuarantinedItems`). Written by a library writer; the enqueue
/// API writes the same items, and the relay is what enforces it.
#[tokio::test]
async fn an_unknown_partition_or_an_oversized_record_is_dead_lettered_at_once_under_block() {
    let (client, counter) = counted_client().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("orders");
    // two partitions, records of at most 2000 bytes
    create_topic_with_config(&topic, 2, &[("max.message.bytes", "2000")]);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // Every message in bucket 1: partition 1, and partition 7 (the topic's count + 5).
    let msg = |partition: i32, value: String| {
        writer
            .message(&topic)
            .with_partition(partition)
            .with_key("k")
            .with_value(value)
    };
    let one = msg(1, "one".into());
    let no_such_partition = msg(7, "for partition 7".into());
    let two = msg(1, "two".into());
    let too_large = msg(1, "x".repeat(10_000));
    let three = msg(1, "three".into());
    let placed = writer
        .enqueue(&[
            one.clone(),
            no_such_partition.clone(),
            two.clone(),
            too_large.clone(),
            three.clone(),
        ])
        .await
        .unwrap();
    assert!(placed.iter().all(|p| p.bucket == 1), "{placed:?}");

    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let metrics = Arc::new(EmfMetrics::new("Outbox", "test", &options.table_name));
    let relay_options = fast_relay_options(&random_name("relay"), 2);
    assert_eq!(relay_options.poison_policy, PoisonPolicy::Block);
    let relay = Relay::new(store.clone(), kafka_publisher().await, relay_options)
        .unwrap()
        .with_metrics(metrics.clone());
    let run = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(8))
            .await
    });
    let good = id_set([&one, &two, &three]);
    let delivered = wait_for_ids(&topic, &good, Duration::from_secs(30)).await;
    let report = run.await.unwrap().unwrap();
    delivered.assert_exactly_once(&good);
    // in order, on partition 1
    let order: Vec<String> = read_topic(&topic)
        .iter()
        .filter(|r| r.partition == 1)
        .filter_map(ReadRecord::message_id)
        .collect();
    assert_eq!(
        order,
        [&one, &two, &three].map(|m| m.message_id.to_string())
    );
    assert_eq!(report.published, 3, "{report:?}");
    assert_eq!(report.quarantined, 2, "{report:?}");
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&counter, "unpublishable records");
    assert_eq!(pending_messages(&client, &options).await, 0);

    // Both are dead letters, whole, with the reason.
    let (dead, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (d, m, placed, why) in [
        (
            &dead[0],
            &no_such_partition,
            &placed[1],
            "unknown partition",
        ),
        (&dead[1], &too_large, &placed[3], "record too large"),
    ] {
        assert_eq!((d.bucket, d.sequence), (Some(1), Some(placed.sequence)));
        assert_eq!(d.message.as_ref().unwrap(), m);
        let reason = d.reason.as_deref().unwrap();
        assert!(
            reason.starts_with(&format!("unpublishable ({why})"))
                && reason.contains("moved at once under every poison policy"),
            "{reason}"
        );
    }
    // Counted: each a poison item once, and quarantined.
    let (docs, sum) = flushed_sums(&metrics);
    assert_eq!(sum("QuarantinedItems"), 2, "{docs:?}");
    assert_eq!(sum("PoisonItems"), 2, "{docs:?}");
}

/// The EMF documents `metrics` flushes, and a sum of one metric over them.
fn flushed_sums(metrics: &EmfMetrics) -> (Vec<String>, impl Fn(&str) -> u64) {
    let docs = metrics.flush_at(1_764_500_000_000);
    let values: Vec<serde_json::Value> = docs
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let sum = move |name: &str| -> u64 { values.iter().filter_map(|v| v[name].as_u64()).sum() };
    (docs, sum)
}
