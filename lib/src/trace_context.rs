//! W3C Trace Context on outbox messages: the `traceparent` and `tracestate` headers that let
//! a consumer continue the trace of the business write that produced the message.
//!
//! The writer stamps them (see [`DynamoDbOutboxWriter`](crate::DynamoDbOutboxWriter)):
//!
//! - a message that already carries a `traceparent` header keeps it, and nothing is added;
//! - otherwise a context given explicitly ([`OutboxMessage::with_trace_context`]) is stamped;
//! - otherwise, with the `otel` feature, the current OpenTelemetry context's span, when it
//!   has a valid one;
//! - otherwise nothing: a writer without the feature and without an explicit context
//!   writes no trace headers.
//!
//! The headers are ordinary message headers (UTF-8 text, as W3C Trace Context's HTTP
//! headers), so they travel in the `Headers` blob and reach Kafka byte for byte:
//! `traceparent` = `00-{trace id, 32 lowercase hex}-{parent id, 16 lowercase hex}-{flags, 2
//! hex}`, and `tracestate` (only when the context has one) = the vendor list as given.
//!
//! [`OutboxMessage::with_trace_context`]: crate::OutboxMessage::with_trace_context

use crate::error::{Error, Result};
use crate::headers::Header;

/// The header carrying the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The header carrying the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` accepted, in characters (W3C: at least 512 must be propagated).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// Most list members in a `tracestate` (W3C's limit).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Most bytes of a rejected input an error or a log line quotes (the caller's input may be
/// megabytes; its start is enough to find it).
pub const MAX_QUOTED_BYTES: usize = 64;

