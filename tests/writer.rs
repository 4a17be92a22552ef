//! The writer and table provisioning against DynamoDB Local.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use dynamo_outbox::accounting::Refusals;
use dynamo_outbox::protocol::attr;
use dynamo_outbox::protocol::schema::{self, Keys};
use dynamo_outbox::table::{self, Provisioned};
use dynamo_outbox::writer::transaction_error;
use dynamo_outbox::{DynamoDbOutboxWriter, Error, Header, OutboxMessage, OutboxOptions};
use outbox_testkit::{
    counted_client, dynamodb, dynamodb_builder, faulty_dynamodb, fresh_table, random_name, Fault,
};

async fn query_partition(
    client: &Client,
    table: &str,
    pk: &str,
) -> Vec<HashMap<String, AttributeValue>> {
    client
        .query()
        .table_name(table)
        .key_condition_expression("PK = :pk")
        .expression_attribute_values(":pk", AttributeValue::S(pk.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default()
}

async fn count_items(client: &Client, table: &str) -> usize {
    client
        .scan()
        .table_name(table)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default()
        .len()
}

#[tokio::test]
async fn provisioning_is_idempotent_and_concurrent() {
    let client = dynamodb().await;
    let options = OutboxOptions::new(random_name("prov"));
    let (a, b) = tokio::join!(
        table::create_if_not_exists(&client, &options),
        table::create_if_not_exists(&client, &options)
    );
    let mut outcomes = [a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| *o == Provisioned::Existed);
    assert_eq!(
        outcomes[1],
        Provisioned::Existed,
        "at most one call creates"
    );
    assert_eq!(
        table::create_if_not_exists(&client, &options)
            .await
            .unwrap(),
        Provisioned::Existed
    );
    let described = client
        .describe_table()
        .table_name(&options.table_name)
        .send()
        .await
        .unwrap();
    let t = described.table.unwrap();
    assert_eq!(t.table_status().map(|s| s.as_str()), Some("ACTIVE"));
    table::check_key_schema(&t, &options).unwrap();
}

#[tokio::test]
async fn provisioning_refuses_a_table_with_other_keys() {
    let client = dynamodb().await;
    let name = random_name("wrongkeys");
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let err = table::create_if_not_exists(&client, &OutboxOptions::new(&name))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Misconfiguration { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("partition key is id, but the options expect PK"),
        "{err}"
    );
}

#[tokio::test]
async fn enqueue_reserves_in_list_order_per_bucket() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 8).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let keys = Keys::new(&options);
    // Three keys of one bucket and one of another, interleaved: each bucket's sequence
    // follows the list order, across keys too.
    let bucket_of = |k: &str| writer.message("orders").with_key(k).bucket();
    let names: Vec<String> = (0..10_000).map(|n| format!("key-{n}")).collect();
    let shared = bucket_of(&names[0]);
    let mut chosen: Vec<&str> = names
        .iter()
        .filter(|k| bucket_of(k) == shared)
        .take(3)
        .map(String::as_str)
        .collect();
    chosen.push(names.iter().find(|k| bucket_of(k) != shared).unwrap());
    let messages: Vec<OutboxMessage> = (0..12)
        .map(|i| {
            writer
                .message("orders")
                .with_key(chosen[i % 4])
                .with_value(format!("v{i}"))
                .with_header(Header::new("n", i.to_string()))
        })
        .collect();
    let first = writer.enqueue(&messages).await.unwrap();
    let second = writer
        .enqueue(
            &messages[..3]
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    m.message_id = uuid::Uuid::new_v4();
                    m
                })
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert_eq!(first.len(), 12);
    let mut per_bucket: HashMap<u32, Vec<u64>> = HashMap::new();
    for (m, r) in messages.iter().zip(&first) {
        assert_eq!(r.message_id, m.message_id);
        assert_eq!(r.bucket, m.bucket());
        per_bucket.entry(r.bucket).or_default().push(r.sequence);
    }
    for seqs in per_bucket.values() {
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "consecutive in list order: {seqs:?}"
        );
    }
    assert_eq!(per_bucket.len(), 2, "{per_bucket:?}");
    assert_eq!(per_bucket[&shared].len(), 9, "three keys share a bucket");
    // Each bucket's later enqueue continues after the earlier one.
    for r in &second {
        let max_first = first
            .iter()
            .filter(|f| f.bucket == r.bucket)
            .map(|f| f.sequence)
            .max()
            .unwrap_or(0);
        assert!(r.sequence > max_first);
    }
    // The items in the table read back as the messages, in order, with the counter at the last number.
    for (&bucket, seqs) in &per_bucket {
        let items = query_partition(&client, &options.table_name, &keys.message_pk(bucket)).await;
        let stored: Vec<_> = items
            .iter()
            .map(|i| schema::parse_message(&keys, i).unwrap())
            .collect();
        let bodies: Vec<_> = stored.iter().map(|s| s.sequence).collect();
        assert!(bodies.starts_with(seqs));
        // In sequence order the bucket holds the messages in list order, keys interleaved.
        let listed: Vec<uuid::Uuid> = messages
            .iter()
            .filter(|m| m.bucket() == bucket)
            .map(|m| m.message_id)
            .collect();
        let in_order: Vec<uuid::Uuid> = stored[..seqs.len()]
            .iter()
            .map(|s| s.message.message_id)
            .collect();
        assert_eq!(in_order, listed, "bucket {bucket}");
        for s in &stored[..seqs.len()] {
            let original = messages
                .iter()
                .find(|m| m.message_id == s.message.message_id)
                .unwrap();
            assert_eq!(&s.message, original);
        }
        let counter =
            query_partition(&client, &options.table_name, &keys.sequence_pk(bucket)).await;
        let last: u64 = schema::get_n(&counter[0], attr::SEQUENCE).unwrap();
        assert_eq!(
            last,
            *stored.iter().map(|s| s.sequence).max().as_ref().unwrap()
        );
    }
}

