//! Checks `docs/protocol.md` against the code: every fenced block whose info string
//! contains `example:KIND` is parsed and compared with what the library computes (the
//! lease plans through `plan::compute`, keys through `schema`, ticks through `clock`,
//! hashes and buckets through `message`, heartbeats and lapses through `coordination`,
//! header blobs through `headers::decode`), and the constants block with the code's
//! constants and defaults. Its links are checked with every doc's by `doc_links.rs`.
//!
//! A few values are private to the crate (`pub(crate)` or local to a function); for those
//! the test finds the defining line in the source file instead, so that changing either
//! side alone still fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, UNIX_EPOCH};

use dynamo_outbox::headers::{self, HeaderError};
use dynamo_outbox::message::{compute_bucket, murmur2, to_positive};
use dynamo_outbox::protocol::clock::{self, duration_to_ticks, ticks_from_system_time};
use dynamo_outbox::protocol::coordination::{self, Coordination, LeaseRecord, RelayRecord};
use dynamo_outbox::protocol::plan::{self, LeaseView, PlanInput};
use dynamo_outbox::protocol::schema::{self, Keys};
use dynamo_outbox::{OutboxOptions, RelayOptions};
use uuid::Uuid;

mod doc_examples;
use doc_examples::{example_blocks, hex, unix_seconds_of, Example};

const DOC: &str = include_str!("../../docs/protocol.md");
const DELETE_RS: &str = include_str!("../src/protocol/store/delete.rs");
const STOP_RS: &str = include_str!("../src/relay/graceful_stop.rs");
const STATE_RS: &str = include_str!("../src/relay/state.rs");
const ROUTE_RS: &str = include_str!("../src/publish/route.rs");

/// A reader's clock for the examples that give times relative to "now".
const NOW: i64 = 639_316_440_000_000_000;

impl Example {
    fn at(&self) -> String {
        format!("docs/protocol.md line {} ({})", self.line, self.kind)
    }
}

/// `name: value` lines, in order; blank lines and `#` comments are skipped. The name ends
/// at the first `": "` (so `a::B: 1` is the name `a::B`); a line ending in `:` has an
/// empty value.
fn fields(ex: &Example) -> Vec<(String, String)> {
    ex.body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (name, value) = line
                .split_once(": ")
                .or_else(|| line.strip_suffix(':').map(|n| (n, "")))
                .unwrap_or_else(|| panic!("{}: {line:?} is not `name: value`", ex.at()));
            (name.trim().to_string(), value.trim().to_string())
        })
        .collect()
}

fn map(ex: &Example) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for (k, v) in fields(ex) {
        assert!(m.insert(k.clone(), v).is_none(), "{}: {k} twice", ex.at());
    }
    m
}

fn get<'a>(m: &'a BTreeMap<String, String>, ex: &Example, name: &str) -> &'a str {
    m.get(name)
        .unwrap_or_else(|| panic!("{} has no {name:?}", ex.at()))
}

fn num<T: std::str::FromStr>(text: &str, ex: &Example, what: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {what} {text:?}: {e:?}", ex.at()))
}

fn yes_no(text: &str, ex: &Example) -> bool {
    match text {
        "yes" => true,
        "no" => false,
        other => panic!("{}: {other:?} is neither yes nor no", ex.at()),
    }
}