/// A validated W3C trace context: the `traceparent` fields and an optional `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from its parts; `None` when the trace id or the parent id is all zeros
    /// (W3C: invalid).
    pub fn new(trace_id: [u8; 16], parent_id: [u8; 8], flags: u8) -> Option<Self> {
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            parent_id,
            flags,
            tracestate: None,
        })
    }

    /// Parses a `traceparent` (version `00`: `00-{32 hex}-{16 hex}-{2 hex}`, lowercase,
    /// trace and parent id not all zeros) and an optional `tracestate` (at most
    /// [`MAX_TRACESTATE_LEN`] characters, at most [`MAX_TRACESTATE_MEMBERS`] comma-separated
    /// `key=value` members of printable ASCII). An error names `field` (the traceparent's;
    /// the tracestate's is `field` with `traceparent` replaced by `tracestate`, or
    /// `{field}.tracestate`) and the rule.
    pub fn parse(field: &str, traceparent: &str, tracestate: Option<&str>) -> Result<Self> {
        let mut context = parse_traceparent(traceparent).map_err(|rule| {
            Error::message(
                field,
                format!("{} is not a W3C traceparent: {rule}", quote(traceparent)),
            )
        })?;
        if let Some(state) = tracestate {
            check_tracestate(state).map_err(|rule| {
                Error::message(
                    tracestate_field(field),
                    format!("{} is not a W3C tracestate: {rule}", quote(state)),
                )
            })?;
            if !state.trim().is_empty() {
                context.tracestate = Some(state.to_string());
            }
        }
        Ok(context)
    }

    /// The context of an AWS X-Ray trace header (`Root=1-{8 hex}-{24 hex};Parent={16
    /// hex};Sampled={0|1}`, as Lambda passes it in `Lambda-Runtime-Trace-Id` and
    /// `_X_AMZN_TRACE_ID`): the W3C trace id is the root's two hex parts joined (X-Ray's
    /// ids are W3C ids written differently), the parent id is `Parent`, and the sampled
    /// flag is `Sampled=1`. `None` when the header has no valid root or parent (a header
    /// without a parent names no span to link to).
    pub fn from_xray(header: &str) -> Option<Self> {
        Self::parse_xray(header).ok().flatten()
    }

    /// [`Self::from_xray`] for the trace header of one invocation: a malformed header
    /// (no valid `Root`, or a `Parent` that is not 16 hex digits) is dropped with one
    /// warning that quotes at most [`MAX_QUOTED_BYTES`] of it and names the rule; a valid
    /// root without a parent is no context and no warning (it names no span to link to).
    /// Call it once per invocation: it logs each time it meets a malformed header.
    pub fn from_invocation_xray(header: &str) -> Option<Self> {
        match Self::parse_xray(header) {
            Ok(context) => context,
            Err(rule) => {
                tracing::warn!(
                    header = %quote(header),
                    rule,
                    "ignored a malformed x-ray trace header"
                );
                None
            }
        }
    }

    /// The X-Ray header's context: `Ok(None)` when it has a valid root and no parent,
    /// `Err(rule)` when it is malformed.
    fn parse_xray(header: &str) -> std::result::Result<Option<Self>, &'static str> {
        let (mut root, mut parent, mut sampled) = (None, None, false);
        for part in header.split(';') {
            let Some((key, value)) = part.split_once('=') else {
                continue;
            };
            match key.trim() {
                "Root" => root = Some(value.trim()),
                "Parent" => parent = Some(value.trim()),
                "Sampled" => sampled = value.trim() == "1",
                _ => {}
            }
        }
        const ROOT: &str = "Root must be 1-{8 hex}-{24 hex}";
        let root = root.ok_or("Root is missing")?;
        let (time, id) = root
            .strip_prefix("1-")
            .and_then(|r| r.split_once('-'))
            .ok_or(ROOT)?;
        if time.len() != 8 || id.len() != 24 {
            return Err(ROOT);
        }
        let trace_id = hex_bytes::<16>(&format!("{time}{id}").to_ascii_lowercase()).ok_or(ROOT)?;
        if trace_id == [0; 16] {
            return Err("Root must not be all zeros");
        }
        let Some(parent) = parent else {
            return Ok(None);
        };
        let parent_id =
            hex_bytes::<8>(&parent.to_ascii_lowercase()).ok_or("Parent must be 16 hex digits")?;
        TraceContext::new(trace_id, parent_id, u8::from(sampled))
            .map(Some)
            .ok_or("Parent must not be all zeros")
    }

    /// The context carried by `headers`: the first `traceparent` header (and the first
    /// `tracestate`), when it is valid; `None` otherwise (no header, a null or malformed
    /// one: a message's headers are the writer's, never a reason to fail).
    pub fn from_headers(headers: &[Header]) -> Option<Self> {
        let value = |key: &str| {
            headers
                .iter()
                .find(|h| h.key == key)
                .and_then(|h| h.value.as_deref())
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        let parent = value(TRACEPARENT)?;
        TraceContext::parse(TRACEPARENT, parent, value(TRACESTATE))
            .or_else(|_| TraceContext::parse(TRACEPARENT, parent, None))
            .ok()
    }

    /// The same context with `tracestate` (validated as [`Self::parse`] does; empty removes it).
    pub fn with_tracestate(mut self, tracestate: &str) -> Result<Self> {
        check_tracestate(tracestate).map_err(|rule| {
            Error::message(
                TRACESTATE,
                format!("{} is not a W3C tracestate: {rule}", quote(tracestate)),
            )
        })?;
        self.tracestate = (!tracestate.trim().is_empty()).then(|| tracestate.to_string());
        Ok(self)
    }

    /// The trace id's 16 bytes.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The parent (span) id's 8 bytes.
    pub fn parent_id(&self) -> [u8; 8] {
        self.parent_id
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The `tracestate`, when the context has one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The `traceparent` header value: `00-{trace id}-{parent id}-{flags}`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.parent_id),
            self.flags
        )
    }

    /// The headers to stamp: `traceparent`, then `tracestate` when there is one.
    pub fn headers(&self) -> Vec<Header> {
        let mut headers = vec![Header::new(TRACEPARENT, self.traceparent())];
        if let Some(state) = &self.tracestate {
            headers.push(Header::new(TRACESTATE, state.as_bytes()));
        }
        headers
    }

    /// The current OpenTelemetry context's span as a trace context, when it has a valid
    /// span context (feature `otel`).
    #[cfg(feature = "otel")]
    pub fn current() -> Option<Self> {
        use opentelemetry::trace::TraceContextExt as _;
        let context = opentelemetry::Context::current();
        let span = context.span();
        Self::of_span_context(span.span_context())
    }

    /// A span context as a trace context; `None` when it is not valid (feature `otel`).
    #[cfg(feature = "otel")]
    pub fn of_span_context(span: &opentelemetry::trace::SpanContext) -> Option<Self> {
        if !span.is_valid() {
            return None;
        }
        let mut context = TraceContext::new(
            span.trace_id().to_bytes(),
            span.span_id().to_bytes(),
            span.trace_flags().to_u8(),
        )?;
        let state = span.trace_state().header();
        if !state.is_empty() && check_tracestate(&state).is_ok() {
            context.tracestate = Some(state);
        }
        Some(context)
    }

    /// This context as a remote OpenTelemetry span context, for a span link (feature `otel`).
    #[cfg(feature = "otel")]
    pub fn span_context(&self) -> opentelemetry::trace::SpanContext {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        let state = self
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.parent_id),
            TraceFlags::new(self.flags),
            true,
            state,
        )
    }
}

