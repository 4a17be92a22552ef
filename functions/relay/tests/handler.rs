//! The relay handler, called directly with a `LambdaEvent` whose context carries a real
//! deadline, against DynamoDB Local and the local broker (run through scripts/stack.sh;
//! never skipped).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use dynamo_outbox::lambda::{
    DeadlineSource, Ending, RelayHandler, RelaySettings, RelaySummary, Trigger,
};
use dynamo_outbox::notification::{CommitNotification, Skip, DETAIL_TYPE, SOURCE};
use dynamo_outbox::{DynamoDbOutboxWriter, OutboxOptions, StopReason};
use lambda_runtime::LambdaEvent;
use outbox_testkit::*;
use serde_json::{json, Value};
use tokio::time::Instant;

fn event(request_id: &str, deadline_ms: u64) -> LambdaEvent<Value> {
    event_with(request_id, deadline_ms, json!({"source": "aws.scheduler"}))
}

fn event_with(request_id: &str, deadline_ms: u64, payload: Value) -> LambdaEvent<Value> {
    common::invocation(request_id, deadline_ms, payload)
}

/// A commit notification as EventBridge delivers it to the function.
fn notification(options: &OutboxOptions, buckets: &[u32]) -> Value {
    let detail = CommitNotification::new(options, buckets.iter().copied());
    json!({
        "version": "0",
        "id": random_name("event"),
        "detail-type": DETAIL_TYPE,
        "source": SOURCE,
        "account": "123456789012",
        "time": "2026-11-30T12:00:00Z",
        "region": "us-east-1",
        "resources": [],
        "detail": serde_json::to_value(&detail).unwrap(),
    })
}

use common::in_ms;

fn settings(options: &OutboxOptions, extra: &[(&str, &str)]) -> RelaySettings {
    // These tests are about runs that end at their deadline (tests/doorbell.rs and
    // tests/serverless.rs test the idle stop, the function's default).
    common::settings(options, &[("OUTBOX_IDLE_STOP", "never")], extra)
}

/// Enqueues `count` messages; their ids.
async fn enqueue(
    writer: &DynamoDbOutboxWriter,
    topic: &str,
    from: u64,
    count: u64,
) -> BTreeSet<String> {
    let batch: Vec<_> = (from..from + count)
        .map(|n| {
            writer
                .message(topic)
                .with_key(format!("key-{}", n % 5))
                .with_value(format!("value-{n}"))
        })
        .collect();
    writer.enqueue(&batch).await.unwrap();
    id_set(&batch)
}

/// Asserts that the ids in `topic` are `written` (each at least once) and reports copies.
#[track_caller]
fn assert_delivered(topic: &str, written: &BTreeSet<String>) {
    let read = topic_deliveries(topic);
    let copies = read.assert_at_least_once(written);
    if copies > 0 {
        println!(
            "{topic}: {} messages, {copies} extra copies {:?}",
            written.len(),
            read.duplicates
        );
    }
}

