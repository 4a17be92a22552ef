//! The coordination partition as one read sees it: lease and heartbeat records, who is
//! active, the leases as the plan sees them, which notified buckets no live relay covers,
//! when a peer's announced stop hands buckets over, and which heartbeat records are stale.
//!
//! Pure: every function takes the read and the reader's clock (`now`, UTC ticks) and does
//! no I/O. [`crate::protocol::store`] performs the read ([`crate::DynamoDbOutboxStore::read_coordination`])
//! and the writes; [`crate::protocol::plan`] turns a snapshot into a lease plan; the relay and a
//! notified invocation decide with the functions here.

use std::time::Duration;

use crate::protocol::plan::{self, LeaseView, PlanInput};

/// How recent a relay's heartbeat must be for [`Coordination::uncovered`] to count the
/// claims of the round that heartbeat started: longer than a round takes from its
/// heartbeat to its claims (the first round of a relay waits [`JOIN_DELAY`]
/// in between).
pub const ROUND_WINDOW: Duration = Duration::from_secs(1);
/// Pause between a relay's first heartbeat and its first read of the coordination
/// partition (at most a quarter of the renew interval), so that relays starting together
/// see each other's heartbeats.
pub const JOIN_DELAY: Duration = Duration::from_millis(300);
/// The same pause for a relay that a woken host started alone (the first wake-up of its
/// moment, no live relay in the host's last read, its heartbeat landed soon after that
/// read): no relay whose heartbeat the read did not see reads before this one's claims.
pub const ALONE_JOIN_DELAY: Duration = Duration::from_millis(100);

/// The heartbeat's `Delivery` of a relay in exactly-once mode.
pub const DELIVERY_EXACTLY_ONCE: &str = "exactly-once";

/// Delay after a peer's announced stop before the extra acquisition, and between retries.
pub const HANDOVER_STEP: Duration = Duration::from_millis(300);
/// How long past a peer's announced stop the relay keeps looking for its released buckets.
pub const HANDOVER_WATCH: Duration = Duration::from_secs(5);

/// The timings [`Coordination::taken_over_at`] assumes of the fleet (UTC ticks): every
/// relay of an outbox runs with the same options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeoverTicks {
    /// The lease duration (who is active).
    pub lease: i64,
    /// A relay announcing its stop within this does not count (the poll interval).
    pub soon: i64,
    /// How often a relay runs its round (the renew interval).
    pub renew: i64,
    /// The handover step ([`HANDOVER_STEP`]).
    pub step: i64,
    /// How long past an announced stop its peers watch for the handover
    /// ([`HANDOVER_WATCH`]).
    pub watch: i64,
}

/// The timings [`Coordination::uncovered`] judges coverage with (UTC ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoverageTicks {
    /// The lease duration (who is active).
    pub lease: i64,
    /// A relay announcing its stop within this does not count (the poll interval).
    pub soon: i64,
    /// How recent a heartbeat must be for its round's claims to count ([`ROUND_WINDOW`]).
    pub round: i64,
    /// How long after a leaver's announced stop its successor has taken its buckets over:
    /// two handover steps ([`HANDOVER_STEP`]), the re-read after the stop and one retry
    /// while the stamp and the releases land.
    pub takeover: i64,
}

/// One lease item as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The bucket (from the sort key).
    pub bucket: u32,
    /// The relay holding it; `None` for a free bucket.
    pub owner: Option<String>,
    /// Expiry in UTC ticks, also the lease's version, as [`read_ticks`] reads
    /// `ExpiresAtUtc`: 0 (lapsed) when the item has none or one that is not a number.
    pub expires_at: i64,
    /// Whether `ExpiresAtUtc` is a whole number of ticks, as every relay writes it. When
    /// it is not (missing, another type, a fraction, beyond `i64`), a write conditioned on
    /// the expiry as read matches such an item ([`ReadExpiry`]) instead of an equal one.
    pub expiry_exact: bool,
}

impl LeaseRecord {
    /// The expiry as this read saw it, for a write conditioned on it.
    pub fn read_expiry(&self) -> ReadExpiry {
        ReadExpiry {
            ticks: self.expires_at,
            exact: self.expiry_exact,
        }
    }
}

/// The expiry a renewal or release is conditioned on: the lease's `ExpiresAtUtc` as the
/// round read it. Exact (a whole number of ticks, what relays write): the write requires
/// `ExpiresAtUtc = ticks`. Not exact (the item had none, another type, or a number that is
/// not a whole tick count, which [`read_ticks`] rounds up): the write requires it to be
/// missing, not a number, or at most `ticks`, so that a lease another tool left without a
/// usable expiry can still be taken back and handed back by its owner, while any expiry a
/// relay wrote since (always later) still refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadExpiry {
    /// The expiry in UTC ticks (0 when the item had none).
    pub ticks: i64,
    /// Whether the item carried exactly this whole number of ticks.
    pub exact: bool,
}

impl From<i64> for ReadExpiry {
    fn from(ticks: i64) -> Self {
        ReadExpiry { ticks, exact: true }
    }
}

/// Reads a timestamp attribute in UTC ticks from its number text (`None` when the
/// attribute is missing or not a number): `(ticks, exact)`. A whole number in `i64` is
/// itself, exact; any other number is rounded up (saturating at the `i64` range), so that
/// "at most the value read" still holds of the stored number; anything else is 0.
pub fn read_ticks(number: Option<&str>) -> (i64, bool) {
    let Some(text) = number else {
        return (0, false);
    };
    if let Ok(ticks) = text.trim().parse::<i64>() {
        return (ticks, true);
    }
    match text.trim().parse::<f64>() {
        // `as` saturates at the bounds of i64.
        Ok(x) if x.is_finite() => (x.ceil() as i64, false),
        _ => (0, false),
    }
}

