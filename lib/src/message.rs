//! The outbox message and its bucket (Kafka's murmur2 lives here too).

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::headers::Header;
use crate::ticks::ticks_from_system_time;
use crate::trace_context::TraceContext;

/// A Kafka record waiting in the outbox.
///
/// Key and value are stored pre-serialized; the relay passes them through byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// Random (v4) id, stamped on the record as the message-id header so consumers can
    /// deduplicate the copies that at-least-once delivery may produce.
    pub message_id: Uuid,
    /// Topic to publish to.
    pub topic: String,
    /// Serialized key; `None` is a keyless record, `Some(vec![])` a real, empty key.
    pub key: Option<Vec<u8>>,
    /// Serialized value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Record headers, in order.
    pub headers: Vec<Header>,
    /// Explicit Kafka partition; wins over the key for both the bucket and the partition.
    pub partition: Option<i32>,
    /// Enqueue time in UTC ticks; drives the oldest-pending-age metric.
    pub created_at_ticks: i64,
    /// The writer's bucket count, stamped on the item so a relay with another count faults
    /// instead of silently breaking order.
    pub bucket_count: u32,
}

impl OutboxMessage {
    /// A keyless, valueless message for `topic` with a fresh id, created now, for
    /// `bucket_count` buckets. Set the rest with the `with_*` methods.
    pub fn new(topic: impl Into<String>, bucket_count: u32) -> Self {
        OutboxMessage {
            message_id: Uuid::new_v4(),
            topic: topic.into(),
            key: None,
            value: None,
            headers: Vec::new(),
            partition: None,
            created_at_ticks: ticks_from_system_time(std::time::SystemTime::now()),
            bucket_count,
        }
    }

    /// Sets the serialized key.
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the serialized value.
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Appends a header.
    pub fn with_header(mut self, header: Header) -> Self {
        self.headers.push(header);
        self
    }

    /// Stamps the W3C trace context `context` as the `traceparent` (and `tracestate`)
    /// headers, unless the message already carries a `traceparent` header of its own,
    /// which it keeps ([`crate::trace_context`]).
    pub fn with_trace_context(mut self, context: &TraceContext) -> Self {
        crate::trace_context::stamp(&mut self.headers, Some(context));
        self
    }

    /// Sets an explicit partition.
    pub fn with_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The bucket of this message, as every writer and relay computes it.
    pub fn bucket(&self) -> u32 {
        compute_bucket(
            self.key.as_deref(),
            self.partition,
            &self.message_id,
            self.bucket_count,
        )
    }

    /// Checks the message against the rules; `field` prefixes the error's field name
    /// (for example `messages[3]`).
    pub fn validate(&self, field: &str) -> Result<()> {
        validate_topic(&self.topic)
            .map_err(|rule| Error::message(format!("{field}.topic"), rule))?;
        if let Some(p) = self.partition {
            if p < 0 {
                return Err(Error::message(format!("{field}.partition"), "must be >= 0"));
            }
        }
        for (i, h) in self.headers.iter().enumerate() {
            if h.key.is_empty() {
                return Err(Error::message(
                    format!("{field}.headers[{i}].key"),
                    "must not be empty",
                ));
            }
        }
        if self.bucket_count < 1 {
            return Err(Error::message(
                format!("{field}.bucket_count"),
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A message read back from the table, with where it sits: what a relay hands its
/// [`Publisher`](crate::publish::Publisher), one bucket's messages in sequence order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredMessage {
    /// The bucket (from the partition key).
    pub bucket: u32,
    /// The sequence number (from the sort key).
    pub sequence: u64,
    /// The message.
    pub message: OutboxMessage,
}

impl StoredMessage {
    /// `message`, stored at `sequence` of `bucket`.
    pub fn new(bucket: u32, sequence: u64, message: OutboxMessage) -> Self {
        StoredMessage {
            bucket,
            sequence,
            message,
        }
    }
}

/// Checks Kafka's topic name rules: 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic(topic: &str) -> std::result::Result<(), String> {
    if topic.is_empty() {
        return Err("must not be empty".into());
    }
    if topic.len() > 249 {
        return Err(format!(
            "must be at most 249 characters (Kafka's limit), got {}",
            topic.len()
        ));
    }
    if topic == "." || topic == ".." {
        return Err("must not be '.' or '..'".into());
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "may contain only ASCII letters, digits, '.', '_' and '-' (found {c:?})"
        ));
    }
    Ok(())
}

/// The bucket of a message: the explicit partition modulo the count, else Kafka's murmur2
/// of the key, else murmur2 of the message id's 16 mixed-endian bytes.
pub fn compute_bucket(
    key: Option<&[u8]>,
    partition: Option<i32>,
    message_id: &Uuid,
    bucket_count: u32,
) -> u32 {
    let n = bucket_count.max(1);
    if let Some(p) = partition {
        return (p.max(0) as u32) % n;
    }
    let hash = match key {
        Some(k) => murmur2(k),
        None => murmur2(&message_id.to_bytes_le()),
    };
    to_positive(hash) % n
}

/// Kafka's `Utils.toPositive`: clears the sign bit.
pub fn to_positive(h: i32) -> u32 {
    (h & 0x7fff_ffff) as u32
}

/// Kafka's frozen key hash (`Utils.murmur2`, seed `0x9747b28c`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn murmur2_matches_kafka_vectors() {
        // Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (data, expected) in cases {
            assert_eq!(
                murmur2(data),
                expected,
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn bucket_rules() {
        let id = Uuid::parse_str("00112233-4455-6677-8899-aabbccddeeff").unwrap();
        assert_eq!(
            id.to_bytes_le(),
            [
                0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff
            ]
        );
        // explicit partition wins over the key
        assert_eq!(compute_bucket(Some(b"foobar"), Some(13), &id, 8), 5);
        // keyed: toPositive(murmur2) % n
        assert_eq!(
            compute_bucket(Some(b"foobar"), None, &id, 8),
            to_positive(-790_332_482) % 8
        );
        // keyless: hash of the mixed-endian id bytes
        assert_eq!(
            compute_bucket(None, None, &id, 1000),
            to_positive(murmur2(&id.to_bytes_le())) % 1000
        );
        // an empty key is a real key, not keyless
        assert_eq!(
            compute_bucket(Some(b""), None, &id, 1 << 20),
            to_positive(murmur2(b"")) % (1 << 20)
        );
    }

    #[test]
    fn topic_rules() {
        assert!(validate_topic("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a b", "ü", &"a".repeat(250)] {
            assert!(validate_topic(bad).is_err(), "{bad}");
        }
        let m = OutboxMessage::new("bad topic", 8);
        assert!(m
            .validate("messages[3]")
            .unwrap_err()
            .to_string()
            .starts_with("messages[3].topic:"));
        let m = OutboxMessage::new("t", 8).with_partition(-1);
        assert_eq!(
            m.validate("m").unwrap_err().to_string(),
            "m.partition: must be >= 0"
        );
    }

    proptest! {
        #[test]
        fn bucket_is_in_range(key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                              n in 1u32..100, p in proptest::option::of(0i32..i32::MAX)) {
            let id = Uuid::new_v4();
            prop_assert!(compute_bucket(key.as_deref(), p, &id, n) < n);
        }
    }
}
