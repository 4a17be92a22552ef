//! The writer: reserves sequence numbers and turns messages into transaction items.
//!
//! DynamoDB has no auto-increment, so each message takes the next number of its bucket's
//! counter (`ADD Sequence :n`, `UPDATED_NEW`) before the transaction commits: the order of
//! two messages in a bucket is the order of their reservations. A reservation whose
//! transaction never commits leaves a gap, which the relay tolerates.
//!
//! Every message is written with its trace context ([`crate::trace_context`]): its own
//! `traceparent` header if it has one, else the context given with
//! [`OutboxMessage::with_trace_context`], else (feature `otel`) the current OpenTelemetry
//! span's, else none.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{
    Put, ReturnValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use futures::stream::{self, StreamExt, TryStreamExt};
use tracing::{debug, instrument};
use uuid::Uuid;

use crate::attr;
pub use crate::error::transaction_error;
use crate::error::{from_sdk, Error, Result};
use crate::message::OutboxMessage;
use crate::notification::{CommitNotifier, NoopNotifier};
use crate::options::{OutboxOptions, TopicAllowList};
use crate::protocol::schema::{self, Item, Keys};

/// A message with its reserved place, ready to join a transaction.
#[derive(Debug, Clone)]
pub(crate) struct Reserved {
    /// The message's id.
    pub(crate) message_id: Uuid,
    /// Its bucket.
    pub(crate) bucket: u32,
    /// Its sequence number within the bucket.
    pub(crate) sequence: u64,
    /// The item to put (guarded by `attribute_not_exists`).
    item: Item,
    table_name: String,
    sk_attribute: String,
}

impl Reserved {
    /// The `Put` for a `TransactWriteItems` request. The `attribute_not_exists` condition
    /// makes a reset counter fail the transaction instead of overwriting a pending message.
    pub(crate) fn transact_write_item(&self) -> Result<TransactWriteItem> {
        let put = Put::builder()
            .table_name(&self.table_name)
            .set_item(Some(self.item.clone()))
            .condition_expression("attribute_not_exists(#sk)")
            .expression_attribute_names("#sk", &self.sk_attribute)
            .build()
            .map_err(|e| {
                Error::misconfigured_by("the outbox item's request could not be built", e)
            })?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

/// The result of [`DynamoDbOutboxWriter::enqueue`] for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The message's id.
    pub message_id: Uuid,
    /// Its bucket.
    pub bucket: u32,
    /// Its sequence number within the bucket.
    pub sequence: u64,
}

/// Writes outbox messages: inside the caller's own transaction, or on their own.
#[derive(Debug, Clone)]
pub struct DynamoDbOutboxWriter {
    client: Client,
    options: OutboxOptions,
    keys: Keys,
    notifier: Arc<dyn CommitNotifier>,
}

impl DynamoDbOutboxWriter {
    /// A writer for the outbox `options` describe; the options are validated here.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `options` break a rule ([`OutboxOptions::validate`]).
    ///
    /// # Examples
    /// ```no_run
    /// use dynamo_outbox::{DynamoDbOutboxWriter, OutboxOptions};
    ///
    /// # async fn example() -> dynamo_outbox::Result<()> {
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let client = aws_sdk_dynamodb::Client::new(&sdk);
    /// let writer = DynamoDbOutboxWriter::new(client, OutboxOptions::new("orders-outbox"))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(client: Client, options: OutboxOptions) -> Result<Self> {
        options.validate()?;
        Ok(DynamoDbOutboxWriter {
            client,
            keys: Keys::new(&options),
            options,
            notifier: Arc::new(NoopNotifier),
        })
    }

    /// Refuses every topic outside `allowed_topics` in [`Self::check`] (and so before any
    /// request of every write), as the enqueue service does with
    /// [`env::ALLOWED_TOPICS`](crate::options::env::ALLOWED_TOPICS) set: the same check as
    /// [`OutboxOptions::allowed_topics`], which [`OutboxOptions::from_env`] reads.
    pub fn with_allowed_topics(mut self, allowed_topics: TopicAllowList) -> Self {
        self.options.allowed_topics = allowed_topics;
        self
    }

    /// Sets the notifier that [`Self::notify_committed`] calls.
    pub fn with_notifier(mut self, notifier: Arc<dyn CommitNotifier>) -> Self {
        self.notifier = notifier;
        self
    }

