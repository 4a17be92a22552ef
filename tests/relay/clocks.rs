//! Relays whose clocks are wrong: set back (neither renewing backwards nor publishing,
//! nor claiming) or a wall clock ahead (publishing bounded by the monotonic validity).

use super::*;

#[tokio::test]
async fn a_clock_set_back_neither_renews_backwards_nor_publishes() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("clock");
    create_topic(&topic, 1);
    let clock = OffsetClock::new(0);
    let (counted, wire) = counted_client().await;
    let store = DynamoDbOutboxStore::new(counted, options.clone())
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let relay = Relay::new(
        store.clone(),
        kafka_publisher().await,
        fast_relay_options("skewed", 2),
    )
    .unwrap();
    let refused = store.refused_writes().clone();
    let running = spawn(relay);
    wait_until("it owns both", Duration::from_secs(10), || async {
        lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("skewed"))
    })
    .await;
    // Set the clock back by 10 s, more than the renew interval (1 s) and the lease (3 s).
    clock.set_offset_ticks(-10 * TICKS_PER_SECOND);
    let expiry_before = expiries(&store).await;
    // Its next round (renew interval 1 s) notices; a message enqueued after that waits.
    wait_until(
        "its heartbeat is refused",
        Duration::from_secs(5),
        || async { refused.get(dynamo_outbox::protocol::store::WriteKind::Heartbeat) >= 1 },
    )
    .await;
    // The wire counted it before the relay did (the interceptor runs inside the request).
    assert!(
        wire.refused("UpdateItem").total() >= 1,
        "DynamoDB's refusal of the heartbeat, at the wire: {:?}",
        wire.refusals()
    );
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let waiting = keyed(&writer, &topic, "k", 1);
    writer
        .enqueue(std::slice::from_ref(&waiting))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // kafka.py blocks: off this current-thread runtime, so that the relay keeps running.
    let read = {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || read_topic(&topic))
            .await
            .unwrap()
    };
    assert!(
        read.is_empty(),
        "published while its clock was behind the stored expiry"
    );
    // Lease by lease: not one expiry moved backwards.
    let expiry_after = expiries(&store).await;
    for (bucket, before) in &expiry_before {
        let after = expiry_after.get(bucket).copied().unwrap_or(0);
        assert!(
            after >= *before,
            "bucket {bucket}: expiry moved backwards from {before} to {after}"
        );
    }
    assert_eq!(
        refused.get(dynamo_outbox::protocol::store::WriteKind::Renew),
        0,
        "no backwards renewal was even sent"
    );
    assert!(
        refused.get(dynamo_outbox::protocol::store::WriteKind::Heartbeat) >= 1,
        "its heartbeat is refused"
    );
    // Clock fixed: it resumes once its clock passes the stored expiry.
    clock.set_offset_ticks(0);
    wait_for_ids(&topic, &id_set([&waiting]), Duration::from_secs(15)).await;
    let report = running.stop().await;
    // The refusals DynamoDB answered are the ones the relay counted: none it failed to
    // count, none counted twice.
    let relay_refused = refused.total();
    assert_eq!(report.refused_total(), relay_refused, "{report:?}");
    assert_eq!(
        wire.refused_total(),
        relay_refused,
        "wire {:?}, relay {report:?}",
        wire.refusals()
    );
}

/// Every lease's expiry, by bucket.
async fn expiries(store: &DynamoDbOutboxStore) -> std::collections::BTreeMap<u32, i64> {
    store
        .read_coordination()
        .await
        .unwrap()
        .leases
        .iter()
        .map(|l| (l.bucket, l.expires_at))
        .collect()
}

/// Every bucket's lease owner as stored, lapsed or not.
async fn raw_owners(store: &DynamoDbOutboxStore, buckets: u32) -> Vec<Option<String>> {
    let c = store.read_coordination().await.unwrap();
    (0..buckets)
        .map(|b| c.lease(b).and_then(|l| l.owner.clone()))
        .collect()
}

