//! The Kafka publisher against the local broker (Apache Kafka), read back with an independent
//! client (`scripts/kafka.py`, librdkafka through confluent-kafka).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dynamo_outbox::error::Rejection;
use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::message::{murmur2, to_positive};
use dynamo_outbox::publish::{KafkaCompression, KafkaConfig, KafkaPublisher, Publisher};
use dynamo_outbox::{Error, Header, OutboxMessage};
use outbox_testkit::{random_name, stack_var};

const HEADER: &str = dynamo_outbox::publish::DEFAULT_MESSAGE_ID_HEADER;

async fn publisher() -> KafkaPublisher {
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let config = KafkaConfig::from_env().expect("KAFKA_* variables of the stack");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    KafkaPublisher::connect(config, deadline)
        .await
        .expect("connect to the local broker")
}

fn stored(messages: Vec<OutboxMessage>) -> Vec<StoredMessage> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| StoredMessage::new(0, i as u64 + 1, message))
        .collect()
}

/// A record as the independent client read it.
type Read = outbox_testkit::DecodedRecord;

/// Every record of `topic`, read by the independent client; fails unless there are `expect`.
fn read_topic(topic: &str, expect: usize) -> Vec<Read> {
    outbox_testkit::try_read_records(&["read", topic, "--expect", &expect.to_string()])
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|r| r.decoded())
        .collect()
}

fn java_partition(key: &[u8], partitions: u32) -> i32 {
    (to_positive(murmur2(key)) % partitions) as i32
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn records_land_where_the_java_client_puts_them_with_headers_and_order() {
    const PARTITIONS: u32 = 6;
    let publisher = publisher().await;
    let topic = random_name("publish");
    assert!(publisher
        .create_topic(&topic, PARTITIONS as i32, 1)
        .await
        .expect("create topic"));
    assert!(!publisher
        .create_topic(&topic, PARTITIONS as i32, 1)
        .await
        .unwrap());
    assert_eq!(
        publisher.partition_count(&topic).await.unwrap(),
        Some(PARTITIONS)
    );

    let keys: [&[u8]; 5] = [
        b"foobar",
        b"21",
        b"a-little-bit-long-string",
        b"",
        &[0, 0xff, 0x80],
    ];
    let mut messages = Vec::new();
    for i in 0..30usize {
        let key = keys[i % keys.len()];
        messages.push(
            OutboxMessage::new(&topic, 8)
                .with_key(key)
                .with_value(format!("value-{i}"))
                .with_header(Header::new("trace", format!("t{i}")))
                .with_header(Header::new("binary", vec![0u8, 0xff, i as u8]))
                .with_header(Header::null("nullable")),
        );
    }
    // explicit partition beats the key; keyless records; a tombstone
    messages.push(
        OutboxMessage::new(&topic, 8)
            .with_key("foobar")
            .with_partition(5)
            .with_value("explicit"),
    );
    messages.push(OutboxMessage::new(&topic, 8).with_value("keyless-1"));
    messages.push(OutboxMessage::new(&topic, 8).with_key("foobar"));
    messages.push(OutboxMessage::new(&topic, 8).with_value("keyless-2"));
    let batch = stored(messages);

    let before = now_ms();
    let outcome = publisher.publish(&batch).await;
    let after = now_ms();
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.acknowledged, batch.len());

    let records = read_topic(&topic, batch.len());
    let by_id: HashMap<String, &Read> = records
        .iter()
        .map(|r| {
            let ids: Vec<_> = r.headers.iter().filter(|(k, _)| k == HEADER).collect();
            assert_eq!(ids.len(), 1, "one message-id header: {r:?}");
            let id = String::from_utf8(ids[0].1.clone().expect("id header has a value")).unwrap();
            (id, r)
        })
        .collect();
    // Every message exactly once: the ids read are the ids published, and as many records
    // as ids (so none was read twice).
    let written: BTreeSet<String> = batch
        .iter()
        .map(|s| s.message.message_id.hyphenated().to_string())
        .collect();
    let read: BTreeSet<String> = by_id.keys().cloned().collect();
    assert_eq!(read, written, "the ids read are the ids published");
    assert_eq!(records.len(), written.len(), "no message read twice");

    let mut keyless_partitions = Vec::new();
    for s in &batch {
        let m = &s.message;
        let id = m.message_id.hyphenated().to_string();
        assert_eq!(id, id.to_lowercase());
        let r = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("message {id} not in the topic"));
        // partition: explicit, else the Java partitioner, keyless all together
        match (m.partition, &m.key) {
            (Some(p), _) => assert_eq!(r.partition, p),
            (None, Some(k)) => assert_eq!(r.partition, java_partition(k, PARTITIONS), "key {k:?}"),
            (None, None) => keyless_partitions.push(r.partition),
        }
        // bytes through unchanged
        assert_eq!(r.key, m.key);
        assert_eq!(r.value, m.value);
        // headers: the user's exactly (in order, the null as null), then the id
        let mut expected: Vec<(String, Option<Vec<u8>>)> = m
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        expected.push((HEADER.to_owned(), Some(id.clone().into_bytes())));
        assert_eq!(r.headers, expected);
        // publish time, as CreateTime
        assert_eq!(r.timestamp_type.as_deref(), Some("create"));
        let ts = r.timestamp.unwrap();
        assert!(
            before <= ts && ts <= after,
            "timestamp {ts} outside [{before}, {after}]"
        );
    }
    assert_eq!(keyless_partitions.len(), 2);
    assert_eq!(
        keyless_partitions[0], keyless_partitions[1],
        "keyless records stick together"
    );

    // order inside each partition follows the batch (sequence) order
    let sequence_of: HashMap<String, u64> = batch
        .iter()
        .map(|s| (s.message.message_id.hyphenated().to_string(), s.sequence))
        .collect();
    let mut per_partition: HashMap<i32, Vec<(i64, u64)>> = HashMap::new();
    for (id, r) in &by_id {
        per_partition
            .entry(r.partition)
            .or_default()
            .push((r.offset, sequence_of[id]));
    }
    assert!(per_partition.len() > 1, "the keys spread over partitions");
    for (p, mut v) in per_partition {
        v.sort();
        assert!(
            v.windows(2).all(|w| w[0].1 < w[1].1),
            "partition {p} out of order: {v:?}"
        );
    }
}

