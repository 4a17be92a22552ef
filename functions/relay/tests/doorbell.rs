//! The relay function woken by doorbells: batches of the table's DynamoDB stream records,
//! as the event source mapping of `WakeOn=stream` delivers them, read back from DynamoDB
//! Local's real stream (scripts/streams.py), against the local stack (never skipped).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dynamo_outbox::accounting::RequestCounter;
use dynamo_outbox::lambda::{Ending, RelayHandler, RelaySettings, RelaySummary, Trigger};
use dynamo_outbox::notification::Skip;
use dynamo_outbox::{DynamoDbOutboxWriter, OutboxOptions, StopReason};
use lambda_runtime::LambdaEvent;
use outbox_testkit::*;
use serde_json::{json, Value};
use tokio::time::Instant;

fn event(request_id: &str, time_left: Duration, payload: Value) -> LambdaEvent<Value> {
    common::invocation(request_id, common::in_ms(time_left), payload)
}

fn settings(options: &OutboxOptions, extra: &[(&str, &str)]) -> RelaySettings {
    common::settings(options, &[("OUTBOX_IDLE_STOP", "1s")], extra)
}

/// A client counting attempts and refused conditions, and a function over it.
async fn function(
    options: &OutboxOptions,
    extra: &[(&str, &str)],
) -> (Arc<RelayHandler>, RequestCounter) {
    let (client, counter) = counted_client().await;
    let f = RelayHandler::new(client, settings(options, extra))
        .unwrap()
        .with_request_counter(counter.clone());
    (Arc::new(f), counter)
}

/// A fresh table with a `KEYS_ONLY` stream (as the template's `WakeOn=stream` creates it).
async fn streamed_table(bucket_count: u32) -> (aws_sdk_dynamodb::Client, OutboxOptions) {
    let client = dynamodb().await;
    let options = fresh_table(&client, bucket_count).await;
    try_stack_py("streams.py", &["enable", &options.table_name]).expect("enable the stream");
    (client, options)
}

/// The stream records of the table's message inserts since `after` (a sequence number),
/// as one Lambda event, and the last sequence number in it.
fn doorbell_since(options: &OutboxOptions, after: Option<&str>) -> (Value, Option<String>) {
    let prefix = dynamo_outbox::protocol::schema::Keys::new(options).messages_prefix();
    let mut args = vec![
        "records",
        options.table_name.as_str(),
        "--filter-prefix",
        prefix.as_str(),
    ];
    if let Some(a) = after {
        args.extend(["--after", a]);
    }
    let out = try_stack_py("streams.py", &args).expect("read the stream");
    let event: Value = serde_json::from_str(out.trim()).expect("stream event json");
    let last = event["Records"]
        .as_array()
        .and_then(|r| r.last())
        .and_then(|r| r["dynamodb"]["SequenceNumber"].as_str())
        .map(str::to_owned);
    (event, last)
}

async fn enqueue(writer: &DynamoDbOutboxWriter, topic: &str, keys: &[&str]) -> BTreeSet<String> {
    let batch: Vec<_> = keys
        .iter()
        .map(|k| {
            writer
                .message(topic)
                .with_key(*k)
                .with_value(format!("{k}-v"))
        })
        .collect();
    writer.enqueue(&batch).await.unwrap();
    id_set(&batch)
}

