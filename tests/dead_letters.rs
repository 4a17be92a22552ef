//! Dead letters back in the stream ([`dynamo_outbox::dead_letters`], what `outboxctl
//! dead-letters` runs) against the local stack: list with its filters, show, redrive to
//! the tail of the original bucket, purge; a redrive racing the relay that owns the bucket
//! (no conditional write refused, the message published once, with its id, after what was
//! pending); a dead letter stamped with another bucket count refused, nothing written.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::dead_letters::{self, Filter};
use dynamo_outbox::protocol::schema;
use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, Error, Header, OutboxMessage, Relay,
};
use outbox_testkit::*;
use tokio::time::Instant;

fn all() -> Filter {
    Filter::default()
}

/// The items of bucket `bucket`'s message partition, read as messages (sequence, id).
async fn bucket_messages(store: &DynamoDbOutboxStore, bucket: u32) -> Vec<(u64, String)> {
    let out = store
        .client()
        .query()
        .table_name(&store.options().table_name)
        .key_condition_expression("#pk = :pk")
        .expression_attribute_names("#pk", &store.keys().pk)
        .expression_attribute_values(":pk", schema::s(store.keys().message_pk(bucket)))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    out.items()
        .iter()
        .map(|i| {
            let m = schema::parse_message(store.keys(), i).unwrap();
            (m.sequence, m.message.message_id.to_string())
        })
        .collect()
}

#[tokio::test]
async fn list_show_redrive_and_purge() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let before = store.clock().now_ticks();

    // Bucket 1: a (to be quarantined), b (stays pending); bucket 2: c on another topic.
    let a = writer
        .message("orders")
        .with_partition(1)
        .with_key("customer-7")
        .with_value(vec![0u8, 159, 146, 150])
        .with_header(Header::new("type", b"created".to_vec()))
        .with_header(Header::null("empty"));
    let b = writer.message("orders").with_partition(1).with_value("b");
    let c = writer.message("audit").with_partition(2).with_value("c");
    let placed = writer
        .enqueue(&[a.clone(), b.clone(), c.clone()])
        .await
        .unwrap();
    let (a_seq, c_seq) = (placed[0].sequence, placed[2].sequence);
    store.quarantine(1, a_seq).await.unwrap();
    store
        .quarantine_because(2, c_seq, "the broker rejected it: record too large")
        .await
        .unwrap();

    // list, and its filters.
    let (found, more) = dead_letters::list(&store, &all(), 100).await.unwrap();
    assert!(!more);
    let places: Vec<(Option<u32>, Option<u64>)> =
        found.iter().map(|d| (d.bucket, d.sequence)).collect();
    assert_eq!(places, [(Some(1), Some(a_seq)), (Some(2), Some(c_seq))]);
    let only = |f: Filter| {
        let store = &store;
        async move {
            let (found, _) = dead_letters::list(store, &f, 100).await.unwrap();
            found
                .iter()
                .map(|d| d.message_id.clone().unwrap())
                .collect::<Vec<_>>()
        }
    };
    let (a_id, c_id) = (a.message_id.to_string(), c.message_id.to_string());
    assert_eq!(
        only(Filter {
            bucket: Some(2),
            ..all()
        })
        .await,
        [c_id.as_str()]
    );
    assert_eq!(
        only(Filter {
            topic: Some("orders".into()),
            ..all()
        })
        .await,
        [a_id.as_str()]
    );
    assert!(only(Filter {
        older_than: Some(Duration::from_secs(3600)),
        ..all()
    })
    .await
    .is_empty());
    assert_eq!(
        only(Filter {
            older_than: Some(Duration::ZERO),
            ..all()
        })
        .await
        .len(),
        2
    );
    let (first, more) = dead_letters::list(&store, &all(), 1).await.unwrap();
    assert_eq!((first.len(), more), (1, true));

    // show: all of it, when and why.
    let d = dead_letters::get(&store, 1, a_seq).await.unwrap().unwrap();
    assert_eq!(d.message.as_ref().unwrap(), &a);
    assert_eq!(d.reason.as_deref(), Some("moved by an operator"));
    let at = d.quarantined_at.unwrap();
    assert!(at >= before && at <= store.clock().now_ticks(), "{at}");
    let dc = dead_letters::get(&store, 2, c_seq).await.unwrap().unwrap();
    assert_eq!(
        dc.reason.as_deref(),
        Some("the broker rejected it: record too large")
    );
    assert!(dead_letters::get(&store, 1, 999).await.unwrap().is_none());

    // redrive: the tail of bucket 1, after b, same id, key, value, headers; gone from the
    // dead letters.
    let counter = store.sequence_counter(1).await.unwrap().unwrap();
    let r = dead_letters::redrive(&store, &d).await.unwrap();
    assert_eq!(
        (r.message_id, r.bucket, r.from_sequence, r.sequence),
        (a.message_id, 1, a_seq, counter + 1)
    );
    assert_eq!(
        bucket_messages(&store, 1).await,
        [
            (placed[1].sequence, b.message_id.to_string()),
            (counter + 1, a_id.clone())
        ]
    );
    let back = store.last_message(1).await.unwrap().unwrap();
    let back = schema::parse_message(store.keys(), &back).unwrap().message;
    assert_eq!(
        (&back.key, &back.value, &back.headers, &back.topic),
        (&a.key, &a.value, &a.headers, &a.topic)
    );
    assert!(back.created_at_ticks >= at, "the redrive's time");
    assert!(
        !back.headers.is_empty() && back.bucket_count == 4,
        "{back:?}"
    );
    assert_eq!(only(all()).await, [c_id.as_str()]);

    // Redriving it again (a stale listing) fails and writes no second copy.
    let e = dead_letters::redrive(&store, &d).await.unwrap_err();
    assert!(
        matches!(&e, Error::TransactionCanceled { reasons, .. } if reasons.iter().any(|r| r == "ConditionalCheckFailed")),
        "{e:?}"
    );
    let ids: Vec<String> = bucket_messages(&store, 1)
        .await
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(ids, [b.message_id.to_string(), a_id.clone()]);

    // purge: gone for good; a second purge finds nothing.
    assert!(dead_letters::purge(&store, &dc).await.unwrap());
    assert!(!dead_letters::purge(&store, &dc).await.unwrap());
    assert!(only(all()).await.is_empty());
    assert_eq!(
        bucket_messages(&store, 2).await,
        [],
        "a purge puts nothing back"
    );
}

