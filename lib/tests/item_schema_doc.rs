//! Checks the worked examples of `docs/item-schema.md` against the code: every fenced
//! block whose info string contains `example:KIND` is parsed and compared with what
//! `murmur2`, `compute_bucket`, `headers::encode` and `schema::message_item` produce.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use dynamo_outbox::headers::{self, Header};
use dynamo_outbox::message::{compute_bucket, murmur2, to_positive};
use dynamo_outbox::protocol::clock::ticks_from_system_time;
use dynamo_outbox::protocol::schema::{self, Item, Keys};
use dynamo_outbox::OutboxOptions;
use uuid::Uuid;

mod doc_examples;
use doc_examples::{example_blocks, hex, unix_seconds_of, Example};

const DOC: &str = include_str!("../../docs/item-schema.md");

/// `name: value` lines; a line starting with whitespace continues the previous value.
fn fields(ex: &Example) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in ex.body.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let last = out
                .last_mut()
                .unwrap_or_else(|| panic!("line {}: continuation first", ex.line));
            last.1.push(' ');
            last.1.push_str(line.trim());
            continue;
        }
        let (name, value) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("line {}: {line:?} is not `name: value`", ex.line));
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
    out
}

fn map(ex: &Example) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for (k, v) in fields(ex) {
        assert!(
            m.insert(k.clone(), v).is_none(),
            "line {}: {k} twice",
            ex.line
        );
    }
    m
}

fn get<'a>(m: &'a BTreeMap<String, String>, ex: &Example, name: &str) -> &'a str {
    m.get(name)
        .unwrap_or_else(|| panic!("example at line {} has no {name:?}", ex.line))
}

fn num<T: std::str::FromStr>(m: &BTreeMap<String, String>, ex: &Example, name: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    get(m, ex, name)
        .parse()
        .unwrap_or_else(|e| panic!("line {}: {name}: {e:?}", ex.line))
}

/// Checks murmur2, its hex form and toPositive of `bytes`.
fn check_hash(m: &BTreeMap<String, String>, ex: &Example, bytes: &[u8]) -> i32 {
    let h = murmur2(bytes);
    assert_eq!(h, num::<i32>(m, ex, "murmur2"), "line {}", ex.line);
    assert_eq!(
        format!("{:#010x}", h as u32),
        get(m, ex, "murmur2 (hex)"),
        "line {}",
        ex.line
    );
    assert_eq!(
        to_positive(h),
        num::<u32>(m, ex, "toPositive"),
        "line {}",
        ex.line
    );
    h
}

fn dynamodb_json_item(ex: &Example) -> Item {
    let v: serde_json::Value = serde_json::from_str(&ex.body)
        .unwrap_or_else(|e| panic!("line {}: not JSON: {e}", ex.line));
    let obj = v.as_object().expect("an item is an object");
    let mut item = HashMap::new();
    for (name, typed) in obj {
        let typed = typed.as_object().expect("a typed value");
        assert_eq!(typed.len(), 1, "line {}: {name} has one type", ex.line);
        let (t, val) = typed.iter().next().unwrap();
        let val = val.as_str().expect("values are strings in DynamoDB JSON");
        let av = match t.as_str() {
            "S" => AttributeValue::S(val.into()),
            "N" => AttributeValue::N(val.into()),
            "B" => AttributeValue::B(Blob::new(
                base64::engine::general_purpose::STANDARD
                    .decode(val)
                    .expect("base64"),
            )),
            other => panic!("line {}: type {other}", ex.line),
        };
        item.insert(name.clone(), av);
    }
    item
}

/// A `keys` example: every key the item schema names, from the prefix, bucket and sequence.
fn check_keys(ex: &Example) {
    let m = map(ex);
    let k = Keys::new(&OutboxOptions::new("orders-outbox").with_key_prefix(get(&m, ex, "prefix")));
    let bucket: u32 = num(&m, ex, "bucket");
    let sequence: u64 = num(&m, ex, "sequence");
    assert_eq!(k.message_pk(bucket), get(&m, ex, "message PK"));
    assert_eq!(schema::message_sk(sequence), get(&m, ex, "message SK"));
    assert_eq!(k.sequence_pk(bucket), get(&m, ex, "counter PK"));
    assert_eq!(schema::SEQUENCE_SK, get(&m, ex, "counter SK"));
    assert_eq!(k.coordination_pk(), get(&m, ex, "lease PK"));
    assert_eq!(schema::lease_sk(bucket), get(&m, ex, "lease SK"));
    assert_eq!(
        schema::relay_sk(get(&m, ex, "relay id")),
        get(&m, ex, "heartbeat SK")
    );
    assert_eq!(
        k.idempotency_pk(get(&m, ex, "idempotency key")),
        get(&m, ex, "idempotency PK")
    );
    assert_eq!(schema::IDEMPOTENCY_SK, get(&m, ex, "idempotency SK"));
    assert_eq!(k.dead_letter_pk(), get(&m, ex, "dead letter PK"));
    assert_eq!(
        schema::dead_letter_sk(bucket, sequence),
        get(&m, ex, "dead letter SK")
    );
}