#[tokio::test]
async fn publishes_and_stops_before_the_invocation_deadline() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("relay-fn");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut written = enqueue(&writer, &topic, 0, 20).await;

    let (counted, wire) = counted_client().await;
    let function = RelayHandler::new(counted, settings(&options, &[])).unwrap();
    let started = Instant::now();
    let summary = function
        .handle(event("req-1", in_ms(Duration::from_secs(8))))
        .await
        .expect("relay invocation");
    let took = started.elapsed();
    assert_eq!(summary.relay_id, "outbox-relay-test-req-1");
    assert_eq!(summary.published, 20, "{summary:?}");
    assert_eq!(
        summary.stop_reason,
        Ending::Ran(StopReason::Deadline),
        "{summary:?}"
    );
    assert!(summary.released, "{summary:?}");
    assert_eq!(summary.refused_writes, 0, "{summary:?}");
    assert_no_refusal_on_the_wire(&wire, "the invocation");
    assert_eq!(summary.buckets_owned, 4, "{summary:?}");
    assert_eq!(summary.deadline_source, DeadlineSource::Invocation);
    // 8 s deadline minus the 3 s margin: the relay works until 2 s (its stop reserve)
    // before that, so for 3 s, then stops and returns. What a user relies on: it used its
    // time (no early return), answered before the invocation's deadline, and reported the
    // time it had left as Lambda counts it. How long the stop itself takes depends on the
    // machine, so the upper bound is the deadline, not the margin.
    assert!(took >= Duration::from_millis(2_900), "took {took:?}");
    assert!(
        took < Duration::from_secs(8),
        "answered after the deadline: {took:?}"
    );
    let expected_left = Duration::from_secs(8).saturating_sub(took).as_millis() as i64;
    assert!(
        summary.time_left_ms > 0 && (summary.time_left_ms as i64 - expected_left).abs() < 500,
        "time_left_ms {} vs about {expected_left} ms by the test's clock: {summary:?}",
        summary.time_left_ms
    );
    assert_eq!(pending_messages(&client, &options).await, 0);
    assert_eq!(
        lease_owners(&client, &options).await,
        vec![None; 4],
        "every lease released"
    );
    assert_delivered(&topic, &written);

    // The summary is the JSON the function returns.
    let v = serde_json::to_value(&summary).unwrap();
    for field in [
        "published",
        "buckets_owned",
        "refused_writes",
        "stop_reason",
        "time_left_ms",
    ] {
        assert!(v.get(field).is_some(), "{field} missing from {v}");
    }
    // The answer's JSON names the ending and the trigger as the docs list them.
    assert_eq!(
        (&v["stop_reason"], &v["trigger"]),
        (&json!("deadline"), &json!("direct"))
    );

    // A warm invocation reuses the clients and publishes what arrived since.
    written.extend(enqueue(&writer, &topic, 20, 5).await);
    let summary = function
        .handle(event("req-2", in_ms(Duration::from_secs(7))))
        .await
        .expect("warm invocation");
    assert_eq!(summary.published, 5, "{summary:?}");
    assert_delivered(&topic, &written);
}

#[tokio::test]
async fn a_missing_or_past_deadline_falls_back_to_the_configured_run_time() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("relay-fn");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let written = enqueue(&writer, &topic, 0, 3).await;
    let function = RelayHandler::new(
        client.clone(),
        settings(&options, &[("OUTBOX_MAX_RUN_TIME", "4s")]),
    )
    .unwrap();
    for (request, deadline_ms) in [("zero", 0), ("past", in_ms(Duration::ZERO) - 60_000)] {
        let started = Instant::now();
        let summary = function
            .handle(event(request, deadline_ms))
            .await
            .expect("relay invocation");
        let took = started.elapsed();
        assert_eq!(summary.deadline_source, DeadlineSource::Fallback);
        assert_eq!(
            summary.stop_reason,
            Ending::Ran(StopReason::Deadline),
            "{summary:?}"
        );
        assert!(summary.released, "{summary:?}");
        // 4 s of run time, the last 2 s of it kept for the stop: it works for 2 s (not
        // the zero or negative time the context says) and then stops. The stop's own
        // length depends on the machine; a run bounded by the fallback ends well before
        // twice that run time (the default run time, 50 s, would not).
        assert!(
            took >= Duration::from_millis(1_900) && took < Duration::from_secs(8),
            "{request}: took {took:?}"
        );
    }
    assert_delivered(&topic, &written);
}