/// A duration written `300ms`, `30s`, `29.9999999s`, `-10s` or `+20s`, as exact ticks
/// (100 ns), without going through floating point.
fn ticks(text: &str, ex: &Example) -> i64 {
    let t = text.trim();
    let (sign, t) = match t.as_bytes().first() {
        Some(b'-') => (-1, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let (number, unit_ticks, unit_digits) = if let Some(n) = t.strip_suffix("ms") {
        (n, 10_000i64, 4usize)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, clock::TICKS_PER_SECOND, 7usize)
    } else {
        panic!("{}: {text:?} is not a duration in s or ms", ex.at())
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    assert!(
        fraction.len() <= unit_digits,
        "{}: {text:?} is finer than a tick",
        ex.at()
    );
    let whole: i64 = num(whole, ex, "duration");
    let fraction: i64 = if fraction.is_empty() {
        0
    } else {
        num::<i64>(fraction, ex, "duration") * 10i64.pow((unit_digits - fraction.len()) as u32)
    };
    sign * (whole * unit_ticks + fraction)
}

fn unhex(text: &str, ex: &Example) -> Vec<u8> {
    text.split_whitespace()
        .map(|b| {
            u8::from_str_radix(b, 16).unwrap_or_else(|_| panic!("{}: {b:?} is not a byte", ex.at()))
        })
        .collect()
}

// ---- Lease plans ----

/// `none`, or bucket tokens separated by spaces, each `N` or `N-M` (both included).
fn buckets(text: &str, ex: &Example) -> Vec<u32> {
    if text == "none" {
        return Vec::new();
    }
    let mut out = Vec::new();
    for token in text.split_whitespace() {
        match token.split_once('-') {
            Some((a, b)) => out.extend(num::<u32>(a, ex, "bucket")..=num::<u32>(b, ex, "bucket")),
            None => out.push(num(token, ex, "bucket")),
        }
    }
    out
}

/// `owner buckets [lapsed]; ...`, with `nobody` for a lease item without an owner.
fn leases(text: &str, ex: &Example) -> Vec<LeaseView> {
    let mut out = Vec::new();
    for lease in text.split(';').map(str::trim).filter(|l| !l.is_empty()) {
        let mut tokens: Vec<&str> = lease.split_whitespace().collect();
        assert!(tokens.len() >= 2, "{}: lease {lease:?}", ex.at());
        let lapsed = tokens.last() == Some(&"lapsed");
        if lapsed {
            tokens.pop();
        }
        let owner = match tokens[0] {
            "nobody" => None,
            id => Some(id.to_string()),
        };
        for bucket in buckets(&tokens[1..].join(" "), ex) {
            out.push(LeaseView {
                bucket,
                owner: owner.clone(),
                lapsed,
            });
        }
    }
    out
}

/// The plan line's fields, `share 4; range 0-3; keep ...; release ...; claim ...[; standby N]`.
fn plan_fields(text: &str, ex: &Example) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for part in text.split(';').map(str::trim) {
        let (name, value) = part
            .split_once(' ')
            .unwrap_or_else(|| panic!("{}: plan field {part:?}", ex.at()));
        assert!(
            out.insert(name.to_string(), value.trim().to_string())
                .is_none(),
            "{}: {name} twice",
            ex.at()
        );
    }
    for name in out.keys() {
        assert!(
            ["share", "range", "keep", "release", "claim", "standby"].contains(&name.as_str()),
            "{}: unknown plan field {name:?}",
            ex.at()
        );
    }
    out
}

/// A named field of a parsed line, or a failure naming the example.
fn field<'a, V: AsRef<str>>(
    fields: &'a BTreeMap<&str, V>,
    name: &str,
    whose: &str,
    ex: &Example,
) -> &'a str {
    fields
        .get(name)
        .map(|v| v.as_ref())
        .unwrap_or_else(|| panic!("{}: {whose} has no {name:?}", ex.at()))
}

fn check_plan_block(ex: &Example) -> usize {
    let mut n = None;
    let mut active: Option<Vec<String>> = None;
    let mut lease_views: Option<Vec<LeaseView>> = None;
    let mut plans = Vec::new();
    for (name, value) in fields(ex) {
        match name.as_str() {
            "bucket count" => n = Some(num::<u32>(&value, ex, "bucket count")),
            "active relays" => {
                active = Some(value.split(',').map(|s| s.trim().to_string()).collect())
            }
            "leases" => lease_views = Some(leases(&value, ex)),
            relay => plans.push((relay.to_string(), value)),
        }
    }
    let n = n.unwrap_or_else(|| panic!("{}: no bucket count", ex.at()));
    let active = active.unwrap_or_else(|| panic!("{}: no active relays", ex.at()));
    let lease_views = lease_views.unwrap_or_else(|| panic!("{}: no leases", ex.at()));
    assert!(!plans.is_empty(), "{}: no plan", ex.at());
    let mut claimed = BTreeSet::new();
    for (me, line) in &plans {
        let owned = plan_fields(line, ex);
        let f: BTreeMap<&str, &str> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let whose = format!("the plan of {me}");
        let field = |name: &str| field(&f, name, &whose, ex);
        let p = plan::compute(&PlanInput {
            bucket_count: n,
            me,
            active_relays: &active,
            leases: &lease_views,
        });
        let what = format!("{}: the plan of {me}: {p:?}", ex.at());
        assert_eq!(p.share, num::<u32>(field("share"), ex, "share"), "{what}");
        let range = match field("range") {
            "empty" => None,
            r => {
                let b = buckets(r, ex);
                Some(b[0]..b[b.len() - 1] + 1)
            }
        };
        match range {
            None => assert!(p.range.is_empty(), "{what}: range"),
            Some(r) => assert_eq!(p.range, r, "{what}: range"),
        }
        assert_eq!(p.keep, buckets(field("keep"), ex), "{what}: keep");
        assert_eq!(p.release, buckets(field("release"), ex), "{what}: release");
        assert_eq!(p.claim, buckets(field("claim"), ex), "{what}: claim");
        let standby = f.get("standby").map(|s| num::<u32>(s, ex, "standby"));
        assert_eq!(p.standby_rank, standby, "{what}: standby rank");
        for b in &p.claim {
            assert!(
                claimed.insert(*b),
                "{}: bucket {b} claimed twice from one read",
                ex.at()
            );
        }
    }
    plans.len()
}

