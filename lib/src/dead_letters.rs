//! Dead letters back in the stream: list, redrive and purge what the dead-letter partition
//! (`{prefix}#DEADLETTER`) holds (`outboxctl dead-letters`).
//!
//! A dead letter is a message item moved aside whole by
//! [`DynamoDbOutboxStore::quarantine`] (an operator) or by a relay under
//! `OUTBOX_POISON_POLICY=quarantine-after=N`; it keeps its original key in `OriginalPK` /
//! `OriginalSK`, and when and why it was moved in `QuarantinedAtUtc` / `QuarantineReason`.
//!
//! [`redrive`] puts one back at the **tail** of its original bucket: it takes the bucket's
//! next sequence number as a writer does (`ADD Sequence :1` on the counter), then one
//! `TransactWriteItems` puts the message item there (same message id, topic, key, value,
//! headers and partition; `CreatedAtUtc` is the redrive's time) under
//! `attribute_not_exists`, and deletes the dead letter under `attribute_exists` and its
//! message id. Its old place is gone (the relay has published what came after it), and a
//! bucket's order is its sequence order, so it goes out after everything pending in the
//! bucket now. Relays see a new message: nothing they write is touched, so none of their
//! conditional writes is refused because of it. A transaction that does not commit
//! leaves a gap in the sequence, which relays step over as after any failed enqueue.
//!
//! A dead letter is redriven only into the bucket its key belongs to under this outbox's
//! bucket count, and only when it can be read as a message on an allowed topic: anything
//! else would park its bucket again, or break per-key order. Those are refused with
//! [`Error::InvalidMessage`] naming the rule, and nothing is written.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, ReturnValue, TransactWriteItem};
use uuid::Uuid;

use crate::attr;
use crate::error::{from_sdk, transaction_error, Error, Result};
use crate::message::OutboxMessage;
use crate::protocol::clock::duration_to_ticks;
use crate::protocol::schema::{self, Item, Keys};
use crate::protocol::store::{DynamoDbOutboxStore, ORIGINAL_PK, ORIGINAL_SK};

/// The most dead letters one call redrives or purges.
pub const MAX_BATCH: usize = 1000;

/// One item of the dead-letter partition, read without trusting it: every field that
/// cannot be read is `None` (or `message` an `Err` saying why).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its sort key in the dead-letter partition (`{bucket:010}#{sequence:019}`).
    pub sort_key: String,
    /// The bucket it was moved from (from `OriginalPK`, or its sort key).
    pub bucket: Option<u32>,
    /// The sequence number it had there (from `OriginalSK`, or its sort key).
    pub sequence: Option<u64>,
    /// `MessageId`, as stored.
    pub message_id: Option<String>,
    /// `Topic`, as stored.
    pub topic: Option<String>,
    /// When it was quarantined, in UTC ticks (`None` for one moved before this was
    /// recorded).
    pub quarantined_at: Option<i64>,
    /// Why it was quarantined (`None` for one moved before this was recorded).
    pub reason: Option<String>,
    /// The message, read as a relay would read it at its original key; `Err` says why it
    /// cannot be.
    pub message: std::result::Result<OutboxMessage, String>,
    /// The stored item.
    pub item: std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
}

impl DeadLetter {
    /// Reads an item of the dead-letter partition. Never fails: what cannot be read is
    /// `None`. For tools that read the partition themselves (it takes the protocol's
    /// [`Keys`]): hidden from these docs.
    #[doc(hidden)]
    pub fn from_item(keys: &Keys, item: Item) -> DeadLetter {
        let (_, sk) = keys.key_of(&item);
        let sort_key = sk.to_string();
        let from_sk = parse_dead_letter_sk(&sort_key);
        let bucket = schema::get_s(&item, ORIGINAL_PK)
            .and_then(|pk| keys.message_bucket(pk))
            .or(from_sk.map(|(b, _)| b));
        let sequence = schema::get_s(&item, ORIGINAL_SK)
            .and_then(schema::parse_message_sk)
            .or(from_sk.map(|(_, s)| s));
        let message = match (bucket, sequence) {
            (Some(b), Some(s)) => {
                let mut original = item.clone();
                original.extend(keys.key(keys.message_pk(b), schema::message_sk(s)));
                schema::parse_message(keys, &original)
                    .map(|m| m.message)
                    .map_err(|e| crate::error::unreadable_because(&e))
            }
            _ => Err("its original bucket and sequence cannot be read".into()),
        };
        DeadLetter {
            sort_key,
            bucket,
            sequence,
            message_id: schema::get_s(&item, attr::MESSAGE_ID).map(str::to_string),
            topic: schema::get_s(&item, attr::TOPIC).map(str::to_string),
            quarantined_at: schema::get_n(&item, attr::QUARANTINED_AT),
            reason: schema::get_s(&item, attr::QUARANTINE_REASON).map(str::to_string),
            message,
            item,
        }
    }