/// Watches the lease owners of `options` every 50 ms until `until`: the longest time any
/// bucket had no live owner (counted once every bucket was owned), and a timeline of the
/// owners (ms since `begin`).
async fn watch_owners(
    client: aws_sdk_dynamodb::Client,
    options: OutboxOptions,
    begin: Instant,
    until: Instant,
) -> (Duration, Vec<String>) {
    let buckets = options.bucket_count as usize;
    let mut unowned_since: Vec<Option<Instant>> = vec![None; buckets];
    let mut longest = Duration::ZERO;
    let mut all_owned_once = false;
    let mut timeline = Vec::new();
    let mut last = None;
    while Instant::now() < until {
        let owners = lease_owners(&client, &options).await;
        let now = Instant::now();
        if last.as_ref() != Some(&owners) {
            timeline.push(format!("{:>6}ms {owners:?}", (now - begin).as_millis()));
            last = Some(owners.clone());
        }
        all_owned_once |= owners.iter().all(Option::is_some);
        if all_owned_once {
            for (b, o) in owners.iter().enumerate() {
                match (o, unowned_since[b]) {
                    (None, None) => unowned_since[b] = Some(now),
                    (Some(_), Some(since)) => {
                        longest = longest.max(now - since);
                        unowned_since[b] = None;
                    }
                    _ => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let end = Instant::now();
    for since in unowned_since.into_iter().flatten() {
        longest = longest.max(end - since);
    }
    (longest, timeline)
}

/// Enqueues four messages every 100 ms until `until`; their ids.
async fn produce_until(
    writer: DynamoDbOutboxWriter,
    topic: String,
    until: Instant,
) -> BTreeSet<String> {
    let mut n = 0;
    let mut written = BTreeSet::new();
    while Instant::now() < until {
        written.extend(enqueue(&writer, &topic, n, 4).await);
        n += 4;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    written
}

/// Two scheduled invocations that overlap, as consecutive schedule ticks do: the newcomer
/// joins while the leaver still owns every bucket, the leaver stops and releases. Reports
/// the longest time any bucket had no live owner while messages kept arriving.
#[tokio::test]
async fn overlapping_invocations_hand_buckets_over() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("relay-fn");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // Two execution environments, DynamoDB's refusals of their writes counted at the wire.
    let (counted, wire) = counted_client().await;
    let first = RelayHandler::new(counted.clone(), settings(&options, &[])).unwrap();
    let second = RelayHandler::new(counted, settings(&options, &[])).unwrap();

    // Timeline (s): the first invocation works until 12 - 3 (margin) - 2 (stop reserve)
    // = 7; the second starts at 5 and works until 5 + 7 = 12. Messages arrive until 9;
    // buckets are watched until 11.5.
    let begin = Instant::now();
    let watch_until = begin + Duration::from_millis(11_500);
    let watcher = tokio::spawn(watch_owners(
        client.clone(),
        options.clone(),
        begin,
        watch_until,
    ));
    let producer = tokio::spawn(produce_until(
        writer.clone(),
        topic.clone(),
        begin + Duration::from_secs(9),
    ));
    let a = first.handle(event("tick-1", in_ms(Duration::from_secs(12))));
    let b = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        second
            .handle(event("tick-2", in_ms(Duration::from_secs(12))))
            .await
    };
    let (a, b): (RelaySummary, RelaySummary) = {
        let (a, b) = tokio::join!(a, b);
        (a.expect("first invocation"), b.expect("second invocation"))
    };
    let written = producer.await.unwrap();
    let (longest_unowned, timeline) = watcher.await.unwrap();
    println!(
        "first:  {a:?}\nsecond: {b:?}\nlease owners:\n{}\nlongest unowned gap: {longest_unowned:?}",
        timeline.join("\n")
    );
    assert!(a.released && b.released, "{a:?} {b:?}");
    assert_eq!(
        a.refused_writes + b.refused_writes,
        0,
        "no refused conditional write at the boundary: {a:?} {b:?}"
    );
    assert_no_refusal_on_the_wire(&wire, "two overlapping invocations");
    assert_delivered(&topic, &written);
    assert_eq!(pending_messages(&client, &options).await, 0);
    // The newcomer reads the leaver's announced stop and watches for its releases every
    // handover step, for at most HANDOVER_WATCH past the announcement; a bucket that
    // waited for the newcomer's next renew round (10 s) would exceed it.
    assert!(
        longest_unowned < dynamo_outbox::protocol::coordination::HANDOVER_WATCH,
        "a bucket was unowned for {longest_unowned:?}"
    );
}

/// Waits until the scheduled invocation ("tick") owns all four buckets, at most 3 s.
async fn wait_until_the_scheduled_relay_owns_every_bucket(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
) {
    let all = vec![Some("outbox-relay-test-tick".to_string()); 4];
    let owned_by = Instant::now() + Duration::from_secs(3);
    loop {
        let owners = lease_owners(client, options).await;
        if owners == all {
            break;
        }
        assert!(
            Instant::now() < owned_by,
            "the scheduled relay did not own every bucket within 3 s: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Four more messages (keys 8 to 11): their ids and the buckets they went to.
async fn enqueue_four_more(
    writer: &DynamoDbOutboxWriter,
    topic: &str,
) -> (BTreeSet<String>, Vec<u32>) {
    let batch: Vec<_> = (8..12)
        .map(|n| {
            writer
                .message(topic)
                .with_key(format!("key-{n}"))
                .with_value(format!("value-{n}"))
        })
        .collect();
    let mut buckets: Vec<u32> = writer
        .enqueue(&batch)
        .await
        .unwrap()
        .iter()
        .map(|e| e.bucket)
        .collect();
    buckets.sort_unstable();
    buckets.dedup();
    assert!(!buckets.is_empty());
    (id_set(&batch), buckets)
}

/// A burst of five notifications for `buckets` to the idle fleet, at once, with random
/// request ids: the first wake-up (by time, then request id) joins, the others wait for
/// its relay. Their summaries, and the wire counter of their client.
async fn notify_the_idle_fleet(
    options: &OutboxOptions,
    buckets: &[u32],
) -> (Vec<RelaySummary>, dynamo_outbox::accounting::RequestCounter) {
    let (woken_client, woken_wire) = counted_client().await;
    let woken = RelayHandler::new(woken_client, settings(options, &[])).unwrap();
    let ids: Vec<String> = (0..5).map(|_| random_name("wake")).collect();
    let burst = futures::future::join_all(ids.iter().map(|id| {
        woken.handle(event_with(
            id,
            in_ms(Duration::from_secs(7)),
            notification(options, buckets),
        ))
    }))
    .await;
    let burst = burst
        .into_iter()
        .map(|r| r.expect("notified invocation"))
        .collect();
    (burst, woken_wire)
}

/// Commit notifications never start a stampede: while a scheduled invocation owns every
/// bucket, notified invocations read the coordination partition once and return; once it
/// has stopped, a notification starts a relay that publishes what arrived.
#[tokio::test]
async fn notified_invocations_return_after_one_read_while_live_relays_own_the_buckets() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("relay-fn");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let mut written = enqueue(&writer, &topic, 0, 8).await;

    // The scheduled invocation: works until 8 - 3 (margin) - 2 (stop reserve) = 3 s. Its
    // client and the idle-fleet burst's count DynamoDB's refusals at the wire.
    let (scheduled_client, scheduled_wire) = counted_client().await;
    let scheduled = RelayHandler::new(scheduled_client, settings(&options, &[])).unwrap();
    let tick = scheduled.handle(event("tick", in_ms(Duration::from_secs(8))));
    let notified = async {
        wait_until_the_scheduled_relay_owns_every_bucket(&client, &options).await;
        let (counted, counter) = counted_client().await;
        let function = RelayHandler::new(counted, settings(&options, &[])).unwrap();
        // A burst of notifications: five invocations at once.
        let burst = futures::future::join_all((0..5).map(|i| {
            function.handle(event_with(
                &format!("burst-{i}"),
                in_ms(Duration::from_secs(8)),
                notification(&options, &[0, 1, 2, 3]),
            ))
        }))
        .await;
        (burst, counter.snapshot())
    };
    let (tick, (burst, requests)) = tokio::join!(tick, notified);
    let tick = tick.expect("scheduled invocation");
    assert_eq!(tick.published, 8, "{tick:?}");
    assert_eq!(tick.trigger, Trigger::Direct);
    assert_eq!(tick.refused_writes, 0, "{tick:?}");
    assert_no_refusal_on_the_wire(&scheduled_wire, "the scheduled invocation");
    for summary in burst {
        let summary = summary.expect("notified invocation");
        assert_eq!(
            summary.stop_reason,
            Ending::Skipped(Skip::Covered),
            "{summary:?}"
        );
        assert_eq!(summary.trigger, Trigger::Notification);
        assert_eq!(summary.uncovered, Some(vec![]));
        assert_eq!((summary.published, summary.buckets_owned), (0, 0));
        assert!(summary.time_left_ms > 4_000, "{summary:?}");
    }
    // One strongly consistent Query each, and not one write.
    let queries = requests.get("Query").map_or(0, |a| a.ok);
    let total: u64 = requests.values().map(|a| a.total()).sum();
    assert_eq!((queries, total), (5, 5), "{requests:?}");

    // The scheduled relay has stopped and released everything: a notification now starts
    // a relay, which publishes what arrived meanwhile.
    assert_eq!(lease_owners(&client, &options).await, vec![None; 4]);
    let (batch, buckets) = enqueue_four_more(&writer, &topic).await;
    written.extend(batch);
    let (burst, woken_wire) = notify_the_idle_fleet(&options, &buckets).await;
    let joined: Vec<&RelaySummary> = burst.iter().filter(|s| s.stop_reason.ran()).collect();
    assert_eq!(
        joined.len(),
        1,
        "exactly one notification of the burst starts a relay: {burst:?}"
    );
    for s in &joined {
        assert_eq!(s.trigger, Trigger::Notification);
        assert_eq!(s.stop_reason, Ending::Ran(StopReason::Deadline), "{s:?}");
        assert!(s.uncovered.as_ref().is_some_and(|u| !u.is_empty()), "{s:?}");
    }
    let published: u64 = burst.iter().map(|s| s.published).sum();
    let refused: u64 = burst.iter().map(|s| s.refused_writes).sum();
    assert_eq!((published, refused), (4, 0), "{burst:?}");
    assert_no_refusal_on_the_wire(&woken_wire, "the relays the idle-fleet burst started");
    assert_delivered(&topic, &written);
}

#[tokio::test]
async fn notifications_for_another_outbox_or_malformed_ones_start_nothing() {
    let (client, counter) = counted_client().await;
    let options = fresh_table(&client, 4).await;
    counter.reset();
    let function = RelayHandler::new(client.clone(), settings(&options, &[])).unwrap();
    let other = OutboxOptions::new("another-table").with_bucket_count(4);
    let summary = function
        .handle(event_with(
            "other",
            in_ms(Duration::from_secs(8)),
            notification(&other, &[1]),
        ))
        .await
        .expect("ignored notification");
    assert_eq!(
        summary.stop_reason,
        Ending::Skipped(Skip::NotThisOutbox),
        "{summary:?}"
    );
    let mut malformed = notification(&options, &[1]);
    malformed["detail"]["buckets"] = json!([1, 4]);
    let e = function
        .handle(event_with("bad", in_ms(Duration::from_secs(8)), malformed))
        .await
        .expect_err("a bucket beyond the count");
    assert_eq!(e.error_type, "ValidationError", "{e}");
    assert!(e.message.starts_with("detail.buckets:"), "{e}");
    assert_eq!(counter.total(), 0, "{:?}", counter.snapshot());
}

/// A warm execution environment whose Kafka connection breaks: the invocation that cannot
/// publish still returns its summary (not a function error), the function drops the
/// client, and the next invocation connects a new one and publishes what was left.
/// (Multi-threaded: the proxy's task runs while kafka.py blocks a thread.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_kafka_connection_is_rebuilt_by_the_next_invocation() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let kafka = common::ProxiedTopic::start("rebuild").await;
    let (bootstrap, topic) = (&kafka.bootstrap, &kafka.topic);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let function = RelayHandler::new(
        client.clone(),
        settings(
            &options,
            &[
                ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
                ("OUTBOX_ERROR_BACKOFF", "200ms"),
            ],
        ),
    )
    .unwrap();

    let mut written = enqueue(&writer, topic, 0, 3).await;
    let first = function
        .handle(event("cold", in_ms(Duration::from_secs(7))))
        .await
        .expect("cold invocation");
    assert_eq!((first.published, first.kafka_client_reused), (3, false));

    // Every connection cut, new ones refused.
    kafka.broker.proxy.refuse();
    written.extend(enqueue(&writer, topic, 3, 3).await);
    let broken = function
        .handle(event("broken", in_ms(Duration::from_secs(7))))
        .await
        .expect("a broken broker is not a function error");
    assert_eq!(broken.published, 0, "{broken:?}");
    assert!(broken.publish_failures > 0, "{broken:?}");
    assert!(broken.kafka_client_reused, "{broken:?}");
    assert!(broken.released, "{broken:?}");
    assert_eq!(pending_messages(&client, &options).await, 3);

    kafka.broker.proxy.pass();
    let rebuilt = function
        .handle(event("rebuilt", in_ms(Duration::from_secs(7))))
        .await
        .expect("invocation after the broker is back");
    assert!(!rebuilt.kafka_client_reused, "a new client: {rebuilt:?}");
    assert_eq!(rebuilt.published, 3, "{rebuilt:?}");
    assert_eq!(pending_messages(&client, &options).await, 0);
    // What was left went out: the six ids written, each at least once.
    let read = Deliveries::of(&kafka.records());
    let copies = read.assert_at_least_once(&written);
    println!(
        "after the rebuild: {} messages, {copies} extra copies {:?}",
        written.len(),
        read.duplicates
    );
}

/// The `CommitToAckLatency` values of the EMF documents in `text` (one JSON document a
/// line, as the function prints them), after checking each is a number or an array of
/// numbers (the specification's target members) in milliseconds.
fn commit_to_ack_values(text: &str) -> Vec<f64> {
    let mut values = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let doc: Value = serde_json::from_str(line).expect("one EMF document a line");
        let defined = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .expect("a metric directive")
            .iter()
            .find(|m| m["Name"] == "CommitToAckLatency")
            .cloned();
        match (&doc["CommitToAckLatency"], defined) {
            (Value::Null, None) => {}
            (Value::Number(n), Some(d)) => {
                assert_eq!(d["Unit"], "Milliseconds");
                values.push(n.as_f64().unwrap());
            }
            (Value::Array(a), Some(d)) => {
                assert_eq!(d["Unit"], "Milliseconds");
                assert!(a.len() <= 100, "EMF's 100 values per metric");
                values.extend(a.iter().map(|v| v.as_f64().expect("a number")));
            }
            other => panic!("CommitToAckLatency is not EMF: {other:?} in {line}"),
        }
    }
    values
}

#[tokio::test]
async fn the_emf_output_has_one_commit_to_ack_latency_per_published_message() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("latency");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // More than fit in one EMF array (100 values): the values continue in a second document.
    let created = Instant::now();
    let mut written = enqueue(&writer, &topic, 0, 100).await;
    written.extend(enqueue(&writer, &topic, 100, 30).await);

    let out = Captured::default();
    let function = RelayHandler::new(client.clone(), settings(&options, &[]))
        .unwrap()
        .with_metrics_output(out.clone());
    let summary = function
        .handle(event("req-latency", in_ms(Duration::from_secs(8))))
        .await
        .expect("relay invocation");
    let waited = created.elapsed();
    assert_eq!(summary.published, 130, "{summary:?}");
    assert_delivered(&topic, &written);

    let text = out.text();
    let values = commit_to_ack_values(&text);
    assert_eq!(
        values.len(),
        130,
        "one latency per published message: {text}"
    );
    // Between the messages' creation and the end of the invocation (one host, one clock
    // here; 50 ms for the two clocks' readings).
    let bound = waited.as_secs_f64() * 1000.0 + 50.0;
    assert!(
        values.iter().all(|v| (0.0..bound).contains(v)),
        "milliseconds within {bound}: {values:?}"
    );
    let published: f64 = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|d| d["Published"].as_f64())
        .sum();
    assert_eq!(published, 130.0, "{text}");
}

/// With an OTLP endpoint configured (as the ADOT collector layer is), an invocation's
/// publish spans are at the receiver when the invocation returns, linked to the trace of
/// each message that carries one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invocation_exports_its_publish_spans_before_it_returns() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("spans");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let context = dynamo_outbox::TraceContext::parse(
        "traceparent",
        "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01",
        None,
    )
    .unwrap();
    let traced = writer
        .message(topic.as_str())
        .with_key("order-1")
        .with_trace_context(&context);
    let plain = writer.message(topic.as_str()).with_key("order-2");
    writer
        .enqueue(&[traced.clone(), plain.clone()])
        .await
        .unwrap();

    let receiver = outbox_testkit::otlp::OtlpReceiver::start();
    let endpoint = receiver.endpoint.clone();
    let function = RelayHandler::new(
        client.clone(),
        common::settings(
            &options,
            &[("OUTBOX_IDLE_STOP", "1s")],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
        ),
    )
    .unwrap();
    let summary = function
        .handle(event("req-spans", in_ms(Duration::from_secs(10))))
        .await
        .expect("relay invocation");
    assert_eq!(summary.published, 2, "{summary:?}");

    // No waiting: the invocation flushed before it returned.
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    let requests: Vec<ExportTraceServiceRequest> = receiver
        .trace_requests()
        .iter()
        .map(|r| {
            use prost::Message as _;
            ExportTraceServiceRequest::decode(r.body.as_slice())
                .expect("an ExportTraceServiceRequest")
        })
        .collect();
    let spans: Vec<_> = requests
        .iter()
        .flat_map(|r| r.resource_spans.iter())
        .flat_map(|rs| rs.scope_spans.iter())
        .flat_map(|ss| ss.spans.iter().cloned())
        .filter(|s| s.name == format!("send {topic}"))
        .collect();
    assert!(
        !spans.is_empty(),
        "the publish spans were exported before the return"
    );
    let text = |attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str| {
        attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
            match kv.value.as_ref()?.value.as_ref()? {
                Any::StringValue(s) => Some(s.clone()),
                _ => None,
            }
        })
    };
    let links: Vec<_> = spans.iter().flat_map(|s| s.links.iter()).collect();
    assert_eq!(links.len(), 1, "one traced message, one link: {spans:?}");
    assert_eq!(links[0].trace_id, context.trace_id().to_vec());
    assert_eq!(links[0].span_id, context.parent_id().to_vec());
    assert_eq!(
        text(&links[0].attributes, "messaging.message.id"),
        Some(traced.message_id.to_string())
    );
    let ids: BTreeSet<String> = spans
        .iter()
        .flat_map(|s| {
            match s
                .attributes
                .iter()
                .find(|kv| kv.key == "outbox.message.ids")
            {
                Some(kv) => match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Any::ArrayValue(a)) => a
                        .values
                        .iter()
                        .filter_map(|v| match v.value.as_ref() {
                            Some(Any::StringValue(s)) => Some(s.clone()),
                            _ => None,
                        })
                        .collect::<Vec<_>>(),
                    _ => Vec::new(),
                },
                None => Vec::new(),
            }
        })
        .collect();
    assert_eq!(
        ids,
        id_set([&traced, &plain]),
        "both ids on the publish spans"
    );
}