/// Whether `headers` hold a `traceparent` header (whatever its value: a message's own
/// header is kept, never replaced).
pub fn has_traceparent(headers: &[Header]) -> bool {
    headers.iter().any(|h| h.key == TRACEPARENT)
}

/// Appends the trace headers of `context` to `headers`, unless they hold a `traceparent`
/// of their own (kept as it is).
pub(crate) fn stamp(headers: &mut Vec<Header>, context: Option<&TraceContext>) {
    if let Some(context) = context {
        if !has_traceparent(headers) {
            headers.extend(context.headers());
        }
    }
}

fn tracestate_field(field: &str) -> String {
    if field.contains(TRACEPARENT) {
        field.replace(TRACEPARENT, TRACESTATE)
    } else {
        format!("{field}.{TRACESTATE}")
    }
}

fn parse_traceparent(value: &str) -> std::result::Result<TraceContext, String> {
    let parts: Vec<&str> = value.split('-').collect();
    let [version, trace_id, parent_id, flags] = parts[..] else {
        return Err("must be four fields separated by '-': version-traceid-parentid-flags".into());
    };
    if version != "00" {
        return Err(format!("version must be 00, got {}", quote(version)));
    }
    let field = |name: &str, text: &str, len: usize| {
        if text.len() != len || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Err(format!("{name} must be {len} lowercase hex digits"))
        } else {
            Ok(())
        }
    };
    field("the trace id", trace_id, 32)?;
    field("the parent id", parent_id, 16)?;
    field("the flags", flags, 2)?;
    let trace = hex_bytes::<16>(trace_id).ok_or("the trace id is not hex")?;
    let parent = hex_bytes::<8>(parent_id).ok_or("the parent id is not hex")?;
    let flags = hex_bytes::<1>(flags).ok_or("the flags are not hex")?[0];
    if trace == [0; 16] {
        return Err("the trace id must not be all zeros".into());
    }
    if parent == [0; 8] {
        return Err("the parent id must not be all zeros".into());
    }
    Ok(TraceContext {
        trace_id: trace,
        parent_id: parent,
        flags,
        tracestate: None,
    })
}

