//! `outboxctl drain`: waits until every bucket is empty, showing the messages left and
//! the rate (a bar on a terminal, plain lines otherwise).

use std::io::IsTerminal;
use std::time::Duration;

use dynamo_outbox::DynamoDbOutboxStore;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

use crate::{dynamodb, failure, human_duration, outbox_options, Cli, Failure};

/// Flags of `outboxctl drain`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Give up (exit 1) when the table is not empty after this long, e.g. 90s, 10m.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = crate::args::duration)]
    timeout: Duration,
    /// How often to count the messages (each count reads every pending message, up to
    /// the pending count limit per bucket).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::args::positive_duration)]
    interval: Duration,
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

/// The progress text: messages left, rate and time to go (after the bar on a terminal,
/// alone in the plain lines).
pub(crate) fn progress_text(left: u64, capped: bool, rate: Option<f64>) -> String {
    let at_least = if capped { ">=" } else { "" };
    let mut line = format!("{at_least}{left} messages left");
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

/// Where the progress goes: an indicatif bar on a terminal (it hides itself elsewhere),
/// and a plain line every 5 s otherwise, for logs.
struct Progress {
    bar: ProgressBar,
    terminal: bool,
    last_plain: Option<Instant>,
}

impl Progress {
    fn new(start: u64) -> Self {
        // On stdout, as the plain lines: stderr keeps the logs.
        let bar = ProgressBar::with_draw_target(Some(start), ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template("[{bar:30}] {percent:>3}%  {msg}")
                .expect("a valid template")
                .progress_chars("#-"),
        );
        Progress {
            bar,
            terminal: std::io::stdout().is_terminal(),
            last_plain: None,
        }
    }

    fn show(&mut self, start: u64, left: u64, capped: bool, rate: Option<f64>) {
        let text = progress_text(left, capped, rate);
        // More may arrive while it drains: the bar grows with the backlog.
        self.bar.set_length(start.max(left).max(1));
        self.bar.set_position(start.max(left) - left);
        self.bar.set_message(text.clone());
        if !self.terminal
            && self
                .last_plain
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
        {
            println!("drain: {text}");
            self.last_plain = Some(Instant::now());
        }
    }
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let options = outbox_options(cli, None)?;
    let (timeout, interval) = (args.timeout, args.interval);
    let store = DynamoDbOutboxStore::new(dynamodb().await, options)?;
    let started = Instant::now();
    let deadline = started + timeout;
    let (start, mut capped) = count(&store).await?;
    let mut left = start;
    let mut last = (started, start);
    let mut rate: Option<f64> = None;
    let mut progress = Progress::new(start);
    loop {
        if left == 0 {
            progress.show(start, 0, false, rate);
            progress.bar.finish();
            println!(
                "drained: every bucket is empty ({} messages in {})",
                start,
                human_duration(started.elapsed().as_secs_f64())
            );
            return Ok(());
        }
        progress.show(start, left, capped, rate);
        if Instant::now() + interval > deadline {
            progress.bar.abandon();
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
    fn progress_texts() {
        assert_eq!(
            progress_text(25, false, Some(5.0)),
            "25 messages left, 5.0 msg/s, ~5s to go"
        );
        assert_eq!(progress_text(100, false, None), "100 messages left");
        assert_eq!(
            progress_text(10_000, true, Some(0.0)),
            ">=10000 messages left, 0.0 msg/s"
        );
    }
}
