//! The header blob, format version 1 (`Headers` attribute, type B).
//!
//! ```text
//! [u8 version = 1] [i32 count]
//! count times: [i32 keyLength] [key, UTF-8] [i32 valueLength or -1 for null] [value]
//! ```
//! All integers are little-endian, signed 32-bit. No headers means no attribute, never an
//! empty blob. The decoder rejects every malformed input with an error; it never panics
//! and never allocates from a length it has not checked against the bytes it holds.

/// The only format version this crate writes and reads.
pub const FORMAT_VERSION: u8 = 1;

/// A record header: a UTF-8 key and an optional (nullable) byte value, order preserved.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Header {
    /// Header key; Kafka allows duplicates, and so does the blob.
    pub key: String,
    /// Header value; `None` is Kafka's null value, distinct from an empty value.
    pub value: Option<Vec<u8>>,
}

impl Header {
    /// A header with a value.
    pub fn new(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Header {
            key: key.into(),
            value: Some(value.into()),
        }
    }

    /// A header with a null value.
    pub fn null(key: impl Into<String>) -> Self {
        Header {
            key: key.into(),
            value: None,
        }
    }
}

/// Why a header blob could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The blob has no bytes at all (an absent attribute means no headers).
    #[error("header blob is empty")]
    Empty,
    /// The version byte is not [`FORMAT_VERSION`].
    #[error("unknown header format version {0}")]
    UnknownVersion(u8),
    /// The count is negative.
    #[error("negative header count {0}")]
    NegativeCount(i32),
    /// The count cannot fit in the remaining bytes (each header takes at least 8).
    #[error("header count {count} cannot fit in {remaining} bytes")]
    CountTooLarge {
        /// The count read.
        count: i32,
        /// Bytes left after the count.
        remaining: usize,
    },
    /// A length field, or the bytes it announces, runs past the end of the blob.
    #[error("header {index}: {what} runs past the end of the blob")]
    Truncated {
        /// Index of the header.
        index: usize,
        /// What was being read.
        what: &'static str,
    },
    /// A length is negative (other than -1 for a null value).
    #[error("header {index}: invalid {what} length {length}")]
    BadLength {
        /// Index of the header.
        index: usize,
        /// Which length.
        what: &'static str,
        /// The length read.
        length: i32,
    },
    /// A key is not valid UTF-8.
    #[error("header {index}: key is not valid UTF-8")]
    InvalidKey {
        /// Index of the header.
        index: usize,
    },
    /// Bytes remain after the last header.
    #[error("{0} trailing bytes after the last header")]
    TrailingBytes(usize),
}

/// Error of [`encode`]: a key or value too long for an `i32` length, or too many headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("headers too large for format version 1")]
pub struct HeaderTooLarge;

/// Encodes headers; `Ok(None)` for an empty list (the attribute is then absent).
pub fn encode(headers: &[Header]) -> Result<Option<Vec<u8>>, HeaderTooLarge> {
    if headers.is_empty() {
        return Ok(None);
    }
    let len = |n: usize| i32::try_from(n).map_err(|_| HeaderTooLarge);
    let size: usize = 5 + headers
        .iter()
        .map(|h| 8 + h.key.len() + h.value.as_ref().map_or(0, Vec::len))
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&len(headers.len())?.to_le_bytes());
    for h in headers {
        out.extend_from_slice(&len(h.key.len())?.to_le_bytes());
        out.extend_from_slice(h.key.as_bytes());
        match &h.value {
            Some(v) => {
                out.extend_from_slice(&len(v.len())?.to_le_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_le_bytes()),
        }
    }
    Ok(Some(out))
}