    /// The options of this writer.
    pub fn options(&self) -> &OutboxOptions {
        &self.options
    }

    /// A message for `topic` stamped with this writer's bucket count.
    pub fn message(&self, topic: impl Into<String>) -> OutboxMessage {
        OutboxMessage::new(topic, self.options.bucket_count)
    }

    /// Reserves a sequence number for one message and returns its `Put` for your own
    /// transaction. Call it inside your retry loop: a rebuilt transaction must reserve again.
    ///
    /// # Errors
    /// As [`transact_write_items`](Self::transact_write_items).
    ///
    /// # Examples
    /// ```no_run
    /// use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
    /// use dynamo_outbox::error::transaction_error;
    /// use dynamo_outbox::DynamoDbOutboxWriter;
    ///
    /// # async fn example(
    /// #     client: aws_sdk_dynamodb::Client,
    /// #     writer: DynamoDbOutboxWriter,
    /// #     order: TransactWriteItem,
    /// # ) -> dynamo_outbox::Result<()> {
    /// let message = writer
    ///     .message("orders")
    ///     .with_key("order-42")
    ///     .with_value(r#"{"status":"placed"}"#);
    /// // the business write and the outbox item commit together, or neither does
    /// client
    ///     .transact_write_items()
    ///     .transact_items(order)
    ///     .transact_items(writer.transact_write_item(&message).await?)
    ///     .send()
    ///     .await
    ///     .map_err(transaction_error)?;
    /// writer.notify_committed(&[message]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn transact_write_item(&self, message: &OutboxMessage) -> Result<TransactWriteItem> {
        self.transact_write_items(std::slice::from_ref(message))
            .await?
            .pop()
            .ok_or_else(|| Error::message("messages", "must not be empty"))
    }

    /// Reserves sequence numbers for several messages (one request per distinct bucket;
    /// messages sharing a bucket keep their list order) and returns their `Put`s.
    ///
    /// # Errors
    /// Before any request, what [`check`](Self::check) finds ([`Error::InvalidMessage`],
    /// [`Error::Limit`]); [`Error::DynamoDb`] when a reservation fails (retryable ones say
    /// so, [`Error::is_retryable`]); [`Error::Corrupt`] when a bucket's sequence counter
    /// holds no number.
    pub async fn transact_write_items(
        &self,
        messages: &[OutboxMessage],
    ) -> Result<Vec<TransactWriteItem>> {
        self.reserve(messages)
            .await?
            .iter()
            .map(Reserved::transact_write_item)
            .collect()
    }

    /// Checks every message, the topic allow-list ([`OutboxOptions::allowed_topics`]) and
    /// DynamoDB's limits without sending anything.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] naming the message's field and the rule it broke (a topic
    /// outside the allow-list among them), [`Error::Limit`] for an item or a transaction
    /// DynamoDB would refuse.
    pub fn check(&self, messages: &[OutboxMessage]) -> Result<()> {
        self.check_stamped(&with_current_trace(messages))
    }

    /// [`Self::check`] of messages already stamped with their trace context.
    fn check_stamped(&self, messages: &[OutboxMessage]) -> Result<()> {
        if messages.is_empty() {
            return Err(Error::message("messages", "must not be empty"));
        }
        if messages.len() > schema::MAX_TRANSACTION_ITEMS {
            return Err(Error::Limit {
                what: "items in one transaction".into(),
                actual: messages.len(),
                limit: schema::MAX_TRANSACTION_ITEMS,
            });
        }
        let mut total = 0;
        for (i, m) in messages.iter().enumerate() {
            let field = format!("messages[{i}]");
            m.validate(&field)?;
            self.options
                .allowed_topics
                .check(&format!("{field}.topic"), &m.topic)?;
            if m.bucket_count != self.options.bucket_count {
                return Err(Error::message(
                    format!("{field}.bucket_count"),
                    format!(
                        "is {}, but the writer's bucket count is {}: every writer and relay of a table must use the same count",
                        m.bucket_count, self.options.bucket_count
                    ),
                ));
            }
            // The sort key has a fixed width, so the size with sequence 0 is the real size.
            let size = schema::item_size(&schema::message_item(&self.keys, m, m.bucket(), 0)?);
            if size > schema::MAX_ITEM_BYTES {
                return Err(Error::Limit {
                    what: format!("{field}: item size in bytes"),
                    actual: size,
                    limit: schema::MAX_ITEM_BYTES,
                });
            }
            total += size;
        }
        if total > schema::MAX_TRANSACTION_BYTES {
            return Err(Error::Limit {
                what: "bytes in one transaction".into(),
                actual: total,
                limit: schema::MAX_TRANSACTION_BYTES,
            });
        }
        Ok(())
    }

    /// Reserves sequence numbers and builds the items, in the order of `messages`.
    #[instrument(skip_all, fields(messages = messages.len()))]
    pub(crate) async fn reserve(&self, messages: &[OutboxMessage]) -> Result<Vec<Reserved>> {
        let messages = with_current_trace(messages);
        let messages = messages.as_ref();
        self.check_stamped(messages)?;
        let mut by_bucket: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, m) in messages.iter().enumerate() {
            by_bucket.entry(m.bucket()).or_default().push(i);
        }
        let reservations: Vec<(u32, u64)> = stream::iter(
            by_bucket
                .iter()
                .map(|(&bucket, idx)| async move {
                    let last = self.reserve_numbers(bucket, idx.len() as u64).await?;
                    Ok::<_, Error>((bucket, last))
                })
                .collect::<Vec<_>>(),
        )
        .buffer_unordered(self.options.max_concurrency)
        .try_collect()
        .await?;
        let mut placed: Vec<Option<(u32, u64)>> = vec![None; messages.len()];
        for (bucket, last) in reservations {
            let idx = &by_bucket[&bucket];
            // `reserved_range` checked count <= last <= MAX_SEQUENCE.
            let first = last - (idx.len() as u64 - 1);
            for (offset, &i) in idx.iter().enumerate() {
                placed[i] = Some((bucket, first + offset as u64));
            }
        }
        messages
            .iter()
            .zip(placed)
            .map(|(m, place)| {
                let (bucket, sequence) = place.expect("every message belongs to a reserved bucket");
                Ok(Reserved {
                    message_id: m.message_id,
                    bucket,
                    sequence,
                    item: schema::message_item(&self.keys, m, bucket, sequence)?,
                    table_name: self.options.table_name.clone(),
                    sk_attribute: self.keys.sk.clone(),
                })
            })
            .collect()
    }

    /// `ADD Sequence :n` on the bucket's counter; returns the new (last reserved) number.
    async fn reserve_numbers(&self, bucket: u32, count: u64) -> Result<u64> {
        reserve_sequence_numbers(
            &self.client,
            &self.options.table_name,
            &self.keys,
            bucket,
            count,
        )
        .await
    }

    /// Writes 1 to 100 messages that have no business write, all or nothing, and notifies.
    ///
    /// One message is one conditional `PutItem` (`attribute_not_exists`), as the reference
    /// writer does: half the write units of a transaction. A refusal whose old item
    /// (`ReturnValuesOnConditionCheckFailure = ALL_OLD`) carries this message's id is the
    /// SDK's retry of a write that was applied: a success, not a second copy. Two or more
    /// messages are one `TransactWriteItems` with a `ClientRequestToken`, so a retry of the
    /// SDK whose first attempt was applied is a success there too.
    ///
    /// # Errors
    /// As [`transact_write_items`](Self::transact_write_items), and for the write itself
    /// [`Error::DynamoDb`] or [`Error::TransactionCanceled`]; nothing is written then.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(writer: dynamo_outbox::DynamoDbOutboxWriter) -> dynamo_outbox::Result<()> {
    /// let enqueued = writer
    ///     .enqueue(&[writer.message("orders").with_key("order-42").with_value("placed")])
    ///     .await?;
    /// println!("message {} in bucket {}", enqueued[0].message_id, enqueued[0].bucket);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn enqueue(&self, messages: &[OutboxMessage]) -> Result<Vec<Enqueued>> {
        let reserved = self.reserve(messages).await?;
        match reserved.as_slice() {
            [one] => self.put_one(one).await?,
            _ => {
                let items = reserved
                    .iter()
                    .map(Reserved::transact_write_item)
                    .collect::<Result<Vec<_>>>()?;
                self.client
                    .transact_write_items()
                    .set_transact_items(Some(items))
                    .client_request_token(Uuid::new_v4().to_string())
                    .send()
                    .await
                    .map_err(transaction_error)?;
            }
        }
        self.notify_committed(messages);
        Ok(reserved
            .iter()
            .map(|r| Enqueued {
                message_id: r.message_id,
                bucket: r.bucket,
                sequence: r.sequence,
            })
            .collect())
    }

    /// One reserved message as a conditional `PutItem`; an applied earlier attempt of the
    /// same write (the item at its key has its message id) is a success.
    async fn put_one(&self, reserved: &Reserved) -> Result<()> {
        let result = self
            .client
            .put_item()
            .table_name(&self.options.table_name)
            .set_item(Some(reserved.item.clone()))
            .condition_expression("attribute_not_exists(#sk)")
            .expression_attribute_names("#sk", &reserved.sk_attribute)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                if let Some(PutItemError::ConditionalCheckFailedException(c)) = e.as_service_error()
                {
                    let ours = reserved.message_id.to_string();
                    if c.item()
                        .and_then(|old| schema::get_s(old, attr::MESSAGE_ID))
                        .is_some_and(|id| id == ours)
                    {
                        debug!(message_id = %ours, "enqueue already applied by an earlier attempt");
                        return Ok(());
                    }
                }
                Err(from_sdk("PutItem", e))
            }
        }
    }

    /// Wakes the relay after your transaction committed. Never call it before the commit.
    pub fn notify_committed(&self, messages: &[OutboxMessage]) {
        let mut buckets: Vec<u32> = messages.iter().map(OutboxMessage::bucket).collect();
        buckets.sort_unstable();
        buckets.dedup();
        self.notifier.notify(&buckets);
    }

    /// The DynamoDB client of this writer.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }
}