    /// When it left the stream, in UTC ticks: its quarantine time, or (for one moved
    /// before that was recorded) its enqueue time.
    pub fn since(&self) -> Option<i64> {
        self.quarantined_at
            .or_else(|| schema::get_n(&self.item, attr::CREATED_AT))
    }
}

/// Bucket and sequence of a dead letter's sort key (`{bucket:010}#{sequence:019}`).
pub(crate) fn parse_dead_letter_sk(sk: &str) -> Option<(u32, u64)> {
    let (b, s) = sk.split_once('#')?;
    if b.len() != 10 || !b.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((b.parse().ok()?, schema::parse_message_sk(s)?))
}

/// Which dead letters a command takes; every filter set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Moved from this bucket.
    pub bucket: Option<u32>,
    /// With this original sequence number (with `bucket`: one dead letter).
    pub sequence: Option<u64>,
    /// On this topic.
    pub topic: Option<String>,
    /// Out of the stream for at least this long ([`DeadLetter::since`]); one whose time
    /// cannot be read does not match.
    pub older_than: Option<Duration>,
}

impl Filter {
    /// Whether `d` matches at `now` (UTC ticks).
    pub fn matches(&self, d: &DeadLetter, now: i64) -> bool {
        self.bucket.is_none_or(|b| d.bucket == Some(b))
            && self.sequence.is_none_or(|s| d.sequence == Some(s))
            && self
                .topic
                .as_deref()
                .is_none_or(|t| d.topic.as_deref() == Some(t))
            && self.older_than.is_none_or(|age| {
                d.since()
                    .is_some_and(|t| now.saturating_sub(t) >= duration_to_ticks(age))
            })
    }
}

/// The dead letters `filter` matches, in sort key order (bucket, then sequence), at most
/// `limit`; the flag says whether more match. Strongly consistent reads of the dead-letter
/// partition (only the filter's bucket or sort key when it names one), page by page.
///
/// # Errors
/// [`Error::DynamoDb`] when a read fails.
///
/// # Examples
/// ```no_run
/// use dynamo_outbox::dead_letters::{self, Filter};
///
/// # async fn example(store: dynamo_outbox::DynamoDbOutboxStore) -> dynamo_outbox::Result<()> {
/// let (letters, more) = dead_letters::list(&store, &Filter::default(), 100).await?;
/// for d in &letters {
///     match dead_letters::redrive(&store, d).await {
///         Ok(r) => println!("{} back in bucket {} at {}", r.message_id, r.bucket, r.sequence),
///         Err(e) => println!("{:?} stays: {e}", d.message_id),
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub async fn list(
    store: &DynamoDbOutboxStore,
    filter: &Filter,
    limit: usize,
) -> Result<(Vec<DeadLetter>, bool)> {
    let keys = store.keys();
    let now = store.clock().now_ticks();
    let mut found = Vec::new();
    let mut start = None;
    loop {
        let mut query = store
            .query_partition(keys.dead_letter_pk())
            .consistent_read(true)
            .set_exclusive_start_key(start);
        match (filter.bucket, filter.sequence) {
            (Some(b), Some(s)) => {
                query = query
                    .key_condition_expression("#pk = :pk AND #sk = :sk")
                    .expression_attribute_names("#sk", &keys.sk)
                    .expression_attribute_values(
                        ":sk",
                        AttributeValue::S(schema::dead_letter_sk(b, s)),
                    );
            }
            (Some(b), None) => {
                query = query
                    .key_condition_expression("#pk = :pk AND begins_with(#sk, :sk)")
                    .expression_attribute_names("#sk", &keys.sk)
                    .expression_attribute_values(":sk", AttributeValue::S(format!("{b:010}#")));
            }
            _ => {}
        }
        let out = query.send().await.map_err(|e| from_sdk("Query", e))?;
        for item in out.items.unwrap_or_default() {
            let d = DeadLetter::from_item(keys, item);
            if filter.matches(&d, now) {
                if found.len() == limit {
                    return Ok((found, true));
                }
                found.push(d);
            }
        }
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return Ok((found, false)),
        }
    }
}

