//! The enqueue request and response as JSON: what the enqueue Lambda function and
//! `outboxctl enqueue` accept and print, parsed and validated in one place so that what
//! one accepts the other accepts. An error's `errorType` is [`Error::error_type`].
//!
//! ```json
//! {"messages": [{"topic": "orders", "key": "order-1", "value_base64": "eyJ9",
//!                "headers": [{"key": "type", "value": "created"}, {"key": "trace", "value": null}],
//!                "partition": 3}],
//!  "idempotency_key": "optional",
//!  "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
//!  "tracestate": "optional"}
//! ```
//!
//! - `messages`: 1 to 100 messages.
//! - `topic`: Kafka's topic name rules ([`validate_topic`](crate::message::validate_topic)).
//! - `key` / `key_base64`, `value` / `value_base64`: a UTF-8 string or standard base64
//!   (padded), never both; absent or `null` is a keyless record or a tombstone.
//! - `headers`: a list of `{"key", "value" | "value_base64"}`; the key is a non-empty string,
//!   a missing or `null` value is Kafka's null header value. A `traceparent` header (the
//!   message's own trace context, kept as it is) must hold a valid W3C traceparent.
//! - `partition`: an explicit partition, `0..=2147483647`.
//! - `idempotency_key`: 1 to 256 characters without control characters; with one, at most
//!   99 messages (the idempotency marker is the transaction's 100th item).
//! - `traceparent` / `tracestate`: the caller's W3C trace context
//!   ([`TraceContext::parse`]: version `00`, a trace id and a parent id not all zeros,
//!   lowercase hex), stamped on every message that has no `traceparent` header of its own;
//!   `tracestate` only with `traceparent`.
//!
//! Unknown fields are rejected everywhere. Every error names the field and the rule, for
//! example `messages[3].topic: must not be empty`; the caller writes nothing when parsing
//! or [`DynamoDbOutboxWriter::check`](crate::DynamoDbOutboxWriter::check) fails.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::headers::Header;
use crate::message::OutboxMessage;
use crate::protocol::schema::MAX_TRANSACTION_ITEMS;
use crate::trace_context::TraceContext;
use crate::writer::Enqueued;

/// Longest accepted `idempotency_key`, in characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;

/// A parsed and validated enqueue request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueueRequest {
    /// The messages, stamped with the writer's bucket count, in request order.
    pub messages: Vec<OutboxMessage>,
    /// The caller's idempotency key, when given.
    pub idempotency_key: Option<String>,
}

/// One enqueued message of an [`EnqueueResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EnqueuedMessage {
    /// The message id (a UUID, hyphenated), also stamped on the record as a header.
    pub message_id: String,
    /// The message's bucket.
    pub bucket: u32,
    /// Its sequence number within the bucket.
    pub sequence: u64,
}

/// The response to an enqueue request: one entry per message, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EnqueueResponse {
    /// The enqueued messages.
    pub messages: Vec<EnqueuedMessage>,
}

impl EnqueueResponse {
    /// The response for what [`DynamoDbOutboxWriter::enqueue`](crate::DynamoDbOutboxWriter::enqueue) returned.
    pub fn from_enqueued(enqueued: &[Enqueued]) -> Self {
        EnqueueResponse {
            messages: enqueued
                .iter()
                .map(|e| EnqueuedMessage {
                    message_id: e.message_id.hyphenated().to_string(),
                    bucket: e.bucket,
                    sequence: e.sequence,
                })
                .collect(),
        }
    }
}

/// Parses JSON text (see the module documentation) for a writer with `bucket_count` buckets.
pub fn parse_request_str(text: &str, bucket_count: u32) -> Result<EnqueueRequest> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::message("request", format!("is not valid JSON: {e}")))?;
    parse_request(&value, bucket_count)
}