fn business_put(table: &str, id: &str, guarded: bool) -> TransactWriteItem {
    let mut put = Put::builder()
        .table_name(table)
        .item("PK", AttributeValue::S(format!("ORDER#{id}")))
        .item("SK", AttributeValue::S("ORDER".into()))
        .item("Status", AttributeValue::S("placed".into()));
    if guarded {
        put = put.condition_expression("attribute_not_exists(PK)");
    }
    TransactWriteItem::builder()
        .put(put.build().unwrap())
        .build()
}

#[tokio::test]
async fn message_commits_with_the_business_write_or_not_at_all() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let keys = Keys::new(&options);
    // The business transactions go through a client that counts DynamoDB's refusals.
    let (business, wire) = counted_client().await;

    let placed = writer
        .message("orders")
        .with_key("order-1")
        .with_value("placed");
    let outbox_item = writer.transact_write_item(&placed).await.unwrap();
    business
        .transact_write_items()
        .transact_items(business_put(&options.table_name, "order-1", true))
        .transact_items(outbox_item)
        .send()
        .await
        .unwrap();
    assert_eq!(wire.refused_total(), 0, "{:?}", wire.refusals());
    let bucket = placed.bucket();
    let items = query_partition(&client, &options.table_name, &keys.message_pk(bucket)).await;
    assert_eq!(items.len(), 1);
    assert_eq!(
        schema::parse_message(&keys, &items[0]).unwrap().message,
        placed
    );

    // The same order again: the business condition fails, so no message is left behind.
    let again = writer
        .message("orders")
        .with_key("order-1")
        .with_value("placed twice");
    let outbox_item = writer.transact_write_item(&again).await.unwrap();
    let err = business
        .transact_write_items()
        .transact_items(business_put(&options.table_name, "order-1", true))
        .transact_items(outbox_item)
        .send()
        .await
        .map_err(transaction_error)
        .unwrap_err();
    match &err {
        Error::TransactionCanceled {
            reasons, retryable, ..
        } => {
            assert_eq!(reasons, &["ConditionalCheckFailed", "None"]);
            assert!(!retryable);
        }
        other => panic!("unexpected {other}"),
    }
    // The SDK's error stays the source (its request id and messages for the logs).
    let source = std::error::Error::source(&err).expect("the SDK error as the source");
    assert!(
        dynamo_outbox::error::chain(&err).contains("TransactionCanceledException")
            || format!("{source:?}").contains("TransactionCanceledException"),
        "{source:?}"
    );
    // DynamoDB Local's cancellation, counted at the wire as one refused condition.
    assert_eq!(
        wire.refusals(),
        BTreeMap::from([(
            "TransactWriteItems".to_string(),
            Refusals {
                first_attempt: 1,
                retry: 0
            }
        )])
    );
    let items = query_partition(&client, &options.table_name, &keys.message_pk(bucket)).await;
    assert_eq!(items.len(), 1, "the failed transaction left no message");
    assert_eq!(
        schema::parse_message(&keys, &items[0])
            .unwrap()
            .message
            .message_id,
        placed.message_id
    );
}

