//! Buckets changing hands between relays: three relays splitting eight buckets and
//! handing over on stop, a crashed relay's buckets taken over after its leases lapse,
//! standbys that write no lease, far-back standbys, consecutive invocations.

use super::*;

#[tokio::test]
async fn three_relays_split_eight_buckets_without_refused_writes_and_hand_over_on_stop() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 8).await;
    let publisher = kafka_publisher().await;
    // The relays' client: DynamoDB's refusals counted at the wire.
    let (counted, wire) = counted_client().await;
    let mut relays = Vec::new();
    for (i, id) in ["relay-c", "relay-a", "relay-b"].into_iter().enumerate() {
        let mut o = fast_relay_options(id, 8);
        o.lease_duration = Duration::from_secs(6);
        relays.push((
            id,
            spawn(relay_with(&counted, &options, publisher.clone(), o).await),
        ));
        // Scale out: each newcomer joins a fleet that holds every bucket.
        wait_until(
            &format!("{} relays own all buckets fairly", i + 1),
            Duration::from_secs(15),
            || async {
                let owners = lease_owners(&client, &options).await;
                let counts = owned_counts(&owners);
                owners.iter().all(Option::is_some)
                    && counts.len() == i + 1
                    && counts.values().max().unwrap() - counts.values().min().unwrap() <= 1
            },
        )
        .await;
    }
    let counts = owned_counts(&lease_owners(&client, &options).await);
    assert_eq!(
        counts
            .values()
            .copied()
            .collect::<Vec<_>>()
            .iter()
            .sum::<usize>(),
        8
    );
    assert!(counts.values().all(|&c| c == 2 || c == 3), "{counts:?}");

    // Graceful stop of one: the others take its buckets on their next round, not after the
    // lease lapses. Evidence from the leases themselves: the new owner's first seen
    // expiry less the lease duration is the time of its claim or of a later renewal, so
    // when that is before the leaver's own expiry, the bucket was taken before the
    // leaver's lease would have lapsed (no fixed bound against the lease).
    let (leaving_id, leaving) = relays.remove(0);
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let leaver_expiry: BTreeMap<u32, i64> = plain
        .read_coordination()
        .await
        .unwrap()
        .leases
        .iter()
        .filter(|l| l.owner.as_deref() == Some(leaving_id))
        .map(|l| (l.bucket, l.expires_at))
        .collect();
    let report = leaving.stop().await;
    assert!(report.released, "{report:?}");
    let lease_ticks = 6 * TICKS_PER_SECOND;
    let mut first_claim: BTreeMap<u32, i64> = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(30);
    while first_claim.len() < leaver_expiry.len() {
        let c = plain.read_coordination().await.unwrap();
        for &bucket in leaver_expiry.keys() {
            if let Some(l) = c.lease(bucket).filter(|l| l.owner.is_some()) {
                first_claim
                    .entry(bucket)
                    .or_insert(l.expires_at - lease_ticks);
            }
        }
        assert!(Instant::now() < until, "not taken over: {first_claim:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (bucket, lapses_at) in &leaver_expiry {
        assert!(
            first_claim[bucket] < *lapses_at,
            "bucket {bucket} was taken only after the leaver's lease lapsed"
        );
    }
    wait_until(
        "two relays own all eight buckets",
        Duration::from_secs(15),
        || async {
            let owners = lease_owners(&client, &options).await;
            owners.iter().all(Option::is_some) && owned_counts(&owners).len() == 2
        },
    )
    .await;

    let mut refused = report.refused_total();
    for (_, r) in relays {
        refused += r.stop().await.refused_total();
    }
    assert_eq!(
        refused, 0,
        "a healthy fleet makes no refused conditional write"
    );
    assert_no_refusal_on_the_wire(&wire, "three relays scaling out and in");
    assert!(
        wire.get("UpdateItem").ok > 0,
        "the counter saw the lease writes: {:?}",
        wire.snapshot()
    );
}

