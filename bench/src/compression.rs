//! Compression: produce-request bytes on the wire and publisher CPU per codec
//! (`KAFKA_COMPRESSION`), for a backlog of ~1 KB JSON order events.
//!
//! A counting TCP proxy holds a proxy slot of the stack's broker (which advertises the
//! proxy's address there), so every connection of the publisher (bootstrap and produce)
//! goes through it; the proxy reads the Kafka request
//! frames from the client and adds up the bytes of the Produce requests (API key 0: the
//! 4-byte length and the frame). The proxy runs on a thread of its own with its own
//! runtime; its CPU time is read from `/proc/thread-self/stat` and taken off the
//! process's (`/proc/self/stat`, as `getrusage(RUSAGE_SELF)` counts it), which leaves the
//! publisher's: building the records, compressing, framing, the client's I/O. The messages
//! are built before the clock starts; the relay's DynamoDB work (the same for every codec)
//! is not part of this benchmark.
//!
//! Each run publishes the backlog with one codec, in batches of the relay's batch size
//! (500) over 8 partitions keyed by customer, as the relay's publisher sends them (one
//! produce request per partition per batch); codecs alternate run by run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant as StdInstant};

use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::publish::{KafkaCompression, KafkaConfig, KafkaPublisher, Publisher};
use dynamo_outbox::{Header, OutboxMessage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::support::{cpu_seconds, random_name, Result};

/// Options of the compression benchmark.
#[derive(Debug, Clone)]
pub struct CompressionArgs {
    /// Messages per run (10,000).
    pub messages: u64,
    /// Runs per codec (3).
    pub runs: usize,
    /// Messages per publish call (500, the relay's default batch size).
    pub batch_size: usize,
    /// Partitions of the topic (8).
    pub partitions: i32,
}

const CODECS: [(KafkaCompression, &str); 5] = [
    (KafkaCompression::None, "none"),
    (KafkaCompression::Gzip, "gzip"),
    (KafkaCompression::Snappy, "snappy"),
    (KafkaCompression::Lz4, "lz4"),
    (KafkaCompression::Zstd, "zstd"),
];

/// Runs the benchmark and prints its table.
pub async fn run(args: &CompressionArgs) -> Result<()> {
    // the broker advertises the slot's address, where the proxy listens
    let slot = outbox_testkit::kafka::ProxySlot::acquire()?;
    UPSTREAM
        .set(slot.upstream)
        .map_err(|_| "one proxy slot per process")?;
    let proxy = CountingProxy::start(slot.listener)?;
    let messages = |topic: &str| backlog(topic, args.messages);
    let sample = messages("t");
    let value_bytes: usize = sample
        .iter()
        .map(|m| m.message.value.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "== compression: {} messages per run, values {:.0} bytes on average ({} bytes in all), batches of {}, {} partitions, {} runs per codec",
        args.messages,
        value_bytes as f64 / args.messages as f64,
        value_bytes,
        args.batch_size,
        args.partitions,
        args.runs
    );
    let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); CODECS.len()];
    for run in 0..args.runs {
        let order: Vec<usize> = if run % 2 == 0 {
            (0..CODECS.len()).collect()
        } else {
            (0..CODECS.len()).rev().collect()
        };
        for i in order {
            let (codec, name) = CODECS[i];
            let f = one_run(&proxy, codec, args, &messages).await?;
            println!(
                "run {} {name:>6}: produce bytes {:>9}, publisher CPU {:.2} s (process {:.2} s, proxy {:.2} s; 10 ms ticks), wall {:.2} s",
                run + 1,
                f.produce_bytes,
                f.cpu,
                f.process_cpu,
                f.proxy_cpu,
                f.wall.as_secs_f64()
            );
            figures[i].push(f);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<(f64, f64, f64)> = figures
        .iter()
        .map(|runs| {
            let mut bytes: Vec<f64> = runs.iter().map(|f| f.produce_bytes as f64).collect();
            let mut cpu: Vec<f64> = runs.iter().map(|f| f.cpu).collect();
            let mut wall: Vec<f64> = runs.iter().map(|f| f.wall.as_secs_f64()).collect();
            (median(&mut bytes), median(&mut cpu), median(&mut wall))
        })
        .collect();
    let per_10k = 10_000.0 / args.messages as f64;
    let (none_bytes, none_cpu, _) = medians[0];
    println!("| codec | produce bytes per 10,000 | vs none | publisher CPU per 10,000 (s) | vs none | wall per 10,000 (s) |");
    println!("|---|---|---|---|---|---|");
    for (i, (bytes, cpu, wall)) in medians.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.2} |",
            CODECS[i].1,
            bytes * per_10k,
            bytes / none_bytes,
            cpu * per_10k,
            cpu / none_cpu,
            wall * per_10k
        );
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct Figures {
    produce_bytes: u64,
    cpu: f64,
    process_cpu: f64,
    proxy_cpu: f64,
    wall: Duration,
}

