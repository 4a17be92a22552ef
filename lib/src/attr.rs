//! Attribute names of the outbox items (the reference specification's, plus this
//! project's extensions) and DynamoDB's item size limit: a leaf module that the options
//! (their validation) and the protocol's schema both use; public as
//! [`protocol::attr`](crate::protocol::attr).

/// DynamoDB's item size limit in bytes (400 KB).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Message id (S), a lowercase hyphenated UUID.
pub const MESSAGE_ID: &str = "MessageId";
/// Topic (S).
pub const TOPIC: &str = "Topic";
/// Serialized key (B); absent for a keyless record.
pub const KEY: &str = "Key";
/// Serialized value (B); absent for a tombstone.
pub const VALUE: &str = "Value";
/// Header blob (B), format version 1; absent when there are no headers.
pub const HEADERS: &str = "Headers";
/// Explicit partition (N).
pub const PARTITION: &str = "Partition";
/// Enqueue time in UTC ticks (N).
pub const CREATED_AT: &str = "CreatedAtUtc";
/// The writer's bucket count (N).
pub const BUCKET_COUNT: &str = "BucketCount";
/// Last sequence number handed out (N), on the counter item.
pub const SEQUENCE: &str = "Sequence";
/// Relay id holding a lease (S); absent for a free bucket.
pub const OWNER: &str = "Owner";
/// Lease expiry in UTC ticks (N), also the lease's version.
pub const EXPIRES_AT: &str = "ExpiresAtUtc";
/// A relay's last round in UTC ticks (N).
pub const LAST_SEEN: &str = "LastSeenUtc";
/// When a relay stopped, in UTC ticks (N).
pub const STOPPED_AT: &str = "StoppedAtUtc";
/// When a relay with a deadline plans to stop, in UTC ticks (N) (this project): peers
/// run their next acquisition right after it, so its buckets change hands within a
/// poll interval instead of a renew interval. Relays that do not know it ignore it.
pub const STOPS_AT: &str = "StopsAtUtc";
/// How the relay delivers, on its heartbeat: `exactly-once`, or absent (this project).
pub const DELIVERY: &str = "Delivery";
/// When an idempotency marker stops counting, in UTC ticks (N) (this project).
pub const IDEMPOTENCY_EXPIRES_AT: &str = "IdempotencyExpiresAtUtc";
/// The enqueue result an idempotency marker returns again (S, JSON) (this project).
pub const RESULT: &str = "Result";
/// When DynamoDB's time to live may delete the item, in epoch seconds (N) (this project):
/// the table's one TTL attribute, on the items that may expire (idempotency markers,
/// continuations), never on a message, a counter or a lease.
pub const TIME_TO_LIVE: &str = "TimeToLive";

/// When a dead letter was moved to the dead-letter partition, in UTC ticks (N) (this
/// project).
pub const QUARANTINED_AT: &str = "QuarantinedAtUtc";
/// Why a dead letter was moved to the dead-letter partition (S) (this project).
pub const QUARANTINE_REASON: &str = "QuarantineReason";

/// Every attribute name above; key attributes may not take one of these names.
pub const ALL: &[&str] = &[
    MESSAGE_ID,
    TOPIC,
    KEY,
    VALUE,
    HEADERS,
    PARTITION,
    CREATED_AT,
    BUCKET_COUNT,
    SEQUENCE,
    OWNER,
    EXPIRES_AT,
    LAST_SEEN,
    STOPPED_AT,
    STOPS_AT,
    DELIVERY,
    IDEMPOTENCY_EXPIRES_AT,
    RESULT,
    TIME_TO_LIVE,
    QUARANTINED_AT,
    QUARANTINE_REASON,
];
