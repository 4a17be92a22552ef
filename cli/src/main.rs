//! `outboxctl`: the operator's command line for the DynamoDB outbox.
//!
//! Configuration comes from the same environment variables as the Lambda functions
//! (`OUTBOX_*`, `KAFKA_*`, and the standard AWS ones); flags override them. Exit codes:
//! 0 ok, 1 operational failure, 2 bad usage or bad input.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use clap::{Parser, Subcommand};
use dynamo_outbox::options::parse_duration;
use dynamo_outbox::publish::{KafkaConfig, KafkaPublisher};
use dynamo_outbox::table::{self, Provisioned};
use dynamo_outbox::writer::transaction_error;
use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, Error, Header, LocalNotifier, OutboxOptions, Relay,
    RelayOptions,
};
use tokio::time::Instant;

/// Operate a DynamoDB transactional outbox that publishes to Kafka.
#[derive(Debug, Parser)]
#[command(name = "outboxctl", version, about, long_about = None)]
struct Cli {
    /// Outbox table (overrides OUTBOX_TABLE_NAME).
    #[arg(long, global = true)]
    table: Option<String>,
    /// Bucket count (overrides OUTBOX_BUCKET_COUNT); every writer and relay must agree.
    #[arg(long, global = true)]
    bucket_count: Option<u32>,
    /// Key prefix (overrides OUTBOX_KEY_PREFIX).
    #[arg(long, global = true)]
    key_prefix: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the outbox table unless it exists, and wait until it is active.
    CreateTable,
    /// Run a long-lived relay: SIGTERM or SIGINT stops it gracefully (leases released).
    Relay {
        /// Stop after this long (e.g. 30s, 5m) instead of waiting for a signal.
        #[arg(long = "for", value_name = "DURATION")]
        run_for: Option<String>,
        /// Time allowed for the graceful stop after a signal.
        #[arg(long, default_value = "10s")]
        grace: String,
    },
    /// The whole path on the local stack: table, topic, business transactions carrying
    /// messages, a relay publishing them; prints what the relay published.
    Demo {
        /// Topic to publish to (created with --partitions).
        #[arg(long, default_value = "orders")]
        topic: String,
        /// Partitions of the topic.
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        /// Orders to place (one message each).
        #[arg(long, default_value_t = 300)]
        orders: u32,
        /// Distinct keys (customers) the orders spread over.
        #[arg(long, default_value_t = 12)]
        keys: u32,
    },
}