/// Headers arrive as the writer made them: in order, a repeated key repeated, a null value
/// null (librdkafka reports it as `None`, an empty value as `b""`), and the message-id
/// header once and last, replacing a stored header of that name.
#[tokio::test]
async fn headers_arrive_byte_for_byte_in_order_with_the_id_last() {
    let publisher = publisher().await;
    let topic = random_name("publish-headers");
    publisher.create_topic(&topic, 1, 1).await.unwrap();
    let headers = |m: OutboxMessage| {
        m.with_header(Header::new("z-first", "1"))
            .with_header(Header::null("nul"))
            .with_header(Header::new("dup", "a"))
            .with_header(Header::new("dup", "b"))
            .with_header(Header::new("a-last", ""))
    };
    let plain = headers(OutboxMessage::new(&topic, 8).with_key("k"));
    // a stored message-id header, in the middle: replaced by the stamped one, at the end
    let spoofed = headers(
        OutboxMessage::new(&topic, 8)
            .with_key("k")
            .with_header(Header::new(HEADER, "spoofed")),
    )
    .with_header(Header::new("after", vec![0u8, 0xff]));
    let batch = stored(vec![plain, spoofed]);
    let outcome = publisher.publish(&batch).await;
    assert_eq!(
        (outcome.acknowledged, outcome.error.is_none()),
        (2, true),
        "{:?}",
        outcome.error
    );
    let mut records = read_topic(&topic, 2);
    records.sort_by_key(|r| r.offset);
    let h = |k: &str, v: Option<&[u8]>| (k.to_owned(), v.map(<[u8]>::to_vec));
    let user = [
        h("z-first", Some(b"1")),
        h("nul", None),
        h("dup", Some(b"a")),
        h("dup", Some(b"b")),
        h("a-last", Some(b"")),
    ];
    let id = |s: &StoredMessage| s.message.message_id.hyphenated().to_string();
    let mut expected = user.to_vec();
    expected.push(h(HEADER, Some(id(&batch[0]).as_bytes())));
    assert_eq!(records[0].headers, expected);
    let mut expected = user.to_vec();
    expected.push(h("after", Some(&[0, 0xff])));
    expected.push(h(HEADER, Some(id(&batch[1]).as_bytes())));
    assert_eq!(records[1].headers, expected);
}

