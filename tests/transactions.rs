//! Kafka transactions of the vendored rskafka (`rskafka::client::transaction`, see
//! `vendor/rskafka/PATCH.md`) against the stack's Apache Kafka, read back with an
//! independent client (`scripts/kafka.py read --isolation`, librdkafka through
//! confluent-kafka) at both isolation levels.
//!
//! Each test has its own topics, group and transactional id. `scripts/test.sh` runs the file
//! against Apache Kafka 4.1 and again against 3.9.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use outbox_testkit::kafka::{ProxySlot, SecureListeners};
use outbox_testkit::{
    create_topic, create_topic_with_config, random_name, stack_var, try_read_records, try_stack_py,
};
use rskafka::chrono::Utc;
use rskafka::client::error::{Error, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, UnknownTopicHandling};
use rskafka::client::transaction::{CommittedOffset, TransactionError, TransactionalProducer};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::{Record, RecordHeader};
use rskafka::BackoffConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Retries of a test's client: a short pause, and a deadline that bounds every step.
fn backoff(deadline: Duration) -> BackoffConfig {
    BackoffConfig {
        init_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_secs(1),
        base: 2.0,
        deadline: Some(deadline),
    }
}

/// A client of the stack's PLAINTEXT listener (or `bootstrap`).
async fn client_of(bootstrap: &str, deadline: Duration) -> Client {
    ClientBuilder::new(vec![bootstrap.to_owned()])
        .backoff_config(backoff(deadline))
        .build()
        .await
        .expect("connect to the stack's broker")
}

async fn client() -> Client {
    client_of(
        &stack_var("KAFKA_BOOTSTRAP_SERVERS"),
        Duration::from_secs(30),
    )
    .await
}

const TIMEOUT: Duration = Duration::from_secs(60);

/// `n` records `{tag}-{i}` with a key and a header.
fn records(tag: &str, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: Some(format!("key-{i}").into_bytes()),
            value: Some(format!("{tag}-{i}").into_bytes()),
            headers: vec![RecordHeader {
                key: "h".into(),
                value: Some(tag.as_bytes().to_vec()),
            }],
            timestamp: Utc::now(),
        })
        .collect()
}