#[tokio::test]
async fn a_crashed_relays_buckets_are_taken_over_after_its_leases_lapse() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let a = spawn_fast(&counted, &options, &publisher, "a", 4).await;
    wait_until("a owns all", Duration::from_secs(10), || async {
        lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("a"))
    })
    .await;
    let b = spawn_fast(&counted, &options, &publisher, "b", 4).await;
    wait_until("a and b split", Duration::from_secs(10), || async {
        owned_counts(&lease_owners(&client, &options).await).get("b") == Some(&2)
    })
    .await;
    // Crash: the task is dropped mid-flight; nothing is released.
    b.handle.abort();
    let _ = b.stop;
    // b's leases as stored at the crash: a takes each one only once it has lapsed. Each
    // bucket is watched until a holds it; the time a's lease is first seen is after a's
    // claim, which must come after b's expiry (no fixed sleep against the lease).
    let plain = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let mut pending: BTreeMap<u32, i64> = plain
        .read_coordination()
        .await
        .unwrap()
        .leases
        .iter()
        .filter(|l| l.owner.as_deref() == Some("b"))
        .map(|l| (l.bucket, l.expires_at))
        .collect();
    assert_eq!(pending.len(), 2, "{pending:?}");
    let until = Instant::now() + Duration::from_secs(30);
    while !pending.is_empty() {
        let c = plain.read_coordination().await.unwrap();
        let seen_at = plain.clock().now_ticks();
        pending.retain(|&bucket, &mut lapses_at| {
            let taken = c.lease(bucket).and_then(|l| l.owner.as_deref()) == Some("a");
            assert!(
                !taken || seen_at >= lapses_at,
                "bucket {bucket} taken {} ms before b's lease lapsed",
                (lapses_at - seen_at) / (TICKS_PER_SECOND / 1000)
            );
            !taken
        });
        assert!(Instant::now() < until, "not taken over: {pending:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = a.stop().await;
    assert_eq!(report.refused_total(), 0, "{report:?}");
    // The takeover claims lapsed leases: DynamoDB refused none of either relay's writes.
    assert_no_refusal_on_the_wire(&wire, "a crash and a takeover");
}

#[tokio::test]
async fn more_relays_than_buckets_leaves_standbys_that_write_no_lease() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let mut running = Vec::new();
    let m_only = vec![Some("pod-m".to_string()); 2];
    let expected = vec![Some("pod-m".to_string()), Some("pod-n".to_string())];
    running.push(spawn_fast(&counted, &options, &publisher, "pod-m", 2).await);
    wait_until("pod-m holds both", Duration::from_secs(15), || async {
        lease_owners(&client, &options).await == m_only
    })
    .await;
    running.push(spawn_fast(&counted, &options, &publisher, "pod-n", 2).await);
    wait_until(
        "pod-m and pod-n hold one bucket each",
        Duration::from_secs(15),
        || async { lease_owners(&client, &options).await == expected },
    )
    .await;
    // Two more join a fleet whose split is already fair: nothing moves, though pod-a sorts first.
    for id in ["pod-a", "pod-q"] {
        running.push(spawn_fast(&counted, &options, &publisher, id, 2).await);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        lease_owners(&client, &options).await,
        expected,
        "incumbents keep their buckets"
    );
    // Stop the standbys first: once an incumbent stops and hands its bucket
    // back, a standby taking it over is the protocol working, not a fault.
    let mut refused = 0;
    let mut acquired = BTreeMap::new();
    let mut stopping: Vec<_> = running
        .into_iter()
        .zip(["pod-m", "pod-n", "pod-a", "pod-q"])
        .collect();
    stopping.rotate_left(2);
    for (r, id) in stopping {
        let report = r.stop().await;
        refused += report.refused_total();
        acquired.insert(id, report.leases_acquired);
    }
    assert_eq!(refused, 0);
    assert_no_refusal_on_the_wire(&wire, "two incumbents and two standbys");
    assert_eq!(
        acquired["pod-a"] + acquired["pod-q"],
        0,
        "standbys never wrote a lease: {acquired:?}"
    );
}

