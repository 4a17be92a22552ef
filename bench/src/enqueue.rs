//! Enqueue throughput: single-message and 100-message enqueues from concurrent writers.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::DynamoDbOutboxWriter;
use tokio::time::Instant;

use crate::classify::{Class, Classifier};
use crate::support::{self, Result};

/// One configuration's figures.
#[derive(Debug, Clone)]
pub struct Throughput {
    /// Messages per call.
    pub batch: usize,
    /// Concurrent writers.
    pub writers: usize,
    /// Messages committed.
    pub messages: u64,
    /// Calls that committed.
    pub calls: u64,
    /// Calls that failed.
    pub failures: u64,
    /// Wall time.
    pub took: Duration,
    /// Call latencies.
    pub latencies: Vec<Duration>,
    /// Reservations (`UpdateItem`) and transactions sent.
    pub reserves: u64,
    /// `TransactWriteItems` attempts.
    pub transacts: u64,
    /// Distinct buckets summed over the committed calls.
    pub distinct_buckets: u64,
}

impl Throughput {
    /// Prints the figures.
    pub fn print(&self) {
        let secs = self.took.as_secs_f64();
        let mut l = self.latencies.clone();
        println!(
            "{:>3} msg/call x {:>2} writers: {:>6.0} msg/s, {:>5.0} calls/s ({} msgs, {} calls, {} failed, {:.1} s); call p50 {} ms p99 {} ms; per call: reserve {:.2} (distinct buckets {:.2}), transact {:.2}",
            self.batch,
            self.writers,
            self.messages as f64 / secs,
            self.calls as f64 / secs,
            self.messages,
            self.calls,
            self.failures,
            secs,
            support::ms(support::quantile(&mut l, 0.5)),
            support::ms(support::quantile(&mut l, 0.99)),
            self.reserves as f64 / self.calls.max(1) as f64,
            self.distinct_buckets as f64 / self.calls.max(1) as f64,
            self.transacts as f64 / self.calls.max(1) as f64,
        );
    }
}

/// `writers` tasks enqueue `batch` messages of 1 KB per call for `duration`.
pub async fn measure(batch: usize, writers: usize, duration: Duration) -> Result<Throughput> {
    let config = support::sdk_config().await?;
    let plain = support::client(&config, None);
    let options = support::fresh_table(&plain, 8, 8).await?;
    let classifier = Classifier::default();
    let writer =
        DynamoDbOutboxWriter::new(support::client(&config, Some(&classifier)), options.clone())?;
    let messages = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let distinct = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let until = started + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let writer = writer.clone();
        let (messages, calls, failures, distinct, latencies) = (
            messages.clone(),
            calls.clone(),
            failures.clone(),
            distinct.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let batch_messages: Vec<_> = (0..batch)
                    .map(|i| {
                        writer
                            .message("bench")
                            .with_key(format!("w{w}-{n}-{i}"))
                            .with_value(support::payload(1024, n))
                    })
                    .collect();
                n += 1;
                let buckets = batch_messages
                    .iter()
                    .map(|m| m.bucket())
                    .collect::<BTreeSet<_>>()
                    .len() as u64;
                let t0 = Instant::now();
                match writer.enqueue(&batch_messages).await {
                    Ok(_) => {
                        let took = t0.elapsed();
                        messages.fetch_add(batch as u64, Ordering::Relaxed);
                        calls.fetch_add(1, Ordering::Relaxed);
                        distinct.fetch_add(buckets, Ordering::Relaxed);
                        latencies
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(took);
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let took = started.elapsed();
    let counts = classifier.snapshot();
    support::drop_table(&plain, &options).await;
    let latencies = latencies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Throughput {
        batch,
        writers,
        messages: messages.load(Ordering::Relaxed),
        calls: calls.load(Ordering::Relaxed),
        failures: failures.load(Ordering::Relaxed),
        took,
        latencies,
        reserves: counts.get(Class::Reserve),
        transacts: counts.get(Class::Transact),
        distinct_buckets: distinct.load(Ordering::Relaxed),
    })
}

/// The enqueue benchmark over every batch size and writer count.
pub async fn run(batches: &[usize], writers: &[usize], duration: Duration) -> Result<()> {
    println!("== enqueue throughput (1 KB messages, 8 buckets, {duration:?} per configuration)");
    for &b in batches {
        for &w in writers {
            measure(b, w, duration).await?.print();
        }
    }
    Ok(())
}
