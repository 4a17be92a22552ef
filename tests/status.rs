//! `outboxctl status`'s data ([`dynamo_outbox::status::read_status`]) against tables in
//! known states, built by writing the items directly: owned, lapsed and never claimed
//! leases; live, stopped, silent and future relays; pending, capped and empty buckets; a
//! message stamped with another bucket count; sequence counters behind their messages; a
//! bucket stuck behind an unreadable item, and a dead letter; and, with an allow-list
//! (`OUTBOX_ALLOWED_TOPICS`), every bucket parked behind its head named with its sequence,
//! topic, reason and the command that moves the head aside.

use std::collections::BTreeSet;
use std::time::Duration;

use dynamo_outbox::options::TopicAllowList;
use dynamo_outbox::protocol::clock::TICKS_PER_SECOND;
use dynamo_outbox::protocol::schema;
use dynamo_outbox::status::{read_status, StatusReport, WarningKind};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, OutboxMessage};
use outbox_testkit::*;

const S: i64 = TICKS_PER_SECOND;
const LEASE: Duration = Duration::from_secs(30);

fn kinds(report: &StatusReport, kind: WarningKind) -> BTreeSet<String> {
    report
        .warnings_of(kind)
        .map(|w| match (&w.bucket, &w.relay) {
            (Some(b), _) => b.to_string(),
            (None, Some(r)) => r.clone(),
            (None, None) => String::new(),
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn near(actual: Option<f64>, expected: f64, slack: f64) -> bool {
    actual.is_some_and(|a| (a - expected).abs() <= slack)
}

#[tokio::test]
async fn an_empty_table_reports_nothing_to_do() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let store = DynamoDbOutboxStore::new(client, options.clone()).unwrap();
    let report = read_status(&store, LEASE).await.unwrap();
    assert_eq!(report.table, options.table_name);
    assert_eq!(report.bucket_count, 4);
    assert_eq!(report.buckets.len(), 4);
    for (i, b) in report.buckets.iter().enumerate() {
        assert_eq!(b.bucket, i as u32);
        assert_eq!(
            (b.pending, b.pending_capped, b.has_pending()),
            (0, false, false)
        );
        assert_eq!(
            (b.owner.as_deref(), b.owned, b.lease_expires_at),
            (None, false, None)
        );
        assert_eq!((b.oldest_age_seconds, b.sequence_counter), (None, None));
    }
    assert!(report.relays.is_empty());
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(report.dead_letters, 0);
    assert_eq!(report.total_pending(), 0);
}

#[tokio::test]
async fn a_table_in_known_states() {
    let client = dynamodb().await;
    let mut options = fresh_table(&client, 5).await;
    // A small cap, so that a bucket reaches it with a few messages.
    options.pending_count_limit = 5;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let now = store.clock().now_ticks();

    // relay-a: live, owns bucket 0 for another 12 s.
    assert!(store.heartbeat("relay-a", now - 2 * S, None).await.unwrap());
    assert!(store.claim(0, "relay-a", now, now + 12 * S).await.unwrap());
    assert!(store.claim(4, "relay-a", now, now + 12 * S).await.unwrap());
    // relay-b: stopped; its lease of bucket 1 lapsed 3 s ago.
    assert!(store
        .heartbeat("relay-b", now - 20 * S, None)
        .await
        .unwrap());
    assert!(store
        .claim(1, "relay-b", now - 60 * S, now - 3 * S)
        .await
        .unwrap());
    assert!(store.stamp_stopped("relay-b", now - 5 * S).await.unwrap());
    // relay-c: heartbeat 100 s old, not stopped, still holds bucket 2 (refused heartbeats).
    assert!(store
        .heartbeat("relay-c", now - 100 * S, None)
        .await
        .unwrap());
    assert!(store.claim(2, "relay-c", now, now + 20 * S).await.unwrap());
    // relay-d: a heartbeat a minute in the future.
    assert!(store
        .heartbeat("relay-d", now + 60 * S, None)
        .await
        .unwrap());
    // relay-x: a live lease beyond the bucket count (a relay with 16 buckets).
    assert!(store.claim(9, "relay-x", now, now + 20 * S).await.unwrap());
    // Bucket 3: never claimed.
    // Bucket 4: owned by relay-a, stuck behind an unreadable item.

    let message = |bucket: u32, age_s: i64| {
        let mut m = writer
            .message("orders")
            .with_partition(bucket as i32)
            .with_value("v");
        m.created_at_ticks = now - age_s * S;
        m
    };
    // Bucket 0 (owned): two messages, the oldest 30 s old.
    writer
        .enqueue(&[message(0, 30), message(0, 10)])
        .await
        .unwrap();
    // Bucket 1 (lapsed): seven messages, over the cap of 5.
    let seven: Vec<OutboxMessage> = (0..7).map(|i| message(1, 100 - i)).collect();
    writer.enqueue(&seven).await.unwrap();
    // Bucket 2 (owned by relay-c): one message through the writer (counter 1), and one put
    // directly at sequence 9: the counter is behind its messages.
    writer.enqueue(&[message(2, 5)]).await.unwrap();
    let raw = schema::message_item(store.keys(), &message(2, 4), 2, 9).unwrap();
    client
        .put_item()
        .table_name(&options.table_name)
        .set_item(Some(raw))
        .send()
        .await
        .unwrap();
    // Bucket 3 (never claimed): a message stamped with bucket count 16 by a foreign
    // writer, with no counter item at all.
    let mut foreign = message(3, 7);
    foreign.bucket_count = 16;
    let raw = schema::message_item(store.keys(), &foreign, 3, 3).unwrap();
    client
        .put_item()
        .table_name(&options.table_name)
        .set_item(Some(raw))
        .send()
        .await
        .unwrap();

    // Bucket 4 (owned): a good message (sequence 1), and before it an item whose topic
    // Kafka would never accept (a poison item the relay cannot read).
    writer.enqueue(&[message(4, 8)]).await.unwrap();
    let mut poison = message(4, 9);
    poison.topic = "not a topic".into();
    let raw = schema::message_item(store.keys(), &poison, 4, 0).unwrap();
    client
        .put_item()
        .table_name(&options.table_name)
        .set_item(Some(raw))
        .send()
        .await
        .unwrap();

    let report = read_status(&store, LEASE).await.unwrap();
    let b = &report.buckets;
    assert_eq!(b.len(), 5, "leases beyond the count are not buckets");

    // Bucket 0: owned, expires in ~12 s, 2 pending, the oldest ~30 s old.
    assert_eq!(b[0].owner.as_deref(), Some("relay-a"));
    assert!(b[0].owned);
    assert!(near(b[0].lease_expires_in_seconds, 12.0, 3.0), "{:?}", b[0]);
    assert_eq!((b[0].pending, b[0].pending_capped), (2, false));
    assert!(near(b[0].oldest_age_seconds, 30.0, 3.0), "{:?}", b[0]);
    assert_eq!((b[0].head_sequence, b[0].last_sequence), (Some(1), Some(2)));
    assert_eq!(b[0].sequence_counter, Some(2));
    assert_eq!(b[0].head_bucket_count, Some(5));

    // Bucket 1: lapsed 3 s ago, capped at 5, the oldest ~100 s old.
    assert_eq!(b[1].owner.as_deref(), Some("relay-b"));
    assert!(!b[1].owned);
    assert!(near(b[1].lease_expires_in_seconds, -3.0, 3.0), "{:?}", b[1]);
    assert_eq!((b[1].pending, b[1].pending_capped), (5, true));
    assert!(near(b[1].oldest_age_seconds, 100.0, 3.0), "{:?}", b[1]);
    assert_eq!(
        (b[1].last_sequence, b[1].sequence_counter),
        (Some(7), Some(7))
    );

    // Bucket 2: owned by the silent relay, counter 1 behind message 9.
    assert_eq!(b[2].owner.as_deref(), Some("relay-c"));
    assert!(b[2].owned);
    assert_eq!(b[2].pending, 2);
    assert_eq!((b[2].head_sequence, b[2].last_sequence), (Some(1), Some(9)));
    assert_eq!(b[2].sequence_counter, Some(1));

    // Bucket 3: never claimed, one foreign message, no counter.
    assert_eq!((b[3].owner.as_deref(), b[3].lease_expires_at), (None, None));
    assert!(!b[3].owned);
    assert_eq!(b[3].pending, 1);
    assert_eq!(b[3].head_bucket_count, Some(16));
    assert_eq!(b[3].sequence_counter, None);

    // Bucket 4: stuck behind its unreadable head.
    assert!(b[4].owned);
    assert!(b[4].head_unreadable);
    assert_eq!((b[4].head_sequence, b[4].last_sequence), (Some(0), Some(1)));
    assert_eq!((b[4].pending, b[4].sequence_counter), (2, Some(1)));
    assert!(b[..4].iter().all(|b| !b.head_unreadable));

    assert_eq!(report.total_pending(), 12);
    assert!(report.any_capped());
    assert_eq!(
        (report.dead_letters, report.dead_letters_capped),
        (0, false)
    );

    // Relays, by id.
    let ids: Vec<&str> = report.relays.iter().map(|r| r.relay_id.as_str()).collect();
    assert_eq!(ids, ["relay-a", "relay-b", "relay-c", "relay-d"]);
    let [a, rb, c, d] = &report.relays[..] else {
        unreachable!()
    };
    assert!(a.active && !a.stopped);
    assert_eq!(a.buckets, [0, 4]);
    assert!(near(Some(a.last_seen_age_seconds), 2.0, 3.0), "{a:?}");
    assert!(rb.stopped && !rb.active);
    assert_eq!(rb.stopped_at, Some(now - 5 * S));
    assert!(rb.buckets.is_empty(), "a lapsed lease is not held");
    assert!(!c.active && !c.stopped);
    assert_eq!(c.buckets, [2]);
    assert!(near(Some(c.last_seen_age_seconds), 100.0, 3.0), "{c:?}");
    assert!(d.last_seen_age_seconds < -50.0, "{d:?}");
    assert!(d.buckets.is_empty());

    // Warnings: exactly the expected ones.
    assert_eq!(
        kinds(&report, WarningKind::PendingWithoutOwner),
        set(&["1", "3"])
    );
    assert_eq!(
        kinds(&report, WarningKind::BucketCountMismatch),
        set(&["3"])
    );
    assert_eq!(
        kinds(&report, WarningKind::SequenceBehind),
        set(&["2", "3"])
    );
    assert_eq!(
        kinds(&report, WarningKind::HeartbeatStale),
        set(&["relay-c"])
    );
    assert_eq!(
        kinds(&report, WarningKind::HeartbeatInFuture),
        set(&["relay-d"])
    );
    assert_eq!(
        kinds(&report, WarningKind::LeaseBeyondBucketCount),
        set(&["9"])
    );
    assert_eq!(kinds(&report, WarningKind::UnreadableHead), set(&["4"]));
    let parked = report
        .warnings_of(WarningKind::UnreadableHead)
        .next()
        .unwrap();
    let head = parked.parked.as_ref().unwrap();
    assert_eq!(head.sequence, Some(0));
    assert_eq!(head.topic.as_deref(), Some("not a topic"));
    assert!(head.reason.contains("cannot be read"), "{}", head.reason);
    assert_eq!(head.command.as_deref(), Some("outboxctl quarantine 4 0"));
    assert!(
        parked.message.contains("outboxctl quarantine 4 0"),
        "{}",
        parked.message
    );
    assert_eq!(kinds(&report, WarningKind::DeadLetters), set(&[]));
    assert_eq!(report.warnings.len(), 9, "{:#?}", report.warnings);
    let mismatch = report
        .warnings_of(WarningKind::BucketCountMismatch)
        .next()
        .unwrap();
    assert!(
        mismatch.message.contains("bucket count 16") && mismatch.message.contains("is 5"),
        "{}",
        mismatch.message
    );
    let unowned: Vec<&str> = report
        .warnings_of(WarningKind::PendingWithoutOwner)
        .map(|w| w.message.as_str())
        .collect();
    assert!(
        unowned[0].contains(">=5 messages") && unowned[0].contains("lapsed"),
        "{}",
        unowned[0]
    );
    assert!(unowned[1].contains("never claimed"), "{}", unowned[1]);

    // The JSON form scripts read (`outboxctl status --json` prints exactly this).
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["buckets"][1]["pending"], 5);
    assert_eq!(json["buckets"][1]["pending_capped"], true);
    assert_eq!(json["buckets"][0]["owner"], "relay-a");
    assert_eq!(json["relays"][1]["stopped"], true);
    let kinds_json: BTreeSet<&str> = json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds_json,
        [
            "bucket_count_mismatch",
            "heartbeat_in_future",
            "heartbeat_stale",
            "lease_beyond_bucket_count",
            "pending_without_owner",
            "sequence_behind",
            "unreadable_head"
        ]
        .into_iter()
        .collect()
    );

    // Nothing is cached: once bucket 1 is drained, relay-a gives bucket 0 up and the poison
    // item is quarantined, the next report says so.
    for seq in 1..=7 {
        client
            .delete_item()
            .table_name(&options.table_name)
            .set_key(Some(
                store
                    .keys()
                    .key(store.keys().message_pk(1), schema::message_sk(seq)),
            ))
            .send()
            .await
            .unwrap();
    }
    assert!(store
        .release(0, "relay-a", Some(now + 12 * S))
        .await
        .unwrap());
    store.quarantine(4, 0).await.unwrap();
    let again = read_status(&store, LEASE).await.unwrap();
    assert!(!again.buckets[4].head_unreadable);
    assert_eq!(again.buckets[4].pending, 1);
    assert_eq!((again.dead_letters, again.dead_letters_capped), (1, false));
    assert_eq!(kinds(&again, WarningKind::UnreadableHead), set(&[]));
    assert_eq!(again.warnings_of(WarningKind::DeadLetters).count(), 1);
    assert_eq!(
        (again.buckets[1].pending, again.buckets[1].has_pending()),
        (0, false)
    );
    assert_eq!(again.buckets[0].owner, None);
    assert!(!again.buckets[0].owned);
    assert_eq!(
        kinds(&again, WarningKind::PendingWithoutOwner),
        set(&["0", "3"])
    );
}

