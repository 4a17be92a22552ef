//! The lease plan: which buckets a relay keeps, hands back and claims, computed from one
//! strongly consistent read of the coordination partition.
//!
//! [`compute`] is a pure function. Relays that share a table (ours and those of other
//! implementations of the specification) must compute exactly the same plan from the
//! same read, or a mixed fleet makes refused conditional writes; the rule below is
//! normative (`docs/protocol.md`, section 4.3, the lease plan):
//!
//! 1. **Free and held.** A bucket is free when it has no owner, or when its lease has
//!    lapsed and the owner is not the requesting relay (a relay's own lapsed lease still
//!    counts as its own). Every other bucket is held by its owner, also when that owner
//!    has no live heartbeat.
//! 2. **Order.** The active relays (the requesting relay always among them) sorted by
//!    ordinal, byte-wise comparison of their ids; a relay's rank is its position.
//! 3. **Shares.** `floor = N / R`, `rest = N % R`. Every share starts at `floor`; `rest`
//!    goes one at a time first to relays (in rank order) that hold more than `floor`,
//!    then to relays still at `floor` (in rank order).
//! 4. **Ranges.** Rank `r` is assigned the contiguous range starting at the sum of the
//!    shares of ranks `< r`, as long as its share.
//! 5. **Keep and release.** Own buckets ordered in-range first, then by number; keep the
//!    first `min(owned, share)`, release the rest.
//! 6. **Claims.** With `deficit = max(0, share - held)` for every relay, simulate over
//!    the free buckets: pass 1, each relay in rank order takes free buckets of its own
//!    range upwards; pass 2, one cursor from bucket 0 that never moves back hands the
//!    next free bucket to each relay in rank order while its deficit is positive. The
//!    requesting relay claims what the simulation gave it.
//! 7. **Standby rank.** A relay with share 0 that owns nothing has standby rank = the
//!    number of earlier-ranked relays whose share is 0 as well.
//!
//! The relay then renews the kept leases, releases the handed-back ones, and claims, in
//! that order; that I/O is not done here.

use std::ops::Range;

/// One lease as read from the coordination partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// The bucket the lease is for. Leases of buckets `>= bucket_count` are ignored: they
    /// are left over from a larger bucket count and take no part in the plan.
    pub bucket: u32,
    /// The relay the lease names (`Owner`); `None` when the item has no owner, which makes
    /// the bucket free, like a missing lease item.
    pub owner: Option<String>,
    /// Whether the lease's `ExpiresAtUtc` is at or before now by this relay's clock: a
    /// lapsed lease of another relay is free, a lapsed lease of the requesting relay is
    /// still its own.
    pub lapsed: bool,
}

/// Everything the plan depends on: one read of the coordination partition, as seen by
/// one relay.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// The number of buckets `N`; the shares sum to it.
    pub bucket_count: u32,
    /// The id of the requesting relay: it is always counted as active, even before its
    /// own heartbeat is visible, and only its own lapsed leases count as held.
    pub me: &'a str,
    /// Ids of the active relays (heartbeat younger than the lease duration and not stamped
    /// stopped). May or may not contain `me`, may contain duplicates, any order.
    pub active_relays: &'a [String],
    /// The leases as read, in any order; buckets without a lease item are free. Each
    /// bucket is expected at most once; should one appear more often, it is held if any
    /// of its entries holds it, by the smallest such owner id, so the plan still does not
    /// depend on the order.
    pub leases: &'a [LeaseView],
}

/// What one relay does with the leases this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The number of buckets this relay should own: `N / R` or one more.
    pub share: u32,
    /// The contiguous range of buckets assigned to this relay (`share` long): its own
    /// buckets inside it are kept first, and its free buckets are claimed first.
    pub range: Range<u32>,
    /// Own buckets to renew, ascending; never more than `share`, and always buckets the
    /// relay already owns (its own lapsed leases included).
    pub keep: Vec<u32>,
    /// Own buckets to hand back because the relay owns more than its share, ascending.
    /// `keep` and `release` together are exactly the relay's own buckets.
    pub release: Vec<u32>,
    /// Free buckets to claim, ascending; disjoint from what every other relay that read
    /// the same state claims, and `keep.len() + claim.len() <= share`.
    pub claim: Vec<u32>,
    /// For a relay with share 0 that owns nothing (a standby): its place in line, the
    /// number of earlier-ranked relays whose share is 0 too. Standbys with rank `< N` run
    /// every round, those further back only every other round. `None` for other relays.
    pub standby_rank: Option<u32>,
    /// `R`, the number of distinct active relays, the requesting relay included.
    pub active_relays: u32,
}

impl Plan {
    /// Whether the plan writes nothing but renewals (no release, no claim).
    pub fn is_quiet(&self) -> bool {
        self.release.is_empty() && self.claim.is_empty()
    }
}