fn check_tracestate(value: &str) -> std::result::Result<(), String> {
    if value.chars().count() > MAX_TRACESTATE_LEN {
        return Err(format!(
            "must be at most {MAX_TRACESTATE_LEN} characters long"
        ));
    }
    let members: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    if members.len() > MAX_TRACESTATE_MEMBERS {
        return Err(format!(
            "must have at most {MAX_TRACESTATE_MEMBERS} list members"
        ));
    }
    for member in members {
        let Some((key, val)) = member.split_once('=') else {
            return Err(format!("member {} must be key=value", quote(member)));
        };
        if key.is_empty() || val.is_empty() {
            return Err(format!(
                "member {} must have a key and a value",
                quote(member)
            ));
        }
        if !member.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(format!("member {} must be printable ASCII", quote(member)));
        }
    }
    Ok(())
}

/// `text` quoted as `Debug` quotes it, cut to at most [`MAX_QUOTED_BYTES`] bytes at a char
/// boundary, with how long it was when it was cut: `"00-4bf9..."... (812 bytes)`.
pub(crate) fn quote(text: &str) -> String {
    if text.len() <= MAX_QUOTED_BYTES {
        return format!("{text:?}");
    }
    let mut end = MAX_QUOTED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &text[..end], text.len())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_the_w3c_example() {
        let c = TraceContext::parse("traceparent", PARENT, Some("rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(c.traceparent(), PARENT);
        assert_eq!(c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.flags(), 1);
        assert_eq!(c.tracestate(), Some("rojo=00f067aa0ba902b7"));
        assert_eq!(
            c.headers(),
            vec![
                Header::new("traceparent", PARENT),
                Header::new("tracestate", "rojo=00f067aa0ba902b7")
            ]
        );
        let without = TraceContext::parse("traceparent", PARENT, None).unwrap();
        assert_eq!(without.headers(), vec![Header::new("traceparent", PARENT)]);
    }

    #[test]
    fn malformed_contexts_name_the_field_and_the_rule() {
        let cases = [
            ("", "four fields"),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version must be 00",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "trace id must be 32",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "lowercase hex",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id must not be all zeros",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "parent id must not be all zeros",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "flags must be 2",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                "four fields",
            ),
        ];
        for (value, rule) in cases {
            let e = TraceContext::parse("messages[0].traceparent", value, None).unwrap_err();
            assert_eq!(e.error_type(), "ValidationError");
            let text = e.to_string();
            assert!(text.starts_with("messages[0].traceparent: "), "{text}");
            assert!(text.contains(rule), "{value}: {text} lacks {rule:?}");
        }
        let e = TraceContext::parse("traceparent", PARENT, Some("novalue")).unwrap_err();
        assert!(e.to_string().starts_with("tracestate: "), "{e}");
        assert!(e.to_string().contains("key=value"), "{e}");
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE_LEN));
        let e = TraceContext::parse("traceparent", PARENT, Some(&long)).unwrap_err();
        assert!(e.to_string().contains("at most 512"), "{e}");
    }

    #[test]
    fn an_xray_header_becomes_the_same_trace_in_w3c_form() {
        let c = TraceContext::from_xray(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        )
        .unwrap();
        assert_eq!(
            c.traceparent(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
        );
        let unsampled = TraceContext::from_xray(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0;Lineage=a:1",
        )
        .unwrap();
        assert_eq!(
            unsampled.traceparent(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"
        );
        for no in [
            "",
            "Root=1-5759e988-bd862e3fe1be46a994272793",
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e98-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",
            "Root=1-5759e988-zz862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
        ] {
            assert_eq!(TraceContext::from_xray(no), None, "{no}");
        }
    }

    #[test]
    fn a_message_keeps_its_own_traceparent() {
        let ours = TraceContext::parse("traceparent", PARENT, Some("a=b")).unwrap();
        let own = "00-11111111111111111111111111111111-2222222222222222-00";
        let mut headers = vec![Header::new("traceparent", own)];
        stamp(&mut headers, Some(&ours));
        assert_eq!(headers, vec![Header::new("traceparent", own)]);
        let mut headers = vec![Header::new("type", "x")];
        stamp(&mut headers, Some(&ours));
        assert_eq!(headers.len(), 3);
        assert_eq!(TraceContext::from_headers(&headers), Some(ours));
        let mut none = vec![Header::new("type", "x")];
        stamp(&mut none, None);
        assert_eq!(none, vec![Header::new("type", "x")]);
        // A malformed header is no context (and no error).
        assert_eq!(
            TraceContext::from_headers(&[Header::new("traceparent", "garbage")]),
            None
        );
        assert_eq!(
            TraceContext::from_headers(&[Header::null("traceparent")]),
            None
        );
    }

    #[test]
    fn errors_quote_at_most_64_bytes_of_the_input() {
        // a huge traceparent, with a multi-byte character straddling byte 64
        let huge = format!("{}é{}", "a".repeat(63), "b".repeat(100_000));
        let text = TraceContext::parse("traceparent", &huge, None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            text,
            format!(
                "traceparent: \"{}\"... (100065 bytes) is not a W3C traceparent: must be four \
                 fields separated by '-': version-traceid-parentid-flags",
                "a".repeat(63)
            )
        );
        let long_state = format!("k={}", "v".repeat(10_000));
        let text = TraceContext::parse("traceparent", PARENT, Some(&long_state))
            .unwrap_err()
            .to_string();
        assert!(text.len() < 300, "{text}");
        assert!(text.contains("... (10002 bytes)"), "{text}");
        let member = "x".repeat(400);
        let text = TraceContext::parse("traceparent", PARENT, Some(&member))
            .unwrap_err()
            .to_string();
        assert!(text.len() < 300 && text.contains("key=value"), "{text}");
        let version = format!(
            "{}-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "9".repeat(500)
        );
        let text = TraceContext::parse("traceparent", &version, None)
            .unwrap_err()
            .to_string();
        assert!(
            text.len() < 300 && text.contains("version must be 00"),
            "{text}"
        );
        // short inputs are quoted whole
        assert_eq!(quote("abc"), "\"abc\"");
        assert_eq!(
            quote(&"é".repeat(40)),
            format!("{:?}... (80 bytes)", "é".repeat(32))
        );
    }

    /// Runs `f` with a subscriber that writes warnings to a buffer; the buffer's text.
    fn warnings_of(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_malformed_invocation_xray_header_is_dropped_with_one_warning() {
        let good = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let logs = warnings_of(|| {
            assert!(TraceContext::from_invocation_xray(good).is_some());
            // a root without a parent is no context, and not malformed
            assert_eq!(
                TraceContext::from_invocation_xray("Root=1-5759e988-bd862e3fe1be46a994272793"),
                None
            );
        });
        assert_eq!(logs, "");

        for (header, rule) in [
            ("", "Root is missing"),
            ("Parent=53995c3f42cd8ad8", "Root is missing"),
            (
                "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
                "Root must be 1-{8 hex}-{24 hex}",
            ),
            (
                "Root=1-5759e988-zz862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
                "Root must be 1-{8 hex}-{24 hex}",
            ),
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f",
                "Parent must be 16 hex digits",
            ),
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",
                "Parent must not be all zeros",
            ),
        ] {
            let logs = warnings_of(|| assert_eq!(TraceContext::from_invocation_xray(header), None));
            assert_eq!(logs.lines().count(), 1, "{header:?}: {logs}");
            assert!(
                logs.contains("WARN")
                    && logs.contains("ignored a malformed x-ray trace header")
                    && logs.contains(rule)
                    && logs.contains(&format!("{header:?}")),
                "{header:?}: {logs}"
            );
        }

        // a huge header is quoted to its first 64 bytes
        let huge = format!("Root={}", "Z".repeat(100_000));
        let logs = warnings_of(|| assert_eq!(TraceContext::from_invocation_xray(&huge), None));
        assert_eq!(logs.lines().count(), 1, "{logs}");
        assert!(logs.len() < 400, "{logs}");
        assert!(logs.contains("... (100005 bytes)"), "{logs}");
    }
}