#[tokio::test]
async fn a_rejected_record_ends_the_acknowledged_prefix() {
    let publisher = publisher().await;
    let topic = random_name("publish-rej");
    publisher.create_topic(&topic, 2, 1).await.unwrap();
    let missing = random_name("no-such-topic");

    // unknown topic in the middle: the messages before it are acknowledged
    let first = stored(vec![
        OutboxMessage::new(&topic, 8).with_key("a").with_value("1"),
        OutboxMessage::new(&topic, 8).with_key("b").with_value("2"),
        OutboxMessage::new(&missing, 8).with_value("lost"),
        OutboxMessage::new(&topic, 8).with_key("a").with_value("3"),
    ]);
    let outcome = publisher.publish(&first).await;
    assert_eq!(outcome.acknowledged, 2);
    match outcome.error {
        Some(Error::KafkaRejected {
            topic: t,
            reason: Rejection::UnknownTopic,
            ..
        }) => {
            assert_eq!(t, missing)
        }
        other => panic!("expected an unknown-topic rejection, got {other:?}"),
    }

    // an explicit partition the topic lacks
    let second = stored(vec![
        OutboxMessage::new(&topic, 8).with_value("4"),
        OutboxMessage::new(&topic, 8)
            .with_partition(7)
            .with_value("nowhere"),
    ]);
    let outcome = publisher.publish(&second).await;
    assert_eq!(outcome.acknowledged, 1);
    assert!(
        matches!(
            outcome.error,
            Some(Error::KafkaRejected {
                reason: Rejection::UnknownPartition,
                ..
            })
        ),
        "{:?}",
        outcome.error
    );
    assert!(!outcome.error.unwrap().is_retryable());

    // what was acknowledged is in the topic, once (the message after the rejection was
    // not sent): the ids read are the acknowledged ones
    let records = read_topic(&topic, 3);
    let read: BTreeSet<String> = records
        .iter()
        .filter_map(|r| {
            let (_, id) = r.headers.iter().find(|(k, _)| k == HEADER)?;
            String::from_utf8(id.clone()?).ok()
        })
        .collect();
    let acknowledged: BTreeSet<String> = [&first[0], &first[1], &second[0]]
        .iter()
        .map(|s| s.message.message_id.hyphenated().to_string())
        .collect();
    assert_eq!(read, acknowledged);
    assert_eq!(records.len(), acknowledged.len(), "none read twice");
    let mut values: Vec<String> = records
        .into_iter()
        .filter_map(|r| r.value)
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    values.sort();
    assert_eq!(values, ["1", "2", "4"]);
}

