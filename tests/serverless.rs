//! The relay's idle stop against DynamoDB Local and the local broker: an idle run stops
//! early with everything released, and a commit that lands just as a relay decides to
//! stop still reaches Kafka promptly, whichever side of the stop announcement it lands on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::accounting::RequestCounter;
use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, OutboxOptions, Relay, RelayOptions, StopReason,
};
use outbox_testkit::*;
use tokio::time::Instant;

/// Where the interceptor holds the relay's idle-stop announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Before it is sent: a commit made meanwhile is older than the announcement.
    BeforeSend,
    /// After DynamoDB answered: a commit made meanwhile is newer than the announcement.
    AfterAnswer,
}

/// Holds the first stop announcement of a relay (where `hold` says) until the test
/// releases it.
fn announcement_gate(hold: Hold) -> Fault {
    let gate = Fault::on("UpdateItem").when(is_announcement).times(1);
    match hold {
        Hold::BeforeSend => gate.hold_before_send(),
        Hold::AfterAnswer => gate.hold_after_answer(),
    }
}

/// The idle stop's announcement: a heartbeat whose `StopsAtUtc` is its own time (a
/// heartbeat of a run with a deadline announces a later stop).
fn is_announcement(json: &serde_json::Value) -> bool {
    let values = &json["ExpressionAttributeValues"];
    let (now, stops) = (&values[":now"]["N"], &values[":stops"]["N"]);
    stops.is_string() && now == stops
}

/// A client with the gate (when given) and a wire counter of refused conditions.
async fn client_with(gate: Option<Fault>, counter: &RequestCounter) -> aws_sdk_dynamodb::Client {
    stack_var("AWS_ENDPOINT_URL_DYNAMODB");
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let mut builder = aws_sdk_dynamodb::config::Builder::from(&config).interceptor(counter.clone());
    if let Some(g) = gate {
        builder = builder.interceptor(g);
    }
    aws_sdk_dynamodb::Client::from_conf(builder.build())
}

/// When the relay last reported a publish.
#[derive(Debug, Default)]
struct LastPublish(std::sync::Mutex<Option<Instant>>);

impl LastPublish {
    fn at(&self) -> Option<Instant> {
        *self.0.lock().unwrap()
    }
}

