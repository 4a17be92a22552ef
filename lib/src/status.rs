//! What `outboxctl status` shows: the state of one outbox as the table says it is now.
//!
//! [`read_status`] reads the coordination partition once (strongly consistent), then for
//! every bucket its backlog ([`DynamoDbOutboxStore::backlog`]: a count capped at the
//! pending count limit and the head message), its last message and its sequence counter,
//! and counts the dead-letter partition.
//! Nothing is cached: every figure of a [`StatusReport`] was read by that call. The report
//! also lists the [`Warning`]s an operator must act on; formatting is the caller's.
//!
//! Cost per call: one query of the coordination partition; per bucket one count query
//! (billed as a read of every counted item, at most the pending count limit), two
//! one-item queries and one `GetItem`; and one count query of the dead-letter partition.

use std::time::Duration;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use crate::attr;
use crate::error::Result;
use crate::options::TopicAllowList;
use crate::protocol::clock::{duration_to_ticks, TICKS_PER_SECOND};
use crate::protocol::coordination::Coordination;
use crate::protocol::schema::{self, Keys};
use crate::protocol::store::DynamoDbOutboxStore;

/// A heartbeat this far ahead of the reader's clock is reported as being in the future.
pub const FUTURE_TOLERANCE: Duration = Duration::from_secs(5);

/// The state of one outbox, read from its table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    /// The table.
    pub table: String,
    /// The key prefix of the outbox.
    pub key_prefix: String,
    /// The bucket count the report was read with (the reader's configuration).
    pub bucket_count: u32,
    /// The cap of each bucket's pending count.
    pub pending_count_limit: u32,
    /// The lease duration that decides whether a relay's heartbeat counts as live.
    pub lease_duration_seconds: f64,
    /// The reader's clock when the coordination partition had been read, in UTC ticks.
    pub now_ticks: i64,
    /// The same instant as RFC 3339 UTC text, to the second (`2026-11-30T14:00:00Z`).
    pub now_utc: String,
    /// One entry per bucket, ascending.
    pub buckets: Vec<BucketStatus>,
    /// One entry per heartbeat record, by relay id.
    pub relays: Vec<RelayStatus>,
    /// Items in the dead-letter partition (quarantined poison items), counted up to the
    /// pending count limit.
    pub dead_letters: u32,
    /// Whether the dead-letter count stopped at the limit.
    pub dead_letters_capped: bool,
    /// What an operator must act on; empty when all is well.
    pub warnings: Vec<Warning>,
}

/// The state of one bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketStatus {
    /// The bucket.
    pub bucket: u32,
    /// The relay the lease item names (lapsed or not); `None` for a free or never
    /// claimed bucket.
    pub owner: Option<String>,
    /// Whether the lease names an owner and has not lapsed: someone publishes this bucket.
    pub owned: bool,
    /// The lease expiry in UTC ticks; `None` when there is no lease item.
    pub lease_expires_at: Option<i64>,
    /// Seconds until the lease expires; negative once it has lapsed.
    pub lease_expires_in_seconds: Option<f64>,
    /// Pending messages, counted up to [`StatusReport::pending_count_limit`].
    pub pending: u32,
    /// Whether the count stopped at the limit (the backlog may be larger).
    pub pending_capped: bool,
    /// Enqueue time of the head (oldest) message, in UTC ticks.
    pub oldest_created_at: Option<i64>,
    /// Age of the head message in seconds.
    pub oldest_age_seconds: Option<f64>,
    /// Sequence number of the head message.
    pub head_sequence: Option<u64>,
    /// `BucketCount` stamped on the head message.
    pub head_bucket_count: Option<u32>,
    /// Whether the head item cannot be read as a message: a poison item the bucket is
    /// stuck behind.
    pub head_unreadable: bool,
    /// Why the head item cannot be read as a message.
    pub head_unreadable_reason: Option<String>,
    /// `Topic` of the head item (when it has one as a string).
    pub head_topic: Option<String>,
    /// Sequence number of the last (newest) message.
    pub last_sequence: Option<u64>,
    /// `BucketCount` stamped on the last message.
    pub last_bucket_count: Option<u32>,
    /// The bucket's sequence counter (the last number handed out); `None` when the counter
    /// item does not exist.
    pub sequence_counter: Option<u64>,
}

