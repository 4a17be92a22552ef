//! A service that places orders through the outbox writer.
//!
//! Each order is one DynamoDB `TransactWriteItems`: the order item in the service's own
//! table and the order's Kafka message in the outbox table. Both are written or neither
//! is, so no order goes unannounced and no message announces an order that does not
//! exist. A relay (`outboxctl relay`, the relay function, or the `embedded_relay`
//! example) publishes the messages afterwards.
//!
//! On the local stack, with the outbox table created first:
//!
//! ```sh
//! scripts/stack.sh run -- bash -c '
//!     export OUTBOX_TABLE_NAME=outbox
//!     cargo run -p outboxctl -- create-table
//!     cargo run -p dynamo-outbox --example place_orders -- --count 5'
//! ```
//!
//! Settings: the outbox's `OUTBOX_*` variables (`OUTBOX_TABLE_NAME` is required; see
//! docs/configuration.md), the standard AWS variables (`AWS_REGION`,
//! `AWS_ENDPOINT_URL_DYNAMODB`, ...), and these flags:
//!
//! - `--count N`: orders to place, 1 to 1000 (default 5);
//! - `--topic NAME`: the topic of the messages (default `$ORDERS_TOPIC`, else `orders`);
//! - `--orders-table NAME`: the service's own table, created if missing (default
//!   `$ORDERS_TABLE`, else `orders`);
//! - `--outbox-table NAME`: overrides `OUTBOX_TABLE_NAME`.

use std::process::ExitCode;
use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, TableStatus, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use dynamo_outbox::writer::transaction_error;
use dynamo_outbox::{DynamoDbOutboxWriter, Header, OutboxMessage, OutboxOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Tries per order: a transaction that lost a race (`TransactionConflict`) or was
/// throttled is tried again.
const MAX_ATTEMPTS: u32 = 5;

/// The service's own table: one item per order, keyed by `OrderId`.
const ORDER_ID: &str = "OrderId";

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("place_orders: {message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and its sources: the SDK's errors say what DynamoDB answered.
            eprintln!("place_orders: {}", dynamo_outbox::error::chain(e.as_ref()));
            exit_code(e.as_ref())
        }
    }
}