// ---- The other kinds ----

fn check_keys(ex: &Example) {
    let m = map(ex);
    let k = Keys::new(&OutboxOptions::new("orders-outbox").with_key_prefix(get(&m, ex, "prefix")));
    let bucket: u32 = num(get(&m, ex, "bucket"), ex, "bucket");
    let sequence: u64 = num(get(&m, ex, "first sequence number"), ex, "sequence");
    let at = ex.at();
    assert_eq!(k.message_pk(bucket), get(&m, ex, "message PK"), "{at}");
    assert_eq!(
        schema::message_sk(sequence),
        get(&m, ex, "message SK"),
        "{at}"
    );
    assert_eq!(k.sequence_pk(bucket), get(&m, ex, "counter PK"), "{at}");
    assert_eq!(k.coordination_pk(), get(&m, ex, "coordination PK"), "{at}");
    assert_eq!(schema::lease_sk(bucket), get(&m, ex, "lease SK"), "{at}");
    assert_eq!(
        schema::parse_lease_sk(get(&m, ex, "lease SK")),
        Some(bucket)
    );
    assert_eq!(
        schema::relay_sk(get(&m, ex, "relay id")),
        get(&m, ex, "heartbeat SK"),
        "{at}"
    );
    assert_eq!(
        schema::dead_letter_sk(bucket, sequence),
        get(&m, ex, "dead letter SK"),
        "{at}"
    );
    assert_eq!(k.message_bucket(get(&m, ex, "message PK")), Some(bucket));
}

fn check_ticks(ex: &Example) {
    let m = map(ex);
    let secs = unix_seconds_of(get(&m, ex, "UTC"));
    let t = if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    };
    assert_eq!(
        ticks_from_system_time(t),
        num::<i64>(get(&m, ex, "ticks"), ex, "ticks"),
        "{}",
        ex.at()
    );
}

fn check_lease_times(ex: &Example) {
    let mut duration = None;
    let mut now = None;
    let mut expires = None;
    let mut lapses = 0;
    for (name, value) in fields(ex) {
        match name.as_str() {
            "lease duration" => duration = Some(ticks(&value, ex)),
            "now" => now = Some(num::<i64>(&value, ex, "now")),
            "ExpiresAtUtc" => {
                let e = num::<i64>(&value, ex, "ExpiresAtUtc");
                let (d, n) = (duration.expect("duration first"), now.expect("now first"));
                assert_eq!(n + d, e, "{}: now + lease duration", ex.at());
                expires = Some(e);
            }
            other => {
                let offset = other
                    .strip_prefix("lapsed at now + ")
                    .unwrap_or_else(|| panic!("{}: unknown field {other:?}", ex.at()));
                let at = now.expect("now first") + ticks(offset, ex);
                let c = Coordination {
                    leases: vec![LeaseRecord {
                        bucket: 0,
                        owner: Some("a".into()),
                        expires_at: expires.expect("ExpiresAtUtc first"),
                        expiry_exact: true,
                    }],
                    relays: vec![],
                };
                assert_eq!(
                    c.lease_views(at)[0].lapsed,
                    yes_no(&value, ex),
                    "{}: {other}",
                    ex.at()
                );
                lapses += 1;
            }
        }
    }
    assert!(lapses >= 2, "{}: lapse cases", ex.at());
    assert_eq!(
        duration.map(|d| d == duration_to_ticks(RelayOptions::default().lease_duration)),
        Some(true),
        "{}: the example uses the default lease duration",
        ex.at()
    );
}

