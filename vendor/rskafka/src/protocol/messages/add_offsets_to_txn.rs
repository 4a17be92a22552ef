//! `AddOffsetsToTxn` (API key 25), version 3: tells the transaction coordinator that the
//! transaction will commit offsets of a consumer group (the group's offsets partition joins the
//! transaction), before `TxnOffsetCommit` sends them to the group coordinator.
//!
//! Version 3 is the first flexible version; version 4 only adds `TRANSACTION_ABORTABLE`, which
//! a version 3 client never receives. Apache Kafka 2.7 through 4.1 accept version 3.
//!
//! # References
//! - `AddOffsetsToTxnRequest.json` and `AddOffsetsToTxnResponse.json` of Apache Kafka

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{CompactStringRef, Int16, Int32, Int64, TaggedFields},
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
};

const VERSION: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOffsetsToTxnRequest {
    /// The transactional id.
    pub transactional_id: String,

    /// The producer id of the transactional id.
    pub producer_id: i64,

    /// The producer's epoch.
    pub producer_epoch: i16,

    /// The consumer group whose offsets the transaction commits.
    pub group_id: String,
}

impl<W> WriteVersionedType<W> for AddOffsetsToTxnRequest
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
        CompactStringRef(&self.group_id).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for AddOffsetsToTxnRequest {
    type ResponseBody = AddOffsetsToTxnResponse;
    const API_KEY: ApiKey = ApiKey::AddOffsetsToTxn;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(3));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOffsetsToTxnResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The error, if any.
    pub error: Option<Error>,
}

impl<R> ReadVersionedType<R> for AddOffsetsToTxnResponse
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
        let mut buf = vec![];
        AddOffsetsToTxnRequest {
            transactional_id: "tx".into(),
            producer_id: 258,
            producer_epoch: 2,
            group_id: "g".into(),
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        let expected = [
            &[3][..],
            b"tx",
            &[0, 0, 0, 0, 0, 0, 1, 2],
            &[0, 2],
            &[2],
            b"g",
            &[0],
        ]
        .concat();
        assert_eq!(buf, expected);
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [0, 0, 0, 1, 0, 48, 0];
        let mut cursor = Cursor::new(bytes.to_vec());
        let response = AddOffsetsToTxnResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position(), bytes.len() as u64);
        assert_eq!(
            response,
            AddOffsetsToTxnResponse {
                throttle_time_ms: Int32(1),
                error: Some(Error::InvalidTxnState),
            }
        );
    }
}