#[tokio::test]
async fn far_back_standbys_skip_every_other_round_but_stay_counted() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let owner = spawn_fast(&counted, &options, &publisher, "a", 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // b is the first standby (rank 0 < 1 bucket): every round; c is further back: every other.
    let b = spawn_fast(&counted, &options, &publisher, "b", 1).await;
    let c = spawn_fast(&counted, &options, &publisher, "c", 1).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let coordination = store.read_coordination().await.unwrap();
    let now = store.clock().now_ticks();
    let c_record = coordination
        .relays
        .iter()
        .find(|r| r.relay_id == "c")
        .unwrap();
    // Counted: its heartbeat is younger than the lease (3 s), so every plan counts it.
    assert!(
        c_record.is_active(now, 3 * TICKS_PER_SECOND),
        "c is still counted: {c_record:?}"
    );
    let (b, c, owner) = (b.stop().await, c.stop().await, owner.stop().await);
    assert!(c.rounds >= 3, "{c:?}");
    assert!(
        c.rounds * 4 < b.rounds * 3,
        "c ran {} rounds, b {}",
        c.rounds,
        b.rounds
    );
    assert_eq!(
        b.refused_total() + c.refused_total() + owner.refused_total(),
        0
    );
    assert_no_refusal_on_the_wire(&wire, "an owner and two standbys");
    assert_eq!(b.leases_acquired + c.leases_acquired, 0);
}