fn buckets_of(event: &Value) -> BTreeSet<u32> {
    event["Records"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["dynamodb"]["Keys"]["PK"]["S"].as_str())
        .filter_map(|pk| pk.rsplit('#').next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doorbells_from_real_stream_records_wake_a_relay_that_publishes_and_idles_out() {
    let (client, options) = streamed_table(4).await;
    let topic = random_name("doorbell");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let written = enqueue(&writer, &topic, &["a", "b", "c", "d", "e", "f"]).await;
    let (doorbell, _) = doorbell_since(&options, None);
    // The real records: one INSERT per message, in the buckets the writer chose.
    assert_eq!(
        doorbell["Records"].as_array().unwrap().len(),
        6,
        "{doorbell}"
    );
    assert!(!buckets_of(&doorbell).is_empty());

    let rung = buckets_of(&doorbell);
    let (f, wire) = function(&options, &[]).await;
    let started = Instant::now();
    let summary = f
        .handle(event("bell-1", Duration::from_secs(40), doorbell))
        .await
        .expect("a doorbell never fails");
    assert_eq!(summary.trigger, Trigger::Doorbell, "{summary:?}");
    let uncovered: BTreeSet<u32> = summary.uncovered.clone().unwrap().into_iter().collect();
    assert_eq!(uncovered, rung, "{summary:?}");
    assert_eq!(summary.published, 6, "{summary:?}");
    assert_eq!(
        summary.stop_reason,
        Ending::Ran(StopReason::Idle),
        "{summary:?}"
    );
    assert!(summary.released, "{summary:?}");
    assert_eq!(summary.refused_writes, 0, "{summary:?}");
    assert_no_refusal_on_the_wire(&wire, "the doorbell's relay");
    // Idle after a second: it answered long before its deadline (40 s).
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    assert!(
        summary
            .dynamodb_requests
            .get("Query")
            .is_some_and(|n| *n > 0),
        "{summary:?}"
    );
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);
    assert!(lease_owners(&client, &options)
        .await
        .iter()
        .all(Option::is_none));

    // The same records again (as a later batch of one commit's stream records arrives
    // after the relay that published them stopped): nothing waits, no relay runs, no
    // Kafka connection. One read of the coordination partition and one probe per rung
    // bucket, no write.
    let (again, wire_again) = function(&options, &[]).await;
    let (doorbell, _) = doorbell_since(&options, None);
    let summary = again
        .handle(event("bell-again", Duration::from_secs(40), doorbell))
        .await
        .unwrap();
    assert_eq!(
        summary.stop_reason,
        Ending::Skipped(Skip::Empty),
        "{summary:?}"
    );
    let attempts = wire_again.snapshot();
    assert_eq!(
        attempts.keys().collect::<Vec<_>>(),
        ["Query"],
        "{attempts:?}"
    );
    assert_eq!(
        wire_again.get("Query").total(),
        1 + rung.len() as u64,
        "{attempts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doorbell_while_a_relay_owns_the_buckets_returns_covered_after_one_read() {
    let (client, options) = streamed_table(4).await;
    let topic = random_name("covered");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    // A scheduled invocation that holds every bucket for its whole run (no idle stop).
    let (scheduled, _) = function(&options, &[("OUTBOX_IDLE_STOP", "never")]).await;
    let running = tokio::spawn({
        let scheduled = scheduled.clone();
        async move {
            scheduled
                .handle(event(
                    "tick",
                    Duration::from_secs(16),
                    json!({"source": "dynamo-outbox.schedule"}),
                ))
                .await
        }
    });
    let until = Instant::now() + Duration::from_secs(30);
    while lease_owners(&client, &options)
        .await
        .iter()
        .any(Option::is_none)
    {
        assert!(
            Instant::now() < until,
            "the scheduled relay never held every bucket"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written = enqueue(&writer, &topic, &["x", "y", "z"]).await;
    let (doorbell, _) = doorbell_since(&options, None);
    let (f, wire) = function(&options, &[]).await;
    let summary = f
        .handle(event("bell-2", Duration::from_secs(30), doorbell))
        .await
        .unwrap();
    assert_eq!(
        summary.stop_reason,
        Ending::Skipped(Skip::Covered),
        "{summary:?}"
    );
    assert_eq!(summary.trigger, Trigger::Doorbell);
    // One strongly consistent Query of the coordination partition, nothing else.
    let attempts = wire.snapshot();
    assert_eq!(
        attempts.keys().collect::<Vec<_>>(),
        ["Query"],
        "{attempts:?}"
    );
    assert_eq!(wire.get("Query").total(), 1, "{attempts:?}");
    assert_eq!(summary.dynamodb_requests, [("Query".to_string(), 1)].into());
    assert_eq!(
        summary.dynamodb_consistent_reads,
        [("Query".to_string(), 1)].into(),
        "the coverage read is strongly consistent"
    );
    // The scheduled relay publishes the messages.
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);
    let scheduled = running.await.unwrap().unwrap();
    assert_eq!(
        scheduled.stop_reason,
        Ending::Ran(StopReason::Deadline),
        "{scheduled:?}"
    );
    assert_eq!(scheduled.refused_writes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_doorbells_on_an_idle_fleet_starts_one_relay() {
    let (client, options) = streamed_table(4).await;
    let topic = random_name("burst");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let written = enqueue(&writer, &topic, &["p", "q", "r", "s"]).await;
    let (doorbell, _) = doorbell_since(&options, None);
    let (f, wire) = function(&options, &[]).await;
    // Five doorbells at once, with random request ids: the first wake-up (by time, then
    // request id) joins, the others wait for its relay to cover the buckets.
    let ids: Vec<String> = (0..5).map(|_| random_name("wake")).collect();
    let mut handles = Vec::new();
    for id in ids {
        let f = f.clone();
        let payload = doorbell.clone();
        handles.push(tokio::spawn(async move {
            f.handle(event(&id, Duration::from_secs(30), payload))
                .await
                .unwrap()
        }));
    }
    let mut summaries: Vec<RelaySummary> = Vec::new();
    for h in handles {
        summaries.push(h.await.unwrap());
    }
    let joined: Vec<&RelaySummary> = summaries.iter().filter(|s| s.stop_reason.ran()).collect();
    assert_eq!(
        joined.len(),
        1,
        "exactly one doorbell starts a relay: {summaries:?}"
    );
    assert_eq!(
        joined[0].stop_reason,
        Ending::Ran(StopReason::Idle),
        "{summaries:?}"
    );
    assert_eq!(joined[0].published, 4, "{summaries:?}");
    let refused: u64 = summaries.iter().map(|s| s.refused_writes).sum();
    assert_eq!(refused, 0);
    assert_no_refusal_on_the_wire(&wire, "the burst");
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);
    assert!(lease_owners(&client, &options)
        .await
        .iter()
        .all(Option::is_none));
}

/// Invocation `k` of the schedule at `at`, with a deadline 9 s away.
fn scheduled_tick(
    f: Arc<RelayHandler>,
    k: usize,
    at: Instant,
) -> tokio::task::JoinHandle<RelaySummary> {
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        let payload = json!({"source": "dynamo-outbox.schedule"});
        let e = event(&format!("tick-{k}"), Duration::from_secs(9), payload);
        f.handle(e).await.unwrap()
    })
}

/// Scheduled invocations that overlap (each starts while the previous one still runs) and
/// doorbells around each handover: from shortly before the leaver's announced stop until
/// shortly after it. A live successor takes the buckets over, so no doorbell starts a
/// relay, and no conditional write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doorbells_at_scheduled_handovers_start_no_relay() {
    let (client, options) = streamed_table(4).await;
    let topic = random_name("handover");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let timing = [
        ("OUTBOX_IDLE_STOP", "never"),
        ("OUTBOX_LEASE_DURATION", "6s"),
        ("OUTBOX_LEASE_RENEW_INTERVAL", "2s"),
    ];
    let (scheduled, wire) = function(&options, &timing).await;
    let (bells, bell_wire) = function(&options, &timing).await;
    // Each invocation: deadline 9 s away -> runs 6 s (shutdown margin 3 s) and announces
    // its stop 4 s in (stop reserve 2 s). A new one every 3 s: the next one has run about a
    // second (and a round) when the previous one's announced stop comes.
    const HANDOVERS: usize = 3;
    let period = Duration::from_secs(3);
    let t0 = Instant::now();
    let ticks: Vec<_> = (0..=HANDOVERS)
        .map(|k| scheduled_tick(scheduled.clone(), k, t0 + period * k as u32))
        .collect();
    // One message before the fleet starts, and its stream records: the doorbell every
    // bell below rings (reading the stream per bell would take longer than the bells'
    // spacing); each bell also commits one more message, off the bell's schedule.
    let mut written = enqueue(&writer, &topic, &["first"]).await;
    let payload = doorbell_since(&options, None).0;
    let mut bell_summaries = Vec::new();
    let mut commits = Vec::new();
    for k in 0..HANDOVERS {
        // Invocation k announces its stop at about t0 + 3k + 4 s; its successor (k + 1)
        // started a second before. Bells from 0.5 s before the stop to 0.5 s after it.
        let stop = t0 + period * k as u32 + Duration::from_secs(4);
        let mut handles = Vec::new();
        for j in 0..6u32 {
            let at = stop - Duration::from_millis(500) + Duration::from_millis(200) * j;
            tokio::time::sleep_until(at).await;
            let w = writer.clone();
            let topic = topic.clone();
            commits.push(tokio::spawn(async move {
                enqueue(&w, &topic, &[format!("h{k}-{j}").as_str()]).await
            }));
            let b = bells.clone();
            let payload = payload.clone();
            handles.push(tokio::spawn(async move {
                let at = t0.elapsed();
                let summary = b
                    .handle(event(
                        &format!("bell-{k}-{j}"),
                        Duration::from_secs(20),
                        payload,
                    ))
                    .await
                    .unwrap();
                (at, summary)
            }));
        }
        for h in handles {
            bell_summaries.push(h.await.unwrap());
        }
    }
    for c in commits {
        written.extend(c.await.unwrap());
    }
    let mut ticked = Vec::new();
    for t in ticks {
        ticked.push(t.await.unwrap());
    }
    let joiners: Vec<&(Duration, RelaySummary)> = bell_summaries
        .iter()
        .filter(|(_, s)| s.stop_reason.ran())
        .collect();
    println!(
        "{} doorbells over {HANDOVERS} handovers, {} joined",
        bell_summaries.len(),
        joiners.len()
    );
    assert!(
        joiners.is_empty(),
        "doorbells started relays at a handover: {joiners:?}"
    );
    let refused: u64 = ticked.iter().map(|s| s.refused_writes).sum();
    assert_eq!(refused, 0, "{ticked:?}");
    assert_no_refusal_on_the_wire(&wire, "the scheduled invocations");
    assert_no_refusal_on_the_wire(&bell_wire, "the doorbells");
    assert!(ticked.iter().all(|s| s.released), "{ticked:?}");
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_at_least_once(&written);
}

/// A successor that announces its stop before it would take the leaver's bucket is no
/// coverage: a doorbell at that handover joins and publishes, instead of leaving the
/// message to the next tick. One bucket, poll interval 1 s, each invocation announcing its
/// stop 5 s before its deadline: the leaver A announces its stop at 4 s; the successor S,
/// started at 2 s, at 4.25 s, before the handover steps after A's stop in which it would
/// take A's bucket. Kafka refuses until 4.5 s, so neither publishes the message. The bell
/// rings at 3.05 s: A stops within its poll interval, and S is "live" by its own stop
/// (more than a poll interval away) but gone by the time it would hold A's bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_doorbell_at_a_handover_to_a_short_lived_successor_joins_and_publishes() {
    let (client, options) = streamed_table(1).await;
    let kafka = common::ProxiedTopic::start("short-successor").await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let timing = [
        ("KAFKA_BOOTSTRAP_SERVERS", kafka.bootstrap.as_str()),
        ("OUTBOX_IDLE_STOP", "never"),
        ("OUTBOX_POLL_INTERVAL", "1s"),
        ("OUTBOX_ERROR_BACKOFF", "200ms"),
        ("OUTBOX_LEASE_DURATION", "6s"),
        ("OUTBOX_LEASE_RENEW_INTERVAL", "2s"),
    ];
    kafka.broker.proxy.refuse();
    let written = enqueue(&writer, &kafka.topic, &["waiting"]).await;
    let (payload, _) = doorbell_since(&options, None);
    let (scheduled, wire) = function(&options, &timing).await;
    let (bells, bell_wire) = function(&options, &timing).await;
    let t0 = Instant::now();
    let tick = |f: Arc<RelayHandler>, id: &'static str, at: Duration, deadline: Duration| {
        tokio::spawn(async move {
            tokio::time::sleep_until(t0 + at).await;
            let payload = json!({"source": "dynamo-outbox.schedule"});
            f.handle(event(id, deadline, payload)).await.unwrap()
        })
    };
    let leaver = tick(
        scheduled.clone(),
        "leaver",
        Duration::ZERO,
        Duration::from_secs(9),
    );
    let successor = tick(
        scheduled.clone(),
        "short-lived",
        Duration::from_secs(2),
        Duration::from_millis(7250),
    );
    tokio::time::sleep_until(t0 + Duration::from_millis(3050)).await;
    let bell = tokio::spawn({
        let bells = bells.clone();
        async move {
            let e = event("bell", Duration::from_secs(14), payload);
            bells.handle(e).await.unwrap()
        }
    });
    tokio::time::sleep_until(t0 + Duration::from_millis(4500)).await;
    kafka.broker.proxy.pass();
    let bell = bell.await.unwrap();
    assert_eq!(bell.trigger, Trigger::Doorbell);
    assert!(
        bell.stop_reason.ran(),
        "the doorbell counted a successor that leaves first as coverage: {bell:?}"
    );
    assert_eq!(bell.published, 1, "{bell:?}");
    Deliveries::of(&kafka.records()).assert_at_least_once(&written);
    for summary in [leaver.await.unwrap(), successor.await.unwrap(), bell] {
        assert_eq!(summary.refused_writes, 0, "{summary:?}");
        assert!(summary.released, "{summary:?}");
    }
    assert_no_refusal_on_the_wire(&wire, "the scheduled invocations");
    assert_no_refusal_on_the_wire(&bell_wire, "the doorbell");
}

