//! `outboxctl dead-letters list|show|redrive|purge`: the dead-letter partition, through
//! [`dynamo_outbox::dead_letters`]; this module parses the flags and formats.

use std::fmt::Write as _;
use std::time::Duration;

use base64::Engine as _;
use clap::Subcommand;
use dynamo_outbox::dead_letters::{self, DeadLetter, Filter, MAX_BATCH};
use dynamo_outbox::status::rfc3339;
use dynamo_outbox::{DynamoDbOutboxStore, Error};
use serde_json::{json, Value};

use crate::{dynamodb, failure, human_duration, outbox_options, usage, Cli, Failure};

/// Subcommands of `outboxctl dead-letters`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// List dead letters (bucket, sequence, id, topic, when and why quarantined).
    List(ListArgs),
    /// Show one dead letter in full: id, key, value summary, headers, original bucket and
    /// sequence, when and why it was quarantined.
    Show(ShowArgs),
    /// Put dead letters back at the tail of their original bucket.
    ///
    /// Each one takes its bucket's next sequence number (as a writer does) and, in one
    /// transaction, goes back with the same message id, topic, key, value, headers and
    /// partition while its dead letter is deleted. It is published after everything
    /// pending in its bucket now: its old place is gone, and a bucket's order is its
    /// sequence order. One that cannot be read as a message, is stamped with another
    /// bucket count than OUTBOX_BUCKET_COUNT, belongs to another bucket under that count,
    /// or is on a topic outside OUTBOX_ALLOWED_TOPICS is refused (exit 2) and stays.
    #[command(verbatim_doc_comment)]
    Redrive(RedriveArgs),
    /// Delete dead letters for good (refused without --yes).
    Purge(PurgeArgs),
}

/// Which dead letters: every filter given must match.
#[derive(Debug, clap::Args)]
struct Select {
    /// Only those quarantined from this bucket.
    #[arg(long)]
    bucket: Option<u32>,
    /// Only the one with this original sequence number (with --bucket).
    #[arg(long, requires = "bucket")]
    sequence: Option<u64>,
    /// Only those on this topic.
    #[arg(long)]
    topic: Option<String>,
    /// Only those quarantined at least this long ago (`30m`, `2h`, `168h`).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::duration)]
    older_than: Option<Duration>,
}

impl Select {
    fn filter(&self) -> Filter {
        Filter {
            bucket: self.bucket,
            sequence: self.sequence,
            topic: self.topic.clone(),
            older_than: self.older_than,
        }
    }
}