/// A failure with its exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::InvalidOption { .. } | Error::InvalidMessage { .. } | Error::Limit { .. } => 2,
            _ => 1,
        };
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        Failure { code, message }
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        message: message.into(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,aws=warn,rskafka=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("outboxctl: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn outbox_options(cli: &Cli, default_table: Option<&str>) -> Result<OutboxOptions, Failure> {
    let table = cli.table.clone();
    let default_table = default_table.map(str::to_string);
    let bucket_count = cli.bucket_count.map(|c| c.to_string());
    let key_prefix = cli.key_prefix.clone();
    let options = OutboxOptions::from_lookup(|name| match name {
        dynamo_outbox::options::env::TABLE_NAME => table
            .clone()
            .or_else(|| std::env::var(name).ok())
            .or_else(|| default_table.clone()),
        dynamo_outbox::options::env::BUCKET_COUNT => {
            bucket_count.clone().or_else(|| std::env::var(name).ok())
        }
        dynamo_outbox::options::env::KEY_PREFIX => {
            key_prefix.clone().or_else(|| std::env::var(name).ok())
        }
        _ => std::env::var(name).ok(),
    })?;
    Ok(options)
}

fn relay_options(options: &OutboxOptions) -> Result<RelayOptions, Failure> {
    let count = options.bucket_count.to_string();
    Ok(RelayOptions::from_lookup(|name| {
        if name == dynamo_outbox::options::env::BUCKET_COUNT {
            Some(count.clone())
        } else {
            std::env::var(name).ok()
        }
    })?)
}

async fn dynamodb() -> aws_sdk_dynamodb::Client {
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    aws_sdk_dynamodb::Client::new(&config)
}

async fn kafka(deadline: Instant) -> Result<Arc<KafkaPublisher>, Failure> {
    let config = KafkaConfig::from_env()?;
    Ok(Arc::new(KafkaPublisher::connect(config, deadline).await?))
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::CreateTable => {
            let options = outbox_options(&cli, None)?;
            let outcome = table::create_if_not_exists(&dynamodb().await, &options).await?;
            match outcome {
                Provisioned::Created => println!("created table {}", options.table_name),
                Provisioned::Existed => println!("table {} exists", options.table_name),
            }
            Ok(())
        }
        Command::Relay { run_for, grace } => {
            let options = outbox_options(&cli, None)?;
            let grace = parse_duration("--grace", grace)?;
            let run_for = run_for
                .as_deref()
                .map(|d| parse_duration("--for", d))
                .transpose()?;
            let store = DynamoDbOutboxStore::new(dynamodb().await, options.clone())?;
            let publisher = kafka(Instant::now() + Duration::from_secs(30)).await?;
            let relay = Relay::new(store, publisher, relay_options(&options)?)?;
            let report = match run_for {
                Some(d) => relay.run_until(Instant::now() + d).await?,
                None => relay.run_until_shutdown(shutdown_signal(), grace).await?,
            };
            println!(
                "relay {} stopped ({}): published {}, refused writes {}, leases released: {}",
                report.relay_id,
                report.stop_reason.as_str(),
                report.published,
                report.refused_total(),
                report.released
            );
            Ok(())
        }
        Command::Demo {
            topic,
            partitions,
            orders,
            keys,
        } => demo(&cli, topic, *partitions, *orders, *keys).await,
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

async fn demo(
    cli: &Cli,
    topic: &str,
    partitions: i32,
    orders: u32,
    keys: u32,
) -> Result<(), Failure> {
    if keys == 0 || orders == 0 {
        return Err(usage("--orders and --keys must be at least 1"));
    }
    let options = outbox_options(cli, Some("outbox-demo"))?;
    let client = dynamodb().await;
    let started = Instant::now();
    table::create_if_not_exists(&client, &options).await?;
    let publisher = kafka(Instant::now() + Duration::from_secs(30)).await?;
    publisher.create_topic(topic, partitions, 1).await?;
    println!(
        "table {} ({} buckets) and topic {topic} ({partitions} partitions) ready",
        options.table_name, options.bucket_count
    );

    // The relay runs in this process, woken by the writer's commit notifications.
    let notifier = LocalNotifier::new();
    let writer =
        DynamoDbOutboxWriter::new(client.clone(), options.clone())?.with_notifier(notifier.clone());
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone())?;
    let relay = Relay::new(store, publisher, relay_options(&options)?)?.with_notifier(notifier);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(async move {
        relay
            .run_until_shutdown(
                async move {
                    let _ = stop_rx.await;
                },
                Duration::from_secs(10),
            )
            .await
    });

    // Each order is a business item and a message in one transaction.
    let mut per_key: BTreeMap<String, u32> = BTreeMap::new();
    for i in 0..orders {
        let customer = format!("customer-{}", i % keys);
        let n = per_key.entry(customer.clone()).or_default();
        *n += 1;
        let enqueued_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let order_id = format!("{}-{i}", options.table_name);
        let message = writer
            .message(topic)
            .with_key(customer.clone())
            .with_value(format!(
                "{{\"order\":\"{order_id}\",\"customer\":\"{customer}\",\"seq\":{n},\"enqueued_ms\":{enqueued_ms}}}"
            ))
            .with_header(Header::new("type", "OrderPlaced"));
        let outbox_item = writer.transact_write_item(&message).await?;
        let business = Put::builder()
            .table_name(&options.table_name)
            .item(
                &options.partition_key_attribute,
                AttributeValue::S(format!("ORDER#{order_id}")),
            )
            .item(
                &options.sort_key_attribute,
                AttributeValue::S("ORDER".into()),
            )
            .item("Customer", AttributeValue::S(customer))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", &options.partition_key_attribute)
            .build()
            .map_err(|e| usage(e.to_string()))?;
        client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(business).build())
            .transact_items(outbox_item)
            .send()
            .await
            .map_err(transaction_error)?;
        writer.notify_committed(std::slice::from_ref(&message));
    }
    println!("placed {orders} orders over {keys} customers, each with its message in the same transaction");

    // Wait until the relay has drained the table.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut pending = 0;
        for b in 0..options.bucket_count {
            pending += store.backlog(b).await?.pending;
        }
        if pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(Failure {
                code: 1,
                message: format!("{pending} messages still pending after 60 s"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let report = relay_task.await.map_err(|e| Failure {
        code: 1,
        message: format!("relay task: {e}"),
    })??;
    println!(
        "relay {} published {} messages in {:.1} s; refused conditional writes: {}; leases released: {}",
        report.relay_id,
        report.published,
        started.elapsed().as_secs_f64(),
        report.refused_total(),
        report.released
    );
    if report.published != u64::from(orders) {
        return Err(Failure {
            code: 1,
            message: format!("published {} of {orders} messages", report.published),
        });
    }
    Ok(())
}