fn check_keyless(ex: &Example) {
    let m = map(ex);
    let id = Uuid::parse_str(get(&m, ex, "message id")).unwrap();
    let bytes = id.to_bytes_le();
    let at = ex.at();
    assert_eq!(hex(&bytes), get(&m, ex, "id bytes"), "{at}");
    let h = murmur2(&bytes);
    assert_eq!(h, num::<i32>(get(&m, ex, "murmur2"), ex, "murmur2"), "{at}");
    assert_eq!(
        format!("{:#010x}", h as u32),
        get(&m, ex, "murmur2 (hex)"),
        "{at}"
    );
    assert_eq!(
        to_positive(h),
        num::<u32>(get(&m, ex, "toPositive"), ex, "toPositive")
    );
    let count: u32 = num(get(&m, ex, "bucket count"), ex, "bucket count");
    assert_eq!(
        compute_bucket(None, None, &id, count),
        num::<u32>(get(&m, ex, "bucket"), ex, "bucket"),
        "{at}"
    );
}

/// The publisher's routing type is private to the crate, so the keyed rule is checked
/// through the library's `murmur2` / `to_positive`, and the explicit-partition rule
/// against the line of `partition_for` that refuses a partition the topic lacks.
fn check_kafka_partition(ex: &Example) {
    let m = map(ex);
    let key = get(&m, ex, "key (UTF-8)").as_bytes();
    let count: u32 = num(get(&m, ex, "partition count"), ex, "partition count");
    let explicit = m
        .get("explicit partition")
        .map(|p| num::<i32>(p, ex, "explicit partition"));
    let expected = match explicit {
        Some(p) if p as u32 >= count => None,
        Some(p) => Some(p as u32),
        None => Some(to_positive(murmur2(key)) % count),
    };
    let documented = match get(&m, ex, "partition") {
        "refused" => None,
        p => Some(num::<u32>(p, ex, "partition")),
    };
    assert_eq!(documented, expected, "{}", ex.at());
    if explicit.is_none() {
        // The library's own partitioner gives the documented partition.
        assert_eq!(
            Some(dynamo_outbox::publish::partition_for(key, count) as u32),
            expected,
            "{}",
            ex.at()
        );
    }
    assert!(
        ROUTE_RS.contains("(None, Some(key)) => Ok(partition_for(key, count)),")
            && ROUTE_RS
                .contains("(Some(p), _) if p as u32 >= count => Err(Rejection::UnknownPartition),"),
        "lib/src/publish/route.rs no longer routes as docs/protocol.md says"
    );
}

fn check_header_blobs(ex: &Example) -> usize {
    let mut n = 0;
    for (blob, result) in fields(ex) {
        let bytes = if blob == "(no bytes)" {
            Vec::new()
        } else {
            unhex(&blob, ex)
        };
        let decoded = headers::decode(&bytes);
        let what = format!("{}: {blob} gives {decoded:?}", ex.at());
        match result.strip_prefix("refused, ") {
            Some(label) => {
                let e = decoded.expect_err(&what);
                let actual = match e {
                    HeaderError::Empty => "empty",
                    HeaderError::UnknownVersion(_) => "unknown version",
                    HeaderError::NegativeCount(_) => "negative count",
                    HeaderError::CountTooLarge { .. } => "count too large",
                    HeaderError::Truncated { .. } => "truncated",
                    HeaderError::BadLength { .. } => "bad length",
                    HeaderError::InvalidKey { .. } => "invalid key",
                    HeaderError::TrailingBytes(_) => "trailing bytes",
                    _ => "another error",
                };
                assert_eq!(actual, label, "{what}");
            }
            None => {
                let count = result
                    .strip_suffix(" headers")
                    .or_else(|| result.strip_suffix(" header"))
                    .unwrap_or_else(|| panic!("{}: result {result:?}", ex.at()));
                let list = decoded.expect(&what);
                assert_eq!(list.len(), num::<usize>(count, ex, "count"), "{what}");
                if !list.is_empty() {
                    // What a reader accepts, a writer writes the same way.
                    assert_eq!(headers::encode(&list).unwrap(), Some(bytes), "{what}");
                }
            }
        }
        n += 1;
    }
    n
}

