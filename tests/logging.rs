//! The binaries' log subscribers on the public API ([`dynamo_outbox::logging`]): whatever
//! the directives, the AWS SDK's signing internals never reach the output (signing an MSK
//! IAM token at trace prints the session token without the filter), and the
//! configurations' `Debug` holds no secret. No stack needed.

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use dynamo_outbox::logging::{cli_subscriber, lambda_subscriber};
use dynamo_outbox::publish::{KafkaConfig, MskIamTokenProvider};
use dynamo_outbox::{OutboxOptions, RelayOptions};
use outbox_testkit::Captured;
use tracing::Subscriber;

/// Example credentials with random markers, to look for in the output.
fn planted() -> (String, String, String) {
    let marker = |what: &str| format!("{what}{}", uuid::Uuid::new_v4().simple());
    (marker("AKIA"), marker("secret"), marker("token"))
}

/// What signing an MSK IAM token with `credentials` logs through `subscriber`.
fn sign_under(subscriber: impl Subscriber + Send + Sync, credentials: &Credentials) {
    let provider = MskIamTokenProvider::new(
        "us-east-1",
        SharedCredentialsProvider::new(credentials.clone()),
    );
    tracing::subscriber::with_default(subscriber, || {
        futures::executor::block_on(provider.token()).unwrap();
    });
}

#[test]
fn a_presigned_msk_iam_token_leaks_at_trace_unless_filtered() {
    let (key, secret, token) = planted();
    let credentials = Credentials::new(&key, &secret, Some(token.clone()), None, "test");

    // Without the filter, the SDK prints the session token at trace (the canonical
    // request of a presigned URL has it in its query string).
    let unfiltered = Captured::default();
    let writer = unfiltered.clone();
    sign_under(
        tracing_subscriber::fmt()
            .with_env_filter("trace")
            .with_writer(move || writer.clone())
            .finish(),
        &credentials,
    );
    let text = unfiltered.text();
    assert!(text.contains(&token) && text.contains(&key), "{text}");

    // Every subscriber of the binaries, at trace, even when a directive names the
    // signing module itself.
    for directives in ["trace", "trace,aws_sigv4::http_request=trace"] {
        let out = Captured::default();
        let writer = out.clone();
        sign_under(
            cli_subscriber(Some(directives), move || writer.clone()),
            &credentials,
        );
        for format in ["JSON", "Text"] {
            let writer = out.clone();
            let vars = [
                ("RUST_LOG", directives),
                ("AWS_LAMBDA_LOG_LEVEL", "TRACE"),
                ("AWS_LAMBDA_LOG_FORMAT", format),
            ];
            let lookup = |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            };
            sign_under(
                lambda_subscriber(lookup, move || writer.clone()),
                &credentials,
            );
        }
        let text = out.text();
        for planted in [&key, &secret, &token] {
            assert!(!text.contains(planted.as_str()), "{directives}: {text}");
        }
    }
}

#[test]
fn the_project_configs_debug_holds_no_secret() {
    let (key, secret, token) = planted();
    let credentials = SharedCredentialsProvider::new(Credentials::new(
        &key,
        &secret,
        Some(token.clone()),
        None,
        "test",
    ));
    let kafka = KafkaConfig::new(["b-1:9098"]).with_credentials(credentials.clone());
    let provider = MskIamTokenProvider::new("us-east-1", credentials);
    let outbox = OutboxOptions::new("orders-outbox");
    let relay = RelayOptions::default();
    let text = format!("{kafka:?} {provider:?} {outbox:?} {relay:?}");
    for planted in [&key, &secret, &token] {
        assert!(!text.contains(planted.as_str()), "{text}");
    }
}
