//! Value parsers of the CLI's flags: clap calls them while parsing, so a bad value is
//! refused with clap's usage error (exit 2), which names the flag.

use std::time::Duration;

use dynamo_outbox::options::parse_duration;
use dynamo_outbox::Error;

/// A duration (`500ms`, `30s`, `2m`, `1h`), by the library's rule, so that a flag and its
/// environment variable accept the same values.
pub(crate) fn duration(value: &str) -> Result<Duration, String> {
    match parse_duration("", value) {
        Ok(d) => Ok(d),
        Err(Error::InvalidOption { rule, .. }) => Err(rule),
        Err(e) => Err(e.to_string()),
    }
}

/// A [`duration`] greater than zero.
pub(crate) fn positive_duration(value: &str) -> Result<Duration, String> {
    match duration(value)? {
        d if d.is_zero() => Err("must be greater than zero".into()),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_by_the_librarys_rule() {
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert!(duration("soon").unwrap_err().contains("like 500ms, 30s"));
        assert_eq!(
            positive_duration("0s").unwrap_err(),
            "must be greater than zero"
        );
    }
}