impl BucketStatus {
    /// Whether the bucket holds messages (by its count or by its head: the count is
    /// eventually consistent, the head read is not).
    pub fn has_pending(&self) -> bool {
        self.pending > 0 || self.head_sequence.is_some()
    }
}

/// The state of one relay, from its heartbeat record and the leases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelayStatus {
    /// The relay id.
    pub relay_id: String,
    /// Its last round, in UTC ticks.
    pub last_seen: i64,
    /// Seconds since its last round (negative when its heartbeat is in the future).
    pub last_seen_age_seconds: f64,
    /// When it stopped gracefully, in UTC ticks.
    pub stopped_at: Option<i64>,
    /// Whether it stopped gracefully.
    pub stopped: bool,
    /// When it plans to stop, in UTC ticks: a relay running inside a deadline (a Lambda
    /// invocation) announces it.
    pub stops_at: Option<i64>,
    /// Whether peers count it towards fair share: not stopped, heartbeat younger than the
    /// lease duration.
    pub active: bool,
    /// Buckets whose unlapsed lease names it, ascending.
    pub buckets: Vec<u32>,
}

/// Something an operator must act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// What kind of problem.
    pub kind: WarningKind,
    /// The bucket concerned, if one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    /// The relay concerned, if one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    /// What is wrong and what to look at, in one sentence.
    pub message: String,
    /// The head a bucket is parked behind, for the warnings that name one
    /// ([`WarningKind::UnreadableHead`], [`WarningKind::DisallowedTopicHead`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parked: Option<ParkedHead>,
}

/// The item a bucket is parked behind, as the table holds it: no relay publishes
/// anything of the bucket past it until it is moved aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParkedHead {
    /// Its sequence number (`None` when its sort key is not one).
    pub sequence: Option<u64>,
    /// Its `Topic` (`None` when it has none that is a string).
    pub topic: Option<String>,
    /// Why no relay publishes it.
    pub reason: String,
    /// The command that moves it to the dead-letter partition (`None` when its sort key
    /// is not a sequence number: then only a hand edit of the item helps).
    pub command: Option<String>,
}

/// Kinds of [`Warning`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// A bucket holds messages and no unlapsed lease names an owner: nobody publishes it.
    PendingWithoutOwner,
    /// A message is stamped with another bucket count than the reader's.
    BucketCountMismatch,
    /// A bucket's sequence counter is behind (or missing below) its newest message.
    SequenceBehind,
    /// A relay's heartbeat is ahead of the reader's clock.
    HeartbeatInFuture,
    /// A relay not counted as live (its heartbeat is old) still holds unlapsed leases: its
    /// heartbeats are being refused, or it stalled.
    HeartbeatStale,
    /// A lease beyond the bucket count has a live owner: a relay runs with another count.
    LeaseBeyondBucketCount,
    /// A bucket's oldest item cannot be read as a message: the bucket is stuck behind it.
    UnreadableHead,
    /// A bucket's oldest message is on a topic outside the reader's allow-list
    /// (`OUTBOX_ALLOWED_TOPICS`): relays with the same list park the bucket behind it.
    DisallowedTopicHead,
    /// The dead-letter partition holds quarantined items: messages that were not published.
    DeadLetters,
}

impl WarningKind {
    /// The snake_case name, as in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::PendingWithoutOwner => "pending_without_owner",
            WarningKind::BucketCountMismatch => "bucket_count_mismatch",
            WarningKind::SequenceBehind => "sequence_behind",
            WarningKind::HeartbeatInFuture => "heartbeat_in_future",
            WarningKind::HeartbeatStale => "heartbeat_stale",
            WarningKind::LeaseBeyondBucketCount => "lease_beyond_bucket_count",
            WarningKind::UnreadableHead => "unreadable_head",
            WarningKind::DisallowedTopicHead => "disallowed_topic_head",
            WarningKind::DeadLetters => "dead_letters",
        }
    }
}

