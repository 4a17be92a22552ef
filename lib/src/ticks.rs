//! UTC .NET ticks (100 ns since 0001-01-01T00:00:00Z): how the items hold time (a
//! message's enqueue time, lease expiries, heartbeats), and their conversions. A leaf that
//! the message (its enqueue time) and the protocol's clock both use; public as
//! [`protocol::clock`](crate::protocol::clock).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Ticks at the Unix epoch (1970-01-01T00:00:00Z).
pub const UNIX_EPOCH_TICKS: i64 = 621_355_968_000_000_000;
/// Ticks per second.
pub const TICKS_PER_SECOND: i64 = 10_000_000;

/// UTC ticks of a system time.
pub fn ticks_from_system_time(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH_TICKS.saturating_add(duration_to_ticks(d)),
        Err(e) => UNIX_EPOCH_TICKS.saturating_sub(duration_to_ticks(e.duration())),
    }
}

/// The system time of UTC ticks.
pub fn system_time_from_ticks(ticks: i64) -> SystemTime {
    let delta = ticks - UNIX_EPOCH_TICKS;
    if delta >= 0 {
        UNIX_EPOCH + ticks_to_duration(delta)
    } else {
        UNIX_EPOCH - ticks_to_duration(-delta)
    }
}

/// A duration in ticks (saturating).
pub fn duration_to_ticks(d: Duration) -> i64 {
    i64::try_from(d.as_nanos() / 100).unwrap_or(i64::MAX)
}

/// Ticks as a duration (negative ticks give zero).
pub fn ticks_to_duration(ticks: i64) -> Duration {
    let t = ticks.max(0) as u64;
    Duration::new(t / 10_000_000, ((t % 10_000_000) * 100) as u32)
}

/// The first whole Unix epoch second at or after UTC `ticks`: the `TimeToLive` of an item
/// that expires then (rounded up, so DynamoDB's time to live never removes it early).
pub fn epoch_seconds_at_or_after(ticks: i64) -> i64 {
    let delta = ticks.saturating_sub(UNIX_EPOCH_TICKS);
    delta.div_euclid(TICKS_PER_SECOND) + i64::from(delta.rem_euclid(TICKS_PER_SECOND) != 0)
}

/// Whole Unix epoch milliseconds at UTC `ticks` (rounded down; zero before the epoch).
#[cfg(feature = "relay")]
pub(crate) fn unix_millis(ticks: i64) -> u64 {
    (ticks.saturating_sub(UNIX_EPOCH_TICKS) / (TICKS_PER_SECOND / 1000)).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_seconds_round_up_to_the_next_whole_second() {
        assert_eq!(epoch_seconds_at_or_after(UNIX_EPOCH_TICKS), 0);
        assert_eq!(epoch_seconds_at_or_after(UNIX_EPOCH_TICKS + 1), 1);
        assert_eq!(
            epoch_seconds_at_or_after(UNIX_EPOCH_TICKS + 1_764_500_000 * TICKS_PER_SECOND),
            1_764_500_000
        );
        assert_eq!(
            epoch_seconds_at_or_after(
                UNIX_EPOCH_TICKS + 1_764_500_000 * TICKS_PER_SECOND + 9_999_999
            ),
            1_764_500_001
        );
        assert_eq!(epoch_seconds_at_or_after(UNIX_EPOCH_TICKS - 1), 0);
        assert_eq!(
            epoch_seconds_at_or_after(UNIX_EPOCH_TICKS - TICKS_PER_SECOND),
            -1
        );
    }

    #[test]
    fn epoch_and_round_trip() {
        assert_eq!(ticks_from_system_time(UNIX_EPOCH), UNIX_EPOCH_TICKS);
        // 2024-01-01T00:00:00Z is 638396640000000000 ticks in .NET.
        let t = UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        assert_eq!(ticks_from_system_time(t), 638_396_640_000_000_000);
        assert_eq!(system_time_from_ticks(638_396_640_000_000_000), t);
        assert_eq!(duration_to_ticks(Duration::from_millis(1)), 10_000);
        assert_eq!(ticks_to_duration(15_000_000), Duration::from_millis(1500));
    }
}
