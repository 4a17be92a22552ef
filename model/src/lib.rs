//! A model of the lease protocol (not of the code), checked with `stateright`.
//!
//! Relays share a global clock (ticks of one renew interval) and each reads it with a
//! bounded skew. The lease and heartbeat items are the table's state; every conditional
//! write is one atomic step, so the checker explores every interleaving of the relays'
//! writes. A round is: heartbeat, one read of the coordination partition, the plan (the
//! library's real [`dynamo_outbox::protocol::plan::compute`]), then the planned writes one by one.
//! A write may land with its response lost (the relay never learns it applied). Relays
//! may crash; with stalls enabled, time may pass while a relay does nothing, including
//! between the start and the end of a publish.
//!
//! Each bucket holds one message. Publishing is two steps (start, broker ack), deleting a
//! third; as in the relay loop, a relay's round and its batches never overlap. Properties:
//! - no acknowledged message is ever lost (it is in the table or in Kafka);
//! - nothing is deleted before the broker acknowledged it;
//! - (a lease is only written as some relay's plan said, and a refused write changes
//!   nothing: by construction, since every write the model makes comes from a plan);
//! - at most one relay is publishing a bucket at a time (the spec accepts a violation
//!   after a stall past the lease: the checker must find it when stalls are enabled);
//! - every message is eventually published while a relay lives (checked on the paths
//!   the bounded run explores to their end).
//!
//! [`exactly_once`] models the exactly-once design of `docs/protocol.md`, section 8, on
//! the same rounds: Kafka's transactional producers and the watermark, and the relays'
//! transactions, with the properties of that mode.

use std::collections::BTreeSet;

use dynamo_outbox::protocol::plan::{compute, LeaseView, PlanInput};
use stateright::{Model, Property};

pub mod exactly_once;

/// Lease duration in ticks (one tick = one renew interval).
pub const LEASE: u8 = 3;

/// The model's parameters.
#[derive(Debug, Clone)]
pub struct LeaseModel {
    /// Number of relays.
    pub relays: u8,
    /// Number of buckets.
    pub buckets: u8,
    /// Last tick explored.
    pub max_time: u8,
    /// Each relay's clock offset in ticks (bounded skew).
    pub skew: Vec<i8>,
    /// Relays that may crash (at most one crash per run).
    pub crashes: bool,
    /// Whether time may pass while a relay is mid-round or mid-publish.
    pub stalls: bool,
    /// Whether a write may land with its response lost.
    pub lost_responses: bool,
}

/// One conditional write a relay planned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Write {
    /// Renew `bucket` from `read` to `new` (owner and version condition).
    Renew {
        /// The bucket.
        bucket: u8,
        /// The lease's expiry as the plan read it (the write's condition).
        read: i16,
        /// The expiry it writes.
        new: i16,
    },
    /// Release `bucket` read at `read`.
    Release {
        /// The bucket.
        bucket: u8,
        /// The lease's expiry as the plan read it (the write's condition).
        read: i16,
    },
    /// Claim `bucket` if free or lapsed at `now` (the relay's clock).
    Claim {
        /// The bucket.
        bucket: u8,
        /// The relay's clock when it planned (the lease must have lapsed by then).
        now: i16,
        /// The expiry it writes.
        new: i16,
    },
}

/// Where a relay is in its round.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waiting for the next tick.
    Done,
    /// Next: write the heartbeat.
    Heartbeat,
    /// Next: read and plan.
    Plan,
    /// Next: the planned writes, in order, sent at global time `sent`.
    Writing {
        /// The writes still to send, in order.
        writes: Vec<Write>,
        /// The global time they were sent at.
        sent: u8,
    },
}

/// A relay's own state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Relay {
    /// Not crashed.
    pub alive: bool,
    /// Round progress.
    pub phase: Phase,
    /// Buckets it believes it holds, with the global tick its lease is valid until (the
    /// monotonic clock: send time plus the lease duration).
    pub owned: Vec<Option<u8>>,
    /// A publish in flight: the bucket.
    pub publishing: Option<u8>,
    /// Acknowledged, not yet deleted: the bucket.
    pub deleting: Option<u8>,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Global time.
    pub t: u8,
    /// Lease items: owner and expiry (by the writer's clock), per bucket.
    pub leases: Vec<(Option<u8>, i16)>,
    /// Heartbeats: last seen (by the writer's clock), per relay.
    pub beats: Vec<Option<i16>>,
    /// The relays.
    pub relays: Vec<Relay>,
    /// The message of each bucket is still in the table.
    pub in_table: Vec<bool>,
    /// The message of each bucket reached Kafka (acknowledged).
    pub in_kafka: Vec<bool>,
    /// A message was deleted before it was acknowledged.
    pub early_delete: bool,
    /// Two relays were publishing one bucket at once.
    pub double_publish: bool,
    /// When a relay crashed.
    pub crashed: Option<u8>,
    /// A response was lost (at most one per run: a fault, not a network that never answers).
    pub lost_response: bool,
}