/// Computes the plan of relay `input.me` from one read of the coordination partition.
pub fn compute(input: &PlanInput<'_>) -> Plan {
    let view = View::read(input);
    let me = view.rank;
    let share = view.shares[me];
    let range = view.ranges[me].clone();

    let mut own: Vec<u32> = view
        .holder
        .iter()
        .zip(0u32..)
        .filter(|(holder, _)| **holder == Some(input.me))
        .map(|(_, bucket)| bucket)
        .collect();
    own.sort_by_key(|bucket| (!range.contains(bucket), *bucket));
    let kept = own.len().min(share as usize);
    let mut release = own.split_off(kept);
    let mut keep = own;
    keep.sort_unstable();
    release.sort_unstable();

    let claim = if keep.len() < share as usize && view.holder.iter().any(Option::is_none) {
        view.claims().swap_remove(me)
    } else {
        Vec::new()
    };

    let standby_rank = (share == 0 && keep.is_empty() && release.is_empty())
        .then(|| view.shares[..me].iter().filter(|s| **s == 0).count() as u32);

    Plan {
        share,
        range,
        keep,
        release,
        claim,
        standby_rank,
        active_relays: view.relays.len() as u32,
    }
}

/// The plan of every distinct active relay, in rank order, each computed as if that relay
/// had made this read: what the fleet does when all relays read the same state.
pub fn fleet(
    bucket_count: u32,
    active_relays: &[String],
    leases: &[LeaseView],
) -> Vec<(String, Plan)> {
    let mut ids: Vec<&String> = active_relays.iter().collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|id| {
            let plan = compute(&PlanInput {
                bucket_count,
                me: id,
                active_relays,
                leases,
            });
            (id.clone(), plan)
        })
        .collect()
}

/// One relay's reading of the coordination partition: rules 1 to 4.
#[derive(Debug)]
struct View<'a> {
    /// Distinct active relay ids in rank order, the requesting relay included.
    relays: Vec<&'a str>,
    /// The requesting relay's rank.
    rank: usize,
    /// Per bucket, the relay holding it, or `None` when it is free.
    holder: Vec<Option<&'a str>>,
    /// Per rank, the number of buckets held.
    held: Vec<u32>,
    /// Per rank, the share.
    shares: Vec<u32>,
    /// Per rank, the assigned range.
    ranges: Vec<Range<u32>>,
}

impl<'a> View<'a> {
    fn read(input: &PlanInput<'a>) -> Self {
        let n = input.bucket_count;
        let me = input.me;

        let mut relays: Vec<&'a str> = input
            .active_relays
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(me))
            .collect();
        relays.sort_unstable();
        relays.dedup();
        let rank = relays
            .binary_search(&me)
            .expect("the requesting relay is always counted");

        let mut holder: Vec<Option<&'a str>> = vec![None; n as usize];
        for lease in input.leases.iter().filter(|l| l.bucket < n) {
            let held_by = match lease.owner.as_deref() {
                Some(owner) if !lease.lapsed || owner == me => Some(owner),
                _ => None,
            };
            let slot = &mut holder[lease.bucket as usize];
            *slot = match (*slot, held_by) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }

        let mut held = vec![0u32; relays.len()];
        for owner in holder.iter().flatten() {
            if let Ok(r) = relays.binary_search(owner) {
                held[r] += 1;
            }
        }

        let count = relays.len() as u32;
        let floor = n / count;
        let mut rest = n % count;
        let mut shares = vec![floor; relays.len()];
        for (share, held) in shares.iter_mut().zip(&held) {
            if rest == 0 {
                break;
            }
            if *held > floor {
                *share += 1;
                rest -= 1;
            }
        }
        for share in &mut shares {
            if rest == 0 {
                break;
            }
            if *share == floor {
                *share += 1;
                rest -= 1;
            }
        }

        let mut start = 0u32;
        let ranges = shares
            .iter()
            .map(|share| {
                let range = start..start + share;
                start += share;
                range
            })
            .collect();

