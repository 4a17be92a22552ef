//! `OffsetFetch` (API key 9), version 7: a consumer group's committed offsets.
//!
//! Version 7 adds `require_stable` ([KIP-447]): with it, the group coordinator answers a
//! partition that has an offset commit pending in an open transaction with
//! `UNSTABLE_OFFSET_COMMIT` instead of the last committed offset. Version 7 is the last with one
//! group per request (version 8 batches groups, [KIP-709]); Apache Kafka 2.5 through 4.1 accept
//! it.
//!
//! # References
//! - `OffsetFetchRequest.json` and `OffsetFetchResponse.json` of Apache Kafka
//!
//! [KIP-447]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-447%3A+Producer+scalability+for+exactly+once+semantics
//! [KIP-709]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-709%3A+Extend+OffsetFetch+requests+to+accept+multiple+group+ids

use std::io::{Read, Write};

use crate::protocol::{
    api_key::ApiKey,
    api_version::{ApiVersion, ApiVersionRange},
    error::Error,
    primitives::{
        Boolean, CompactArrayRef, CompactNullableString, CompactString, CompactStringRef, Int16,
        Int32, Int64, TaggedFields, UnsignedVarint,
    },
    traits::{ReadType, WriteType},
};

use super::{
    ReadVersionedError, ReadVersionedType, RequestBody, WriteVersionedError, WriteVersionedType,
    read_compact_versioned_array, write_compact_versioned_array,
};

const VERSION: i16 = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchRequestTopic {
    /// The topic.
    pub name: String,

    /// The partitions whose offsets to fetch.
    pub partition_indexes: Vec<i32>,
}

impl<W> WriteVersionedType<W> for OffsetFetchRequestTopic
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
        let partitions: Vec<Int32> = self.partition_indexes.iter().copied().map(Int32).collect();
        CompactArrayRef(Some(partitions.as_slice())).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchRequest {
    /// The consumer group.
    pub group_id: String,

    /// The partitions whose offsets to fetch, by topic; `None` for all of the group's.
    pub topics: Option<Vec<OffsetFetchRequestTopic>>,

    /// Answer a partition with an offset commit pending in an open transaction with
    /// `UNSTABLE_OFFSET_COMMIT`.
    pub require_stable: bool,
}

impl<W> WriteVersionedType<W> for OffsetFetchRequest
where
    W: Write,
{
    fn write_versioned(
        &self,
        writer: &mut W,
        version: ApiVersion,
    ) -> Result<(), WriteVersionedError> {
        assert_eq!(version.0.0, VERSION);
        CompactStringRef(&self.group_id).write(writer)?;
        match &self.topics {
            Some(topics) => {
                write_compact_versioned_array(writer, version, Some(topics.as_slice()))?
            }
            None => UnsignedVarint(0).write(writer)?,
        }
        Boolean(self.require_stable).write(writer)?;
        TaggedFields::default().write(writer)?;
        Ok(())
    }
}

impl RequestBody for OffsetFetchRequest {
    type ResponseBody = OffsetFetchResponse;
    const API_KEY: ApiKey = ApiKey::OffsetFetch;
    const API_VERSION_RANGE: ApiVersionRange =
        ApiVersionRange::new(ApiVersion(Int16(VERSION)), ApiVersion(Int16(VERSION)));
    const FIRST_TAGGED_FIELD_IN_REQUEST_VERSION: ApiVersion = ApiVersion(Int16(6));
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchResponsePartition {
    /// The partition.
    pub partition_index: i32,

    /// The committed offset, or -1 if there is none.
    pub committed_offset: i64,

    /// The leader epoch committed with it, or -1.
    pub committed_leader_epoch: i32,

    /// The metadata committed with it.
    pub metadata: Option<String>,

    /// The error, if any.
    pub error: Option<Error>,
}

impl<R> ReadVersionedType<R> for OffsetFetchResponsePartition
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let partition = Self {
            partition_index: Int32::read(reader)?.0,
            committed_offset: Int64::read(reader)?.0,
            committed_leader_epoch: Int32::read(reader)?.0,
            metadata: CompactNullableString::read(reader)?.0,
            error: Error::new(Int16::read(reader)?.0),
        };
        TaggedFields::read(reader)?;
        Ok(partition)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchResponseTopic {
    /// The topic.
    pub name: String,

    /// The offsets of its partitions.
    pub partitions: Vec<OffsetFetchResponsePartition>,
}

impl<R> ReadVersionedType<R> for OffsetFetchResponseTopic
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
pub struct OffsetFetchResponse {
    /// The time the request was throttled for, in milliseconds.
    pub throttle_time_ms: Int32,