/// What can happen next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock advances one tick.
    Tick,
    /// Relay writes its heartbeat.
    Heartbeat(u8),
    /// Relay reads and plans.
    Plan(u8),
    /// Relay's next write lands; `lost` when its response never arrives.
    Write(u8, bool),
    /// Relay starts publishing a bucket it believes it holds.
    StartPublish(u8, u8),
    /// The broker acknowledges the relay's publish.
    Ack(u8),
    /// The relay deletes the acknowledged message.
    Delete(u8),
    /// The relay crashes.
    Crash(u8),
}

/// The lease half of a relay's round (heartbeat, read and plan, the planned writes), on the
/// coordination items alone, so that both models run the same rounds.
pub(crate) mod round {
    use super::{compute, BTreeSet, LeaseView, Phase, PlanInput, Write, LEASE};

    /// A lease item: owner and expiry (by the writer's clock).
    pub(crate) type LeaseItem = (Option<u8>, i16);

    /// The relay's clock at global time `t`.
    pub(crate) fn clock(skew: &[i8], r: u8, t: u8) -> i16 {
        i16::from(t) + i16::from(skew[r as usize])
    }

    fn id(r: u8) -> String {
        format!("r{r}")
    }

    /// Relay `r` writes its heartbeat at global time `t`.
    pub(crate) fn heartbeat(skew: &[i8], beats: &mut [Option<i16>], r: u8, t: u8) {
        let now = clock(skew, r, t);
        let beat = &mut beats[r as usize];
        if beat.is_none_or(|seen| seen < now) {
            *beat = Some(now);
        }
    }

    /// Relay `r` reads the coordination items and plans at global time `t`: forgets the
    /// buckets the read says it lost, and returns the phase with the planned writes.
    pub(crate) fn plan(
        relays: u8,
        skew: &[i8],
        leases: &[LeaseItem],
        beats: &[Option<i16>],
        owned: &mut [Option<u8>],
        r: u8,
        t: u8,
    ) -> Phase {
        let buckets = leases.len() as u8;
        let now = clock(skew, r, t);
        let active: Vec<String> = (0..relays)
            .filter(|&p| beats[p as usize].is_some_and(|seen| now - seen < i16::from(LEASE)))
            .map(id)
            .collect();
        let views: Vec<LeaseView> = leases
            .iter()
            .enumerate()
            .filter(|(_, (owner, _))| owner.is_some())
            .map(|(b, (owner, exp))| LeaseView {
                bucket: b as u32,
                owner: owner.map(id),
                lapsed: *exp <= now,
            })
            .collect();
        let me = id(r);
        let plan = compute(&PlanInput {
            bucket_count: u32::from(buckets),
            me: &me,
            active_relays: &active,
            leases: &views,
        });
        let new = now + i16::from(LEASE);
        // Buckets it believed it held but the read says otherwise: lost.
        let planned: BTreeSet<u32> = plan.keep.iter().chain(&plan.release).copied().collect();
        for b in 0..buckets {
            if !planned.contains(&u32::from(b)) {
                owned[b as usize] = None;
            }
        }
        let mut writes = Vec::new();
        for &b in &plan.keep {
            let read = leases[b as usize].1;
            if new > read {
                writes.push(Write::Renew {
                    bucket: b as u8,
                    read,
                    new,
                });
            }
        }
        for &b in &plan.release {
            owned[b as usize] = None;
            writes.push(Write::Release {
                bucket: b as u8,
                read: leases[b as usize].1,
            });
        }
        for &b in &plan.claim {
            writes.push(Write::Claim {
                bucket: b as u8,
                now,
                new,
            });
        }
        if writes.is_empty() {
            Phase::Done
        } else {
            Phase::Writing { writes, sent: t }
        }
    }