/// The request counter tells DynamoDB Local's refused conditions from its other answers,
/// for each single-item write, from the deserialized error of the attempt.
#[tokio::test]
async fn refused_conditions_are_counted_at_the_wire() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 1).await;
    let (counted, wire) = counted_client().await;
    let table = options.table_name.as_str();
    let key = |id: &str| {
        HashMap::from([
            ("PK".to_string(), AttributeValue::S(format!("TEST#{id}"))),
            ("SK".to_string(), AttributeValue::S("ITEM".into())),
        ])
    };
    let put = || {
        counted
            .put_item()
            .table_name(table)
            .set_item(Some(key("a")))
            .condition_expression("attribute_not_exists(PK)")
    };
    put().send().await.expect("the first put applies");
    let e = put().send().await.expect_err("the second put is refused");
    assert!(e
        .into_service_error()
        .is_conditional_check_failed_exception());
    let e = counted
        .update_item()
        .table_name(table)
        .set_key(Some(key("a")))
        .update_expression("SET #v = :v")
        .condition_expression("#v = :old")
        .expression_attribute_names("#v", "Version")
        .expression_attribute_values(":v", AttributeValue::N("2".into()))
        .expression_attribute_values(":old", AttributeValue::N("1".into()))
        .send()
        .await
        .expect_err("no version 1");
    assert!(e
        .into_service_error()
        .is_conditional_check_failed_exception());
    let e = counted
        .delete_item()
        .table_name(table)
        .set_key(Some(key("missing")))
        .condition_expression("attribute_exists(PK)")
        .send()
        .await
        .expect_err("nothing to delete");
    assert!(e
        .into_service_error()
        .is_conditional_check_failed_exception());
    // Another client error (a malformed expression) is not a refused condition.
    counted
        .update_item()
        .table_name(table)
        .set_key(Some(key("a")))
        .update_expression("SET")
        .send()
        .await
        .expect_err("malformed");
    counted
        .delete_item()
        .table_name(table)
        .set_key(Some(key("a")))
        .condition_expression("attribute_exists(PK)")
        .send()
        .await
        .expect("the conditional delete applies");
    let once = Refusals {
        first_attempt: 1,
        retry: 0,
    };
    assert_eq!(
        wire.refusals(),
        BTreeMap::from([
            ("DeleteItem".to_string(), once),
            ("PutItem".to_string(), once),
            ("UpdateItem".to_string(), once),
        ])
    );
    assert_eq!(
        wire.get("UpdateItem").client_error,
        2,
        "{:?}",
        wire.snapshot()
    );
}

#[tokio::test]
async fn a_retried_request_with_the_same_token_is_one_write() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 8).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let messages: Vec<_> = (0..5)
        .map(|i| writer.message("t").with_key(format!("k{i}")))
        .collect();
    let items = writer.transact_write_items(&messages).await.unwrap();
    let token = uuid::Uuid::new_v4().to_string();
    for _ in 0..2 {
        // What the SDK does when the first attempt was applied but its response was lost.
        client
            .transact_write_items()
            .set_transact_items(Some(items.clone()))
            .client_request_token(&token)
            .send()
            .await
            .unwrap();
    }
    let counters = 5.min(
        messages
            .iter()
            .map(|m| m.bucket())
            .collect::<std::collections::HashSet<_>>()
            .len(),
    );
    assert_eq!(
        count_items(&client, &options.table_name).await,
        5 + counters
    );
}