#[tokio::test]
async fn large_groups_go_out_in_several_requests_in_order() {
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let mut config = KafkaConfig::from_env().unwrap();
    config.max_request_bytes = 4096; // about 7 records of 500 bytes per request
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let publisher = KafkaPublisher::connect(config, deadline).await.unwrap();
    let topic = random_name("publish-big");
    publisher.create_topic(&topic, 3, 1).await.unwrap();

    let batch = stored(
        (0..60u8)
            .map(|i| {
                OutboxMessage::new(&topic, 8)
                    .with_key(vec![i % 2])
                    .with_value(vec![i; 500])
            })
            .collect(),
    );
    let before = publisher.produce_requests();
    let outcome = publisher.publish(&batch).await;
    assert_eq!(
        (outcome.acknowledged, outcome.error.is_none()),
        (60, true),
        "{:?}",
        outcome.error
    );
    // 60 records of over 500 bytes in requests of at most 4096: at least 8 requests (at
    // most 7 records each), where one request per partition would carry them all.
    let requests = publisher.produce_requests() - before;
    assert!(
        requests >= 8,
        "{requests} produce requests for 60 x 500 bytes"
    );

    let mut records = read_topic(&topic, 60);
    records.sort_by_key(|r| (r.partition, r.offset));
    for key in [0u8, 1] {
        let values: Vec<u8> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(&[key][..]))
            .map(|r| r.value.as_ref().unwrap()[0])
            .collect();
        let expected: Vec<u8> = (0..60u8).filter(|i| i % 2 == key).collect();
        assert_eq!(values, expected, "key {key} in order");
    }
}

/// Publishes 60 compressible records over 3 partitions with `compression` and reads them
/// back with librdkafka, which decompresses them: every key, value and header as sent.
async fn round_trip_compressed(compression: KafkaCompression) {
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let mut config = KafkaConfig::from_env().unwrap();
    config.compression = compression;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let publisher = KafkaPublisher::connect(config, deadline).await.unwrap();
    let topic = random_name("publish-codec");
    publisher.create_topic(&topic, 3, 1).await.unwrap();
    let batch = stored(
        (0..60u32)
            .map(|i| {
                let value = format!(
                    r#"{{"order_id":"order-{i:05}","customer":"customer-{}","status":"PLACED","items":[{{"sku":"SKU-{:04}","quantity":{},"price":"19.99"}}],"note":"{}"}}"#,
                    i % 7,
                    i * 37 % 1000,
                    i % 5 + 1,
                    "compressible ".repeat(20)
                );
                OutboxMessage::new(&topic, 8)
                    .with_key(format!("customer-{}", i % 7))
                    .with_value(value)
                    .with_header(Header::new("type", "OrderPlaced"))
                    .with_header(Header::null("trace"))
            })
            .collect(),
    );
    let outcome = publisher.publish(&batch).await;
    assert_eq!(
        (outcome.acknowledged, outcome.error.is_none()),
        (60, true),
        "{compression:?}: {:?}",
        outcome.error
    );
    let records = read_topic(&topic, 60);
    let by_id: HashMap<String, &Read> = records
        .iter()
        .map(|r| {
            let (_, id) = r.headers.last().expect("the message-id header");
            (String::from_utf8(id.clone().unwrap()).unwrap(), r)
        })
        .collect();
    assert_eq!(by_id.len(), 60, "{compression:?}: every record once");
    for s in &batch {
        let m = &s.message;
        let id = m.message_id.hyphenated().to_string();
        let r = by_id[&id];
        assert_eq!((&r.key, &r.value), (&m.key, &m.value), "{compression:?}");
        let mut expected: Vec<(String, Option<Vec<u8>>)> = m
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        expected.push((HEADER.to_owned(), Some(id.into_bytes())));
        assert_eq!(r.headers, expected, "{compression:?}");
    }
}

#[tokio::test]
async fn gzip_records_arrive_intact() {
    round_trip_compressed(KafkaCompression::Gzip).await;
}

#[tokio::test]
async fn snappy_records_arrive_intact() {
    round_trip_compressed(KafkaCompression::Snappy).await;
}

#[tokio::test]
async fn lz4_records_arrive_intact() {
    round_trip_compressed(KafkaCompression::Lz4).await;
}

#[tokio::test]
async fn zstd_records_arrive_intact() {
    round_trip_compressed(KafkaCompression::Zstd).await;
}
