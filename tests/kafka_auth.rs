//! SASL credentials and TLS material from AWS Secrets Manager, for real: secrets in the
//! stack's moto server (`AWS_ENDPOINT_URL_SECRETS_MANAGER`), named by
//! `KAFKA_SASL_SECRET_ARN`, `KAFKA_TLS_CA_SECRET_ARN` and `KAFKA_TLS_CLIENT_SECRET_ARN`,
//! read through `KafkaConfig::from_lookup` as the relay function and `outboxctl` read them.
//!
//! The SCRAM and PLAIN exchanges themselves are checked byte for byte against the library's
//! fake broker (`lib/src/publish/fake_broker.rs`): the local broker has no SASL.

use aws_sdk_secretsmanager::primitives::Blob;
use dynamo_outbox::publish::env;
use dynamo_outbox::publish::{KafkaAuth, KafkaConfig, SaslCredentials};
use outbox_testkit::{random_name, stack_var};
use tracing_subscriber::util::SubscriberInitExt as _;

/// One test at a time: the log capture below is a thread's default subscriber, and a
/// concurrent test without one can leave the SDK's callsites disabled for it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn secrets_manager() -> aws_sdk_secretsmanager::Client {
    stack_var("AWS_ENDPOINT_URL_SECRETS_MANAGER");
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    aws_sdk_secretsmanager::Client::new(&config)
}

/// A secret holding `text`; its ARN.
async fn create_secret(client: &aws_sdk_secretsmanager::Client, text: &str) -> String {
    client
        .create_secret()
        .name(random_name("AmazonMSK_outbox"))
        .secret_string(text)
        .send()
        .await
        .expect("create the secret in moto")
        .arn()
        .expect("moto returns the ARN")
        .to_owned()
}

fn config_for(auth: &str, secret: &str) -> KafkaConfig {
    let vars = [
        (env::BOOTSTRAP_SERVERS, "b-1.example:9096".to_owned()),
        (env::AUTH, auth.to_owned()),
        (env::SASL_SECRET_ARN, secret.to_owned()),
    ];
    KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("a valid configuration")
}

