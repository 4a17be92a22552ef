//! An outbox message as an rskafka [`Record`], and what rskafka cannot carry.
//!
//! Key and value pass through byte for byte (`None` stays null). rskafka 0.6 holds record
//! headers in a `BTreeMap<String, Vec<u8>>`, and its wire type has no null header value, so
//! three things about headers cannot survive the trip, whatever this crate does:
//!
//! - **null values** are sent as empty values (the key stays present);
//! - **duplicate keys** keep the last value, the one Java's `Headers.lastHeader` returns;
//! - **order** becomes the keys' byte order.
//!
//! The message-id header is added last, so it replaces a header of the same name.
//! [`HeaderLoss`] counts what was altered so the publisher can say so in its logs.

use std::collections::BTreeMap;

use rskafka::chrono::{DateTime, Utc};
use rskafka::record::Record;

use crate::message::OutboxMessage;

/// What [`to_record`] could not keep of a message's headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderLoss {
    /// Headers whose null value became an empty value.
    pub null_values: usize,
    /// Headers dropped because a later header (or the message-id header) had the same key.
    pub duplicate_keys: usize,
}

impl HeaderLoss {
    /// Whether anything was altered.
    pub fn is_lossy(&self) -> bool {
        self.null_values > 0 || self.duplicate_keys > 0
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: HeaderLoss) {
        self.null_values += other.null_values;
        self.duplicate_keys += other.duplicate_keys;
    }
}

/// The record for `message`: its key, value and headers, the message-id header
/// (`message_id_header` = the id as a lowercase hyphenated UUID in UTF-8), and `timestamp`
/// (publish time, not enqueue time).
pub fn to_record(
    message: &OutboxMessage,
    message_id_header: &str,
    timestamp: DateTime<Utc>,
) -> (Record, HeaderLoss) {
    let mut loss = HeaderLoss::default();
    let mut headers = BTreeMap::new();
    for h in &message.headers {
        let value = match &h.value {
            Some(v) => v.clone(),
            None => {
                loss.null_values += 1;
                Vec::new()
            }
        };
        if headers.insert(h.key.clone(), value).is_some() {
            loss.duplicate_keys += 1;
        }
    }
    let id = message.message_id.hyphenated().to_string().into_bytes();
    if headers.insert(message_id_header.to_owned(), id).is_some() {
        loss.duplicate_keys += 1;
    }
    let record = Record {
        key: message.key.clone(),
        value: message.value.clone(),
        headers,
        timestamp,
    };
    (record, loss)
}

/// Bytes a record of `message` takes in a produce request, estimated from above: its data
/// plus the varints and lengths around it (the message-id header included).
pub fn estimated_size(message: &OutboxMessage, message_id_header: &str) -> usize {
    const RECORD_OVERHEAD: usize = 25; // length, attributes, deltas, key/value lengths
    const HEADER_OVERHEAD: usize = 10; // two varint lengths
    let headers: usize = message
        .headers
        .iter()
        .map(|h| HEADER_OVERHEAD + h.key.len() + h.value.as_ref().map_or(0, Vec::len))
        .sum();
    RECORD_OVERHEAD
        + message.key.as_ref().map_or(0, Vec::len)
        + message.value.as_ref().map_or(0, Vec::len)
        + headers
        + HEADER_OVERHEAD
        + message_id_header.len()
        + 36
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Header;
    use uuid::Uuid;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_700_000_000_123).unwrap()
    }

    #[test]
    fn passes_bytes_through_and_stamps_the_id() {
        let mut m = OutboxMessage::new("t", 8)
            .with_key(vec![0u8, 0xff, 0x80])
            .with_value(b"v\x00alue".to_vec())
            .with_header(Header::new("b", vec![1, 2, 3]))
            .with_header(Header::new("a", Vec::new()));
        m.message_id = Uuid::parse_str("0F8FAD5B-D9CB-469F-A165-70867728950E").unwrap();
        let (r, loss) = to_record(&m, "x-outbox-message-id", now());
        assert_eq!(r.key.as_deref(), Some(&[0u8, 0xff, 0x80][..]));
        assert_eq!(r.value.as_deref(), Some(&b"v\x00alue"[..]));
        assert_eq!(r.timestamp, now());
        assert_eq!(r.headers["b"], [1, 2, 3]);
        assert_eq!(r.headers["a"], Vec::<u8>::new());
        assert_eq!(
            r.headers["x-outbox-message-id"],
            b"0f8fad5b-d9cb-469f-a165-70867728950e"
        );
        assert_eq!(r.headers.len(), 3);
        assert!(!loss.is_lossy());
    }

    #[test]
    fn null_key_and_value_stay_null() {
        let (r, _) = to_record(&OutboxMessage::new("t", 8), "id", now());
        assert_eq!((r.key, r.value), (None, None));
        let (r, _) = to_record(
            &OutboxMessage::new("t", 8).with_key(Vec::new()),
            "id",
            now(),
        );
        assert_eq!(r.key, Some(Vec::new()));
    }

    #[test]
    fn what_rskafka_cannot_carry_is_counted() {
        let m = OutboxMessage::new("t", 8)
            .with_header(Header::new("k", b"first".to_vec()))
            .with_header(Header::null("n"))
            .with_header(Header::new("k", b"last".to_vec()))
            .with_header(Header::new("id", b"spoofed".to_vec()));
        let (r, loss) = to_record(&m, "id", now());
        assert_eq!(r.headers["k"], b"last");
        assert_eq!(r.headers["n"], Vec::<u8>::new());
        assert_eq!(
            r.headers["id"],
            m.message_id.hyphenated().to_string().into_bytes()
        );
        assert_eq!(
            loss,
            HeaderLoss {
                null_values: 1,
                duplicate_keys: 2
            }
        );
    }

    #[test]
    fn size_estimate_is_an_upper_bound_of_the_data() {
        let m = OutboxMessage::new("t", 8)
            .with_key(vec![0; 10])
            .with_value(vec![0; 1000])
            .with_header(Header::new("h", vec![0; 5]));
        let (r, _) = to_record(&m, "x-outbox-message-id", now());
        assert!(estimated_size(&m, "x-outbox-message-id") >= r.approximate_size());
    }
}