/// A doorbell whose coverage read fails (every attempt the SDK makes) is not a lost
/// wake-up: the invocation cannot tell whether live relays cover the buckets, so it joins,
/// says why in its summary, and publishes. No function error, which the stream mapping
/// would answer by holding up the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doorbell_whose_coverage_read_fails_joins_and_publishes() {
    let (client, options) = streamed_table(2).await;
    let topic = random_name("doubt");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let written = enqueue(&writer, &topic, &["a", "b", "c"]).await;
    let (doorbell, _) = doorbell_since(&options, None);

    // Every coverage read the decision makes fails: each is made again after a pause
    // (`LOOK_ATTEMPTS` reads), and each read is up to three attempts (the SDK's two
    // retries; an interceptor's error may also end it at the first: then the relay's next
    // reads fail and are retried on its back-off).
    let failing = Fault::on("Query")
        .times(3 * dynamo_outbox::notification::LOOK_ATTEMPTS)
        .fail("injected: Query unavailable");
    let faulty = faulty_dynamodb(&failing).await;
    let function = RelayHandler::new(faulty, settings(&options, &[])).unwrap();
    let summary = function
        .handle(event("doubt", Duration::from_secs(20), doorbell))
        .await
        .expect("a failed coverage read is no function error");
    assert_eq!(summary.trigger, Trigger::Doorbell);
    assert!(summary.stop_reason.ran(), "{summary:?}");
    let doubt = summary.doubt.as_deref().unwrap_or_default();
    assert!(
        doubt.contains("coordination partition") && doubt.contains("injected"),
        "{summary:?}"
    );
    wait_for_ids(&topic, &written, Duration::from_secs(20))
        .await
        .assert_at_least_once(&written);
    assert_eq!(pending_messages(&client, &options).await, 0);
    assert_eq!(summary.published, written.len() as u64, "{summary:?}");
    assert_eq!(summary.refused_writes, 0, "{summary:?}");
}