/// The values the independent client reads from `topic` at `isolation`, by partition, in
/// offset order; fails unless it reads exactly `expect` records.
fn read(topic: &str, isolation: &str, expect: usize) -> BTreeMap<i32, Vec<String>> {
    let records = try_read_records(&[
        "read",
        topic,
        "--isolation",
        isolation,
        "--expect",
        &expect.to_string(),
        "--timeout",
        "20",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let mut by_partition: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for r in records {
        let value = String::from_utf8(r.value_bytes().expect("a value")).unwrap();
        by_partition.entry(r.partition).or_default().push(value);
    }
    by_partition
}

fn values(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

/// A committed transaction writes to five partitions of two topics and commits an offset with
/// 4 KB of metadata: `read_committed` sees nothing while it is open and everything after the
/// commit; `OffsetFetch` with `require_stable` answers `UNSTABLE_OFFSET_COMMIT` while it is
/// open and the offset and metadata after.
#[tokio::test]
async fn a_committed_transaction_is_visible_with_its_offset() {
    let client = client().await;
    let (orders, audit, progress) = (
        random_name("txn-orders"),
        random_name("txn-audit"),
        random_name("txn-progress"),
    );
    create_topic(&orders, 3);
    create_topic(&audit, 2);
    create_topic(&progress, 1);
    let group = random_name("txn-group");
    let producer = client
        .transactional_producer(random_name("txn-id"), TIMEOUT)
        .await
        .expect("init");
    assert!(!producer.in_transaction());

    // One AddPartitionsToTxn for all five, then the batches at once.
    let targets = [
        (orders.as_str(), 0, 3),
        (orders.as_str(), 1, 1),
        (orders.as_str(), 2, 4),
        (audit.as_str(), 0, 2),
        (audit.as_str(), 1, 5),
    ];
    let partitions: Vec<(&str, i32)> = targets.iter().map(|(t, p, _)| (*t, *p)).collect();
    producer.add_partitions(&partitions).await.expect("add");
    assert!(producer.in_transaction());
    let offsets = try_join_all(targets.iter().map(|(topic, partition, n)| {
        producer.produce(
            topic,
            *partition,
            records(&format!("{topic}-{partition}"), *n),
            Compression::NoCompression,
        )
    }))
    .await
    .expect("produce");
    assert_eq!(offsets[0], vec![0, 1, 2]);
    // A second batch to a partition continues its sequence.
    let more = producer
        .produce(&orders, 0, records("second", 2), Compression::NoCompression)
        .await
        .expect("produce again");
    assert_eq!(more, vec![3, 4]);

    let metadata = "m".repeat(4096);
    producer
        .send_offsets(&group, &progress, 0, 42, Some(metadata.clone()))
        .await
        .expect("send offsets");

    // Open: invisible to read_committed, visible to read_uncommitted; the offset unstable.
    assert!(read(&orders, "read_committed", 0).is_empty());
    assert_eq!(read(&orders, "read_uncommitted", 10).len(), 3);
    let impatient = client_of(
        &stack_var("KAFKA_BOOTSTRAP_SERVERS"),
        Duration::from_secs(1),
    )
    .await;
    let started = Instant::now();
    let unstable = impatient
        .fetch_committed_offset(&group, &progress, 0, true)
        .await
        .expect_err("an offset is pending in the open transaction");
    assert!(
        matches!(
            unstable,
            Error::ServerError {
                protocol_error: ProtocolError::UnstableOffsetCommit,
                ..
            }
        ),
        "{unstable}"
    );
    println!(
        "OffsetFetch(require_stable) of an open transaction's offset: {unstable} after {:?}",
        started.elapsed()
    );
    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, false)
            .await
            .unwrap(),
        None,
        "without require_stable the last committed offset (none) is returned"
    );

    let mut producer = producer;
    producer.commit().await.expect("commit");
    assert!(!producer.in_transaction());

    let orders_read = read(&orders, "read_committed", 10);
    let mut second = values("second", 2);
    let mut p0 = values(&format!("{orders}-0"), 3);
    p0.append(&mut second);
    assert_eq!(orders_read[&0], p0);
    assert_eq!(orders_read[&1], values(&format!("{orders}-1"), 1));
    assert_eq!(orders_read[&2], values(&format!("{orders}-2"), 4));
    let audit_read = read(&audit, "read_committed", 7);
    assert_eq!(audit_read[&0], values(&format!("{audit}-0"), 2));
    assert_eq!(audit_read[&1], values(&format!("{audit}-1"), 5));

    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, true)
            .await
            .expect("stable after the commit"),
        Some(CommittedOffset {
            offset: 42,
            metadata: Some(metadata),
        })
    );

    // The next transaction of the same producer (same epoch, continued sequences).
    producer
        .produce(&orders, 0, records("third", 1), Compression::NoCompression)
        .await
        .expect("produce in the next transaction");
    producer
        .send_offsets(&group, &progress, 0, 43, None)
        .await
        .unwrap();
    producer.commit().await.expect("commit again");
    assert_eq!(
        read(&orders, "read_committed", 11)[&0].last().unwrap(),
        "third-0"
    );
    let committed = client
        .fetch_committed_offset(&group, &progress, 0, true)
        .await
        .unwrap()
        .unwrap();
    // The broker keeps null metadata as the empty string.
    assert_eq!(
        (committed.offset, committed.metadata),
        (43, Some(String::new()))
    );
}

