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
    fn uncovered_stretches() {
        assert_eq!(longest_uncovered(&[(0, 10)], &[(2, 4), (5, 9)]), 2);
        assert_eq!(longest_uncovered(&[(0, 10)], &[]), 10);
        assert_eq!(longest_uncovered(&[(0, 10)], &[(-5, 20)]), 0);
        assert_eq!(merge(vec![(5, 7), (0, 2), (1, 3)]), vec![(0, 3), (5, 7)]);
    }
}
