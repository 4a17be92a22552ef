//! The checker: a pure function from a recorded history to the figures of a scenario.
//!
//! Times are microseconds since the Unix epoch on the host's wall clock, which every
//! process of a run shares (the relays' log timestamps and Kafka record timestamps come
//! from the system clock even when a relay's lease clock is offset).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// One acknowledged enqueue.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Ack {
    /// Message id (lowercase hyphenated UUID).
    pub message_id: String,
    /// Kafka key.
    pub key: String,
    /// Per-key counter carried in the value.
    pub counter: u64,
    /// Topic.
    pub topic: String,
    /// Bucket.
    pub bucket: u32,
    /// Sequence number within the bucket.
    pub sequence: u64,
    /// When the writer saw the acknowledgement.
    pub acked_at_us: i64,
    /// Committed late: its sequence number was reserved (the counter's `ADD`) and its item
    /// put in a transaction of its own a moment later, so that for that moment it was a
    /// hole the relays could step over.
    #[serde(default)]
    pub late: bool,
}

/// One record read back from Kafka.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The message-id header.
    pub message_id: Option<String>,
    /// Record timestamp (the relay's publish time), milliseconds.
    pub timestamp_ms: Option<i64>,
    /// The value's length, when the reader printed only its head (large values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_len: Option<usize>,
}

/// A relay's belief about one bucket, from its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OwnershipEvent {
    /// When it was logged.
    pub at_us: i64,
    /// Bucket.
    pub bucket: u32,
    /// `true` for "owns", `false` for "disowns".
    pub owns: bool,
}

/// What one relay process left behind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RelayHistory {
    /// Relay id.
    pub relay_id: String,
    /// Ownership changes in log order.
    pub events: Vec<OwnershipEvent>,
    /// When the process died or exited (a belief still open then ends there).
    pub ended_at_us: Option<i64>,
    /// Refused conditional writes logged, by kind.
    pub refused: BTreeMap<String, u64>,
    /// When each refusal was logged.
    pub refused_at_us: Vec<i64>,
    /// Buckets handed back (`handed a bucket back`, logged once the release request
    /// returned): (when, bucket).
    pub released: Vec<(i64, u32)>,
}

/// Everything a scenario recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Bucket count.
    pub bucket_count: u32,
    /// Acknowledged enqueues.
    pub acks: Vec<Ack>,
    /// Enqueues that returned an error (their message may or may not exist).
    pub failed_enqueues: u64,
    /// Every record of every topic of the scenario.
    pub deliveries: Vec<Delivery>,
    /// Every relay process.
    pub relays: Vec<RelayHistory>,
    /// Message ids of the message items left in the table after the final drain.
    pub left_in_table: Vec<String>,
    /// Records read by a `read_uncommitted` consumer (exactly-once delivery: the committed
    /// records above plus the copies of aborted transactions), when the scenario read them.
    pub uncommitted_records: Option<usize>,
    /// From the writers' start to the end of the final drain.
    pub window_us: (i64, i64),
    /// The size of every value written, when the scenario padded them (large items): then
    /// every record's value must have it.
    pub value_bytes: Option<usize>,
}

