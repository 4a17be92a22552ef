//! The item schema: key formats, attribute names, and message items in both directions.
//!
//! | Item | Partition key | Sort key |
//! |---|---|---|
//! | Message | `{prefix}#MESSAGES#{bucket}` | sequence, 19 digits, zero padded |
//! | Sequence counter | `{prefix}#SEQUENCE#{bucket}` | `SEQUENCE` |
//! | Lease | `{prefix}#COORDINATION` | `LEASE#{bucket, 10 digits}` |
//! | Relay heartbeat | `{prefix}#COORDINATION` | `RELAY#{relayId}` |
//! | Idempotency marker (this project) | `{prefix}#IDEMPOTENCY#{key}` | `IDEMPOTENCY` |
//! | Dead letter (this project) | `{prefix}#DEADLETTER` | `{bucket, 10 digits}#{sequence, 19 digits}` |
//! | Continuation (this project) | `{prefix}#CONTINUATION#{relayId}` | run start, Unix ms, 20 digits |
//! | Wake-up (this project) | `{prefix}#WAKEUP` | time, Unix ms, 20 digits, `#`, request id |
//!
//! `{bucket}` in a partition key is plain decimal. The last four rows are this project's
//! additions; they live in partitions no relay of the specification reads.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::headers;
use crate::message::{OutboxMessage, StoredMessage};
use crate::options::OutboxOptions;

/// A DynamoDB item.
pub type Item = HashMap<String, AttributeValue>;

use crate::attr;

/// Sort key of a sequence counter.
pub const SEQUENCE_SK: &str = "SEQUENCE";
/// Sort key prefix of a lease.
pub const LEASE_SK_PREFIX: &str = "LEASE#";
/// Sort key prefix of a relay heartbeat.
pub const RELAY_SK_PREFIX: &str = "RELAY#";
/// Sort key of an idempotency marker.
pub const IDEMPOTENCY_SK: &str = "IDEMPOTENCY";

pub use crate::protocol::attr::MAX_ITEM_BYTES;
/// DynamoDB's limit of items in one transaction.
pub const MAX_TRANSACTION_ITEMS: usize = 100;
/// DynamoDB's limit of bytes in one transaction (4 MB).
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// Key formats of one outbox (prefix and key attribute names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// Prefix of every partition key.
    pub prefix: String,
    /// Name of the partition key attribute.
    pub pk: String,
    /// Name of the sort key attribute.
    pub sk: String,
}

impl Keys {
    /// The key formats of `options`.
    pub fn new(options: &OutboxOptions) -> Self {
        Keys {
            prefix: options.key_prefix.clone(),
            pk: options.partition_key_attribute.clone(),
            sk: options.sort_key_attribute.clone(),
        }
    }

    /// Partition key of a bucket's messages.
    pub fn message_pk(&self, bucket: u32) -> String {
        format!("{}{bucket}", self.messages_prefix())
    }

    /// What every message partition key of this outbox starts with (`{prefix}#MESSAGES#`),
    /// for a `begins_with` filter or a stream filter.
    pub fn messages_prefix(&self) -> String {
        format!("{}#MESSAGES#", self.prefix)
    }

    /// Partition key of a bucket's sequence counter.
    pub fn sequence_pk(&self, bucket: u32) -> String {
        format!("{}#SEQUENCE#{bucket}", self.prefix)
    }

    /// Partition key of the leases and heartbeats.
    pub fn coordination_pk(&self) -> String {
        format!("{}#COORDINATION", self.prefix)
    }

    /// Partition key of an idempotency marker.
    pub fn idempotency_pk(&self, key: &str) -> String {
        format!("{}#IDEMPOTENCY#{key}", self.prefix)
    }

    /// Partition key of a relay's continuation: one partition per relay id, one item
    /// per run that asked for a successor (sort key [`continuation_sk`]).
    pub fn continuation_pk(&self, relay_id: &str) -> String {
        format!("{}{relay_id}", self.continuations_prefix())
    }

    /// What every continuation's partition key starts with (`{prefix}#CONTINUATION#`),
    /// for a stream filter.
    pub fn continuations_prefix(&self) -> String {
        format!("{}#CONTINUATION#", self.prefix)
    }