#[tokio::test]
async fn the_secret_is_read_once_per_process_and_again_after_forget() {
    let _serial = SERIAL.lock().await;
    let client = secrets_manager().await;
    // a marker that cannot occur by chance in a log line
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let arn = create_secret(
        &client,
        &format!(r#"{{"username":"outbox-relay","password":"{password}"}}"#),
    )
    .await;
    let config = config_for("scram-sha-512", &arn);
    assert_eq!((config.auth, config.tls), (KafkaAuth::ScramSha512, true));
    let sasl = config.sasl.clone().expect("credentials from the secret");

    // every log line of the read at trace, through the binaries' subscriber
    let logs = outbox_testkit::Captured::default();
    let guard = dynamo_outbox::logging::cli_subscriber(Some("trace"), logs.clone()).set_default();
    let read = sasl.resolve().await.expect("read the secret from moto");
    drop(guard);
    assert_eq!(read.username, "outbox-relay");
    assert_eq!(read.password.expose(), password);
    let logs = logs.text();
    // the operation's own target and the HTTP client's trace lines were captured
    assert!(
        logs.contains("aws_sdk_secretsmanager::operation::get_secret_value")
            && logs.contains("TRACE"),
        "no trace output of the read: {logs}"
    );
    assert!(!logs.contains(&password), "the password is in the logs");
    let debug = format!("{config:?} {sasl:?} {read:?}");
    assert!(!debug.contains(&password), "{debug}");

    // rotated: the configuration's clones keep what was read (one read per process) ...
    let rotated = format!("pw-{}", uuid::Uuid::new_v4().simple());
    client
        .put_secret_value()
        .secret_id(&arn)
        .secret_string(format!(
            r#"{{"username":"outbox-relay","password":"{rotated}"}}"#
        ))
        .send()
        .await
        .unwrap();
    let clone = config.clone().sasl.unwrap();
    assert_eq!(clone.resolve().await.unwrap().password.expose(), password);
    // ... a new process (a new configuration) reads the new value ...
    let fresh = config_for("scram-sha-512", &arn).sasl.unwrap();
    assert_eq!(fresh.resolve().await.unwrap().password.expose(), rotated);
    // ... and so does this one once the brokers refused the old one (the publisher forgets)
    clone.forget().await;
    assert_eq!(sasl.resolve().await.unwrap().password.expose(), rotated);
}

#[tokio::test]
async fn a_missing_or_malformed_secret_is_a_clear_error_without_its_contents() {
    let _serial = SERIAL.lock().await;
    let client = secrets_manager().await;
    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:AmazonMSK_missing-AbCdEf";
    let e = config_for("plain", missing)
        .sasl
        .unwrap()
        .resolve()
        .await
        .expect_err("no such secret")
        .to_string();
    assert!(
        e.starts_with(&format!(
            "misconfiguration: KAFKA_SASL_SECRET_ARN: reading the secret {missing} from AWS \
             Secrets Manager failed: "
        )) && e.contains("ResourceNotFoundException"),
        "{e}"
    );

    let arn = create_secret(&client, r#"{"user":"x","password":"hunter2-3f9c"}"#).await;
    let e = config_for("scram-sha-256", &arn)
        .sasl
        .unwrap()
        .resolve()
        .await
        .expect_err("no username")
        .to_string();
    assert_eq!(
        e,
        format!("misconfiguration: KAFKA_SASL_SECRET_ARN: the secret {arn} has no \"username\"")
    );

    let binary = client
        .create_secret()
        .name(random_name("AmazonMSK_binary"))
        .secret_binary(Blob::new(b"hunter2-3f9c".to_vec()))
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_owned();
    let e = SaslCredentials::secrets_manager(&binary)
        .resolve()
        .await
        .expect_err("a binary secret")
        .to_string();
    assert!(e.contains("has no secret string (a binary secret)"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
}

/// The TLS secrets (`KAFKA_TLS_CA_SECRET_ARN`, `KAFKA_TLS_CLIENT_SECRET_ARN`) are read at
/// the connect, before any broker is reached, through the same Secrets Manager client:
/// at `trace`, with the SDK's own lines captured, the private key appears in no log line;
/// a missing secret and a binary one are errors naming the variable and the secret.
#[tokio::test]
async fn the_tls_secrets_are_read_at_the_connect_and_the_key_is_in_no_log() {
    use dynamo_outbox::publish::KafkaPublisher;
    let _serial = SERIAL.lock().await;
    let client = secrets_manager().await;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["outbox-relay".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let key_pem = key.serialize_pem();
    let ca = create_secret(&client, &cert.pem()).await;
    let identity = create_secret(
        &client,
        &serde_json::json!({"certificate": cert.pem(), "privateKey": key_pem}).to_string(),
    )
    .await;
    let config = |client_secret: &str| {
        // nothing listens on port 1: the connect fails after the secrets were read
        let vars = [
            (env::BOOTSTRAP_SERVERS, "127.0.0.1:1".to_owned()),
            (env::AUTH, "mtls".to_owned()),
            (env::TLS_CA_SECRET_ARN, ca.clone()),
            (env::TLS_CLIENT_SECRET_ARN, client_secret.to_owned()),
        ];
        let mut c = KafkaConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        })
        .expect("a valid configuration");
        c.retry_budget = std::time::Duration::from_millis(200);
        c
    };
    let connect = |c: KafkaConfig| {
        KafkaPublisher::connect(
            c,
            tokio::time::Instant::now() + std::time::Duration::from_secs(20),
        )
    };

    let logs = outbox_testkit::Captured::default();
    let guard = dynamo_outbox::logging::cli_subscriber(Some("trace"), logs.clone()).set_default();
    let e = connect(config(&identity))
        .await
        .expect_err("nothing listens on port 1")
        .to_string();
    drop(guard);
    assert!(e.starts_with("kafka: connecting to the brokers"), "{e}");
    let logs = logs.text();
    assert!(
        logs.contains("aws_sdk_secretsmanager::operation::get_secret_value")
            && logs.contains("TRACE"),
        "no trace output of the reads: {logs}"
    );
    for line in key_pem.lines().filter(|l| !l.starts_with("-----")) {
        assert!(
            !logs.contains(line),
            "a line of the private key in the logs"
        );
    }
    assert!(!logs.contains("PRIVATE KEY"), "the private key in the logs");

    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kafka-client-AbCdEf";
    let e = connect(config(missing))
        .await
        .expect_err("no such secret")
        .to_string();
    assert!(
        e.starts_with(&format!(
            "misconfiguration: KAFKA_TLS_CLIENT_SECRET_ARN: reading the secret {missing} from \
             AWS Secrets Manager failed: "
        )) && e.contains("ResourceNotFoundException"),
        "{e}"
    );
    let binary = client
        .create_secret()
        .name(random_name("outbox_binary"))
        .secret_binary(Blob::new(key_pem.clone().into_bytes()))
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_owned();
    let e = connect(config(&binary))
        .await
        .expect_err("a binary secret")
        .to_string();
    assert_eq!(
        e,
        format!(
            "misconfiguration: KAFKA_TLS_CLIENT_SECRET_ARN: the secret {binary} has no secret \
             string (a binary secret); it must be a JSON object with \"certificate\" (the PEM \
             chain, leaf first) and \"privateKey\" (its PEM key)"
        )
    );
}