/// An aborted transaction's records are never visible to `read_committed` (while
/// `read_uncommitted` sees them) and its offset is never committed; the producer's next
/// transaction commits.
#[tokio::test]
async fn an_aborted_transaction_is_never_visible() {
    let client = client().await;
    let (topic, progress) = (random_name("txn-abort"), random_name("txn-progress"));
    create_topic(&topic, 2);
    create_topic(&progress, 1);
    let group = random_name("txn-group");
    let mut producer = client
        .transactional_producer(random_name("txn-id"), TIMEOUT)
        .await
        .expect("init");

    for partition in 0..2 {
        producer
            .produce(
                &topic,
                partition,
                records("aborted", 3),
                Compression::NoCompression,
            )
            .await
            .expect("produce");
    }
    producer
        .send_offsets(&group, &progress, 0, 7, Some("aborted".into()))
        .await
        .unwrap();
    producer.abort().await.expect("abort");
    assert!(!producer.in_transaction());

    assert!(read(&topic, "read_committed", 0).is_empty());
    let uncommitted = read(&topic, "read_uncommitted", 6);
    assert_eq!(uncommitted[&0], values("aborted", 3));
    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, true)
            .await
            .expect("stable after the abort"),
        None
    );

    // Metadata over the broker's offset.metadata.max.bytes (4096) is refused: abortable.
    let err = producer
        .send_offsets(&group, &progress, 0, 8, Some("m".repeat(4097)))
        .await
        .expect_err("metadata too large");
    assert!(
        matches!(err, TransactionError::Abortable(_))
            && err.protocol_error() == Some(ProtocolError::OffsetMetadataTooLarge),
        "{err}"
    );
    let refused = producer
        .produce(&topic, 0, records("refused", 1), Compression::NoCompression)
        .await
        .expect_err("nothing is added to a transaction that must abort");
    assert!(
        matches!(refused, TransactionError::Abortable(_)),
        "{refused}"
    );
    assert!(matches!(
        producer.commit().await,
        Err(TransactionError::Abortable(_))
    ));
    producer.abort().await.expect("abort after the refusal");

    // A batch the leader refuses (over the topic's max.message.bytes) leaves the sequence
    // numbers uncertain: the abort then also bumps the epoch, and sequences start at 0 again.
    let small = random_name("txn-small");
    create_topic_with_config(&small, 1, &[("max.message.bytes", "1000")]);
    producer
        .produce(&small, 0, records("fits", 1), Compression::NoCompression)
        .await
        .expect("a small batch");
    let mut big = records("big", 1);
    big[0].value = Some(vec![b'x'; 2000]);
    let err = producer
        .produce(&small, 0, big, Compression::NoCompression)
        .await
        .expect_err("too large");
    assert!(
        matches!(err, TransactionError::Abortable(_))
            && err.protocol_error() == Some(ProtocolError::MessageTooLarge),
        "{err}"
    );
    let (id, epoch) = producer.producer_id_and_epoch();
    producer.abort().await.expect("abort and bump");
    assert_eq!(producer.producer_id_and_epoch(), (id, epoch + 1));
    // An explicit bump between transactions.
    producer.bump_epoch().await.expect("bump");
    assert_eq!(producer.producer_id_and_epoch(), (id, epoch + 2));

    producer
        .produce(
            &topic,
            0,
            records("committed", 2),
            Compression::NoCompression,
        )
        .await
        .expect("produce");
    producer
        .send_offsets(&group, &progress, 0, 9, Some("ok".into()))
        .await
        .unwrap();
    producer.commit().await.expect("commit");
    let committed = read(&topic, "read_committed", 2);
    assert_eq!(committed[&0], values("committed", 2));
    assert_eq!(read(&topic, "read_uncommitted", 8).len(), 2);
    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, true)
            .await
            .unwrap(),
        Some(CommittedOffset {
            offset: 9,
            metadata: Some("ok".into())
        })
    );
}

