//! `TxnOffsetCommit` (API key 28), version 3: sends a consumer group's offsets to the group
//! coordinator as part of a transaction; they become visible when the transaction commits.
//!
//! Version 3 is the first flexible version and adds the group generation, member id and
//! instance id ([KIP-447]), which a producer outside a group sends as -1, `""` and null.
//! Version 4 only adds `TRANSACTION_ABORTABLE`, which a version 3 client never receives;
//! Apache Kafka 2.5 through 4.1 accept version 3.
//!
//! # References
//! - `TxnOffsetCommitRequest.json` and `TxnOffsetCommitResponse.json` of Apache Kafka
//!
//! [KIP-447]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-447%3A+Producer+scalability+for+exactly+once+semantics

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{
        CompactNullableStringRef, CompactString, CompactStringRef, Int16, Int32, Int64,
        TaggedFields,
    },
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
    read_compact_versioned_array, write_compact_versioned_array,
};

const VERSION: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitRequestPartition {
    /// The partition.
    pub partition_index: i32,

    /// The offset to commit (by convention the next offset to consume).
    pub committed_offset: i64,

    /// The leader epoch of the last consumed record, or -1.
    pub committed_leader_epoch: i32,

    /// Metadata kept with the offset.
    pub committed_metadata: Option<String>,
}

impl<W> WriteVersionedType<W> for TxnOffsetCommitRequestPartition
where
    W: Write,
{
    fn write_versioned(
        &self,
        writer: &mut W,
        version: ApiVersion,
    ) -> Result<(), WriteVersionedError> {
        assert_eq!(version.0.0, VERSION);
        Int32(self.partition_index).write(writer)?;
        Int64(self.committed_offset).write(writer)?;
        Int32(self.committed_leader_epoch).write(writer)?;
        CompactNullableStringRef(self.committed_metadata.as_deref()).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitRequestTopic {
    /// The topic.
    pub name: String,

    /// The partitions' offsets.
    pub partitions: Vec<TxnOffsetCommitRequestPartition>,
}

impl<W> WriteVersionedType<W> for TxnOffsetCommitRequestTopic
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
        write_compact_versioned_array(writer, version, Some(self.partitions.as_slice()))?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitRequest {
    /// The transactional id.
    pub transactional_id: String,

    /// The consumer group.
    pub group_id: String,

    /// The producer id of the transactional id.
    pub producer_id: i64,

    /// The producer's epoch.
    pub producer_epoch: i16,

    /// The group generation, or -1 for a producer that is not a member of the group.
    pub generation_id: i32,

    /// The member id, or `""`.
    pub member_id: String,

    /// The static member's instance id, if any.
    pub group_instance_id: Option<String>,

    /// The offsets, by topic.
    pub topics: Vec<TxnOffsetCommitRequestTopic>,
}

impl<W> WriteVersionedType<W> for TxnOffsetCommitRequest
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
        CompactStringRef(&self.group_id).write(writer)?;
        Int64(self.producer_id).write(writer)?;
        Int16(self.producer_epoch).write(writer)?;
        Int32(self.generation_id).write(writer)?;
        CompactStringRef(&self.member_id).write(writer)?;
        CompactNullableStringRef(self.group_instance_id.as_deref()).write(writer)?;
        write_compact_versioned_array(writer, version, Some(self.topics.as_slice()))?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for TxnOffsetCommitRequest {
    type ResponseBody = TxnOffsetCommitResponse;
    const API_KEY: ApiKey = ApiKey::TxnOffsetCommit;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(3));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitResponsePartition {
    /// The partition.
    pub partition_index: i32,

    /// The error, if any.
    pub error: Option<Error>,
}

impl<R> ReadVersionedType<R> for TxnOffsetCommitResponsePartition
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let partition = Self {
            partition_index: Int32::read(reader)?.0,
            error: Error::new(Int16::read(reader)?.0),
        };
        TaggedFields::read(reader)?;
        Ok(partition)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitResponseTopic {
    /// The topic.
    pub name: String,

    /// The result of each partition.
    pub partitions: Vec<TxnOffsetCommitResponsePartition>,
}

impl<R> ReadVersionedType<R> for TxnOffsetCommitResponseTopic
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let topic = Self {
            name: CompactString::read(reader)?.0,
            partitions: read_compact_versioned_array(reader, version)?.unwrap_or_default(),
        };
        TaggedFields::read(reader)?;
        Ok(topic)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The results, by topic.
    pub topics: Vec<TxnOffsetCommitResponseTopic>,
}

impl<R> ReadVersionedType<R> for TxnOffsetCommitResponse
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let response = Self {
            throttle_time_ms: Int32::read(reader)?,
            topics: read_compact_versioned_array(reader, version)?.unwrap_or_default(),
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
        TxnOffsetCommitRequest {
            transactional_id: "tx".into(),
            group_id: "g".into(),
            producer_id: 1,
            producer_epoch: 2,
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: None,
            topics: vec![TxnOffsetCommitRequestTopic {
                name: "t".into(),
                partitions: vec![
                    TxnOffsetCommitRequestPartition {
                        partition_index: 3,
                        committed_offset: 300,
                        committed_leader_epoch: -1,
                        committed_metadata: Some("m".into()),
                    },
                    TxnOffsetCommitRequestPartition {
                        partition_index: 4,
                        committed_offset: 0,
                        committed_leader_epoch: -1,
                        committed_metadata: None,
                    },
                ],
            }],
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        let expected = [
            &[3][..],
            b"tx",
            &[2],
            b"g",
            &[0, 0, 0, 0, 0, 0, 0, 1], // producer id
            &[0, 2],                   // epoch
            &[0xff, 0xff, 0xff, 0xff], // generation -1
            &[1],                      // member id ""
            &[0],                      // instance id null
            &[2],                      // one topic
            &[2],
            b"t",
            &[3], // two partitions
            &[0, 0, 0, 3],
            &[0, 0, 0, 0, 0, 0, 1, 44], // 300
            &[0xff, 0xff, 0xff, 0xff],  // leader epoch -1
            &[2],
            b"m",
            &[0],
            &[0, 0, 0, 4],
            &[0; 8],
            &[0xff, 0xff, 0xff, 0xff],
            &[0], // null metadata
            &[0],
            &[0], // the topic's tagged fields
            &[0], // the request's
        ]
        .concat();
        assert_eq!(buf, expected);
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [
            &[0, 0, 0, 0][..],
            &[2],
            &[2],
            b"t",
            &[2],
            &[0, 0, 0, 3, 0, 12, 0], // OFFSET_METADATA_TOO_LARGE
            &[0],
            &[0],
        ]
        .concat();
        let mut cursor = Cursor::new(bytes);
        let response = TxnOffsetCommitResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position() as usize, cursor.get_ref().len());
        assert_eq!(
            response,
            TxnOffsetCommitResponse {
                throttle_time_ms: Int32(0),
                topics: vec![TxnOffsetCommitResponseTopic {
                    name: "t".into(),
                    partitions: vec![TxnOffsetCommitResponsePartition {
                        partition_index: 3,
                        error: Some(Error::OffsetMetadataTooLarge),
                    }],
                }],
            }
        );
    }
}