/// The figures of one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Acknowledged enqueues.
    pub acked: usize,
    /// Enqueues that returned an error.
    pub failed_enqueues: u64,
    /// Records read from Kafka.
    pub records: usize,
    /// Acknowledged messages found neither in Kafka nor in the table.
    pub lost: usize,
    /// The first few of them, to trace through the relays' logs.
    pub lost_examples: Vec<Ack>,
    /// Acknowledged messages without a record in Kafka (lost or never drained): with
    /// `unacked_records`, the id sets of acknowledged and delivered messages differ by
    /// these.
    pub undelivered: usize,
    /// Records whose value length differs from [`History::value_bytes`].
    pub wrong_size_values: usize,
    /// Records of messages that were not acknowledged (a failed enqueue that landed).
    pub unacked_records: usize,
    /// Records beyond the first copy of each message.
    pub duplicates: usize,
    /// `duplicates / acked`.
    pub duplicate_rate: f64,
    /// Most copies of one message.
    pub max_copies: usize,
    /// First deliveries of a key that came after a later counter of the same key.
    pub order_inversions: usize,
    /// Message items left after the final drain.
    pub never_drained: usize,
    /// Acknowledged messages committed late (a reservation, then the put a moment later).
    pub late_commits: usize,
    /// Of those, messages whose first record came more than [`HOLE_MARGIN_MS`] after the
    /// first record of a message with a higher sequence number of the same bucket: holes
    /// the relays stepped over and published once they filled.
    pub holes_stepped_over: usize,
    /// Records a `read_uncommitted` consumer read, when read (see
    /// [`History::uncommitted_records`]).
    pub uncommitted_records: Option<usize>,
    /// Refused conditional writes by kind, over every relay.
    pub refused: BTreeMap<String, u64>,
    /// Sum of `refused`.
    pub refused_total: u64,
    /// Of those, refusals logged after the writers started (startup excluded).
    pub refused_during_writes: u64,
    /// Longest stretch in which a bucket had an acknowledged, undelivered message and no
    /// relay believed it owned the bucket, milliseconds.
    pub max_unowned_pending_ms: f64,
    /// Pairs of ownership intervals of two relays on one bucket that intersect.
    pub overlaps: usize,
    /// Their summed intersection, milliseconds.
    pub overlap_total_ms: f64,
    /// The longest intersection, milliseconds.
    pub overlap_max_ms: f64,
    /// Intersections where the earlier owner had handed the bucket back: the relay stops
    /// publishing a bucket before its release request, but logs `disowns` only at the end
    /// of the round, after the request returned, so a peer's claim can be logged first.
    /// Not counted in `overlaps`.
    pub release_log_overlaps: usize,
    /// Their longest intersection, milliseconds.
    pub release_log_overlap_max_ms: f64,
    /// Enqueue acknowledgement to first delivery: median, 99th percentile, maximum (ms).
    pub latency_p50_ms: f64,
    /// See `latency_p50_ms`.
    pub latency_p99_ms: f64,
    /// See `latency_p50_ms`.
    pub latency_max_ms: f64,
}

/// One relay's belief that it owns a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// Index of the relay in `History::relays`.
    pub relay: usize,
    /// First logged `owns`.
    pub start: i64,
    /// The `disowns`, or the process's end.
    pub end: i64,
    /// Ended by handing the bucket back (a release logged just before the `disowns`).
    pub released: bool,
}

/// How long before a `disowns` a release log of the same bucket marks it as a release.
const RELEASE_LOG_WINDOW_US: i64 = 100_000;

/// How much later (record timestamps, milliseconds) a late commit's first record must
/// come than a higher sequence number's to count as a hole stepped over: the records of
/// one batch to several partitions may differ by a millisecond or two.
pub const HOLE_MARGIN_MS: i64 = 50;

/// Ownership intervals per bucket.
pub fn ownership_intervals(h: &History) -> BTreeMap<u32, Vec<Interval>> {
    let mut out: BTreeMap<u32, Vec<Interval>> = BTreeMap::new();
    for (i, r) in h.relays.iter().enumerate() {
        let mut open: BTreeMap<u32, i64> = BTreeMap::new();
        for e in &r.events {
            if e.owns {
                open.entry(e.bucket).or_insert(e.at_us);
            } else if let Some(start) = open.remove(&e.bucket) {
                let released = r.released.iter().any(|&(t, b)| {
                    b == e.bucket && t <= e.at_us && e.at_us - t <= RELEASE_LOG_WINDOW_US
                });
                out.entry(e.bucket).or_default().push(Interval {
                    relay: i,
                    start,
                    end: e.at_us,
                    released,
                });
            }
        }
        let end = r.ended_at_us.unwrap_or(h.window_us.1);
        for (b, start) in open {
            out.entry(b).or_default().push(Interval {
                relay: i,
                start,
                end: end.max(start),
                released: false,
            });
        }
    }
    out
}