/// With an allow-list, a bucket parked behind a message on another topic (written straight
/// into the table, past every writer's check) is named: bucket, sequence, topic, the
/// reason, and the command that moves it; an unreadable head likewise. What the table
/// holds decides, read with the reader's allow-list: a reader that allows every topic
/// sees no parked head there, and once the head is quarantined the warning is gone.
#[tokio::test]
async fn every_parked_head_is_named_with_its_topic_reason_and_command() {
    let client = dynamodb().await;
    let all = fresh_table(&client, 4).await;
    let list = TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", "orders,billing-*").unwrap();
    let options = all.clone().with_allowed_topics(list);
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let put = |item| {
        client
            .put_item()
            .table_name(&options.table_name)
            .set_item(Some(item))
            .send()
    };
    // Bucket 0: allowed messages only.
    writer
        .enqueue(&[writer.message("orders").with_partition(0)])
        .await
        .unwrap();
    writer
        .enqueue(&[writer.message("billing-eu").with_partition(0)])
        .await
        .unwrap();
    // Bucket 2: a message on "audit" at sequence 3, an allowed one behind it.
    let audit = writer.message("audit").with_partition(2).with_value("v");
    put(schema::message_item(store.keys(), &audit, 2, 3).unwrap())
        .await
        .unwrap();
    let behind = writer.message("orders").with_partition(2);
    put(schema::message_item(store.keys(), &behind, 2, 4).unwrap())
        .await
        .unwrap();
    // Bucket 3: an item without a MessageId (unreadable) on an allowed topic.
    let mut broken = schema::message_item(
        store.keys(),
        &writer.message("orders").with_partition(3),
        3,
        7,
    )
    .unwrap();
    broken.remove("MessageId");
    put(broken).await.unwrap();

    let report = read_status(&store, LEASE).await.unwrap();
    assert_eq!(
        kinds(&report, WarningKind::DisallowedTopicHead),
        set(&["2"])
    );
    assert_eq!(kinds(&report, WarningKind::UnreadableHead), set(&["3"]));
    let w = report
        .warnings_of(WarningKind::DisallowedTopicHead)
        .next()
        .unwrap();
    let head = w.parked.as_ref().unwrap();
    assert_eq!(head.sequence, Some(3));
    assert_eq!(head.topic.as_deref(), Some("audit"));
    assert!(
        head.reason.contains("topic \"audit\" is not allowed here")
            && head
                .reason
                .contains("OUTBOX_ALLOWED_TOPICS: orders,billing-*"),
        "{}",
        head.reason
    );
    assert_eq!(head.command.as_deref(), Some("outboxctl quarantine 2 3"));
    for part in [
        "bucket 2: parked behind",
        "0000000000000000003",
        "topic \"audit\"",
        "outboxctl quarantine 2 3",
        "outboxctl dead-letters",
    ] {
        assert!(w.message.contains(part), "{part}: {}", w.message);
    }
    let u = report
        .warnings_of(WarningKind::UnreadableHead)
        .next()
        .unwrap();
    let head = u.parked.as_ref().unwrap();
    assert_eq!(
        (head.sequence, head.topic.as_deref()),
        (Some(7), Some("orders"))
    );
    assert!(
        head.reason.contains("MessageId is missing"),
        "{}",
        head.reason
    );
    assert_eq!(head.command.as_deref(), Some("outboxctl quarantine 3 7"));
    // The JSON scripts read carries the same.
    let json = serde_json::to_value(&report).unwrap();
    let parked: Vec<&serde_json::Value> = json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "disallowed_topic_head")
        .collect();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0]["bucket"], 2);
    assert_eq!(parked[0]["parked"]["sequence"], 3);
    assert_eq!(parked[0]["parked"]["topic"], "audit");
    assert_eq!(parked[0]["parked"]["command"], "outboxctl quarantine 2 3");

    // A reader allowing every topic: no disallowed head (the unreadable one stays).
    let open = DynamoDbOutboxStore::new(client.clone(), all).unwrap();
    let report = read_status(&open, LEASE).await.unwrap();
    assert_eq!(kinds(&report, WarningKind::DisallowedTopicHead), set(&[]));
    assert_eq!(kinds(&report, WarningKind::UnreadableHead), set(&["3"]));

    // The command in the warning moves it: the bucket is no longer parked.
    store.quarantine(2, 3).await.unwrap();
    let report = read_status(&store, LEASE).await.unwrap();
    assert_eq!(kinds(&report, WarningKind::DisallowedTopicHead), set(&[]));
    assert_eq!(report.buckets[2].head_sequence, Some(4));
    assert_eq!(report.warnings_of(WarningKind::DeadLetters).count(), 1);
}