impl dynamo_outbox::metrics::RelayMetrics for LastPublish {
    fn published(&self, _bucket: u32, _count: u64) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

fn idle_options(relay_id: &str, bucket_count: u32, idle: Duration) -> RelayOptions {
    fast_relay_options(relay_id, bucket_count).with_idle_stop(idle)
}

async fn relay(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    relay_options: RelayOptions,
) -> Relay<dynamo_outbox::publish::KafkaPublisher> {
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    Relay::new(store, kafka_publisher().await, relay_options).unwrap()
}

async fn enqueue(
    writer: &DynamoDbOutboxWriter,
    topic: &str,
    keys: &[&str],
) -> std::collections::BTreeSet<String> {
    let messages: Vec<_> = keys
        .iter()
        .map(|k| {
            writer
                .message(topic)
                .with_key(*k)
                .with_value(format!("{k}:1"))
        })
        .collect();
    writer.enqueue(&messages).await.unwrap();
    id_set(&messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_relay_stops_early_with_everything_released() {
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("idle");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let written = enqueue(&writer, &topic, &["a", "b", "c", "d", "e"]).await;

    let idle = Duration::from_secs(1);
    let last_publish = Arc::new(LastPublish::default());
    let r = relay(&client, &options, idle_options("idler", 4, idle))
        .await
        .with_metrics(last_publish.clone());
    let started = Instant::now();
    // A deadline far away: only the idle stop ends this run early.
    let report = r
        .run_until(started + Duration::from_secs(120))
        .await
        .unwrap();
    let stopped = Instant::now();

    assert_eq!(report.stop_reason, StopReason::Idle, "{report:?}");
    assert!(report.released, "{report:?}");
    assert_eq!(report.published, 5);
    // It stopped once its buckets had been empty for the idle time: after it, and within a
    // couple of polls (100 ms) and the stop's writes of it, not at the deadline.
    let last = last_publish.at().expect("the relay published");
    let empty_for = stopped - last;
    println!("stopped {empty_for:?} after its last publish (idle stop {idle:?})");
    assert!(
        empty_for >= idle && empty_for < idle + Duration::from_secs(2),
        "stopped {empty_for:?} after its last publish, idle stop {idle:?}"
    );
    assert!(lease_owners(&client, &options)
        .await
        .iter()
        .all(Option::is_none));
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);
    assert_eq!(report.refused_total(), 0);
    assert_no_refusal_on_the_wire(&counter, "idle relay");

    // A relay that owns nothing because a live peer holds every bucket is idle too: one
    // bucket, two relays; the holder ranks first by id, so the newcomer is a standby.
    let options = fresh_table(&client, 1).await;
    let holder = relay(&client, &options, fast_relay_options("holder", 1)).await;
    let (stop_holder, stopped) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        holder
            .run_until_shutdown(
                async move {
                    let _ = stopped.await;
                },
                Duration::from_secs(10),
            )
            .await
    });
    let until = Instant::now() + Duration::from_secs(30);
    while lease_owners(&client, &options)
        .await
        .iter()
        .any(|o| o.as_deref() != Some("holder"))
    {
        assert!(Instant::now() < until, "the holder never held every bucket");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let standby = relay(&client, &options, idle_options("standby", 1, idle)).await;
    let report = standby
        .run_until(Instant::now() + Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(report.stop_reason, StopReason::Idle, "{report:?}");
    assert_eq!(
        (report.max_owned, report.leases_acquired),
        (0, 0),
        "{report:?}"
    );
    let _ = stop_holder.send(());
    let held = holder.await.unwrap().unwrap();
    assert_eq!(held.refused_total() + report.refused_total(), 0);
    assert_no_refusal_on_the_wire(&counter, "holder and idle standby");
}

/// A commit lands while a relay is stopping for idleness. `hold` says on which side of
/// the stop announcement; either way the message reaches Kafka within a few seconds (by
/// the stopping relay, or by the relay a doorbell starts), and no write is refused.
async fn commit_at_the_idle_stop(hold: Hold) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let counter = RequestCounter::default();
    let plain = client_with(None, &counter).await;
    let options = fresh_table(&plain, 2).await;
    let topic = random_name("race");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(plain.clone(), options.clone()).unwrap();
    let store = DynamoDbOutboxStore::new(plain.clone(), options.clone()).unwrap();

    let gate = announcement_gate(hold);
    let gated = client_with(Some(gate.clone()), &counter).await;
    let stopping = relay(
        &gated,
        &options,
        idle_options("stopping", 2, Duration::from_millis(800)),
    )
    .await;
    let stopping = tokio::spawn(async move {
        stopping
            .run_until(Instant::now() + Duration::from_secs(120))
            .await
    });
    // The relay holds both buckets, finds them empty and decides to stop.
    let held = gate.clone();
    let reached = tokio::task::spawn_blocking(move || held.wait_held(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(reached, "the relay never announced an idle stop");
    let committed = Instant::now();
    let written = enqueue(&writer, &topic, &["k"]).await;
    // What a doorbell for this commit sees now.
    let doorbell_sees = store
        .uncovered(&[0, 1], &fast_relay_options("doorbell", 2))
        .await
        .unwrap();
    let joiner = if doorbell_sees.is_empty() {
        None
    } else {
        // The doorbell starts a relay, as the function does for uncovered buckets.
        let j = relay(
            &plain,
            &options,
            idle_options("joiner", 2, Duration::from_millis(800)),
        )
        .await;
        Some(tokio::spawn(async move {
            j.run_until(Instant::now() + Duration::from_secs(120)).await
        }))
    };
    gate.release();
    wait_for_ids(&topic, &written, Duration::from_secs(30)).await;
    let latency = committed.elapsed();

    let first = stopping.await.unwrap().unwrap();
    assert_eq!(first.stop_reason, StopReason::Idle, "{first:?}");
    assert!(first.released);
    let mut published = first.published;
    let mut refused = first.refused_total();
    if let Some(j) = joiner {
        let j = j.await.unwrap().unwrap();
        assert_eq!(j.stop_reason, StopReason::Idle, "{j:?}");
        published += j.published;
        refused += j.refused_total();
    }
    match hold {
        // Committed before the announcement: the stopping relay's last probe sees it, so
        // it goes on and publishes the message itself.
        Hold::BeforeSend => assert_eq!(first.published, 1, "{first:?}"),
        // Committed after the announcement: the doorbell no longer counts the stopping
        // relay and starts one (which, or the stopping relay's probe, publishes it).
        Hold::AfterAnswer => assert!(
            !doorbell_sees.is_empty(),
            "a doorbell saw the stopping relay as covering"
        ),
    }
    assert_eq!(published, 1);
    topic_deliveries(&topic).assert_exactly_once(&written);
    assert_eq!(refused, 0);
    assert_no_refusal_on_the_wire(&counter, "commit at the idle stop");
    assert!(lease_owners(&plain, &options)
        .await
        .iter()
        .all(Option::is_none));
    // "Within about a second" of the relay being let go; generous for a loaded machine.
    assert!(
        latency < Duration::from_secs(10),
        "commit to Kafka took {latency:?}"
    );
    println!("{hold:?}: commit to Kafka in {latency:?}, doorbell saw {doorbell_sees:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_just_before_the_idle_stop_announcement_is_published_by_the_stopping_relay() {
    commit_at_the_idle_stop(Hold::BeforeSend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_just_after_the_idle_stop_announcement_makes_a_doorbell_start_a_relay() {
    commit_at_the_idle_stop(Hold::AfterAnswer).await;
}

/// Two overlapping runs with the idle stop and a trickle of commits: they do not pass
/// buckets back and forth, neither loses a lease to the other, and once the trickle ends
/// both stop for idleness, gracefully, with everything delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_overlapping_idle_runs_neither_ping_pong_nor_stop_each_other() {
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let options = fresh_table(&client, 4).await;
    let topic = random_name("overlap");
    create_topic(&topic, 2);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let idle = Duration::from_millis(1500);
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = relay(&client, &options, idle_options("overlap-a", 4, idle)).await;
    let first = tokio::spawn(async move { first.run_until(deadline).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = relay(&client, &options, idle_options("overlap-b", 4, idle)).await;
    let second = tokio::spawn(async move { second.run_until(deadline).await });
    // A commit every 400 ms for 6 s, over every key: work for both.
    let mut written = std::collections::BTreeSet::new();
    let trickle_end = Instant::now() + Duration::from_secs(6);
    let mut n = 0;
    while Instant::now() < trickle_end {
        let key = format!("k{}", n % 8);
        written.extend(enqueue(&writer, &topic, &[key.as_str()]).await);
        n += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let trickle_done = Instant::now();
    let a = first.await.unwrap().unwrap();
    let b = second.await.unwrap().unwrap();
    for r in [&a, &b] {
        assert_eq!(r.stop_reason, StopReason::Idle, "{r:?}");
        assert!(r.released, "{r:?}");
        assert_eq!(r.leases_lost, 0, "{r:?}");
    }
    // Both ended soon after the trickle (idle time 1.5 s), not at the deadline (2 min).
    assert!(trickle_done.elapsed() < Duration::from_secs(60));
    // Each bucket changed hands at most twice: the first claims, the newcomer's share,
    // the survivor's takeover when the other stops.
    assert!(
        a.leases_acquired + b.leases_acquired <= 2 * 4,
        "buckets passed back and forth: {a:?} {b:?}"
    );
    assert_eq!(a.published + b.published, written.len() as u64);
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);
    assert_eq!(a.refused_total() + b.refused_total(), 0);
    assert_no_refusal_on_the_wire(&counter, "two overlapping idle runs");
    assert!(lease_owners(&client, &options)
        .await
        .iter()
        .all(Option::is_none));
}

/// Waits until `relay_id` holds every bucket of the table.
async fn wait_until_holds_all(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
    relay_id: &str,
) {
    let until = Instant::now() + Duration::from_secs(30);
    while lease_owners(client, options)
        .await
        .iter()
        .any(|o| o.as_deref() != Some(relay_id))
    {
        assert!(Instant::now() < until, "{relay_id} never held every bucket");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A scheduled relay's successor starts while the relay it succeeds still holds every
/// bucket and leaves first (its deadline is nearer): the successor must not stop for
/// idleness meanwhile, or the buckets are left with nobody to take them at the leaver's
/// stop, and commits wait for the next tick (the cost model's `WakeOn=schedule` at a
/// steady load: p99 54 s). It waits, takes the buckets over at the leaver's stop, publishes
/// what is committed after it, and only then stops idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_successor_does_not_idle_out_while_the_relay_it_succeeds_is_about_to_leave() {
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let options = fresh_table(&client, 1).await;
    let topic = random_name("successor");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();

    // The leaver ranks first by id and holds the one bucket; it stops at its deadline.
    let leaver = relay(&client, &options, fast_relay_options("a-leaver", 1)).await;
    let leaver_deadline = Instant::now() + Duration::from_secs(12);
    let leaver = tokio::spawn(async move { leaver.run_until(leaver_deadline).await });
    wait_until_holds_all(&client, &options, "a-leaver").await;

    // The successor has a later deadline and an idle stop (1 s) far shorter than the time
    // the leaver has left.
    let successor = relay(
        &client,
        &options,
        idle_options("b-successor", 1, Duration::from_secs(1)),
    )
    .await;
    let successor_deadline = Instant::now() + Duration::from_secs(120);
    let successor = tokio::spawn(async move { successor.run_until(successor_deadline).await });

    let left = leaver.await.unwrap().unwrap();
    assert_eq!(left.stop_reason, StopReason::Deadline, "{left:?}");
    assert!(left.released, "{left:?}");
    // Committed after the leaver left: only the successor can publish these.
    let written = enqueue(&writer, &topic, &["a", "b", "c"]).await;
    wait_for_ids(&topic, &written, Duration::from_secs(30))
        .await
        .assert_exactly_once(&written);

    let succeeded = successor.await.unwrap().unwrap();
    assert_eq!(succeeded.stop_reason, StopReason::Idle, "{succeeded:?}");
    assert_eq!(succeeded.published, 3, "{succeeded:?}");
    assert_eq!(
        (
            succeeded.leases_acquired,
            succeeded.leases_lost,
            left.leases_lost
        ),
        (1, 0, 0),
        "{succeeded:?} {left:?}"
    );
    assert!(succeeded.released, "{succeeded:?}");
    assert_eq!(succeeded.refused_total() + left.refused_total(), 0);
    assert_no_refusal_on_the_wire(&counter, "a leaver and its successor");
}

/// The idle decision is taken on the read of the relay's last round, up to a renew
/// interval old. A newcomer whose holder hands it its share after that read must claim the
/// bucket, not stop for idleness with it unheld (the cost model's doorbell mode at a
/// steady load: 4 buckets unowned for about 10 s). Here the newcomer joins just after a
/// round of the holder (rounds 2 s apart), its own rounds are 30 s apart and its idle stop
/// is 4 s: the hand-over lands between its first round and its idle decision, and only a
/// fresh read at the decision sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_about_to_idle_out_takes_the_buckets_handed_over_since_its_last_round() {
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let options = fresh_table(&client, 2).await;
    let slow_rounds = |id: &str, renew: Duration| {
        fast_relay_options(id, 2)
            .with_lease_duration(Duration::from_secs(60))
            .with_lease_renew_interval(renew)
    };
    // The holder runs until shut down (it announces no stop).
    let holder = relay(
        &client,
        &options,
        slow_rounds("a-holder", Duration::from_secs(2)),
    )
    .await;
    let (stop_holder, stopped) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        holder
            .run_until_shutdown(
                async move {
                    let _ = stopped.await;
                },
                Duration::from_secs(10),
            )
            .await
    });
    wait_until_holds_all(&client, &options, "a-holder").await;

    // Join right after one of the holder's rounds: the newcomer's first read comes well
    // before the holder's next round, which hands it its share.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let last_seen = || async {
        let c = store.read_coordination().await.unwrap();
        c.relays
            .iter()
            .find(|r| r.relay_id == "a-holder")
            .map(|r| r.last_seen)
    };
    let seen = last_seen().await;
    let until = Instant::now() + Duration::from_secs(30);
    while last_seen().await == seen {
        assert!(Instant::now() < until, "the holder ran no round");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let newcomer = relay(
        &client,
        &options,
        slow_rounds("b-newcomer", Duration::from_secs(30)).with_idle_stop(Duration::from_secs(4)),
    )
    .await;
    let started = Instant::now();
    let report = newcomer
        .run_until(started + Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(report.stop_reason, StopReason::Idle, "{report:?}");
    // It took the share handed to it and ran on with it until that too was idle; it
    // stopped before its next scheduled round (30 s).
    assert_eq!(
        (report.leases_acquired, report.max_owned, report.leases_lost),
        (1, 1, 0),
        "{report:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(report.released, "{report:?}");

    let _ = stop_holder.send(());
    let held = holder.await.unwrap().unwrap();
    assert_eq!(held.leases_lost, 0, "{held:?}");
    assert_eq!(held.refused_total() + report.refused_total(), 0);
    assert_no_refusal_on_the_wire(
        &counter,
        "a holder handing over to a newcomer about to idle out",
    );
}

/// Records the successors a relay asks for.
#[derive(Debug, Default)]
struct RecordingSuccessor {
    started: Mutex<Vec<dynamo_outbox::notification::Handoff>>,
}

impl dynamo_outbox::notification::Successor for RecordingSuccessor {
    fn start<'a>(
        &'a self,
        handoff: &'a dynamo_outbox::notification::Handoff,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = dynamo_outbox::Result<()>> + Send + 'a>>
    {
        self.started.lock().unwrap().push(handoff.clone());
        Box::pin(async { Ok(()) })
    }
}

/// Refuses every publish, as a Kafka that is down.
#[derive(Debug)]
struct KafkaDown;

impl dynamo_outbox::publish::Publisher for KafkaDown {
    async fn publish(
        &self,
        _: &[dynamo_outbox::message::StoredMessage],
    ) -> dynamo_outbox::publish::PublishOutcome {
        dynamo_outbox::publish::PublishOutcome::failed(dynamo_outbox::Error::Kafka {
            message: "injected: connection refused".into(),
            retryable: true,
            source: None,
        })
    }
}

/// A run with a deadline that still has work in its buckets when its deadline nears
/// (here: Kafka down, so nothing leaves) starts one successor, naming those buckets and
/// itself; a run whose buckets are empty starts none. Both runs are a little longer than
/// the shortest that may start one (twice the successor lead, plus the stop reserve).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_leaves_work_starts_one_successor_and_an_empty_one_none() {
    use dynamo_outbox::notification::SUCCESSOR_LEAD;
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let busy = fresh_table(&client, 2).await;
    let empty = fresh_table(&client, 2).await;
    let topic = random_name("successor");
    let writer = DynamoDbOutboxWriter::new(client.clone(), busy.clone()).unwrap();
    let written = enqueue(&writer, &topic, &["a", "b", "c", "d"]).await;
    let run =
        SUCCESSOR_LEAD * 2 + dynamo_outbox::relay::DEFAULT_STOP_RESERVE + Duration::from_secs(1);

    let run_one = |options: OutboxOptions, id: &'static str| {
        let client = client.clone();
        async move {
            let successor = Arc::new(RecordingSuccessor::default());
            let store = DynamoDbOutboxStore::new(client, options).unwrap();
            let relay = Relay::new(store, Arc::new(KafkaDown), fast_relay_options(id, 2))
                .unwrap()
                .with_successor(successor.clone());
            let report = relay.run_until(Instant::now() + run).await.unwrap();
            let started = successor.started.lock().unwrap().clone();
            (report, started)
        }
    };
    let ((busy_report, busy_started), (empty_report, empty_started)) = tokio::join!(
        run_one(busy.clone(), "leaves-work"),
        run_one(empty.clone(), "leaves-nothing")
    );

    assert_eq!(
        busy_report.stop_reason,
        StopReason::Deadline,
        "{busy_report:?}"
    );
    assert!(busy_report.successor_started, "{busy_report:?}");
    assert_eq!(
        busy_started.len(),
        1,
        "one successor per run: {busy_started:?}"
    );
    let handoff = &busy_started[0];
    assert_eq!(handoff.predecessor, "leaves-work");
    assert_eq!(
        (handoff.table.as_str(), handoff.bucket_count),
        (busy.table_name.as_str(), 2)
    );
    let waiting: std::collections::BTreeSet<u32> = scan_all(&client, &busy.table_name)
        .await
        .iter()
        .filter_map(|item| {
            let pk = item.get(&busy.partition_key_attribute)?.as_s().ok()?;
            pk.strip_prefix(&dynamo_outbox::protocol::schema::Keys::new(&busy).messages_prefix())?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(pending_messages(&client, &busy).await, written.len());
    assert_eq!(
        handoff
            .buckets
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        waiting,
        "the handoff names the buckets with messages"
    );

    assert!(!empty_report.successor_started, "{empty_report:?}");
    assert!(empty_started.is_empty(), "{empty_started:?}");
    assert_eq!(
        busy_report.refused_total() + empty_report.refused_total(),
        0
    );
}

/// A run that finds no work left at its successor lead, then takes a message it cannot
/// publish (Kafka down), looks again when its work ends and starts one successor for it,
/// instead of leaving the message to the next wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_that_arrives_after_the_successor_look_gets_a_successor_at_the_end() {
    use dynamo_outbox::notification::SUCCESSOR_LEAD;
    use dynamo_outbox::relay::DEFAULT_STOP_RESERVE;
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("late-work");
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let run = SUCCESSOR_LEAD * 2 + DEFAULT_STOP_RESERVE + Duration::from_secs(1);
    let successor = Arc::new(RecordingSuccessor::default());
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay = Relay::new(
        store,
        Arc::new(KafkaDown),
        fast_relay_options("late-work", 2),
    )
    .unwrap()
    .with_successor(successor.clone());
    // The look at the lead comes at the end of work (the deadline less the stop reserve)
    // less the lead: 11 s into this run. The message comes 3 s after it, 7 s before the end.
    let look = run - DEFAULT_STOP_RESERVE - SUCCESSOR_LEAD;
    let late = async {
        tokio::time::sleep(look + Duration::from_secs(3)).await;
        enqueue(&writer, &topic, &["late"]).await
    };
    let (report, written) = tokio::join!(relay.run_until(Instant::now() + run), late);
    let report = report.unwrap();
    assert_eq!(report.stop_reason, StopReason::Deadline, "{report:?}");
    assert!(report.publish_failures > 0, "it tried: {report:?}");
    assert!(report.successor_started, "{report:?}");
    let handoffs = successor.started.lock().unwrap().clone();
    assert_eq!(handoffs.len(), 1, "one successor per run: {handoffs:?}");
    assert_eq!(
        handoffs[0].buckets.len(),
        1,
        "the late message's bucket: {handoffs:?}"
    );
    assert_eq!(pending_messages(&client, &options).await, written.len());
    assert_eq!(report.refused_total(), 0, "{report:?}");
}

/// A bucket parked behind a poison item (here a topic outside the allow-list, under the
/// default policy `block`) is not work left: a run long enough to start a successor, whose
/// other messages all go out, starts none, and leaves the poison item where it is for an
/// operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parked_bucket_starts_no_successor() {
    use dynamo_outbox::notification::SUCCESSOR_LEAD;
    use dynamo_outbox::options::TopicAllowList;
    let counter = RequestCounter::default();
    let client = client_with(None, &counter).await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("parked");
    create_topic(&topic, 2);
    // A writer without the allow-list puts a message on a topic the relay refuses, then
    // good ones behind it and beside it.
    let direct = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let poison = direct
        .message("audit")
        .with_key("k")
        .with_value("not for Kafka");
    let parked = direct.enqueue(std::slice::from_ref(&poison)).await.unwrap()[0].bucket;
    let good: Vec<_> = ["k", "a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|k| direct.message(&topic).with_key(*k).with_value("v"))
        .collect();
    let placed = direct.enqueue(&good).await.unwrap();
    // What waits behind the poison item (its bucket), and what goes out (the other one).
    let (behind, free): (Vec<_>, Vec<_>) = good
        .iter()
        .zip(&placed)
        .partition(|(_, p)| p.bucket == parked);
    assert!(!free.is_empty(), "some messages in the other bucket");
    let free = id_set(free.into_iter().map(|(m, _)| m));

    let list = TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", &topic).unwrap();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone().with_allowed_topics(list))
        .unwrap();
    let successor = Arc::new(RecordingSuccessor::default());
    let relay = Relay::new(
        store,
        kafka_publisher().await,
        fast_relay_options("parks", 2),
    )
    .unwrap()
    .with_successor(successor.clone());
    let run =
        SUCCESSOR_LEAD * 2 + dynamo_outbox::relay::DEFAULT_STOP_RESERVE + Duration::from_secs(1);
    let report = relay.run_until(Instant::now() + run).await.unwrap();

    assert_eq!(report.stop_reason, StopReason::Deadline, "{report:?}");
    assert!(!report.successor_started, "{report:?}");
    let started = successor.started.lock().unwrap().clone();
    assert!(started.is_empty(), "a parked bucket started {started:?}");
    // The other bucket's messages went out; the parked bucket's wait behind the poison.
    wait_for_ids(&topic, &free, Duration::from_secs(10))
        .await
        .assert_exactly_once(&free);
    assert_eq!(
        pending_messages(&client, &options).await,
        1 + behind.len(),
        "the poison item and the messages behind it stay"
    );
    assert_eq!(report.refused_total(), 0, "{report:?}");
    assert_no_refusal_on_the_wire(&counter, "a parked bucket");
}

/// Counts the runs that could not start their successor.
#[derive(Debug, Default)]
struct SuccessorFailures(std::sync::atomic::AtomicU32);

impl dynamo_outbox::metrics::RelayMetrics for SuccessorFailures {
    fn successor_failed(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The continuations in `options`' table: (relay id, sort key, time to live).
async fn continuations(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
) -> Vec<(String, String, u64)> {
    let keys = dynamo_outbox::protocol::schema::Keys::new(options);
    scan_all(client, &options.table_name)
        .await
        .iter()
        .filter_map(|item| {
            let pk = item.get(&options.partition_key_attribute)?.as_s().ok()?;
            let relay = pk.strip_prefix(&keys.continuations_prefix())?;
            let sk = item.get(&options.sort_key_attribute)?.as_s().ok()?;
            let ttl = item
                .get(dynamo_outbox::protocol::attr::TIME_TO_LIVE)?
                .as_n()
                .ok()?
                .parse()
                .ok()?;
            Some((relay.to_owned(), sk.clone(), ttl))
        })
        .collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A run that leaves work (Kafka down: three messages it cannot publish) with a
/// [`StreamSuccessor`](dynamo_outbox::notification::StreamSuccessor) on a client with
/// `fault`, long enough to start one (twice the lead and the stop reserve): the table,
/// the report and the failed successors counted, checked to have stopped by the deadline.
async fn run_leaving_work(
    fault: &Fault,
    relay_id: &str,
) -> (
    aws_sdk_dynamodb::Client,
    OutboxOptions,
    dynamo_outbox::RunReport,
    u32,
) {
    use dynamo_outbox::notification::{StreamSuccessor, SUCCESSOR_LEAD};
    let counter = RequestCounter::default();
    let client = client_with(Some(fault.clone()), &counter).await;
    let options = fresh_table(&client, 2).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    enqueue(&writer, &random_name(relay_id), &["a", "b", "c"]).await;
    fault.arm();
    let run =
        SUCCESSOR_LEAD * 2 + dynamo_outbox::relay::DEFAULT_STOP_RESERVE + Duration::from_secs(1);
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let failures = Arc::new(SuccessorFailures::default());
    let relay = Relay::new(
        store.clone(),
        Arc::new(KafkaDown),
        fast_relay_options(relay_id, 2),
    )
    .unwrap()
    .with_successor(Arc::new(StreamSuccessor::new(&store)))
    .with_metrics(failures.clone());
    let deadline = Instant::now() + run;
    let report = relay.run_until(deadline).await.unwrap();
    assert!(Instant::now() <= deadline, "the run overran its deadline");
    assert_eq!(report.stop_reason, StopReason::Deadline, "{report:?}");
    assert!(report.released, "the stop reserve was whole: {report:?}");
    assert_eq!(report.refused_total(), 0, "{report:?}");
    let failed = failures.0.load(std::sync::atomic::Ordering::SeqCst);
    (client, options, report, failed)
}

/// A run that leaves work (Kafka down) starts its successor through the stream: one
/// continuation item keyed by its relay id and run start, with a time to live two days
/// ahead, written again after the answers to the first two attempts were throttles (each
/// attempt writes the same item, so a retry of a write that landed is never a second
/// successor); the run still stops by its deadline with its leases released, and counts
/// no failed successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_leaves_work_writes_one_continuation_through_throttling() {
    use dynamo_outbox::notification::CONTINUATION_LIFETIME;
    let throttle = Fault::on("PutItem").times(2).disarmed().throttle();
    let before = unix_now();
    let (client, options, report, failed) = run_leaving_work(&throttle, "leaves-work").await;

    assert_eq!(throttle.hits(), 2, "both throttles met the continuation");
    assert!(
        report.successor_started && !report.successor_failed,
        "{report:?}"
    );
    assert_eq!(failed, 0);
    let found = continuations(&client, &options).await;
    assert_eq!(found.len(), 1, "one continuation a run: {found:?}");
    let (relay_id, sk, ttl) = &found[0];
    assert_eq!(relay_id, "leaves-work");
    let run_start_ms: u64 = sk.parse().unwrap();
    assert_eq!(sk.len(), 20, "{sk}");
    assert!(
        (before * 1000..before * 1000 + 5_000).contains(&run_start_ms),
        "the run's start: {run_start_ms} vs {before}"
    );
    let lifetime = CONTINUATION_LIFETIME.as_secs();
    assert!(
        (before + lifetime..=unix_now() + lifetime).contains(ttl),
        "{ttl} is not two days ahead"
    );
}

/// A continuation that cannot be written (every attempt failing before it is sent) is tried
/// within the run at the lead and once more at the last look, bounded by the end of work:
/// the run still stops by its deadline with its leases released (the stop reserve stays
/// whole), and counts one failed successor, which the `SuccessorFailures` metric reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_successor_that_cannot_be_started_is_counted_and_the_run_still_stops_in_time() {
    let outage = Fault::on("PutItem")
        .disarmed()
        .fail("injected: DynamoDB unavailable");
    let (client, options, report, failed) = run_leaving_work(&outage, "cannot-continue").await;

    assert!(outage.hits() >= 2, "attempts: {}", outage.hits());
    assert!(
        !report.successor_started && report.successor_failed,
        "{report:?}"
    );
    assert_eq!(failed, 1);
    outage.disarm();
    assert!(continuations(&client, &options).await.is_empty());
}

/// Whether a request reads the coordination partition.
fn reads_coordination(json: &serde_json::Value) -> bool {
    json["ExpressionAttributeValues"]
        .as_object()
        .is_some_and(|values| {
            values.values().any(|v| {
                v["S"]
                    .as_str()
                    .is_some_and(|s| s.ends_with("#COORDINATION"))
            })
        })
}

/// Fifty wake-ups against a throttled coordination partition (every coverage read throttled
/// for the first two seconds) start a bounded number of relays: each looks again after a
/// growing pause instead of joining in doubt at once, and once the throttle ends the first
/// to join covers the buckets for the rest. Joining at the first failed read would start
/// fifty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_wake_ups_against_a_throttled_coordination_partition_starts_few_relays() {
    use dynamo_outbox::notification::{decide, CommitNotification, Decision};
    let counter = RequestCounter::default();
    let throttle = Fault::on("Query")
        .when(reads_coordination)
        .disarmed()
        .throttle();
    let client = client_with(Some(throttle.clone()), &counter).await;
    let options = fresh_table(&client, 4).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let topic = random_name("throttled-burst");
    create_topic(&topic, 2);
    enqueue(&writer, &topic, &["a", "b", "c", "d", "e", "f"]).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let notification = CommitNotification::new(&options, 0..4);
    throttle.arm();
    let release = {
        let throttle = throttle.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            throttle.disarm();
        })
    };
    let joined = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let publisher = kafka_publisher().await;
    let wake_ups: Vec<_> = (0..50)
        .map(|i| {
            let (store, notification, joined, publisher) = (
                store.clone(),
                notification.clone(),
                joined.clone(),
                publisher.clone(),
            );
            tokio::spawn(async move {
                let id = format!("wake-{i}-{}", random_name("r"));
                let relay_options = fast_relay_options(&id, 4);
                let deadline = Instant::now() + Duration::from_secs(30);
                let decision = decide(
                    &store,
                    &notification,
                    &relay_options,
                    deadline,
                    &id,
                    async {},
                )
                .await;
                if let Decision::Join { .. } = decision {
                    joined.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let relay = Relay::new(store, publisher, relay_options).unwrap();
                    relay
                        .run_until(Instant::now() + Duration::from_secs(8))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in wake_ups {
        w.await.unwrap();
    }
    release.await.unwrap();
    let joined = joined.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        throttle.hits() >= 50,
        "the throttle met the burst: {}",
        throttle.hits()
    );
    assert!(
        (1..=4).contains(&joined),
        "{joined} of 50 wake-ups joined against a throttled partition"
    );
    assert_eq!(pending_messages(&client, &options).await, 0);
}

/// What a host woken for every bucket of `options`' outbox decides (fast relay options, a
/// 30 s deadline, no head start).
async fn wake_once(
    store: &DynamoDbOutboxStore,
    options: &dynamo_outbox::OutboxOptions,
    id: &str,
) -> dynamo_outbox::notification::Decision {
    use dynamo_outbox::notification::{decide, CommitNotification};
    decide(
        store,
        &CommitNotification::new(options, 0..4),
        &fast_relay_options(id, 4),
        Instant::now() + Duration::from_secs(30),
        id,
        async {},
    )
    .await
}

/// The first wake-up of its moment on an idle fleet joins alone (its relay may skip most of
/// the join delay); with a live relay in the coordination partition that covers none of
/// the buckets (its heartbeat 1.5 s old, no lease), it joins but not alone, so its relay
/// waits the whole join delay and the two relays' first plans see each other.
#[tokio::test]
async fn the_first_wake_up_on_an_idle_fleet_joins_alone_and_one_beside_a_live_relay_does_not() {
    use dynamo_outbox::notification::Decision;
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    enqueue(&writer, &random_name("alone"), &["a", "b", "c"]).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let joined_alone = |d: &Decision| match d {
        Decision::Join {
            uncovered,
            doubt,
            alone,
            ..
        } => {
            assert_eq!(uncovered, &vec![0, 1, 2, 3], "{d:?}");
            assert_eq!(doubt, &None, "{d:?}");
            // Alone: its relay's heartbeat must land within ALONE_WITHIN of the last read.
            if let Some(by) = alone {
                assert!(
                    *by <= Instant::now() + dynamo_outbox::notification::ALONE_WITHIN,
                    "{d:?}"
                );
            }
            alone.is_some()
        }
        other => panic!("the wake-up did not join: {other:?}"),
    };
    assert!(joined_alone(
        &wake_once(&store, &options, &random_name("first")).await
    ));

    // Past the first wake-up's window, so that the next one comes first of its own moment.
    tokio::time::sleep(dynamo_outbox::notification::WAKEUP_WINDOW).await;
    // A live relay whose heartbeat (1.5 s old) is older than a round's window (1 s) and
    // younger than the lease (3 s): it holds and is about to claim nothing, so the buckets
    // stay uncovered, but it is there.
    let a_moment_ago = store.clock().now_ticks() - 15_000_000;
    assert!(store
        .heartbeat("live-peer", a_moment_ago, None)
        .await
        .unwrap());
    assert!(!joined_alone(
        &wake_once(&store, &options, &random_name("beside")).await
    ));
}

/// A wake-up is never lost behind a first one that died: a host that wrote its wake-up
/// and never ran its relay (the item is written here by hand, as that host would have)
/// comes first; the next woken host waits for that relay, sees none, and joins itself
/// once the window after the first wake-up has passed, not before and not much later.
#[tokio::test]
async fn a_wake_up_behind_a_first_that_died_joins_once_the_window_has_passed() {
    use dynamo_outbox::notification::{Decision, WAKEUP_WINDOW};
    use dynamo_outbox::protocol::schema::{self, Keys};
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    enqueue(&writer, &random_name("dead-first"), &["a", "b"]).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let keys = Keys::new(&options);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let written = Instant::now();
    client
        .put_item()
        .table_name(&options.table_name)
        .set_item(Some(
            keys.key(keys.wakeup_pk(), schema::wakeup_sk(now_ms, "dead-host")),
        ))
        .send()
        .await
        .unwrap();
    let decision = wake_once(&store, &options, &random_name("live-host")).await;
    let waited = written.elapsed();
    match &decision {
        Decision::Join {
            uncovered,
            doubt,
            alone,
        } => {
            assert!(!uncovered.is_empty(), "{decision:?}");
            assert!(
                alone.is_none(),
                "it waited for another wake-up: {decision:?}"
            );
            assert!(
                doubt
                    .as_deref()
                    .is_some_and(|d| d.contains("first wake-up")),
                "{decision:?}"
            );
        }
        other => panic!("the wake-up behind a dead first was lost: {other:?}"),
    }
    assert!(
        // The window counts from the dead host's time, taken a moment before `written`.
        waited >= WAKEUP_WINDOW - Duration::from_millis(500)
            && waited < WAKEUP_WINDOW + Duration::from_secs(5),
        "joined {waited:?} after the dead host's wake-up"
    );
}