impl StatusReport {
    /// Pending messages over all buckets (each capped at the limit).
    pub fn total_pending(&self) -> u64 {
        self.buckets.iter().map(|b| u64::from(b.pending)).sum()
    }

    /// Whether any bucket's count stopped at the limit.
    pub fn any_capped(&self) -> bool {
        self.buckets.iter().any(|b| b.pending_capped)
    }

    /// The warnings of one kind.
    pub fn warnings_of(&self, kind: WarningKind) -> impl Iterator<Item = &Warning> {
        self.warnings.iter().filter(move |w| w.kind == kind)
    }
}

/// What was read of one bucket besides the coordination partition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BucketRead {
    backlog: crate::protocol::store::sample::BucketBacklog,
    last_sequence: Option<u64>,
    last_bucket_count: Option<u32>,
    sequence_counter: Option<u64>,
}

fn seconds(ticks: i64) -> f64 {
    // Rounded to milliseconds: more is noise for an operator and for scripts.
    (ticks as f64 / TICKS_PER_SECOND as f64 * 1000.0).round() / 1000.0
}

/// Reads the state of the outbox of `store` now. `lease_duration` is the relays' (it
/// decides which heartbeats count as live; `RelayOptions::lease_duration`).
///
/// # Errors
/// [`Error::DynamoDb`](crate::Error::DynamoDb) when a read fails; nothing is reported then.
///
/// # Examples
/// ```no_run
/// use dynamo_outbox::status::read_status;
///
/// # async fn example(store: dynamo_outbox::DynamoDbOutboxStore) -> dynamo_outbox::Result<()> {
/// let lease_duration = dynamo_outbox::RelayOptions::default().lease_duration;
/// let report = read_status(&store, lease_duration).await?;
/// println!("{} messages pending", report.total_pending());
/// for warning in &report.warnings {
///     println!("{}", warning.message);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn read_status(
    store: &DynamoDbOutboxStore,
    lease_duration: Duration,
) -> Result<StatusReport> {
    let coordination = store.read_coordination().await?;
    let now = store.clock().now_ticks();
    let options = store.options();
    let reads: Vec<BucketRead> = stream::iter(0..options.bucket_count)
        .map(|bucket| read_bucket(store, bucket))
        .buffered(options.max_concurrency.max(1))
        .try_collect()
        .await?;
    let dead_letters = store.count_dead_letters().await?;
    Ok(build_report(
        store,
        &coordination,
        reads,
        dead_letters,
        now,
        duration_to_ticks(lease_duration),
    ))
}

async fn read_bucket(store: &DynamoDbOutboxStore, bucket: u32) -> Result<BucketRead> {
    let backlog = store.backlog(bucket).await?;
    let last = store.last_message(bucket).await?;
    let sequence_counter = store.sequence_counter(bucket).await?;
    Ok(BucketRead {
        backlog,
        last_sequence: last
            .as_ref()
            .and_then(|i| schema::parse_message_sk(store.keys().key_of(i).1)),
        last_bucket_count: last
            .as_ref()
            .and_then(|i| schema::get_n(i, attr::BUCKET_COUNT)),
        sequence_counter,
    })
}

