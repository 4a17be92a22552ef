//! `outboxctl demo`: the whole path on the local stack.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use dynamo_outbox::table;
use dynamo_outbox::writer::transaction_error;
use dynamo_outbox::{
    DynamoDbOutboxStore, DynamoDbOutboxWriter, Header, LocalNotifier, OutboxOptions, Relay,
};
use tokio::time::Instant;

use crate::{dynamodb, kafka, outbox_options, relay_options, usage, Cli, Failure};

/// Flags of `outboxctl demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
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
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let (topic, partitions, orders, keys) =
        (args.topic.as_str(), args.partitions, args.orders, args.keys);
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

    place_orders(&client, &writer, &options, args).await?;
    println!("placed {orders} orders over {keys} customers, each with its message in the same transaction");

    wait_until_drained(&client, &options).await?;
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

/// Places `args.orders` orders over `args.keys` customers: each an order item and its
/// message, written in one transaction, then the relay notified of the commit.
async fn place_orders(
    client: &aws_sdk_dynamodb::Client,
    writer: &DynamoDbOutboxWriter,
    options: &OutboxOptions,
    args: &Args,
) -> Result<(), Failure> {
    let (topic, orders, keys) = (args.topic.as_str(), args.orders, args.keys);
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
    Ok(())
}

/// Waits until the relay has drained the table (every bucket's backlog empty), at most
/// 60 s.
async fn wait_until_drained(
    client: &aws_sdk_dynamodb::Client,
    options: &OutboxOptions,
) -> Result<(), Failure> {
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
    Ok(())
}
