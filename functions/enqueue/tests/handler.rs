//! The enqueue handler, called directly with a `LambdaEvent` whose context carries a real
//! deadline, against DynamoDB Local (run through scripts/stack.sh; never skipped).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use dynamo_outbox::protocol::schema;
use lambda_runtime::LambdaEvent;
use outbox_enqueue_function::EnqueueFunction;
use outbox_testkit::*;
use serde_json::{json, Value};

fn event(payload: Value, time_left: Duration) -> LambdaEvent<Value> {
    outbox_testkit::lambda::invocation_in("outbox-enqueue-test", payload, time_left)
}

#[tokio::test]
async fn enqueues_a_batch_and_answers_with_ids_buckets_and_sequences() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let function = EnqueueFunction::new(client.clone(), options.clone()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let request = json!({
        "messages": [
            {"topic": "orders", "key": "order-1", "value": "{\"n\":1}",
             "headers": [{"key": "type", "value": "created"}, {"key": "trace", "value": null}]},
            {"topic": "orders", "key": "order-1", "value_base64": b64.encode([0u8, 159, 146, 150])},
            {"topic": "audit", "key_base64": b64.encode(b""), "partition": 2},
            {"topic": "audit"}
        ]
    });
    let response = function
        .handle(event(request, Duration::from_secs(10)))
        .await
        .expect("enqueue");
    let response = serde_json::to_value(&response).unwrap();
    let messages = response["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    for m in messages {
        uuid::Uuid::parse_str(m["message_id"].as_str().unwrap()).unwrap();
        assert!(m["bucket"].as_u64().unwrap() < 4);
        assert!(m["sequence"].as_u64().unwrap() >= 1);
    }
    // Same key, same bucket, consecutive sequences in request order.
    assert_eq!(messages[0]["bucket"], messages[1]["bucket"]);
    assert_eq!(
        messages[1]["sequence"].as_u64().unwrap(),
        messages[0]["sequence"].as_u64().unwrap() + 1
    );
    assert_eq!(
        messages[2]["bucket"], 2,
        "explicit partition 2 of 4 buckets"
    );
    assert_eq!(pending_messages(&client, &options).await, 4);

    // The stored items read back as the request said.
    let store = dynamo_outbox::DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let keys = store.keys().clone();
    let items = scan_all(&client, &options.table_name).await;
    let stored: Vec<dynamo_outbox::message::StoredMessage> = items
        .iter()
        .filter(|i| {
            i["PK"]
                .as_s()
                .is_ok_and(|pk| keys.message_bucket(pk).is_some())
        })
        .map(|i| schema::parse_message(&keys, i).unwrap())
        .collect();
    let first = stored
        .iter()
        .find(|s| s.message.message_id.to_string() == messages[0]["message_id"].as_str().unwrap())
        .unwrap();
    assert_eq!(first.message.key.as_deref(), Some(&b"order-1"[..]));
    assert_eq!(first.message.value.as_deref(), Some(&b"{\"n\":1}"[..]));
    assert_eq!(
        first.message.headers,
        vec![
            dynamo_outbox::Header::new("type", "created"),
            dynamo_outbox::Header::null("trace")
        ]
    );
}

#[tokio::test]
async fn a_rejected_request_is_a_validation_error_and_writes_nothing() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let function = EnqueueFunction::new(client.clone(), options.clone()).unwrap();
    let ok = json!({"topic": "orders", "key": "k", "value": "v"});
    let big = "x".repeat(401 * 1024);
    let cases = [
        (
            json!({"messages": [ok, ok, ok, {"topic": "bad topic"}]}),
            "messages[3].topic: ",
        ),
        (json!({"messages": []}), "messages: "),
        (
            json!({"messages": [ok, {"topic": "t", "value": "a", "value_base64": "YQ=="}]}),
            "messages[1].value: ",
        ),
        (
            json!({"messages": [ok, {"topic": "t", "headers": [{"key": ""}]}]}),
            "messages[1].headers[0].key: ",
        ),
        (
            json!({"messages": [ok, {"topic": "t", "partition": -1}]}),
            "messages[1].partition: ",
        ),
        (
            json!({"messages": [ok], "priority": 1}),
            "priority: unknown field",
        ),
        (
            json!({"messages": [ok, {"topic": "t", "value": big}]}),
            "messages[1]: item size in bytes",
        ),
    ];
    let before = scan_all(&client, &options.table_name).await.len();
    for (request, field) in cases {
        let e = function
            .handle(event(request, Duration::from_secs(10)))
            .await
            .expect_err("a rejected request");
        assert_eq!(e.error_type, "ValidationError", "{e}");
        assert!(
            e.message.starts_with(field),
            "{e} does not start with {field:?}"
        );
        let diagnostic = lambda_runtime::Diagnostic::from(e);
        assert_eq!(diagnostic.error_type, "ValidationError");
    }
    assert_eq!(
        scan_all(&client, &options.table_name).await.len(),
        before,
        "no item (not even a sequence counter) was written"
    );
}