    /// The offsets, by topic.
    pub topics: Vec<OffsetFetchResponseTopic>,

    /// The group's error, if any (a coordinator error, say).
    pub error: Option<Error>,
}

impl<R> ReadVersionedType<R> for OffsetFetchResponse
where
    R: Read,
{
    fn read_versioned(reader: &mut R, version: ApiVersion) -> Result<Self, ReadVersionedError> {
        assert_eq!(version.0.0, VERSION);
        let response = Self {
            throttle_time_ms: Int32::read(reader)?,
            topics: read_compact_versioned_array(reader, version)?.unwrap_or_default(),
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
        OffsetFetchRequest {
            group_id: "g".into(),
            topics: Some(vec![OffsetFetchRequestTopic {
                name: "t".into(),
                partition_indexes: vec![1],
            }]),
            require_stable: true,
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        let expected = [
            &[2][..],
            b"g",
            &[2], // one topic
            &[2],
            b"t",
            &[2, 0, 0, 0, 1], // partitions [1]
            &[0],
            &[1], // require_stable
            &[0],
        ]
        .concat();
        assert_eq!(buf, expected);

        let mut buf = vec![];
        OffsetFetchRequest {
            group_id: "g".into(),
            topics: None,
            require_stable: false,
        }
        .write_versioned(&mut buf, V)
        .unwrap();
        assert_eq!(buf, [&[2][..], b"g", &[0, 0, 0]].concat());
    }

    #[test]
    fn response_wire_bytes() {
        let bytes = [
            &[0, 0, 0, 0][..],
            &[2], // one topic
            &[2],
            b"t",
            &[3], // two partitions
            &[0, 0, 0, 1],
            &[0, 0, 0, 0, 0, 0, 0, 42],
            &[0, 0, 0, 5], // leader epoch
            &[3],
            b"md",
            &[0, 0],
            &[0],
            &[0, 0, 0, 2],
            &[0xff; 8], // no offset
            &[0xff; 4],
            &[0],     // null metadata
            &[0, 88], // UNSTABLE_OFFSET_COMMIT
            &[0],
            &[0],    // the topic's tagged fields
            &[0, 0], // no group error
            &[0],
        ]
        .concat();
        let mut cursor = Cursor::new(bytes);
        let response = OffsetFetchResponse::read_versioned(&mut cursor, V).unwrap();
        assert_eq!(cursor.position() as usize, cursor.get_ref().len());
        assert_eq!(
            response,
            OffsetFetchResponse {
                throttle_time_ms: Int32(0),
                topics: vec![OffsetFetchResponseTopic {
                    name: "t".into(),
                    partitions: vec![
                        OffsetFetchResponsePartition {
                            partition_index: 1,
                            committed_offset: 42,
                            committed_leader_epoch: 5,
                            metadata: Some("md".into()),
                            error: None,
                        },
                        OffsetFetchResponsePartition {
                            partition_index: 2,
                            committed_offset: -1,
                            committed_leader_epoch: -1,
                            metadata: None,
                            error: Some(Error::UnstableOffsetCommit),
                        },
                    ],
                }],
                error: None,
            }
        );
    }
}
