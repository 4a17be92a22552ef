//! Lease writes: refused when stale while their own retries are successes, and leases
//! with an owner but no numeric expiry claimed and taken back.

use super::*;

/// Lease writes against DynamoDB itself, with explicit times: a claim of a live lease, a
/// renewal from a stale read and a release after a takeover are refused by DynamoDB (the
/// wire sees each refusal, the store counts it); an SDK retry of each applied write (the
/// same request sent again after it landed) is refused by DynamoDB too, but recognised
/// from the old item as this very write: a success, not counted as a refusal.
#[tokio::test]
async fn lease_writes_are_refused_when_stale_and_their_own_retries_are_successes() {
    use dynamo_outbox::protocol::store::WriteKind;
    let (client, wire) = counted_client().await;
    let options = fresh_table(&client, 1).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let counted = |kind| store.refused_writes().get(kind);
    let wire_refused = || wire.refused("UpdateItem").total();
    let t0: i64 = 1_000_000_000;
    let d: i64 = 30 * TICKS_PER_SECOND;

    // A claims the free bucket; its retry of the applied claim is a success.
    assert!(store.claim(0, "a", t0, t0 + d).await.unwrap());
    assert!(
        store.claim(0, "a", t0, t0 + d).await.unwrap(),
        "a retried claim"
    );
    assert_eq!((wire_refused(), counted(WriteKind::Claim)), (1, 0));
    // B's claim of the live lease is refused.
    assert!(!store.claim(0, "b", t0 + 1, t0 + 1 + d).await.unwrap());
    assert_eq!((wire_refused(), counted(WriteKind::Claim)), (2, 1));

    // A renews from its read; the retry of that renewal is a success.
    assert!(store.renew(0, "a", t0 + d, t0 + 2 * d, None).await.unwrap());
    assert!(
        store.renew(0, "a", t0 + d, t0 + 2 * d, None).await.unwrap(),
        "a retried renewal"
    );
    assert_eq!((wire_refused(), counted(WriteKind::Renew)), (3, 0));
    // A renewal from a stale read (the expiry before that renewal) is refused.
    assert!(!store.renew(0, "a", t0 + d, t0 + 3 * d, None).await.unwrap());
    assert_eq!((wire_refused(), counted(WriteKind::Renew)), (4, 1));

    // The lease lapses and B takes it over; A's release (of the expiry it read) is refused.
    let lapsed = t0 + 2 * d + 1;
    assert!(store.claim(0, "b", lapsed, lapsed + d).await.unwrap());
    assert!(!store.release(0, "a", Some(t0 + 2 * d)).await.unwrap());
    assert_eq!((wire_refused(), counted(WriteKind::Release)), (5, 1));
    // B releases what it read; the retry of that release is a success.
    assert!(store.release(0, "b", Some(lapsed + d)).await.unwrap());
    assert!(
        store.release(0, "b", Some(lapsed + d)).await.unwrap(),
        "a retried release"
    );
    assert_eq!((wire_refused(), counted(WriteKind::Release)), (6, 1));
    assert_eq!(lease_owners(&client, &options).await, vec![None]);
}

/// Lease items with an owner but a missing or non-numeric `ExpiresAtUtc`, some
/// naming a relay that is gone, some naming the relay itself: it claims the first and
/// takes back the second, refusing nothing, and publishes every bucket.
#[tokio::test]
async fn leases_with_an_owner_but_no_numeric_expiry_are_claimed_and_taken_back() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("noexpiry");
    create_topic(&topic, 4);
    let owner = |id: &str| ("Owner", AttributeValue::S(id.into()));
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::lease_sk(0),
        vec![owner("ghost")],
    )
    .await;
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::lease_sk(1),
        vec![
            owner("ghost"),
            ("ExpiresAtUtc", AttributeValue::S("tomorrow".into())),
        ],
    )
    .await;
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::lease_sk(2),
        vec![owner("me")],
    )
    .await;
    put_coordination(
        &client,
        &options,
        &dynamo_outbox::protocol::schema::lease_sk(3),
        vec![owner("me"), ("ExpiresAtUtc", AttributeValue::Bool(true))],
    )
    .await;
    // One message per bucket (partition p goes to bucket p of 4).
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let messages: Vec<OutboxMessage> = (0..4)
        .map(|p| {
            writer
                .message(&topic)
                .with_partition(p)
                .with_value(format!("b{p}"))
        })
        .collect();
    writer.enqueue(&messages).await.unwrap();

    let relay_options = fast_relay_options("me", 4);
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
    let all_mine = vec![Some("me".to_string()); 4];
    let until = Instant::now() + relay_options.lease_renew_interval * 10;
    let owners = loop {
        let owners = lease_owners(&client, &options).await;
        if owners == all_mine || Instant::now() >= until {
            break owners;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let published = if owners == all_mine {
        Some(wait_for_ids(&topic, &id_set(&messages), Duration::from_secs(30)).await)
    } else {
        None
    };
    let report = running.stop().await;
    assert_eq!(
        owners,
        all_mine,
        "after {} rounds; refused by the relay {:?}, at the wire {:?}",
        report.rounds,
        report.refused,
        wire.refusals()
    );
    published
        .expect("published")
        .assert_exactly_once(&id_set(&messages));
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&wire, "leases without a numeric expiry");
}
