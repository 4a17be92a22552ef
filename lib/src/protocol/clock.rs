//! Time: the clock lease expiries and heartbeats are compared with, one the tests control,
//! and the UTC .NET ticks (100 ns since 0001-01-01) the items hold time in.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::ticks::{
    duration_to_ticks, epoch_seconds_at_or_after, system_time_from_ticks, ticks_from_system_time,
    ticks_to_duration, TICKS_PER_SECOND, UNIX_EPOCH_TICKS,
};

/// The wall clock that lease expiries and heartbeats are compared with.
pub trait Clock: Debug + Send + Sync {
    /// The current time in UTC ticks.
    fn now_ticks(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ticks(&self) -> i64 {
        ticks_from_system_time(SystemTime::now())
    }
}

/// The system clock shifted by an adjustable offset: for tests of skew and clocks set back.
#[derive(Debug, Clone, Default)]
pub struct OffsetClock {
    offset_ticks: Arc<AtomicI64>,
}

impl OffsetClock {
    /// A clock `offset` ahead of (positive) or behind (negative) the system clock.
    pub fn new(offset_ticks: i64) -> Self {
        OffsetClock {
            offset_ticks: Arc::new(AtomicI64::new(offset_ticks)),
        }
    }

    /// Changes the offset; clones share it.
    pub fn set_offset_ticks(&self, offset_ticks: i64) {
        self.offset_ticks.store(offset_ticks, Ordering::SeqCst);
    }
}

impl Clock for OffsetClock {
    fn now_ticks(&self) -> i64 {
        SystemClock.now_ticks() + self.offset_ticks.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_clock_moves() {
        let c = OffsetClock::new(-TICKS_PER_SECOND * 60);
        let d = SystemClock.now_ticks() - c.now_ticks();
        assert!(
            (TICKS_PER_SECOND * 59..=TICKS_PER_SECOND * 61).contains(&d),
            "{d}"
        );
    }
}
