//! Logs without secrets, at any level: the one place the binaries (both functions and
//! `outboxctl`) build their log subscriber.
//!
//! Whatever `RUST_LOG` (or, in Lambda, `AWS_LAMBDA_LOG_LEVEL`) says, `trace` included,
//! the AWS SDK's signing and credential internals never reach the output: every event
//! and span of a target in [`CAPPED_TARGETS`] more verbose than its cap is dropped by
//! [`secrets_filter`], a filter of its own on top of the directives, so that no directive
//! (not even `aws_sigv4::http_request=trace`) can turn them back on. What they print
//! there (measured with planted credentials, RUST_LOG=trace, against the local stack and
//! with an MSK IAM token signed):
//!
//! - `aws_sigv4` (trace): `signing request` with the signing parameters and the
//!   identity (the access key id), and the canonical request, whose query string for a
//!   presigned request (the MSK IAM token) carries `X-Amz-Credential` and
//!   `X-Amz-Security-Token` (the session token) in clear;
//! - `aws_smithy_runtime::client::orchestrator` (trace): `resolved identity` (in
//!   `::auth`) and the runtime components with the identity cache's credentials;
//! - the credential providers and caches (`aws_config`, `aws_credential_types`,
//!   `aws_smithy_runtime::client::identity`) and the shared config and credentials files'
//!   parser (`aws_runtime::env_config`), capped at `debug` as well: their trace output is
//!   what they resolved, read or cached.
//!
//! The project's own `Debug` of every configuration holds no secret either:
//! `KafkaConfig` shows `credentials: <provided>`, `MskIamTokenProvider` neither the token
//! nor the credentials, the options and settings hold none.

use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::{filter_fn, FilterFn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Targets (a module path and everything under it) whose more verbose levels print
/// signing material or credentials, with the most verbose level each may log at.
pub const CAPPED_TARGETS: &[(&str, Level)] = &[
    ("aws_sigv4", Level::INFO),
    ("aws_smithy_runtime::client::orchestrator", Level::DEBUG),
    ("aws_smithy_runtime::client::identity", Level::DEBUG),
    ("aws_smithy_runtime_api::client::identity", Level::DEBUG),
    ("aws_credential_types", Level::DEBUG),
    ("aws_config", Level::DEBUG),
    ("aws_runtime::env_config", Level::DEBUG),
];

/// `outboxctl`'s directives when `RUST_LOG` is unset or invalid.
pub const CLI_DEFAULT_DIRECTIVES: &str = "info,aws=warn,rskafka=warn";

/// Whether an event or span of `target` at `level` may reach the output (see
/// [`CAPPED_TARGETS`]).
pub fn allowed(target: &str, level: &Level) -> bool {
    CAPPED_TARGETS
        .iter()
        .filter(|(prefix, _)| {
            target
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
        .all(|(_, cap)| level <= cap)
}

fn allowed_metadata(metadata: &Metadata<'_>) -> bool {
    allowed(metadata.target(), metadata.level())
}

/// The filter every binary's subscriber carries on top of its directives: drops what
/// [`allowed`] refuses.
pub fn secrets_filter() -> FilterFn<fn(&Metadata<'_>) -> bool> {
    filter_fn(allowed_metadata as fn(&Metadata<'_>) -> bool)
}

/// `outboxctl`'s directives: `rust_log` (`RUST_LOG`), or [`CLI_DEFAULT_DIRECTIVES`]
/// when it is unset or invalid.
pub fn cli_env_filter(rust_log: Option<&str>) -> EnvFilter {
    rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new(CLI_DEFAULT_DIRECTIVES))
}

/// `outboxctl`'s subscriber: text lines to `writer`, filtered by [`cli_env_filter`] and
/// [`secrets_filter`].
pub fn cli_subscriber<W>(rust_log: Option<&str>, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(cli_env_filter(rust_log))
        .with_writer(writer)
        .finish()
        .with(secrets_filter())
}

/// Installs [`cli_subscriber`] for `RUST_LOG`, writing to stderr.
pub fn init_cli() {
    let rust_log = std::env::var("RUST_LOG").ok();
    cli_subscriber(rust_log.as_deref(), std::io::stderr).init();
}

/// The functions' directives, as `lambda_runtime`'s default subscriber reads them: the
/// level of `AWS_LAMBDA_LOG_LEVEL` (Lambda's advanced logging controls), else of
/// `RUST_LOG`, else `INFO`, as the default directive, and `RUST_LOG`'s directives
/// (invalid ones ignored), both read through `lookup`.
#[cfg(feature = "lambda")]
pub fn lambda_env_filter(lookup: impl Fn(&str) -> Option<String>) -> EnvFilter {
    use std::str::FromStr;
    use tracing::level_filters::LevelFilter;

    let rust_log = lookup("RUST_LOG");
    let level = lookup("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|| rust_log.clone())
        .and_then(|l| LevelFilter::from_str(&l).ok())
        .unwrap_or(LevelFilter::INFO);
    EnvFilter::builder()
        .with_default_directive(level.into())
        .parse_lossy(rust_log.unwrap_or_default())
}

/// A function's subscriber, as `lambda_runtime::tracing::init_default_subscriber` builds
/// it (JSON lines when `AWS_LAMBDA_LOG_FORMAT` is `JSON`, the function's `LoggingConfig`;
/// no target, no time), with [`lambda_env_filter`] and [`secrets_filter`]; the variables
/// are read through `lookup`.
#[cfg(feature = "lambda")]
pub fn lambda_subscriber<W>(
    lookup: impl Fn(&str) -> Option<String>,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let json = lookup("AWS_LAMBDA_LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_env_filter(lambda_env_filter(&lookup))
        .with_writer(writer);
    if json {
        Box::new(builder.json().finish().with(secrets_filter()))
    } else {
        Box::new(builder.finish().with(secrets_filter()))
    }
}

/// Installs [`lambda_subscriber`] for the process environment, writing to stdout (where
/// Lambda reads the function's logs); call it first thing in `main`.
#[cfg(feature = "lambda")]
pub fn init_lambda() {
    lambda_subscriber(|name| std::env::var(name).ok(), std::io::stdout).init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_for_a_target_and_everything_under_it_only() {
        assert!(!allowed("aws_sigv4", &Level::DEBUG));
        assert!(!allowed("aws_sigv4::http_request::sign", &Level::TRACE));
        assert!(allowed("aws_sigv4::http_request::sign", &Level::INFO));
        assert!(!allowed(
            "aws_smithy_runtime::client::orchestrator::auth",
            &Level::TRACE
        ));
        assert!(allowed(
            "aws_smithy_runtime::client::orchestrator",
            &Level::DEBUG
        ));
        // Another crate that merely starts with the same letters, and the rest of the SDK.
        assert!(allowed("aws_sigv4x", &Level::TRACE));
        assert!(allowed(
            "aws_smithy_runtime::client::retries",
            &Level::TRACE
        ));
        assert!(allowed("dynamo_outbox::relay", &Level::TRACE));
    }

    // What the filter keeps out of the binaries' subscribers, measured by signing an MSK
    // IAM token at trace, and what the configurations' Debug shows: `tests/logging.rs`.
}