fn merge(mut v: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    v.retain(|(a, b)| b > a);
    v.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The longest part of `pending` not covered by `owned` (both merged, sorted).
fn longest_uncovered(pending: &[(i64, i64)], owned: &[(i64, i64)]) -> i64 {
    let mut best = 0;
    for &(a, b) in pending {
        let mut cursor = a;
        for &(oa, ob) in owned {
            if ob <= cursor {
                continue;
            }
            if oa >= b {
                break;
            }
            if oa > cursor {
                best = best.max(oa - cursor);
            }
            cursor = cursor.max(ob);
            if cursor >= b {
                break;
            }
        }
        if cursor < b {
            best = best.max(b - cursor);
        }
    }
    best
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Computes the figures of a history.
pub fn check(h: &History) -> Figures {
    let mut f = Figures {
        acked: h.acks.len(),
        failed_enqueues: h.failed_enqueues,
        records: h.deliveries.len(),
        never_drained: h.left_in_table.len(),
        ..Figures::default()
    };
    // Copies and first delivery of each message.
    let mut copies: HashMap<&str, usize> = HashMap::new();
    let mut first: HashMap<&str, &Delivery> = HashMap::new();
    for d in &h.deliveries {
        let Some(id) = d.message_id.as_deref() else {
            f.unacked_records += 1;
            continue;
        };
        *copies.entry(id).or_default() += 1;
        let slot = first.entry(id).or_insert(d);
        if (d.partition, d.offset) < (slot.partition, slot.offset) && d.topic == slot.topic {
            *slot = d;
        }
    }
    let acked: HashMap<&str, &Ack> = h.acks.iter().map(|a| (a.message_id.as_str(), a)).collect();
    for (id, n) in &copies {
        if acked.contains_key(id) {
            f.duplicates += n - 1;
            f.max_copies = f.max_copies.max(*n);
        } else {
            f.unacked_records += n;
        }
    }
    // Lost: in neither Kafka nor the table (what is still in the table is "never drained").
    let left: std::collections::HashSet<&str> =
        h.left_in_table.iter().map(String::as_str).collect();
    let lost: Vec<&Ack> = h
        .acks
        .iter()
        .filter(|a| {
            !copies.contains_key(a.message_id.as_str()) && !left.contains(a.message_id.as_str())
        })
        .collect();
    f.lost = lost.len();
    f.lost_examples = lost.into_iter().take(3).cloned().collect();
    f.undelivered = h
        .acks
        .iter()
        .filter(|a| !copies.contains_key(a.message_id.as_str()))
        .count();
    if let Some(bytes) = h.value_bytes {
        f.wrong_size_values = h
            .deliveries
            .iter()
            .filter(|d| d.value_len != Some(bytes))
            .count();
    }
    f.duplicate_rate = if f.acked == 0 {
        0.0
    } else {
        f.duplicates as f64 / f.acked as f64
    };

    // Per-key order among first deliveries (a key's records share one partition).
    let mut by_key: HashMap<&str, Vec<(&str, i32, i64, u64)>> = HashMap::new();
    for a in &h.acks {
        if let Some(d) = first.get(a.message_id.as_str()) {
            by_key.entry(a.key.as_str()).or_default().push((
                d.topic.as_str(),
                d.partition,
                d.offset,
                a.counter,
            ));
        }
    }
    for firsts in by_key.values_mut() {
        firsts.sort_unstable();
        let mut max_seen = None;
        for &(_, _, _, counter) in firsts.iter() {
            if max_seen.is_some_and(|m| counter < m) {
                f.order_inversions += 1;
            }
            max_seen = Some(max_seen.map_or(counter, |m: u64| m.max(counter)));
        }
    }

    // Latency, and pending intervals per bucket.
    let mut latencies = Vec::new();
    let mut pending: BTreeMap<u32, Vec<(i64, i64)>> = BTreeMap::new();
    for a in &h.acks {
        let delivered_us = first
            .get(a.message_id.as_str())
            .and_then(|d| d.timestamp_ms)
            .map(|ms| ms * 1000);
        if let Some(t) = delivered_us {
            latencies.push(((t - a.acked_at_us) as f64 / 1000.0).max(0.0));
        }
        let end = delivered_us.unwrap_or(h.window_us.1);
        pending
            .entry(a.bucket)
            .or_default()
            .push((a.acked_at_us, end));
    }
    latencies.sort_by(f64::total_cmp);
    f.latency_p50_ms = percentile(&latencies, 0.50);
    f.latency_p99_ms = percentile(&latencies, 0.99);
    f.latency_max_ms = latencies.last().copied().unwrap_or(0.0);

    // Late commits, and the holes stepped over: a higher sequence number of the bucket
    // reached Kafka first (record timestamps: the relays' publish times).
    let mut first_at: BTreeMap<u32, Vec<(u64, i64)>> = BTreeMap::new();
    for a in &h.acks {
        if let Some(ts) = first
            .get(a.message_id.as_str())
            .and_then(|d| d.timestamp_ms)
        {
            first_at.entry(a.bucket).or_default().push((a.sequence, ts));
        }
    }
    for a in h.acks.iter().filter(|a| a.late) {
        f.late_commits += 1;
        let Some(ts) = first
            .get(a.message_id.as_str())
            .and_then(|d| d.timestamp_ms)
        else {
            continue;
        };
        let stepped_over = first_at.get(&a.bucket).is_some_and(|v| {
            v.iter()
                .any(|&(seq, t)| seq > a.sequence && t + HOLE_MARGIN_MS < ts)
        });
        if stepped_over {
            f.holes_stepped_over += 1;
        }
    }
    f.uncommitted_records = h.uncommitted_records;

    let intervals = ownership_intervals(h);
    for (bucket, p) in pending {
        let owned = merge(
            intervals
                .get(&bucket)
                .map(|v| v.iter().map(|iv| (iv.start, iv.end)).collect())
                .unwrap_or_default(),
        );
        let gap = longest_uncovered(&merge(p), &owned);
        f.max_unowned_pending_ms = f.max_unowned_pending_ms.max(gap as f64 / 1000.0);
    }

    // Overlapping beliefs of two relays on one bucket.
    for list in intervals.values() {
        for (i, x) in list.iter().enumerate() {
            for y in &list[i + 1..] {
                if x.relay == y.relay {
                    continue;
                }
                let overlap = x.end.min(y.end) - x.start.max(y.start);
                if overlap <= 0 {
                    continue;
                }
                let ms = overlap as f64 / 1000.0;
                // The earlier owner handed the bucket back and the later one took it.
                let (first, second) = if x.start <= y.start { (x, y) } else { (y, x) };
                if first.released && first.end <= second.end {
                    f.release_log_overlaps += 1;
                    f.release_log_overlap_max_ms = f.release_log_overlap_max_ms.max(ms);
                } else {
                    f.overlaps += 1;
                    f.overlap_total_ms += ms;
                    f.overlap_max_ms = f.overlap_max_ms.max(ms);
                }
            }
        }
    }

    for r in &h.relays {
        for (k, v) in &r.refused {
            *f.refused.entry(k.clone()).or_default() += v;
        }
    }
    f.refused_total = f.refused.values().sum();
    f.refused_during_writes = h
        .relays
        .iter()
        .flat_map(|r| &r.refused_at_us)
        .filter(|&&t| t >= h.window_us.0)
        .count() as u64;
    f
}

/// A message item of a restore's snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotMessage {
    /// Message id.
    pub message_id: String,
    /// Bucket.
    pub bucket: u32,
    /// Sequence number.
    pub sequence: u64,
    /// The bucket's watermark read at the restore covers it (same sequence number, same
    /// message-id fingerprint): the relay that takes the bucket deletes it unpublished.
    pub covered_at_restore: bool,
}

/// What the restore of a table from a snapshot saw (scenario 20).
#[derive(Debug, Clone, Default)]
pub struct RestoreRecord {
    /// Items of the snapshot (messages, counters, leases, heartbeats, business items).
    pub snapshot_items: usize,
    /// Its message items.
    pub snapshot: Vec<SnapshotMessage>,
    /// When the snapshot's scan began and ended.
    pub snapshot_us: (i64, i64),
    /// When the restore began (the writers paused) and ended (the relays started again,
    /// just before the writers resumed).
    pub restore_us: (i64, i64),
    /// The committed records of the topics once the relays had stopped, before the table
    /// was deleted.
    pub published_before: Vec<Delivery>,
    /// The table created again has the old one's ARN (so the watermarks carry over).
    pub same_arn: bool,
    /// Watermarks read at the restore that do not decode: the bucket, the text, why.
    pub unreadable_watermarks: Vec<String>,
}

/// The figures of a restore (scenario 20).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RestoreFigures {
    /// Items of the snapshot.
    pub snapshot_items: usize,
    /// Its message items.
    pub snapshot_messages: usize,
    /// Acknowledged before the restore.
    pub acked_before_restore: usize,
    /// Of those, in neither the snapshot nor Kafka at the restore: rolled back with the
    /// table (their business writes too); not in the ground truth.
    pub rolled_back: usize,
    /// Acknowledged after the restore.
    pub acked_after_restore: usize,
    /// Snapshot messages with a committed record before the restore.
    pub snapshot_published: usize,
    /// Of those, first published before the snapshot's scan began (published, not yet
    /// deleted when it was taken), during it, after it ended.
    pub published_before_snapshot: usize,
    /// See `published_before_snapshot`.
    pub published_during_snapshot: usize,
    /// See `published_before_snapshot`.
    pub published_after_snapshot: usize,
    /// Snapshot messages the watermarks at the restore covered.
    pub covered_by_watermark: usize,
    /// Of those, messages without a committed record before the restore: a watermark that
    /// would have them deleted unpublished, a loss. Must be 0.
    pub covered_not_published: usize,
    /// Snapshot messages published before the restore and not covered: the design
    /// publishes them again (a restore replays the table).
    pub expected_duplicates: usize,
    /// Messages read committed more than once.
    pub duplicates: usize,
    /// Of those, not among the expected ones. Must be 0.
    pub unexpected_duplicates: usize,
    /// Expected duplicates read once only. Must be 0.
    pub expected_not_duplicated: usize,
    /// A few ids of either kind.
    pub examples: Vec<String>,
    /// The table created again has the old one's ARN.
    pub same_arn: bool,
    /// Watermarks read at the restore that do not decode (see [`RestoreRecord`]).
    pub unreadable_watermarks: Vec<String>,
}