/// Parses a JSON value (see the module documentation) for a writer with `bucket_count`
/// buckets, and checks every message against [`OutboxMessage::validate`].
pub fn parse_request(value: &Value, bucket_count: u32) -> Result<EnqueueRequest> {
    let obj = object(value, "request")?;
    only_fields(
        obj,
        "request",
        "",
        &["messages", "idempotency_key", "traceparent", "tracestate"],
    )?;
    let list = match obj.get("messages") {
        None | Some(Value::Null) => return Err(Error::message("messages", "is required")),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(Error::message(
                "messages",
                format!("must be an array, got {}", kind(other)),
            ))
        }
    };
    if list.is_empty() {
        return Err(Error::message("messages", "must hold at least 1 message"));
    }
    if list.len() > MAX_TRANSACTION_ITEMS {
        return Err(Error::message(
            "messages",
            format!(
                "must hold at most {MAX_TRANSACTION_ITEMS} messages (one DynamoDB transaction), got {}",
                list.len()
            ),
        ));
    }
    let trace = trace_context(obj)?;
    let messages = list
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let message = parse_message(m, &format!("messages[{i}]"), bucket_count)?;
            Ok(match &trace {
                Some(context) => message.with_trace_context(context),
                None => message,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let idempotency_key = match obj.get("idempotency_key") {
        None | Some(Value::Null) => None,
        Some(Value::String(k)) => {
            let n = k.chars().count();
            if n == 0 || n > MAX_IDEMPOTENCY_KEY_LEN {
                return Err(Error::message(
                    "idempotency_key",
                    format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters long"),
                ));
            }
            if k.chars().any(char::is_control) {
                return Err(Error::message(
                    "idempotency_key",
                    "must not contain control characters",
                ));
            }
            Some(k.clone())
        }
        Some(other) => {
            return Err(Error::message(
                "idempotency_key",
                format!("must be a string, got {}", kind(other)),
            ))
        }
    };
    if idempotency_key.is_some() && messages.len() >= MAX_TRANSACTION_ITEMS {
        return Err(Error::message(
            "messages",
            format!(
                "must hold at most {} messages with an idempotency_key (its marker item takes one of the transaction's {MAX_TRANSACTION_ITEMS}), got {}",
                MAX_TRANSACTION_ITEMS - 1,
                messages.len()
            ),
        ));
    }
    Ok(EnqueueRequest {
        messages,
        idempotency_key,
    })
}

/// The request's `traceparent` and `tracestate`, validated.
fn trace_context(obj: &Map<String, Value>) -> Result<Option<TraceContext>> {
    let text = |name: &str| match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(Error::message(
            name,
            format!("must be a string, got {}", kind(other)),
        )),
    };
    match (text("traceparent")?, text("tracestate")?) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(Error::message(
            "tracestate",
            "is given without traceparent (a tracestate belongs to a traceparent)",
        )),
        (Some(parent), state) => TraceContext::parse("traceparent", parent, state).map(Some),
    }
}

fn parse_message(value: &Value, field: &str, bucket_count: u32) -> Result<OutboxMessage> {
    let obj = object(value, field)?;
    only_fields(
        obj,
        field,
        &format!("{field}."),
        &[
            "topic",
            "key",
            "key_base64",
            "value",
            "value_base64",
            "headers",
            "partition",
        ],
    )?;
    let topic = match obj.get("topic") {
        None | Some(Value::Null) => {
            return Err(Error::message(format!("{field}.topic"), "is required"))
        }
        Some(Value::String(t)) => t.clone(),
        Some(other) => {
            return Err(Error::message(
                format!("{field}.topic"),
                format!("must be a string, got {}", kind(other)),
            ))
        }
    };
    let mut message = OutboxMessage::new(topic, bucket_count);
    message.key = bytes(obj, field, "key")?;
    message.value = bytes(obj, field, "value")?;
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, h) in list.iter().enumerate() {
                message
                    .headers
                    .push(parse_header(h, &format!("{field}.headers[{i}]"))?);
            }
        }
        Some(other) => {
            return Err(Error::message(
                format!("{field}.headers"),
                format!("must be an array, got {}", kind(other)),
            ))
        }
    }
    match obj.get("partition") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) => {
            let p = n.as_i64().filter(|p| (0..=i64::from(i32::MAX)).contains(p));
            match p {
                Some(p) => message.partition = Some(p as i32),
                None => {
                    return Err(Error::message(
                        format!("{field}.partition"),
                        format!("must be a whole number from 0 to {}, got {n}", i32::MAX),
                    ))
                }
            }
        }
        Some(other) => {
            return Err(Error::message(
                format!("{field}.partition"),
                format!("must be a whole number >= 0, got {}", kind(other)),
            ))
        }
    }
    message.validate(field)?;
    Ok(message)
}

