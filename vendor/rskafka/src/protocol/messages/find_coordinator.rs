//! `FindCoordinator` (API key 10), version 3: the broker that coordinates a consumer group or a
//! transactional id.
//!
//! Version 3 is the first flexible version and the last with a single key per request (version
//! 4 batches keys, [KIP-699]); Apache Kafka 2.4 through 4.1 accept it.
//!
//! # References
//! - `FindCoordinatorRequest.json` and `FindCoordinatorResponse.json` of Apache Kafka
//!
//! [KIP-699]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-699%3A+Update+FindCoordinator+to+resolve+multiple+Coordinators+at+a+time

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{
        CompactNullableString, CompactString, CompactStringRef, Int8, Int16, Int32, TaggedFields,
    },
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
};

const VERSION: i16 = 3;

/// What a coordinator key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorType {
    /// A consumer group id: the group coordinator, which also keeps the group's offsets.
    Group,
    /// A transactional id: the transaction coordinator.
    Transaction,
}

impl CoordinatorType {
    fn code(self) -> i8 {
        match self {
            Self::Group => 0,
            Self::Transaction => 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindCoordinatorRequest {
    /// The group id or transactional id.
    pub key: String,

    /// What `key` names.
    pub key_type: CoordinatorType,
}

impl<W> WriteVersionedType<W> for FindCoordinatorRequest
where
    W: Write,
{
    fn write_versioned(
        &self,
        writer: &mut W,
        version: ApiVersion,
    ) -> Result<(), WriteVersionedError> {
        assert_eq!(version.0.0, VERSION);
        CompactStringRef(&self.key).write(writer)?;
        Int8(self.key_type.code()).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for FindCoordinatorRequest {
    type ResponseBody = FindCoordinatorResponse;
    const API_KEY: ApiKey = ApiKey::FindCoordinator;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(3));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindCoordinatorResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The error, if any.
    pub error: Option<Error>,

    /// The broker's message about the error, if any.
    pub error_message: Option<String>,

    /// The coordinator's node id.
    pub node_id: i32,

    /// The coordinator's host name.
    pub host: String,

    /// The coordinator's port.
    pub port: i32,
}

impl<R> ReadVersionedType<R> for FindCoordinatorResponse
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let response = Self {
            throttle_time_ms: Int32::read(reader)?,
            error: Error::new(Int16::read(reader)?.0),
            error_message: CompactNullableString::read(reader)?.0,
            node_id: Int32::read(reader)?.0,
            host: CompactString::read(reader)?.0,
            port: Int32::read(reader)?.0,
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
        for (key_type, code) in [
            (CoordinatorType::Group, 0),
            (CoordinatorType::Transaction, 1),
        ] {
            let mut buf = vec![];
            FindCoordinatorRequest {
                key: "tx-1".into(),
                key_type,
            }
            .write_versioned(&mut buf, V)
            .unwrap();
            // compact string (length + 1), key type, no tagged fields
            assert_eq!(buf, [&[5][..], b"tx-1", &[code, 0]].concat());
        }
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [
            &[0, 0, 0, 7][..], // throttle
            &[0, 0],           // no error
            &[0],              // null message
            &[0, 0, 0, 2],     // node id
            &[10],             // compact string "127.0.0.1"
            b"127.0.0.1",
            &[0, 0, 0x23, 0x84], // 9092
            &[0],                // tagged fields
        ]
        .concat();
        let mut cursor = Cursor::new(bytes);
        let response = FindCoordinatorResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position() as usize, cursor.get_ref().len());
        assert_eq!(
            response,
            FindCoordinatorResponse {
                throttle_time_ms: Int32(7),
                error: None,
                error_message: None,
                node_id: 2,
                host: "127.0.0.1".into(),
                port: 9092,
            }
        );

        let bytes = [
            &[0, 0, 0, 0][..],
            &[0, 15], // COORDINATOR_NOT_AVAILABLE
            &[4],
            b"abc",
            &[0xff, 0xff, 0xff, 0xff], // -1
            &[1],                      // empty host
            &[0xff, 0xff, 0xff, 0xff],
            &[1, 5, 2, 0xaa, 0xbb], // one unknown tagged field, skipped
        ]
        .concat();
        let response = FindCoordinatorResponse::read_versioned(&mut Cursor::new(bytes), V).unwrap();
        assert_eq!(response.error, Some(Error::CoordinatorNotAvailable));
        assert_eq!(response.error_message.as_deref(), Some("abc"));
        assert_eq!(response.node_id, -1);
    }
}