    /// Partition key of the wake-ups about to join (one item per woken host that found
    /// uncovered buckets with messages, sort key [`wakeup_sk`]): the first of a burst
    /// joins, the others wait for it.
    pub fn wakeup_pk(&self) -> String {
        format!("{}#WAKEUP", self.prefix)
    }

    /// Partition key of the dead letters.
    pub fn dead_letter_pk(&self) -> String {
        format!("{}#DEADLETTER", self.prefix)
    }

    /// The key of an item as the two key attributes.
    pub fn key(&self, pk: String, sk: String) -> Item {
        HashMap::from([
            (self.pk.clone(), AttributeValue::S(pk)),
            (self.sk.clone(), AttributeValue::S(sk)),
        ])
    }

    /// The bucket of a message partition key of this outbox (`{prefix}#MESSAGES#{bucket}`),
    /// if it is one.
    pub fn message_bucket(&self, pk: &str) -> Option<u32> {
        let digits = pk
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("#MESSAGES#")?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// Reads the string key attributes of an item (empty strings when missing).
    pub fn key_of<'a>(&self, item: &'a Item) -> (&'a str, &'a str) {
        let get = |name: &str| {
            item.get(name)
                .and_then(|v| v.as_s().ok())
                .map_or("", |s| s.as_str())
        };
        (get(&self.pk), get(&self.sk))
    }
}

/// The largest sequence number a message's sort key holds (19 digits).
pub const MAX_SEQUENCE: u64 = 9_999_999_999_999_999_999;

/// Sort key of a continuation: the run's start in Unix milliseconds, 20 digits.
pub fn continuation_sk(run_start_ms: u64) -> String {
    format!("{run_start_ms:020}")
}

/// Sort key of a wake-up: its time in Unix milliseconds (20 digits), `#`, its request id;
/// so the wake-ups of a partition sort by time, then by request id.
pub fn wakeup_sk(at_ms: u64, request_id: &str) -> String {
    format!("{at_ms:020}#{request_id}")
}

/// Sort key of a message: the sequence number, 19 digits, zero padded.
pub fn message_sk(sequence: u64) -> String {
    format!("{sequence:019}")
}

/// Sort key of a lease: `LEASE#` and the bucket, 10 digits, zero padded.
pub fn lease_sk(bucket: u32) -> String {
    format!("{LEASE_SK_PREFIX}{bucket:010}")
}

/// Sort key of a heartbeat.
pub fn relay_sk(relay_id: &str) -> String {
    format!("{RELAY_SK_PREFIX}{relay_id}")
}

/// Sort key of a dead letter.
pub fn dead_letter_sk(bucket: u32, sequence: u64) -> String {
    format!("{bucket:010}#{sequence:019}")
}

/// The sequence number of a message sort key.
pub fn parse_message_sk(sk: &str) -> Option<u64> {
    if sk.len() != 19 || !sk.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    sk.parse().ok()
}