/// A second producer of the same transactional id fences the first: the coordinator aborts
/// the first one's open transaction before it answers the second, so that transaction's
/// records are never visible and its offset never committed; the first producer's produce,
/// commit, abort and epoch bump all fail as fenced.
#[tokio::test]
async fn a_second_producer_fences_the_first() {
    let client = client().await;
    let (topic, progress) = (random_name("txn-fence"), random_name("txn-progress"));
    create_topic(&topic, 2);
    create_topic(&progress, 1);
    let (group, id) = (random_name("txn-group"), random_name("txn-id"));

    let mut first = client
        .transactional_producer(&id, TIMEOUT)
        .await
        .expect("init the first");
    first
        .produce(&topic, 0, records("first", 3), Compression::NoCompression)
        .await
        .unwrap();
    first
        .send_offsets(&group, &progress, 0, 100, Some("first".into()))
        .await
        .unwrap();

    let started = Instant::now();
    let mut second = client
        .transactional_producer(&id, TIMEOUT)
        .await
        .expect("init the second");
    let took = started.elapsed();
    println!("InitProducerId over an open transaction (aborted first): {took:?}");
    let (first_id, first_epoch) = first.producer_id_and_epoch();
    let (second_id, second_epoch) = second.producer_id_and_epoch();
    assert_eq!(first_id, second_id);
    assert!(
        second_epoch > first_epoch,
        "{first_epoch} -> {second_epoch}"
    );

    // The open transaction is gone before the second producer wrote anything.
    assert!(read(&topic, "read_committed", 0).is_empty());
    assert_eq!(read(&topic, "read_uncommitted", 3).len(), 1);
    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, true)
            .await
            .expect("no pending offset once the second producer is initialised"),
        None
    );

    // The partition leader saw the abort marker of the bumped epoch: it refuses the old one.
    let err = first
        .produce(&topic, 0, records("late", 1), Compression::NoCompression)
        .await
        .expect_err("fenced");
    assert!(matches!(err, TransactionError::Fenced(_)), "{err}");
    // From then on every call fails so, without a request.
    for result in [
        first.commit().await,
        first.abort().await,
        first.bump_epoch().await,
        first.send_offsets(&group, &progress, 0, 101, None).await,
    ] {
        assert!(
            matches!(result, Err(TransactionError::Fenced(_))),
            "{result:?}"
        );
    }

    // A third producer fences the second in the middle of its transaction: the transaction
    // coordinator refuses the second one's commit.
    second
        .produce(&topic, 1, records("second", 2), Compression::NoCompression)
        .await
        .unwrap();
    let mut third = client
        .transactional_producer(&id, TIMEOUT)
        .await
        .expect("init the third");
    let err = second.commit().await.expect_err("fenced");
    assert!(
        matches!(err, TransactionError::Fenced(_))
            && err.protocol_error() == Some(ProtocolError::ProducerFenced),
        "{err}"
    );

    third
        .produce(&topic, 1, records("third", 2), Compression::NoCompression)
        .await
        .unwrap();
    third
        .send_offsets(&group, &progress, 0, 200, Some("third".into()))
        .await
        .unwrap();
    third.commit().await.expect("commit the third");
    let committed = read(&topic, "read_committed", 2);
    assert_eq!(committed.get(&0), None);
    assert_eq!(committed[&1], values("third", 2));
    assert_eq!(read(&topic, "read_uncommitted", 7).len(), 2);
    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, true)
            .await
            .unwrap(),
        Some(CommittedOffset {
            offset: 200,
            metadata: Some("third".into())
        })
    );
}

/// A TCP proxy of a proxy slot of the stack's broker that, once armed, lets the next
/// bytes from the broker go nowhere and cuts their connection: the request they answer
/// reached the broker, its answer is lost.
struct LosingProxy {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LosingProxy {
    async fn start() -> Self {
        let slot = tokio::task::spawn_blocking(ProxySlot::acquire)
            .await
            .unwrap()
            .expect("a proxy slot");
        let addr = slot.addr();
        let upstream = slot.upstream;
        slot.listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(slot.listener).unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (a, l, c) = (armed.clone(), lost.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (armed, lost) = (a.clone(), l.clone());
                tokio::spawn(async move {
                    let Ok(broker) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut br, mut bw) = broker.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n @ 1..) = cr.read(&mut buf).await {
                            if bw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n @ 1..) = br.read(&mut buf).await {
                            if armed.swap(false, Ordering::SeqCst) {
                                lost.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                    }
                });
            }
        });
        // The broker answers through the proxy (the ping blocks a thread; the proxy runs on
        // another).
        let bootstrap = addr.to_string();
        tokio::task::spawn_blocking(move || {
            try_stack_py(
                "kafka.py",
                &["--bootstrap", &bootstrap, "ping", "--timeout", "30"],
            )
        })
        .await
        .unwrap()
        .expect("an answer through the proxy");
        LosingProxy {
            addr,
            armed,
            lost,
            connections,
            task,
        }
    }
}