/// A doorbell on a cold start while Kafka refuses connections is not a lost wake-up: the
/// invocation joins (its head-start connection gives up after the connect timeout, which
/// is no part of the decision), the relay retries the connection on its back-off, and
/// publishes once Kafka is back, within the invocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doorbell_on_a_cold_start_with_kafka_unreachable_publishes_once_kafka_returns() {
    let (client, options) = streamed_table(2).await;
    let kafka = common::ProxiedTopic::start("cold").await;
    let (bootstrap, topic) = (&kafka.bootstrap, &kafka.topic);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let written = enqueue(&writer, topic, &["a", "b", "c"]).await;
    let (doorbell, _) = doorbell_since(&options, None);

    kafka.broker.proxy.refuse();
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
    // Refused for longer than one connection attempt may take.
    let reopen = async {
        tokio::time::sleep(dynamo_outbox::publish::CONNECT_TIMEOUT + Duration::from_secs(2)).await;
        kafka.broker.proxy.pass();
    };
    let (summary, ()) = tokio::join!(
        function.handle(event("cold", Duration::from_secs(40), doorbell)),
        reopen
    );
    let summary = summary.expect("Kafka unreachable is no function error");
    assert_eq!(summary.trigger, Trigger::Doorbell);
    assert!(summary.stop_reason.ran(), "{summary:?}");
    assert!(!summary.kafka_client_reused, "{summary:?}");
    assert!(
        summary.publish_failures > 0,
        "it tried while Kafka refused: {summary:?}"
    );
    assert_eq!(summary.published, written.len() as u64, "{summary:?}");
    assert_eq!(pending_messages(&client, &options).await, 0);
    Deliveries::of(&kafka.records()).assert_at_least_once(&written);
}
