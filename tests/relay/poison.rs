//! Trouble confined to its bucket: a message stamped with another bucket count, a poison
//! item until it is quarantined, a stalled batch, a record the broker rejects for good.

use super::*;

#[tokio::test]
async fn a_message_stamped_with_another_bucket_count_faults_the_relay_and_stays() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let other =
        DynamoDbOutboxWriter::new(client.clone(), options.clone().with_bucket_count(8)).unwrap();
    other
        .enqueue(&[other.message("t").with_key("k")])
        .await
        .unwrap();
    let relay = relay_with(
        &client,
        &options,
        kafka_publisher().await,
        fast_relay_options("r", 4),
    )
    .await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        relay.run_until(Instant::now() + Duration::from_secs(15)),
    )
    .await
    .expect("the relay stops on its own");
    let err = result.unwrap_err();
    assert!(matches!(err, Error::Misconfiguration { .. }), "{err}");
    assert!(
        err.to_string().contains("stamped with bucket count 8"),
        "{err}"
    );
    assert_eq!(
        pending_messages(&client, &options).await,
        1,
        "nothing deleted"
    );
    // And a relay whose own count differs from the store's refuses to start.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let err = Relay::new(store, kafka_publisher().await, fast_relay_options("r", 8)).unwrap_err();
    assert!(matches!(err, Error::Misconfiguration { .. }));
}

#[derive(Debug, Default)]
struct PoisonCounter(AtomicUsize);

impl dynamo_outbox::metrics::RelayMetrics for PoisonCounter {
    fn poison_item(&self, _bucket: u32) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs relay "r" over the 2 buckets of `options` for `run`; its report, and how often it
/// reported a poison item.
async fn run_counting_poison(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    run: Duration,
) -> (RunReport, usize) {
    let metrics = Arc::new(PoisonCounter::default());
    let relay = relay_with(
        client,
        options,
        kafka_publisher().await,
        fast_relay_options("r", 2),
    )
    .await
    .with_metrics(metrics.clone());
    let report = relay.run_until(Instant::now() + run).await.unwrap();
    (report, metrics.0.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_poison_item_stops_only_its_bucket_until_it_is_quarantined() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("poison");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let keys = dynamo_outbox::protocol::schema::Keys::new(&options);
    // Bucket 0: an item without MessageId at sequence 1, then a good message.
    client
        .put_item()
        .table_name(&options.table_name)
        .item(
            "PK",
            aws_sdk_dynamodb::types::AttributeValue::S(keys.message_pk(0)),
        )
        .item(
            "SK",
            aws_sdk_dynamodb::types::AttributeValue::S(
                dynamo_outbox::protocol::schema::message_sk(1),
            ),
        )
        .item(
            "Topic",
            aws_sdk_dynamodb::types::AttributeValue::S(topic.clone()),
        )
        .send()
        .await
        .unwrap();
    client
        .update_item()
        .table_name(&options.table_name)
        .key(
            "PK",
            aws_sdk_dynamodb::types::AttributeValue::S(keys.sequence_pk(0)),
        )
        .key(
            "SK",
            aws_sdk_dynamodb::types::AttributeValue::S(
                dynamo_outbox::protocol::schema::SEQUENCE_SK.into(),
            ),
        )
        .update_expression("SET #s = :one")
        .expression_attribute_names("#s", "Sequence")
        .expression_attribute_values(
            ":one",
            aws_sdk_dynamodb::types::AttributeValue::N("1".into()),
        )
        .send()
        .await
        .unwrap();
    let stuck = writer
        .message(&topic)
        .with_partition(0)
        .with_value("after the poison");
    let fine = writer
        .message(&topic)
        .with_partition(1)
        .with_value("other bucket");
    writer
        .enqueue(&[stuck.clone(), fine.clone()])
        .await
        .unwrap();

    let (report, poison_reports) =
        run_counting_poison(&client, &options, Duration::from_secs(4)).await;
    assert_eq!(report.published, 1, "the other bucket went on");
    assert_eq!(report.stop_reason, StopReason::Deadline, "no crash loop");
    assert!(poison_reports >= 1, "the poison item is reported");
    let ids: Vec<String> = read_topic(&topic)
        .iter()
        .filter_map(ReadRecord::message_id)
        .collect();
    assert_eq!(ids, [fine.message_id.to_string()]);
    assert_eq!(
        pending_messages(&client, &options).await,
        2,
        "nothing dropped silently"
    );

    // The operator moves it aside; the bucket resumes.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    store.quarantine(0, 1).await.unwrap();
    let dead = store.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0][dynamo_outbox::protocol::store::ORIGINAL_SK]
            .as_s()
            .unwrap(),
        &dynamo_outbox::protocol::schema::message_sk(1)
    );
    let relay = relay_with(
        &client,
        &options,
        kafka_publisher().await,
        fast_relay_options("r", 2),
    )
    .await;
    let report = relay
        .run_until(Instant::now() + Duration::from_secs(4))
        .await
        .unwrap();
    assert_eq!(report.published, 1);
    assert_eq!(pending_messages(&client, &options).await, 0);
    let err = store.quarantine(0, 1).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("no message item at bucket 0, sequence 1"),
        "{err}"
    );
}