fn build_report(
    store: &DynamoDbOutboxStore,
    coordination: &Coordination,
    reads: Vec<BucketRead>,
    (dead_letters, dead_letters_capped): (u32, bool),
    now: i64,
    lease_ticks: i64,
) -> StatusReport {
    let options = store.options();
    let keys = store.keys();
    let buckets: Vec<BucketStatus> = reads
        .into_iter()
        .map(|r| bucket_status(coordination, r, now))
        .collect();
    let relays = relay_statuses(coordination, now, lease_ticks);

    let mut warnings = Vec::new();
    for b in &buckets {
        warnings.extend(pending_without_owner(b, options.bucket_count));
        warnings.extend(unreadable_head(b, keys));
        warnings.extend(disallowed_topic_head(b, keys, &options.allowed_topics));
        warnings.extend(bucket_count_mismatch(b, keys, options.bucket_count));
        warnings.extend(sequence_behind(b, keys));
    }
    for r in &relays {
        warnings.extend(heartbeat_warning(r, now));
    }
    warnings.extend(leases_beyond_bucket_count(
        coordination,
        now,
        options.bucket_count,
    ));
    warnings.extend(dead_letter_warning(dead_letters, dead_letters_capped, keys));

    StatusReport {
        table: options.table_name.clone(),
        key_prefix: options.key_prefix.clone(),
        bucket_count: options.bucket_count,
        pending_count_limit: options.pending_count_limit,
        lease_duration_seconds: seconds(lease_ticks),
        now_ticks: now,
        now_utc: rfc3339(now),
        buckets,
        relays,
        dead_letters,
        dead_letters_capped,
        warnings,
    }
}

/// One bucket's row: what was read of it and its lease in `coordination`.
fn bucket_status(coordination: &Coordination, r: BucketRead, now: i64) -> BucketStatus {
    let bucket = r.backlog.bucket;
    let lease = coordination.lease(bucket);
    let expires = lease.map(|l| l.expires_at);
    let owner = lease.and_then(|l| l.owner.clone());
    BucketStatus {
        bucket,
        owned: owner.is_some() && expires.is_some_and(|e| e > now),
        owner,
        lease_expires_at: expires,
        lease_expires_in_seconds: expires.map(|e| seconds(e.saturating_sub(now))),
        pending: r.backlog.pending,
        pending_capped: r.backlog.capped,
        oldest_created_at: r.backlog.oldest_created_at,
        oldest_age_seconds: r
            .backlog
            .oldest_created_at
            .map(|c| seconds(now.saturating_sub(c))),
        head_sequence: r.backlog.head_sequence,
        head_bucket_count: r.backlog.head_bucket_count,
        head_unreadable: r.backlog.head_unreadable,
        head_unreadable_reason: r.backlog.head_unreadable_reason,
        head_topic: r.backlog.head_topic,
        last_sequence: r.last_sequence,
        last_bucket_count: r.last_bucket_count,
        sequence_counter: r.sequence_counter,
    }
}

/// Every heartbeat of `coordination` with the buckets its relay holds, by relay id.
fn relay_statuses(coordination: &Coordination, now: i64, lease_ticks: i64) -> Vec<RelayStatus> {
    let mut relays: Vec<RelayStatus> = coordination
        .relays
        .iter()
        .map(|r| {
            let held: Vec<u32> = coordination
                .leases
                .iter()
                .filter(|l| l.owner.as_deref() == Some(r.relay_id.as_str()) && l.expires_at > now)
                .map(|l| l.bucket)
                .collect();
            RelayStatus {
                relay_id: r.relay_id.clone(),
                last_seen: r.last_seen,
                last_seen_age_seconds: seconds(now.saturating_sub(r.last_seen)),
                stopped_at: r.stopped_at,
                stopped: r.stopped_at.is_some(),
                stops_at: r.stops_at,
                active: r.is_active(now, lease_ticks),
                buckets: held,
            }
        })
        .collect();
    relays.sort_by(|a, b| a.relay_id.cmp(&b.relay_id));
    relays
}

fn bucket_warning(kind: WarningKind, bucket: u32, message: String) -> Warning {
    Warning {
        kind,
        bucket: Some(bucket),
        relay: None,
        message,
        parked: None,
    }
}

/// [`WarningKind::PendingWithoutOwner`]: messages wait and no live relay holds the bucket.
fn pending_without_owner(b: &BucketStatus, bucket_count: u32) -> Option<Warning> {
    if !b.has_pending() || b.owned {
        return None;
    }
    let lease = match (&b.owner, b.lease_expires_in_seconds) {
        (None, None) => "its lease was never claimed".to_string(),
        (None, Some(_)) => "its lease is free".to_string(),
        (Some(o), Some(s)) => format!("the lease of {o} lapsed {:.0}s ago", -s),
        (Some(o), None) => format!("the lease of {o} has no expiry"),
    };
    Some(bucket_warning(
        WarningKind::PendingWithoutOwner,
        b.bucket,
        format!(
            "bucket {}: {} pending and no live owner ({lease}): no relay publishes it; \
             check that relays run against this table with bucket count {bucket_count}",
            b.bucket,
            pending_text(b.pending, b.pending_capped),
        ),
    ))
}