/// One heartbeat item as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayRecord {
    /// The relay's id (from the sort key).
    pub relay_id: String,
    /// Its last round in UTC ticks, as [`read_ticks`] reads `LastSeenUtc`: 0 when the
    /// record has none or one that is not a number (another implementation's stop stamp
    /// written before its first heartbeat, say). Such a record never counts as active; it
    /// is stale once its stop is a lease duration old, or at once when it has no stop
    /// stamp either ([`RelayRecord::is_stale`]).
    pub last_seen: i64,
    /// When it stopped, if it did.
    pub stopped_at: Option<i64>,
    /// When it plans to stop (this project's `StopsAtUtc`), if it runs inside a deadline.
    pub stops_at: Option<i64>,
    /// How it delivers (this project's `Delivery`): `exactly-once`, or `None` for a relay
    /// that delivers at least once or does not say (another implementation's).
    pub delivery: Option<String>,
}

impl RelayRecord {
    /// Whether the relay counts toward fair share at `now`: heartbeat younger than the
    /// lease duration and not stamped stopped.
    pub fn is_active(&self, now: i64, lease_duration_ticks: i64) -> bool {
        self.stopped_at.is_none()
            && self.last_seen <= now.saturating_add(lease_duration_ticks)
            && now.saturating_sub(self.last_seen) < lease_duration_ticks
    }

    /// Whether its record may be deleted at `now`: stopped one lease duration ago, or
    /// silent for ten lease durations.
    pub fn is_stale(&self, now: i64, lease_duration_ticks: i64) -> bool {
        match self.stopped_at {
            Some(stopped) => now.saturating_sub(stopped) >= lease_duration_ticks,
            None => now.saturating_sub(self.last_seen) >= lease_duration_ticks.saturating_mul(10),
        }
    }
}

/// The coordination partition, read in one strongly consistent query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coordination {
    /// Every lease item, ascending by bucket (including buckets beyond the count).
    pub leases: Vec<LeaseRecord>,
    /// Every heartbeat item.
    pub relays: Vec<RelayRecord>,
}

impl Coordination {
    /// The lease of `bucket`, if its item exists.
    pub fn lease(&self, bucket: u32) -> Option<&LeaseRecord> {
        self.leases.iter().find(|l| l.bucket == bucket)
    }

    /// Ids of the relays active at `now`.
    pub fn active_relays(&self, now: i64, lease_duration_ticks: i64) -> Vec<String> {
        self.relays
            .iter()
            .filter(|r| r.is_active(now, lease_duration_ticks))
            .map(|r| r.relay_id.clone())
            .collect()
    }

    /// The live relays other than `me` whose heartbeat does not say `Delivery =
    /// exactly-once`: peers an exactly-once relay does not share buckets with
    /// (protocol.md, section 8.5).
    pub fn peers_not_exactly_once(
        &self,
        me: &str,
        now: i64,
        lease_duration_ticks: i64,
    ) -> Vec<String> {
        self.relays
            .iter()
            .filter(|r| r.relay_id != me && r.is_active(now, lease_duration_ticks))
            .filter(|r| r.delivery.as_deref() != Some(DELIVERY_EXACTLY_ONCE))
            .map(|r| r.relay_id.clone())
            .collect()
    }

    /// The leases as the plan sees them at `now` (lapsed = expiry at or before now).
    pub fn lease_views(&self, now: i64) -> Vec<LeaseView> {
        self.leases
            .iter()
            .map(|l| LeaseView {
                bucket: l.bucket,
                owner: l.owner.clone(),
                lapsed: l.expires_at <= now,
            })
            .collect()
    }

    /// The buckets below `bucket_count` whose lease item names `relay_id`, whatever their
    /// expiry, ascending.
    pub fn held_by(&self, relay_id: &str, bucket_count: u32) -> Vec<u32> {
        self.leases
            .iter()
            .filter(|l| l.bucket < bucket_count && l.owner.as_deref() == Some(relay_id))
            .map(|l| l.bucket)
            .collect()
    }

    /// When `me` should run an extra acquisition for a peer that is handing buckets over:
    /// - a peer that announced its stop (`StopsAtUtc`) and still holds buckets: `step`
    ///   past the announced time, and again every `step` while it has not stamped its stop,
    ///   at most `watch` past the announced time;
    /// - a peer that has stamped its stop and still holds unlapsed leases
    ///   ([`Self::releasing`]): `step` from now, so every `step` until its releases have
    ///   landed, at most `watch` past the stamp. A relay that read the stamp before the
    ///   releases keeps watching instead of waiting a renew interval for its next round.
    ///
    /// UTC ticks; `None` when no such peer.
    pub fn handover_at(
        &self,
        me: &str,
        bucket_count: u32,
        now: i64,
        step: i64,
        watch: i64,
    ) -> Option<i64> {
        let announced = self
            .relays
            .iter()
            .filter(|r| r.relay_id != me && r.stopped_at.is_none())
            .filter(|r| !self.held_by(&r.relay_id, bucket_count).is_empty())
            .filter_map(|r| r.stops_at)
            .filter(|&at| now < at.saturating_add(watch))
            .map(|at| at.saturating_add(step).max(now.saturating_add(step)))
            .min();
        let releasing = (!self.releasing(me, bucket_count, now, watch).is_empty())
            .then(|| now.saturating_add(step));
        announced.into_iter().chain(releasing).min()
    }