#[derive(Debug, clap::Args)]
struct ListArgs {
    #[command(flatten)]
    select: Select,
    /// Show at most this many.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: u32,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ShowArgs {
    /// The bucket it was quarantined from.
    bucket: u32,
    /// Its sequence number there.
    sequence: u64,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct RedriveArgs {
    #[command(flatten)]
    select: Select,
    /// Redrive at most this many per call (at most 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH as i64))]
    limit: u32,
    /// Say what would be redriven (and what refused); write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct PurgeArgs {
    #[command(flatten)]
    select: Select,
    /// Purge at most this many per call (at most 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH as i64))]
    limit: u32,
    /// Confirm: the messages are deleted for good and never published.
    #[arg(long)]
    yes: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    if let Sub::Purge(p) = &args.command {
        if !p.yes {
            // Refused before anything is read: nothing is deleted by accident.
            return Err(usage(
                "purge: refused without --yes: purged dead letters are deleted for good and \
                 never published; `outboxctl dead-letters list` with the same filters shows \
                 what it would delete",
            ));
        }
    }
    let options = outbox_options(cli, None)?;
    if let Sub::Show(ShowArgs { bucket, .. }) = &args.command {
        if *bucket >= options.bucket_count {
            return Err(usage(format!(
                "bucket: {bucket} is not below the bucket count {}",
                options.bucket_count
            )));
        }
    }
    let store = DynamoDbOutboxStore::new(dynamodb().await, options)?;
    match &args.command {
        Sub::List(a) => list(&store, a).await,
        Sub::Show(a) => show(&store, a).await,
        Sub::Redrive(a) => redrive(&store, a).await,
        Sub::Purge(a) => purge(&store, a).await,
    }
}

async fn list(store: &DynamoDbOutboxStore, a: &ListArgs) -> Result<(), Failure> {
    let (found, more) = dead_letters::list(store, &a.select.filter(), a.limit as usize).await?;
    let now = store.clock().now_ticks();
    if a.json {
        let items: Vec<Value> = found.iter().map(|d| summary_json(d, false)).collect();
        print_json(&json!({"dead_letters": items, "more": more}))?;
        return Ok(());
    }
    if found.is_empty() {
        println!("no dead letters match");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|d| {
            vec![
                opt(d.bucket),
                opt(d.sequence),
                d.message_id.clone().unwrap_or_else(|| "-".into()),
                d.topic.clone().unwrap_or_else(|| "-".into()),
                d.since().map_or_else(
                    || "-".into(),
                    |t| format!("{} ago", human_duration(now.saturating_sub(t) as f64 / 1e7)),
                ),
                d.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print!(
        "{}",
        crate::status::table(
            &[
                "BUCKET",
                "SEQUENCE",
                "MESSAGE ID",
                "TOPIC",
                "QUARANTINED",
                "REASON"
            ],
            &rows
        )
    );
    if more {
        println!("(more match: raise --limit or narrow the filters)");
    }
    Ok(())
}

async fn show(store: &DynamoDbOutboxStore, a: &ShowArgs) -> Result<(), Failure> {
    let Some(d) = dead_letters::get(store, a.bucket, a.sequence).await? else {
        return Err(usage(format!(
            "bucket/sequence: no dead letter from bucket {}, sequence {}",
            a.bucket, a.sequence
        )));
    };
    if a.json {
        return print_json(&summary_json(&d, true));
    }
    print!("{}", show_text(&d, store.clock().now_ticks()));
    Ok(())
}

/// `show`'s text: one line per field.
fn show_text(d: &DeadLetter, now: i64) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        let _ = writeln!(out, "{name:<13} {value}");
    };
    line("dead letter", d.sort_key.clone());
    line("bucket", opt(d.bucket));
    line("sequence", opt(d.sequence));
    line(
        "message id",
        d.message_id.clone().unwrap_or_else(|| "-".into()),
    );
    line("topic", d.topic.clone().unwrap_or_else(|| "-".into()));
    line(
        "quarantined",
        d.quarantined_at.map_or_else(
            || "- (not recorded)".into(),
            |t| {
                format!(
                    "{} ({} ago)",
                    rfc3339(t),
                    human_duration(now.saturating_sub(t) as f64 / 1e7)
                )
            },
        ),
    );
    line(
        "reason",
        d.reason
            .clone()
            .unwrap_or_else(|| "- (not recorded)".into()),
    );
    match &d.message {
        Err(why) => line("unreadable", why.clone()),
        Ok(m) => {
            line(
                "key",
                m.key.as_deref().map_or("none (keyless)".into(), bytes_text),
            );
            line(
                "value",
                m.value.as_deref().map_or("none (a tombstone)".into(), |v| {
                    let preview = value_summary(v);
                    match preview["utf8_preview"].as_str() {
                        Some(p) if preview["truncated"] == true => {
                            format!("{} bytes: {p}...", v.len())
                        }
                        Some(p) => format!("{} bytes: {p}", v.len()),
                        None => format!("{} bytes (binary)", v.len()),
                    }
                }),
            );
            let headers: Vec<String> = m
                .headers
                .iter()
                .map(|h| {
                    format!(
                        "{}={}",
                        h.key,
                        h.value.as_deref().map_or("null".into(), bytes_text)
                    )
                })
                .collect();
            line(
                "headers",
                if headers.is_empty() {
                    "none".into()
                } else {
                    headers.join(", ")
                },
            );
            line("partition", opt(m.partition));
            line("enqueued", rfc3339(m.created_at_ticks));
            line("bucket count", m.bucket_count.to_string());
        }
    }
    out
}

/// Bytes as text when they are UTF-8, else `base64:...`.
fn bytes_text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_string(),
        Err(_) => format!(
            "base64:{}",
            base64::engine::general_purpose::STANDARD.encode(b)
        ),
    }
}