/// The bucket of a lease sort key.
pub fn parse_lease_sk(sk: &str) -> Option<u32> {
    let digits = sk.strip_prefix(LEASE_SK_PREFIX)?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A number attribute.
pub fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A string attribute.
pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// Reads a number attribute, `None` when absent or not a number.
pub fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> Option<T> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

/// Reads a string attribute, `None` when absent or not a string.
pub fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

/// The item of a message at `bucket` / `sequence`.
pub fn message_item(
    keys: &Keys,
    message: &OutboxMessage,
    bucket: u32,
    sequence: u64,
) -> Result<Item> {
    let mut item = keys.key(keys.message_pk(bucket), message_sk(sequence));
    item.insert(
        attr::MESSAGE_ID.into(),
        s(message.message_id.hyphenated().to_string()),
    );
    item.insert(attr::TOPIC.into(), s(message.topic.clone()));
    if let Some(k) = &message.key {
        item.insert(attr::KEY.into(), AttributeValue::B(Blob::new(k.clone())));
    }
    if let Some(v) = &message.value {
        item.insert(attr::VALUE.into(), AttributeValue::B(Blob::new(v.clone())));
    }
    let blob =
        headers::encode(&message.headers).map_err(|e| Error::message("headers", e.to_string()))?;
    if let Some(h) = blob {
        item.insert(attr::HEADERS.into(), AttributeValue::B(Blob::new(h)));
    }
    if let Some(p) = message.partition {
        item.insert(attr::PARTITION.into(), n(p));
    }
    item.insert(attr::CREATED_AT.into(), n(message.created_at_ticks));
    item.insert(attr::BUCKET_COUNT.into(), n(message.bucket_count));
    Ok(item)
}

/// Reads a message item; an item that cannot be a message is [`Error::Corrupt`] naming its key.
///
/// A missing `BucketCount` reads as `0` (not stamped, not checked).
pub fn parse_message(keys: &Keys, item: &Item) -> Result<StoredMessage> {
    let (pk, sk) = keys.key_of(item);
    let corrupt_by = |reason: String, source: Option<crate::error::BoxError>| Error::Corrupt {
        pk: pk.to_string(),
        sk: sk.to_string(),
        reason,
        source,
    };
    let corrupt = |reason: String| corrupt_by(reason, None);
    let bucket = pk
        .strip_prefix(&keys.prefix)
        .and_then(|r| r.strip_prefix("#MESSAGES#"))
        .and_then(|b| b.parse::<u32>().ok())
        .ok_or_else(|| corrupt("partition key is not a message partition".into()))?;
    let sequence = parse_message_sk(sk)
        .ok_or_else(|| corrupt("sort key is not a 19-digit sequence number".into()))?;
    let message_id = get_s(item, attr::MESSAGE_ID)
        .ok_or_else(|| corrupt("MessageId is missing or not a string".into()))?;
    let message_id = Uuid::parse_str(message_id).map_err(|e| {
        corrupt_by(
            format!("MessageId {message_id:?} is not a UUID"),
            Some(Box::new(e)),
        )
    })?;
    let topic = get_s(item, attr::TOPIC)
        .ok_or_else(|| corrupt("Topic is missing or not a string".into()))?;
    crate::message::validate_topic(topic).map_err(|rule| corrupt(format!("Topic {rule}")))?;
    let blob = |name: &str| -> Result<Option<Vec<u8>>> {
        match item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::B(b)) => Ok(Some(b.as_ref().to_vec())),
            Some(_) => Err(corrupt(format!("{name} is not binary"))),
        }
    };
    let number = |name: &str| -> Result<Option<i64>> {
        match item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::N(v)) => v
                .parse()
                .map(Some)
                .map_err(|_| corrupt(format!("{name} {v:?} is not a whole number"))),
            Some(_) => Err(corrupt(format!("{name} is not a number"))),
        }
    };
    let headers = match blob(attr::HEADERS)? {
        None => Vec::new(),
        Some(b) => headers::decode(&b)
            .map_err(|e| corrupt_by("Headers cannot be decoded".into(), Some(Box::new(e))))?,
    };
    let partition = match number(attr::PARTITION)? {
        None => None,
        Some(p) => Some(
            i32::try_from(p)
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| corrupt(format!("Partition {p} is out of range")))?,
        ),
    };
    let created_at_ticks =
        number(attr::CREATED_AT)?.ok_or_else(|| corrupt("CreatedAtUtc is missing".into()))?;
    let bucket_count = match number(attr::BUCKET_COUNT)? {
        None => 0,
        Some(c) => {
            u32::try_from(c).map_err(|_| corrupt(format!("BucketCount {c} is out of range")))?
        }
    };
    Ok(StoredMessage {
        bucket,
        sequence,
        message: OutboxMessage {
            message_id,
            topic: topic.to_string(),
            key: blob(attr::KEY)?,
            value: blob(attr::VALUE)?,
            headers,
            partition,
            created_at_ticks,
            bucket_count,
        },
    })
}