impl RestoreFigures {
    /// What the restore must show, in words (empty: all shown).
    pub fn missed(&self) -> Vec<String> {
        let mut m = Vec::new();
        for w in &self.unreadable_watermarks {
            m.push(format!(
                "a watermark read at the restore does not decode: {w}"
            ));
        }
        if !self.same_arn {
            m.push(
                "the table created again has another ARN: the watermarks did not carry over".into(),
            );
        }
        if self.covered_not_published > 0 {
            m.push(format!(
                "{} snapshot messages covered by a watermark without a committed record: deleted unpublished, lost",
                self.covered_not_published
            ));
        }
        if self.expected_duplicates == 0 {
            m.push(
                "no snapshot message had been published before the restore: nothing was replayed"
                    .into(),
            );
        }
        if self.unexpected_duplicates > 0 || self.expected_not_duplicated > 0 {
            m.push(format!(
                "duplicates other than the replay: {} unexpected, {} expected but read once ({:?})",
                self.unexpected_duplicates, self.expected_not_duplicated, self.examples
            ));
        }
        m
    }
}

/// The ground truth of a restore: the acknowledged messages without those it rolled back
/// (acknowledged before it, in neither the snapshot nor Kafka then).
pub fn restore_truth(acks: &[Ack], r: &RestoreRecord) -> Vec<Ack> {
    let before: std::collections::HashSet<&str> = r
        .published_before
        .iter()
        .filter_map(|d| d.message_id.as_deref())
        .chain(r.snapshot.iter().map(|m| m.message_id.as_str()))
        .collect();
    acks.iter()
        .filter(|a| a.acked_at_us >= r.restore_us.1 || before.contains(a.message_id.as_str()))
        .cloned()
        .collect()
}

