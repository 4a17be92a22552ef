//! `outboxctl quarantine`: moves a poison item to the dead-letter partition.

use dynamo_outbox::DynamoDbOutboxStore;

use crate::{dynamodb, outbox_options, usage, Cli, Failure};

/// Arguments of `outboxctl quarantine`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bucket of the item.
    bucket: u32,
    /// The item's sequence number (its sort key, without the zero padding).
    sequence: u64,
    /// Print the moved item as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(cli: &Cli, args: &Args) -> Result<(), Failure> {
    let Args {
        ref bucket,
        ref sequence,
        ref json,
    } = *args;
    let options = outbox_options(cli, None)?;
    if *bucket >= options.bucket_count {
        return Err(usage(format!(
            "bucket: {bucket} is not below the bucket count {}",
            options.bucket_count
        )));
    }
    let store = DynamoDbOutboxStore::new(dynamodb().await, options)?;
    let moved = store.quarantine(*bucket, *sequence).await?;
    let (pk, sk) = store.keys().key_of(&moved);
    if *json {
        println!(
            "{}",
            serde_json::json!({"bucket": bucket, "sequence": sequence, "pk": pk, "sk": sk})
        );
    } else {
        println!("moved bucket {bucket}, sequence {sequence} to {pk} / {sk}");
    }
    Ok(())
}