async fn redrive(store: &DynamoDbOutboxStore, a: &RedriveArgs) -> Result<(), Failure> {
    let (found, more) = dead_letters::list(store, &a.select.filter(), a.limit as usize).await?;
    let mut done = Vec::new();
    let mut refused = Vec::new();
    let mut gone = Vec::new();
    for d in &found {
        let result = if a.dry_run {
            dead_letters::check_redrive(store, d).map(|(m, bucket)| {
                json!({"message_id": m.message_id.to_string(), "bucket": bucket,
                       "from_sequence": d.sequence})
            })
        } else {
            dead_letters::redrive(store, d).await.map(|r| {
                json!({"message_id": r.message_id.to_string(), "bucket": r.bucket,
                       "from_sequence": r.from_sequence, "sequence": r.sequence})
            })
        };
        match result {
            Ok(v) => done.push(v),
            Err(e @ Error::InvalidMessage { .. }) => {
                refused.push(json!({"sort_key": d.sort_key, "bucket": d.bucket,
                                    "sequence": d.sequence, "error": e.to_string()}));
            }
            Err(Error::TransactionCanceled { reasons, .. }) if failed_check(&reasons, 1) => {
                // Redriven or purged by someone else since it was listed: nothing to do.
                gone.push(json!({"sort_key": d.sort_key, "bucket": d.bucket,
                                 "sequence": d.sequence}));
            }
            Err(Error::TransactionCanceled { reasons, .. }) if failed_check(&reasons, 0) => {
                report_redrive(a, &done, &refused, more)?;
                return Err(failure(format!(
                    "bucket {}: the slot its sequence counter handed out holds a message: the \
                     counter is behind its messages (`outboxctl status` warns \
                     sequence_behind); nothing was written, the dead letter stays",
                    opt(d.bucket)
                )));
            }
            // An operational failure stops the call: what was redriven stays redriven.
            Err(e) => {
                report_redrive(a, &done, &refused, more)?;
                return Err(Failure::from(e));
            }
        }
    }
    report_redrive(a, &done, &refused, more)?;
    for g in &gone {
        eprintln!(
            "bucket {}, sequence {}: gone meanwhile (redriven or purged by someone else)",
            plain(&g["bucket"]),
            plain(&g["sequence"])
        );
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(usage(format!(
            "{} dead letter(s) refused; they stay in the dead-letter partition",
            refused.len()
        )))
    }
}

fn report_redrive(
    a: &RedriveArgs,
    done: &[Value],
    refused: &[Value],
    more: bool,
) -> Result<(), Failure> {
    if a.json {
        let key = if a.dry_run {
            "would_redrive"
        } else {
            "redriven"
        };
        return print_json(
            &json!({key: done, "refused": refused, "dry_run": a.dry_run, "more": more}),
        );
    }
    for v in done {
        if a.dry_run {
            println!(
                "would redrive {} from bucket {}, sequence {} to the tail of bucket {}",
                plain(&v["message_id"]),
                plain(&v["bucket"]),
                plain(&v["from_sequence"]),
                plain(&v["bucket"])
            );
        } else {
            println!(
                "redrove {} from bucket {}, sequence {} to bucket {}, sequence {}",
                plain(&v["message_id"]),
                plain(&v["bucket"]),
                plain(&v["from_sequence"]),
                plain(&v["bucket"]),
                plain(&v["sequence"])
            );
        }
    }
    for v in refused {
        println!("refused {}", plain(&v["error"]));
    }
    if done.is_empty() && refused.is_empty() {
        println!("no dead letters match");
    }
    if more {
        println!("(more match: run again, or raise --limit)");
    }
    Ok(())
}

async fn purge(store: &DynamoDbOutboxStore, a: &PurgeArgs) -> Result<(), Failure> {
    let (found, more) = dead_letters::list(store, &a.select.filter(), a.limit as usize).await?;
    let mut purged = Vec::new();
    for d in &found {
        if dead_letters::purge(store, d).await? {
            purged.push(json!({"sort_key": d.sort_key, "bucket": d.bucket,
                               "sequence": d.sequence, "message_id": d.message_id}));
        }
    }
    if a.json {
        return print_json(&json!({"purged": purged, "more": more}));
    }
    for v in &purged {
        println!(
            "purged {} (bucket {}, sequence {})",
            plain(&v["message_id"]),
            plain(&v["bucket"]),
            plain(&v["sequence"])
        );
    }
    if purged.is_empty() {
        println!("no dead letters match");
    }
    if more {
        println!("(more match: run again, or raise --limit)");
    }
    Ok(())
}

