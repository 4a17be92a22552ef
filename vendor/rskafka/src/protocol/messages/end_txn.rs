//! `EndTxn` (API key 26), version 3: commits or aborts a producer's transaction.
//!
//! Version 3 is the first flexible version; version 4 only adds `TRANSACTION_ABORTABLE`, and
//! version 5 (Apache Kafka 4.0 and up) the epoch bump on every transaction of [KIP-890]'s
//! second part. Apache Kafka 2.7 through 4.1 accept version 3, and treat a producer that ends
//! its transactions with it as they did before [KIP-890]: its epoch stays.
//!
//! # References
//! - `EndTxnRequest.json` and `EndTxnResponse.json` of Apache Kafka
//!
//! [KIP-890]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-890%3A+Transactions+Server-Side+Defense

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{Boolean, CompactStringRef, Int16, Int32, Int64, TaggedFields},
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
};

const VERSION: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndTxnRequest {
    /// The transactional id.
    pub transactional_id: String,

    /// The producer id of the transactional id.
    pub producer_id: i64,

    /// The producer's epoch.
    pub producer_epoch: i16,

    /// `true` to commit the transaction, `false` to abort it.
    pub committed: bool,
}

impl<W> WriteVersionedType<W> for EndTxnRequest
where
    W: Write,
{
    fn write_versioned(
        &self,
        writer: &mut W,
        version: ApiVersion,
    ) -> Result<(), WriteVersionedError> {
        assert_eq!(version.0.0, VERSION);
        CompactStringRef(&self.transactional_id).write(writer)?;
        Int64(self.producer_id).write(writer)?;
        Int16(self.producer_epoch).write(writer)?;
        Boolean(self.committed).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for EndTxnRequest {
    type ResponseBody = EndTxnResponse;
    const API_KEY: ApiKey = ApiKey::EndTxn;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(3));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndTxnResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The error, if any.
    pub error: Option<Error>,
}

impl<R> ReadVersionedType<R> for EndTxnResponse
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let response = Self {
            throttle_time_ms: Int32::read(reader)?,
            error: Error::new(Int16::read(reader)?.0),
        };
        TaggedFields::read(reader)?;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    const V: ApiVersion = ApiVersion(Int16(VERSION));

    #[test]
    fn request_wire_bytes() {
        for committed in [false, true] {
            let mut buf = vec![];
            EndTxnRequest {
                transactional_id: "tx".into(),
                producer_id: 7,
                producer_epoch: 0,
                committed,
            }
            .write_versioned(&mut buf, V)
            .unwrap();
            let expected = [
                &[3][..],
                b"tx",
                &[0, 0, 0, 0, 0, 0, 0, 7],
                &[0, 0],
                &[committed as u8],
                &[0],
            ]
            .concat();
            assert_eq!(buf, expected);
        }
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [0, 0, 0, 0, 0, 0, 0];
        let mut cursor = Cursor::new(bytes.to_vec());
        let response = EndTxnResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position(), bytes.len() as u64);
        assert_eq!(response.error, None);
        let bytes = [0, 0, 0, 0, 0, 90, 0];
        let response = EndTxnResponse::read_versioned(&mut Cursor::new(bytes.to_vec()), V).unwrap();
        assert_eq!(response.error, Some(Error::ProducerFenced));
    }
}