    /// Relay `r`'s next planned write lands (`lost`: its response never arrives). Returns
    /// the relay's next phase; `None` when it has no write to send.
    pub(crate) fn write(
        phase: &Phase,
        leases: &mut [LeaseItem],
        owned: &mut [Option<u8>],
        r: u8,
        lost: bool,
    ) -> Option<Phase> {
        let Phase::Writing { writes, sent } = phase else {
            return None;
        };
        let (write, rest) = writes.split_first()?;
        let me = Some(r);
        let valid_until = sent + LEASE;
        match *write {
            Write::Renew { bucket, read, new } => {
                let lease = &mut leases[bucket as usize];
                let ok = lease.0 == me && lease.1 == read;
                if ok {
                    lease.1 = new;
                }
                if !lost {
                    owned[bucket as usize] = ok.then_some(valid_until);
                }
            }
            Write::Release { bucket, read } => {
                let lease = &mut leases[bucket as usize];
                if lease.0 == me && lease.1 == read {
                    lease.0 = None;
                }
            }
            Write::Claim { bucket, now, new } => {
                let lease = &mut leases[bucket as usize];
                let ok = lease.0.is_none() || lease.1 <= now;
                if ok {
                    *lease = (me, new);
                }
                if !lost && ok {
                    owned[bucket as usize] = Some(valid_until);
                }
            }
        }
        Some(if rest.is_empty() {
            Phase::Done
        } else {
            Phase::Writing {
                writes: rest.to_vec(),
                sent: *sent,
            }
        })
    }
}

impl LeaseModel {
    /// Whether the relay may publish bucket `b` now: the lease is valid for more than one
    /// renew interval by the monotonic clock, and the message is waiting.
    fn publishable(&self, s: &State, r: u8, b: u8) -> bool {
        let relay = &s.relays[r as usize];
        relay.owned[b as usize].is_some_and(|until| until > s.t + 1)
            && s.in_table[b as usize]
            && !s.in_kafka[b as usize]
    }