/// The command that moves the item at `bucket` / `sequence` to the dead-letter partition.
pub(crate) fn quarantine_command(bucket: u32, sequence: u64) -> String {
    format!("outboxctl quarantine {bucket} {sequence}")
}

/// The warning of a bucket parked behind its head: bucket, sequence, topic, why, and the
/// command that moves the head aside.
fn parked_warning(kind: WarningKind, b: &BucketStatus, keys: &Keys, reason: String) -> Warning {
    let sk = b
        .head_sequence
        .map_or_else(|| "?".into(), schema::message_sk);
    let topic = b
        .head_topic
        .as_deref()
        .map_or_else(|| "no topic".to_string(), |t| format!("topic {t:?}"));
    let command = b.head_sequence.map(|seq| quarantine_command(b.bucket, seq));
    let action = match (&command, b.head_sequence) {
        (Some(c), Some(seq)) => format!(
            "move it to the dead-letter partition with `{c}`; then `outboxctl dead-letters \
             show {} {seq}` shows it, and `outboxctl dead-letters redrive` or `purge --yes` \
             settles it",
            b.bucket
        ),
        _ => "its sort key is not a sequence number: fix or delete the item by hand".into(),
    };
    let message = format!(
        "bucket {}: parked behind {}/{sk} ({topic}): {reason}; no relay publishes anything \
         of the bucket past it; {action}",
        b.bucket,
        keys.message_pk(b.bucket),
    );
    Warning {
        parked: Some(ParkedHead {
            sequence: b.head_sequence,
            topic: b.head_topic.clone(),
            reason,
            command,
        }),
        ..bucket_warning(kind, b.bucket, message)
    }
}

/// [`WarningKind::UnreadableHead`]: the bucket is stuck behind a poison item.
fn unreadable_head(b: &BucketStatus, keys: &Keys) -> Option<Warning> {
    if !b.head_unreadable {
        return None;
    }
    let why = b.head_unreadable_reason.as_deref().unwrap_or("unknown");
    let reason = format!("it cannot be read as a message ({why})");
    Some(parked_warning(WarningKind::UnreadableHead, b, keys, reason))
}

/// [`WarningKind::DisallowedTopicHead`]: the bucket is parked behind a message on a topic
/// outside the allow-list (a readable head; an unreadable one is [`unreadable_head`]'s).
fn disallowed_topic_head(
    b: &BucketStatus,
    keys: &Keys,
    allowed: &TopicAllowList,
) -> Option<Warning> {
    if b.head_unreadable {
        return None;
    }
    let topic = b.head_topic.as_deref()?;
    if allowed.allows(topic) {
        return None;
    }
    let reason = format!("{}: relays refuse to publish it", allowed.refusal(topic));
    Some(parked_warning(
        WarningKind::DisallowedTopicHead,
        b,
        keys,
        reason,
    ))
}

/// [`WarningKind::BucketCountMismatch`]: the head or the last message is stamped with
/// another bucket count than this outbox's (reported once per bucket).
fn bucket_count_mismatch(b: &BucketStatus, keys: &Keys, bucket_count: u32) -> Option<Warning> {
    let stamps = [
        (b.head_sequence, b.head_bucket_count),
        (b.last_sequence, b.last_bucket_count),
    ];
    let (seq, count) = stamps.into_iter().find_map(|stamp| match stamp {
        (Some(seq), Some(count)) if count != bucket_count && count != 0 => Some((seq, count)),
        _ => None,
    })?;
    Some(bucket_warning(
        WarningKind::BucketCountMismatch,
        b.bucket,
        format!(
            "bucket {}: message {}/{} is stamped with bucket count {count}, but this \
             outbox's is {bucket_count}: a writer uses another count, its keys lose their order \
             and relays fault on the message (drain the table before changing the count)",
            b.bucket,
            keys.message_pk(b.bucket),
            schema::message_sk(seq),
        ),
    ))
}

