//! Where each record goes, how a batch becomes produce requests, and which prefix of the
//! batch a partial failure still acknowledges. Pure functions, no I/O.
//!
//! A batch is one bucket's messages in sequence order. It is grouped by (topic, partition),
//! keeping order inside each group; each group is cut into requests under a size limit and
//! those are sent one after the other, so order inside a partition holds. Different groups
//! go out concurrently. When some fail, the batch's acknowledged prefix ends at the first
//! message that was not written: [`acknowledged_prefix`].

use crate::error::Rejection;
use crate::message::{murmur2, to_positive, OutboxMessage};

/// What the publisher knows about a topic while it routes one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopicRoute {
    /// Partitions of the topic (at least 1).
    pub partition_count: u32,
    /// Partition for this batch's keyless records (sticky: one per batch and topic, so they
    /// travel in one request); below `partition_count`.
    pub sticky: u32,
}

/// The partition the relay publishes a keyed message without an explicit partition to, in
/// a topic of `partition_count` partitions: `toPositive(murmur2(key)) % partition_count`,
/// as the Java client's default partitioner (and librdkafka's `murmur2_random`) picks it,
/// so that records of one key written here and by other Kafka producers meet in one
/// partition. An empty key is a key; a count of zero counts as one.
///
/// A message with an explicit partition goes to that one; a keyless message goes to a
/// partition the relay picks per batch.
///
/// # Examples
/// ```
/// use dynamo_outbox::publish::partition_for;
///
/// // Kafka's own test vector: murmur2("foobar") is -790332482.
/// assert_eq!(partition_for(b"foobar", 100), 66);
/// assert!((0..6).contains(&partition_for(b"order-42", 6)));
/// ```
pub fn partition_for(key: &[u8], partition_count: u32) -> i32 {
    (to_positive(murmur2(key)) % partition_count.max(1)) as i32
}

/// The partition of a record, as the Java client's default partitioner picks it: the explicit
/// one if set, else [`partition_for`] its key (an empty key is a key), else the batch's
/// sticky partition.
pub(crate) fn route_record(
    key: Option<&[u8]>,
    explicit: Option<i32>,
    route: TopicRoute,
) -> Result<i32, Rejection> {
    let count = route.partition_count.max(1);
    match (explicit, key) {
        (Some(p), _) if p < 0 => Err(Rejection::InvalidRecord),
        (Some(p), _) if p as u32 >= count => Err(Rejection::UnknownPartition),
        (Some(p), _) => Ok(p),
        (None, Some(key)) => Ok(partition_for(key, count)),
        (None, None) => Ok((route.sticky % count) as i32),
    }
}

/// The messages of one batch bound for one partition, in batch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Indices into the batch, ascending.
    pub indices: Vec<usize>,
}

/// Why routing stopped at a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unroutable {
    /// The message's topic has no route (unknown, or its metadata could not be read); the
    /// caller knows which.
    Topic,
    /// The message itself cannot be placed (an explicit partition the topic lacks).
    Partition(Rejection),
}

/// A batch split into groups, up to the first message that cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan<'a> {
    /// Groups ordered by their first index; together they hold every index below `stop`'s.
    pub groups: Vec<Group<'a>>,
    /// The first message that cannot be routed, and why; nothing at or after it is planned,
    /// since it could not be acknowledged anyway.
    pub stop: Option<(usize, Unroutable)>,
}

/// Groups `messages` by (topic, partition); `route` gives each topic's route or `None`.
pub(crate) fn plan<'a>(
    messages: impl IntoIterator<Item = &'a OutboxMessage>,
    route: impl Fn(&str) -> Option<TopicRoute>,
) -> Plan<'a> {
    let mut groups: Vec<Group<'a>> = Vec::new();
    for (index, m) in messages.into_iter().enumerate() {
        let Some(r) = route(&m.topic) else {
            return Plan {
                groups,
                stop: Some((index, Unroutable::Topic)),
            };
        };
        let partition = match route_record(m.key.as_deref(), m.partition, r) {
            Ok(p) => p,
            Err(rejection) => {
                return Plan {
                    groups,
                    stop: Some((index, Unroutable::Partition(rejection))),
                }
            }
        };
        match groups
            .iter_mut()
            .find(|g| g.partition == partition && g.topic == m.topic)
        {
            Some(g) => g.indices.push(index),
            None => groups.push(Group {
                topic: &m.topic,
                partition,
                indices: vec![index],
            }),
        }
    }
    Plan { groups, stop: None }
}