/// `messages` as the writer writes them: with the `otel` feature, each one without a
/// `traceparent` header of its own gets the current OpenTelemetry span's context (when
/// there is a valid one); without the feature, unchanged ([`crate::trace_context`]).
fn with_current_trace(messages: &[OutboxMessage]) -> Cow<'_, [OutboxMessage]> {
    #[cfg(feature = "otel")]
    if let Some(context) = crate::trace_context::TraceContext::current() {
        if messages
            .iter()
            .any(|m| !crate::trace_context::has_traceparent(&m.headers))
        {
            return Cow::Owned(
                messages
                    .iter()
                    .map(|m| m.clone().with_trace_context(&context))
                    .collect(),
            );
        }
    }
    Cow::Borrowed(messages)
}

/// `ADD Sequence :n` on `bucket`'s counter, as every writer takes sequence numbers (the
/// library's writer, and a redriven dead letter); returns the new (last reserved) number.
pub(crate) async fn reserve_sequence_numbers(
    client: &Client,
    table_name: &str,
    keys: &Keys,
    bucket: u32,
    count: u64,
) -> Result<u64> {
    let out = client
        .update_item()
        .table_name(table_name)
        .set_key(Some(
            keys.key(keys.sequence_pk(bucket), schema::SEQUENCE_SK.into()),
        ))
        .update_expression("ADD #seq :n")
        .expression_attribute_names("#seq", attr::SEQUENCE)
        .expression_attribute_values(":n", schema::n(count))
        .return_values(ReturnValue::UpdatedNew)
        .send()
        .await
        .map_err(|e| from_sdk("UpdateItem", e))?;
    let last = reserved_range(
        keys,
        bucket,
        out.attributes()
            .and_then(|a| schema::get_n(a, attr::SEQUENCE)),
        count,
    )?;
    debug!(bucket, last, count, "reserved sequence numbers");
    Ok(last)
}