/// A dead letter stamped with another bucket count than the outbox's: its bucket is not
/// its key's bucket under this count, so a redrive would break per-key order. Refused
/// with an error naming the rule; nothing is written (not even a sequence number taken),
/// and it stays a dead letter.
#[tokio::test]
async fn a_dead_letter_of_another_bucket_count_is_not_redriven() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    // A writer configured with 8 buckets wrote into the table.
    let foreign =
        DynamoDbOutboxWriter::new(client.clone(), options.clone().with_bucket_count(8)).unwrap();
    let m = foreign.message("orders").with_key("customer-9");
    let placed = foreign.enqueue(std::slice::from_ref(&m)).await.unwrap()[0];
    // The foreign item lies in its bucket under 8 (maybe beyond 4): a store of 8 reaches
    // it wherever it is to quarantine it.
    let wide =
        DynamoDbOutboxStore::new(client.clone(), options.clone().with_bucket_count(8)).unwrap();
    wide.quarantine(placed.bucket, placed.sequence)
        .await
        .unwrap();

    let (found, _) = dead_letters::list(&store, &all(), 10).await.unwrap();
    assert_eq!(found.len(), 1);
    let counter = store.sequence_counter(placed.bucket).await.unwrap();
    let e = dead_letters::redrive(&store, &found[0]).await.unwrap_err();
    assert!(matches!(e, Error::InvalidMessage { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("stamped with bucket count 8")
            && text.contains("(OUTBOX_BUCKET_COUNT) is 4")
            && text.contains("not redriven"),
        "{text}"
    );
    assert_eq!(
        store.sequence_counter(placed.bucket).await.unwrap(),
        counter,
        "no sequence number taken"
    );
    assert!(bucket_messages(&wide, placed.bucket).await.is_empty());
    assert_eq!(
        dead_letters::list(&store, &all(), 10)
            .await
            .unwrap()
            .0
            .len(),
        1
    );
}

/// A redrive while the relay that owns the bucket publishes it and a writer keeps
/// enqueuing into it: no conditional write is refused (the relay's report and the wire
/// both count), and the redriven message is published once, with its id, key, value and
/// headers, after every message of the bucket with a lower sequence and before every one
/// with a higher.
#[tokio::test]
async fn a_redrive_racing_the_owning_relay_refuses_no_write_and_publishes_once_in_tail_order() {
    let (client, counter) = counted_client().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("redrive");
    create_topic(&topic, 1);
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let msg = |v: &str| {
        writer
            .message(&topic)
            .with_partition(0)
            .with_key("k")
            .with_value(v.to_string())
    };
    let m1 = msg("m1");
    let m2 = msg("m2").with_header(Header::new("h", b"x".to_vec()));
    let m3 = msg("m3");
    let placed = writer
        .enqueue(&[m1.clone(), m2.clone(), m3.clone()])
        .await
        .unwrap();
    let m2_seq = placed[1].sequence;
    store.quarantine(0, m2_seq).await.unwrap();

    let relay = Relay::new(
        DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap(),
        kafka_publisher().await,
        fast_relay_options(&random_name("relay"), 2),
    )
    .unwrap();
    let run = tokio::spawn(async move {
        relay
            .run_until(Instant::now() + Duration::from_secs(12))
            .await
    });
    wait_for_ids(&topic, &id_set([&m1, &m3]), Duration::from_secs(20)).await;

    // A writer keeps enqueuing into the relay's bucket ...
    let written: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let feeding = {
        let writer = writer.clone();
        let written = written.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            for i in 0..30 {
                let m: OutboxMessage = writer
                    .message(&topic)
                    .with_partition(0)
                    .with_key("k")
                    .with_value(format!("w{i}"));
                let e = writer.enqueue(std::slice::from_ref(&m)).await.unwrap()[0];
                written
                    .lock()
                    .unwrap()
                    .push((e.sequence, m.message_id.to_string()));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    // ... while the dead letter goes back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let d = dead_letters::get(&store, 0, m2_seq).await.unwrap().unwrap();
    let r = dead_letters::redrive(&store, &d).await.unwrap();
    assert!(r.sequence > m2_seq);
    feeding.await.unwrap();
    let mut all_ids = id_set([&m1, &m2, &m3]);
    let written = written.lock().unwrap().clone();
    all_ids.extend(written.iter().map(|(_, id)| id.clone()));
    wait_for_ids(&topic, &all_ids, Duration::from_secs(20)).await;
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&counter, "a redrive racing the owning relay");
    assert_eq!(report.published, all_ids.len() as u64, "{report:?}");

    // Once each, the redriven one byte for byte, in tail order.
    let records = read_topic(&topic);
    Deliveries::of(&records).assert_exactly_once(&all_ids);
    let mut by_offset = records.clone();
    by_offset.sort_by_key(|r| r.offset);
    let order: Vec<String> = by_offset.iter().filter_map(|r| r.message_id()).collect();
    let at = |id: &str| order.iter().position(|o| o == id).unwrap();
    let m2_id = m2.message_id.to_string();
    let redriven = &by_offset[at(&m2_id)].decoded();
    assert_eq!(
        (&redriven.key, &redriven.value),
        (&m2.key, &m2.value),
        "same key and value"
    );
    assert!(redriven
        .headers
        .contains(&("h".to_string(), Some(b"x".to_vec()))));
    let before: BTreeSet<&str> = written
        .iter()
        .filter(|(s, _)| *s < r.sequence)
        .map(|(_, id)| id.as_str())
        .collect();
    let after: BTreeSet<&str> = written
        .iter()
        .filter(|(s, _)| *s > r.sequence)
        .map(|(_, id)| id.as_str())
        .collect();
    assert!(
        !before.is_empty() && !after.is_empty(),
        "the race: writes on both sides"
    );
    let (m1_id, m3_id) = (m1.message_id.to_string(), m3.message_id.to_string());
    for id in before
        .iter()
        .copied()
        .chain([m1_id.as_str(), m3_id.as_str()])
    {
        assert!(at(id) < at(&m2_id), "{id} was pending before the redrive");
    }
    for id in &after {
        assert!(at(id) > at(&m2_id), "{id} came after the redrive");
    }
    assert!(dead_letters::list(&store, &all(), 10)
        .await
        .unwrap()
        .0
        .is_empty());
}

/// A sequence counter reset hands a number out again: quarantining the new item at a
/// place that already has a dead letter is refused with the cause, and neither item is
/// lost (the dead letter keeps the first message, the bucket the second).
#[tokio::test]
async fn a_quarantine_never_overwrites_an_earlier_dead_letter_of_the_same_place() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let first = writer.message("orders").with_partition(1).with_value("1");
    let seq = writer.enqueue(std::slice::from_ref(&first)).await.unwrap()[0].sequence;
    store.quarantine(1, seq).await.unwrap();
    // The same place again, as after a counter reset.
    let second = writer.message("orders").with_partition(1).with_value("2");
    client
        .put_item()
        .table_name(&options.table_name)
        .set_item(Some(
            schema::message_item(store.keys(), &second, 1, seq).unwrap(),
        ))
        .send()
        .await
        .unwrap();
    let e = store.quarantine(1, seq).await.unwrap_err();
    assert!(matches!(e, Error::Misconfiguration { .. }), "{e:?}");
    assert!(
        e.to_string().contains("exists already") && e.to_string().contains("counter was reset"),
        "{e}"
    );
    let d = dead_letters::get(&store, 1, seq).await.unwrap().unwrap();
    assert_eq!(d.message.unwrap(), first);
    assert_eq!(
        bucket_messages(&store, 1).await,
        [(seq, second.message_id.to_string())]
    );
}

/// The poison policy's move is fenced by the bucket's lease: a relay whose lease another
/// relay took moves nothing (the transaction's check of the lease item is refused), and
/// the relay that owns the bucket moves the item.
#[tokio::test]
async fn a_relay_that_lost_the_bucket_cannot_quarantine_its_head() {
    use dynamo_outbox::protocol::store::LeaseFence;
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let placed = writer
        .enqueue(&[writer
            .message("orders")
            .with_partition(1)
            .with_value("head")])
        .await
        .unwrap();
    let (bucket, sequence) = (placed[0].bucket, placed[0].sequence);

    // Relay a held the bucket until t0 + 10; its lease lapsed and relay b claimed it.
    let t0 = store.clock().now_ticks();
    assert!(store.claim(bucket, "relay-a", t0, t0 + 10).await.unwrap());
    let b_expires = t0 + 600 * 10_000_000;
    assert!(store
        .claim(bucket, "relay-b", t0 + 20, b_expires)
        .await
        .unwrap());

    // Relay a, unaware, tries to move the head with the lease it remembers.
    let stale = LeaseFence {
        relay_id: "relay-a".into(),
        expires_at: t0 + 10,
        now: t0 + 5,
    };
    let err = store
        .quarantine_fenced(bucket, sequence, "the broker rejected it", &stale)
        .await
        .expect_err("a lost lease moves nothing");
    assert!(
        matches!(
            err,
            Error::ConditionFailed {
                operation: "quarantine",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        bucket_messages(&store, bucket).await,
        [(sequence, placed[0].message_id.to_string())]
    );
    assert!(dead_letters::list(&store, &all(), 10)
        .await
        .unwrap()
        .0
        .is_empty());

    // A lease with the right owner but another version (a renewal since) moves nothing
    // either; nor does one that lapsed.
    for fence in [
        LeaseFence {
            relay_id: "relay-b".into(),
            expires_at: b_expires - 1,
            now: t0 + 30,
        },
        LeaseFence {
            relay_id: "relay-b".into(),
            expires_at: b_expires,
            now: b_expires,
        },
    ] {
        let err = store
            .quarantine_fenced(bucket, sequence, "x", &fence)
            .await
            .expect_err("not the lease as held");
        assert!(matches!(err, Error::ConditionFailed { .. }), "{err:?}");
    }
    assert_eq!(bucket_messages(&store, bucket).await.len(), 1);

    // The owner, with the lease as it holds it, moves the head.
    let owner = LeaseFence {
        relay_id: "relay-b".into(),
        expires_at: b_expires,
        now: t0 + 30,
    };
    store
        .quarantine_fenced(bucket, sequence, "the broker rejected it", &owner)
        .await
        .unwrap();
    assert!(bucket_messages(&store, bucket).await.is_empty());
    let (dead, _) = dead_letters::list(&store, &all(), 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].sequence, Some(sequence));
}