fn check_heartbeats(ex: &Example) -> usize {
    let mut lease = None;
    let mut records = Vec::new();
    for (name, value) in fields(ex) {
        if name == "lease duration" {
            lease = Some(ticks(&value, ex));
            continue;
        }
        let f: BTreeMap<&str, &str> = value
            .split(';')
            .map(|part| {
                let part = part.trim();
                let (k, v) = part
                    .rsplit_once(' ')
                    .unwrap_or_else(|| panic!("{}: {part:?}", ex.at()));
                (k, v)
            })
            .collect();
        let field = |k: &str| field(&f, k, &name, ex);
        let last_seen = NOW + ticks(field("last seen"), ex);
        let stopped_at = match field("stopped") {
            "none" => None,
            t => Some(NOW + ticks(t, ex)),
        };
        records.push((
            RelayRecord {
                relay_id: name.clone(),
                last_seen,
                stopped_at,
                stops_at: None,
                delivery: None,
            },
            yes_no(field("active"), ex),
            yes_no(field("stale"), ex),
        ));
    }
    let lease = lease.unwrap_or_else(|| panic!("{}: no lease duration", ex.at()));
    assert_eq!(
        lease,
        duration_to_ticks(RelayOptions::default().lease_duration),
        "{}: the example uses the default lease duration",
        ex.at()
    );
    for (r, active, stale) in &records {
        assert_eq!(
            r.is_active(NOW, lease),
            *active,
            "{}: {r:?} active",
            ex.at()
        );
        assert_eq!(r.is_stale(NOW, lease), *stale, "{}: {r:?} stale", ex.at());
    }
    // The same through a read of the coordination partition.
    let c = Coordination {
        leases: vec![],
        relays: records.iter().map(|(r, _, _)| r.clone()).collect(),
    };
    let expected: Vec<String> = records
        .iter()
        .filter(|(_, active, _)| *active)
        .map(|(r, _, _)| r.relay_id.clone())
        .collect();
    assert_eq!(c.active_relays(NOW, lease), expected, "{}", ex.at());
    records.len()
}