#[tokio::test]
async fn limits_fail_before_any_request() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 8).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();

    let too_big = writer
        .message("t")
        .with_key("k")
        .with_value(vec![0u8; 400 * 1024]);
    let err = writer.enqueue(&[too_big]).await.unwrap_err();
    assert!(matches!(&err, Error::Limit { limit: 409_600, .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("messages[0]: item size in bytes"),
        "{err}"
    );

    let many: Vec<_> = (0..101).map(|_| writer.message("t")).collect();
    let err = writer.enqueue(&many).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "items in one transaction: 101 exceeds the limit of 100"
    );

    let wrong_count = OutboxMessage::new("t", 16).with_key("k");
    let err = writer.transact_write_item(&wrong_count).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("messages[0].bucket_count: is 16, but the writer's bucket count is 8"),
        "{err}"
    );

    let bad_topic = writer.message("no spaces allowed");
    let err = writer
        .enqueue(&[writer.message("ok"), bad_topic])
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("messages[1].topic:"), "{err}");

    // 20 messages of 250 KB each are under the item limit but over the 4 MB transaction limit.
    let heavy: Vec<_> = (0..20)
        .map(|i| {
            writer
                .message("t")
                .with_key(format!("k{i}"))
                .with_value(vec![1u8; 250 * 1024])
        })
        .collect();
    let err = writer.enqueue(&heavy).await.unwrap_err();
    assert!(
        err.to_string().starts_with("bytes in one transaction:"),
        "{err}"
    );

    assert_eq!(
        count_items(&client, &options.table_name).await,
        0,
        "nothing was written, not even a reservation"
    );
}

#[tokio::test]
async fn one_message_is_one_conditional_put_and_a_retried_applied_put_is_one_write() {
    let (client, counter) = counted_client().await;
    let options = fresh_table(&client, 4).await;
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let m = writer.message("orders").with_key("k").with_value("v");
    let done = writer.enqueue(std::slice::from_ref(&m)).await.unwrap();
    assert_eq!(done.len(), 1);
    // The reservation and one PutItem; no transaction.
    let attempts = counter.snapshot();
    assert!(!attempts.contains_key("TransactWriteItems"), "{attempts:?}");
    assert_eq!(counter.get("PutItem").total(), 1, "{attempts:?}");
    assert_eq!(counter.get("UpdateItem").total(), 1, "{attempts:?}");
    let items = query_partition(
        &client,
        &options.table_name,
        &dynamo_outbox::protocol::schema::Keys::new(&options).message_pk(m.bucket()),
    )
    .await;
    assert_eq!(items.len(), 1);
    assert_eq!(
        schema::get_s(&items[0], attr::MESSAGE_ID),
        Some(m.message_id.to_string().as_str())
    );

    // The first answer is lost after DynamoDB applied the put: the SDK retries, DynamoDB
    // refuses the retry (the item exists), and the writer recognises its own message in
    // the refusal's old item: one success, one copy.
    let wire = dynamo_outbox::accounting::RequestCounter::default();
    let lossy = Client::from_conf(
        dynamodb_builder()
            .await
            .interceptor(Fault::on("PutItem").times(1).lose_answer())
            .interceptor(wire.clone())
            .build(),
    );
    let writer = DynamoDbOutboxWriter::new(lossy, options.clone()).unwrap();
    let m2 = writer.message("orders").with_key("k").with_value("v2");
    let done = writer.enqueue(std::slice::from_ref(&m2)).await.unwrap();
    assert_eq!(done[0].message_id, m2.message_id);
    assert_eq!(wire.get("PutItem").total(), 2, "{:?}", wire.snapshot());
    assert_eq!(wire.refused("PutItem").total(), 1, "{:?}", wire.refusals());
    let items = query_partition(
        &client,
        &options.table_name,
        &dynamo_outbox::protocol::schema::Keys::new(&options).message_pk(m2.bucket()),
    )
    .await;
    let copies = items
        .iter()
        .filter(|i| schema::get_s(i, attr::MESSAGE_ID) == Some(m2.message_id.to_string().as_str()))
        .count();
    assert_eq!(copies, 1);

    // A counter set back (a restored backup, a hand edit): the next number is taken by
    // another message. The put is refused and reported, never a success, and the pending
    // message is not overwritten.
    let keys = Keys::new(&options);
    client
        .update_item()
        .table_name(&options.table_name)
        .set_key(Some(
            keys.key(keys.sequence_pk(m2.bucket()), schema::SEQUENCE_SK.into()),
        ))
        .update_expression("SET #seq = :n")
        .expression_attribute_names("#seq", attr::SEQUENCE)
        .expression_attribute_values(":n", schema::n(done[0].sequence - 1))
        .send()
        .await
        .unwrap();
    let plain = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let taken = plain.message("orders").with_key("k").with_value("v3");
    let e = plain
        .enqueue(std::slice::from_ref(&taken))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ConditionFailed { .. }), "{e:?}");
    let items = query_partition(
        &client,
        &options.table_name,
        &dynamo_outbox::protocol::schema::Keys::new(&options).message_pk(m2.bucket()),
    )
    .await;
    let ids: Vec<_> = items
        .iter()
        .filter_map(|i| schema::get_s(i, attr::MESSAGE_ID))
        .collect();
    assert!(ids.contains(&m2.message_id.to_string().as_str()), "{ids:?}");
    assert!(
        !ids.contains(&taken.message_id.to_string().as_str()),
        "{ids:?}"
    );
}