fn parse_header(value: &Value, field: &str) -> Result<Header> {
    let obj = object(value, field)?;
    only_fields(
        obj,
        field,
        &format!("{field}."),
        &["key", "value", "value_base64"],
    )?;
    let key = match obj.get("key") {
        None | Some(Value::Null) => {
            return Err(Error::message(format!("{field}.key"), "is required"))
        }
        Some(Value::String(k)) if k.is_empty() => {
            return Err(Error::message(format!("{field}.key"), "must not be empty"))
        }
        Some(Value::String(k)) => k.clone(),
        Some(other) => {
            return Err(Error::message(
                format!("{field}.key"),
                format!("must be a string, got {}", kind(other)),
            ))
        }
    };
    let value = bytes(obj, field, "value")?;
    if key == crate::trace_context::TRACEPARENT {
        // A message's own trace context is kept as given: it must be one.
        let text = value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
            .ok_or_else(|| {
                Error::message(
                    format!("{field}.value"),
                    "a traceparent header must have a W3C traceparent as its value (UTF-8 text)",
                )
            })?;
        TraceContext::parse(&format!("{field}.value"), text, None)?;
    }
    Ok(Header { key, value })
}

/// `name` as a UTF-8 string or `name_base64` as base64; neither (or `null`) is `None`.
fn bytes(obj: &Map<String, Value>, field: &str, name: &str) -> Result<Option<Vec<u8>>> {
    let b64_name = format!("{name}_base64");
    let text = obj.get(name).filter(|v| !v.is_null());
    let b64 = obj.get(&b64_name).filter(|v| !v.is_null());
    match (text, b64) {
        (Some(_), Some(_)) => Err(Error::message(
            format!("{field}.{name}"),
            format!("give either {name} (UTF-8 text) or {b64_name} (base64), not both"),
        )),
        (None, None) => Ok(None),
        (Some(Value::String(s)), None) => Ok(Some(s.as_bytes().to_vec())),
        (Some(other), None) => Err(Error::message(
            format!("{field}.{name}"),
            format!("must be a string, got {}", kind(other)),
        )),
        (None, Some(Value::String(s))) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map(Some)
            .map_err(|e| {
                Error::message(
                    format!("{field}.{b64_name}"),
                    format!("is not valid base64: {e}"),
                )
            }),
        (None, Some(other)) => Err(Error::message(
            format!("{field}.{b64_name}"),
            format!("must be a base64 string, got {}", kind(other)),
        )),
    }
}

fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>> {
    value
        .as_object()
        .ok_or_else(|| Error::message(field, format!("must be a JSON object, got {}", kind(value))))
}

