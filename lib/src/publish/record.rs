//! An outbox message as an rskafka [`Record`].
//!
//! Key, value and headers pass through byte for byte: `None` stays null (a null header
//! value included), repeated header keys stay repeated, and the headers keep the writer's
//! order. The message-id header comes once, last: a stored header with its name is left
//! out (the id the relay stamps replaces it).
//!
//! rskafka 0.6.0 as published holds headers in a `BTreeMap<String, Vec<u8>>`, which can
//! carry none of this; the workspace builds the copy in `vendor/rskafka`, whose record and
//! wire headers are an ordered `Vec` of [`RecordHeader`]s with optional values
//! (`vendor/rskafka/PATCH.md`).

use rskafka::chrono::{DateTime, Utc};
use rskafka::record::{Record, RecordHeader};

use crate::message::OutboxMessage;

/// The record for `message`: its key, value and headers in order, then the message-id
/// header (`message_id_header` = the id as a lowercase hyphenated UUID in UTF-8; a stored
/// header of that name is left out), and `timestamp` (publish time, not enqueue time).
pub(crate) fn to_record(
    message: &OutboxMessage,
    message_id_header: &str,
    timestamp: DateTime<Utc>,
) -> Record {
    let mut headers: Vec<RecordHeader> = message
        .headers
        .iter()
        .filter(|h| h.key != message_id_header)
        .map(|h| RecordHeader {
            key: h.key.clone(),
            value: h.value.clone(),
        })
        .collect();
    headers.push(RecordHeader {
        key: message_id_header.to_owned(),
        value: Some(message.message_id.hyphenated().to_string().into_bytes()),
    });
    Record {
        key: message.key.clone(),
        value: message.value.clone(),
        headers,
        timestamp,
    }
}

/// Bytes a record of `message` takes in a produce request, estimated from above: its data
/// plus the varints and lengths around it (the message-id header included).
pub(crate) fn estimated_size(message: &OutboxMessage, message_id_header: &str) -> usize {
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

    fn header(key: &str, value: Option<&[u8]>) -> RecordHeader {
        RecordHeader {
            key: key.to_owned(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn passes_bytes_through_and_stamps_the_id() {
        let mut m = OutboxMessage::new("t", 8)
            .with_key(vec![0u8, 0xff, 0x80])
            .with_value(b"v\x00alue".to_vec())
            .with_header(Header::new("b", vec![1, 2, 3]))
            .with_header(Header::new("a", Vec::new()));
        m.message_id = Uuid::parse_str("0F8FAD5B-D9CB-469F-A165-70867728950E").unwrap();
        let r = to_record(&m, "x-outbox-message-id", now());
        assert_eq!(r.key.as_deref(), Some(&[0u8, 0xff, 0x80][..]));
        assert_eq!(r.value.as_deref(), Some(&b"v\x00alue"[..]));
        assert_eq!(r.timestamp, now());
        assert_eq!(
            r.headers,
            [
                header("b", Some(&[1, 2, 3])),
                header("a", Some(b"")),
                header(
                    "x-outbox-message-id",
                    Some(b"0f8fad5b-d9cb-469f-a165-70867728950e")
                ),
            ]
        );
    }

    #[test]
    fn null_key_and_value_stay_null() {
        let r = to_record(&OutboxMessage::new("t", 8), "id", now());
        assert_eq!((r.key, r.value), (None, None));
        let r = to_record(
            &OutboxMessage::new("t", 8).with_key(Vec::new()),
            "id",
            now(),
        );
        assert_eq!(r.key, Some(Vec::new()));
    }

    #[test]
    fn headers_keep_nulls_repeats_and_order_and_the_id_comes_last() {
        let m = OutboxMessage::new("t", 8)
            .with_header(Header::new("z-first", b"1".to_vec()))
            .with_header(Header::null("nul"))
            .with_header(Header::new("id", b"spoofed".to_vec()))
            .with_header(Header::new("dup", b"a".to_vec()))
            .with_header(Header::new("dup", b"b".to_vec()))
            .with_header(Header::new("a-last", Vec::new()));
        let r = to_record(&m, "id", now());
        let id = m.message_id.hyphenated().to_string();
        assert_eq!(
            r.headers,
            [
                header("z-first", Some(b"1")),
                header("nul", None),
                header("dup", Some(b"a")),
                header("dup", Some(b"b")),
                header("a-last", Some(b"")),
                header("id", Some(id.as_bytes())),
            ]
        );
    }

    #[test]
    fn size_estimate_is_an_upper_bound_of_the_data() {
        let m = OutboxMessage::new("t", 8)
            .with_key(vec![0; 10])
            .with_value(vec![0; 1000])
            .with_header(Header::new("h", vec![0; 5]))
            .with_header(Header::null("n"));
        let r = to_record(&m, "x-outbox-message-id", now());
        assert!(estimated_size(&m, "x-outbox-message-id") >= r.approximate_size());
    }
}