#[tokio::test]
async fn a_retried_call_with_the_same_idempotency_key_returns_the_first_result() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    // Long enough that the calls inside the window finish inside it on a loaded machine;
    // each of them checks that it did, so a slow machine cannot turn a late retry into a
    // false "the window works".
    let retention = Duration::from_secs(8);
    let function = EnqueueFunction::new(client.clone(), options.clone())
        .unwrap()
        .with_idempotency_retention(retention);
    let request = json!({
        "messages": [{"topic": "orders", "key": "k", "value": "v1"},
                     {"topic": "orders", "key": "j", "value": "v2"}],
        "idempotency_key": "order-42/create"
    });
    let first_call = std::time::Instant::now();
    let first = function
        .handle(event(request.clone(), Duration::from_secs(10)))
        .await
        .expect("first call");
    // The marker's window starts when the first call writes it, somewhere inside the call.
    let first_done = std::time::Instant::now();
    assert_eq!(pending_messages(&client, &options).await, 2);
    let marker_pk =
        dynamo_outbox::protocol::schema::Keys::new(&options).idempotency_pk("order-42/create");
    let marker = scan_all(&client, &options.table_name)
        .await
        .into_iter()
        .find(|i| i["PK"].as_s().is_ok_and(|pk| *pk == marker_pk))
        .expect("the marker item");
    assert_eq!(marker["SK"].as_s().unwrap(), "IDEMPOTENCY");
    // Its expiry twice: in ticks (what the reference implementation reads) and in epoch
    // seconds (what the table's time to live reads), the same instant, rounded up.
    let number = |name: &str| -> i64 {
        marker[name]
            .as_n()
            .unwrap_or_else(|_| panic!("{name} is a number: {marker:?}"))
            .parse()
            .unwrap()
    };
    let expires_ticks = number("IdempotencyExpiresAtUtc");
    let ttl = number("TimeToLive");
    let ticks_per_second = dynamo_outbox::protocol::clock::TICKS_PER_SECOND;
    let epoch_ticks = expires_ticks - dynamo_outbox::protocol::clock::UNIX_EPOCH_TICKS;
    assert_eq!(
        ttl,
        (epoch_ticks + ticks_per_second - 1) / ticks_per_second,
        "{marker:?}"
    );
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let retention_s = retention.as_secs() as i64;
    assert!(
        (now_s - 60 + retention_s..=now_s + 1 + retention_s).contains(&ttl),
        "TimeToLive {ttl}: not the retention ({retention_s} s) after now ({now_s})"
    );

    // A retry (even with another body) inside the window: same answer, nothing new.
    let mut other = request.clone();
    other["messages"][0]["value"] = json!("changed");
    for retry in [request.clone(), other] {
        let again = function
            .handle(event(retry, Duration::from_secs(10)))
            .await
            .expect("retried call");
        assert!(
            first_call.elapsed() < retention,
            "the retry came {:?} after the first call, outside the window under test",
            first_call.elapsed()
        );
        assert_eq!(again, first);
        assert_eq!(pending_messages(&client, &options).await, 2);
    }

    // Another key is another call.
    let mut fresh = request.clone();
    fresh["idempotency_key"] = json!("order-43/create");
    let third = function
        .handle(event(fresh, Duration::from_secs(10)))
        .await
        .unwrap();
    assert_ne!(third, first);
    assert_eq!(pending_messages(&client, &options).await, 4);

    // After the retention window (counted from the end of the first call, which wrote the
    // marker before it returned) the key writes again.
    tokio::time::sleep(
        (retention + Duration::from_millis(100)).saturating_sub(first_done.elapsed()),
    )
    .await;
    let later = function
        .handle(event(request, Duration::from_secs(10)))
        .await
        .unwrap();
    assert_ne!(later, first);
    assert_eq!(pending_messages(&client, &options).await, 6);
}