/// A produce whose answer is lost is sent again with the same producer id, epoch and
/// sequence number, on a new connection; the broker recognises the batch and answers with
/// its first offsets instead of writing it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_whose_answer_was_lost_is_written_once() {
    let topic = random_name("txn-retry");
    create_topic(&topic, 1);
    let proxy = LosingProxy::start().await;
    let client = client_of(&proxy.addr.to_string(), Duration::from_secs(30)).await;
    let mut producer = client
        .transactional_producer(random_name("txn-id"), TIMEOUT)
        .await
        .expect("init");
    let first = producer
        .produce(&topic, 0, records("before", 2), Compression::NoCompression)
        .await
        .unwrap();
    assert_eq!(first, vec![0, 1]);
    producer.add_partitions(&[(&topic, 0)]).await.unwrap();

    // The only request in flight on the producer's connection is the produce.
    let connections = proxy.connections.load(Ordering::SeqCst);
    proxy.armed.store(true, Ordering::SeqCst);
    let offsets = producer
        .produce(&topic, 0, records("retried", 3), Compression::NoCompression)
        .await
        .expect("the retry succeeds");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "an answer was lost");
    assert!(
        proxy.connections.load(Ordering::SeqCst) > connections,
        "reconnected"
    );
    assert_eq!(offsets, vec![2, 3, 4], "the first write's offsets");

    producer
        .produce(&topic, 0, records("after", 1), Compression::NoCompression)
        .await
        .unwrap();
    producer.commit().await.expect("commit");
    let read_back = read(&topic, "read_uncommitted", 6);
    let mut expected = values("before", 2);
    expected.extend(values("retried", 3));
    expected.extend(values("after", 1));
    assert_eq!(read_back[&0], expected);
    assert_eq!(read(&topic, "read_committed", 6)[&0], expected);
}

/// A produce whose future the caller drops (its own timeout) may or may not have been
/// written: the transaction can then only abort, and the abort bumps the epoch, after which
/// the next transaction commits and the dropped batch is never visible.
#[tokio::test]
async fn a_produce_dropped_by_a_timeout_leaves_the_transaction_to_abort() {
    let client = client().await;
    let topic = random_name("txn-dropped");
    create_topic(&topic, 1);
    let mut producer = client
        .transactional_producer(random_name("txn-id"), TIMEOUT)
        .await
        .expect("init");
    producer.add_partitions(&[(&topic, 0)]).await.unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_micros(1),
        producer.produce(&topic, 0, records("dropped", 3), Compression::NoCompression),
    )
    .await;
    assert!(dropped.is_err(), "the produce outran a 1 µs timeout");
    let err = producer
        .commit()
        .await
        .expect_err("the transaction must abort");
    assert!(matches!(err, TransactionError::Abortable(_)), "{err}");
    let (id, epoch) = producer.producer_id_and_epoch();
    producer.abort().await.expect("abort");
    assert_eq!(producer.producer_id_and_epoch(), (id, epoch + 1));

    producer
        .produce(&topic, 0, records("kept", 2), Compression::NoCompression)
        .await
        .unwrap();
    producer.commit().await.expect("commit");
    assert_eq!(read(&topic, "read_committed", 2)[&0], values("kept", 2));
}