/// Cuts a group's indices into consecutive requests of at most `max_bytes` estimated bytes
/// (`size_of` estimates one record); a record larger than that travels alone.
pub(crate) fn chunks(
    indices: &[usize],
    size_of: impl Fn(usize) -> usize,
    max_bytes: usize,
) -> Vec<&[usize]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, &index) in indices.iter().enumerate() {
        let size = size_of(index);
        if i > start && bytes.saturating_add(size) > max_bytes {
            out.push(&indices[start..i]);
            start = i;
            bytes = 0;
        }
        bytes = bytes.saturating_add(size);
    }
    if start < indices.len() {
        out.push(&indices[start..]);
    }
    out
}

/// How many leading messages of a batch of `len` are acknowledged, given the index of the
/// first unwritten message of every group that failed (and of the routing stop): all
/// messages before the smallest such index belong to groups that wrote them.
pub(crate) fn acknowledged_prefix(
    len: usize,
    first_unwritten: impl IntoIterator<Item = usize>,
) -> usize {
    first_unwritten.into_iter().fold(len, usize::min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashMap};

    fn route(count: u32, sticky: u32) -> TopicRoute {
        TopicRoute {
            partition_count: count,
            sticky,
        }
    }

    #[test]
    fn keyed_records_follow_the_java_partitioner() {
        // murmur2("foobar") = -790332482 (Kafka's UtilsTest); toPositive = 1357151166
        assert_eq!(to_positive(-790_332_482), 1_357_151_166);
        assert_eq!(route_record(Some(b"foobar"), None, route(6, 0)), Ok(0)); // 1357151166 % 6
        assert_eq!(route_record(Some(b"foobar"), None, route(7, 0)), Ok(0)); // % 7
        assert_eq!(route_record(Some(b"foobar"), None, route(100, 0)), Ok(66));
        // "21" -> -973932308 -> 1173551340
        assert_eq!(route_record(Some(b"21"), None, route(6, 3)), Ok(0));
        assert_eq!(route_record(Some(b"21"), None, route(10, 3)), Ok(0));
        assert_eq!(route_record(Some(b"21"), None, route(7, 3)), Ok(3));
        assert_eq!(route_record(Some(b"foobar"), None, route(5, 0)), Ok(1)); // 1357151166 % 5
                                                                             // an empty key is a key, not keyless
        let empty = (to_positive(murmur2(b"")) % 12) as i32;
        assert_eq!(route_record(Some(b""), None, route(12, 5)), Ok(empty));
        assert_eq!(partition_for(b"", 12), empty);
        assert_eq!(partition_for(b"foobar", 100), 66);
        assert_eq!(partition_for(b"foobar", 0), 0);
    }

    #[test]
    fn explicit_partition_wins_and_must_exist() {
        assert_eq!(route_record(Some(b"foobar"), Some(4), route(6, 0)), Ok(4));
        assert_eq!(route_record(None, Some(0), route(1, 0)), Ok(0));
        assert_eq!(
            route_record(None, Some(6), route(6, 0)),
            Err(Rejection::UnknownPartition)
        );
        assert_eq!(
            route_record(None, Some(-1), route(6, 0)),
            Err(Rejection::InvalidRecord)
        );
    }

    #[test]
    fn keyless_records_stick_to_one_partition() {
        assert_eq!(route_record(None, None, route(6, 4)), Ok(4));
        assert_eq!(route_record(None, None, route(6, 10)), Ok(4));
    }

    #[test]
    fn plan_groups_in_order_and_stops_at_the_first_unroutable() {
        let msgs = vec![
            OutboxMessage::new("a", 8).with_key("foobar"), // a/0 (6 partitions)
            OutboxMessage::new("b", 8),                    // b/sticky 1
            OutboxMessage::new("a", 8).with_partition(3),  // a/3
            OutboxMessage::new("a", 8).with_key("foobar"), // a/0
            OutboxMessage::new("a", 8).with_partition(9),  // stop: unknown partition
            OutboxMessage::new("a", 8).with_key("foobar"),
        ];
        let routes = |t: &str| match t {
            "a" => Some(route(6, 0)),
            "b" => Some(route(2, 1)),
            _ => None,
        };
        let p = plan(&msgs, routes);
        assert_eq!(
            p.groups,
            vec![
                Group {
                    topic: "a",
                    partition: 0,
                    indices: vec![0, 3]
                },
                Group {
                    topic: "b",
                    partition: 1,
                    indices: vec![1]
                },
                Group {
                    topic: "a",
                    partition: 3,
                    indices: vec![2]
                },
            ]
        );
        assert_eq!(
            p.stop,
            Some((4, Unroutable::Partition(Rejection::UnknownPartition)))
        );

        let msgs = vec![OutboxMessage::new("a", 8), OutboxMessage::new("zzz", 8)];
        let p = plan(&msgs, routes);
        assert_eq!(p.groups.len(), 1);
        assert_eq!(p.stop, Some((1, Unroutable::Topic)));
    }

    #[test]
    fn chunks_respect_the_size_limit() {
        let sizes = [400, 400, 400, 2000, 10, 10];
        let idx: Vec<usize> = (0..sizes.len()).collect();
        let c = chunks(&idx, |i| sizes[i], 1000);
        assert_eq!(c, vec![&[0, 1][..], &[2], &[3], &[4, 5]]);
        assert!(chunks(&[], |_| 1, 10).is_empty());
    }

    #[test]
    fn prefix_is_the_smallest_failure() {
        assert_eq!(acknowledged_prefix(5, []), 5);
        assert_eq!(acknowledged_prefix(5, [3, 1, 4]), 1);
        assert_eq!(acknowledged_prefix(0, []), 0);
    }

    fn message() -> impl Strategy<Value = OutboxMessage> {
        (
            0usize..3,
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..6)),
            proptest::option::of(0i32..8),
        )
            .prop_map(|(t, key, partition)| {
                let mut m = OutboxMessage::new(["t0", "t1", "t2"][t], 8);
                m.key = key;
                m.partition = partition;
                m
            })
    }

    proptest! {
        /// Whatever each group manages to write (a prefix of its own messages, since its
        /// requests go one after the other and stop at the first failure), every message
        /// before the reported prefix is written and the message at it is not.
        #[test]
        fn acknowledged_means_written(
            batch in proptest::collection::vec(message(), 0..40),
            counts in proptest::collection::vec(1u32..8, 3),
            written_fraction in proptest::collection::vec(0.0f64..=1.0, 64),
        ) {
            let routes: HashMap<&str, TopicRoute> = ["t0", "t1", "t2"].iter().zip(&counts)
                .map(|(t, &c)| (*t, route(c, c / 2))).collect();
            let p = plan(&batch, |t| routes.get(t).copied());
            let limit = p.stop.map_or(batch.len(), |(i, _)| i);

            // groups partition exactly the indices before the stop, each ascending and
            // routed where partition_for says
            let mut seen = BTreeSet::new();
            for g in &p.groups {
                prop_assert!(g.indices.windows(2).all(|w| w[0] < w[1]));
                for &i in &g.indices {
                    prop_assert!(seen.insert(i));
                    let m = &batch[i];
                    prop_assert_eq!(m.topic.as_str(), g.topic);
                    prop_assert_eq!(
                        route_record(m.key.as_deref(), m.partition, routes[g.topic]),
                        Ok(g.partition)
                    );
                }
            }
            prop_assert_eq!(seen, (0..limit).collect::<BTreeSet<_>>());

            // simulate partial writes
            let mut written = vec![false; batch.len()];
            let mut failures = Vec::new();
            for (g, frac) in p.groups.iter().zip(written_fraction.iter().cycle()) {
                let k = ((g.indices.len() as f64) * frac).floor() as usize;
                for &i in &g.indices[..k] { written[i] = true; }
                if k < g.indices.len() { failures.push(g.indices[k]); }
            }
            failures.extend(p.stop.map(|(i, _)| i));
            let n = acknowledged_prefix(batch.len(), failures);
            prop_assert!(written[..n].iter().all(|&w| w));
            prop_assert!(n == batch.len() || !written[n]);
        }

        #[test]
        fn chunks_cover_in_order(sizes in proptest::collection::vec(0usize..500, 0..50), max in 1usize..1000) {
            let idx: Vec<usize> = (0..sizes.len()).collect();
            let c = chunks(&idx, |i| sizes[i], max);
            let flat: Vec<usize> = c.iter().flat_map(|s| s.iter().copied()).collect();
            prop_assert_eq!(&flat, &idx);
            for s in c {
                prop_assert!(!s.is_empty());
                prop_assert!(s.len() == 1 || s.iter().map(|&i| sizes[i]).sum::<usize>() <= max);
            }
        }
    }
}