        View {
            relays,
            rank,
            holder,
            held,
            shares,
            ranges,
        }
    }

    /// Rule 6 for every relay: per rank, the free buckets it claims, ascending.
    fn claims(&self) -> Vec<Vec<u32>> {
        let n = self.holder.len();
        let mut free: Vec<bool> = self.holder.iter().map(Option::is_none).collect();
        let mut deficit: Vec<u32> = self
            .shares
            .iter()
            .zip(&self.held)
            .map(|(share, held)| share.saturating_sub(*held))
            .collect();
        let mut claims = vec![Vec::new(); self.relays.len()];

        // Pass 1: each relay its own range, upwards.
        for ((range, deficit), claims) in self.ranges.iter().zip(&mut deficit).zip(&mut claims) {
            for bucket in range.clone() {
                if *deficit == 0 {
                    break;
                }
                if free[bucket as usize] {
                    free[bucket as usize] = false;
                    *deficit -= 1;
                    claims.push(bucket);
                }
            }
        }

        // Pass 2: one cursor from bucket 0 that never moves back.
        let mut cursor = 0usize;
        'relays: for (deficit, claims) in deficit.iter_mut().zip(&mut claims) {
            while *deficit > 0 {
                while cursor < n && !free[cursor] {
                    cursor += 1;
                }
                if cursor == n {
                    break 'relays;
                }
                free[cursor] = false;
                *deficit -= 1;
                claims.push(cursor as u32);
                cursor += 1;
            }
        }

        for claims in &mut claims {
            claims.sort_unstable();
        }
        claims
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use std::collections::{BTreeMap, BTreeSet};

    fn ids(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    fn lease(owner: &str, bucket: u32) -> LeaseView {
        LeaseView {
            bucket,
            owner: Some(owner.to_string()),
            lapsed: false,
        }
    }

    fn lapsed(owner: &str, bucket: u32) -> LeaseView {
        LeaseView {
            lapsed: true,
            ..lease(owner, bucket)
        }
    }

    fn leases(owner: &str, buckets: impl IntoIterator<Item = u32>) -> Vec<LeaseView> {
        buckets.into_iter().map(|b| lease(owner, b)).collect()
    }

    fn plan(n: u32, active: &[&str], leases: &[LeaseView], me: &str) -> Plan {
        compute(&PlanInput {
            bucket_count: n,
            me,
            active_relays: &ids(active),
            leases,
        })
    }

    #[track_caller]
    fn check(plan: &Plan, keep: &[u32], release: &[u32], claim: &[u32]) {
        assert_eq!(plan.keep, keep, "keep of {plan:?}");
        assert_eq!(plan.release, release, "release of {plan:?}");
        assert_eq!(plan.claim, claim, "claim of {plan:?}");
    }

    // ---- The worked examples of docs/protocol.md (section 4.4), row by row. ----

    #[test]
    fn example_fair_split_keeps_everything() {
        let l = [leases("a", 0..4), leases("b", 4..8)].concat();
        let p = plan(8, &["a", "b"], &l, "a");
        check(&p, &[0, 1, 2, 3], &[], &[]);
        assert_eq!((p.share, p.range.clone(), p.standby_rank), (4, 0..4, None));
        check(&plan(8, &["a", "b"], &l, "b"), &[4, 5, 6, 7], &[], &[]);
    }

    #[test]
    fn example_incumbent_sorting_last_keeps_its_range_and_releases_the_rest() {
        let l = leases("m", 0..8);
        let p = plan(8, &["m", "b"], &l, "m");
        check(&p, &[4, 5, 6, 7], &[0, 1, 2, 3], &[]);
        assert_eq!(p.range, 4..8);
        // b waits: nothing is free yet.
        check(&plan(8, &["m", "b"], &l, "b"), &[], &[], &[]);
    }

    #[test]
    fn example_held_bucket_outside_the_range_is_kept() {
        let l = [leases("a", 0..3), leases("a", [7]), leases("b", 4..7)].concat();
        check(&plan(8, &["a", "b"], &l, "a"), &[0, 1, 2, 7], &[], &[]);
        check(&plan(8, &["a", "b"], &l, "b"), &[4, 5, 6], &[], &[3]);
    }

    #[test]
    fn example_newcomer_claims_its_range() {
        let l = leases("a", 0..4);
        check(&plan(8, &["a", "b"], &l, "b"), &[], &[], &[4, 5, 6, 7]);
        check(&plan(8, &["a", "b"], &l, "a"), &[0, 1, 2, 3], &[], &[]);
    }

    #[test]
    fn example_rest_and_second_pass() {
        let l = [leases("a", 0..4), leases("c", 8..12), leases("d", 12..16)].concat();
        let active = ["a", "c", "d"];
        let a = plan(16, &active, &l, "a");
        let c = plan(16, &active, &l, "c");
        let d = plan(16, &active, &l, "d");
        check(&a, &[0, 1, 2, 3], &[], &[4, 5]);
        check(&c, &[8, 9, 10, 11], &[], &[6]);
        check(&d, &[12, 13, 14, 15], &[], &[7]);
        assert_eq!((a.share, c.share, d.share), (6, 5, 5));
        assert_eq!((a.range, c.range, d.range), (0..6, 6..11, 11..16));
    }

    fn lapse_example() -> Vec<LeaseView> {
        vec![
            lease("a", 0),
            lapsed("a", 1),
            lease("b", 2),
            lapsed("dead", 3),
        ]
    }

    #[test]
    fn example_own_lapsed_lease_is_kept() {
        check(
            &plan(4, &["a", "b"], &lapse_example(), "a"),
            &[0, 1],
            &[],
            &[],
        );
    }

    #[test]
    fn example_lapsed_lease_of_a_dead_relay_is_free() {
        check(
            &plan(4, &["a", "b"], &lapse_example(), "b"),
            &[2],
            &[],
            &[3],
        );
    }

    #[test]
    fn example_live_lease_without_heartbeat_is_not_free() {
        let p = plan(4, &["a"], &leases("gone", 0..4), "a");
        check(&p, &[], &[], &[]);
        assert_eq!((p.share, p.standby_rank), (4, None));
    }

    #[test]
    fn example_more_relays_than_buckets_holder_keeps_its_range() {
        let l = leases("c", 0..2);
        let c = plan(2, &["a", "b", "c"], &l, "c");
        check(&c, &[1], &[0], &[]);
        assert_eq!((c.share, c.range), (1, 1..2));
        let a = plan(2, &["a", "b", "c"], &l, "a");
        check(&a, &[], &[], &[]);
        assert_eq!((a.share, a.range), (1, 0..1));
        let b = plan(2, &["a", "b", "c"], &l, "b");
        assert_eq!((b.share, b.standby_rank), (0, Some(0)));
    }

    #[test]
    fn example_more_relays_than_buckets_free_bucket_goes_to_first_at_floor() {
        let l = leases("c", [1]);
        let active = ["a", "b", "c"];
        let a = plan(2, &active, &l, "a");
        let b = plan(2, &active, &l, "b");
        let c = plan(2, &active, &l, "c");
        check(&a, &[], &[], &[0]);
        check(&b, &[], &[], &[]);
        check(&c, &[1], &[], &[]);
        assert_eq!(b.standby_rank, Some(0));
        assert_eq!((a.standby_rank, c.standby_rank), (None, None));
    }

    #[test]
    fn example_own_heartbeat_not_yet_visible() {
        let p = plan(8, &["a"], &leases("a", 0..4), "b");
        check(&p, &[], &[], &[4, 5, 6, 7]);
        assert_eq!((p.active_relays, p.range), (2, 4..8));
    }

    #[test]
    fn more_relays_than_buckets() {
        let l: Vec<LeaseView> = ["pod-m", "pod-n", "pod-o", "pod-p"]
            .iter()
            .zip(0..)
            .map(|(owner, bucket)| lease(owner, bucket))
            .collect();
        let active = ["pod-m", "pod-n", "pod-o", "pod-p", "pod-q", "pod-a"];
        for (owner, bucket) in [("pod-m", 0), ("pod-n", 1), ("pod-o", 2), ("pod-p", 3)] {
            let p = plan(4, &active, &l, owner);
            check(&p, &[bucket], &[], &[]);
            assert_eq!((p.share, p.standby_rank), (1, None));
        }
        let a = plan(4, &active, &l, "pod-a");
        check(&a, &[], &[], &[]);
        assert_eq!((a.share, a.standby_rank, a.active_relays), (0, Some(0), 6));
        let q = plan(4, &active, &l, "pod-q");
        check(&q, &[], &[], &[]);
        assert_eq!((q.share, q.standby_rank), (0, Some(1)));

        // pod-o leaves: its heartbeat is gone and its bucket freed.
        let l: Vec<LeaseView> = l.into_iter().filter(|l| l.bucket != 2).collect();
        let active = ["pod-m", "pod-n", "pod-p", "pod-q", "pod-a"];
        for (owner, bucket) in [("pod-m", 0), ("pod-n", 1), ("pod-p", 3)] {
            check(&plan(4, &active, &l, owner), &[bucket], &[], &[]);
        }
        let a = plan(4, &active, &l, "pod-a");
        check(&a, &[], &[], &[2]);
        assert_eq!((a.share, a.standby_rank), (1, None));
        let q = plan(4, &active, &l, "pod-q");
        check(&q, &[], &[], &[]);
        assert_eq!(q.standby_rank, Some(0));
    }

    #[test]
    fn minimal_movement() {
        let l = [
            leases("b", 0..2),
            leases("c", 2..4),
            leases("d", 4..6),
            leases("e", [6]),
            leases("f", [7]),
        ]
        .concat();
        let active = ids(&["a", "b", "c", "d", "e", "f"]);
        let plans: BTreeMap<String, Plan> = fleet(8, &active, &l).into_iter().collect();
        let released: Vec<(&str, u32)> = plans
            .iter()
            .flat_map(|(id, p)| p.release.iter().map(move |b| (id.as_str(), *b)))
            .collect();
        assert_eq!(released, [("d", 4)]);
        assert!(plans.values().all(|p| p.claim.is_empty()));
        check(&plans["b"], &[0, 1], &[], &[]);
        check(&plans["c"], &[2, 3], &[], &[]);
        check(&plans["d"], &[5], &[4], &[]);
        check(&plans["e"], &[6], &[], &[]);
        check(&plans["f"], &[7], &[], &[]);
        check(&plans["a"], &[], &[], &[]);

        // Next round d's bucket is free and the newcomer takes it; then all is quiet.
        let l: Vec<LeaseView> = l.into_iter().filter(|l| l.bucket != 4).collect();
        check(
            &plan(8, &["a", "b", "c", "d", "e", "f"], &l, "a"),
            &[],
            &[],
            &[4],
        );
    }

    // ---- Smaller cases the rule pins down. ----

    #[test]
    fn leases_beyond_the_bucket_count_are_ignored() {
        let l = [leases("a", [0, 9]), leases("b", [1, 5])].concat();
        let p = plan(2, &["a", "b"], &l, "a");
        check(&p, &[0], &[], &[]);
        check(&plan(2, &["a", "b"], &l, "b"), &[1], &[], &[]);
    }

    #[test]
    fn lease_item_without_owner_is_free() {
        let l = vec![LeaseView {
            bucket: 0,
            owner: None,
            lapsed: false,
        }];
        check(&plan(1, &["a"], &l, "a"), &[], &[], &[0]);
    }

    #[test]
    fn duplicates_in_active_relays_count_once() {
        let p = plan(4, &["b", "a", "b", "a"], &[], "a");
        assert_eq!(p.active_relays, 2);
        check(&p, &[], &[], &[0, 1]);
    }

    #[test]
    fn rest_goes_first_to_holders_above_floor_in_rank_order() {
        // N = 5, R = 2: floor 2, rest 1. b holds 3 > 2, so b's share is 3 and a's 2.
        let l = [leases("a", [0]), leases("b", 1..4)].concat();
        let a = plan(5, &["a", "b"], &l, "a");
        let b = plan(5, &["a", "b"], &l, "b");
        assert_eq!((a.share, b.share), (2, 3));
        assert_eq!((a.range.clone(), b.range.clone()), (0..2, 2..5));
        check(&a, &[0], &[], &[4]);
        check(&b, &[1, 2, 3], &[], &[]);
    }

    #[test]
    fn standby_rank_counts_only_earlier_relays_with_share_zero() {
        // N = 1: the holder keeps it; the others are standbys in rank order.
        let l = leases("m", [0]);
        let active = ["z", "m", "a", "b"];
        assert_eq!(plan(1, &active, &l, "m").standby_rank, None);
        assert_eq!(plan(1, &active, &l, "a").standby_rank, Some(0));
        assert_eq!(plan(1, &active, &l, "b").standby_rank, Some(1));
        assert_eq!(plan(1, &active, &l, "z").standby_rank, Some(2));
    }

    #[test]
    fn with_more_relays_than_buckets_every_holder_gets_a_share() {
        // R > N: floor 0 and rest N, so every holder's share is 1, whatever its rank.
        let l = [leases("z", [0, 1]), leases("y", [2])].concat();
        let active = ["a", "b", "y", "z"];
        let z = plan(3, &active, &l, "z");
        // Neither of z's buckets is in its range: it keeps the lower one.
        check(&z, &[0], &[1], &[]);
        assert_eq!((z.share, z.range), (1, 2..3));
        let y = plan(3, &active, &l, "y");
        check(&y, &[2], &[], &[]);
        assert_eq!((y.share, y.range), (1, 1..2));
        let a = plan(3, &active, &l, "a");
        assert_eq!((a.share, a.range, a.standby_rank), (1, 0..1, None));
        let b = plan(3, &active, &l, "b");
        assert_eq!((b.share, b.standby_rank), (0, Some(0)));
        check(&b, &[], &[], &[]);
    }

    #[test]
    fn lapsed_lease_views_differ_only_for_its_owner() {
        let l = vec![lapsed("b", 0)];
        // From b's view its lapsed lease is its own: it retakes it under the owner
        // condition.
        check(&plan(1, &["a", "b"], &l, "b"), &[0], &[], &[]);
        // From a's view it is free.
        check(&plan(1, &["a", "b"], &l, "a"), &[], &[], &[0]);
    }

    // ---- Properties. ----

    /// Relay ids that may become active, chosen so some sort before the others (and
    /// byte-wise, not by locale: "A" < "a" < "z" < "é").
    const POOL: [&str; 12] = [
        "", "A", "a", "a0", "b", "m", "pod-a", "pod-m", "pod-z", "z", "zz", "\u{e9}",
    ];
    /// Owners that never have a heartbeat.
    const GHOSTS: [&str; 2] = ["dead", "gone"];

    /// One read of the coordination partition.
    #[derive(Debug, Clone)]
    struct Read {
        n: u32,
        /// Distinct active relays, in the order generated.
        members: Vec<String>,
        /// Active relay ids as the read lists them: members with duplicates.
        active: Vec<String>,
        leases: Vec<LeaseView>,
        /// A relay computing a plan before its own heartbeat is visible.
        joiner: Option<String>,
        seed: u64,
    }

    /// Per bucket: 0 no item, 1 item without owner, 2 any id (a ghost, a member or an
    /// inactive pool id), 3..=5 a member; which one; lapsed.
    type Slot = (u8, prop::sample::Index, bool);

    fn slot() -> impl Strategy<Value = Slot> {
        (
            0u8..=5,
            any::<prop::sample::Index>(),
            prop::bool::weighted(0.25),
        )
    }

    fn read() -> impl Strategy<Value = Read> {
        (
            1u32..=40,
            prop::sample::subsequence(POOL.to_vec(), 1..=8).prop_shuffle(),
            prop::collection::vec(slot(), 40),
            prop::collection::vec((0u32..4, slot()), 0..3),
            prop::collection::vec(any::<prop::sample::Index>(), 0..3),
            prop::option::of(any::<prop::sample::Index>()),
            any::<u64>(),
        )
            .prop_map(|(n, members, slots, beyond, dups, joiner, seed)| {
                let members: Vec<String> = members.into_iter().map(String::from).collect();
                let anyone: Vec<&str> = POOL.iter().chain(&GHOSTS).copied().collect();
                let lease_of = |bucket: u32, (kind, who, lapsed): &Slot| match kind {
                    0 => None,
                    1 => Some(LeaseView {
                        bucket,
                        owner: None,
                        lapsed: *lapsed,
                    }),
                    2 => Some(LeaseView {
                        bucket,
                        owner: Some(who.get(&anyone).to_string()),
                        lapsed: *lapsed,
                    }),
                    _ => Some(LeaseView {
                        bucket,
                        owner: Some(who.get(&members).clone()),
                        lapsed: *lapsed,
                    }),
                };
                let mut leases: Vec<LeaseView> = (0..n)
                    .zip(&slots)
                    .filter_map(|(bucket, slot)| lease_of(bucket, slot))
                    .collect();
                leases.extend(
                    beyond
                        .iter()
                        .filter_map(|(extra, slot)| lease_of(n + extra, slot)),
                );
                let mut active = members.clone();
                active.extend(dups.iter().map(|i| i.get(&members).clone()));
                let joiner = joiner
                    .map(|i| i.get(&POOL).to_string())
                    .filter(|id| !members.contains(id));
                Read {
                    n,
                    members,
                    active,
                    leases,
                    joiner,
                    seed,
                }
            })
    }

    fn input<'a>(read: &'a Read, me: &'a str) -> PlanInput<'a> {
        PlanInput {
            bucket_count: read.n,
            me,
            active_relays: &read.active,
            leases: &read.leases,
        }
    }

    /// The buckets `me` owns as read (lapsed or not).
    fn own(read: &Read, me: &str) -> BTreeSet<u32> {
        read.leases
            .iter()
            .filter(|l| l.bucket < read.n && l.owner.as_deref() == Some(me))
            .map(|l| l.bucket)
            .collect()
    }

    /// Whether `me` may claim `bucket` as read: no item, no owner, or lapsed and not own.
    fn free_for(read: &Read, me: &str, bucket: u32) -> bool {
        read.leases
            .iter()
            .filter(|l| l.bucket == bucket)
            .all(|l| match &l.owner {
                None => true,
                Some(owner) => l.lapsed && owner != me,
            })
    }

    fn ascending(v: &[u32]) -> bool {
        v.windows(2).all(|w| w[0] < w[1])
    }

    /// The relays that compute a plan from this read: every member, and the joiner.
    fn relays(read: &Read) -> Vec<String> {
        read.members.iter().chain(&read.joiner).cloned().collect()
    }

    /// 1000 cases unless `PROPTEST_CASES` says otherwise.
    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(1000);
        ProptestConfig {
            cases,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn each_plan_obeys_the_rule(read in read()) {
            for me in relays(&read) {
                let p = compute(&input(&read, &me));
                let own = own(&read, &me);
                prop_assert!(ascending(&p.keep) && ascending(&p.release) && ascending(&p.claim));
                let kept_and_released: BTreeSet<u32> =
                    p.keep.iter().chain(&p.release).copied().collect();
                prop_assert_eq!(kept_and_released.len(), p.keep.len() + p.release.len());
                prop_assert_eq!(&kept_and_released, &own, "keep + release == own of {}", me);
                prop_assert_eq!(p.keep.len(), own.len().min(p.share as usize));
                prop_assert!(p.keep.len() + p.claim.len() <= p.share as usize);
                for bucket in &p.claim {
                    prop_assert!(*bucket < read.n);
                    prop_assert!(free_for(&read, &me, *bucket), "{} claims {} that is not free", me, bucket);
                }
                prop_assert_eq!(p.range.len(), p.share as usize);
                prop_assert!(p.range.end <= read.n);
                let distinct: BTreeSet<&String> = read.members.iter().chain([&me]).collect();
                prop_assert_eq!(p.active_relays as usize, distinct.len());
                let floor = read.n / p.active_relays;
                prop_assert!(p.share == floor || p.share == floor + 1);
                prop_assert_eq!(p.standby_rank.is_some(), p.share == 0 && own.is_empty());
            }
        }

        #[test]
        fn each_view_splits_fairly_and_simulates_disjoint_claims(read in read()) {
            for me in relays(&read) {
                let input = input(&read, &me);
                let view = View::read(&input);
                prop_assert_eq!(view.shares.iter().sum::<u32>(), read.n);
                let (min, max) = (view.shares.iter().min().unwrap(), view.shares.iter().max().unwrap());
                prop_assert!(max - min <= 1);
                let mut start = 0;
                for (range, share) in view.ranges.iter().zip(&view.shares) {
                    prop_assert_eq!(range.clone(), start..start + share);
                    start = range.end;
                }
                let claims = view.claims();
                let mut taken = BTreeSet::new();
                for ((claims, share), held) in claims.iter().zip(&view.shares).zip(&view.held) {
                    prop_assert!(claims.len() as u32 + held.min(share) <= *share);
                    for bucket in claims {
                        prop_assert!(view.holder[*bucket as usize].is_none());
                        prop_assert!(taken.insert(*bucket), "bucket {} claimed twice", bucket);
                    }
                }
                // Nobody is left short while a bucket is free.
                let short = claims.iter().zip(&view.shares).zip(&view.held)
                    .any(|((c, s), h)| (c.len() as u32) + h < *s);
                let free = view.holder.iter().filter(|h| h.is_none()).count();
                prop_assert!(!short || taken.len() == free);
            }
        }

        #[test]
        fn relays_reading_the_same_state_claim_disjoint_buckets(read in read()) {
            let mut claimed: BTreeMap<u32, String> = BTreeMap::new();
            for me in &read.members {
                for bucket in compute(&input(&read, me)).claim {
                    if let Some(other) = claimed.insert(bucket, me.clone()) {
                        prop_assert!(false, "{} and {} both claim {}", other, me, bucket);
                    }
                }
            }
        }

        #[test]
        fn shares_agree_when_no_relay_owns_a_lapsed_lease(read in read()) {
            // Only a relay's own lapsed leases make views differ; take them out.
            let mut read = read;
            for lease in &mut read.leases {
                if lease.owner.as_ref().is_some_and(|o| read.members.contains(o)) {
                    lease.lapsed = false;
                }
            }
            let plans = fleet(read.n, &read.active, &read.leases);
            prop_assert_eq!(plans.len(), read.members.len());
            prop_assert_eq!(plans.iter().map(|(_, p)| p.share).sum::<u32>(), read.n);
            let mut start = 0;
            for (_, p) in &plans {
                prop_assert_eq!(p.range.start, start);
                start = p.range.end;
            }
            let (min, max) = (
                plans.iter().map(|(_, p)| p.share).min().unwrap(),
                plans.iter().map(|(_, p)| p.share).max().unwrap(),
            );
            prop_assert!(max - min <= 1);
        }

        #[test]
        fn plan_does_not_depend_on_input_order(read in read()) {
            let mut rng = StdRng::seed_from_u64(read.seed);
            let mut shuffled = read.clone();
            shuffled.active.shuffle(&mut rng);
            shuffled.leases.shuffle(&mut rng);
            for me in relays(&read) {
                prop_assert_eq!(compute(&input(&read, &me)), compute(&input(&shuffled, &me)));
                // Listing me explicitly, or not, changes nothing either.
                let mut with_me = shuffled.clone();
                with_me.active.push(me.clone());
                prop_assert_eq!(compute(&input(&read, &me)), compute(&input(&with_me, &me)));
            }
        }

        #[test]
        fn nothing_moves_when_the_split_is_already_fair(
            n in 1u32..=40,
            members in prop::sample::subsequence(POOL.to_vec(), 1..=8),
            seed in any::<u64>(),
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let r = members.len() as u32;
            // Pick which relays hold one more than floor, and who holds which bucket.
            let mut counts: Vec<u32> = (0..r).map(|i| n / r + u32::from(i < n % r)).collect();
            counts.shuffle(&mut rng);
            let mut buckets: Vec<u32> = (0..n).collect();
            buckets.shuffle(&mut rng);
            let mut leases = Vec::new();
            let mut next = buckets.into_iter();
            for (id, count) in members.iter().zip(&counts) {
                leases.extend((0..*count).map(|_| lease(id, next.next().unwrap())));
            }
            let active = ids(&members);
            for (id, p) in fleet(n, &active, &leases) {
                prop_assert!(p.is_quiet(), "{} moves: {:?}", id, p);
                let own: Vec<u32> = {
                    let mut own: Vec<u32> = leases.iter()
                        .filter(|l| l.owner.as_deref() == Some(id.as_str()))
                        .map(|l| l.bucket)
                        .collect();
                    own.sort_unstable();
                    own
                };
                prop_assert_eq!(&p.keep, &own);
            }
        }

        #[test]
        fn fleet_settles_within_three_rounds_then_stays_quiet(
            n in 1u32..=40,
            initial in prop::sample::subsequence(POOL.to_vec(), 1..=4).prop_shuffle(),
            changes in prop::collection::vec(
                prop::collection::vec(any::<prop::sample::Index>(), 1..=2), 1..=6),
            seed in any::<u64>(),
        ) {
            let mut sim = Fleet::new(n, seed);
            for id in initial {
                sim.join(id);
            }
            sim.settle()?;
            for change in changes {
                for toggle in change {
                    let id = toggle.get(&POOL);
                    if sim.members.iter().any(|m| m == id) {
                        if sim.members.len() > 1 {
                            sim.leave(id);
                        }
                    } else if sim.members.len() < 8 {
                        sim.join(id);
                    }
                }
                sim.settle()?;
            }
        }
    }

    /// A fleet of relays sharing one lease map, all leases live, membership changing
    /// gracefully: a relay's heartbeat becomes visible on its first acquisition; a leaving
    /// relay stamps its heartbeat stopped and frees its leases.
    #[derive(Debug)]
    struct Fleet {
        n: u32,
        owners: Vec<Option<String>>,
        members: Vec<String>,
        visible: BTreeSet<String>,
        rng: StdRng,
    }

    impl Fleet {
        fn new(n: u32, seed: u64) -> Self {
            Fleet {
                n,
                owners: vec![None; n as usize],
                members: Vec::new(),
                visible: BTreeSet::new(),
                rng: StdRng::seed_from_u64(seed),
            }
        }

        fn join(&mut self, id: &str) {
            self.members.push(id.to_string());
        }

        fn leave(&mut self, id: &str) {
            self.members.retain(|m| m != id);
            self.visible.remove(id);
            for owner in &mut self.owners {
                if owner.as_deref() == Some(id) {
                    *owner = None;
                }
            }
        }

        /// One round: every member acquires once, in random order, each reading the
        /// state its predecessors left. Returns the number of releases and claims.
        fn round(&mut self) -> Result<usize, TestCaseError> {
            let mut order = self.members.clone();
            order.shuffle(&mut self.rng);
            let mut writes = 0;
            for me in order {
                self.visible.insert(me.clone());
                let leases: Vec<LeaseView> = self
                    .owners
                    .iter()
                    .zip(0..)
                    .filter_map(|(owner, bucket)| owner.as_ref().map(|owner| lease(owner, bucket)))
                    .collect();
                let active: Vec<String> = self.visible.iter().cloned().collect();
                let p = compute(&PlanInput {
                    bucket_count: self.n,
                    me: &me,
                    active_relays: &active,
                    leases: &leases,
                });
                for bucket in &p.keep {
                    prop_assert_eq!(self.owners[*bucket as usize].as_ref(), Some(&me));
                }
                for bucket in &p.release {
                    prop_assert_eq!(self.owners[*bucket as usize].as_ref(), Some(&me));
                    self.owners[*bucket as usize] = None;
                }
                for bucket in &p.claim {
                    prop_assert_eq!(self.owners[*bucket as usize].as_ref(), None);
                    self.owners[*bucket as usize] = Some(me.clone());
                }
                writes += p.release.len() + p.claim.len();
            }
            Ok(writes)
        }

        /// Three rounds reach a fair split; two more write nothing.
        fn settle(&mut self) -> Result<(), TestCaseError> {
            for _ in 0..3 {
                self.round()?;
            }
            let mut counts: BTreeMap<&str, u32> =
                self.members.iter().map(|m| (m.as_str(), 0)).collect();
            for owner in &self.owners {
                let owner = owner.as_deref();
                prop_assert!(owner.is_some(), "a bucket is unowned: {:?}", self);
                let count = counts.get_mut(owner.unwrap());
                prop_assert!(count.is_some(), "a non-member owns a bucket: {:?}", self);
                *count.unwrap() += 1;
            }
            let (min, max) = (
                counts.values().min().unwrap(),
                counts.values().max().unwrap(),
            );
            prop_assert!(max - min <= 1, "unfair after three rounds: {:?}", counts);
            for _ in 0..2 {
                prop_assert_eq!(self.round()?, 0, "writes after settling: {:?}", self);
            }
            Ok(())
        }
    }
}
