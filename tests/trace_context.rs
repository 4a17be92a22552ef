//! Trace context through the outbox, end to end on the local stack: a message written
//! inside a traced business transaction (an OpenTelemetry context set in the test, the
//! library built with its `otel` feature) reaches Kafka with a `traceparent` naming that
//! trace, read back by the independent client; a message with its own `traceparent` keeps
//! it; a message written outside any trace carries no trace header. Run through
//! scripts/stack.sh; never skipped.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Header, Relay};
use opentelemetry::trace::{
    FutureExt as _, SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use opentelemetry::Context;
use outbox_testkit::*;
use tokio::time::Instant;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_ID: &str = "00f067aa0ba902b7";

/// The context of the business transaction: a sampled span of a known trace, with a
/// vendor's tracestate.
fn business_context() -> Context {
    let span = SpanContext::new(
        TraceId::from_hex(TRACE_ID).unwrap(),
        SpanId::from_hex(SPAN_ID).unwrap(),
        TraceFlags::SAMPLED,
        false,
        TraceState::from_key_value([("rojo", "00f067aa0ba902b7")]).unwrap(),
    );
    Context::new().with_remote_span_context(span)
}

fn header<'a>(headers: &'a [(String, Option<Vec<u8>>)], key: &str) -> Vec<&'a [u8]> {
    headers
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_deref().expect("a trace header has a value"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writers_trace_reaches_kafka_byte_for_byte() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("traced");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();

    // A business write and its message in one transaction, inside the traced span.
    let traced = writer
        .message(topic.as_str())
        .with_key("order-1")
        .with_value("{}")
        .with_header(Header::new("type", "OrderPlaced"));
    let own_parent = "00-11111111111111111111111111111111-2222222222222222-00";
    let own = writer
        .message(topic.as_str())
        .with_key("order-2")
        .with_header(Header::new("traceparent", own_parent));
    let business = async {
        // The business item (in the outbox's table, for brevity) and the messages' Puts.
        let order = Put::builder()
            .table_name(&options.table_name)
            .item("PK", AttributeValue::S(random_name("ORDER#")))
            .item("SK", AttributeValue::S("ORDER".into()))
            .build()
            .unwrap();
        let mut items = vec![TransactWriteItem::builder().put(order).build()];
        items.extend(
            writer
                .transact_write_items(&[traced.clone(), own.clone()])
                .await
                .unwrap(),
        );
        client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await
            .unwrap();
    };
    business.with_context(business_context()).await;
    // Outside any trace: no trace header.
    let untraced = writer.message(topic.as_str()).with_key("order-3");
    writer
        .enqueue(std::slice::from_ref(&untraced))
        .await
        .unwrap();

    let mut relay_options = fast_relay_options("traced", 2);
    relay_options.idle_stop = Some(Duration::from_secs(1));
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let relay = Relay::new(store, Arc::clone(&kafka_publisher().await), relay_options).unwrap();
    let report = relay
        .run_until(Instant::now() + Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(report.published, 3, "{report:?}");

    let written: BTreeSet<String> = id_set([&traced, &own, &untraced]);
    wait_for_ids(&topic, &written, Duration::from_secs(10)).await;
    let records = read_topic(&topic);
    let by_id = |id: uuid::Uuid| {
        records
            .iter()
            .find(|r| r.message_id().as_deref() == Some(id.to_string().as_str()))
            .unwrap_or_else(|| panic!("{id} in {records:?}"))
            .header_list()
    };

    let headers = by_id(traced.message_id);
    assert_eq!(
        header(&headers, "traceparent"),
        vec![format!("00-{TRACE_ID}-{SPAN_ID}-01").as_bytes()],
        "the business span's trace, in W3C form: {headers:?}"
    );
    assert_eq!(
        header(&headers, "tracestate"),
        vec![&b"rojo=00f067aa0ba902b7"[..]]
    );
    assert_eq!(
        headers[0],
        ("type".to_string(), Some(b"OrderPlaced".to_vec())),
        "the message's own headers come first, in order"
    );

    let headers = by_id(own.message_id);
    assert_eq!(
        header(&headers, "traceparent"),
        vec![own_parent.as_bytes()],
        "a message's own traceparent is kept: {headers:?}"
    );
    assert!(header(&headers, "tracestate").is_empty(), "{headers:?}");

    let headers = by_id(untraced.message_id);
    assert!(
        header(&headers, "traceparent").is_empty() && header(&headers, "tracestate").is_empty(),
        "a message written outside any trace has no trace header: {headers:?}"
    );
}
