//! The publish span of one produce request (feature `otel`; without it, nothing).
//!
//! One span per produce request, that is per partition (a partition's records that do not
//! fit [`KafkaConfig::max_request_bytes`](super::KafkaConfig::max_request_bytes) take
//! several requests, each with its span), on the global tracer provider (`outboxctl relay`
//! and the relay function install one when an OTLP endpoint is configured; otherwise the
//! no-op provider records nothing). Named and described after OpenTelemetry's messaging
//! semantic conventions:
//!
//! - name `send {topic}`, kind `PRODUCER`, a root span (the relay's own work; the
//!   producers' traces are linked, not parents);
//! - `messaging.system` `kafka`, `messaging.operation.type` and `messaging.operation.name`
//!   `send`, `messaging.destination.name` the topic, `messaging.destination.partition.id`
//!   the partition;
//! - `messaging.batch.message_count` for more than one message, `messaging.message.id`
//!   for exactly one, and `outbox.message.ids` (this project's): every message id of the
//!   request, in order;
//! - once acknowledged, `messaging.kafka.offset`: the offset of the request's first
//!   record (the others follow it, one each);
//! - a link to each message's trace context (its `traceparent` header, see
//!   [`crate::trace_context`]) with the link attributes `messaging.message.id` and, once
//!   acknowledged, `messaging.kafka.offset`; a message without a valid `traceparent` gets
//!   no link (its id is in `outbox.message.ids`);
//! - status `ERROR` with the error's text when the request failed (after its retries).

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
    use opentelemetry::{global, Context, KeyValue, StringValue, Value};

    use crate::error::Error;
    use crate::message::StoredMessage;
    use crate::trace_context::TraceContext;

    /// The tracer's (instrumentation scope's) name.
    pub(crate) const TRACER_NAME: &str = "dynamo-outbox";

    /// A started publish span, ended by [`PublishSpan::acknowledged`] or
    /// [`PublishSpan::failed`] (or when dropped).
    pub(crate) struct PublishSpan {
        span: global::BoxedSpan,
        /// Each message's id and trace context, in request order.
        messages: Vec<(String, Option<TraceContext>)>,
    }

    impl PublishSpan {
        /// The span of the request carrying `batch[i]` for each `i` of `chunk`.
        pub(crate) fn start(
            topic: &str,
            partition: i32,
            batch: &[StoredMessage],
            chunk: &[usize],
        ) -> Self {
            let tracer = global::tracer(TRACER_NAME);
            let messages: Vec<(String, Option<TraceContext>)> = chunk
                .iter()
                .map(|&i| &batch[i])
                .map(|m| {
                    (
                        m.message.message_id.hyphenated().to_string(),
                        TraceContext::from_headers(&m.message.headers),
                    )
                })
                .collect();
            let mut attributes = vec![
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.operation.name", "send"),
                KeyValue::new("messaging.destination.name", topic.to_string()),
                KeyValue::new("messaging.destination.partition.id", partition.to_string()),
                KeyValue::new(
                    "outbox.message.ids",
                    Value::Array(
                        messages
                            .iter()
                            .map(|(id, _)| StringValue::from(id.clone()))
                            .collect::<Vec<_>>()
                            .into(),
                    ),
                ),
            ];
            match messages.as_slice() {
                [(id, _)] => attributes.push(KeyValue::new("messaging.message.id", id.clone())),
                many => attributes.push(KeyValue::new(
                    "messaging.batch.message_count",
                    many.len() as i64,
                )),
            }
            let span = tracer
                .span_builder(format!("send {topic}"))
                .with_kind(SpanKind::Producer)
                .with_attributes(attributes)
                .start_with_context(&tracer, &Context::new());
            PublishSpan { span, messages }
        }

        /// The request was acknowledged, its first record at `base_offset`.
        pub(crate) fn acknowledged(mut self, base_offset: Option<i64>) {
            if let Some(offset) = base_offset {
                self.span
                    .set_attribute(KeyValue::new("messaging.kafka.offset", offset));
            }
            self.link(base_offset);
            self.span.end();
        }

        /// The request failed with `error`.
        pub(crate) fn failed(mut self, error: &Error) {
            self.span
                .set_status(Status::error(crate::error::chain(error).to_string()));
            self.link(None);
            self.span.end();
        }

        fn link(&mut self, base_offset: Option<i64>) {
            for (i, (id, context)) in self.messages.iter().enumerate() {
                let Some(context) = context else { continue };
                let mut attributes = vec![KeyValue::new("messaging.message.id", id.clone())];
                // The base offset is the broker's answer: no offset past i64 is named.
                if let Some(offset) = base_offset.and_then(|b| b.checked_add(i as i64)) {
                    attributes.push(KeyValue::new("messaging.kafka.offset", offset));
                }
                self.span.add_link(context.span_context(), attributes);
            }
        }
    }
}

#[cfg(feature = "otel")]
pub(crate) use otel::PublishSpan;

/// Without the `otel` feature: records nothing.
#[cfg(not(feature = "otel"))]
pub(crate) struct PublishSpan;

#[cfg(not(feature = "otel"))]
impl PublishSpan {
    pub(crate) fn start(
        _topic: &str,
        _partition: i32,
        _batch: &[crate::message::StoredMessage],
        _chunk: &[usize],
    ) -> Self {
        PublishSpan
    }

    pub(crate) fn acknowledged(self, _base_offset: Option<i64>) {}

    pub(crate) fn failed(self, _error: &crate::error::Error) {}
}