/// A restore's figures, and the ground truth ([`restore_truth`]).
pub fn check_restore(h: &History, r: &RestoreRecord) -> (Vec<Ack>, RestoreFigures) {
    let mut first_ts: HashMap<&str, i64> = HashMap::new();
    for d in &r.published_before {
        if let Some(id) = d.message_id.as_deref() {
            let ts = d.timestamp_ms.unwrap_or(i64::MAX);
            first_ts
                .entry(id)
                .and_modify(|t| *t = (*t).min(ts))
                .or_insert(ts);
        }
    }
    let in_snapshot: HashMap<&str, &SnapshotMessage> = r
        .snapshot
        .iter()
        .map(|m| (m.message_id.as_str(), m))
        .collect();
    let mut f = RestoreFigures {
        snapshot_items: r.snapshot_items,
        snapshot_messages: r.snapshot.len(),
        same_arn: r.same_arn,
        unreadable_watermarks: r.unreadable_watermarks.clone(),
        ..RestoreFigures::default()
    };
    for a in &h.acks {
        let id = a.message_id.as_str();
        if a.acked_at_us >= r.restore_us.1 {
            f.acked_after_restore += 1;
        } else {
            f.acked_before_restore += 1;
            if !in_snapshot.contains_key(id) && !first_ts.contains_key(id) {
                f.rolled_back += 1;
            }
        }
    }
    let truth = restore_truth(&h.acks, r);
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for d in &h.deliveries {
        if let Some(id) = d.message_id.as_deref() {
            *copies.entry(id).or_default() += 1;
        }
    }
    let mut expected = std::collections::HashSet::new();
    for m in &r.snapshot {
        let id = m.message_id.as_str();
        let published = first_ts.get(id);
        if m.covered_at_restore {
            f.covered_by_watermark += 1;
            if published.is_none() {
                f.covered_not_published += 1;
            }
        }
        let Some(&ts) = published else {
            continue;
        };
        f.snapshot_published += 1;
        let us = ts.saturating_mul(1000);
        if us < r.snapshot_us.0 {
            f.published_before_snapshot += 1;
        } else if us > r.snapshot_us.1 {
            f.published_after_snapshot += 1;
        } else {
            f.published_during_snapshot += 1;
        }
        if !m.covered_at_restore {
            expected.insert(id);
        }
    }
    f.expected_duplicates = expected.len();
    for (id, n) in &copies {
        if *n > 1 {
            f.duplicates += 1;
            if !expected.contains(id) {
                f.unexpected_duplicates += 1;
                if f.examples.len() < 5 {
                    f.examples.push(format!("unexpected {id} ({n} copies)"));
                }
            }
        }
    }
    for id in &expected {
        if copies.get(id).copied().unwrap_or(0) < 2 {
            f.expected_not_duplicated += 1;
            if f.examples.len() < 5 {
                f.examples.push(format!("expected {id}"));
            }
        }
    }
    (truth, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(id: &str, key: &str, counter: u64, at: i64) -> Ack {
        Ack {
            message_id: id.into(),
            key: key.into(),
            counter,
            topic: "t".into(),
            bucket: 0,
            sequence: counter,
            acked_at_us: at,
            late: false,
        }
    }

    fn rec(id: &str, offset: i64, ts_ms: i64) -> Delivery {
        Delivery {
            topic: "t".into(),
            partition: 0,
            offset,
            message_id: Some(id.into()),
            timestamp_ms: Some(ts_ms),
            value_len: None,
        }
    }

    fn ev(at_us: i64, owns: bool) -> OwnershipEvent {
        OwnershipEvent {
            at_us,
            bucket: 0,
            owns,
        }
    }

    #[test]
    fn finds_losses_duplicates_and_inversions() {
        let h = History {
            bucket_count: 1,
            acks: vec![
                ack("a", "k", 0, 0),
                ack("b", "k", 1, 0),
                ack("c", "k", 2, 0),
                ack("d", "k", 3, 0),
                ack("e", "k", 4, 0),
            ],
            // b's first copy comes after c's: one inversion; a twice; d lost; e left.
            deliveries: vec![
                rec("a", 0, 1),
                rec("c", 1, 1),
                rec("a", 2, 1),
                rec("b", 3, 1),
            ],
            left_in_table: vec!["e".into()],
            window_us: (0, 10_000),
            ..History::default()
        };
        let f = check(&h);
        assert_eq!(f.lost, 1);
        assert_eq!(f.undelivered, 2, "d lost, e left in the table");
        assert_eq!(f.never_drained, 1);
        assert_eq!(f.duplicates, 1);
        assert_eq!(f.max_copies, 2);
        assert_eq!(f.order_inversions, 1);
        assert_eq!(f.unacked_records, 0);
    }

    #[test]
    fn measures_overlap_and_unowned_pending_time() {
        let h = History {
            bucket_count: 1,
            // pending from 1 s to 9 s (delivered at 9 s)
            acks: vec![ack("a", "k", 0, 1_000_000)],
            deliveries: vec![rec("a", 0, 9_000)],
            relays: vec![
                // owns 0..3 s, killed at 3 s without a disown
                RelayHistory {
                    relay_id: "r1".into(),
                    events: vec![ev(0, true)],
                    ended_at_us: Some(3_000_000),
                    ..RelayHistory::default()
                },
                // owns 5 s..8 s, then 7.5 s..: overlaps r3 from 7.5 s to 8 s
                RelayHistory {
                    relay_id: "r2".into(),
                    events: vec![ev(5_000_000, true), ev(8_000_000, false)],
                    ..RelayHistory::default()
                },
                RelayHistory {
                    relay_id: "r3".into(),
                    events: vec![ev(7_500_000, true)],
                    ended_at_us: Some(9_500_000),
                    ..RelayHistory::default()
                },
            ],
            window_us: (0, 10_000_000),
            ..History::default()
        };
        let f = check(&h);
        assert_eq!(f.max_unowned_pending_ms, 2000.0);
        assert_eq!(f.overlaps, 1);
        assert_eq!(f.overlap_max_ms, 500.0);
        assert_eq!(f.latency_max_ms, 8000.0);
    }

    #[test]
    fn an_overlap_ending_in_a_logged_release_is_a_logging_artifact() {
        let h = History {
            bucket_count: 1,
            relays: vec![
                RelayHistory {
                    relay_id: "r1".into(),
                    events: vec![ev(0, true), ev(1_000_300, false)],
                    released: vec![(1_000_200, 0)],
                    ..RelayHistory::default()
                },
                RelayHistory {
                    relay_id: "r2".into(),
                    events: vec![ev(1_000_000, true)],
                    ..RelayHistory::default()
                },
            ],
            window_us: (0, 2_000_000),
            ..History::default()
        };
        let f = check(&h);
        assert_eq!(f.overlaps, 0);
        assert_eq!(f.release_log_overlaps, 1);
        assert_eq!(f.release_log_overlap_max_ms, 0.3);
    }

    #[test]
    fn a_late_commit_published_after_a_higher_number_is_a_hole_stepped_over() {
        let mut late = ack("late", "k1", 0, 0);
        late.sequence = 1;
        late.late = true;
        let mut on_time = ack("on-time", "k2", 0, 0);
        on_time.sequence = 2;
        let mut late_in_order = ack("late-2", "k1", 1, 0);
        late_in_order.sequence = 3;
        late_in_order.late = true;
        let h = History {
            bucket_count: 1,
            acks: vec![late, on_time, late_in_order],
            // 2 went out 200 ms before the hole at 1 filled; 3 in the same batch as 1.
            deliveries: vec![
                rec("on-time", 0, 1_000),
                rec("late", 1, 1_200),
                rec("late-2", 2, 1_201),
            ],
            window_us: (0, 10_000_000),
            ..History::default()
        };
        let f = check(&h);
        assert_eq!((f.late_commits, f.holes_stepped_over), (2, 1));
        assert_eq!(f.order_inversions, 0, "the keys differ");
    }

    fn snap(id: &str, covered: bool) -> SnapshotMessage {
        SnapshotMessage {
            message_id: id.into(),
            bucket: 0,
            sequence: 0,
            covered_at_restore: covered,
        }
    }

    /// A restore: `a` published before the snapshot, `b` after it, `c` covered by the
    /// watermark (deleted unpublished after the restore), `d` in the snapshot unpublished,
    /// `e` acknowledged after the snapshot and never published (rolled back), `f` after
    /// the restore.
    fn restore_history() -> (History, RestoreRecord) {
        let acks = vec![
            ack("a", "k", 0, 100),
            ack("b", "k", 1, 200),
            ack("c", "k", 2, 300),
            ack("d", "k", 3, 400),
            ack("e", "k", 4, 2_000),
            ack("f", "k", 5, 9_000),
        ];
        let before = vec![rec("a", 0, 0), rec("b", 1, 3), rec("c", 2, 3)];
        let r = RestoreRecord {
            snapshot_items: 10,
            snapshot: vec![
                snap("a", false),
                snap("b", false),
                snap("c", true),
                snap("d", false),
            ],
            snapshot_us: (1_000, 2_000),
            restore_us: (5_000, 8_000),
            published_before: before.clone(),
            same_arn: true,
            unreadable_watermarks: Vec::new(),
        };
        let mut deliveries = before;
        deliveries.extend([
            rec("a", 3, 9),
            rec("b", 4, 9),
            rec("d", 5, 9),
            rec("f", 6, 10),
        ]);
        let h = History {
            bucket_count: 1,
            acks,
            deliveries,
            window_us: (0, 10_000),
            ..History::default()
        };
        (h, r)
    }

    #[test]
    fn a_restore_replays_exactly_the_published_snapshot_messages_the_watermark_does_not_cover() {
        let (h, r) = restore_history();
        let (truth, f) = check_restore(&h, &r);
        let ids: Vec<&str> = truth.iter().map(|a| a.message_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d", "f"], "e was rolled back");
        assert_eq!(
            (f.rolled_back, f.acked_before_restore, f.acked_after_restore),
            (1, 5, 1)
        );
        assert_eq!(f.snapshot_published, 3);
        assert_eq!(
            (
                f.published_before_snapshot,
                f.published_during_snapshot,
                f.published_after_snapshot
            ),
            (1, 0, 2)
        );
        assert_eq!((f.covered_by_watermark, f.covered_not_published), (1, 0));
        assert_eq!((f.expected_duplicates, f.duplicates), (2, 2));
        assert!(f.missed().is_empty(), "{:?}", f.missed());
        let mut g = h.clone();
        g.acks = truth;
        let figures = check(&g);
        assert_eq!(
            (figures.lost, figures.duplicates, figures.unacked_records),
            (0, 2, 0)
        );
    }

    #[test]
    fn a_restore_check_finds_stray_and_missing_duplicates_and_a_covering_without_a_record() {
        let (mut h, mut r) = restore_history();
        // d read twice (it had not been published before the restore), b once only.
        h.deliveries
            .retain(|d| !(d.message_id.as_deref() == Some("b") && d.offset == 4));
        h.deliveries.push(rec("d", 7, 10));
        // A watermark covering d, which had no record: it would be deleted unpublished.
        r.snapshot[3].covered_at_restore = true;
        let (_, f) = check_restore(&h, &r);
        assert_eq!((f.unexpected_duplicates, f.expected_not_duplicated), (1, 1));
        assert_eq!(f.covered_not_published, 1);
        assert_eq!(f.missed().len(), 2, "{:?}", f.missed());
    }

    #[test]
    fn uncovered_stretches() {
        assert_eq!(longest_uncovered(&[(0, 10)], &[(2, 4), (5, 9)]), 2);
        assert_eq!(longest_uncovered(&[(0, 10)], &[]), 10);
        assert_eq!(longest_uncovered(&[(0, 10)], &[(-5, 20)]), 0);
        assert_eq!(merge(vec![(5, 7), (0, 2), (1, 3)]), vec![(0, 3), (5, 7)]);
    }
}
