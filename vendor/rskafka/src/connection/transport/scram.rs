//! Checks of the SCRAM messages a broker sends (RFC 5802 §7), made before rsasl sees them.
//!
//! rsasl 2.3 computes PBKDF2 with whatever iteration count the server-first message names,
//! synchronously, so a broken or hostile broker can pin a CPU for minutes (past any
//! connect timeout: the work never yields). Its parser also indexes `part[0..2]` of each
//! comma-separated attribute and panics on a short one (`r=x,s` or an empty server-final
//! message). Every server message is therefore checked here first, and one that breaks
//! a rule is refused with [`ScramMessageError`], which names the message and the rule.

use std::fmt;

/// The largest iteration count accepted from a broker: Apache Kafka's own maximum for
/// SCRAM-SHA-256 and SCRAM-SHA-512 credentials (its `ScramMechanism` stores none above
/// 16384; its minimum, and Amazon MSK's count, is 4096). A broker naming more is broken
/// or hostile, and computing it would hold the connecting thread.
pub const SCRAM_MAX_ITERATIONS: u32 = 16_384;

/// A SCRAM server message that breaks a rule of RFC 5802 or this client's ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramMessageError {
    /// Which message: `server-first` or `server-final`.
    pub message: &'static str,
    /// The rule it broke (never the message's bytes, except a decimal iteration count).
    pub rule: String,
}

impl fmt::Display for ScramMessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the broker's SCRAM {} message {}",
            self.message, self.rule
        )
    }
}

impl std::error::Error for ScramMessageError {}

/// Checks a server-first message: `[m=...,]r=<nonce>,s=<base64 salt>,i=<count>[,ext...]`,
/// with a printable nonce, a canonical base64 salt and an iteration count in
/// `1..=SCRAM_MAX_ITERATIONS`. A mandatory extension (`m=`) is refused, as RFC 5802
/// requires of a client that supports none.
pub fn check_server_first(input: &[u8]) -> Result<(), ScramMessageError> {
    let refuse = |rule: String| ScramMessageError {
        message: "server-first",
        rule,
    };
    let text = std::str::from_utf8(input).map_err(|_| refuse("is not UTF-8".into()))?;
    let mut parts = text.split(',');
    let mut attribute = |name: char, what: &str| -> Result<&str, ScramMessageError> {
        let part = parts.next().unwrap_or("");
        let mut chars = part.chars();
        match (chars.next(), chars.next()) {
            (Some('m'), Some('=')) if name == 'r' => Err(refuse(
                "names a mandatory extension (m=), which this client does not support".into(),
            )),
            (Some(c), Some('=')) if c == name => Ok(&part[2..]),
            _ => Err(refuse(format!(
                "has no {what} ({name}=...) where RFC 5802 puts it"
            ))),
        }
    };
    let nonce = attribute('r', "nonce")?;
    let salt = attribute('s', "salt")?;
    let iterations = attribute('i', "iteration count")?;
    if nonce.is_empty() || !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(refuse(
            "has a nonce (r=) that is empty or not printable ASCII".into(),
        ));
    }
    if !is_base64(salt) {
        return Err(refuse(
            "has a salt (s=) that is empty or not canonical base64".into(),
        ));
    }
    if iterations.is_empty() || !iterations.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse(
            "has an iteration count (i=) that is not a decimal number".into(),
        ));
    }
    match iterations.parse::<u32>() {
        Ok(0) => Err(refuse("has an iteration count (i=) of 0".into())),
        Ok(n) if n <= SCRAM_MAX_ITERATIONS => Ok(()),
        _ => Err(refuse(format!(
            "has an iteration count i={} above the ceiling of {SCRAM_MAX_ITERATIONS} \
             (Apache Kafka's own maximum)",
            // a count too long to read is not quoted whole
            if iterations.len() <= 20 {
                iterations
            } else {
                "(more than 20 digits)"
            }
        ))),
    }
}