/// [`WarningKind::SequenceBehind`]: a message exists past the bucket's sequence counter.
fn sequence_behind(b: &BucketStatus, keys: &Keys) -> Option<Warning> {
    let last = b.last_sequence?;
    if b.sequence_counter.is_some_and(|c| c >= last) {
        return None;
    }
    let counter = b
        .sequence_counter
        .map_or("missing".to_string(), |c| format!("at {c}"));
    Some(bucket_warning(
        WarningKind::SequenceBehind,
        b.bucket,
        format!(
            "bucket {}: the sequence counter {}/{} is {counter} but message {last} exists: \
             the counter was reset or restored; enqueues into this bucket fail until it \
             passes {last} (raise it with ADD {} :n)",
            b.bucket,
            keys.sequence_pk(b.bucket),
            schema::SEQUENCE_SK,
            attr::SEQUENCE
        ),
    ))
}

/// [`WarningKind::HeartbeatInFuture`] or [`WarningKind::HeartbeatStale`] of one relay.
fn heartbeat_warning(r: &RelayStatus, now: i64) -> Option<Warning> {
    let (kind, message) = if r.last_seen.saturating_sub(now) > duration_to_ticks(FUTURE_TOLERANCE) {
        (
            WarningKind::HeartbeatInFuture,
            format!(
                "relay {}: its heartbeat is {:.0}s in the future: its clock is ahead of this \
                 host's (or this host's is behind); a process under this id with a correct \
                 clock has its heartbeats refused until then",
                r.relay_id, -r.last_seen_age_seconds
            ),
        )
    } else if !r.stopped && !r.active && !r.buckets.is_empty() {
        (
            WarningKind::HeartbeatStale,
            format!(
                "relay {}: holds bucket(s) {} but its heartbeat is {:.0}s old: its heartbeats \
                 are refused (a clock set back, two processes sharing the id) or it stalled",
                r.relay_id,
                list(&r.buckets),
                r.last_seen_age_seconds
            ),
        )
    } else {
        return None;
    };
    Some(Warning {
        kind,
        relay: Some(r.relay_id.clone()),
        bucket: None,
        message,
        parked: None,
    })
}

/// [`WarningKind::LeaseBeyondBucketCount`]: live leases of buckets this outbox does not
/// have.
fn leases_beyond_bucket_count(
    coordination: &Coordination,
    now: i64,
    bucket_count: u32,
) -> Vec<Warning> {
    coordination
        .leases
        .iter()
        .filter(|l| l.expires_at > now && l.bucket >= bucket_count)
        .filter_map(|l| {
            let owner = l.owner.as_ref()?;
            Some(Warning {
                kind: WarningKind::LeaseBeyondBucketCount,
                bucket: Some(l.bucket),
                relay: Some(owner.clone()),
                message: format!(
                    "bucket {}: relay {owner} holds its lease, but this outbox has \
                     {bucket_count} buckets: a relay runs with another bucket count",
                    l.bucket
                ),
                parked: None,
            })
        })
        .collect()
}

/// [`WarningKind::DeadLetters`]: quarantined items wait for an operator.
fn dead_letter_warning(count: u32, capped: bool, keys: &Keys) -> Option<Warning> {
    (count > 0).then(|| Warning {
        kind: WarningKind::DeadLetters,
        bucket: None,
        relay: None,
        message: format!(
            "{}{count} quarantined item(s) in {}: messages that were not published; \
             `outboxctl dead-letters list` shows them, `redrive` puts them back at the tail \
             of their bucket, `purge --yes` deletes them",
            if capped { ">=" } else { "" },
            keys.dead_letter_pk()
        ),
        parked: None,
    })
}