/// DynamoDB's size of an item in bytes: attribute names plus values (numbers counted at
/// their upper bound of 21 bytes), as its 400 KB limit counts them.
pub fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, v)| name.len() + value_size(v))
        .sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::N(_) => 21,
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| 1 + k.len() + value_size(v))
                .sum::<usize>()
        }
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => 21 * v.len(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Header;

    fn keys() -> Keys {
        Keys::new(&OutboxOptions::new("orders-outbox"))
    }

    #[test]
    fn key_formats_match_the_spec() {
        let k = keys();
        assert_eq!(k.message_pk(3), "OUTBOX#MESSAGES#3");
        assert_eq!(k.message_bucket("OUTBOX#MESSAGES#3"), Some(3));
        for other in [
            "OUTBOX#MESSAGES#",
            "OUTBOX#MESSAGES#3x",
            "OTHER#MESSAGES#3",
            "OUTBOX#SEQUENCE#3",
            "OUTBOX#MESSAGES#-1",
        ] {
            assert_eq!(k.message_bucket(other), None, "{other}");
        }
        assert_eq!(k.sequence_pk(12), "OUTBOX#SEQUENCE#12");
        assert_eq!(k.coordination_pk(), "OUTBOX#COORDINATION");
        assert_eq!(message_sk(42), "0000000000000000042");
        assert_eq!(lease_sk(3), "LEASE#0000000003");
        assert_eq!(relay_sk("r-1"), "RELAY#r-1");
        assert_eq!(parse_message_sk("0000000000000000042"), Some(42));
        assert_eq!(parse_message_sk("42"), None);
        assert_eq!(parse_lease_sk("LEASE#0000000003"), Some(3));
        assert_eq!(parse_lease_sk("LEASE#3"), None);
        assert_eq!(parse_lease_sk("RELAY#x"), None);
    }

    #[test]
    fn message_item_round_trips() {
        let k = keys();
        let m = OutboxMessage::new("orders", 8)
            .with_key(b"k1".to_vec())
            .with_value(b"v".to_vec())
            .with_header(Header::new("h", b"1".to_vec()))
            .with_header(Header::null("n"))
            .with_partition(2);
        let item = message_item(&k, &m, 2, 7).unwrap();
        assert_eq!(item["PK"], s("OUTBOX#MESSAGES#2"));
        assert_eq!(item["SK"], s("0000000000000000007"));
        assert_eq!(item[attr::MESSAGE_ID], s(m.message_id.to_string()));
        assert_eq!(item[attr::BUCKET_COUNT], n(8));
        let back = parse_message(&k, &item).unwrap();
        assert_eq!((back.bucket, back.sequence), (2, 7));
        assert_eq!(back.message, m);
    }

    #[test]
    fn absent_and_empty_are_distinct() {
        let k = keys();
        let keyless = OutboxMessage::new("t", 8);
        let item = message_item(&k, &keyless, 0, 1).unwrap();
        assert!(
            !item.contains_key(attr::KEY)
                && !item.contains_key(attr::VALUE)
                && !item.contains_key(attr::HEADERS)
        );
        let empty = OutboxMessage::new("t", 8)
            .with_key(Vec::new())
            .with_value(Vec::new());
        let item = message_item(&k, &empty, 0, 1).unwrap();
        let back = parse_message(&k, &item).unwrap().message;
        assert_eq!((back.key, back.value), (Some(vec![]), Some(vec![])));
    }

    #[test]
    fn corrupt_items_name_their_key() {
        let k = keys();
        let m = OutboxMessage::new("t", 8);
        let mut item = message_item(&k, &m, 1, 5).unwrap();
        item.remove(attr::MESSAGE_ID);
        let e = parse_message(&k, &item).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unreadable item OUTBOX#MESSAGES#1/0000000000000000005: MessageId is missing or not a string"
        );
        let mut item = message_item(&k, &m, 1, 5).unwrap();
        item.insert(attr::HEADERS.into(), AttributeValue::B(Blob::new(vec![9])));
        let e = parse_message(&k, &item).unwrap_err();
        assert!(e.to_string().ends_with("Headers cannot be decoded"), "{e}");
        // the decoding error stays the source
        let source = std::error::Error::source(&e).expect("the header error as the source");
        assert_eq!(source.to_string(), "unknown header format version 9");
        let mut item = message_item(&k, &m, 1, 5).unwrap();
        item.insert(attr::TOPIC.into(), s(""));
        assert!(matches!(
            parse_message(&k, &item),
            Err(Error::Corrupt { .. })
        ));
        let mut item = message_item(&k, &m, 1, 5).unwrap();
        item.insert(attr::KEY.into(), s("not binary"));
        assert!(parse_message(&k, &item)
            .unwrap_err()
            .to_string()
            .ends_with("Key is not binary"));
    }
}