/// The transaction timeout: the broker refuses one above `transaction.max.timeout.ms` (15
/// minutes), the client one of zero; a transaction left open past its timeout is aborted by
/// the coordinator, which fences its producer for good (an epoch bump is refused too), and a
/// new producer of the id starts afresh.
#[tokio::test]
async fn a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() {
    let client = client().await;
    let topic = random_name("txn-timeout");
    create_topic(&topic, 1);
    let id = random_name("txn-id");

    for timeout in [Duration::from_secs(15 * 60 + 1), Duration::ZERO] {
        let err = client
            .transactional_producer(&id, timeout)
            .await
            .expect_err("an invalid timeout");
        assert!(
            matches!(err, TransactionError::Fatal(_))
                && err.protocol_error() == Some(ProtocolError::InvalidTransactionTimeout),
            "{timeout:?}: {err}"
        );
    }
    client
        .transactional_producer(&id, Duration::from_secs(15 * 60))
        .await
        .expect("the broker's maximum is accepted");

    let mut producer = client
        .transactional_producer(&id, Duration::from_secs(1))
        .await
        .expect("init");
    producer
        .produce(&topic, 0, records("expired", 2), Compression::NoCompression)
        .await
        .unwrap();
    // The coordinator looks for expired transactions every 10 s
    // (transaction.abort.timed.out.transaction.cleanup.interval.ms); its abort marker
    // moves the high watermark past the two records.
    let partition = client
        .partition_client(&topic, 0, UnknownTopicHandling::Retry)
        .await
        .unwrap();
    let started = Instant::now();
    while partition.get_offset(OffsetAt::Latest).await.unwrap() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the coordinator did not abort the expired transaction"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "a transaction with a 1 s timeout was aborted {:?} after its records",
        started.elapsed()
    );
    assert!(read(&topic, "read_committed", 0).is_empty());
    // The coordinator bumped the epoch when it aborted: the producer is fenced for good (it
    // answers the abort and an epoch bump alike).
    let err = producer.abort().await.expect_err("fenced");
    assert!(
        matches!(err, TransactionError::Fenced(_))
            && err.protocol_error() == Some(ProtocolError::ProducerFenced),
        "{err}"
    );
    assert!(matches!(
        producer.commit().await,
        Err(TransactionError::Fenced(_))
    ));

    let mut fresh = client
        .transactional_producer(&id, TIMEOUT)
        .await
        .expect("a new producer");
    fresh
        .produce(&topic, 0, records("fresh", 1), Compression::NoCompression)
        .await
        .unwrap();
    fresh.commit().await.unwrap();
    assert_eq!(read(&topic, "read_committed", 1)[&0], values("fresh", 1));
}

/// `TxnOffsetCommit` needs the offset's topic and partition to exist: the group coordinator
/// answers `UNKNOWN_TOPIC_OR_PARTITION`, which is retried until the retries run out.
#[tokio::test]
async fn offsets_of_a_topic_that_does_not_exist_are_refused() {
    let client = client_of(
        &stack_var("KAFKA_BOOTSTRAP_SERVERS"),
        Duration::from_secs(2),
    )
    .await;
    let topic = random_name("txn-progress");
    create_topic(&topic, 1);
    let producer = client
        .transactional_producer(random_name("txn-id"), TIMEOUT)
        .await
        .expect("init");
    let group = random_name("txn-group");
    for (topic, partition) in [
        (random_name("txn-missing").as_str(), 0),
        (topic.as_str(), 1),
    ] {
        let err = producer
            .send_offsets(&group, topic, partition, 1, None)
            .await
            .expect_err("no such partition");
        assert!(
            matches!(err, TransactionError::Retriable(_))
                && err.protocol_error() == Some(ProtocolError::UnknownTopicOrPartition),
            "{err}"
        );
    }
}