/// Decodes a blob written by [`encode`] (or by any writer following the format).
pub fn decode(blob: &[u8]) -> Result<Vec<Header>, HeaderError> {
    let (&version, rest) = blob.split_first().ok_or(HeaderError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(HeaderError::UnknownVersion(version));
    }
    let mut r = Reader { rest };
    let count = r.i32().ok_or(HeaderError::Truncated {
        index: 0,
        what: "count",
    })?;
    if count < 0 {
        return Err(HeaderError::NegativeCount(count));
    }
    // Each header takes at least 8 bytes (two lengths), so this bounds the allocation by
    // the input's size, never by the untrusted count alone.
    if count as usize > r.rest.len() / 8 {
        return Err(HeaderError::CountTooLarge {
            count,
            remaining: r.rest.len(),
        });
    }
    let mut headers = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let key_len = r.i32().ok_or(HeaderError::Truncated {
            index,
            what: "key length",
        })?;
        if key_len < 0 {
            return Err(HeaderError::BadLength {
                index,
                what: "key",
                length: key_len,
            });
        }
        let key = r
            .take(key_len as usize)
            .ok_or(HeaderError::Truncated { index, what: "key" })?;
        let key = std::str::from_utf8(key)
            .map_err(|_| HeaderError::InvalidKey { index })?
            .to_owned();
        let value_len = r.i32().ok_or(HeaderError::Truncated {
            index,
            what: "value length",
        })?;
        let value = match value_len {
            -1 => None,
            n if n < 0 => {
                return Err(HeaderError::BadLength {
                    index,
                    what: "value",
                    length: n,
                })
            }
            n => Some(
                r.take(n as usize)
                    .ok_or(HeaderError::Truncated {
                        index,
                        what: "value",
                    })?
                    .to_vec(),
            ),
        };
        headers.push(Header { key, value });
    }
    if !r.rest.is_empty() {
        return Err(HeaderError::TrailingBytes(r.rest.len()));
    }
    Ok(headers)
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn i32(&mut self) -> Option<i32> {
        let b = self.take(4)?;
        Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_bytes() {
        let headers = vec![Header::new("a", b"xy".to_vec()), Header::null("k")];
        let blob = encode(&headers).unwrap().unwrap();
        assert_eq!(
            blob,
            [
                1, 2, 0, 0, 0, // version, count
                1, 0, 0, 0, b'a', 2, 0, 0, 0, b'x', b'y', // a = xy
                1, 0, 0, 0, b'k', 0xff, 0xff, 0xff, 0xff, // k = null
            ]
        );
        assert_eq!(decode(&blob).unwrap(), headers);
        assert_eq!(encode(&[]).unwrap(), None);
    }

    #[test]
    fn empty_value_and_empty_key_survive() {
        let headers = vec![Header::new("", Vec::new()), Header::new("k", Vec::new())];
        let blob = encode(&headers).unwrap().unwrap();
        assert_eq!(decode(&blob).unwrap(), headers);
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(decode(&[]), Err(HeaderError::Empty));
        assert_eq!(
            decode(&[2, 0, 0, 0, 0]),
            Err(HeaderError::UnknownVersion(2))
        );
        assert_eq!(
            decode(&[1, 0xff, 0xff, 0xff, 0xff]),
            Err(HeaderError::NegativeCount(-1))
        );
        assert!(matches!(
            decode(&[1, 0xff, 0xff, 0xff, 0x7f]),
            Err(HeaderError::CountTooLarge { .. })
        ));
        assert!(matches!(
            decode(&[1, 1, 0]),
            Err(HeaderError::Truncated { .. })
        ));
        // key length runs past the end
        assert!(matches!(
            decode(&[1, 1, 0, 0, 0, 9, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
            Err(HeaderError::Truncated { what: "key", .. })
        ));
        // invalid utf-8 key
        assert_eq!(
            decode(&[1, 1, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Err(HeaderError::InvalidKey { index: 0 })
        );
        // value length -2
        assert!(matches!(
            decode(&[1, 1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]),
            Err(HeaderError::BadLength { what: "value", .. })
        ));
        // trailing bytes
        assert_eq!(
            decode(&[1, 0, 0, 0, 0, 7]),
            Err(HeaderError::TrailingBytes(1))
        );
    }

    fn header() -> impl Strategy<Value = Header> {
        (
            ".{0,12}",
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
        )
            .prop_map(|(key, value)| Header { key, value })
    }

    proptest! {
        #[test]
        fn round_trips(headers in proptest::collection::vec(header(), 0..8)) {
            match encode(&headers).unwrap() {
                None => prop_assert!(headers.is_empty()),
                Some(blob) => prop_assert_eq!(decode(&blob).unwrap(), headers),
            }
        }

        #[test]
        fn never_panics_on_garbage(blob in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&blob);
        }

        #[test]
        fn never_panics_on_mutated_blobs(
            headers in proptest::collection::vec(header(), 1..4),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut blob = encode(&headers).unwrap().unwrap();
            for (i, b) in flips { let i = i.index(blob.len()); blob[i] = b; }
            let end = cut.index(blob.len() + 1);
            if let Ok(decoded) = decode(&blob[..end]) {
                // whatever decodes to headers must re-encode to the same bytes
                if let Some(again) = encode(&decoded).unwrap() {
                    prop_assert_eq!(again, blob[..end].to_vec());
                }
            }
        }
    }
}
