//! `outboxctl relay` outside Lambda: its OpenTelemetry metrics and publish spans received by
//! a real OTLP/HTTP receiver (a small one in this test: it decodes each
//! `ExportMetricsServiceRequest` and `ExportTraceServiceRequest` with opentelemetry-proto's
//! types, as a collector does), and its health endpoint answering probes, with the relay
//! binary publishing messages on the local stack. Run through scripts/stack.sh; never
//! skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use dynamo_outbox::{DynamoDbOutboxWriter, TraceContext};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use outbox_testkit::otlp::OtlpReceiver;
use outbox_testkit::*;
use prost::Message as _;

/// Every metrics request the receiver got: path, content type, authorization header,
/// decoded body.
type Exports = Vec<(String, String, String, ExportMetricsServiceRequest)>;

fn metrics_exports(receiver: &OtlpReceiver) -> Exports {
    receiver
        .metrics_requests()
        .into_iter()
        .map(|r| {
            let decoded = ExportMetricsServiceRequest::decode(r.body.as_slice())
                .expect("the body is an ExportMetricsServiceRequest");
            (r.path, r.content_type, r.authorization, decoded)
        })
        .collect()
}

/// Every traces request the receiver got (`/v1/traces`): content type, authorization
/// header, decoded body.
fn trace_exports(receiver: &OtlpReceiver) -> Vec<(String, String, ExportTraceServiceRequest)> {
    receiver
        .trace_requests()
        .into_iter()
        .map(|r| {
            let decoded = ExportTraceServiceRequest::decode(r.body.as_slice())
                .expect("the body is an ExportTraceServiceRequest");
            (r.content_type, r.authorization, decoded)
        })
        .collect()
}

/// One HTTP GET: status and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the health endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_string();
    (status, body)
}

fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    })
}

/// The metrics of one export by name, with the export's resource attributes.
fn metrics_of(request: &ExportMetricsServiceRequest) -> BTreeMap<String, Metric> {
    let mut out = BTreeMap::new();
    for rm in &request.resource_metrics {
        for sm in &rm.scope_metrics {
            let scope = sm.scope.as_ref().map(|s| s.name.as_str()).unwrap_or("");
            assert_eq!(scope, "Dekaf.Outbox", "the reference's meter name");
            for m in &sm.metrics {
                out.insert(m.name.clone(), m.clone());
            }
        }
    }
    out
}

/// The value of a counter or gauge's single data point (as f64), after checking that the
/// point's only attribute is `outbox.name` = `name`.
fn point_value(m: &Metric, name: &str) -> f64 {
    let points = match m.data.as_ref().unwrap() {
        metric::Data::Sum(s) => &s.data_points,
        metric::Data::Gauge(g) => &g.data_points,
        other => panic!("{}: not a number metric: {other:?}", m.name),
    };
    assert_eq!(points.len(), 1, "{}: one series per outbox", m.name);
    let p = &points[0];
    assert_eq!(p.attributes.len(), 1, "{}: {:?}", m.name, p.attributes);
    assert_eq!(
        string_attr(&p.attributes, "outbox.name").as_deref(),
        Some(name)
    );
    match p.value.unwrap() {
        number_data_point::Value::AsInt(v) => v as f64,
        number_data_point::Value::AsDouble(v) => v,
    }
}

/// `line` without terminal colour codes (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn wait_for_line(lines: &mpsc::Receiver<String>, what: &str, timeout: Duration) -> String {
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(what) => return line,
            Ok(_) => {}
            Err(_) => panic!("no stderr line with {what:?} within {timeout:?}"),
        }
    }
}

fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out after {timeout:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A relay started by [`start_relay`]: the process (killed when dropped), its log lines as
/// they come, every line so far, and its stdout (the run's summary once it exits).
struct RunningRelay {
    process: Relay,
    lines: mpsc::Receiver<String>,
    log: Arc<Mutex<Vec<String>>>,
    stdout: std::process::ChildStdout,
}

/// A table of four buckets and a topic of two partitions with 30 messages enqueued (in two
/// transactions), and their ids; every third one carries a trace context (by id).
async fn thirty_messages() -> (
    dynamo_outbox::OutboxOptions,
    String,
    BTreeSet<String>,
    BTreeMap<String, TraceContext>,
) {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("otel");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut traced = BTreeMap::new();
    let messages: Vec<_> = (0..30)
        .map(|i| {
            let m = writer
                .message(topic.as_str())
                .with_key(format!("k{}", i % 7))
                .with_value(format!("m{i}"));
            if i % 3 != 0 {
                return m;
            }
            let context = TraceContext::parse(
                "traceparent",
                &format!("00-4bf92f3577b34da6a3ce929d0e0e{i:04x}-00f067aa0ba9{i:04x}-01"),
                None,
            )
            .unwrap();
            traced.insert(m.message_id.to_string(), context.clone());
            m.with_trace_context(&context)
        })
        .collect();
    writer.enqueue(&messages[..20]).await.unwrap();
    writer.enqueue(&messages[20..]).await.unwrap();
    (options, topic, id_set(&messages), traced)
}

/// `outboxctl relay` over the table of `options`, exporting to `endpoint` every 500 ms
/// with `token` in its OTLP headers, logging at trace, with its health endpoint on a free
/// port; `overrides` last (they win).
fn start_relay(
    options: &dynamo_outbox::OutboxOptions,
    endpoint: &str,
    relay_id: &str,
    token: &str,
    overrides: &[(&str, &str)],
) -> RunningRelay {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args([
            "relay",
            "--table",
            &options.table_name,
            "--bucket-count",
            "4",
            "--health-listen",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "trace")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("authorization=Bearer {token}"),
        )
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .env("OTEL_SERVICE_NAME", "orders-relay")
        .env("OUTBOX_METRICS_NAME", "orders")
        .env("OUTBOX_RELAY_ID", relay_id)
        .env("OUTBOX_LEASE_DURATION", "3s")
        .env("OUTBOX_LEASE_RENEW_INTERVAL", "1s")
        .env("OUTBOX_POLL_INTERVAL", "100ms")
        .envs(overrides.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outboxctl relay");
    let stderr = child.stderr.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    RunningRelay {
        process: Relay(child),
        lines,
        log,
        stdout,
    }
}

/// The health endpoint (its address from the log: port 0 picked a free one) answers
/// `/healthz`, then `/readyz` once the relay is ready, and 404 elsewhere; its address.
fn assert_health_probes(lines: &mpsc::Receiver<String>) -> String {
    let line = wait_for_line(lines, "health endpoint listening", Duration::from_secs(60));
    let addr = strip_ansi(&line)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("the log line names the address: {line:?}"))
        .to_string();
    let (status, body) = get(&addr, "/healthz");
    assert_eq!(status, 200, "{body}");
    let (status, body) = wait_until("the relay is ready", Duration::from_secs(60), || {
        let (s, b) = get(&addr, "/readyz");
        (s == 200).then_some((s, b))
    });
    assert!(body.starts_with("ready: "), "{status} {body}");
    assert_eq!(get(&addr, "/nothing-here").0, 404);
    addr
}

/// Every message in Kafka (none foreign), then an export that counted every one of them
/// and one with a backlog sample.
async fn wait_for_the_exports(topic: &str, written: &BTreeSet<String>, receiver: &OtlpReceiver) {
    let read = tokio::task::spawn_blocking({
        let (topic, written) = (topic.to_string(), written.clone());
        move || {
            wait_until("every message in Kafka", Duration::from_secs(90), || {
                let d = topic_deliveries(&topic);
                d.missing(&written).is_empty().then_some(d)
            })
        }
    })
    .await
    .unwrap();
    assert!(read.unexpected(written).is_empty());
    let acknowledged = |r: &ExportMetricsServiceRequest| {
        metrics_of(r)
            .get("dekaf.outbox.publish.acknowledged")
            .map(|m| point_value(m, "orders"))
    };
    wait_until(
        "an export with publish.acknowledged = 30",
        Duration::from_secs(60),
        || {
            metrics_exports(receiver)
                .iter()
                .any(|(_, _, _, r)| acknowledged(r) == Some(30.0))
                .then_some(())
        },
    );
    // The owner of bucket zero samples the backlog from its second round on (1 s here).
    wait_until(
        "an export with a backlog sample",
        Duration::from_secs(60),
        || {
            metrics_exports(receiver)
                .iter()
                .any(|(_, _, _, r)| metrics_of(r).contains_key("dekaf.outbox.pending.messages"))
                .then_some(())
        },
    );
}

/// Stops the relay with SIGTERM: it exits with success, says it published 30, and no
/// export failed or was refused; its log.
/// Sends the relay SIGTERM and waits for it to exit: its exit status, how long it took
/// from the signal, its stdout and its log.
fn terminate(relay: RunningRelay) -> (std::process::ExitStatus, Duration, String, String) {
    let RunningRelay {
        mut process,
        log,
        stdout,
        ..
    } = relay;
    let pid = process.0.id().to_string();
    let signalled = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exit = wait_until("the relay exits", Duration::from_secs(60), || {
        process.0.try_wait().unwrap()
    });
    let took = signalled.elapsed();
    let mut out = String::new();
    BufReader::new(stdout).read_to_string(&mut out).unwrap();
    let logs = log.lock().unwrap().join("\n");
    (exit, took, out, logs)
}

fn stop_gracefully(relay: RunningRelay) -> String {
    let (exit, _, out, logs) = terminate(relay);
    assert!(exit.success(), "{exit:?}\n{out}\n{logs}");
    assert!(out.contains("published 30,"), "{out}");
    assert!(
        !logs.contains("export failed") && !logs.contains("export refused"),
        "{logs}"
    );
    logs
}

/// Periodic exports and the final one, each an OTLP/HTTP protobuf POST with the header's
/// token, which is never logged (the export client's trace logs are on); the resource
/// names the service and the relay.
fn assert_exports_and_resource(
    got: &[(String, String, String, ExportMetricsServiceRequest)],
    token: &str,
    logs: &str,
    relay_id: &str,
) {
    assert!(
        got.len() >= 2,
        "periodic exports and the final one: {}",
        got.len()
    );
    for (path, content_type, authorization, _) in got.iter() {
        assert_eq!(path, "/v1/metrics");
        assert_eq!(content_type, "application/x-protobuf");
        assert_eq!(
            authorization,
            &format!("Bearer {token}"),
            "OTEL_EXPORTER_OTLP_HEADERS"
        );
    }
    assert!(
        logs.contains("hyper_util::client"),
        "trace logs of the export's HTTP client are on"
    );
    assert!(
        !logs.contains(token),
        "the header's token is never logged, even at trace"
    );
    let (_, _, _, last) = got.last().unwrap();
    let resource = last.resource_metrics[0].resource.as_ref().unwrap();
    assert_eq!(
        string_attr(&resource.attributes, "service.name").as_deref(),
        Some("orders-relay")
    );
    assert_eq!(
        string_attr(&resource.attributes, "service.instance.id").as_deref(),
        Some(relay_id)
    );
}

/// Every instrument over the run (the backlog gauges only while the relay owned bucket
/// zero and had sampled it), the latest point of each: the reference's instruments and this
/// project's `dekaf.outbox.poison.quarantined`, no others.
fn assert_instrument_names(metrics: &BTreeMap<String, Metric>) {
    let names: BTreeSet<&str> = metrics.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = dynamo_outbox::metrics::otel::INSTRUMENT_NAMES
        .into_iter()
        .collect();
    assert_eq!(
        names, expected,
        "the reference's instruments, the quarantine counter and the commit-to-ack histogram, no others"
    );
    for name in [
        "dekaf.outbox.pending.messages",
        "dekaf.outbox.pending.oldest_age",
        "dekaf.outbox.owned_buckets",
        "dekaf.outbox.publish.acknowledged",
        "dekaf.outbox.publish.failures",
        "dekaf.outbox.publish.duration",
        "dekaf.outbox.lease.expirations",
        "dekaf.outbox.cycle.duration",
    ] {
        assert!(names.contains(name), "{name} in {names:?}");
    }
}

/// Counters and gauges of the kinds and units the reference declares; the counters' last
/// values (30 acknowledged, no failure, no lease expired).
fn assert_counters_and_gauges(metrics: &BTreeMap<String, Metric>) {
    let unit = |n: &str| metrics[n].unit.as_str();
    for (name, u) in [
        ("dekaf.outbox.publish.acknowledged", "{message}"),
        ("dekaf.outbox.publish.failures", "{attempt}"),
        ("dekaf.outbox.lease.expirations", "{event}"),
    ] {
        assert_eq!(unit(name), u, "{name}");
        match metrics[name].data.as_ref().unwrap() {
            metric::Data::Sum(s) => assert!(s.is_monotonic, "{name} is a counter"),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(
        point_value(&metrics["dekaf.outbox.publish.acknowledged"], "orders"),
        30.0
    );
    assert_eq!(
        point_value(&metrics["dekaf.outbox.publish.failures"], "orders"),
        0.0
    );
    assert_eq!(
        point_value(&metrics["dekaf.outbox.lease.expirations"], "orders"),
        0.0
    );
    for (name, u) in [
        ("dekaf.outbox.owned_buckets", "{bucket}"),
        ("dekaf.outbox.pending.messages", "{message}"),
        ("dekaf.outbox.pending.oldest_age", "s"),
        ("dekaf.outbox.pending.available", "1"),
    ] {
        assert_eq!(unit(name), u, "{name}");
        assert!(
            matches!(metrics[name].data, Some(metric::Data::Gauge(_))),
            "{name} is a gauge"
        );
    }
}

/// The relay owned every bucket (bucket zero among them: it sampled the backlog); while it
/// owned bucket zero it had a backlog sample; stopped, it released every bucket, and its
/// last export says it has none (the next owner reports it).
fn assert_ownership_and_backlog(got: &[(String, String, String, ExportMetricsServiceRequest)]) {
    let owned_seen = got.iter().any(|(_, _, _, r)| {
        metrics_of(r)
            .get("dekaf.outbox.owned_buckets")
            .is_some_and(|m| point_value(m, "orders") == 4.0)
    });
    assert!(owned_seen, "owned_buckets reported 4");
    let sampled = got
        .iter()
        .map(|(_, _, _, r)| metrics_of(r))
        .find(|m| m.contains_key("dekaf.outbox.pending.messages"))
        .expect("an export with a backlog sample");
    assert_eq!(
        point_value(&sampled["dekaf.outbox.pending.available"], "orders"),
        1.0
    );
    let pending = point_value(&sampled["dekaf.outbox.pending.messages"], "orders");
    assert!((0.0..=30.0).contains(&pending), "{pending}");
    let age = point_value(&sampled["dekaf.outbox.pending.oldest_age"], "orders");
    assert!((0.0..600.0).contains(&age), "seconds: {age}");
    let last = metrics_of(&got.last().unwrap().3);
    assert_eq!(
        point_value(&last["dekaf.outbox.pending.available"], "orders"),
        0.0
    );
    assert!(!last.contains_key("dekaf.outbox.pending.messages"));
    assert_eq!(
        point_value(&last["dekaf.outbox.owned_buckets"], "orders"),
        0.0
    );
    assert_eq!(
        point_value(&last["dekaf.outbox.publish.acknowledged"], "orders"),
        30.0
    );
}

/// The histograms: seconds (not milliseconds), one point each, named by `outbox.name`; the
/// commit-to-ack histogram counts every published message.
fn assert_histograms(metrics: &BTreeMap<String, Metric>) {
    for name in [
        "dekaf.outbox.publish.duration",
        "dekaf.outbox.cycle.duration",
    ] {
        assert_eq!(metrics[name].unit.as_str(), "s", "{name}");
        let Some(metric::Data::Histogram(h)) = &metrics[name].data else {
            panic!("{name} is a histogram");
        };
        assert_eq!(h.data_points.len(), 1);
        let p = &h.data_points[0];
        assert!(p.count >= 1, "{name}: {}", p.count);
        assert_eq!(
            string_attr(&p.attributes, "outbox.name").as_deref(),
            Some("orders")
        );
        assert!(
            p.sum.unwrap() / (p.count as f64) < 30.0,
            "{name}: seconds, not milliseconds"
        );
    }
    // Commit to ack: one value per acknowledged message (cumulative: the last point counts
    // all 30), in seconds, each between the commit and now.
    let name = dynamo_outbox::metrics::otel::COMMIT_TO_ACK;
    assert_eq!(metrics[name].unit.as_str(), "s", "{name}");
    let Some(metric::Data::Histogram(h)) = &metrics[name].data else {
        panic!("{name} is a histogram");
    };
    assert_eq!(h.data_points.len(), 1);
    let p = &h.data_points[0];
    assert_eq!(p.count, 30, "{name}: one value per published message");
    assert_eq!(
        string_attr(&p.attributes, "outbox.name").as_deref(),
        Some("orders")
    );
    assert_eq!(
        p.explicit_bounds,
        dynamo_outbox::metrics::otel::LATENCY_BOUNDARIES.to_vec()
    );
    let (min, max) = (p.min.unwrap(), p.max.unwrap());
    assert!(
        0.0 <= min && min <= max && max < 120.0,
        "{name}: seconds from commit to ack: {min}..{max}"
    );
}

fn attr<'a>(
    attrs: &'a [KeyValue],
    key: &str,
) -> Option<&'a opentelemetry_proto::tonic::common::v1::any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        any_value::Value::IntValue(v) => Some(*v),
        _ => None,
    }
}