/// A transaction through the SASL_SSL listener with SCRAM-SHA-512: the coordinator
/// connections authenticate as the client's others do. Besides WRITE on the records' topics,
/// the principal needs WRITE and DESCRIBE on the transactional id (without them
/// InitProducerId is refused, a fatal error), READ on the group (AddOffsetsToTxn) and READ on
/// the offset's topic (TxnOffsetCommit); without the last two, `send_offsets` fails with an
/// abortable error. OffsetFetch needs DESCRIBE on both.
#[tokio::test]
async fn a_transaction_commits_over_scram() {
    let listeners = SecureListeners::from_stack();
    let (topic, progress) = (random_name("txn-scram"), random_name("txn-progress"));
    create_topic(&topic, 2);
    create_topic(&progress, 1);
    let (group, id) = (random_name("txn-group"), random_name("txn-id"));
    let principal = format!("User:{}", listeners.user);

    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(&listeners.ca_file).unwrap();
    use rustls::pki_types::pem::PemObject as _;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let client = ClientBuilder::new(vec![listeners.sasl_ssl.clone()])
        .backoff_config(backoff(Duration::from_secs(30)))
        .tls_config(Arc::new(tls))
        .sasl_config(SaslConfig::ScramSha512(Credentials::new(
            listeners.user.clone(),
            listeners.password.clone(),
        )))
        .build()
        .await
        .expect("connect over SASL_SSL");

    let refused = client
        .transactional_producer(&id, TIMEOUT)
        .await
        .expect_err("no grant on the transactional id");
    assert!(
        matches!(refused, TransactionError::Fatal(_))
            && refused.protocol_error() == Some(ProtocolError::TransactionalIdAuthorizationFailed),
        "{refused}"
    );

    grant(&principal, &["--transactional-id", &id]);
    let mut producer: TransactionalProducer = client
        .transactional_producer(&id, TIMEOUT)
        .await
        .expect("init over SCRAM");
    // AddOffsetsToTxn needs READ on the group, TxnOffsetCommit READ on the offset's topic too:
    // each refusal is abortable.
    for (missing, resource) in [
        (ProtocolError::GroupAuthorizationFailed, ["--group", &group]),
        (
            ProtocolError::TopicAuthorizationFailed,
            ["--topic", &progress],
        ),
    ] {
        producer
            .produce(&topic, 0, records("refused", 1), Compression::NoCompression)
            .await
            .expect("produce over SCRAM");
        let err = producer
            .send_offsets(&group, &progress, 0, 5, Some("scram".into()))
            .await
            .expect_err("not authorized");
        assert!(
            matches!(err, TransactionError::Abortable(_)) && err.protocol_error() == Some(missing),
            "{err}"
        );
        producer.abort().await.expect("abort");
        let mut args = resource.to_vec();
        if missing == ProtocolError::TopicAuthorizationFailed {
            args.extend(["--operation", "READ"]);
        }
        grant(&principal, &args);
    }

    for partition in 0..2 {
        producer
            .produce(
                &topic,
                partition,
                records("scram", 2),
                Compression::NoCompression,
            )
            .await
            .expect("produce over SCRAM");
    }
    producer
        .send_offsets(&group, &progress, 0, 5, Some("scram".into()))
        .await
        .expect("offsets over SCRAM");
    producer.commit().await.expect("commit over SCRAM");

    let committed = read(&topic, "read_committed", 4);
    assert_eq!(committed[&0], values("scram", 2));
    assert_eq!(committed[&1], values("scram", 2));
    assert_eq!(read(&topic, "read_uncommitted", 6).len(), 2);
    assert_eq!(
        client
            .fetch_committed_offset(&group, &progress, 0, true)
            .await
            .expect("OffsetFetch over SCRAM"),
        Some(CommittedOffset {
            offset: 5,
            metadata: Some("scram".into())
        })
    );
}

/// Allows `principal` operations on a resource (`--transactional-id ID`, `--group G`,
/// `--topic T --operation READ`, ...), through the admin listener.
fn grant(principal: &str, resource: &[&str]) {
    let bootstrap = stack_var("KAFKA_BOOTSTRAP_SERVERS");
    let mut args = vec!["grant", "--bootstrap", &bootstrap, "--principal", principal];
    args.extend_from_slice(resource);
    try_stack_py("kafka_broker.py", &args).unwrap_or_else(|e| panic!("{e}"));
}