/// The dead letter moved from `bucket` / `sequence`, if there is one.
///
/// # Errors
/// [`Error::DynamoDb`] when the read fails.
pub async fn get(
    store: &DynamoDbOutboxStore,
    bucket: u32,
    sequence: u64,
) -> Result<Option<DeadLetter>> {
    let filter = Filter {
        bucket: Some(bucket),
        sequence: Some(sequence),
        ..Filter::default()
    };
    Ok(list(store, &filter, 1).await?.0.into_iter().next())
}

/// Where a redriven message went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Redriven {
    /// Its id (unchanged).
    pub message_id: Uuid,
    /// Its bucket (the original one).
    pub bucket: u32,
    /// The sequence it had when it was quarantined.
    pub from_sequence: u64,
    /// Its new sequence number: the bucket's tail when it was redriven.
    pub sequence: u64,
}

/// Checks that `d` can go back into this outbox and returns the message to write and its
/// bucket; nothing is sent. Refused ([`Error::InvalidMessage`], naming the rule): an item
/// that cannot be read as a message, one stamped with another bucket count than
/// `OUTBOX_BUCKET_COUNT`, one whose key belongs to another bucket under that count, one on
/// a topic outside `OUTBOX_ALLOWED_TOPICS`.
///
/// # Errors
/// [`Error::InvalidMessage`] naming the rule the dead letter breaks.
pub fn check_redrive(store: &DynamoDbOutboxStore, d: &DeadLetter) -> Result<(OutboxMessage, u32)> {
    let options = store.options();
    let field = format!("dead letter {}", d.sort_key);
    let refuse = |rule: String| Error::message(field.clone(), format!("{rule}; not redriven"));
    let message = d.message.as_ref().map_err(|why| {
        refuse(format!(
            "cannot be read as a message ({why}): it would park its bucket again (fix the \
             item or purge it)"
        ))
    })?;
    let bucket = d
        .bucket
        .ok_or_else(|| refuse("its original bucket cannot be read".into()))?;
    let count = options.bucket_count;
    if message.bucket_count != 0 && message.bucket_count != count {
        return Err(refuse(format!(
            "it is stamped with bucket count {}, but this outbox's bucket count \
             (OUTBOX_BUCKET_COUNT) is {count}: its bucket {bucket} is not its key's bucket \
             under {count}, and per-key order would break",
            message.bucket_count
        )));
    }
    let mut message = message.clone();
    message.bucket_count = count;
    let belongs = message.bucket();
    if bucket >= count || belongs != bucket {
        return Err(refuse(format!(
            "it was quarantined from bucket {bucket}, but under this outbox's bucket count \
             (OUTBOX_BUCKET_COUNT) {count} it belongs in bucket {belongs}: per-key order would \
             break"
        )));
    }
    if !options.allowed_topics.allows(&message.topic) {
        return Err(refuse(format!(
            "{}: it would park its bucket again",
            options.allowed_topics.refusal(&message.topic)
        )));
    }
    message.created_at_ticks = store.clock().now_ticks();
    Ok((message, bucket))
}

