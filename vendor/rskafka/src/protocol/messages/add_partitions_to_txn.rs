//! `AddPartitionsToTxn` (API key 24), version 3: adds partitions to a producer's transaction
//! before it produces to them.
//!
//! Version 3 is the last version a client sends (versions 4 and up are the brokers' own,
//! [KIP-890]) and the first flexible one; Apache Kafka 2.7 through 4.1 accept it.
//!
//! # References
//! - `AddPartitionsToTxnRequest.json` and `AddPartitionsToTxnResponse.json` of Apache Kafka
//!
//! [KIP-890]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-890%3A+Transactions+Server-Side+Defense

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{
        CompactArrayRef, CompactString, CompactStringRef, Int16, Int32, Int64, TaggedFields,
    },
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
    read_compact_versioned_array, write_compact_versioned_array,
};

const VERSION: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsToTxnTopic {
    /// The topic.
    pub name: String,

    /// The partitions of the topic to add.
    pub partitions: Vec<i32>,
}

impl<W> WriteVersionedType<W> for AddPartitionsToTxnTopic
where
    W: Write,
{
    fn write_versioned(
        &self,
        writer: &mut W,
        version: ApiVersion,
    ) -> Result<(), WriteVersionedError> {
        assert_eq!(version.0.0, VERSION);
        CompactStringRef(&self.name).write(writer)?;
        let partitions: Vec<Int32> = self.partitions.iter().copied().map(Int32).collect();
        CompactArrayRef(Some(partitions.as_slice())).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsToTxnRequest {
    /// The transactional id.
    pub transactional_id: String,

    /// The producer id of the transactional id.
    pub producer_id: i64,

    /// The producer's epoch.
    pub producer_epoch: i16,

    /// The partitions to add, by topic.
    pub topics: Vec<AddPartitionsToTxnTopic>,
}

impl<W> WriteVersionedType<W> for AddPartitionsToTxnRequest
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
        write_compact_versioned_array(writer, version, Some(self.topics.as_slice()))?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for AddPartitionsToTxnRequest {
    type ResponseBody = AddPartitionsToTxnResponse;
    const API_KEY: ApiKey = ApiKey::AddPartitionsToTxn;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(3));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsToTxnPartitionResult {
    /// The partition.
    pub partition_index: i32,

    /// The error, if any.
    pub error: Option<Error>,
}

impl<R> ReadVersionedType<R> for AddPartitionsToTxnPartitionResult
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let result = Self {
            partition_index: Int32::read(reader)?.0,
            error: Error::new(Int16::read(reader)?.0),
        };
        TaggedFields::read(reader)?;
        Ok(result)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsToTxnTopicResult {
    /// The topic.
    pub name: String,

    /// The result of each partition.
    pub results: Vec<AddPartitionsToTxnPartitionResult>,
}

impl<R> ReadVersionedType<R> for AddPartitionsToTxnTopicResult
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let result = Self {
            name: CompactString::read(reader)?.0,
            results: read_compact_versioned_array(reader, version)?.unwrap_or_default(),
        };
        TaggedFields::read(reader)?;
        Ok(result)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsToTxnResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The results, by topic.
    pub results: Vec<AddPartitionsToTxnTopicResult>,
}

impl<R> ReadVersionedType<R> for AddPartitionsToTxnResponse
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let response = Self {
            throttle_time_ms: Int32::read(reader)?,
            results: read_compact_versioned_array(reader, version)?.unwrap_or_default(),
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
        AddPartitionsToTxnRequest {
            transactional_id: "tx".into(),
            producer_id: 5,
            producer_epoch: 1,
            topics: vec![
                AddPartitionsToTxnTopic {
                    name: "a".into(),
                    partitions: vec![0, 2],
                },
                AddPartitionsToTxnTopic {
                    name: "bc".into(),
                    partitions: vec![],
                },
            ],
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        let expected = [
            &[3][..],
            b"tx",
            &[0, 0, 0, 0, 0, 0, 0, 5], // producer id
            &[0, 1],                   // epoch
            &[3],                      // two topics
            &[2],
            b"a",
            &[3, 0, 0, 0, 0, 0, 0, 0, 2], // partitions [0, 2]
            &[0],                         // the topic's tagged fields
            &[3],
            b"bc",
            &[1], // no partitions
            &[0],
            &[0], // the request's tagged fields
        ]
        .concat();
        assert_eq!(buf, expected);
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [
            &[0, 0, 0, 0][..], // throttle
            &[2],              // one topic
            &[2],
            b"a",
            &[3], // two partitions
            &[0, 0, 0, 0, 0, 0, 0],
            &[0, 0, 0, 2, 0, 51, 0], // CONCURRENT_TRANSACTIONS
            &[0],
            &[0],
        ]
        .concat();
        let mut cursor = Cursor::new(bytes);
        let response = AddPartitionsToTxnResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position() as usize, cursor.get_ref().len());
        assert_eq!(
            response,
            AddPartitionsToTxnResponse {
                throttle_time_ms: Int32(0),
                results: vec![AddPartitionsToTxnTopicResult {
                    name: "a".into(),
                    results: vec![
                        AddPartitionsToTxnPartitionResult {
                            partition_index: 0,
                            error: None,
                        },
                        AddPartitionsToTxnPartitionResult {
                            partition_index: 2,
                            error: Some(Error::ConcurrentTransactions),
                        },
                    ],
                }],
            }
        );
    }
}