/// Compares one constant; returns false for a name the test does not know.
fn check_constant(name: &str, value: &str, ex: &Example) -> bool {
    let relay = RelayOptions::default();
    let outbox = OutboxOptions::new("orders-outbox");
    let duration = |d: Duration| {
        assert_eq!(
            duration_to_ticks(d),
            ticks(value, ex),
            "{}: {name}",
            ex.at()
        );
    };
    let number = |actual: u64| {
        assert_eq!(actual, num::<u64>(value, ex, name), "{}: {name}", ex.at());
    };
    let text = |actual: &str| assert_eq!(actual, value, "{}: {name}", ex.at());
    let source = |file: &str, path: &str, line: String| {
        assert!(
            file.contains(&line),
            "{}: {name} is {value}, but {path} no longer has `{line}`",
            ex.at()
        );
    };
    match name {
        "RelayOptions.lease_duration" => duration(relay.lease_duration),
        "RelayOptions.lease_renew_interval" => duration(relay.lease_renew_interval),
        "RelayOptions.poll_interval" => duration(relay.poll_interval),
        "RelayOptions.error_backoff" => duration(relay.error_backoff),
        "RelayOptions.batch_size" => number(relay.batch_size.into()),
        "RelayOptions.bucket_count" => number(relay.bucket_count.into()),
        "OutboxOptions.bucket_count" => number(outbox.bucket_count.into()),
        "OutboxOptions.key_prefix" => text(&outbox.key_prefix),
        "OutboxOptions.partition_key_attribute" => text(&outbox.partition_key_attribute),
        "OutboxOptions.sort_key_attribute" => text(&outbox.sort_key_attribute),
        "OutboxOptions.max_concurrency" => number(outbox.max_concurrency as u64),
        "largest bucket count" => {
            let largest: u32 = num(value, ex, name);
            assert!(outbox.clone().with_bucket_count(largest).validate().is_ok());
            assert!(
                outbox
                    .clone()
                    .with_bucket_count(largest + 1)
                    .validate()
                    .is_err(),
                "{}: a bucket count above {largest} is accepted",
                ex.at()
            );
        }
        "options::MAX_RELAY_ID_LEN" => number(dynamo_outbox::options::MAX_RELAY_ID_LEN as u64),
        "clock::UNIX_EPOCH_TICKS" => {
            assert_eq!(clock::UNIX_EPOCH_TICKS, num::<i64>(value, ex, name));
            assert_eq!(ticks_from_system_time(UNIX_EPOCH), clock::UNIX_EPOCH_TICKS);
        }
        "clock::TICKS_PER_SECOND" => {
            assert_eq!(clock::TICKS_PER_SECOND, num::<i64>(value, ex, name));
            assert_eq!(
                duration_to_ticks(Duration::from_secs(1)),
                clock::TICKS_PER_SECOND
            );
        }
        "headers::FORMAT_VERSION" => number(headers::FORMAT_VERSION.into()),
        "publish::DEFAULT_MESSAGE_ID_HEADER" => {
            text(dynamo_outbox::publish::DEFAULT_MESSAGE_ID_HEADER)
        }
        "relay::JOIN_DELAY" => duration(dynamo_outbox::relay::JOIN_DELAY),
        "coordination::ALONE_JOIN_DELAY" => {
            duration(dynamo_outbox::protocol::coordination::ALONE_JOIN_DELAY)
        }
        "relay::DEFAULT_STOP_RESERVE" => duration(dynamo_outbox::relay::DEFAULT_STOP_RESERVE),
        "relay::BACKLOG_SAMPLE_INTERVAL" => duration(dynamo_outbox::relay::BACKLOG_SAMPLE_INTERVAL),
        "coordination::HANDOVER_STEP" => {
            duration(coordination::HANDOVER_STEP);
            assert_eq!(
                dynamo_outbox::protocol::coordination::HANDOVER_STEP,
                coordination::HANDOVER_STEP
            );
        }
        "coordination::HANDOVER_WATCH" => {
            duration(coordination::HANDOVER_WATCH);
            assert_eq!(
                dynamo_outbox::protocol::coordination::HANDOVER_WATCH,
                coordination::HANDOVER_WATCH
            );
        }
        "coordination::ROUND_WINDOW" => duration(coordination::ROUND_WINDOW),
        "store::MAX_GAP_PROBES" => number(dynamo_outbox::protocol::store::MAX_GAP_PROBES as u64),
        "store::MAX_REFETCHES" => number(dynamo_outbox::protocol::store::MAX_REFETCHES.into()),
        "deletes per BatchWriteItem" => source(
            DELETE_RS,
            "lib/src/protocol/store/delete.rs",
            format!("const CHUNK: usize = {value};"),
        ),
        "release passes of a graceful stop" => source(
            STOP_RS,
            "lib/src/relay/graceful_stop.rs",
            format!("for _ in 0..{value} {{"),
        ),
        "silent heartbeat removed after (lease durations)" => {
            let factor: i64 = num(value, ex, name);
            let lease = duration_to_ticks(relay.lease_duration);
            let silent = |ago: i64| RelayRecord {
                relay_id: "r".into(),
                last_seen: NOW - ago,
                stopped_at: None,
                stops_at: None,
                delivery: None,
            };
            assert!(silent(factor * lease).is_stale(NOW, lease), "{}", ex.at());
            assert!(
                !silent(factor * lease - 1).is_stale(NOW, lease),
                "{}",
                ex.at()
            );
        }
        "far-back standby skips while its heartbeat stays younger than (of the lease duration)" => {
            let (a, b) = value
                .split_once('/')
                .unwrap_or_else(|| panic!("{}: {name}: a fraction", ex.at()));
            source(
                STATE_RS,
                "lib/src/relay/state.rs",
                format!("options.lease_duration * {a} / {b}"),
            );
        }
        _ => return false,
    }
    true
}