async fn one_run(
    proxy: &CountingProxy,
    compression: KafkaCompression,
    args: &CompressionArgs,
    messages: &impl Fn(&str) -> Vec<StoredMessage>,
) -> Result<Figures> {
    let mut config = KafkaConfig::new([proxy.addr.to_string()]);
    config.compression = compression;
    let publisher = connect(config).await?;
    let topic = random_name("bench-codec");
    publisher.create_topic(&topic, args.partitions, 1).await?;
    // metadata read before the clock starts, as a running relay has it
    publisher.partition_count(&topic).await?;
    let backlog = messages(&topic);

    let bytes_before = proxy.produce_bytes.load(Ordering::SeqCst);
    let proxy_before = proxy.cpu()?;
    let (user, sys) = cpu_seconds().ok_or("reading /proc/self/stat")?;
    let started = StdInstant::now();
    for batch in backlog.chunks(args.batch_size) {
        let outcome = publisher.publish(batch).await;
        if let Some(e) = outcome.error {
            return Err(format!("publishing with {compression:?}: {e}").into());
        }
        if outcome.acknowledged != batch.len() {
            return Err(format!("publishing with {compression:?}: partly acknowledged").into());
        }
    }
    let wall = started.elapsed();
    let (user2, sys2) = cpu_seconds().ok_or("reading /proc/self/stat")?;
    let proxy_cpu = proxy.cpu()? - proxy_before;
    let process_cpu = (user2 + sys2) - (user + sys);
    Ok(Figures {
        produce_bytes: proxy.produce_bytes.load(Ordering::SeqCst) - bytes_before,
        cpu: process_cpu - proxy_cpu,
        process_cpu,
        proxy_cpu,
        wall,
    })
}