/// Two relays with deadlines, the second starting before the first ends, as consecutive
/// scheduled Lambda invocations do: the buckets change hands at the boundary within a
/// fraction of a second (the leaver announces its stop, the newcomer acquires right after
/// it), not a renew interval later, and no conditional write is refused.
#[tokio::test]
async fn consecutive_invocations_hand_buckets_over_promptly() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let timings = |id: &str| {
        let mut o = fast_relay_options(id, 4);
        o.lease_renew_interval = Duration::from_secs(5);
        o.lease_duration = Duration::from_secs(15);
        o
    };
    let t0 = Instant::now();
    let first = relay_with(
        &counted,
        &options,
        publisher.clone(),
        timings("invocation-1"),
    )
    .await;
    // The leaver's run returns once its releases have landed: its end is when the buckets
    // it held became free.
    let first = tokio::spawn(async move {
        let report = first.run_until(t0 + Duration::from_secs(7)).await;
        (report, Instant::now())
    });
    wait_until(
        "the first owns every bucket",
        Duration::from_secs(5),
        || async {
            lease_owners(&client, &options)
                .await
                .iter()
                .all(Option::is_some)
        },
    )
    .await;
    tokio::time::sleep_until(t0 + Duration::from_secs(3)).await;
    // When the newcomer starts publishing each bucket, on the same monotonic clock.
    let owns = Arc::new(OwnershipLog::default());
    let second = relay_with(
        &counted,
        &options,
        publisher.clone(),
        timings("invocation-2"),
    )
    .await
    .with_metrics(owns.clone());
    let second = tokio::spawn(async move { second.run_until(t0 + Duration::from_secs(14)).await });

    // Sample ownership every 50 ms across the boundary: no bucket stays without an owner
    // for longer than the sampling can see (printed; the bound is on the relays' own clock
    // below).
    let mut unowned_since: Vec<Option<Instant>> = vec![None; 4];
    let mut sampled = Duration::ZERO;
    while Instant::now() < t0 + Duration::from_secs(10) {
        let owners = lease_owners(&client, &options).await;
        let now = Instant::now();
        for (b, owner) in owners.iter().enumerate() {
            match (owner, unowned_since[b]) {
                (None, None) => unowned_since[b] = Some(now),
                (Some(_), Some(since)) => {
                    sampled = sampled.max(now - since);
                    unowned_since[b] = None;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for since in unowned_since.into_iter().flatten() {
        sampled = sampled.max(Instant::now() - since);
    }
    let ((first, first_end), second) = (first.await.unwrap(), second.await.unwrap().unwrap());
    let first = first.unwrap();
    assert!(
        first.released && first.stop_reason == StopReason::Deadline,
        "{first:?}"
    );
    assert_eq!(
        first.refused_total() + second.refused_total(),
        0,
        "{first:?} {second:?}"
    );
    assert_no_refusal_on_the_wire(&wire, "two consecutive invocations");
    // Every bucket the newcomer did not already hold before the leaver's end, it took
    // within a fraction of a second of it: a couple of handover steps (300 ms) after the
    // releases, not its next regular round (the renew interval, 5 s).
    let taken = owns.first_owned_after(first_end);
    println!(
        "buckets taken after the leaver's end: {taken:?}; longest sampled unowned stretch {sampled:?}"
    );
    assert_eq!(
        taken.len() + owns.owned_before(first_end).len(),
        4,
        "the newcomer ends up owning every bucket: {taken:?}"
    );
    let longest = taken.values().copied().max().unwrap_or_default();
    assert!(
        longest < Duration::from_secs(1),
        "a bucket changed hands {longest:?} after the leaver's end (renew interval 5 s): {taken:?}"
    );
}

/// A relay restarted under the same relay id, after a crash (its leases still valid, its
/// heartbeat not stamped) and after a graceful stop, picks its buckets up again and
/// publishes what was written meanwhile without a single refused conditional write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_the_same_relay_id_makes_no_refusal() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("restart");
    create_topic(&topic, 2);
    let publisher = kafka_publisher().await;
    let (counted, wire) = counted_client().await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut written = std::collections::BTreeSet::new();
    let write = |round: usize| -> Vec<OutboxMessage> {
        (0..8)
            .map(|i| {
                writer
                    .message(&topic)
                    .with_key(format!("k{i}"))
                    .with_value(format!("{round}:{i}"))
            })
            .collect()
    };
    let all_owned_by = |id: &'static str| {
        let (client, options) = (client.clone(), options.clone());
        move || {
            let (client, options) = (client.clone(), options.clone());
            async move {
                lease_owners(&client, &options)
                    .await
                    .iter()
                    .all(|o| o.as_deref() == Some(id))
            }
        }
    };

    // First life: owns every bucket, then crashes (the task is dropped mid-run: no stop
    // stamp, no release).
    let first = spawn_fast(&counted, &options, &publisher, "same-id", 4).await;
    wait_until(
        "the first life owns every bucket",
        Duration::from_secs(10),
        all_owned_by("same-id"),
    )
    .await;
    first.handle.abort();
    let _ = first.handle.await;
    let round = write(1);
    written.extend(id_set(&round));
    writer.enqueue(&round).await.unwrap();

    // Second life under the same id, while its leases are still valid: then a graceful
    // stop.
    let second = spawn_fast(&counted, &options, &publisher, "same-id", 4).await;
    wait_for_ids(&topic, &written, Duration::from_secs(20)).await;
    wait_until(
        "the second life owns every bucket",
        Duration::from_secs(10),
        all_owned_by("same-id"),
    )
    .await;
    let second = second.stop().await;
    assert!(second.released, "{second:?}");
    let round = write(2);
    written.extend(id_set(&round));
    writer.enqueue(&round).await.unwrap();

    // Third life after the graceful stop.
    let third = spawn_fast(&counted, &options, &publisher, "same-id", 4).await;
    wait_for_ids(&topic, &written, Duration::from_secs(20))
        .await
        .assert_at_least_once(&written);
    let third = third.stop().await;
    assert_eq!(
        second.refused_total() + third.refused_total(),
        0,
        "{second:?} {third:?}"
    );
    assert_no_refusal_on_the_wire(&wire, "a relay restarted under the same id");
    assert_eq!(pending_messages(&client, &options).await, 0);
}