/// Rejects any field of `obj` not in `allowed`; `prefix` is prepended to the field's name.
fn only_fields(
    obj: &Map<String, Value>,
    field: &str,
    prefix: &str,
    allowed: &[&str],
) -> Result<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(unknown) => Err(Error::message(
            format!("{prefix}{unknown}"),
            format!(
                "unknown field (the fields of {field} are {})",
                allowed.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<EnqueueRequest> {
        parse_request(&v, 8)
    }

    fn err(v: Value) -> String {
        parse(v).unwrap_err().to_string()
    }

    #[test]
    fn parses_every_field() {
        let r = parse(json!({
            "messages": [
                {"topic": "orders", "key": "k1", "value": "v1",
                 "headers": [{"key": "a", "value": "x"}, {"key": "b", "value_base64": "AAE="},
                             {"key": "c", "value": null}, {"key": "d"}],
                 "partition": 3},
                {"topic": "orders", "key_base64": "", "value_base64": "/w=="},
                {"topic": "t", "key": null, "value": null}
            ],
            "idempotency_key": "req-1"
        }))
        .unwrap();
        assert_eq!(r.idempotency_key.as_deref(), Some("req-1"));
        let [a, b, c] = &r.messages[..] else {
            panic!("three messages")
        };
        assert_eq!(a.topic, "orders");
        assert_eq!(a.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(a.value.as_deref(), Some(&b"v1"[..]));
        assert_eq!(
            a.headers,
            vec![
                Header::new("a", "x"),
                Header::new("b", vec![0u8, 1]),
                Header::null("c"),
                Header::null("d")
            ]
        );
        assert_eq!(a.partition, Some(3));
        assert_eq!(a.bucket_count, 8);
        assert_eq!(a.bucket(), 3);
        assert_eq!(b.key.as_deref(), Some(&b""[..]), "empty key is a real key");
        assert_eq!(b.value.as_deref(), Some(&[0xffu8][..]));
        assert_eq!((c.key.clone(), c.value.clone()), (None, None));
        assert_ne!(a.message_id, b.message_id);
    }

    /// Asserts that each request is refused as a validation error whose message starts
    /// with the field and the rule.
    fn assert_refused(cases: &[(Value, &str)]) {
        for (request, expected) in cases {
            let e = parse(request.clone()).unwrap_err();
            assert_eq!(e.error_type(), "ValidationError", "{request}");
            assert!(
                e.to_string().starts_with(expected),
                "{request}: {e} does not start with {expected:?}"
            );
        }
    }

    #[test]
    fn request_errors_name_the_field_and_rule() {
        let ok = json!({"topic": "t"});
        let many: Vec<Value> = (0..101).map(|_| ok.clone()).collect();
        let cases = [
            (json!([]), "request: must be a JSON object"),
            (json!({}), "messages: is required"),
            (json!({"messages": {}}), "messages: must be an array"),
            (json!({"messages": []}), "messages: must hold at least 1"),
            (json!({"messages": many}), "messages: must hold at most 100"),
            (
                json!({"messages": many[..100], "idempotency_key": "k"}),
                "messages: must hold at most 99 messages with an idempotency_key",
            ),
            (
                json!({"messages": [ok], "extra": 1}),
                "extra: unknown field",
            ),
            (
                json!({"messages": [ok], "idempotency_key": ""}),
                "idempotency_key: must be 1 to 256",
            ),
            (
                json!({"messages": [ok], "idempotency_key": 7}),
                "idempotency_key: must be a string",
            ),
        ];
        assert_refused(&cases);
        assert!(err(json!({"messages": [ok], "idempotency_key": "a\nb"}))
            .starts_with("idempotency_key: must not contain control"));
    }

    #[test]
    fn message_errors_name_the_field_and_rule() {
        let ok = json!({"topic": "t"});
        let cases = [
            (
                json!({"messages": [ok, ok, ok, {"topic": ""}]}),
                "messages[3].topic: must not be empty",
            ),
            (
                json!({"messages": [{"topic": "a b"}]}),
                "messages[0].topic: may contain only",
            ),
            (
                json!({"messages": [{"topic": "x".repeat(250)}]}),
                "messages[0].topic: must be at most 249",
            ),
            (json!({"messages": [{"topic": ".."}]}), "messages[0].topic:"),
            (json!({"messages": [{}]}), "messages[0].topic: is required"),
            (
                json!({"messages": [{"topic": 5}]}),
                "messages[0].topic: must be a string",
            ),
            (
                json!({"messages": [{"topic": "t", "colour": 1}]}),
                "messages[0].colour: unknown field",
            ),
            (
                json!({"messages": [{"topic": "t", "key": "a", "key_base64": "YQ=="}]}),
                "messages[0].key: give either key",
            ),
            (
                json!({"messages": [{"topic": "t", "value_base64": "not base64!"}]}),
                "messages[0].value_base64: is not valid base64",
            ),
            (
                json!({"messages": [{"topic": "t", "value": 1}]}),
                "messages[0].value: must be a string",
            ),
            (
                json!({"messages": [{"topic": "t", "partition": -1}]}),
                "messages[0].partition: must be a whole number from 0",
            ),
            (
                json!({"messages": [{"topic": "t", "partition": 2147483648u64}]}),
                "messages[0].partition:",
            ),
            (
                json!({"messages": [{"topic": "t", "partition": 1.5}]}),
                "messages[0].partition:",
            ),
            (
                json!({"messages": [{"topic": "t", "partition": "1"}]}),
                "messages[0].partition: must be a whole number",
            ),
            (
                json!({"messages": [{"topic": "t", "headers": [{"key": "a"}, {"key": ""}]}]}),
                "messages[0].headers[1].key: must not be empty",
            ),
            (
                json!({"messages": [{"topic": "t", "headers": [{"value": "a"}]}]}),
                "messages[0].headers[0].key: is required",
            ),
            (
                json!({"messages": [{"topic": "t", "headers": [{"key": "a", "v": 1}]}]}),
                "messages[0].headers[0].v: unknown field",
            ),
            (
                json!({"messages": [{"topic": "t", "headers": {}}]}),
                "messages[0].headers: must be an array",
            ),
        ];
        assert_refused(&cases);
    }

    #[test]
    fn the_callers_trace_context_is_stamped_on_messages_without_their_own() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let own = "00-11111111111111111111111111111111-2222222222222222-00";
        let r = parse(json!({
            "messages": [
                {"topic": "t", "headers": [{"key": "type", "value": "x"}]},
                {"topic": "t", "headers": [{"key": "traceparent", "value": own}]}
            ],
            "traceparent": parent,
            "tracestate": "rojo=1"
        }))
        .unwrap();
        assert_eq!(
            r.messages[0].headers,
            vec![
                Header::new("type", "x"),
                Header::new("traceparent", parent),
                Header::new("tracestate", "rojo=1")
            ]
        );
        assert_eq!(
            r.messages[1].headers,
            vec![Header::new("traceparent", own)],
            "a message's own traceparent is kept"
        );
        let plain = parse(json!({"messages": [{"topic": "t"}]})).unwrap();
        assert!(
            plain.messages[0].headers.is_empty(),
            "no context, no headers"
        );
        assert_refused(&[
            (
                json!({"messages": [{"topic": "t"}], "traceparent": "00-abc-def-01"}),
                "traceparent: \"00-abc-def-01\" is not a W3C traceparent: the trace id must be 32",
            ),
            (
                json!({"messages": [{"topic": "t"}],
                       "traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}),
                "traceparent: ",
            ),
            (
                json!({"messages": [{"topic": "t"}], "traceparent": 7}),
                "traceparent: must be a string",
            ),
            (
                json!({"messages": [{"topic": "t", "headers": [{"key": "traceparent", "value": "x"}]}]}),
                "messages[0].headers[0].value: \"x\" is not a W3C traceparent",
            ),
            (
                json!({"messages": [{"topic": "t", "headers": [{"key": "traceparent"}]}]}),
                "messages[0].headers[0].value: a traceparent header must have",
            ),
            (
                json!({"messages": [{"topic": "t"}], "tracestate": "a=b"}),
                "tracestate: is given without traceparent",
            ),
            (
                json!({"messages": [{"topic": "t"}], "traceparent": parent, "tracestate": "nokey"}),
                "tracestate: \"nokey\" is not a W3C tracestate",
            ),
        ]);
    }

    #[test]
    fn text_requests_parse_or_name_the_problem() {
        let r = parse_request_str(r#"{"messages":[{"topic":"t","value":"v"}]}"#, 4).unwrap();
        assert_eq!(r.messages[0].bucket_count, 4);
        let e = parse_request_str("{not json", 4).unwrap_err();
        assert!(
            e.to_string().starts_with("request: is not valid JSON"),
            "{e}"
        );
    }

    #[test]
    fn responses_serialize_as_documented() {
        let id = uuid::Uuid::new_v4();
        let r = EnqueueResponse::from_enqueued(&[Enqueued {
            message_id: id,
            bucket: 2,
            sequence: 41,
        }]);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"messages": [{"message_id": id.to_string(), "bucket": 2, "sequence": 41}]})
        );
    }

    mod fuzz {
        //! The request parser on hostile input (the stable-toolchain stand-in for a
        //! `cargo fuzz` target): it never panics, and a request it accepts is valid.
        use super::*;
        use proptest::prelude::*;

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<f64>().prop_map(|f| json!(f)),
                ".{0,20}".prop_map(Value::String),
                "[A-Za-z0-9+/=]{0,24}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                let keys = prop_oneof![
                    Just("messages".to_string()),
                    Just("topic".to_string()),
                    Just("key".to_string()),
                    Just("key_base64".to_string()),
                    Just("value".to_string()),
                    Just("value_base64".to_string()),
                    Just("headers".to_string()),
                    Just("partition".to_string()),
                    Just("idempotency_key".to_string()),
                    ".{0,8}",
                ];
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    proptest::collection::btree_map(keys, inner, 0..6)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn never_panics_on_arbitrary_json(v in json_value()) {
                if let Ok(request) = parse_request(&v, 8) {
                    prop_assert!(!request.messages.is_empty() && request.messages.len() <= 100);
                    for (i, m) in request.messages.iter().enumerate() {
                        let field = format!("messages[{}]", i);
                        prop_assert!(m.validate(&field).is_ok());
                    }
                }
                let _ = parse_request(&json!({ "messages": [v] }), 8);
            }

            #[test]
            fn never_panics_on_arbitrary_text(text in ".{0,200}") {
                let _ = parse_request_str(&text, 8);
            }
        }

        /// A valid message: topic, key, value, headers, sometimes a partition.
        fn valid_message() -> impl Strategy<Value = Value> {
            (
                "[a-z][a-z0-9._-]{0,10}",
                "[a-z0-9]{1,8}",
                "[ -~]{0,16}",
                proptest::option::of(0i64..8),
                proptest::collection::vec(("[a-z]{1,6}", "[ -~]{0,6}"), 0..3),
            )
                .prop_map(|(topic, key, value, partition, headers)| {
                    let headers: Vec<Value> = headers
                        .into_iter()
                        .map(|(k, v)| json!({"key": k, "value": v}))
                        .collect();
                    let mut m =
                        json!({"topic": topic, "key": key, "value": value, "headers": headers});
                    if let Some(p) = partition {
                        m["partition"] = json!(p);
                    }
                    m
                })
        }

        /// One field of one message made invalid, and the field the rejection must name
        /// (after `messages[i].`).
        fn mutate(m: &mut Value, which: usize) -> &'static str {
            let o = m.as_object_mut().unwrap();
            match which {
                0 => {
                    o.remove("topic");
                    "topic"
                }
                1 => {
                    o.insert("topic".into(), json!(7));
                    "topic"
                }
                2 => {
                    o.insert("topic".into(), json!(""));
                    "topic"
                }
                3 => {
                    o.insert("topic".into(), json!("has space"));
                    "topic"
                }
                4 => {
                    o.insert("key".into(), json!(5));
                    "key"
                }
                5 => {
                    o.insert("key_base64".into(), json!("a2V5"));
                    "key"
                }
                6 => {
                    o.remove("key");
                    o.insert("key_base64".into(), json!("!!not base64!!"));
                    "key_base64"
                }
                7 => {
                    o.insert("value".into(), json!({"nested": true}));
                    "value"
                }
                8 => {
                    o.insert("partition".into(), json!(-1));
                    "partition"
                }
                9 => {
                    o.insert("partition".into(), json!("3"));
                    "partition"
                }
                10 => {
                    o.insert("headers".into(), json!({"key": "k"}));
                    "headers"
                }
                11 => {
                    o.insert("headers".into(), json!([{"value": "v"}]));
                    "headers[0].key"
                }
                _ => {
                    o.insert("colour".into(), json!("red"));
                    "colour"
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            /// Near-valid requests (a valid skeleton, one field of one message mutated):
            /// the rejection names exactly that field; unmutated, the request is accepted
            /// and reads back as written.
            #[test]
            fn a_near_valid_request_is_rejected_naming_the_mutated_field(
                messages in proptest::collection::vec(valid_message(), 1..5),
                at in any::<prop::sample::Index>(),
                which in 0usize..13,
            ) {
                let accepted = parse_request(&json!({"messages": messages.clone()}), 8);
                let accepted = accepted.map_err(|e| TestCaseError::fail(e.to_string()))?;
                for (m, parsed) in messages.iter().zip(&accepted.messages) {
                    prop_assert_eq!(m["topic"].as_str().unwrap(), parsed.topic.as_str());
                    prop_assert_eq!(
                        m["key"].as_str().map(str::as_bytes),
                        parsed.key.as_deref()
                    );
                    prop_assert_eq!(
                        m["value"].as_str().map(str::as_bytes),
                        parsed.value.as_deref()
                    );
                }

                let mut mutated = messages.clone();
                let i = at.index(mutated.len());
                let named = mutate(&mut mutated[i], which);
                let err = parse_request(&json!({"messages": mutated}), 8).unwrap_err();
                match err {
                    Error::InvalidMessage { field, .. } => {
                        prop_assert_eq!(field, format!("messages[{i}].{named}"));
                    }
                    other => prop_assert!(false, "not a field-named rejection: {other}"),
                }
            }
        }
    }
}
