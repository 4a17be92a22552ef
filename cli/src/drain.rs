//! `outboxctl drain`: waits until every bucket is empty, showing the messages left and
//! the rate (a bar on a terminal, plain lines otherwise).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use dynamo_outbox::options::parse_duration;
use dynamo_outbox::DynamoDbOutboxStore;
use tokio::time::Instant;

use crate::{dynamodb, failure, human_duration, outbox_options, usage, Cli, Failure};

/// Flags of `outboxctl drain`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Give up (exit 1) when the table is not empty after this long, e.g. 90s, 10m.
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    timeout: String,
    /// How often to count the messages (each count reads every pending message, up to
    /// the pending count limit per bucket).
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    interval: String,
}

/// The messages left: the sum over the buckets, and whether a count stopped at the cap.
async fn count(store: &DynamoDbOutboxStore) -> Result<(u64, bool), Failure> {
    let mut left = 0u64;
    let mut capped = false;
    for bucket in 0..store.options().bucket_count {
        let b = store.backlog(bucket).await?;
        // The count is eventually consistent, the head read is not: a head means not empty.
        left += u64::from(b.pending.max(u32::from(b.head_sequence.is_some())));
        capped |= b.capped;
    }
    Ok((left, capped))
}

/// A progress line: bar (when `width` > 0), messages left, rate and time to go.
pub(crate) fn progress_line(
    start: u64,
    left: u64,
    capped: bool,
    rate: Option<f64>,
    width: usize,
) -> String {
    let mut line = String::new();
    if width > 0 {
        let done = if start == 0 {
            1.0
        } else {
            (start.saturating_sub(left)) as f64 / start as f64
        };
        let filled = ((done * width as f64).round() as usize).min(width);
        line.push('[');
        line.push_str(&"#".repeat(filled));
        line.push_str(&"-".repeat(width - filled));
        line.push_str(&format!("] {:>3.0}%  ", done * 100.0));
    }
    let at_least = if capped { ">=" } else { "" };
    line.push_str(&format!("{at_least}{left} messages left"));
    match rate {
        Some(r) if r > 0.0 => {
            line.push_str(&format!(", {r:.1} msg/s"));
            if !capped {
                line.push_str(&format!(", ~{} to go", human_duration(left as f64 / r)));
            }
        }
        Some(_) => line.push_str(", 0.0 msg/s"),
        None => {}
    }
    line
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let options = outbox_options(cli, None)?;
    let timeout = parse_duration("--timeout", &args.timeout)?;
    let interval = parse_duration("--interval", &args.interval)?;
    if interval.is_zero() {
        return Err(usage("--interval must be greater than zero"));
    }
    let store = DynamoDbOutboxStore::new(dynamodb().await, options)?;
    let terminal = std::io::stdout().is_terminal();
    let started = Instant::now();
    let deadline = started + timeout;
    let (start, mut capped) = count(&store).await?;
    let mut left = start;
    let mut last = (started, start);
    let mut rate: Option<f64> = None;
    let mut last_plain = None::<Instant>;
    let mut out = std::io::stdout();
    loop {
        if left == 0 {
            if terminal {
                let _ = writeln!(out, "\r{}\x1b[K", progress_line(start, 0, false, rate, 30));
            }
            let _ = writeln!(
                out,
                "drained: every bucket is empty ({} messages in {})",
                start,
                human_duration(started.elapsed().as_secs_f64())
            );
            return Ok(());
        }
        if terminal {
            let _ = write!(
                out,
                "\r{}\x1b[K",
                progress_line(start.max(left), left, capped, rate, 30)
            );
            let _ = out.flush();
        } else if last_plain.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            let _ = writeln!(
                out,
                "drain: {}",
                progress_line(start, left, capped, rate, 0)
            );
            last_plain = Some(Instant::now());
        }
        if Instant::now() + interval > deadline {
            if terminal {
                let _ = writeln!(out);
            }
            let at_least = if capped { "at least " } else { "" };
            return Err(failure(format!(
                "{at_least}{left} messages still pending after {}: are relays running for every \
                 bucket? (outboxctl status shows buckets without a live owner)",
                human_duration(timeout.as_secs_f64())
            )));
        }
        tokio::time::sleep(interval).await;
        let (now_left, now_capped) = count(&store).await?;
        let now = Instant::now();
        let elapsed = now.duration_since(last.0).as_secs_f64();
        if elapsed > 0.0 {
            let instant = last.1.saturating_sub(now_left) as f64 / elapsed;
            // Smoothed, so that one slow count does not make the rate jump.
            rate = Some(rate.map_or(instant, |r| 0.7 * r + 0.3 * instant));
        }
        last = (now, now_left);
        left = now_left;
        capped = now_capped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        assert_eq!(
            progress_line(100, 25, false, Some(5.0), 10),
            "[########--]  75%  25 messages left, 5.0 msg/s, ~5s to go"
        );
        assert_eq!(progress_line(100, 100, false, None, 0), "100 messages left");
        assert_eq!(
            progress_line(20_000, 10_000, true, Some(0.0), 0),
            ">=10000 messages left, 0.0 msg/s"
        );
        assert_eq!(
            progress_line(0, 0, false, None, 4),
            "[####] 100%  0 messages left"
        );
    }
}
