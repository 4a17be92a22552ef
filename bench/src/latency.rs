//! Latency from enqueue to the record being visible to a Kafka consumer, with the
//! in-process commit notification ([`dynamo_outbox::LocalNotifier`]) and with polling only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, LocalNotifier, Relay, RelayOptions,
};
use rand::Rng;
use rskafka::client::partition::UnknownTopicHandling;
use rskafka::client::ClientBuilder;
use tokio::time::Instant;

use crate::support::{self, Hook, Result};

/// Latencies of one mode.
#[derive(Debug, Clone)]
pub struct Latency {
    /// `notification` or `polling only`.
    pub mode: &'static str,
    /// Messages sent and seen.
    pub messages: usize,
    /// From the enqueue call to the record seen by the consumer.
    pub from_call: Vec<Duration>,
    /// From the commit (the enqueue call returned) to the record seen.
    pub from_commit: Vec<Duration>,
    /// The enqueue calls themselves.
    pub enqueue: Vec<Duration>,
    /// The poll interval of the relay.
    pub poll: Duration,
}

impl Latency {
    /// Prints the figures.
    pub fn print(&self) {
        let q = |v: &[Duration], p: f64| support::ms(support::quantile(&mut v.to_vec(), p));
        println!(
            "{:<14} {} msgs: enqueue->visible p50 {} ms, p99 {} ms, max {} ms; commit->visible p50 {} ms, p99 {} ms; enqueue call p50 {} ms (poll interval {:?})",
            self.mode,
            self.messages,
            q(&self.from_call, 0.5),
            q(&self.from_call, 0.99),
            q(&self.from_call, 1.0),
            q(&self.from_commit, 0.5),
            q(&self.from_commit, 0.99),
            q(&self.enqueue, 0.5),
            self.poll,
        );
    }
}

/// Sends `messages` single-message enqueues about `interval` apart (jittered 0.5x-1.5x, so
/// they do not lock onto the poll phase) and times each until a consumer sees it.
pub async fn measure(notify: bool, messages: usize, interval: Duration) -> Result<Latency> {
    let config = support::sdk_config().await?;
    let client = support::client(&config, None);
    let options = support::fresh_table(&client, 8, 8).await?;
    let publisher = support::publisher().await?;
    let topic = support::fresh_topic(&publisher, 1).await?;

    // The consumer: one partition, long-polling fetches.
    let bootstrap = support::stack_var("KAFKA_BOOTSTRAP_SERVERS")?;
    let kafka = ClientBuilder::new(bootstrap.split(',').map(str::to_string).collect())
        .build()
        .await?;
    let partition = kafka
        .partition_client(topic.clone(), 0, UnknownTopicHandling::Retry)
        .await?;
    let seen: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; messages]));
    // Back-to-back fetches with a 1 ms pause when empty (a long-polling fetch that a broker
    // holds for its whole wait would add up to that wait); BENCH_FETCH_WAIT_MS sets one.
    let wait_ms: i32 = std::env::var("BENCH_FETCH_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let consumer = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut offset = 0i64;
            let until = Instant::now() + Duration::from_secs(600);
            while Instant::now() < until {
                let (records, _high) = match partition
                    .fetch_records(offset, 1..10_000_000, wait_ms)
                    .await
                {
                    Ok(r) => r,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                };
                let now = Instant::now();
                if records.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                for r in records {
                    offset = offset.max(r.offset + 1);
                    let index = r.record.value.as_deref().and_then(support::payload_index);
                    if let Some(slot) = index.and_then(|i| seen.get_mut(i as usize)) {
                        slot.get_or_insert(now);
                    }
                }
                if seen.iter().all(Option::is_some) {
                    return;
                }
            }
        })
    };

    let notifier = LocalNotifier::new();
    let mut writer = DynamoDbOutboxWriter::new(client.clone(), options.clone())?;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone())?;
    let relay_options = RelayOptions::default().with_relay_id("bench-latency");
    let poll = relay_options.poll_interval;
    let hook = Hook::new(None);
    let mut relay = Relay::new(store, publisher, relay_options)?.with_metrics(hook.clone());
    if notify {
        writer = writer.with_notifier(notifier.clone());
        relay = relay.with_notifier(notifier.clone());
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until_shutdown(
                async move {
                    let _ = stopped.await;
                },
                Duration::from_secs(10),
            )
            .await
    });
    // Let it own its buckets and finish its first pass.
    tokio::time::timeout(Duration::from_secs(30), hook.wait_rounds(1))
        .await
        .map_err(|_| "the relay ran no acquisition round in 30 s")?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut sent: Vec<(Instant, Instant)> = Vec::with_capacity(messages);
    for i in 0..messages {
        let message = writer
            .message(&topic)
            .with_key(format!("key-{i}"))
            .with_value(support::payload(1024, i as u64));
        let t0 = Instant::now();
        writer.enqueue(std::slice::from_ref(&message)).await?;
        sent.push((t0, Instant::now()));
        let jitter: f64 = rand::thread_rng().gen_range(0.5..1.5);
        tokio::time::sleep(interval.mul_f64(jitter)).await;
    }
    let all_seen = tokio::time::timeout(Duration::from_secs(60), consumer).await;
    let _ = stop.send(());
    let report = running.await??;
    support::drop_table(&client, &options).await;
    if all_seen.is_err() {
        return Err("not every record reached the consumer within 60 s".into());
    }
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut out = Latency {
        mode: if notify {
            "notification"
        } else {
            "polling only"
        },
        messages,
        from_call: Vec::new(),
        from_commit: Vec::new(),
        enqueue: Vec::new(),
        poll,
    };
    for ((t0, t1), at) in sent.into_iter().zip(seen) {
        let at = at.ok_or("a record was not seen")?;
        out.from_call.push(at.saturating_duration_since(t0));
        out.from_commit.push(at.saturating_duration_since(t1));
        out.enqueue.push(t1 - t0);
    }
    if report.refused_total() > 0 {
        println!("  (refused writes: {})", report.refused_total());
    }
    Ok(out)
}

/// The latency benchmark: notification, then polling only.
pub async fn run(messages: usize, interval: Duration) -> Result<()> {
    println!("== latency enqueue -> visible to a Kafka consumer (1 KB, one message per enqueue, ~{interval:?} apart)");
    let notified = measure(true, messages, interval).await?;
    notified.print();
    let polled = measure(false, messages, interval).await?;
    polled.print();
    Ok(())
}