    /// The relays other than `me` whose graceful stop is still releasing at `now`: stamped
    /// stopped no more than `watch` ago, and still named by an unlapsed lease of a bucket
    /// below `bucket_count`. (A stop whose releases did not land within `watch` has failed:
    /// its leases lapse, as after a crash.)
    ///
    /// A read that finds one is half a handover: the leaver's releases are one request per
    /// bucket and land in any order, so two relays that read at nearly the same time (as
    /// the `StopsAtUtc` re-read makes them) can see different halves and plan to claim the
    /// same freed bucket. The relay claims nothing from such a read and reads again a
    /// handover step later ([`Self::handover_at`]). Every claim of the handover is then
    /// planned from a read with all of it; such reads differ at most by claims of peers that
    /// have landed, and a claim that landed takes nothing that another plan of the same
    /// state gives away (`the_claims_of_a_whole_handover_agree_whatever_landed_of_them`).
    pub fn releasing(
        &self,
        me: &str,
        bucket_count: u32,
        now: i64,
        watch: i64,
    ) -> Vec<&RelayRecord> {
        self.relays
            .iter()
            .filter(|r| r.relay_id != me)
            .filter(|r| {
                r.stopped_at
                    .is_some_and(|at| now.saturating_sub(at) < watch)
            })
            .filter(|r| {
                self.leases.iter().any(|l| {
                    l.bucket < bucket_count
                        && l.expires_at > now
                        && l.owner.as_deref() == Some(r.relay_id.as_str())
                })
            })
            .collect()
    }

    /// The heartbeat records that `me` deletes at `now`: only the first active relay in id
    /// order cleans up, and only records of other relays that are stale
    /// ([`RelayRecord::is_stale`]).
    pub fn stale_records(
        &self,
        me: &str,
        now: i64,
        lease_duration_ticks: i64,
    ) -> Vec<&RelayRecord> {
        let active = self.active_relays(now, lease_duration_ticks);
        let first = active.iter().map(String::as_str).chain([me]).min();
        if first != Some(me) {
            return Vec::new();
        }
        self.relays
            .iter()
            .filter(|r| r.relay_id != me && r.is_stale(now, lease_duration_ticks))
            .collect()
    }

    /// Whether relays other than `me` that are live at `now` (active, no stop announced
    /// within `soon_ticks`) and stay at least as long as `me` hold unlapsed leases of every
    /// one of `buckets`: the idle stop's "peers hold the rest".
    ///
    /// `my_stop` is the stop `me` announces (`None`: it runs until shut down). A peer that
    /// announces an earlier stop does not count: it is about to hand its buckets over, and
    /// if `me` left now, nobody would be there to take them until the next wake (a
    /// scheduled relay's successor starts before it leaves, and once idled out would leave
    /// the buckets with work in them for a whole period).
    pub fn peers_hold(
        &self,
        me: &str,
        buckets: impl IntoIterator<Item = u32>,
        now: i64,
        lease_ticks: i64,
        soon_ticks: i64,
        my_stop: Option<i64>,
    ) -> bool {
        let stays = |stops_at: Option<i64>| match stops_at {
            None => true,
            Some(s) => s > now.saturating_add(soon_ticks) && my_stop.is_some_and(|m| s >= m),
        };
        let live_peer = |owner: &str| {
            owner != me
                && self.relays.iter().any(|r| {
                    r.relay_id == owner && r.is_active(now, lease_ticks) && stays(r.stops_at)
                })
        };
        buckets.into_iter().all(|b| {
            self.lease(b)
                .is_some_and(|l| l.expires_at > now && l.owner.as_deref().is_some_and(live_peer))
        })
    }

    /// When the relays of this read will have taken `buckets` over (UTC ticks), if every one
    /// of them has a taker: a notified invocation that found them uncovered looks again
    /// then instead of joining at once (when that is soon), so that a handover or a
    /// newcomer's share changing hands starts no extra relay.
    ///
    /// A relay counts when it is active and announces no stop within `t.soon`. Takers:
    /// - a bucket held by a relay leaving now (its announced stop no more than `t.watch`
    ///   ago or within `t.soon`), while another relay counts: that successor re-reads
    ///   `t.step` after the announced stop and every `t.step` until the stamp and its
    ///   releases have landed ([`Self::handover_at`]), so the bucket is taken `2 × t.step`
    ///   after the later of the announced stop, the stamp and `now`;
    /// - a bucket that a counting relay's plan, computed from this read, claims: at that
    ///   relay's next round (`t.renew` after its heartbeat, or `t.step` after a recent
    ///   announced stop it watches), plus `t.step` for the round itself.
    pub fn taken_over_at(
        &self,
        buckets: &[u32],
        bucket_count: u32,
        now: i64,
        t: &TakeoverTicks,
    ) -> Option<i64> {
        let counts = |r: &RelayRecord| {
            r.is_active(now, t.lease) && r.stops_at.is_none_or(|s| s > now.saturating_add(t.soon))
        };
        let counting: Vec<&RelayRecord> = self.relays.iter().filter(|r| counts(r)).collect();
        let recent_stop = |r: &RelayRecord| {
            r.stops_at
                .filter(|&at| at > now.saturating_sub(t.watch) && at <= now.saturating_add(t.soon))
        };
        // The latest recent announced stop: the successors' next early re-read follows it.
        let leaving_at = self.relays.iter().filter_map(recent_stop).max();
        let active = self.active_relays(now, t.lease);
        let leases = self.lease_views(now);
        let plans: Vec<(&RelayRecord, Vec<u32>)> = counting
            .iter()
            .map(|r| {
                let plan = plan::compute(&PlanInput {
                    bucket_count,
                    me: &r.relay_id,
                    active_relays: &active,
                    leases: &leases,
                });
                (*r, plan.claim)
            })
            .collect();
        let mut latest = now;
        for &b in buckets {
            let leaver = self
                .lease(b)
                .and_then(|l| l.owner.as_deref())
                .and_then(|o| {
                    self.relays
                        .iter()
                        .find(|r| r.relay_id == o && recent_stop(r).is_some())
                });
            let by_handover = leaver
                .filter(|l| counting.iter().any(|r| r.relay_id != l.relay_id))
                .and_then(|l| {
                    let at = recent_stop(l)?;
                    Some(
                        at.max(l.stopped_at.unwrap_or(at))
                            .max(now)
                            .saturating_add(t.step.saturating_mul(2)),
                    )
                });
            let by_plan = plans
                .iter()
                .filter(|(_, claim)| claim.contains(&b))
                .map(|(r, _)| {
                    let regular = r.last_seen.saturating_add(t.renew);
                    let early =
                        leaving_at.map_or(i64::MAX, |at| at.max(now).saturating_add(t.step));
                    regular.min(early).max(now).saturating_add(t.step)
                })
                .min();
            let taken = match (by_handover, by_plan) {
                (Some(h), Some(p)) => h.min(p),
                (h, p) => h.or(p)?,
            };
            latest = latest.max(taken);
        }
        Some(latest)
    }

