//! Heartbeat records: a stopped relay's record deleted one lease duration later, records
//! of relays silent for ten lease durations cleaned up, odd records cleaned and a retried
//! cleanup done, not refused.

use std::collections::BTreeSet;

use dynamo_outbox::accounting::RequestCounter;
use dynamo_outbox::protocol::store::WriteKind;

use super::*;

#[tokio::test]
async fn a_stopped_relays_heartbeat_record_is_deleted_one_lease_duration_later() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let a = spawn_fast(&counted, &options, &publisher, "a", 2).await;
    let z = spawn_fast(&counted, &options, &publisher, "z", 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = z.stop().await;
    assert!(report.released);
    let stopped = Instant::now();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let record = store
        .read_coordination()
        .await
        .unwrap()
        .relays
        .into_iter()
        .find(|r| r.relay_id == "z");
    assert!(record
        .expect("the stop stamps the record, it does not delete it")
        .stopped_at
        .is_some());
    wait_until("z's record is gone", Duration::from_secs(10), || async {
        !store
            .read_coordination()
            .await
            .unwrap()
            .relays
            .iter()
            .any(|r| r.relay_id == "z")
    })
    .await;
    assert!(
        stopped.elapsed() >= Duration::from_millis(2500),
        "deleted before a lease duration passed"
    );
    assert_eq!(a.stop().await.refused_total(), 0);
    // The stop's stamp, the release and a's cleanup of z's record: none refused.
    assert_no_refusal_on_the_wire(&wire, "a stop and the cleanup of its record");
}

/// A running relay deletes the heartbeat records of relays silent for ten lease durations
/// and of relays stopped a lease duration ago, and keeps a record silent for less (it may
/// be a relay paused for a while that comes back).
#[tokio::test]
async fn a_relay_cleans_up_records_of_relays_silent_for_ten_lease_durations() {
    let (client, wire) = counted_client().await;
    let options = fresh_table(&client, 1).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay_options = fast_relay_options("a-cleaner", 1);
    let lease = relay_options.lease_duration.as_secs() as i64 * TICKS_PER_SECOND;
    let now = store.clock().now_ticks();
    assert!(store
        .heartbeat("silent-11", now - 11 * lease, None)
        .await
        .unwrap());
    assert!(store
        .heartbeat("silent-9", now - 9 * lease, None)
        .await
        .unwrap());
    assert!(store
        .heartbeat("stopped", now - 3 * lease, None)
        .await
        .unwrap());
    assert!(store
        .stamp_stopped("stopped", now - 2 * lease)
        .await
        .unwrap());
    let records = |c: dynamo_outbox::protocol::coordination::Coordination| -> Vec<String> {
        c.relays.into_iter().map(|r| r.relay_id).collect()
    };
    assert_eq!(
        records(store.read_coordination().await.unwrap()),
        ["silent-11", "silent-9", "stopped"]
    );

    let relay = Relay::new(
        DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap(),
        kafka_publisher().await,
        relay_options,
    )
    .unwrap();
    let running = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(30))
            .await
    });
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let left = records(store.read_coordination().await.unwrap());
        if left == ["a-cleaner", "silent-9"] {
            break;
        }
        assert!(Instant::now() < until, "records left: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.abort();
    assert_no_refusal_on_the_wire(&wire, "the cleanup");
}

/// The ids of the heartbeat records in the table now.
async fn relay_records(store: &DynamoDbOutboxStore) -> BTreeSet<String> {
    store
        .read_coordination()
        .await
        .unwrap()
        .relays
        .into_iter()
        .map(|r| r.relay_id)
        .collect()
}

/// Heartbeat records without a numeric `LastSeenUtc` (another implementation's
/// stop stamp before its first heartbeat, a bare record, a string) are deleted on
/// purpose by the cleaning relay, none refused; and an SDK retry of a cleanup whose
/// first attempt landed is done, not refused.
#[tokio::test]
async fn odd_heartbeat_records_are_cleaned_and_a_retried_cleanup_is_done_not_refused() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay_options = fast_relay_options("a-cleaner", 2);
    let lease = TICKS_PER_SECOND * relay_options.lease_duration.as_secs() as i64;
    let now = store.clock().now_ticks();
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::relay_sk("stamp-only"),
        vec![("StoppedAtUtc", n(now - 2 * lease))],
    )
    .await;
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::relay_sk("bare"),
        vec![],
    )
    .await;
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::relay_sk("text-seen"),
        vec![
            ("LastSeenUtc", AttributeValue::S("yesterday".into())),
            ("StoppedAtUtc", n(now - 2 * lease)),
        ],
    )
    .await;
    let odd: BTreeSet<String> = ["stamp-only", "bare", "text-seen"].map(String::from).into();

    let (counted, wire) = counted_client().await;
    let running = spawn(
        relay_with(
            &counted,
            &options,
            kafka_publisher().await,
            relay_options.clone(),
        )
        .await,
    );
    // The cleaner deletes them in its first rounds; ten renew intervals is generous.
    let until = Instant::now() + relay_options.lease_renew_interval * 10;
    let left = loop {
        let left: Vec<String> = relay_records(&store)
            .await
            .intersection(&odd)
            .cloned()
            .collect();
        if left.is_empty() || Instant::now() >= until {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let report = running.stop().await;
    assert!(
        left.is_empty(),
        "records left after {} rounds: {left:?}; refused by the relay {:?}, at the wire {:?}",
        report.rounds,
        report.refused,
        wire.refusals()
    );
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&wire, "cleaning odd heartbeat records");

    // A dead relay's record, deleted by a client whose first answer is lost: the SDK
    // retries a delete that landed.
    let seen = now - 11 * lease;
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::relay_sk("gone"),
        vec![("LastSeenUtc", n(seen))],
    )
    .await;
    let lossy_wire = RequestCounter::default();
    // The first DeleteItem's answer is lost after DynamoDB applied it, so the SDK retries
    // a delete that already landed.
    let lossy = aws_sdk_dynamodb::Client::from_conf(
        dynamodb_builder()
            .await
            .interceptor(Fault::on("DeleteItem").times(1).lose_answer())
            .interceptor(lossy_wire.clone())
            .build(),
    );
    let lossy_store = DynamoDbOutboxStore::new(lossy, options.clone()).unwrap();
    let deleted = lossy_store
        .delete_relay_record("a-cleaner", "gone", seen)
        .await
        .unwrap();
    assert_eq!(
        lossy_wire.get("DeleteItem").total(),
        2,
        "the SDK retried: {:?}",
        lossy_wire.snapshot()
    );
    assert!(
        deleted,
        "a retried cleanup that landed is done; refused {:?}",
        lossy_wire.refusals()
    );
    assert_eq!(lossy_store.refused_writes().get(WriteKind::Cleanup), 0);
    assert_no_refusal_on_the_wire(&lossy_wire, "a retried cleanup");
    assert!(!relay_records(&store).await.contains("gone"));
}
