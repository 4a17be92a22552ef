//! `InitProducerId` (API key 22), version 4: a producer id and epoch for a transactional id.
//!
//! Version 3 added the current producer id and epoch to the request, so that a producer can bump
//! its epoch after an abortable error without being fenced ([KIP-360]); version 4 answers a fenced
//! producer with `PRODUCER_FENCED` instead of `INVALID_PRODUCER_EPOCH` ([KIP-588]). Version 5
//! only adds `TRANSACTION_ABORTABLE`, which a version 4 client never receives. Apache Kafka 2.7
//! through 4.1 accept version 4.
//!
//! # References
//! - `InitProducerIdRequest.json` and `InitProducerIdResponse.json` of Apache Kafka
//!
//! [KIP-360]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-360%3A+Improve+reliability+of+idempotent%2Ftransactional+producer
//! [KIP-588]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-588%3A+Allow+producers+to+recover+gracefully+from+transaction+timeouts

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{CompactNullableStringRef, Int16, Int32, Int64, TaggedFields},
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
};

const VERSION: i16 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdRequest {
    /// The transactional id, or `None` for an idempotent producer without transactions.
    pub transactional_id: Option<String>,

    /// How long the coordinator lets a transaction stay open before it aborts it, in
    /// milliseconds.
    pub transaction_timeout_ms: i32,

    /// The producer's current id when it bumps its epoch, else -1.
    pub producer_id: i64,

    /// The producer's current epoch when it bumps it, else -1.
    pub producer_epoch: i16,
}

impl<W> WriteVersionedType<W> for InitProducerIdRequest
where
    W: Write,
{
    fn write_versioned(
        &self,
        writer: &mut W,
        version: ApiVersion,
    ) -> Result<(), WriteVersionedError> {
        assert_eq!(version.0.0, VERSION);
        CompactNullableStringRef(self.transactional_id.as_deref()).write(writer)?;
        Int32(self.transaction_timeout_ms).write(writer)?;
        Int64(self.producer_id).write(writer)?;
        Int16(self.producer_epoch).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for InitProducerIdRequest {
    type ResponseBody = InitProducerIdResponse;
    const API_KEY: ApiKey = ApiKey::InitProducerId;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(2));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The error, if any.
    pub error: Option<Error>,

    /// The producer id.
    pub producer_id: i64,

    /// The producer's epoch.
    pub producer_epoch: i16,
}

impl<R> ReadVersionedType<R> for InitProducerIdResponse
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let response = Self {
            throttle_time_ms: Int32::read(reader)?,
            error: Error::new(Int16::read(reader)?.0),
            producer_id: Int64::read(reader)?.0,
            producer_epoch: Int16::read(reader)?.0,
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
        InitProducerIdRequest {
            transactional_id: Some("tx".into()),
            transaction_timeout_ms: 60_000,
            producer_id: -1,
            producer_epoch: -1,
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        let expected = [
            &[3][..],
            b"tx",
            &[0, 0, 0xea, 0x60], // 60000
            &[0xff; 8],          // producer id -1
            &[0xff, 0xff],       // epoch -1
            &[0],                // tagged fields
        ]
        .concat();
        assert_eq!(buf, expected);

        // The epoch bump of KIP-360 passes the current id and epoch.
        let mut buf = vec![];
        InitProducerIdRequest {
            transactional_id: None,
            transaction_timeout_ms: 1,
            producer_id: 0x0102_0304_0506_0708,
            producer_epoch: 9,
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        assert_eq!(buf, [0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 0]);
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [0, 0, 0, 0, 0, 90, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 3, 0];
        let mut cursor = Cursor::new(bytes.to_vec());
        let response = InitProducerIdResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position(), bytes.len() as u64);
        assert_eq!(
            response,
            InitProducerIdResponse {
                throttle_time_ms: Int32(0),
                error: Some(Error::ProducerFenced),
                producer_id: 0x1000,
                producer_epoch: 3,
            }
        );
    }
}