/// The function as `sam deploy` configures it, with `OUTBOX_NOTIFY_EVENT_BUS` set.
async fn function_with_bus(options: &dynamo_outbox::OutboxOptions, bus: &str) -> EnqueueFunction {
    stack_var("AWS_ENDPOINT_URL_EVENTBRIDGE");
    let vars: HashMap<&str, String> = HashMap::from([
        ("OUTBOX_TABLE_NAME", options.table_name.clone()),
        ("OUTBOX_BUCKET_COUNT", options.bucket_count.to_string()),
        ("OUTBOX_NOTIFY_EVENT_BUS", bus.to_owned()),
    ]);
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    EnqueueFunction::from_lookup(&config, |n| vars.get(n).cloned()).unwrap()
}

#[tokio::test]
async fn a_commit_sends_one_notification_naming_the_table_and_buckets() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 8).await;
    let bus = random_name("bus");
    let queue = watch_notifications(&bus);
    let function = function_with_bus(&options, &bus).await;
    let request = json!({
        "messages": [
            {"topic": "orders", "key": "a", "value": "1"},
            {"topic": "orders", "key": "b", "value": "2"},
            {"topic": "orders", "key": "a", "value": "3"},
            {"topic": "orders", "partition": 6}
        ],
        "idempotency_key": random_name("once"),
    });
    let response = function
        .handle(event(request.clone(), Duration::from_secs(10)))
        .await
        .expect("enqueue");
    let mut buckets: Vec<u64> = response.messages.iter().map(|m| m.bucket as u64).collect();
    buckets.sort_unstable();
    buckets.dedup();

    let events = received_notifications(&queue, 5);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["source"], "dynamo-outbox");
    assert_eq!(e["detail-type"], "OutboxCommitted");
    assert_eq!(
        e["detail"],
        json!({
            "table": options.table_name,
            "key_prefix": options.key_prefix,
            "bucket_count": 8,
            "buckets": buckets,
        })
    );
    // The relay reads the event as EventBridge delivers it.
    let n = dynamo_outbox::notification::CommitNotification::from_event(e)
        .unwrap()
        .expect("a commit notification");
    assert_eq!(n.mismatch(&options), None);

    // A replay of the idempotent call wrote nothing and sends nothing; neither does a
    // rejected request.
    let replay = function
        .handle(event(request, Duration::from_secs(10)))
        .await
        .expect("replay");
    assert_eq!(replay, response);
    let rejected = function
        .handle(event(
            json!({"messages": [{"topic": "bad topic"}]}),
            Duration::from_secs(10),
        ))
        .await
        .expect_err("invalid topic");
    assert_eq!(rejected.error_type, "ValidationError");
    assert_eq!(received_notifications(&queue, 1), Vec::<Value>::new());
    assert_eq!(pending_messages(&client, &options).await, 4);
    let notifier = function
        .notifier()
        .expect("configured from OUTBOX_NOTIFY_EVENT_BUS");
    assert_eq!((notifier.sent(), notifier.failed()), (1, 0));
}