    /// Whether the relay has nothing left to do this tick (a relay that is not stalled
    /// finishes its round and its batches within the tick).
    fn idle(&self, s: &State, r: u8) -> bool {
        let relay = &s.relays[r as usize];
        !relay.alive
            || (relay.phase == Phase::Done
                && relay.publishing.is_none()
                && relay.deleting.is_none()
                && (0..self.buckets).all(|b| !self.publishable(s, r, b)))
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let relay = Relay {
            alive: true,
            phase: Phase::Heartbeat,
            owned: vec![None; self.buckets as usize],
            publishing: None,
            deleting: None,
        };
        vec![State {
            t: 0,
            leases: vec![(None, 0); self.buckets as usize],
            beats: vec![None; self.relays as usize],
            relays: vec![relay; self.relays as usize],
            in_table: vec![true; self.buckets as usize],
            in_kafka: vec![false; self.buckets as usize],
            early_delete: false,
            double_publish: false,
            crashed: None,
            lost_response: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let all_idle = (0..self.relays).all(|r| self.idle(s, r));
        if s.t < self.max_time && (self.stalls || all_idle) {
            actions.push(Action::Tick);
        }
        for r in 0..self.relays {
            let relay = &s.relays[r as usize];
            if !relay.alive {
                continue;
            }
            // As in the relay loop, a round and a wave of batches never overlap: the
            // acquisition runs between waves.
            let busy = relay.publishing.is_some() || relay.deleting.is_some();
            match &relay.phase {
                _ if busy => {}
                Phase::Heartbeat => actions.push(Action::Heartbeat(r)),
                Phase::Plan => actions.push(Action::Plan(r)),
                Phase::Writing { .. } => {
                    actions.push(Action::Write(r, false));
                    if self.lost_responses && !s.lost_response {
                        actions.push(Action::Write(r, true));
                    }
                }
                Phase::Done => {}
            }
            if relay.publishing.is_some() {
                actions.push(Action::Ack(r));
            } else if relay.deleting.is_some() {
                actions.push(Action::Delete(r));
            } else if matches!(relay.phase, Phase::Done | Phase::Heartbeat) {
                for b in 0..self.buckets {
                    if self.publishable(s, r, b) {
                        actions.push(Action::StartPublish(r, b));
                    }
                }
            }
            if self.crashes && s.crashed.is_none() {
                actions.push(Action::Crash(r));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Tick => {
                n.t += 1;
                for relay in n.relays.iter_mut().filter(|r| r.alive) {
                    if relay.phase == Phase::Done {
                        relay.phase = Phase::Heartbeat;
                    }
                }
            }
            Action::Heartbeat(r) => {
                round::heartbeat(&self.skew, &mut n.beats, r, s.t);
                n.relays[r as usize].phase = Phase::Plan;
            }
            Action::Plan(r) => {
                let relay = &mut n.relays[r as usize];
                relay.phase = round::plan(
                    self.relays,
                    &self.skew,
                    &s.leases,
                    &s.beats,
                    &mut relay.owned,
                    r,
                    s.t,
                );
            }
            Action::Write(r, lost) => {
                n.lost_response |= lost;
                let relay = &mut n.relays[r as usize];
                relay.phase = round::write(&relay.phase, &mut n.leases, &mut relay.owned, r, lost)?;
            }
            Action::StartPublish(r, b) => {
                if s.relays.iter().any(|p| p.alive && p.publishing == Some(b)) {
                    n.double_publish = true;
                }
                n.relays[r as usize].publishing = Some(b);
            }
            Action::Ack(r) => {
                let b = n.relays[r as usize].publishing.take()?;
                n.in_kafka[b as usize] = true;
                n.relays[r as usize].deleting = Some(b);
            }
            Action::Delete(r) => {
                let b = n.relays[r as usize].deleting.take()?;
                if !n.in_kafka[b as usize] {
                    n.early_delete = true;
                }
                n.in_table[b as usize] = false;
            }
            Action::Crash(r) => {
                n.crashed = Some(s.t);
                let relay = &mut n.relays[r as usize];
                relay.alive = false;
                relay.publishing = None;
                relay.deleting = None;
                relay.phase = Phase::Done;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no acknowledged message is lost", |_, s: &State| {
                s.in_table.iter().zip(&s.in_kafka).all(|(t, k)| *t || *k)
            }),
            Property::always(
                "nothing is deleted before the broker acknowledged it",
                |_, s: &State| !s.early_delete,
            ),
            Property::always("one relay publishes a bucket at a time", |_, s: &State| {
                !s.double_publish
            }),
            Property::always(
                "at the end every message is published while a relay lives",
                |m: &LeaseModel, s: &State| {
                    // A crashed relay's leases lapse after the lease duration; a survivor
                    // takes them over on its next rounds.
                    let end = s.t == m.max_time && (0..m.relays).all(|r| m.idle(s, r));
                    let settled = s.crashed.is_none_or(|at| at + LEASE + 2 <= s.t);
                    let someone_alive = s.relays.iter().any(|r| r.alive);
                    !(end && settled && someone_alive && !m.stalls) || s.in_kafka.iter().all(|k| *k)
                },
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateright::Checker;

    fn model() -> LeaseModel {
        LeaseModel {
            relays: 2,
            buckets: 2,
            max_time: 7,
            skew: vec![0, 0],
            crashes: true,
            stalls: false,
            lost_responses: true,
        }
    }

    #[test]
    fn the_protocol_holds_with_crashes_lost_responses_and_bounded_skew() {
        for skew in [vec![0, 0], vec![0, 1], vec![1, 0]] {
            let checker = LeaseModel { skew, ..model() }.checker().spawn_bfs().join();
            checker.assert_properties();
            assert!(
                checker.unique_state_count() > 1000,
                "{}",
                checker.unique_state_count()
            );
        }
    }

    #[test]
    fn three_relays_on_two_buckets() {
        let checker = LeaseModel {
            relays: 3,
            skew: vec![0, 1, 0],
            lost_responses: false,
            max_time: 6,
            ..model()
        }
        .checker()
        .spawn_bfs()
        .join();
        checker.assert_properties();
    }

    #[test]
    fn a_stall_past_the_lease_can_make_two_relays_publish_one_bucket() {
        // The specification accepts this (a duplicate, never a loss): the checker must find it.
        let checker = LeaseModel {
            stalls: true,
            crashes: false,
            lost_responses: false,
            max_time: 6,
            ..model()
        }
        .checker()
        .spawn_bfs()
        .join();
        assert!(checker
            .discovery("one relay publishes a bucket at a time")
            .is_some());
        assert!(checker
            .discovery("no acknowledged message is lost")
            .is_none());
        assert!(checker
            .discovery("nothing is deleted before the broker acknowledged it")
            .is_none());
    }
}