/// Loses the answer of the first `TransactWriteItems` that applied (turns it into a 500,
/// which the SDK retries) and records every attempt.
fn lose_first_transaction_answer() -> Fault {
    Fault::on("TransactWriteItems")
        .times(1)
        .recording()
        .lose_answer()
}

/// The `ClientRequestToken` of every transaction `fault` recorded.
fn tokens(fault: &Fault) -> Vec<Option<String>> {
    fault
        .sent()
        .iter()
        .map(|body| body["ClientRequestToken"].as_str().map(str::to_owned))
        .collect()
}

/// `enqueue` sends a `ClientRequestToken`, so the SDK's retry of a transaction whose first
/// attempt applied (its answer lost) is the same request: DynamoDB answers it as a success
/// and writes nothing twice. The caller sees one successful enqueue, and every message is
/// in the table once.
#[tokio::test]
async fn an_enqueue_whose_answer_was_lost_is_retried_with_its_token_and_written_once() {
    let plain = dynamodb().await;
    let options = fresh_table(&plain, 1).await;
    let losing = lose_first_transaction_answer();
    let client = faulty_dynamodb(&losing).await;
    let writer = DynamoDbOutboxWriter::new(client, options.clone()).unwrap();
    let messages: Vec<_> = (0..3)
        .map(|i| writer.message("t").with_key(format!("k{i}")))
        .collect();
    let enqueued = writer.enqueue(&messages).await.unwrap();
    assert_eq!(enqueued.len(), 3);

    let tokens = tokens(&losing);
    assert_eq!(
        tokens.len(),
        2,
        "the first attempt and the SDK's retry: {tokens:?}"
    );
    assert!(tokens[0].is_some(), "no ClientRequestToken: {tokens:?}");
    assert_eq!(tokens[0], tokens[1], "the retry is the same request");
    let keys = Keys::new(&options);
    let items = query_partition(&plain, &options.table_name, &keys.message_pk(0)).await;
    let mut stored: Vec<uuid::Uuid> = items
        .iter()
        .map(|i| schema::parse_message(&keys, i).unwrap().message.message_id)
        .collect();
    stored.sort();
    let mut sent: Vec<uuid::Uuid> = messages.iter().map(|m| m.message_id).collect();
    sent.sort();
    assert_eq!(stored, sent, "every message once");
}

/// The enqueue service's idempotent path (the enqueue function's and `outboxctl
/// enqueue`'s) sends a `ClientRequestToken` too: the SDK's retry of its applied
/// transaction is the same request, a success that is not mistaken for a replay of an
/// earlier call (which would skip the commit notification), with each message and the
/// marker written once.
#[tokio::test]
async fn an_idempotent_enqueue_whose_answer_was_lost_is_retried_with_its_token() {
    let plain = dynamodb().await;
    let options = fresh_table(&plain, 1).await;
    let losing = lose_first_transaction_answer();
    let client = faulty_dynamodb(&losing).await;
    let service = dynamo_outbox::enqueue::EnqueueService::new(client, options.clone()).unwrap();
    let request = serde_json::json!({
        "messages": [
            {"topic": "t", "key": "k", "value": "one"},
            {"topic": "t", "key": "k", "value": "two"}
        ],
        "idempotency_key": "order-1-placed"
    });
    let outcome = service.enqueue_json(&request, None).await.unwrap();
    assert!(!outcome.replayed, "{outcome:?}");
    assert_eq!(outcome.response.messages.len(), 2);
    let tokens = tokens(&losing);
    assert_eq!(
        tokens.len(),
        2,
        "the first attempt and the SDK's retry: {tokens:?}"
    );
    assert!(tokens[0].is_some(), "no ClientRequestToken: {tokens:?}");
    assert_eq!(tokens[0], tokens[1]);
    let keys = Keys::new(&options);
    let items = query_partition(&plain, &options.table_name, &keys.message_pk(0)).await;
    assert_eq!(items.len(), 2, "each message once");
    // A later call with the key is the replay, and answers the first call's response.
    let again = service.enqueue_json(&request, None).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.response, outcome.response);
}