#[tokio::test]
async fn a_failed_notification_never_fails_the_committed_write() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    // No such bus: EventBridge refuses the event.
    let function = function_with_bus(&options, &random_name("no-such-bus")).await;
    let started = std::time::Instant::now();
    let response = function
        .handle(event(
            json!({"messages": [{"topic": "orders", "key": "k", "value": "v"}]}),
            Duration::from_secs(10),
        ))
        .await
        .expect("the write succeeds without its notification");
    assert_eq!(response.messages.len(), 1);
    assert_eq!(pending_messages(&client, &options).await, 1);
    // The notification was attempted and failed.
    let notifier = function.notifier().expect("configured");
    assert_eq!((notifier.sent(), notifier.failed()), (0, 1));
    // EventBridge refuses a missing bus at once, so the failure costs the call little.
    // (The bound itself: a_hanging_event_bus_costs_the_call_the_notification_bound_and_no_more.)
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// An "EventBridge" that accepts connections and never answers: the notification's own
/// bound (`NOTIFY_TIMEOUT`, 2 s) is what ends the call's wait for it.
#[tokio::test]
async fn a_hanging_event_bus_costs_the_call_the_notification_bound_and_no_more() {
    use dynamo_outbox::notification::{EventBridgeNotifier, NOTIFY_TIMEOUT};
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hang = {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(socket); // read nothing, answer nothing, close nothing
            }
        })
    };
    /// No service-specific settings: the stack's AWS_ENDPOINT_URL_EVENTBRIDGE (moto) would
    /// win over the endpoint below.
    #[derive(Debug)]
    struct NoServiceConfig;
    impl aws_types::service_config::LoadServiceConfig for NoServiceConfig {
        fn load_config(
            &self,
            _: aws_types::service_config::ServiceConfigKey<'_>,
        ) -> Option<String> {
            None
        }
    }
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest())
        .await
        .to_builder()
        .endpoint_url(format!("http://{address}"))
        .service_config(NoServiceConfig)
        .build();
    let function = EnqueueFunction::new(client.clone(), options.clone())
        .unwrap()
        .with_notifier(EventBridgeNotifier::new(&config, "hanging-bus"));
    let started = std::time::Instant::now();
    let response = function
        .handle(event(
            json!({"messages": [{"topic": "orders", "key": "k", "value": "v"}]}),
            Duration::from_secs(20),
        ))
        .await
        .expect("the write succeeds without its notification");
    let took = started.elapsed();
    hang.abort();
    assert_eq!(response.messages.len(), 1);
    assert_eq!(pending_messages(&client, &options).await, 1);
    let notifier = function.notifier().expect("configured");
    assert_eq!((notifier.sent(), notifier.failed()), (0, 1));
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the notification never reached the hanging endpoint"
    );
    // The call waited for the notification (an attempt is bounded by half the bound, and
    // the SDK retries once within it) and gave up at the bound, 2 s, far from the 20 s
    // deadline: not before it (less the SDK's timer granularity), and not much after it
    // (the write itself, and a loaded machine's late timer).
    println!("the call took {took:?} with a hanging event bus (bound {NOTIFY_TIMEOUT:?})");
    assert!(
        took >= NOTIFY_TIMEOUT - Duration::from_millis(100),
        "took {took:?}: gave up before the bound"
    );
    assert!(
        took < NOTIFY_TIMEOUT + Duration::from_secs(1),
        "took {took:?}: waited past the bound"
    );
}

/// The function as `sam deploy` configures it, with `OUTBOX_ALLOWED_TOPICS` set.
async fn function_with_allowed_topics(
    options: &dynamo_outbox::OutboxOptions,
    allowed: &str,
) -> dynamo_outbox::Result<EnqueueFunction> {
    let vars: HashMap<&str, String> = HashMap::from([
        ("OUTBOX_TABLE_NAME", options.table_name.clone()),
        ("OUTBOX_BUCKET_COUNT", options.bucket_count.to_string()),
        ("OUTBOX_ALLOWED_TOPICS", allowed.to_owned()),
    ]);
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    EnqueueFunction::from_lookup(&config, |n| vars.get(n).cloned())
}

/// Every item of the table, in key order, for an item-for-item comparison.
async fn table_items(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    let mut items = scan_all(client, table).await;
    let key = |i: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
        (
            i["PK"].as_s().cloned().unwrap_or_default(),
            i["SK"].as_s().cloned().unwrap_or_default(),
        )
    };
    items.sort_by_key(key);
    items
}