/// Stalls the whole (current-thread) runtime once, like a SIGSTOP in the middle of a batch.
#[derive(Debug)]
struct StallOnce {
    inner: Arc<KafkaPublisher>,
    stalled: AtomicBool,
}

impl Publisher for StallOnce {
    async fn publish(&self, batch: &[StoredMessage]) -> PublishOutcome {
        let outcome = self.inner.publish(batch).await;
        if !self.stalled.swap(true, Ordering::SeqCst) {
            // After the broker's ack, before the relay hears of it.
            std::thread::sleep(Duration::from_millis(2500));
        }
        outcome
    }
}

#[tokio::test]
async fn one_stalled_batch_does_not_stop_later_batches() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("stall");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let first = keyed(&writer, &topic, "k", 1);
    writer.enqueue(std::slice::from_ref(&first)).await.unwrap();
    let publisher = Arc::new(StallOnce {
        inner: kafka_publisher().await,
        stalled: AtomicBool::new(false),
    });
    let running = spawn(relay_with(&client, &options, publisher, fast_relay_options("r", 1)).await);
    wait_for_ids(&topic, &id_set([&first]), Duration::from_secs(15)).await;
    // The batch took longer than the renew interval; later batches still run.
    let mut sent = vec![first];
    for n in 2..=4 {
        let m = keyed(&writer, &topic, "k", n);
        writer.enqueue(std::slice::from_ref(&m)).await.unwrap();
        sent.push(m);
    }
    // Distinct ids, not records: a second copy of the stalled batch is no later message.
    let read = wait_for_ids(&topic, &id_set(&sent), Duration::from_secs(10)).await;
    running.stop().await;
    let copies = read.assert_at_least_once(&id_set(&sent));
    println!(
        "after one stalled batch: {} messages, {copies} extra copies {:?}",
        sent.len(),
        read.duplicates
    );
}

#[tokio::test]
async fn a_record_the_broker_rejects_for_good_stops_only_its_bucket() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("good");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // Bucket 0: a record for a topic that does not exist (and is not auto-created).
    let rejected = writer
        .message(random_name("missing-topic"))
        .with_partition(0);
    let behind = writer
        .message(&topic)
        .with_partition(0)
        .with_value("behind it");
    let fine = writer
        .message(&topic)
        .with_partition(1)
        .with_value("other bucket");
    writer
        .enqueue(&[rejected.clone(), behind.clone(), fine.clone()])
        .await
        .unwrap();
    let (report, poison_reports) =
        run_counting_poison(&client, &options, Duration::from_secs(5)).await;
    assert_eq!(report.published, 1, "{report:?}");
    assert!(poison_reports >= 1, "the rejected record is reported");
    let ids: Vec<String> = read_topic(&topic)
        .iter()
        .filter_map(ReadRecord::message_id)
        .collect();
    assert_eq!(
        ids,
        [fine.message_id.to_string()],
        "nothing overtook the rejected record"
    );
    assert_eq!(pending_messages(&client, &options).await, 2);
    // Quarantined, the bucket resumes in order.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let head = store.backlog(0).await.unwrap().head_sequence.unwrap();
    store.quarantine(0, head).await.unwrap();
    let relay = relay_with(
        &client,
        &options,
        kafka_publisher().await,
        fast_relay_options("r", 2),
    )
    .await;
    relay
        .run_until(Instant::now() + Duration::from_secs(4))
        .await
        .unwrap();
    // Every message of the topic arrived: the one of the other bucket and the one that
    // waited behind the rejected record (which went to no topic of its own).
    let copies = topic_deliveries(&topic).assert_at_least_once(&id_set([&fine, &behind]));
    assert_eq!(copies, 0, "nothing went out twice on a healthy run");
    assert_eq!(pending_messages(&client, &options).await, 0);
}