/// The publish spans (one per produce request, OpenTelemetry's messaging conventions):
/// every message id on one of them; a link to each traced message's context carrying its
/// id and its offset in Kafka, on the span of its partition; no link for the others.
fn assert_publish_spans(
    traces: &[(String, String, ExportTraceServiceRequest)],
    token: &str,
    topic: &str,
    written: &BTreeSet<String>,
    traced: &BTreeMap<String, TraceContext>,
) {
    let mut spans: Vec<Span> = Vec::new();
    for (content_type, authorization, request) in traces {
        assert_eq!(content_type, "application/x-protobuf");
        assert_eq!(
            authorization,
            &format!("Bearer {token}"),
            "OTEL_EXPORTER_OTLP_HEADERS"
        );
        for rs in &request.resource_spans {
            let resource = rs.resource.as_ref().unwrap();
            assert_eq!(
                string_attr(&resource.attributes, "service.name").as_deref(),
                Some("orders-relay")
            );
            for ss in &rs.scope_spans {
                assert_eq!(ss.scope.as_ref().unwrap().name, "dynamo-outbox");
                spans.extend(ss.spans.iter().cloned());
            }
        }
    }
    assert!(!spans.is_empty(), "the relay exported publish spans");
    // Kafka's own account: each message's partition and offset.
    let placed: BTreeMap<String, (i32, i64)> = read_topic(topic)
        .iter()
        .map(|r| (r.message_id().unwrap(), (r.partition, r.offset)))
        .collect();
    let mut ids_on_spans = BTreeSet::new();
    let mut links: BTreeMap<String, (Vec<u8>, Vec<u8>, i64, String)> = BTreeMap::new();
    for span in &spans {
        assert_eq!(span.name, format!("send {topic}"));
        assert_eq!(span.kind, SpanKind::Producer as i32, "{}", span.name);
        assert!(span.parent_span_id.is_empty(), "a root span");
        let a = &span.attributes;
        assert_eq!(string_attr(a, "messaging.system").as_deref(), Some("kafka"));
        assert_eq!(
            string_attr(a, "messaging.operation.type").as_deref(),
            Some("send")
        );
        assert_eq!(
            string_attr(a, "messaging.destination.name").as_deref(),
            Some(topic)
        );
        let partition = string_attr(a, "messaging.destination.partition.id").unwrap();
        let Some(any_value::Value::ArrayValue(ids)) = attr(a, "outbox.message.ids") else {
            panic!("outbox.message.ids on {span:?}");
        };
        let ids: Vec<String> = ids
            .values
            .iter()
            .map(|v| match v.value.as_ref() {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        match ids.as_slice() {
            [one] => assert_eq!(string_attr(a, "messaging.message.id").as_ref(), Some(one)),
            many => assert_eq!(
                int_attr(a, "messaging.batch.message_count"),
                Some(many.len() as i64)
            ),
        }
        // The first record's offset, as Kafka placed it.
        let first = &placed[&ids[0]];
        assert_eq!(first.0.to_string(), partition);
        assert_eq!(int_attr(a, "messaging.kafka.offset"), Some(first.1));
        ids_on_spans.extend(ids.iter().cloned());
        for link in &span.links {
            let id = string_attr(&link.attributes, "messaging.message.id")
                .unwrap_or_else(|| panic!("a link names its message id: {link:?}"));
            assert!(ids.contains(&id), "a link of this request's message: {id}");
            let offset = int_attr(&link.attributes, "messaging.kafka.offset")
                .unwrap_or_else(|| panic!("a link carries its message's offset: {link:?}"));
            links.insert(
                id,
                (
                    link.trace_id.clone(),
                    link.span_id.clone(),
                    offset,
                    partition.clone(),
                ),
            );
        }
    }
    assert!(
        written.is_subset(&ids_on_spans),
        "every message id is on a publish span: missing {:?}",
        written.difference(&ids_on_spans).collect::<Vec<_>>()
    );
    let linked: BTreeSet<&String> = links.keys().collect();
    assert_eq!(
        linked,
        traced.keys().collect::<BTreeSet<_>>(),
        "a link for each message with a trace context, none for the others"
    );
    for (id, context) in traced {
        let (trace_id, span_id, offset, partition) = &links[id];
        assert_eq!(
            trace_id,
            &context.trace_id().to_vec(),
            "{id}: the writer's trace"
        );
        assert_eq!(
            span_id,
            &context.parent_id().to_vec(),
            "{id}: the writer's span"
        );
        let (p, o) = placed[id];
        assert_eq!((p.to_string(), o), (partition.clone(), *offset), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_exports_the_reference_instruments_over_otlp_and_answers_health_probes() {
    let (options, topic, written, traced) = thirty_messages().await;
    let receiver = OtlpReceiver::start();
    let endpoint = receiver.endpoint.clone();
    let relay_id = random_name("otel-relay");
    let token = random_name("token");
    let relay = start_relay(&options, &endpoint, &relay_id, &token, &[]);
    let addr = assert_health_probes(&relay.lines);
    wait_for_the_exports(&topic, &written, &receiver).await;
    let (status, body) = get(&addr, "/readyz");
    assert_eq!(status, 200, "still ready after publishing: {body}");

    // A graceful stop: the last export after it still says 30, and so does the relay.
    let logs = stop_gracefully(relay);
    let got = metrics_exports(&receiver);
    assert_exports_and_resource(&got, &token, &logs, &relay_id);
    let mut metrics = BTreeMap::new();
    for (_, _, _, r) in got.iter() {
        metrics.extend(metrics_of(r));
    }
    assert_instrument_names(&metrics);
    assert_counters_and_gauges(&metrics);
    assert_ownership_and_backlog(&got);
    assert_histograms(&metrics);
    assert_publish_spans(&trace_exports(&receiver), &token, &topic, &written, &traced);
}

/// Readiness is not a constant: a relay whose DynamoDB refuses every connection is live
/// (its loop runs and retries) and not ready (no lease round completes). Without an OTLP
/// endpoint in the environment, or `--otlp`, nothing is exported.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_that_cannot_reach_dynamodb_is_live_and_not_ready() {
    stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args([
            "relay",
            "--table",
            &random_name("unreachable"),
            "--health-listen",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .env("AWS_ENDPOINT_URL_DYNAMODB", format!("http://{closed}"))
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .env("OUTBOX_LEASE_DURATION", "3s")
        .env("OUTBOX_LEASE_RENEW_INTERVAL", "1s")
        .env("OUTBOX_ERROR_BACKOFF", "200ms")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outboxctl relay");
    let stderr = child.stderr.take().unwrap();
    let _relay = Relay(child);
    let (tx, lines) = mpsc::channel();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    let line = wait_for_line(&lines, "health endpoint listening", Duration::from_secs(60));
    let addr = strip_ansi(&line)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr=").map(str::to_string))
        .unwrap_or_else(|| panic!("the log line names the address: {line:?}"));
    // Its first lease rounds fail (connection refused) and are retried.
    wait_for_line(&lines, "round failed", Duration::from_secs(60));
    let (status, body) = get(&addr, "/healthz");
    assert_eq!(
        (status, body.as_str()),
        (200, "live: the relay loop is running")
    );
    let (status, body) = get(&addr, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("no acquisition round has completed yet"),
        "{body}"
    );
    let logs = log.lock().unwrap().join("\n");
    assert!(!logs.contains("OTLP"), "no export configured: {logs}");
}

/// The stop waits for the final export at most 5 s (metrics and spans together), even when
/// the endpoint accepts connections and never answers and each export may take 30 s: a
/// relay stopped by SIGTERM after publishing exits within that bound plus its own stop.
#[tokio::test(flavor = "multi_thread")]
async fn the_final_export_to_an_endpoint_that_never_answers_holds_the_stop_at_most_5_s() {
    let (options, topic, written, _) = thirty_messages().await;
    // A black hole: accepts connections, reads nothing, answers nothing.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hole.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in hole.incoming().map_while(Result::ok) {
            held.push(stream);
        }
    });
    let relay = start_relay(
        &options,
        &endpoint,
        &random_name("hole-relay"),
        &random_name("token"),
        &[
            ("RUST_LOG", "info"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "30000"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "60000"),
        ],
    );
    // Published: there are spans to export as well as metrics.
    wait_for_ids(&topic, &written, Duration::from_secs(60)).await;

    let (exit, took, out, logs) = terminate(relay);
    assert!(exit.success(), "{exit:?}\n{out}\n{logs}");
    assert!(
        out.contains("published 30,") && out.contains("leases released: true"),
        "{out}"
    );
    println!("stopped {took:?} after SIGTERM with an OTLP endpoint that never answers");
    // 5 s for the exports, and 2 s for the relay's own stop (its releases) and the exit.
    assert!(
        took < Duration::from_secs(7),
        "the stop took {took:?}: the final export held it past 5 s\n{logs}"
    );
}