/// Puts `d` back at the tail of its original bucket and removes it from the dead-letter
/// partition, in one transaction (see the module's documentation). Refused without a
/// write when [`check_redrive`] refuses it; a dead letter that is gone meanwhile
/// (redriven or purged by someone else) fails the transaction and leaves a gap in the
/// bucket's sequence, nothing else.
///
/// # Errors
/// What [`check_redrive`] refuses; [`Error::DynamoDb`] or [`Error::TransactionCanceled`]
/// when the write fails.
pub async fn redrive(store: &DynamoDbOutboxStore, d: &DeadLetter) -> Result<Redriven> {
    let (message, bucket) = check_redrive(store, d)?;
    let keys = store.keys();
    let options = store.options();
    // The bucket's next sequence number, taken as a writer takes it.
    let sequence = crate::writer::reserve_sequence_numbers(
        store.client(),
        &store.options().table_name,
        store.keys(),
        bucket,
        1,
    )
    .await?;
    let item = schema::message_item(keys, &message, bucket, sequence)?;
    let build = |e: aws_sdk_dynamodb::error::BuildError| {
        Error::misconfigured_by("the redrive's request could not be built", e)
    };
    let put = Put::builder()
        .table_name(&options.table_name)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(#sk)")
        .expression_attribute_names("#sk", &keys.sk)
        .build()
        .map_err(build)?;
    let delete = Delete::builder()
        .table_name(&options.table_name)
        .set_key(Some(keys.key(keys.dead_letter_pk(), d.sort_key.clone())))
        .condition_expression("attribute_exists(#sk) AND #id = :id")
        .expression_attribute_names("#sk", &keys.sk)
        .expression_attribute_names("#id", attr::MESSAGE_ID)
        .expression_attribute_values(
            ":id",
            schema::s(message.message_id.hyphenated().to_string()),
        )
        .build()
        .map_err(build)?;
    store
        .client()
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().put(put).build())
        .transact_items(TransactWriteItem::builder().delete(delete).build())
        .client_request_token(Uuid::new_v4().to_string())
        .send()
        .await
        .map_err(transaction_error)?;
    Ok(Redriven {
        message_id: message.message_id,
        bucket,
        from_sequence: d.sequence.unwrap_or_default(),
        sequence,
    })
}

