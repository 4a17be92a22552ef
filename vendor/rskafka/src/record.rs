use chrono::{DateTime, Utc};

/// Record header: a key and a value that may be null.
///
/// A record's headers are an ordered list: keys may repeat, and their order is kept from producer
/// to consumer, as [KIP-82] requires.
///
/// [KIP-82]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-82+-+Add+Record+Headers
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: String,
    /// `None` is a null value, distinct from an empty one.
    pub value: Option<Vec<u8>>,
}

/// High-level record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Headers in order; keys may repeat.
    pub headers: Vec<RecordHeader>,
    pub timestamp: DateTime<Utc>,
}

impl Record {
    /// Returns the approximate uncompressed size of this [`Record`]
    pub fn approximate_size(&self) -> usize {
        self.key.as_ref().map(|k| k.len()).unwrap_or_default()
            + self.value.as_ref().map(|v| v.len()).unwrap_or_default()
            + self
                .headers
                .iter()
                .map(|h| h.key.len() + h.value.as_ref().map(|v| v.len()).unwrap_or_default())
                .sum::<usize>()
    }
}

/// Record that has offset information attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAndOffset {
    pub record: Record,
    pub offset: i64,
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn test_approximate_size() {
        let record = Record {
            key: Some(vec![0; 23]),
            value: Some(vec![0; 45]),
            headers: vec![
                RecordHeader {
                    key: "a".to_owned(),
                    value: Some(vec![0; 5]),
                },
                RecordHeader {
                    key: "b".to_owned(),
                    value: Some(vec![0; 7]),
                },
                RecordHeader {
                    key: "c".to_owned(),
                    value: None,
                },
            ],
            timestamp: Utc.timestamp_millis_opt(1337).unwrap(),
        };

        assert_eq!(record.approximate_size(), 23 + 45 + 1 + 5 + 1 + 7 + 1);
    }
}