/// The last of `count` numbers just reserved in `bucket`, from the counter's value after
/// the `ADD` (`None`: missing or not a whole number), checked to be a range of sequences
/// a message's sort key can hold. The counter is an item anyone can write.
fn reserved_range(keys: &Keys, bucket: u32, after_add: Option<u64>, count: u64) -> Result<u64> {
    let corrupt = |reason: String| Error::Corrupt {
        pk: keys.sequence_pk(bucket),
        sk: schema::SEQUENCE_SK.into(),
        reason,
        source: None,
    };
    let last = after_add
        .ok_or_else(|| corrupt("Sequence is missing or not a whole number after ADD".into()))?;
    if last < count {
        return Err(corrupt(format!(
            "Sequence {last} is smaller than the {count} numbers just reserved"
        )));
    }
    if last > schema::MAX_SEQUENCE {
        return Err(corrupt(format!(
            "Sequence {last} is past {}, the largest sequence a message's 19-digit sort key holds",
            schema::MAX_SEQUENCE
        )));
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offline_client() -> Client {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .build();
        Client::from_conf(config)
    }

    #[test]
    fn a_sequence_counter_past_the_sort_keys_range_is_refused_with_its_name() {
        let keys = Keys::new(&OutboxOptions::new("orders"));
        let pk = keys.sequence_pk(3);
        assert_eq!(reserved_range(&keys, 3, Some(7), 3).unwrap(), 7);
        assert_eq!(
            reserved_range(&keys, 3, Some(schema::MAX_SEQUENCE), 1).unwrap(),
            schema::MAX_SEQUENCE
        );
        for (after_add, count, says) in [
            (None, 1, "missing or not a whole number"),
            (Some(2), 3, "smaller than the 3 numbers"),
            (Some(schema::MAX_SEQUENCE + 1), 1, "19-digit sort key"),
            (Some(u64::MAX), 2, "19-digit sort key"),
        ] {
            match reserved_range(&keys, 3, after_add, count) {
                Err(Error::Corrupt {
                    pk: got_pk,
                    sk,
                    reason,
                    ..
                }) => {
                    assert_eq!((got_pk.as_str(), sk.as_str()), (pk.as_str(), "SEQUENCE"));
                    assert!(reason.contains(says), "{reason}");
                }
                other => panic!("{after_add:?}, {count}: {other:?}"),
            }
        }
    }

    #[test]
    fn messages_get_the_current_trace_only_with_the_otel_feature_and_a_span() {
        let own = "00-11111111111111111111111111111111-2222222222222222-00";
        let plain = OutboxMessage::new("t", 8);
        let with_own =
            OutboxMessage::new("t", 8).with_header(crate::headers::Header::new("traceparent", own));
        let both = [plain.clone(), with_own.clone()];
        // Outside any span (and always without the feature): written as they are.
        assert!(matches!(with_current_trace(&both), Cow::Borrowed(_)));
        #[cfg(feature = "otel")]
        {
            use opentelemetry::trace::{
                SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
            };
            let span = SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            );
            let _inside = opentelemetry::Context::new()
                .with_remote_span_context(span)
                .attach();
            let stamped = with_current_trace(&both);
            assert_eq!(
                stamped[0].headers,
                vec![crate::headers::Header::new(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                )]
            );
            assert_eq!(stamped[1].headers, with_own.headers, "its own is kept");
        }
    }

    /// Without the `otel` feature the writer has no trace context to stamp: inside a
    /// `tracing` span (a service that traces without OpenTelemetry) its messages are
    /// written as they are, their items without a `Headers` attribute. `scripts/test.sh`
    /// runs the library's unit tests without features for this.
    #[cfg(not(feature = "otel"))]
    #[test]
    fn without_the_otel_feature_a_writer_writes_no_trace_headers() {
        let span = tracing::info_span!("place order");
        let _inside = span.enter();
        let batch = [OutboxMessage::new("orders", 8).with_key("order-1")];
        let written = with_current_trace(&batch);
        assert!(matches!(written, Cow::Borrowed(_)));
        let keys = Keys::new(&OutboxOptions::new("orders-outbox"));
        let item = schema::message_item(&keys, &written[0], written[0].bucket(), 1).unwrap();
        assert!(!item.contains_key(attr::HEADERS), "{item:?}");
    }

    #[test]
    fn the_allow_list_is_an_option_of_the_writer_checked_before_anything_is_sent() {
        let options = OutboxOptions::new("orders-outbox");
        let open = DynamoDbOutboxWriter::new(offline_client(), options.clone()).unwrap();
        let messages: Vec<OutboxMessage> = ["orders", "audit-eu", "orders", "payments"]
            .into_iter()
            .map(|t| open.message(t))
            .collect();
        // Unset: every topic, as before.
        open.check(&messages).unwrap();

        let list = TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", "orders,audit-*").unwrap();
        let by_option =
            DynamoDbOutboxWriter::new(offline_client(), options.with_allowed_topics(list.clone()))
                .unwrap();
        let by_builder = open.clone().with_allowed_topics(list);
        for writer in [&by_option, &by_builder] {
            let e = writer.check(&messages).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("messages[3].topic: topic \"payments\" is not allowed here"),
                "{e}"
            );
            assert_eq!(e.error_type(), "ValidationError");
            writer.check(&messages[..3]).unwrap();
        }
    }
}