#[tokio::test]
async fn a_topic_outside_the_allow_list_is_a_validation_error_and_leaves_the_table_unchanged() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let function = function_with_allowed_topics(&options, "orders, audit-*")
        .await
        .unwrap();
    // Something in the table already: a counter and a message of an allowed topic.
    function
        .handle(event(
            json!({"messages": [{"topic": "orders", "key": "o-1", "value": "{}"}]}),
            Duration::from_secs(10),
        ))
        .await
        .expect("an allowed topic");
    let before = table_items(&client, &options.table_name).await;
    assert_eq!(pending_messages(&client, &options).await, 1);

    let ok = json!({"topic": "orders", "key": "k", "value": "v"});
    let audit = json!({"topic": "audit-eu", "key": "k2", "value": "v"});
    for request in [
        json!({"messages": [ok, audit, ok, {"topic": "payments", "key": "p-1", "value": "{}"}]}),
        // The same with an idempotency key: no marker is written either.
        json!({"messages": [ok, audit, ok, {"topic": "payments"}], "idempotency_key": "k-1"}),
        // A prefix of an allowed name, and a name the pattern's prefix does not start.
        json!({"messages": [ok, audit, ok, {"topic": "order"}]}),
        json!({"messages": [ok, audit, ok, {"topic": "audit"}]}),
    ] {
        let e = function
            .handle(event(request.clone(), Duration::from_secs(10)))
            .await
            .expect_err("a topic outside the allow-list");
        assert_eq!(e.error_type, "ValidationError", "{e}");
        assert!(
            e.message.starts_with("messages[3].topic: topic ")
                && e.message
                    .contains("is not allowed here (OUTBOX_ALLOWED_TOPICS: orders,audit-*)"),
            "{request}: {e}"
        );
    }
    assert_eq!(
        table_items(&client, &options.table_name).await,
        before,
        "the table is item for item as it was (no message, no counter update, no marker)"
    );

    // The allowed topics still go through.
    let response = function
        .handle(event(
            json!({"messages": [ok, audit], "idempotency_key": "k-2"}),
            Duration::from_secs(10),
        ))
        .await
        .expect("allowed topics");
    assert_eq!(response.messages.len(), 2);
    assert_eq!(pending_messages(&client, &options).await, 3);

    // A bad list is a misconfiguration the function refuses to start with.
    for bad in ["orders,,audit-*", "au*dit", ""] {
        let e = function_with_allowed_topics(&options, bad)
            .await
            .expect_err("a bad list");
        assert_eq!(e.error_type(), "Misconfiguration", "{bad:?}: {e}");
        assert!(
            e.to_string().starts_with("OUTBOX_ALLOWED_TOPICS: "),
            "{bad:?}: {e}"
        );
    }
}

/// The stored headers of the message with id `id` (a response's `message_id`).
async fn stored_headers(
    client: &aws_sdk_dynamodb::Client,
    options: &dynamo_outbox::OutboxOptions,
    id: &Value,
) -> Vec<dynamo_outbox::Header> {
    let store = dynamo_outbox::DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let keys = store.keys().clone();
    scan_all(client, &options.table_name)
        .await
        .iter()
        .filter(|i| {
            i["PK"]
                .as_s()
                .is_ok_and(|pk| keys.message_bucket(pk).is_some())
        })
        .map(|i| schema::parse_message(&keys, i).unwrap())
        .find(|s| s.message.message_id.to_string() == id.as_str().unwrap())
        .expect("the enqueued message is in the table")
        .message
        .headers
}