    /// Which of `buckets` no live relay publishes or is about to claim, at `now`.
    ///
    /// A relay counts when it is active (heartbeat younger than `t.lease`, not stamped
    /// stopped) and does not announce a stop (`StopsAtUtc`) within `t.soon`. A bucket is
    /// covered when its lease is unlapsed and names such a relay (it probes the bucket
    /// every poll interval), or when such a relay is in the middle of an acquisition round
    /// (its heartbeat is younger than `t.round`) whose plan, computed from this read as
    /// that relay computes it, claims the bucket: a relay that has just joined.
    ///
    /// A scheduled handover is covered too: a bucket whose unlapsed lease names an active
    /// relay whose announced stop is near but still ahead, while a successor counts that
    /// will still be there when it takes the bucket. A successor reads the announcement (a
    /// relay with a deadline announces its stop from its first heartbeat on) and takes the
    /// bucket over within `t.takeover` of the stop ([`Self::handover_at`]); so it counts
    /// only when it announces no stop, or one more than `t.soon` after that takeover. A
    /// successor that leaves sooner would take nothing, and the bucket would wait for the
    /// next wake. A stop announced for now or past (an idle stop) has no such successor
    /// yet: uncovered.
    ///
    /// Every other bucket is uncovered, also one that a live relay would claim only at its
    /// next round (up to a renew interval away): the notified invocation joins instead.
    pub fn uncovered(
        &self,
        buckets: &[u32],
        bucket_count: u32,
        now: i64,
        t: &CoverageTicks,
    ) -> Vec<u32> {
        let lease_ticks = t.lease;
        let live: Vec<&RelayRecord> = self
            .relays
            .iter()
            .filter(|r| {
                r.is_active(now, lease_ticks)
                    && r.stops_at.is_none_or(|s| s > now.saturating_add(t.soon))
            })
            .collect();
        // A successor of a relay leaving at `leaves`: live, and still there (beyond its own
        // poll interval) when it has taken the leaver's buckets.
        let successor_of = |owner: &str, leaves: i64| {
            let taken = leaves.saturating_add(t.takeover);
            live.iter().any(|r| {
                r.relay_id != owner && r.stops_at.is_none_or(|s| s > taken.saturating_add(t.soon))
            })
        };
        let handing_over = |owner: &str| {
            self.relays.iter().any(|r| {
                r.relay_id == owner
                    && r.is_active(now, lease_ticks)
                    && r.stops_at
                        .is_some_and(|s| s > now && successor_of(owner, s))
            })
        };
        let mut covered = vec![false; bucket_count as usize];
        for l in &self.leases {
            if l.bucket < bucket_count
                && l.expires_at > now
                && l.owner
                    .as_deref()
                    .is_some_and(|o| live.iter().any(|r| r.relay_id == o) || handing_over(o))
            {
                covered[l.bucket as usize] = true;
            }
        }
        let round_ticks = t.round;
        let active = self.active_relays(now, lease_ticks);
        let leases = self.lease_views(now);
        for joining in live
            .iter()
            .filter(|r| now.saturating_sub(r.last_seen) <= round_ticks)
        {
            let plan = plan::compute(&PlanInput {
                bucket_count,
                me: &joining.relay_id,
                active_relays: &active,
                leases: &leases,
            });
            for b in plan.claim {
                covered[b as usize] = true;
            }
        }
        buckets
            .iter()
            .copied()
            .filter(|b| !covered.get(*b as usize).copied().unwrap_or(false))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: i64 = 30;
    const SOON: i64 = 10;
    const ROUND: i64 = 2;
    const TAKEOVER_TICKS: i64 = 6;
    const NOW: i64 = 1_000;

    fn relay(id: &str, last_seen: i64) -> RelayRecord {
        RelayRecord {
            relay_id: id.into(),
            last_seen,
            stopped_at: None,
            stops_at: None,
            delivery: None,
        }
    }

    fn lease(bucket: u32, owner: &str, expires_at: i64) -> LeaseRecord {
        LeaseRecord {
            bucket,
            owner: Some(owner.into()),
            expires_at,
            expiry_exact: true,
        }
    }

    fn check(c: &Coordination, buckets: &[u32]) -> Vec<u32> {
        c.uncovered(
            buckets,
            4,
            NOW,
            &CoverageTicks {
                lease: LEASE,
                soon: SOON,
                round: ROUND,
                takeover: TAKEOVER_TICKS,
            },
        )
    }

    #[test]
    fn live_owners_cover_their_buckets() {
        let c = Coordination {
            leases: (0..4).map(|b| lease(b, "a", NOW + 20)).collect(),
            relays: vec![relay("a", NOW - 5)],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), Vec::<u32>::new());
    }

    #[test]
    fn nobody_alive_covers_nothing() {
        // a's heartbeat is older than the lease duration; its leases have not lapsed yet.
        let c = Coordination {
            leases: (0..4).map(|b| lease(b, "a", NOW + 1)).collect(),
            relays: vec![relay("a", NOW - LEASE)],
        };
        assert_eq!(check(&c, &[1, 3]), vec![1, 3]);
        assert_eq!(check(&Coordination::default(), &[0]), vec![0]);
    }

    #[test]
    fn stopped_or_soon_stopping_relays_do_not_count() {
        let mut stopped = relay("a", NOW - 1);
        stopped.stopped_at = Some(NOW - 1);
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![stopped],
        };
        assert_eq!(check(&c, &[0]), vec![0]);

