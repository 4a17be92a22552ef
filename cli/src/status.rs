//! `outboxctl status`: the data comes from [`dynamo_outbox::status::read_status`]; this
//! module only formats it.

use std::fmt::Write as _;

use dynamo_outbox::status::{read_status, BucketStatus, RelayStatus, StatusReport};
use dynamo_outbox::DynamoDbOutboxStore;

use crate::{dynamodb, failure, human_duration, outbox_options, relay_options, Cli, Failure};

/// Flags of `outboxctl status`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print the report as JSON (ticks and seconds, warnings with a `kind`) for scripts.
    #[arg(long)]
    json: bool,
    /// The relays' lease duration, which decides whether a heartbeat counts as live
    /// (overrides OUTBOX_LEASE_DURATION; default 30s).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::positive_duration)]
    lease_duration: Option<std::time::Duration>,
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let options = outbox_options(cli, None)?;
    let lease_duration = match args.lease_duration {
        Some(d) => d,
        None => relay_options(&options)?.lease_duration,
    };
    let store = DynamoDbOutboxStore::new(dynamodb().await, options)?;
    let report = read_status(&store, lease_duration).await?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| failure(format!("rendering the report: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// `in 12s` / `lapsed 3s ago` / `never claimed`.
pub(crate) fn lease_text(b: &BucketStatus) -> String {
    match b.lease_expires_in_seconds {
        None => "never claimed".into(),
        Some(_) if b.owner.is_none() => "free".into(),
        Some(s) if s > 0.0 => format!("in {}", human_duration(s)),
        Some(s) => format!("lapsed {} ago", human_duration(s)),
    }
}

/// `12`, `>=10000`.
pub(crate) fn pending_text(b: &BucketStatus) -> String {
    if b.pending_capped {
        format!(">={}", b.pending)
    } else {
        b.pending.to_string()
    }
}

fn relative_seen(r: &RelayStatus) -> String {
    if r.last_seen_age_seconds < 0.0 {
        format!("in {} (future)", human_duration(r.last_seen_age_seconds))
    } else {
        format!("{} ago", human_duration(r.last_seen_age_seconds))
    }
}

fn relay_state(r: &RelayStatus, now_ticks: i64) -> String {
    if r.stopped {
        "stopped".into()
    } else if r.active {
        match r.stops_at {
            Some(at) if at > now_ticks => format!(
                "live (stops in {})",
                human_duration((at - now_ticks) as f64 / 1e7)
            ),
            _ => "live".into(),
        }
    } else {
        "silent".into()
    }
}

/// A table with left-aligned columns.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// The human report.
pub(crate) fn render(r: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "outbox {} (prefix {}, {} buckets, lease duration {}) at {}\n",
        r.table,
        r.key_prefix,
        r.bucket_count,
        human_duration(r.lease_duration_seconds),
        r.now_utc
    );
    let rows: Vec<Vec<String>> = r
        .buckets
        .iter()
        .map(|b| {
            vec![
                b.bucket.to_string(),
                b.owner.clone().unwrap_or_else(|| "-".into()),
                lease_text(b),
                pending_text(b),
                b.oldest_age_seconds
                    .map_or_else(|| "-".into(), human_duration),
            ]
        })
        .collect();
    out.push_str(&table(
        &["BUCKET", "OWNER", "LEASE EXPIRES", "PENDING", "OLDEST"],
        &rows,
    ));
    let capped = if r.any_capped() { " (at least)" } else { "" };
    let _ = writeln!(out, "\npending: {}{capped}", r.total_pending());
    if r.dead_letters > 0 {
        let at_least = if r.dead_letters_capped { ">=" } else { "" };
        let _ = writeln!(out, "dead letters: {at_least}{}", r.dead_letters);
    }
    out.push('\n');
    if r.relays.is_empty() {
        out.push_str("no relay heartbeats\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .relays
            .iter()
            .map(|rel| {
                vec![
                    rel.relay_id.clone(),
                    relative_seen(rel),
                    relay_state(rel, r.now_ticks),
                    if rel.buckets.is_empty() {
                        "-".into()
                    } else {
                        rel.buckets
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    },
                ]
            })
            .collect();
        out.push_str(&table(&["RELAY", "LAST SEEN", "STATE", "BUCKETS"], &rows));
    }
    if r.warnings.is_empty() {
        out.push_str("\nno warnings\n");
    } else {
        let _ = writeln!(out, "\n{} warning(s):", r.warnings.len());
        for w in &r.warnings {
            let _ = writeln!(out, "  ! {}", w.message);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_outbox::status::{Warning, WarningKind};

    fn bucket(bucket: u32) -> BucketStatus {
        BucketStatus {
            bucket,
            owner: None,
            owned: false,
            lease_expires_at: None,
            lease_expires_in_seconds: None,
            pending: 0,
            pending_capped: false,
            oldest_created_at: None,
            oldest_age_seconds: None,
            head_sequence: None,
            head_bucket_count: None,
            head_unreadable: false,
            head_unreadable_reason: None,
            head_topic: None,
            last_sequence: None,
            last_bucket_count: None,
            sequence_counter: None,
        }
    }

    #[test]
    fn renders_leases_counts_and_warnings() {
        let mut owned = bucket(0);
        owned.owner = Some("relay-a".into());
        owned.owned = true;
        owned.lease_expires_in_seconds = Some(12.2);
        owned.pending = 3;
        owned.oldest_age_seconds = Some(4.0);
        let mut lapsed = bucket(1);
        lapsed.owner = Some("relay-b".into());
        lapsed.lease_expires_in_seconds = Some(-3.0);
        lapsed.pending = 10_000;
        lapsed.pending_capped = true;
        lapsed.oldest_age_seconds = Some(7380.0);
        let report = StatusReport {
            table: "orders-outbox".into(),
            key_prefix: "OUTBOX".into(),
            bucket_count: 3,
            pending_count_limit: 10_000,
            lease_duration_seconds: 30.0,
            now_ticks: 0,
            now_utc: "2026-11-30T14:00:00Z".into(),
            buckets: vec![owned, lapsed, bucket(2)],
            relays: vec![
                RelayStatus {
                    relay_id: "relay-a".into(),
                    last_seen: 0,
                    last_seen_age_seconds: 2.0,
                    stopped_at: None,
                    stopped: false,
                    stops_at: None,
                    active: true,
                    buckets: vec![0],
                },
                RelayStatus {
                    relay_id: "relay-b".into(),
                    last_seen: 0,
                    last_seen_age_seconds: 45.0,
                    stopped_at: Some(0),
                    stopped: true,
                    stops_at: None,
                    active: false,
                    buckets: vec![],
                },
            ],
            dead_letters: 0,
            dead_letters_capped: false,
            warnings: vec![Warning {
                kind: WarningKind::PendingWithoutOwner,
                bucket: Some(1),
                relay: None,
                message: "bucket 1: >=10000 messages pending and no live owner".into(),
                parked: None,
            }],
        };
        let text = render(&report);
        assert!(text.contains("in 12s"), "{text}");
        assert!(text.contains("lapsed 3s ago"), "{text}");
        assert!(text.contains("never claimed"), "{text}");
        assert!(text.contains(">=10000"), "{text}");
        assert!(text.contains("2h 3m"), "{text}");
        assert!(text.contains("pending: 10003 (at least)"), "{text}");
        assert!(text.contains("45s ago"), "{text}");
        assert!(text.contains("stopped"), "{text}");
        assert!(text.contains("1 warning(s):\n  ! bucket 1:"), "{text}");
    }
}
