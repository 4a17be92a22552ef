//! The table definition and idempotent provisioning.

use std::time::Duration;

use aws_sdk_dynamodb::operation::create_table::CreateTableInput;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableDescription, TableStatus,
};
use aws_sdk_dynamodb::Client;
use tracing::{debug, info};

use crate::error::{from_sdk, Error, Result};
use crate::options::OutboxOptions;

/// How long [`create_if_not_exists`] waits for the table to become active.
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(300);

/// The table the outbox needs: string partition and sort keys named as the options say,
/// on-demand billing, no indexes, no streams, no TTL.
pub fn create_table_request(options: &OutboxOptions) -> Result<CreateTableInput> {
    options.validate()?;
    let def = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    let build_err = |e: aws_sdk_dynamodb::error::BuildError| {
        Error::misconfigured_by("the table definition could not be built", e)
    };
    CreateTableInput::builder()
        .table_name(&options.table_name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(def(&options.partition_key_attribute).map_err(build_err)?)
        .attribute_definitions(def(&options.sort_key_attribute).map_err(build_err)?)
        .key_schema(key(&options.partition_key_attribute, KeyType::Hash).map_err(build_err)?)
        .key_schema(key(&options.sort_key_attribute, KeyType::Range).map_err(build_err)?)
        .build()
        .map_err(build_err)
}

/// What [`create_if_not_exists`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    /// This call created the table.
    Created,
    /// The table existed already (or another process created it concurrently).
    Existed,
}

/// Creates the table unless it exists, and waits until it is active (at most
/// [`DEFAULT_CREATE_TIMEOUT`]). Safe to call from several processes at once.
///
/// # Errors
/// [`Error::Misconfiguration`] for an existing table whose key schema does not fit the
/// options; [`Error::DynamoDb`] when a request fails; [`Error::DeadlineExceeded`] when the
/// table is not active in time.
///
/// # Examples
/// ```no_run
/// use dynamo_outbox::table::{create_if_not_exists, Provisioned};
/// use dynamo_outbox::OutboxOptions;
///
/// # async fn example(client: aws_sdk_dynamodb::Client) -> dynamo_outbox::Result<()> {
/// let options = OutboxOptions::new("orders-outbox");
/// if create_if_not_exists(&client, &options).await? == Provisioned::Created {
///     println!("created {}", options.table_name);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn create_if_not_exists(client: &Client, options: &OutboxOptions) -> Result<Provisioned> {
    create_if_not_exists_within(
        client,
        options,
        tokio::time::Instant::now() + DEFAULT_CREATE_TIMEOUT,
    )
    .await
}

/// [`create_if_not_exists`] with the caller's deadline.
///
/// # Errors
/// As [`create_if_not_exists`].
pub async fn create_if_not_exists_within(
    client: &Client,
    options: &OutboxOptions,
    deadline: tokio::time::Instant,
) -> Result<Provisioned> {
    let request = create_table_request(options)?;
    let outcome = match describe(client, &options.table_name).await? {
        Some(table) => {
            check_key_schema(&table, options)?;
            Provisioned::Existed
        }
        None => {
            let created = client
                .create_table()
                .set_table_name(request.table_name)
                .set_billing_mode(request.billing_mode)
                .set_attribute_definitions(request.attribute_definitions)
                .set_key_schema(request.key_schema)
                .send()
                .await;
            match created {
                Ok(_) => {
                    info!(table = %options.table_name, "created outbox table");
                    Provisioned::Created
                }
                Err(e) if is_code(&e, "ResourceInUseException") => {
                    debug!(table = %options.table_name, "table is being created by someone else");
                    Provisioned::Existed
                }
                Err(e) => return Err(from_sdk("CreateTable", e)),
            }
        }
    };
    let mut pause = Duration::from_millis(50);
    loop {
        match describe(client, &options.table_name).await? {
            Some(table) if table.table_status() == Some(&TableStatus::Active) => {
                check_key_schema(&table, options)?;
                return Ok(outcome);
            }
            _ if tokio::time::Instant::now() + pause > deadline => {
                return Err(Error::DeadlineExceeded(
                    "waiting for the table to become active",
                ))
            }
            _ => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn describe(client: &Client, table: &str) -> Result<Option<TableDescription>> {
    match client.describe_table().table_name(table).send().await {
        Ok(out) => Ok(out.table),
        Err(e) if is_code(&e, "ResourceNotFoundException") => Ok(None),
        Err(e) => Err(from_sdk("DescribeTable", e)),
    }
}

fn is_code<E: aws_sdk_dynamodb::error::ProvideErrorMetadata, R>(
    e: &aws_sdk_dynamodb::error::SdkError<E, R>,
    code: &str,
) -> bool {
    e.as_service_error().and_then(|s| s.code()) == Some(code)
}

/// Checks that a table has string partition and sort keys named as the options say.
pub fn check_key_schema(table: &TableDescription, options: &OutboxOptions) -> Result<()> {
    let name = table.table_name().unwrap_or(&options.table_name);
    let key_of = |kind: KeyType| {
        table
            .key_schema()
            .iter()
            .find(|k| k.key_type() == &kind)
            .map(|k| k.attribute_name().to_string())
    };
    let type_of = |attr: &str| {
        table
            .attribute_definitions()
            .iter()
            .find(|d| d.attribute_name() == attr)
            .map(|d| d.attribute_type().clone())
    };
    for (kind, want, field) in [
        (
            KeyType::Hash,
            &options.partition_key_attribute,
            "partition key",
        ),
        (KeyType::Range, &options.sort_key_attribute, "sort key"),
    ] {
        match key_of(kind) {
            Some(actual) if &actual == want => {
                if type_of(want) != Some(ScalarAttributeType::S) {
                    return Err(Error::misconfigured(format!(
                        "table {name}: {field} {want} must be of type S (string)"
                    )));
                }
            }
            Some(actual) => {
                return Err(Error::misconfigured(format!(
                    "table {name}: {field} is {actual}, but the options expect {want}"
                )))
            }
            None => {
                return Err(Error::misconfigured(format!(
                    "table {name} has no {field}; the outbox needs a string {field} named {want}"
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_matches_the_spec() {
        let r = create_table_request(&OutboxOptions::new("orders-outbox")).unwrap();
        assert_eq!(r.table_name(), Some("orders-outbox"));
        assert_eq!(r.billing_mode(), Some(&BillingMode::PayPerRequest));
        let keys: Vec<_> = r
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type().as_str()))
            .collect();
        assert_eq!(keys, [("PK", "HASH"), ("SK", "RANGE")]);
        assert!(r
            .attribute_definitions()
            .iter()
            .all(|d| d.attribute_type() == &ScalarAttributeType::S));
        assert!(r.global_secondary_indexes().is_empty() && r.local_secondary_indexes().is_empty());
        assert!(r.stream_specification().is_none());
    }

    #[test]
    fn invalid_options_are_refused() {
        let mut o = OutboxOptions::new("orders-outbox");
        o.bucket_count = 0;
        assert!(create_table_request(&o).is_err());
    }
}
