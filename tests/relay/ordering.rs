//! Per-key order and the table's gaps: a batch delivered in order with its headers, a
//! publish failing in mid-batch, a gap that never fills (probed once and passed) and one
//! that fills late (fetched again, in order).

use super::*;

#[tokio::test]
async fn delivers_in_order_with_headers_and_empties_the_table() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("orders");
    create_topic(&topic, 3);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut sent = Vec::new();
    for n in 0..10u64 {
        let batch: Vec<_> = (0..6)
            .map(|k| keyed(&writer, &topic, &format!("key-{k}"), n))
            .collect();
        writer.enqueue(&batch).await.unwrap();
        sent.extend(batch);
    }
    let (counted, wire) = counted_client().await;
    let relay = relay_with(
        &counted,
        &options,
        kafka_publisher().await,
        fast_relay_options("solo", 4),
    )
    .await;
    let running = spawn(relay);
    wait_until("the table is drained", Duration::from_secs(30), || async {
        pending_messages(&client, &options).await == 0
    })
    .await;
    let report = running.stop().await;

    let records = read_topic(&topic);
    // Each message exactly once on a healthy run: the ids read are the ids written.
    Deliveries::of(&records).assert_exactly_once(&id_set(&sent));
    assert_eq!(records.len(), sent.len());
    assert_per_key_order(&records);
    let by_id: HashMap<String, &OutboxMessage> =
        sent.iter().map(|m| (m.message_id.to_string(), m)).collect();
    for r in &records {
        let m = by_id[&r.message_id().unwrap()];
        assert_eq!(r.key_bytes(), m.key);
        assert_eq!(r.value_bytes(), m.value);
        // the writer's headers in order (the null as null), then the message-id header
        let headers = r.header_list();
        assert_eq!(
            headers,
            [
                ("trace".to_string(), m.headers[0].value.clone()),
                ("nullable".to_string(), None),
                (
                    dynamo_outbox::publish::DEFAULT_MESSAGE_ID_HEADER.to_string(),
                    Some(m.message_id.to_string().into_bytes())
                ),
            ]
        );
        // The Java client's default partitioner.
        assert_eq!(
            r.partition as u32,
            to_positive(murmur2(m.key.as_ref().unwrap())) % 3
        );
    }
    assert_eq!(report.published, sent.len() as u64);
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&wire, "the solo relay");
    assert!(report.released);
    assert_eq!(report.stop_reason, StopReason::Shutdown);
    assert!(
        lease_owners(&client, &options)
            .await
            .iter()
            .all(Option::is_none),
        "leases released"
    );
}

/// Fails once in mid-batch: writes only the first `k` records and reports the rest failed.
#[derive(Debug)]
struct FailOnceMidBatch {
    inner: Arc<KafkaPublisher>,
    k: usize,
    failed: AtomicBool,
}

impl Publisher for FailOnceMidBatch {
    async fn publish(&self, batch: &[StoredMessage]) -> PublishOutcome {
        if batch.len() > self.k && !self.failed.swap(true, Ordering::SeqCst) {
            let prefix = self.inner.publish(&batch[..self.k]).await;
            assert!(prefix.error.is_none());
            return PublishOutcome::new(
                prefix.acknowledged,
                Some(Error::Kafka {
                    message: "injected: connection reset".into(),
                    retryable: true,
                    source: None,
                }),
            );
        }
        self.inner.publish(batch).await
    }
}

#[tokio::test]
async fn a_publish_failure_in_mid_batch_loses_nothing_and_keeps_order() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("midbatch");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut sent = Vec::new();
    for n in 0..20u64 {
        let m = keyed(&writer, &topic, &format!("key-{}", n % 4), n);
        writer.enqueue(std::slice::from_ref(&m)).await.unwrap();
        sent.push(m);
    }
    let publisher = Arc::new(FailOnceMidBatch {
        inner: kafka_publisher().await,
        k: 7,
        failed: AtomicBool::new(false),
    });
    let running = spawn(relay_with(&client, &options, publisher, fast_relay_options("r", 1)).await);
    wait_until("drained", Duration::from_secs(30), || async {
        pending_messages(&client, &options).await == 0
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.publish_failures, 1);
    let records = read_topic(&topic);
    // Each exactly once: the ids read are the ids written, none twice.
    Deliveries::of(&records).assert_exactly_once(&id_set(&sent));
    assert_per_key_order(&records);
    // Message n + 1 never went out ahead of n: within each partition, offsets follow enqueue order.
    let position: HashMap<String, usize> = sent
        .iter()
        .enumerate()
        .map(|(i, m)| (m.message_id.to_string(), i))
        .collect();
    let mut by_partition: BTreeMap<i32, Vec<(i64, usize)>> = BTreeMap::new();
    for r in &records {
        by_partition
            .entry(r.partition)
            .or_default()
            .push((r.offset, position[&r.message_id().unwrap()]));
    }
    for (_, mut v) in by_partition {
        v.sort();
        assert!(
            v.windows(2).all(|w| w[0].1 < w[1].1),
            "partition order follows enqueue order: {v:?}"
        );
    }
}

#[tokio::test]
async fn a_gap_that_never_fills_is_probed_once_and_passed() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // An abandoned reservation: sequence 1 is reserved but never committed.
    let _abandoned = writer
        .transact_write_item(&writer.message("t").with_key("k"))
        .await
        .unwrap();
    writer
        .enqueue(&[writer.message("t").with_key("k").with_value("k:2")])
        .await
        .unwrap();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let fetched = store.fetch(0, None, 500).await.unwrap();
    assert_eq!(
        fetched
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [2]
    );
    assert_eq!((fetched.gap_probes, fetched.fetches), (1, 1));
    // After removing 2, the next fetch starts after it: no probe for the old gap.
    writer
        .enqueue(&[writer.message("t").with_key("k")])
        .await
        .unwrap();
    store
        .delete_messages(0, &[2], Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let fetched = store.fetch(0, Some(2), 500).await.unwrap();
    assert_eq!(
        fetched
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(fetched.gap_probes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_that_fills_late_is_fetched_again_in_order() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let late = writer.message("t").with_key("k").with_value("k:1");
    let late_item = writer.transact_write_item(&late).await.unwrap();
    writer
        .enqueue(&[writer.message("t").with_key("k").with_value("k:2")])
        .await
        .unwrap();

    let commit_client = client.clone();
    let commit = std::sync::Mutex::new(Some(move || {
        // Runs inside the SDK's synchronous hook: commit on a thread of its own and wait.
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    commit_client
                        .transact_write_items()
                        .transact_items(late_item)
                        .send()
                        .await
                        .unwrap();
                })
        })
        .join()
        .unwrap();
    }));
    // Commits the held-back transaction the moment the store's first fetch has been
    // answered, so the message appears in a gap between the fetch and its probe.
    let commit_after_first_query = Fault::on("Query").times(1).after_answer(move |_| {
        if let Some(commit) = commit.lock().unwrap().take() {
            commit();
        }
    });
    let intercepted = faulty_dynamodb(&commit_after_first_query).await;
    let store = DynamoDbOutboxStore::new(intercepted, options.clone()).unwrap();
    let fetched = store.fetch(0, None, 500).await.unwrap();
    assert_eq!(
        fetched
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [1, 2],
        "the late message comes first"
    );
    assert_eq!(fetched.fetches, 2, "fetched again after the gap filled");
    assert_eq!(fetched.messages[0].message.message_id, late.message_id);
}