/// 2 for what the caller must fix (a bad setting or message), 1 for anything else: the
/// rule of `outboxctl`.
fn exit_code(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    match e.downcast_ref::<dynamo_outbox::Error>() {
        Some(
            dynamo_outbox::Error::InvalidOption { .. }
            | dynamo_outbox::Error::InvalidMessage { .. }
            | dynamo_outbox::Error::Limit { .. }
            | dynamo_outbox::Error::Misconfiguration { .. },
        ) => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

async fn run(args: Args) -> Result<(), BoxError> {
    // The outbox's settings from the environment, the way the relay and `outboxctl` read
    // them (writers and relays of one outbox must agree on the table, key prefix and
    // bucket count); `--outbox-table` overrides the table's name.
    let options = OutboxOptions::from_lookup(|name| match name {
        dynamo_outbox::options::env::TABLE_NAME => args
            .outbox_table
            .clone()
            .or_else(|| std::env::var(name).ok()),
        _ => std::env::var(name).ok(),
    })?;

    // One DynamoDB client for both tables; AWS_ENDPOINT_URL_DYNAMODB points it at
    // DynamoDB Local.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = Client::new(&config);
    expect_table(&client, &options.table_name).await?;
    create_orders_table(&client, &args.orders_table).await?;

    // The writer reserves sequence numbers and builds the outbox's `Put`s. Without a
    // notifier (`with_notifier`), `notify_committed` does nothing: a long-lived relay
    // finds the messages on its next poll (OUTBOX_POLL_INTERVAL), the relay function is
    // woken by the table's stream.
    let writer = DynamoDbOutboxWriter::new(client.clone(), options)?;

    let customers = ["customer-1", "customer-2", "customer-3"];
    for i in 0..args.count {
        let customer = customers[i as usize % customers.len()];
        let order_id = uuid::Uuid::new_v4().to_string();
        let order =
            serde_json::json!({ "order_id": order_id, "customer": customer, "amount": 10 + i });
        // The key decides the bucket and the partition: one customer's orders are
        // published in the order they were placed.
        let message = writer
            .message(&args.topic)
            .with_key(customer)
            .with_value(order.to_string())
            .with_header(Header::new("type", "OrderPlaced"));
        place_order(
            &client,
            &writer,
            &args.orders_table,
            &order_id,
            customer,
            &message,
        )
        .await?;
        println!(
            "placed order {order_id} for {customer}: message {} to {} (bucket {}), \
             in one transaction",
            message.message_id,
            message.topic,
            message.bucket()
        );
    }
    println!(
        "placed {} orders in {} with their messages in {}",
        args.count,
        args.orders_table,
        writer.options().table_name
    );
    Ok(())
}

/// Writes the order item and its message in one transaction, retrying what may succeed
/// on another try.
async fn place_order(
    client: &Client,
    writer: &DynamoDbOutboxWriter,
    orders_table: &str,
    order_id: &str,
    customer: &str,
    message: &OutboxMessage,
) -> Result<(), BoxError> {
    let (mut attempt, mut pause) = (1, Duration::from_millis(50));
    loop {
        // The business write: refused if the order exists already.
        let order = Put::builder()
            .table_name(orders_table)
            .item(ORDER_ID, AttributeValue::S(order_id.into()))
            .item("Customer", AttributeValue::S(customer.into()))
            .item("Status", AttributeValue::S("PLACED".into()))
            .condition_expression("attribute_not_exists(#id)")
            .expression_attribute_names("#id", ORDER_ID)
            .build()?;
        // The message's `Put`. This reserves its sequence number, so it belongs inside
        // the retry loop: a rebuilt transaction needs a fresh reservation. For several
        // messages, `writer.transact_write_items(&messages)` returns one `Put` each.
        let outbox = writer.transact_write_item(message).await?;
        let committed = client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(order).build())
            .transact_items(outbox)
            .send()
            .await
            // Keeps each item's cancellation reason and whether a retry may help.
            .map_err(transaction_error);
        match committed {
            Ok(_) => {
                // Wakes the relay, if a notifier is set; only ever after the commit.
                writer.notify_committed(std::slice::from_ref(message));
                return Ok(());
            }
            Err(e) if e.is_retryable() && attempt < MAX_ATTEMPTS => {
                tokio::time::sleep(pause).await;
                (attempt, pause) = (attempt + 1, pause * 2);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Fails with a clear message unless the outbox table exists. It is infrastructure,
/// shared by writers and relays: the SAM template or `outboxctl create-table` makes it.
async fn expect_table(client: &Client, table: &str) -> Result<(), BoxError> {
    match client.describe_table().table_name(table).send().await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("ResourceNotFoundException") => Err(format!(
            "the outbox table {table} does not exist: create it with `outboxctl create-table` \
             (or deploy template.yaml)"
        )
        .into()),
        Err(e) => Err(e.into()),
    }
}

/// Creates the service's own table unless it exists, and waits until it is active. A
/// real service has it from its infrastructure code; here it keeps the example
/// self-contained. The outbox does not need it to share anything with the outbox table:
/// one transaction may write to several tables.
async fn create_orders_table(client: &Client, table: &str) -> Result<(), BoxError> {
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(ORDER_ID)
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(ORDER_ID)
                .key_type(KeyType::Hash)
                .build()?,
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    match created {
        Ok(_) => println!("created table {table}"),
        Err(e) if e.code() == Some("ResourceInUseException") => {} // it exists
        Err(e) => return Err(e.into()),
    }
    for _ in 0..120 {
        let table = client.describe_table().table_name(table).send().await?;
        if table.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("table {table} is not active after 60 s").into())
}

/// The command line.
#[derive(Debug)]
struct Args {
    count: u32,
    topic: String,
    orders_table: String,
    outbox_table: Option<String>,
}

impl Args {
    /// Flags as `--name value`; an error names the flag and what it expects.
    fn parse(mut argv: impl Iterator<Item = String>) -> Result<Self, String> {
        let env_or =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
        let mut args = Args {
            count: 5,
            topic: env_or("ORDERS_TOPIC", "orders"),
            orders_table: env_or("ORDERS_TABLE", "orders"),
            outbox_table: None,
        };
        while let Some(flag) = argv.next() {
            let mut value = || argv.next().ok_or_else(|| format!("{flag}: needs a value"));
            match flag.as_str() {
                "--count" => {
                    let v = value()?;
                    args.count = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                            format!("--count: {v:?} is not a whole number from 1 to 1000")
                        })?;
                }
                "--topic" => args.topic = value()?,
                "--orders-table" => args.orders_table = value()?,
                "--outbox-table" => args.outbox_table = Some(value()?),
                _ => {
                    return Err(format!(
                        "unknown argument {flag:?} \
                         (expected --count, --topic, --orders-table, --outbox-table)"
                    ))
                }
            }
        }
        Ok(args)
    }
}