/// Deletes `d` from the dead-letter partition for good; `false` when it was already gone.
///
/// # Errors
/// [`Error::DynamoDb`] when the delete fails.
pub async fn purge(store: &DynamoDbOutboxStore, d: &DeadLetter) -> Result<bool> {
    let keys = store.keys();
    let out = store
        .client()
        .delete_item()
        .table_name(&store.options().table_name)
        .set_key(Some(keys.key(keys.dead_letter_pk(), d.sort_key.clone())))
        .return_values(ReturnValue::AllOld)
        .send()
        .await
        .map_err(|e| from_sdk("DeleteItem", e))?;
    Ok(out.attributes().is_some_and(|a| !a.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{OutboxOptions, TopicAllowList};

    fn keys() -> Keys {
        Keys::new(&OutboxOptions::new("t"))
    }

    fn dead(message: &OutboxMessage, bucket: u32, sequence: u64) -> Item {
        let k = keys();
        let mut item = schema::message_item(&k, message, bucket, sequence).unwrap();
        item.insert(ORIGINAL_PK.into(), schema::s(k.message_pk(bucket)));
        item.insert(ORIGINAL_SK.into(), schema::s(schema::message_sk(sequence)));
        item.extend(k.key(k.dead_letter_pk(), schema::dead_letter_sk(bucket, sequence)));
        item
    }

    #[test]
    fn dead_letters_are_read_without_trusting_them() {
        let k = keys();
        let m = OutboxMessage::new("orders", 8).with_key(b"k".to_vec());
        let mut item = dead(&m, 3, 42);
        item.insert(attr::QUARANTINED_AT.into(), schema::n(77));
        item.insert(attr::QUARANTINE_REASON.into(), schema::s("bad"));
        let d = DeadLetter::from_item(&k, item);
        assert_eq!(d.sort_key, "0000000003#0000000000000000042");
        assert_eq!((d.bucket, d.sequence), (Some(3), Some(42)));
        assert_eq!(d.message.as_ref().unwrap(), &m);
        assert_eq!(
            (d.quarantined_at, d.reason.as_deref()),
            (Some(77), Some("bad"))
        );
        assert_eq!(d.since(), Some(77));

        // Nothing but a key: every field None, the message an error, no panic.
        let bare = k.key(k.dead_letter_pk(), "junk".into());
        let d = DeadLetter::from_item(&k, bare);
        assert_eq!((d.bucket, d.sequence, d.message_id), (None, None, None));
        assert!(d.message.is_err());
        // Original key lost: the sort key says where it came from.
        let mut item = dead(&m, 5, 6);
        item.insert(ORIGINAL_PK.into(), AttributeValue::N("1".into()));
        item.remove(attr::TOPIC);
        let d = DeadLetter::from_item(&k, item);
        assert_eq!((d.bucket, d.sequence), (Some(5), Some(6)));
        assert!(d.message.unwrap_err().contains("Topic"));
        assert_eq!(
            parse_dead_letter_sk("0000000001#0000000000000000042"),
            Some((1, 42))
        );
        assert_eq!(parse_dead_letter_sk("1#42"), None);
    }

    #[test]
    fn filters_match_bucket_topic_and_age() {
        let k = keys();
        let m = OutboxMessage::new("orders", 8);
        let mut item = dead(&m, 3, 42);
        item.insert(attr::QUARANTINED_AT.into(), schema::n(1_000_000_000));
        let d = DeadLetter::from_item(&k, item);
        let now = 1_000_000_000 + duration_to_ticks(Duration::from_secs(60));
        let f = |f: Filter| f.matches(&d, now);
        assert!(f(Filter::default()));
        assert!(f(Filter {
            bucket: Some(3),
            sequence: Some(42),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            bucket: Some(2),
            ..Filter::default()
        }));
        assert!(f(Filter {
            topic: Some("orders".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            topic: Some("order".into()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            older_than: Some(Duration::from_secs(60)),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            older_than: Some(Duration::from_secs(61)),
            ..Filter::default()
        }));
    }

    #[test]
    fn a_redrive_is_refused_with_the_rule_when_the_item_would_not_fit_this_outbox() {
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
                .build(),
        );
        let options = OutboxOptions::new("orders-outbox")
            .with_bucket_count(8)
            .with_allowed_topics(TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", "orders").unwrap());
        let store = DynamoDbOutboxStore::new(client, options).unwrap();
        let k = keys();
        let m = OutboxMessage::new("orders", 8).with_key(b"customer-42".to_vec());
        let b = m.bucket();
        let ok = DeadLetter::from_item(&k, dead(&m, b, 9));
        let (back, bucket) = check_redrive(&store, &ok).unwrap();
        assert_eq!(
            (back.message_id, back.key.clone(), bucket),
            (m.message_id, m.key.clone(), b)
        );

        // Stamped with another count.
        let mut other = m.clone();
        other.bucket_count = 16;
        let d = DeadLetter::from_item(&k, dead(&other, other.bucket(), 9));
        let e = check_redrive(&store, &d).unwrap_err().to_string();
        assert!(
            e.contains("stamped with bucket count 16") && e.contains("OUTBOX_BUCKET_COUNT) is 8"),
            "{e}"
        );
        // Unstamped, in a bucket its key does not belong to.
        let mut unstamped = m.clone();
        unstamped.bucket_count = 0;
        let d = DeadLetter::from_item(&k, dead(&unstamped, (b + 1) % 8, 9));
        let e = check_redrive(&store, &d).unwrap_err().to_string();
        assert!(e.contains(&format!("it belongs in bucket {b}")), "{e}");
        // A topic outside the allow-list.
        let mut audit = m.clone();
        audit.topic = "audit".into();
        let d = DeadLetter::from_item(&k, dead(&audit, b, 9));
        let e = check_redrive(&store, &d).unwrap_err().to_string();
        assert!(e.contains("topic \"audit\" is not allowed here"), "{e}");
        // Unreadable.
        let mut item = dead(&m, b, 9);
        item.remove(attr::MESSAGE_ID);
        let e = check_redrive(&store, &DeadLetter::from_item(&k, item)).unwrap_err();
        assert!(matches!(e, Error::InvalidMessage { .. }));
        assert!(e.to_string().contains("cannot be read as a message"), "{e}");
    }
}