const CONSTANTS: [&str; 30] = [
    "RelayOptions.lease_duration",
    "RelayOptions.lease_renew_interval",
    "RelayOptions.poll_interval",
    "RelayOptions.error_backoff",
    "RelayOptions.batch_size",
    "RelayOptions.bucket_count",
    "OutboxOptions.bucket_count",
    "OutboxOptions.key_prefix",
    "OutboxOptions.partition_key_attribute",
    "OutboxOptions.sort_key_attribute",
    "OutboxOptions.max_concurrency",
    "largest bucket count",
    "options::MAX_RELAY_ID_LEN",
    "clock::UNIX_EPOCH_TICKS",
    "clock::TICKS_PER_SECOND",
    "headers::FORMAT_VERSION",
    "publish::DEFAULT_MESSAGE_ID_HEADER",
    "relay::JOIN_DELAY",
    "coordination::ALONE_JOIN_DELAY",
    "relay::DEFAULT_STOP_RESERVE",
    "relay::BACKLOG_SAMPLE_INTERVAL",
    "coordination::HANDOVER_STEP",
    "coordination::HANDOVER_WATCH",
    "coordination::ROUND_WINDOW",
    "store::MAX_GAP_PROBES",
    "store::MAX_REFETCHES",
    "deletes per BatchWriteItem",
    "release passes of a graceful stop",
    "silent heartbeat removed after (lease durations)",
    "far-back standby skips while its heartbeat stays younger than (of the lease duration)",
];

fn check_constants(ex: &Example) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (name, value) in fields(ex) {
        assert!(
            check_constant(&name, &value, ex),
            "{}: unknown constant {name:?}",
            ex.at()
        );
        assert!(seen.insert(name.clone()), "{}: {name} twice", ex.at());
    }
    seen
}

#[test]
fn worked_examples_match_the_code() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut constants = BTreeSet::new();
    for ex in example_blocks(DOC, "docs/protocol.md") {
        let count = match ex.kind.as_str() {
            "plan" => check_plan_block(&ex),
            "keys" => {
                check_keys(&ex);
                1
            }
            "ticks" => {
                check_ticks(&ex);
                1
            }
            "lease-times" => {
                check_lease_times(&ex);
                1
            }
            "keyless" => {
                check_keyless(&ex);
                1
            }
            "kafka-partition" => {
                check_kafka_partition(&ex);
                1
            }
            "header-blobs" => check_header_blobs(&ex),
            "heartbeats" => check_heartbeats(&ex),
            "constants" => {
                constants.extend(check_constants(&ex));
                1
            }
            other => panic!("{}: unknown example kind {other}", ex.at()),
        };
        *seen.entry(ex.kind.clone()).or_default() += count;
    }
    // At least this many of each kind (plan lines, blob lines, heartbeat lines): an
    // example that disappears from the document fails here.
    let expected = [
        ("plan", 43),
        ("keys", 1),
        ("ticks", 1),
        ("lease-times", 1),
        ("keyless", 1),
        ("kafka-partition", 4),
        ("header-blobs", 12),
        ("heartbeats", 9),
        ("constants", 1),
    ];
    for (kind, n) in expected {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= n,
            "docs/protocol.md lost some of its {kind} examples: {seen:?}"
        );
    }
    for name in CONSTANTS {
        assert!(
            constants.contains(name),
            "docs/protocol.md no longer states {name}"
        );
    }
}

/// Every `module::CONSTANT` the prose names in backticks is in the constants block, so
/// none goes unchecked.
#[test]
fn constants_named_in_the_prose_are_checked() {
    let block: BTreeSet<String> = example_blocks(DOC, "docs/protocol.md")
        .iter()
        .filter(|ex| ex.kind == "constants")
        .flat_map(|ex| fields(ex).into_iter().map(|(name, _)| name))
        .collect();
    let mut named = BTreeSet::new();
    for (i, span) in prose().split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let Some((module, constant)) = span.rsplit_once("::") else {
            continue;
        };
        let is_constant = !constant.is_empty()
            && constant
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        let module = module.rsplit("::").next().unwrap_or(module);
        if is_constant && module.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            named.insert(format!("{module}::{constant}"));
        }
    }
    assert!(!named.is_empty(), "the prose names no constant");
    for name in &named {
        assert!(
            block.contains(name),
            "docs/protocol.md names `{name}` but its constants block does not state it"
        );
    }
}

/// The document without its fenced blocks.
fn prose() -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in DOC.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