/// A relay whose clock is set back claims nothing while its heartbeat is refused, even a
/// bucket a peer has just handed back (a claim would succeed at DynamoDB, written with
/// an expiry already in the past); once its clock is right again it takes the buckets.
#[tokio::test]
async fn a_relay_whose_clock_is_set_back_stops_claiming() {
    use dynamo_outbox::protocol::store::WriteKind;
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let (counted, wire) = counted_client().await;
    let clock = OffsetClock::new(0);
    let store = DynamoDbOutboxStore::new(counted.clone(), options.clone())
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let refused = store.refused_writes().clone();
    let publisher = kafka_publisher().await;
    let skewed = spawn(
        Relay::new(
            store.clone(),
            publisher.clone(),
            fast_relay_options("a-skewed", 2),
        )
        .unwrap(),
    );
    let peer = spawn_fast(&counted, &options, &publisher, "b-peer", 2).await;
    let both = vec![Some("a-skewed".to_string()), Some("b-peer".to_string())];
    wait_until("one bucket each", Duration::from_secs(20), || async {
        let mut owners = lease_owners(&client, &options).await;
        owners.sort();
        owners == both
    })
    .await;
    // 10 s back: its heartbeat is refused until its clock passes the last one it wrote.
    clock.set_offset_ticks(-10 * TICKS_PER_SECOND);
    wait_until(
        "its heartbeat is refused",
        Duration::from_secs(5),
        || async { refused.get(WriteKind::Heartbeat) >= 1 },
    )
    .await;
    let peer_report = peer.stop().await;
    assert!(peer_report.released, "{peer_report:?}");
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let handed_back: Vec<u32> = raw_owners(&plain, 2)
        .await
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_none())
        .map(|(b, _)| b as u32)
        .collect();
    assert!(!handed_back.is_empty(), "the peer handed nothing back");
    // Three seconds (three rounds) with its clock still behind: nothing claimed.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let owners = raw_owners(&plain, 2).await;
        for &b in &handed_back {
            assert_eq!(owners[b as usize], None, "claimed with its clock set back");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refused.get(WriteKind::Claim), 0);
    // Clock right again: it takes every bucket.
    clock.set_offset_ticks(0);
    wait_until("it takes both buckets", Duration::from_secs(20), || async {
        lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("a-skewed"))
    })
    .await;
    let report = skewed.stop().await;
    // The only refusals: its heartbeats while its clock was behind.
    assert_eq!(
        (report.refused_total(), wire.refused_total()),
        (
            refused.get(WriteKind::Heartbeat),
            refused.get(WriteKind::Heartbeat)
        ),
        "{report:?} {:?}",
        wire.refusals()
    );
}

/// The lease's validity is measured on the monotonic clock, from the start of the last
/// renewal that landed, never from the stored expiry: with its wall clock a minute ahead
/// (the stored expiry a minute away) and its renewals failing, the relay stops publishing
/// one lease duration after its last renewal, and resumes once a renewal lands again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wall_clock_ahead_does_not_stretch_publishing_past_the_monotonic_validity() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("ahead");
    create_topic(&topic, 1);
    // Fails every UpdateItem (renewals, heartbeats) while armed, as an outage of writes.
    let failing = Fault::on("UpdateItem")
        .disarmed()
        .fail("injected: UpdateItem unavailable");
    let faulty = faulty_dynamodb(&failing).await;
    let clock = OffsetClock::new(0);
    let store = DynamoDbOutboxStore::new(faulty, options.clone())
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let relay_options = fast_relay_options("ahead", 1);
    let lease = relay_options.lease_duration;
    let running = spawn(Relay::new(store, kafka_publisher().await, relay_options).unwrap());
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    wait_until("it holds the bucket", Duration::from_secs(10), || async {
        lease_owners(&client, &options).await == [Some("ahead".to_string())]
    })
    .await;
    // A minute ahead: its next renewal stores an expiry a minute away.
    clock.set_offset_ticks(60 * TICKS_PER_SECOND);
    wait_until(
        "a renewal a minute ahead",
        Duration::from_secs(10),
        || async {
            let now = plain.clock().now_ticks();
            expiries(&plain).await[&0] > now + 30 * TICKS_PER_SECOND
        },
    )
    .await;
    // Its writes fail from here on; the stored expiry still says the lease is good for
    // almost a minute, by its clock and by the real one.
    failing.arm();
    let armed_at = Instant::now();
    tokio::time::sleep_until(armed_at + lease + Duration::from_millis(500)).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let waiting = keyed(&writer, &topic, "k", 1);
    writer
        .enqueue(std::slice::from_ref(&waiting))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        read_topic(&topic).is_empty(),
        "published past the lease's monotonic validity"
    );
    let now = plain.clock().now_ticks();
    assert!(
        expiries(&plain).await[&0] > now + 20 * TICKS_PER_SECOND,
        "the stored expiry alone would have allowed it"
    );
    // Writes work again: a renewal lands (from the expiry it read) and it publishes.
    failing.disarm();
    wait_for_ids(&topic, &id_set([&waiting]), Duration::from_secs(15))
        .await
        .assert_exactly_once(&id_set([&waiting]));
    let report = running.stop().await;
    assert_eq!((report.published, report.leases_lost), (1, 0), "{report:?}");
}