/// A dead letter as JSON: its place, id, topic, when and why; `full` adds key, value
/// summary, headers, partition, enqueue time and bucket count.
fn summary_json(d: &DeadLetter, full: bool) -> Value {
    let mut v = json!({
        "bucket": d.bucket,
        "sequence": d.sequence,
        "sort_key": d.sort_key,
        "message_id": d.message_id,
        "topic": d.topic,
        "quarantined_at": d.quarantined_at.map(rfc3339),
        "quarantined_at_ticks": d.quarantined_at,
        "reason": d.reason,
        "readable": d.message.is_ok(),
    });
    if !full {
        return v;
    }
    let obj = v.as_object_mut().expect("an object");
    match &d.message {
        Err(why) => {
            obj.insert("unreadable".into(), json!(why));
        }
        Ok(m) => {
            obj.insert(
                "key".into(),
                m.key.as_deref().map_or(Value::Null, bytes_json),
            );
            obj.insert(
                "value".into(),
                m.value.as_deref().map_or(Value::Null, value_summary),
            );
            let headers: Vec<Value> = m
                .headers
                .iter()
                .map(|h| json!({"key": h.key, "value": h.value.as_deref().map_or(Value::Null, bytes_json)}))
                .collect();
            obj.insert("headers".into(), json!(headers));
            obj.insert("partition".into(), json!(m.partition));
            obj.insert("created_at".into(), json!(rfc3339(m.created_at_ticks)));
            obj.insert("bucket_count".into(), json!(m.bucket_count));
        }
    }
    v
}

/// Bytes as `{"utf8": ...}` when they are UTF-8 text, else `{"base64": ...}`.
fn bytes_json(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => json!({ "utf8": s }),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) }),
    }
}

/// Most characters of a value shown.
const PREVIEW_CHARS: usize = 200;

/// A value's size and its first [`PREVIEW_CHARS`] characters when it is UTF-8 text.
fn value_summary(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => {
            let preview: String = s.chars().take(PREVIEW_CHARS).collect();
            json!({"bytes": b.len(), "utf8_preview": preview, "truncated": preview.len() < s.len()})
        }
        Err(_) => json!({"bytes": b.len(), "binary": true}),
    }
}

/// Whether the transaction's item `index` (0: the put, 1: the dead letter's delete) failed
/// its condition.
fn failed_check(reasons: &[String], index: usize) -> bool {
    reasons
        .get(index)
        .is_some_and(|r| r == "ConditionalCheckFailed")
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A JSON value for a text line: strings bare, null as `-`, the rest as JSON.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_json(v: &Value) -> Result<(), Failure> {
    let text =
        serde_json::to_string_pretty(v).map_err(|e| failure(format!("rendering JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_outbox::protocol::store::{ORIGINAL_PK, ORIGINAL_SK};
    use dynamo_outbox::protocol::{attr, schema};
    use dynamo_outbox::{Header, OutboxMessage, OutboxOptions};

    #[test]
    fn show_names_every_field_and_bytes_as_text_or_base64() {
        let keys = schema::Keys::new(&OutboxOptions::new("orders-outbox"));
        let m = OutboxMessage::new("orders", 4)
            .with_key(vec![0xff, 0x00])
            .with_value("x".repeat(300))
            .with_header(Header::new("type", b"created".to_vec()))
            .with_header(Header::null("trace"));
        let mut item = schema::message_item(&keys, &m, 2, 7).unwrap();
        item.insert(ORIGINAL_PK.into(), schema::s(keys.message_pk(2)));
        item.insert(ORIGINAL_SK.into(), schema::s(schema::message_sk(7)));
        item.insert(attr::QUARANTINED_AT.into(), schema::n(m.created_at_ticks));
        item.insert(attr::QUARANTINE_REASON.into(), schema::s("too large"));
        item.extend(keys.key(keys.dead_letter_pk(), schema::dead_letter_sk(2, 7)));
        let d = DeadLetter::from_item(&keys, item);
        let text = show_text(&d, m.created_at_ticks + 30 * 10_000_000);
        for part in [
            "dead letter   0000000002#0000000000000000007",
            "bucket        2",
            "sequence      7",
            &format!("message id    {}", m.message_id),
            "topic         orders",
            "(30s ago)",
            "reason        too large",
            "key           base64:/wA=",
            &format!("value         300 bytes: {}...", "x".repeat(200)),
            "headers       type=created, trace=null",
            "partition     -",
            "bucket count  4",
        ] {
            assert!(text.contains(part), "{part:?} in\n{text}");
        }
    }
}