/// UTC ticks as `YYYY-MM-DDTHH:MM:SSZ` (seconds truncated).
pub fn rfc3339(ticks: i64) -> String {
    // Ticks from any writer: far enough below the Unix epoch, the difference is no i64.
    let secs = ticks
        .checked_sub(crate::protocol::clock::UNIX_EPOCH_TICKS)
        .map(|t| t.div_euclid(TICKS_PER_SECOND));
    match secs.and_then(|s| chrono::DateTime::from_timestamp(s, 0)) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        // Outside chrono's range (about ±262,000 years): no such date to show.
        None => format!("{ticks} ticks"),
    }
}

fn pending_text(pending: u32, capped: bool) -> String {
    match (pending, capped) {
        (_, true) => format!(">={pending} messages"),
        (0, false) => "messages".to_string(),
        (1, false) => "1 message".to_string(),
        (n, false) => format!("{n} messages"),
    }
}

fn list(buckets: &[u32]) -> String {
    buckets
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_at_the_ends_of_i64_from_another_writer_show_without_overflow() {
        // Numbers of items anyone can write: a lease expiring at i64::MIN, a heartbeat
        // there and at i64::MAX, a head created at i64::MIN.
        let (now, lease_ticks) = (639_316_440_000_000_000, 10 * TICKS_PER_SECOND);
        let lease = |bucket, expires_at| crate::protocol::coordination::LeaseRecord {
            bucket,
            owner: Some("far".into()),
            expires_at,
            expiry_exact: true,
        };
        let relay = |id: &str, last_seen| crate::protocol::coordination::RelayRecord {
            relay_id: id.into(),
            last_seen,
            stopped_at: None,
            stops_at: None,
            delivery: None,
        };
        let coordination = Coordination {
            leases: vec![lease(0, i64::MIN), lease(1, i64::MAX)],
            relays: vec![relay("past", i64::MIN), relay("future", i64::MAX)],
        };
        let read = |bucket| BucketRead {
            backlog: crate::protocol::store::sample::BucketBacklog {
                bucket,
                pending: 1,
                capped: false,
                oldest_created_at: Some(i64::MIN),
                head_sequence: Some(1),
                head_bucket_count: None,
                head_unreadable: false,
                head_unreadable_reason: None,
                head_topic: None,
            },
            last_sequence: None,
            last_bucket_count: None,
            sequence_counter: None,
        };
        let lapsed = bucket_status(&coordination, read(0), now);
        assert!(!lapsed.owned);
        assert!(lapsed.lease_expires_in_seconds.unwrap() < 0.0);
        assert!(lapsed.oldest_age_seconds.unwrap() > 0.0);
        let far = bucket_status(&coordination, read(1), now);
        assert!(far.owned && far.lease_expires_in_seconds.unwrap() > 0.0);

        let relays = relay_statuses(&coordination, now, lease_ticks);
        let of = |id: &str| relays.iter().find(|r| r.relay_id == id).unwrap();
        assert!(of("past").last_seen_age_seconds > 0.0);
        assert!(of("future").last_seen_age_seconds < 0.0);
        assert_eq!(heartbeat_warning(of("past"), now), None);
        assert_eq!(
            heartbeat_warning(of("future"), now).map(|w| w.kind),
            Some(WarningKind::HeartbeatInFuture)
        );
        assert_eq!(rfc3339(i64::MIN), format!("{} ticks", i64::MIN));
        // i64::MAX ticks is in the year 29,228, inside chrono's range.
        assert!(
            rfc3339(i64::MAX).contains("29228-"),
            "{}",
            rfc3339(i64::MAX)
        );
    }

    #[test]
    fn rfc3339_of_ticks() {
        assert_eq!(
            rfc3339(crate::protocol::clock::UNIX_EPOCH_TICKS),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(rfc3339(639_316_440_000_000_000), "2026-11-30T14:00:00Z");
        assert_eq!(rfc3339(638_396_640_000_000_000 - 1), "2023-12-31T23:59:59Z");
        assert_eq!(
            rfc3339(630_822_816_000_000_000 + 59 * 86_400 * TICKS_PER_SECOND),
            "2000-02-29T00:00:00Z"
        );
    }
}