/// A `ticks` example: UTC, Unix seconds and .NET ticks agree.
fn check_ticks(ex: &Example) {
    let m = map(ex);
    let secs: i64 = num(&m, ex, "unix seconds");
    assert_eq!(
        unix_seconds_of(get(&m, ex, "UTC")),
        secs,
        "line {}",
        ex.line
    );
    let t = UNIX_EPOCH + Duration::from_secs(secs as u64);
    assert_eq!(ticks_from_system_time(t), num::<i64>(&m, ex, "ticks"));
}

/// A `bucket` or `partition` example: the key's bytes, its hash and its bucket.
fn check_bucket(ex: &Example) {
    let m = map(ex);
    let key = get(&m, ex, "key (UTF-8)").as_bytes().to_vec();
    let count: u32 = num(&m, ex, "bucket count");
    let partition = m.get("partition").map(|p| p.parse::<i32>().unwrap());
    if ex.kind == "bucket" {
        assert_eq!(hex(&key), get(&m, ex, "key bytes"), "line {}", ex.line);
        check_hash(&m, ex, &key);
    } else {
        assert!(partition.is_some(), "line {}: a partition", ex.line);
    }
    // The id does not matter for a keyed message.
    let bucket = compute_bucket(Some(&key), partition, &Uuid::new_v4(), count);
    assert_eq!(bucket, num::<u32>(&m, ex, "bucket"), "line {}", ex.line);
}

/// A `keyless` example: the message id's bytes, their hash and the bucket.
fn check_keyless(ex: &Example) {
    let m = map(ex);
    let id = Uuid::parse_str(get(&m, ex, "message id")).unwrap();
    let bytes = id.to_bytes_le();
    assert_eq!(hex(&bytes), get(&m, ex, "id bytes"), "line {}", ex.line);
    check_hash(&m, ex, &bytes);
    let count: u32 = num(&m, ex, "bucket count");
    assert_eq!(
        compute_bucket(None, None, &id, count),
        num::<u32>(&m, ex, "bucket"),
        "line {}",
        ex.line
    );
}

/// A `headers` example: the header blob, as bytes and base64, both ways.
fn check_headers(ex: &Example) {
    let mut list = Vec::new();
    let mut bytes = None;
    let mut b64 = None;
    for (name, value) in fields(ex) {
        match name.as_str() {
            "header" => {
                let (k, v) = value.split_once(" = ").expect("header: k = v");
                list.push(if v == "null" {
                    Header::null(k)
                } else {
                    let text = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .expect("a quoted value or null");
                    Header::new(k, text.as_bytes().to_vec())
                });
            }
            "bytes" => bytes = Some(value),
            "base64" => b64 = Some(value),
            other => panic!("line {}: unknown field {other}", ex.line),
        }
    }
    let blob = headers::encode(&list).unwrap().expect("headers present");
    assert_eq!(hex(&blob), bytes.expect("bytes"), "line {}", ex.line);
    assert_eq!(
        base64::engine::general_purpose::STANDARD.encode(&blob),
        b64.expect("base64"),
        "line {}",
        ex.line
    );
    assert_eq!(headers::decode(&blob).unwrap(), list);
}

/// A `message-item` example: parsed, and rebuilt byte for byte by the writer's code.
fn check_message_item(keys: &Keys, ex: &Example) {
    let item = dynamodb_json_item(ex);
    let stored =
        schema::parse_message(keys, &item).unwrap_or_else(|e| panic!("line {}: {e}", ex.line));
    assert_eq!(
        stored.message.bucket(),
        stored.bucket,
        "line {}: the partition key's bucket is the message's bucket",
        ex.line
    );
    assert_eq!(
        stored.message.message_id.hyphenated().to_string(),
        schema::get_s(&item, "MessageId").unwrap(),
        "line {}: the id is lowercase and hyphenated",
        ex.line
    );
    let rebuilt =
        schema::message_item(keys, &stored.message, stored.bucket, stored.sequence).unwrap();
    assert_eq!(
        rebuilt, item,
        "line {}: the item is exactly what the writer puts",
        ex.line
    );
}

#[test]
fn worked_examples_match_the_code() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let keys = Keys::new(&OutboxOptions::new("orders-outbox"));
    for ex in example_blocks(DOC, "docs/item-schema.md") {
        *seen.entry(ex.kind.clone()).or_default() += 1;
        match ex.kind.as_str() {
            "keys" => check_keys(&ex),
            "ticks" => check_ticks(&ex),
            "bucket" | "partition" => check_bucket(&ex),
            "keyless" => check_keyless(&ex),
            "headers" => check_headers(&ex),
            "message-item" => check_message_item(&keys, &ex),
            other => panic!("line {}: unknown example kind {other}", ex.line),
        }
    }
    let expected = [
        ("keys", 1),
        ("ticks", 1),
        ("bucket", 4),
        ("partition", 1),
        ("keyless", 1),
        ("headers", 1),
        ("message-item", 3),
    ];
    for (kind, n) in expected {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= n,
            "the document lost its {kind} examples: {seen:?}"
        );
    }
}