        let mut leaving = relay("a", NOW - 1);
        leaving.stops_at = Some(NOW + SOON);
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![leaving.clone()],
        };
        assert_eq!(check(&c, &[0]), vec![0]);
        // With a live successor, a scheduled handover (the stop still ahead) is covered:
        // the successor takes the bucket over just after the stop.
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![leaving.clone(), relay("b", NOW - 1)],
        };
        assert_eq!(check(&c, &[0]), Vec::<u32>::new());
        // ...but not a stop announced for now (an idle stop), nor one already past...
        for at in [NOW, NOW - 1] {
            let stopping = RelayRecord {
                stops_at: Some(at),
                ..leaving.clone()
            };
            let c = Coordination {
                leases: vec![lease(0, "a", NOW + 20)],
                relays: vec![stopping, relay("b", NOW - 1)],
            };
            assert_eq!(check(&c, &[0]), vec![0], "stop at {at}");
        }
        // ...nor when the would-be successor is leaving too.
        let also_leaving = RelayRecord {
            stops_at: Some(NOW + 2),
            ..relay("b", NOW - 1)
        };
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![leaving.clone(), also_leaving],
        };
        assert_eq!(check(&c, &[0]), vec![0]);
        // A successor that is live now but leaves before it has taken the bucket over (the
        // leaver's stop plus the takeover, plus its own poll interval) covers nothing: it
        // would be gone, and the bucket ownerless, until the next wake.
        let leaves = NOW + SOON;
        for (b_stops, covered) in [
            (NOW + SOON + 1, false),
            (leaves + TAKEOVER_TICKS, false),
            (leaves + TAKEOVER_TICKS + SOON, false),
            (leaves + TAKEOVER_TICKS + SOON + 1, true),
        ] {
            let short_lived = RelayRecord {
                stops_at: Some(b_stops),
                ..relay("b", NOW - 1)
            };
            let c = Coordination {
                leases: vec![lease(0, "a", NOW + 20)],
                relays: vec![leaving.clone(), short_lived],
            };
            let want = if covered { vec![] } else { vec![0] };
            assert_eq!(check(&c, &[0]), want, "successor stopping at {b_stops}");
        }
        // A stop announced further out still counts.
        let mut staying = relay("a", NOW - 1);
        staying.stops_at = Some(NOW + SOON + 1);
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20)],
            relays: vec![staying],
        };
        assert_eq!(check(&c, &[0]), Vec::<u32>::new());
    }

    #[test]
    fn free_lapsed_or_dead_relays_buckets_are_uncovered_with_a_fleet_between_rounds() {
        // a holds 0 (live) and 1 (lapsed); 2 has no lease item; 3 is held by a relay
        // without a heartbeat. a is between rounds (heartbeat 5 ticks ago): it would
        // claim 1 and 2 only at its next round, so the notified invocation joins.
        let c = Coordination {
            leases: vec![
                lease(0, "a", NOW + 20),
                lease(1, "a", NOW),
                lease(3, "dead", NOW + 20),
            ],
            relays: vec![relay("a", NOW - 5)],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), vec![1, 2, 3]);
        // A bucket beyond the count is never covered.
        assert_eq!(check(&c, &[7]), vec![7]);
    }

    #[test]
    fn a_relay_in_its_round_covers_what_its_plan_claims() {
        // "new" has just written its first heartbeat and holds nothing: its round is
        // about to claim its share of the free buckets. "a" is between rounds.
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20), lease(3, "dead", NOW + 20)],
            relays: vec![relay("a", NOW - 5), relay("new", NOW - 1)],
        };
        // Shares of 4 buckets over a and new: 2 each; new's range is 2..4. It claims 2
        // (3 is held by the dead relay until it lapses); 1 waits for a's next round.
        assert_eq!(check(&c, &[1, 2, 3]), vec![1, 3]);
        // Alone on an empty table, a joiner covers everything.
        let c = Coordination {
            leases: vec![],
            relays: vec![relay("new", NOW - 1)],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), Vec::<u32>::new());
        // ...unless it is about to stop.
        let mut leaving = relay("new", NOW - 1);
        leaving.stops_at = Some(NOW + 1);
        let c = Coordination {
            leases: vec![],
            relays: vec![leaving],
        };
        assert_eq!(check(&c, &[0]), vec![0]);
    }

    #[test]
    fn a_fleet_holding_every_bucket_covers_them_all_standbys_included() {
        let c = Coordination {
            leases: vec![
                lease(0, "a", NOW + 20),
                lease(1, "b", NOW + 20),
                lease(2, "c", NOW + 20),
                lease(3, "c", NOW + 20),
            ],
            relays: vec![
                relay("a", NOW - 1),
                relay("b", NOW - 1),
                relay("c", NOW - 1),
                relay("standby", NOW - 1),
            ],
        };
        assert_eq!(check(&c, &[0, 1, 2, 3]), Vec::<u32>::new());
    }

    #[test]
    fn stale_records_are_cleaned_by_the_first_active_relay_only() {
        let mut stopped = relay("gone", NOW - 1);
        stopped.stopped_at = Some(NOW - LEASE);
        let silent = relay("silent", NOW - 10 * LEASE);
        let recent_stop = RelayRecord {
            stopped_at: Some(NOW - 1),
            ..relay("recent", NOW - 1)
        };
        let c = Coordination {
            leases: vec![],
            relays: vec![
                relay("b", NOW - 1),
                relay("c", NOW - 1),
                stopped,
                silent,
                recent_stop,
                relay("quiet", NOW - 10 * LEASE + 1),
            ],
        };
        let ids = |me: &str| -> Vec<String> {
            c.stale_records(me, NOW, LEASE)
                .into_iter()
                .map(|r| r.relay_id.clone())
                .collect()
        };
        assert_eq!(ids("b"), ["gone", "silent"]);
        // "c" is not first in id order among the active ("b", "c").
        assert!(ids("c").is_empty());
        // A relay not yet in the read ("a") sorts first.
        assert_eq!(ids("a"), ["gone", "silent"]);
    }

    #[test]
    fn handover_follows_an_announced_stop_of_a_holder() {
        const STEP: i64 = 3;
        const WATCH: i64 = 50;
        let leaving = RelayRecord {
            stops_at: Some(NOW + 10),
            ..relay("leaving", NOW - 1)
        };
        let c = Coordination {
            leases: vec![lease(0, "leaving", NOW + 20)],
            relays: vec![leaving.clone(), relay("me", NOW - 1)],
        };
        assert_eq!(
            c.handover_at("me", 4, NOW, STEP, WATCH),
            Some(NOW + 10 + STEP)
        );
        // Past the announced time: every step while it has not stamped its stop...
        assert_eq!(
            c.handover_at("me", 4, NOW + 20, STEP, WATCH),
            Some(NOW + 20 + STEP)
        );
        // ...up to the watch.
        assert_eq!(c.handover_at("me", 4, NOW + 10 + WATCH, STEP, WATCH), None);
        // Not for a peer that holds nothing, has stamped its stop, or for itself.
        let idle = Coordination {
            leases: vec![lease(7, "leaving", NOW + 20)],
            relays: vec![leaving.clone()],
        };
        assert_eq!(idle.handover_at("me", 4, NOW, STEP, WATCH), None);
        assert_eq!(c.handover_at("leaving", 4, NOW, STEP, WATCH), None);
    }

    #[test]
    fn a_stamped_peer_still_holding_leases_is_watched_every_step_until_its_releases_land() {
        const STEP: i64 = 3;
        const WATCH: i64 = 50;
        let stamped = RelayRecord {
            stops_at: Some(NOW - 5),
            stopped_at: Some(NOW - 4),
            ..relay("leaving", NOW - 4)
        };
        // Stamped, its releases not landed yet: every step from now on...
        let c = Coordination {
            leases: vec![lease(0, "leaving", NOW + 20), lease(1, "me", NOW + 20)],
            relays: vec![stamped.clone(), relay("me", NOW - 1)],
        };
        assert_eq!(c.handover_at("me", 4, NOW, STEP, WATCH), Some(NOW + STEP));
        assert_eq!(c.releasing("me", 4, NOW, WATCH).len(), 1);
        // ...up to the watch past the stamp (a stop that failed: the leases lapse)...
        assert_eq!(c.handover_at("me", 4, NOW - 4 + WATCH, STEP, WATCH), None);
        // ...and not once every release landed, nor for leases that lapsed, nor for buckets
        // beyond the count, nor for itself.
        let released = Coordination {
            leases: vec![
                LeaseRecord {
                    owner: None,
                    ..lease(0, "leaving", NOW + 20)
                },
                lease(2, "leaving", NOW),
                lease(7, "leaving", NOW + 20),
            ],
            relays: vec![stamped.clone()],
        };
        assert_eq!(released.handover_at("me", 4, NOW, STEP, WATCH), None);
        assert!(released.releasing("me", 4, NOW, WATCH).is_empty());
        assert_eq!(c.handover_at("leaving", 4, NOW, STEP, WATCH), None);
    }

    #[test]
    fn peers_hold_only_with_live_unlapsed_leases_of_others() {
        let leaving = RelayRecord {
            stops_at: Some(NOW + SOON),
            ..relay("leaving", NOW - 1)
        };
        let c = Coordination {
            leases: vec![
                lease(0, "me", NOW + 20),
                lease(1, "b", NOW + 20),
                lease(2, "b", NOW),
                lease(3, "leaving", NOW + 20),
            ],
            relays: vec![relay("me", NOW - 1), relay("b", NOW - 1), leaving],
        };
        let holds =
            |buckets: &[u32]| c.peers_hold("me", buckets.iter().copied(), NOW, LEASE, SOON, None);
        assert!(holds(&[1]));
        assert!(holds(&[]));
        assert!(!holds(&[0]), "its own lease is not a peer's");
        assert!(!holds(&[2]), "lapsed");
        assert!(!holds(&[3]), "its holder announced a stop");
        assert!(!holds(&[1, 5]), "no lease item");
    }

    #[test]
    fn a_peer_that_leaves_before_me_does_not_hold_the_rest() {
        let with_stop = |id: &str, stops_at: Option<i64>| RelayRecord {
            stops_at,
            ..relay(id, NOW - 1)
        };
        let c = Coordination {
            leases: vec![
                lease(0, "early", NOW + 20),
                lease(1, "late", NOW + 20),
                lease(2, "forever", NOW + 20),
            ],
            relays: vec![
                with_stop("me", None),
                with_stop("early", Some(NOW + 40)),
                with_stop("late", Some(NOW + 60)),
                with_stop("forever", None),
            ],
        };
        let holds = |bucket: u32, my_stop: Option<i64>| {
            c.peers_hold("me", [bucket], NOW, LEASE, SOON, my_stop)
        };
        // I stop at NOW + 50: the peer leaving at NOW + 40 hands over to nobody if I go.
        assert!(!holds(0, Some(NOW + 50)), "leaves before me");
        assert!(holds(1, Some(NOW + 50)), "leaves after me");
        assert!(holds(1, Some(NOW + 60)), "leaves with me");
        assert!(holds(2, Some(NOW + 50)), "announces no stop");
        // I run until shut down: only a peer that does too stays as long.
        assert!(!holds(1, None));
        assert!(holds(2, None));
    }

    const TAKEOVER: TakeoverTicks = TakeoverTicks {
        lease: LEASE,
        soon: SOON,
        renew: 8,
        step: 3,
        watch: 50,
    };

    #[test]
    fn a_leavers_buckets_are_taken_two_steps_after_its_stop_when_a_successor_counts() {
        let t = TAKEOVER;
        let leaving = |stops_at: i64, stopped_at: Option<i64>| RelayRecord {
            stops_at: Some(stops_at),
            stopped_at,
            ..relay("leaving", NOW - 1)
        };
        let taken = |relays: Vec<RelayRecord>| {
            Coordination {
                leases: vec![lease(0, "leaving", NOW + 20)],
                relays,
            }
            .taken_over_at(&[0], 4, NOW, &t)
        };
        // Announced for now, not stamped yet, a successor counts.
        assert_eq!(
            taken(vec![leaving(NOW, None), relay("b", NOW - 1)]),
            Some(NOW + 2 * t.step)
        );
        // Stamped late: after the stamp.
        assert_eq!(
            taken(vec![leaving(NOW - 10, Some(NOW + 1)), relay("b", NOW - 1)]),
            Some(NOW + 1 + 2 * t.step)
        );
        // No successor, or a stop longer ago than the watch: no taker.
        assert_eq!(taken(vec![leaving(NOW, None)]), None);
        assert_eq!(
            taken(vec![leaving(NOW - t.watch, None), relay("b", NOW - 1)]),
            None
        );
    }

    #[test]
    fn a_free_bucket_is_taken_at_the_next_round_of_the_relay_whose_plan_claims_it() {
        let t = TAKEOVER;
        // a holds 0-1, b (newcomer) will claim 2-3, freed by a's release.
        let c = Coordination {
            leases: vec![lease(0, "a", NOW + 20), lease(1, "a", NOW + 20)],
            relays: vec![relay("a", NOW - 1), relay("b", NOW - 5)],
        };
        assert_eq!(
            c.taken_over_at(&[2, 3], 4, NOW, &t),
            Some(NOW - 5 + t.renew + t.step)
        );
        // With a stop announced just now (a handover in progress), sooner: the early re-read.
        let mut watched = c.clone();
        watched.relays.push(RelayRecord {
            stops_at: Some(NOW - 2),
            stopped_at: Some(NOW - 1),
            ..relay("gone", NOW - 1)
        });
        assert_eq!(
            watched.taken_over_at(&[2, 3], 4, NOW, &t),
            Some(NOW + t.step + t.step)
        );
        // A bucket no plan claims (held by a live relay, here a), or no relay at all: none.
        let nobody = Coordination::default();
        assert_eq!(nobody.taken_over_at(&[2], 4, NOW, &t), None);
        // Every bucket needs a taker: one without makes the whole answer None.
        let c2 = Coordination {
            leases: vec![lease(0, "dead", NOW + 20)],
            relays: vec![relay("b", NOW - 1)],
        };
        assert_eq!(c2.taken_over_at(&[0], 4, NOW, &t), None);
        assert_eq!(
            c2.taken_over_at(&[1], 4, NOW, &t),
            Some(NOW - 1 + t.renew + t.step)
        );
    }

    #[test]
    fn held_by_lists_the_buckets_naming_a_relay() {
        let c = Coordination {
            leases: vec![
                lease(0, "a", NOW - 5),
                lease(2, "a", NOW + 5),
                lease(9, "a", NOW),
            ],
            relays: vec![],
        };
        assert_eq!(c.held_by("a", 4), vec![0, 2]);
        assert!(c.held_by("b", 4).is_empty());
    }

    #[test]
    fn timestamps_read_exact_when_whole_ticks_else_rounded_up_or_zero() {
        assert_eq!(
            read_ticks(Some("638000000000000000")),
            (638000000000000000, true)
        );
        assert_eq!(read_ticks(Some("-5")), (-5, true));
        assert_eq!(read_ticks(Some("12.25")), (13, false));
        assert_eq!(read_ticks(Some("1E+30")), (i64::MAX, false));
        assert_eq!(read_ticks(Some("-1E+30")), (i64::MIN, false));
        assert_eq!(read_ticks(Some("soon")), (0, false));
        assert_eq!(read_ticks(None), (0, false));
        assert_eq!(
            ReadExpiry::from(7),
            ReadExpiry {
                ticks: 7,
                exact: true
            }
        );
    }

    #[test]
    fn a_lease_with_an_owner_but_no_usable_expiry_is_lapsed_free_for_others_and_kept_by_its_owner()
    {
        let (ticks, exact) = read_ticks(None);
        let c = Coordination {
            leases: vec![
                LeaseRecord {
                    bucket: 0,
                    owner: Some("ghost".into()),
                    expires_at: ticks,
                    expiry_exact: exact,
                },
                LeaseRecord {
                    bucket: 1,
                    owner: Some("me".into()),
                    expires_at: ticks,
                    expiry_exact: exact,
                },
            ],
            relays: vec![relay("me", NOW - 1)],
        };
        assert!(c.lease_views(NOW).iter().all(|v| v.lapsed));
        let p = plan::compute(&PlanInput {
            bucket_count: 2,
            me: "me",
            active_relays: &c.active_relays(NOW, LEASE),
            leases: &c.lease_views(NOW),
        });
        assert_eq!((p.keep, p.claim), (vec![1], vec![0]));
        assert_eq!(
            c.lease(1).unwrap().read_expiry(),
            ReadExpiry {
                ticks: 0,
                exact: false
            }
        );
    }

    #[test]
    fn an_exactly_once_relay_finds_the_live_peers_that_do_not_say_so() {
        let exactly = |id: &str| RelayRecord {
            delivery: Some(DELIVERY_EXACTLY_ONCE.into()),
            ..relay(id, NOW - 1)
        };
        let other_word = RelayRecord {
            delivery: Some("at-least-once".into()),
            ..relay("said-otherwise", NOW - 1)
        };
        let stopped = RelayRecord {
            stopped_at: Some(NOW - 1),
            ..relay("stopped", NOW - 1)
        };
        let c = Coordination {
            leases: vec![],
            relays: vec![
                exactly("me"),
                exactly("peer"),
                relay("reference", NOW - 1),
                other_word,
                relay("silent", NOW - LEASE),
                stopped,
            ],
        };
        assert_eq!(
            c.peers_not_exactly_once("me", NOW, LEASE),
            vec!["reference".to_string(), "said-otherwise".to_string()]
        );
        // Itself is never a peer, whatever its record says.
        assert_eq!(
            c.peers_not_exactly_once("reference", NOW, LEASE),
            vec!["said-otherwise".to_string()]
        );
    }

    #[test]
    fn heartbeat_records_without_a_numeric_last_seen_never_count_and_go_stale() {
        let (last_seen, _) = read_ticks(None);
        // Another implementation's stop stamp before its first heartbeat.
        let stamp_only = RelayRecord {
            relay_id: "other".into(),
            last_seen,
            stopped_at: Some(NOW - LEASE),
            stops_at: None,
            delivery: None,
        };
        let bare = RelayRecord {
            relay_id: "bare".into(),
            stopped_at: None,
            ..stamp_only.clone()
        };
        let recent_stamp = RelayRecord {
            relay_id: "recent".into(),
            stopped_at: Some(NOW - 1),
            ..stamp_only.clone()
        };
        for r in [&stamp_only, &bare, &recent_stamp] {
            assert!(!r.is_active(NOW, LEASE), "{r:?}");
        }
        assert!(stamp_only.is_stale(NOW, LEASE));
        assert!(bare.is_stale(NOW, LEASE));
        assert!(
            !recent_stamp.is_stale(NOW, LEASE),
            "its stop is a lease duration old first"
        );
        let c = Coordination {
            leases: vec![],
            relays: vec![relay("a", NOW - 1), stamp_only, bare, recent_stamp],
        };
        let stale: Vec<&str> = c
            .stale_records("a", NOW, LEASE)
            .iter()
            .map(|r| r.relay_id.as_str())
            .collect();
        assert_eq!(stale, ["other", "bare"]);
    }

    /// The worked example of docs/protocol.md, section 4.6: 6 buckets, p holds 0-1, q
    /// holds 2-3, s held 4-5 and has stamped its stop. q reads after only bucket 5's
    /// release landed, p after both.
    #[test]
    fn plans_from_two_halves_of_a_handover_collide_so_half_a_handover_claims_nothing() {
        const WATCH: i64 = 50;
        let s = RelayRecord {
            stopped_at: Some(NOW - 1),
            ..relay("s", NOW - 1)
        };
        let read = |released: &[u32]| Coordination {
            leases: (0..6)
                .map(|b| {
                    let owner = ["p", "p", "q", "q", "s", "s"][b as usize];
                    LeaseRecord {
                        owner: (!released.contains(&b)).then(|| owner.to_string()),
                        ..lease(b, owner, NOW + 20)
                    }
                })
                .collect(),
            relays: vec![relay("p", NOW - 1), relay("q", NOW - 1), s.clone()],
        };
        let claims = |c: &Coordination, me: &str| {
            plan::compute(&PlanInput {
                bucket_count: 6,
                me,
                active_relays: &c.active_relays(NOW, LEASE),
                leases: &c.lease_views(NOW),
            })
            .claim
        };
        let (half, whole) = (read(&[5]), read(&[4, 5]));
        assert_eq!(
            claims(&half, "q"),
            [5],
            "q takes 5, the free bucket of its range"
        );
        assert_eq!(claims(&whole, "q"), [4]);
        assert_eq!(
            claims(&whole, "p"),
            [5],
            "p takes 5 in the second pass: both claim 5"
        );
        // The rule that prevents it: q's read is half a handover, p's is the whole.
        let ids = |c: &Coordination, me: &str| -> Vec<String> {
            c.releasing(me, 6, NOW, WATCH)
                .iter()
                .map(|r| r.relay_id.clone())
                .collect()
        };
        assert_eq!(ids(&half, "q"), ["s"]);
        assert!(ids(&whole, "p").is_empty());
        // Before any release landed, too (the leases still name s): nothing to claim anyway.
        assert_eq!(ids(&read(&[]), "p"), ["s"]);
    }

    use proptest::prelude::*;

    const POOL: [&str; 7] = ["a", "b", "c", "d", "m", "pod-1", "z"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The reads a relay plans claims from after a complete handover differ only by the
        /// claims of peers that have landed (membership is settled: the leaver is stamped,
        /// nobody else changes). Whatever subset of the fleet's claims landed, every relay's
        /// plan from the later read claims exactly what its plan from the earlier one did,
        /// minus what of it landed: no two claims collide.
        #[test]
        fn the_claims_of_a_whole_handover_agree_whatever_landed_of_them(
            n in 1u32..=24,
            members in prop::sample::subsequence(POOL.to_vec(), 2..=6),
            slots in prop::collection::vec(0usize..10, 24),
            landed in prop::collection::vec(any::<bool>(), 24),
        ) {
            // Per bucket: no item, an item without owner, or a member's live lease.
            let leases: Vec<LeaseRecord> = (0..n)
                .filter_map(|b| match slots[b as usize] {
                    0 => None,
                    1 => Some(LeaseRecord { owner: None, ..lease(b, "x", NOW + 20) }),
                    k => Some(lease(b, members[(k - 2) % members.len()], NOW + 20)),
                })
                .collect();
            let before = Coordination {
                leases,
                relays: members.iter().map(|m| relay(m, NOW - 1)).collect(),
            };
            let claims = |c: &Coordination, me: &str| {
                plan::compute(&PlanInput {
                    bucket_count: n,
                    me,
                    active_relays: &c.active_relays(NOW, LEASE),
                    leases: &c.lease_views(NOW),
                })
                .claim
            };
            let planned: Vec<(&str, Vec<u32>)> =
                members.iter().map(|m| (*m, claims(&before, m))).collect();
            let mut after = before.clone();
            for (me, buckets) in &planned {
                for &b in buckets.iter().filter(|b| landed[**b as usize]) {
                    after.leases.retain(|l| l.bucket != b);
                    after.leases.push(lease(b, me, NOW + 20));
                }
            }
            for (me, buckets) in &planned {
                let rest: Vec<u32> =
                    buckets.iter().copied().filter(|b| !landed[*b as usize]).collect();
                prop_assert_eq!(claims(&after, me), rest, "{} after {:?}", me, after.leases);
            }
        }
    }
}