/// Checks a server-final message: `v=<base64 signature>[,ext...]` or `e=<error>[,ext...]`.
/// Whether the signature verifies is rsasl's check; here only its form.
pub fn check_server_final(input: &[u8]) -> Result<(), ScramMessageError> {
    let refuse = |rule: &str| ScramMessageError {
        message: "server-final",
        rule: rule.into(),
    };
    let first = input.split(|&b| b == b',').next().unwrap_or(&[]);
    match first {
        [b'v', b'=', signature @ ..] => {
            if std::str::from_utf8(signature).is_ok_and(is_base64) {
                Ok(())
            } else {
                Err(refuse(
                    "has a verifier (v=) that is empty or not canonical base64",
                ))
            }
        }
        [b'e', b'=', ..] => Ok(()),
        _ => Err(refuse(
            "has neither a verifier (v=...) nor an error (e=...) where RFC 5802 puts it",
        )),
    }
}

/// Whether `s` is non-empty base64 of the standard alphabet with its padding (what rsasl's
/// decoder takes).
fn is_base64(s: &str) -> bool {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() % 4 != 0 {
        return false;
    }
    let data = bytes
        .iter()
        .rposition(|&b| b != b'=')
        .map_or(0, |last| last + 1);
    bytes.len() - data <= 2
        && bytes[..data]
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_server_first_passes() {
        check_server_first(b"r=abcDEF123,s=c2FsdHNhbHQ=,i=4096").unwrap();
        check_server_first(b"r=abc,s=c2FsdA==,i=16384,x=ext").unwrap();
    }

    #[test]
    fn server_first_rules() {
        for (input, rule) in [
            (&b""[..], "no nonce"),
            (b"r", "no nonce"),
            (b"r=abc", "no salt"),
            (b"r=abc,s", "no salt"),
            (b"r=abc,,i=4096", "no salt"),
            (b"r=abc,s=c2FsdA==", "no iteration count"),
            (b"r=abc,s=c2FsdA==,i", "no iteration count"),
            (b"m=ext,r=abc,s=c2FsdA==,i=4096", "mandatory extension"),
            (b"s=c2FsdA==,r=abc,i=4096", "no nonce"),
            (b"r=,s=c2FsdA==,i=4096", "nonce (r=) that is empty"),
            (
                b"r=abc,s=c2Fsd!==,i=4096",
                "salt (s=) that is empty or not canonical",
            ),
            (b"r=abc,s=c2FsdA=,i=4096", "salt (s=)"),
            (b"r=abc,s=,i=4096", "salt (s=)"),
            (b"r=abc,s=c2FsdA==,i=-1", "not a decimal"),
            (b"r=abc,s=c2FsdA==,i=0", "of 0"),
            (
                b"r=abc,s=c2FsdA==,i=16385",
                "i=16385 above the ceiling of 16384",
            ),
            (
                b"r=abc,s=c2FsdA==,i=4294967296",
                "above the ceiling of 16384",
            ),
            (b"r=abc,s=c2FsdA==,i=\xff", "not UTF-8"),
        ] {
            let e = check_server_first(input).expect_err(&String::from_utf8_lossy(input));
            assert_eq!(e.message, "server-first");
            assert!(
                e.to_string().contains(rule),
                "{e} for {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn server_final_rules() {
        check_server_final(b"v=c2lnbmF0dXJl").unwrap();
        check_server_final(b"e=invalid-proof").unwrap();
        for (input, rule) in [
            (&b""[..], "neither a verifier"),
            (b"v", "neither a verifier"),
            (b"x=abc", "neither a verifier"),
            (b"v=", "verifier (v=) that is empty"),
            (b"v=not base64!", "not canonical base64"),
        ] {
            let e = check_server_final(input).expect_err(&String::from_utf8_lossy(input));
            assert_eq!(e.message, "server-final");
            assert!(e.to_string().contains(rule), "{e}");
        }
    }
}