#[tokio::test]
async fn the_callers_trace_context_is_stamped_from_the_request_or_the_xray_header() {
    use dynamo_outbox::Header;
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let function = EnqueueFunction::new(client.clone(), options.clone()).unwrap();
    let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let from_xray = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01";
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let own = "00-11111111111111111111111111111111-2222222222222222-00";
    let traced = |payload: Value| {
        let mut e = event(payload, Duration::from_secs(10));
        e.context.xray_trace_id = Some(xray.to_string());
        e
    };

    // The invocation's X-Ray header, in W3C form; a message's own traceparent is kept.
    let response = function
        .handle(traced(json!({"messages": [
            {"topic": "orders"},
            {"topic": "orders", "headers": [{"key": "traceparent", "value": own}]}
        ]})))
        .await
        .expect("enqueue");
    let ids = serde_json::to_value(&response).unwrap()["messages"].clone();
    assert_eq!(
        stored_headers(&client, &options, &ids[0]["message_id"]).await,
        vec![Header::new("traceparent", from_xray)]
    );
    assert_eq!(
        stored_headers(&client, &options, &ids[1]["message_id"]).await,
        vec![Header::new("traceparent", own)]
    );

    // The request's traceparent wins over the X-Ray header.
    let response = function
        .handle(traced(json!({"messages": [{"topic": "orders"}],
                               "traceparent": given, "tracestate": "rojo=1"})))
        .await
        .expect("enqueue");
    let ids = serde_json::to_value(&response).unwrap()["messages"].clone();
    assert_eq!(
        stored_headers(&client, &options, &ids[0]["message_id"]).await,
        vec![
            Header::new("traceparent", given),
            Header::new("tracestate", "rojo=1")
        ]
    );

    // A malformed traceparent is refused, naming the field and the rule, and writes nothing.
    let before = pending_messages(&client, &options).await;
    let e = function
        .handle(traced(json!({"messages": [{"topic": "orders"}],
                               "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"})))
        .await
        .unwrap_err();
    assert_eq!(e.error_type, "ValidationError");
    assert!(
        e.message
            .starts_with("traceparent: \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7\" is not a W3C traceparent: must be four fields"),
        "{}",
        e.message
    );
    assert_eq!(pending_messages(&client, &options).await, before);
}

/// Lambda retries an asynchronous invocation with the first attempt's request id. A call
/// without an `idempotency_key` is keyed by it: a retry of a call whose write committed
/// (then failed or timed out) answers with the first response and writes nothing again;
/// another invocation (another request id) writes anew.
#[tokio::test]
async fn a_retry_with_the_same_request_id_writes_nothing_again() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let function = EnqueueFunction::new(client.clone(), options.clone()).unwrap();
    let request = json!({"messages": [{"topic": "orders", "key": "k", "value": "v1"},
                                      {"topic": "orders", "key": "j", "value": "v2"}]});
    let attempt = |request_id: &str| {
        outbox_testkit::lambda::invocation(
            "outbox-enqueue-test",
            request_id,
            outbox_testkit::lambda::deadline_in(Duration::from_secs(10)),
            request.clone(),
        )
    };
    let first = function
        .handle(attempt("req-async-1"))
        .await
        .expect("first attempt");
    assert_eq!(pending_messages(&client, &options).await, 2);
    // Lambda's two retries of the same event
    for _ in 0..2 {
        let again = function
            .handle(attempt("req-async-1"))
            .await
            .expect("retry");
        assert_eq!(again, first);
        assert_eq!(pending_messages(&client, &options).await, 2);
    }
    // the marker is keyed by the request id
    let marker_pk = dynamo_outbox::protocol::schema::Keys::new(&options).idempotency_pk(
        &dynamo_outbox::enqueue::invocation_idempotency_key("req-async-1"),
    );
    assert!(scan_all(&client, &options.table_name)
        .await
        .iter()
        .any(|i| i["PK"].as_s().is_ok_and(|pk| *pk == marker_pk)));
    // another invocation is another call
    let other = function
        .handle(attempt("req-async-2"))
        .await
        .expect("another call");
    assert_ne!(other, first);
    assert_eq!(pending_messages(&client, &options).await, 4);

    // The marker takes the transaction's 100th item: 100 messages without a key are
    // refused before anything is written, naming the rule.
    let hundred: Vec<Value> = (0..100)
        .map(|i| json!({"topic": "orders", "value": format!("m{i}")}))
        .collect();
    let err = function
        .handle(event(
            json!({ "messages": hundred }),
            Duration::from_secs(10),
        ))
        .await
        .expect_err("100 messages and a marker exceed one transaction");
    assert_eq!(err.error_type, "ValidationError");
    assert!(
        err.message.starts_with(
            "messages: must hold at most 99 messages in a call of the enqueue function"
        ),
        "{}",
        err.message
    );
    assert_eq!(pending_messages(&client, &options).await, 4);
}