async fn connect(config: KafkaConfig) -> Result<KafkaPublisher> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match KafkaPublisher::connect(config.clone(), deadline).await {
            Ok(p) => return Ok(p),
            Err(e) if Instant::now() + Duration::from_millis(200) < deadline => {
                tracing::debug!(error = %e, "the broker is not answering through the proxy yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `messages` order events of about 1 KB, keyed by customer (64 customers), each with two
/// headers; deterministic but varied (seeded by index), as a service's events are.
fn backlog(topic: &str, messages: u64) -> Vec<StoredMessage> {
    (0..messages)
        .map(|i| {
            let customer = i % 64;
            let message = OutboxMessage::new(topic, 8)
                .with_key(format!("customer-{customer:04}"))
                .with_value(order_event(i, customer))
                .with_header(Header::new("type", "OrderPlaced"))
                .with_header(Header::new("content-type", "application/json"));
            StoredMessage::new(0, i + 1, message)
        })
        .collect()
}

const PRODUCTS: [(&str, &str); 8] = [
    ("Wireless mouse", "electronics"),
    ("USB-C charging cable 2m", "electronics"),
    ("Stainless steel water bottle", "kitchen"),
    ("Organic green tea, 50 bags", "grocery"),
    ("Running socks, 3 pairs", "apparel"),
    ("Paperback notebook A5", "office"),
    ("LED desk lamp", "home"),
    ("Noise-cancelling headphones", "electronics"),
];
const CITIES: [(&str, &str, &str); 6] = [
    ("Berlin", "10115", "DE"),
    ("Lyon", "69001", "FR"),
    ("Madrid", "28001", "ES"),
    ("Milano", "20121", "IT"),
    ("Amsterdam", "1011", "NL"),
    ("Dublin", "D02", "IE"),
];

/// One JSON order event (about 1 KB): ids, timestamps, amounts and trace ids vary.
fn order_event(i: u64, customer: u64) -> String {
    let mut rng = StdRng::seed_from_u64(i);
    let items: Vec<String> = (0..rng.gen_range(3..=5))
        .map(|_| {
            let (name, category) = PRODUCTS[rng.gen_range(0..PRODUCTS.len())];
            format!(
                r#"{{"sku":"SKU-{:05}","name":"{name}","category":"{category}","quantity":{},"unit_price":"{}.{:02}"}}"#,
                rng.gen_range(0..100_000),
                rng.gen_range(1..4),
                rng.gen_range(2..200),
                rng.gen_range(0..100)
            )
        })
        .collect();
    let (city, postal, country) = CITIES[(customer % CITIES.len() as u64) as usize];
    let event_id = uuid::Uuid::from_u128(rng.gen());
    let trace: u128 = rng.gen();
    format!(
        concat!(
            r#"{{"event_type":"OrderPlaced","event_id":"{event_id}","schema_version":3,"#,
            r#""occurred_at":"2026-12-01T{h:02}:{m:02}:{s:02}.{ms:03}Z","#,
            r#""order":{{"order_id":"ORD-{i:08}","customer":{{"id":"customer-{customer:04}","#,
            r#""email":"customer{customer:04}@example.com","tier":"{tier}"}},"currency":"EUR","#,
            r#""items":[{items}],"#,
            r#""shipping":{{"method":"standard","address":{{"street":"{street} Main Street","#,
            r#""city":"{city}","postal_code":"{postal}","country":"{country}"}}}},"#,
            r#""totals":{{"subtotal":"{sub}.{subc:02}","tax":"{tax}.{taxc:02}","shipping":"4.99","#,
            r#""total":"{tot}.{totc:02}"}}}},"#,
            r#""metadata":{{"source":"checkout-service","version":"2.14.1","#,
            r#""trace_id":"{trace:032x}","region":"eu-west-1"}}}}"#
        ),
        event_id = event_id,
        h = rng.gen_range(0..24),
        m = rng.gen_range(0..60),
        s = rng.gen_range(0..60),
        ms = rng.gen_range(0..1000),
        i = i,
        customer = customer,
        tier = ["standard", "silver", "gold"][(customer % 3) as usize],
        items = items.join(","),
        street = rng.gen_range(1..400),
        city = city,
        postal = postal,
        country = country,
        sub = rng.gen_range(20..600),
        subc = rng.gen_range(0..100),
        tax = rng.gen_range(3..120),
        taxc = rng.gen_range(0..100),
        tot = rng.gen_range(25..720),
        totc = rng.gen_range(0..100),
        trace = trace,
    )
}

/// A TCP forwarder that counts the bytes of the Kafka Produce requests it passes on.
#[derive(Debug)]
struct CountingProxy {
    addr: SocketAddr,
    produce_bytes: Arc<AtomicU64>,
    /// `/proc/{pid}/task/{tid}` of the proxy's thread.
    task: String,
}

impl CountingProxy {
    fn start(listener: std::net::TcpListener) -> Result<Self> {
        let produce_bytes = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&produce_bytes);
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("counting-proxy".into())
            .spawn(move || {
                let started = (|| -> std::io::Result<_> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    listener.set_nonblocking(true)?;
                    let listener = {
                        let _entered = runtime.enter();
                        TcpListener::from_std(listener)?
                    };
                    let task = std::fs::read_link("/proc/thread-self")?;
                    Ok((runtime, listener, task))
                })();
                let (runtime, listener, task) = match started {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                // the link reads `{pid}/task/{tid}`, relative to /proc
                let task = std::path::Path::new("/proc").join(task);
                let addr = listener.local_addr().map_err(|e| e.to_string());
                let _ = tx.send(addr.map(|a| (a, task.display().to_string())));
                runtime.block_on(async move {
                    while let Ok((client, _)) = listener.accept().await {
                        tokio::spawn(forward(client, Arc::clone(&counter)));
                    }
                });
            })?;
        let (addr, task) = rx.recv()??;
        Ok(CountingProxy {
            addr,
            produce_bytes,
            task,
        })
    }

    /// CPU seconds (user + system) of the proxy's thread so far.
    fn cpu(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("{}/stat", self.task))?;
        let rest = &stat[stat.rfind(')').ok_or("stat")? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = fields.get(11).ok_or("utime")?.parse()?;
        let stime: f64 = fields.get(12).ok_or("stime")?.parse()?;
        Ok((utime + stime) / 100.0)
    }
}

/// The upstream of every connection: set once the broker's port is known.
static UPSTREAM: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();

async fn forward(client: TcpStream, produce_bytes: Arc<AtomicU64>) {
    let Some(upstream) = UPSTREAM.get().copied() else {
        return;
    };
    let Ok(broker) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = broker.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut broker_read, mut broker_write) = broker.into_split();
    let requests = copy_requests(&mut client_read, &mut broker_write, &produce_bytes);
    let responses = tokio::io::copy(&mut broker_read, &mut client_write);
    let _ = tokio::join!(requests, responses);
}

/// Passes request frames on, adding the size of each Produce request (API key 0).
async fn copy_requests(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    produce_bytes: &AtomicU64,
) -> std::io::Result<()> {
    let mut frame = Vec::new();
    loop {
        let mut len = [0u8; 4];
        from.read_exact(&mut len).await?;
        let n = u32::from_be_bytes(len) as usize;
        frame.resize(n, 0);
        from.read_exact(&mut frame).await?;
        if n >= 2 && frame[0..2] == [0, 0] {
            produce_bytes.fetch_add(4 + n as u64, Ordering::Relaxed);
        }
        to.write_all(&len).await?;
        to.write_all(&frame).await?;
    }
}
