//! SASL with the stack's Apache Kafka, for real, and the credentials and TLS material
//! from AWS Secrets Manager.
//!
//! The broker's SASL_SSL listener (`OUTBOX_KAFKA_SASL_SSL`, the stack's CA in
//! `OUTBOX_KAFKA_TLS_DIR`) enables SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN and checks the
//! credentials itself; the principal `outbox` may write every topic. Each mechanism
//! publishes records that the independent client (confluent-kafka) reads back on the
//! PLAINTEXT listener; a wrong password is refused by the broker, and the connect gives up
//! within its retry budget with an error naming SASL and the variables to check.
//!
//! Secrets live in the stack's moto server (`AWS_ENDPOINT_URL_SECRETS_MANAGER`), named by
//! `KAFKA_SASL_SECRET_ARN`, `KAFKA_TLS_CA_SECRET_ARN` and `KAFKA_TLS_CLIENT_SECRET_ARN`,
//! read through `KafkaConfig::from_lookup` as the relay function and `outboxctl` read them.
//! MSK IAM, which only MSK verifies, is in `fake_broker.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_secretsmanager::primitives::Blob;
use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::publish::env;
use dynamo_outbox::publish::{KafkaAuth, KafkaConfig, KafkaPublisher, Publisher, SaslCredentials};
use dynamo_outbox::OutboxMessage;
use outbox_testkit::kafka::SecureListeners;
use outbox_testkit::{create_topic, random_name, read_topic, stack_var};
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
    assert_eq!(
        (config.auth, config.tls.is_on()),
        (KafkaAuth::ScramSha512, true)
    );
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
    let err = config_for("plain", missing)
        .sasl
        .unwrap()
        .resolve()
        .await
        .expect_err("no such secret");
    // the SDK's error stays the source: the code is in the chain, not in the text
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    let e = dynamo_outbox::error::chain(&err);
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
    let err = connect(config(missing)).await.expect_err("no such secret");
    let e = dynamo_outbox::error::chain(&err);
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

/// The publisher's configuration from these variables, as the relay reads its
/// environment: `KAFKA_AUTH=auth` to the SASL_SSL listener (or `bootstrap`), trusting the
/// stack's CA, with a retry budget of 2 s.
fn sasl_ssl_config(
    listeners: &SecureListeners,
    bootstrap: &str,
    auth: &str,
    credentials: &[(&str, &str)],
) -> KafkaConfig {
    let mut vars = vec![
        (env::BOOTSTRAP_SERVERS, bootstrap.to_owned()),
        (env::AUTH, auth.to_owned()),
        (env::TLS_CA_FILE, listeners.ca_file.display().to_string()),
    ];
    vars.extend(credentials.iter().map(|(k, v)| (*k, v.to_string())));
    let mut config = KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("a valid configuration");
    assert!(config.tls.is_on(), "SASL turns TLS on");
    config.retry_budget = RETRY_BUDGET;
    config
}

const RETRY_BUDGET: Duration = Duration::from_secs(2);
const DEADLINE: Duration = Duration::from_secs(30);

async fn connect(config: KafkaConfig) -> dynamo_outbox::Result<KafkaPublisher> {
    KafkaPublisher::connect(config, tokio::time::Instant::now() + DEADLINE).await
}

/// Publishes three messages to a fresh topic (created by the independent client) through
/// `publisher`, and checks that the independent reader reads them back: the values and
/// the message ids, in order.
async fn publish_and_read_back(publisher: &KafkaPublisher, label: &str) {
    let topic = random_name("sasl");
    let t = topic.clone();
    tokio::task::spawn_blocking(move || create_topic(&t, 1))
        .await
        .unwrap();
    let batch: Vec<StoredMessage> = (0..3)
        .map(|i| {
            StoredMessage::new(
                0,
                i + 1,
                OutboxMessage::new(&topic, 8)
                    .with_key(format!("k{i}"))
                    .with_value(format!("{label} {i}")),
            )
        })
        .collect();
    let outcome = publisher.publish(&batch).await;
    assert_eq!(outcome.acknowledged, 3, "{label}: {:?}", outcome.error);
    let read = tokio::task::spawn_blocking(move || read_topic(&topic))
        .await
        .unwrap();
    let values: Vec<Vec<u8>> = read.iter().filter_map(|r| r.value_bytes()).collect();
    assert_eq!(
        values,
        (0..3)
            .map(|i| format!("{label} {i}").into_bytes())
            .collect::<Vec<_>>(),
        "{label}"
    );
    let ids: Vec<String> = read.iter().filter_map(|r| r.message_id()).collect();
    let written: Vec<String> = batch
        .iter()
        .map(|m| m.message.message_id.to_string())
        .collect();
    assert_eq!(ids, written, "{label}");
}

/// `KAFKA_AUTH=auth` as `outbox` with its password from the environment variables:
/// connects, publishes, and the reader reads the records back.
async fn publishes_with(auth: &str) -> KafkaPublisher {
    let listeners = SecureListeners::from_stack();
    let config = sasl_ssl_config(
        &listeners,
        &listeners.sasl_ssl,
        auth,
        &[
            (env::SASL_USERNAME, &listeners.user),
            (env::SASL_PASSWORD, &listeners.password),
        ],
    );
    let publisher = connect(config)
        .await
        .unwrap_or_else(|e| panic!("{auth}: {e:#?}"));
    publish_and_read_back(&publisher, auth).await;
    publisher
}

#[tokio::test]
async fn scram_sha_512_publishes_and_the_password_is_in_no_log() {
    let _serial = SERIAL.lock().await;
    let listeners = SecureListeners::from_stack();
    // every log line of the connect and the publish at trace, through the binaries'
    // subscriber
    let logs = outbox_testkit::Captured::default();
    let guard = dynamo_outbox::logging::cli_subscriber(Some("trace"), logs.clone()).set_default();
    let publisher = publishes_with("scram-sha-512").await;
    drop(guard);
    let logs = logs.text();
    assert!(logs.contains("rskafka"), "no trace output captured: {logs}");
    let debug = format!("{publisher:?}");
    for text in [&logs, &debug] {
        assert!(
            !text.contains(&listeners.password),
            "the password in {text}"
        );
    }
}

#[tokio::test]
async fn scram_sha_256_publishes() {
    let _serial = SERIAL.lock().await;
    publishes_with("scram-sha-256").await;
}

#[tokio::test]
async fn plain_publishes_over_tls() {
    let _serial = SERIAL.lock().await;
    publishes_with("plain").await;
}

/// A byte-for-byte TCP relay in front of `upstream` that counts the connections it
/// accepts: each is one attempt of the client to reach the broker (TLS passes through
/// untouched; the broker's certificate names 127.0.0.1, the relay's address too).
struct CountingRelay {
    address: String,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingRelay {
    async fn start(upstream: &str) -> CountingRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (count, upstream) = (accepted.clone(), upstream.to_owned());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(mut broker) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                    }
                });
            }
        });
        CountingRelay {
            address,
            accepted,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_wrong_password_fails_the_connect_at_once_naming_sasl_and_the_variables() {
    let _serial = SERIAL.lock().await;
    let listeners = SecureListeners::from_stack();
    for (auth, mechanism) in [
        ("scram-sha-512", "SCRAM-SHA-512"),
        ("scram-sha-256", "SCRAM-SHA-256"),
        ("plain", "PLAIN"),
    ] {
        let relay = CountingRelay::start(&listeners.sasl_ssl).await;
        let config = sasl_ssl_config(
            &listeners,
            &relay.address,
            auth,
            &[
                (env::SASL_USERNAME, &listeners.user),
                (env::SASL_PASSWORD, "wrong-9d2e"),
            ],
        );
        let started = tokio::time::Instant::now();
        let err = connect(config)
            .await
            .expect_err("the broker refuses the password");
        let elapsed = started.elapsed();
        assert_eq!(
            err.to_string(),
            format!(
                "kafka: the brokers refused SASL/{mechanism} authentication as user \"{}\": \
                 check the username and password in KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD",
                listeners.user
            ),
            "{err:?}"
        );
        assert!(!err.is_retryable(), "{mechanism}");
        assert!(!format!("{err:?}").contains("wrong-9d2e"), "{err:?}");
        // Refused credentials end the connect: one connection, not retried within the
        // backoff (the same password would be refused again); the caller decides when
        // to try, with what it reads then.
        let attempts = relay.accepted();
        assert_eq!(
            attempts, 1,
            "{mechanism}: {attempts} connections in {elapsed:?}"
        );
        assert!(elapsed < DEADLINE, "{mechanism}: {elapsed:?}");
    }
}

#[tokio::test]
async fn credentials_from_a_secret_are_read_again_after_the_broker_refused_them() {
    let _serial = SERIAL.lock().await;
    let listeners = SecureListeners::from_stack();
    let client = secrets_manager().await;
    let secret = |password: &str| {
        serde_json::json!({"username": listeners.user, "password": password}).to_string()
    };
    // the secret still holds the password before a rotation
    let arn = create_secret(&client, &secret("before-rotation-4b7e")).await;
    let config = sasl_ssl_config(
        &listeners,
        &listeners.sasl_ssl,
        "scram-sha-512",
        &[(env::SASL_SECRET_ARN, &arn)],
    );
    let err = connect(config.clone())
        .await
        .expect_err("the broker refuses the old password");
    assert_eq!(
        err.to_string(),
        format!(
            "kafka: the brokers refused SASL/SCRAM-SHA-512 authentication: check the username \
             and password in the secret {arn} (KAFKA_SASL_SECRET_ARN)"
        )
    );
    assert!(!format!("{err:?}").contains("before-rotation"), "{err:?}");

    // rotated to the broker's password: the same configuration (a relay's next connect)
    // reads the secret again, connects and publishes
    client
        .put_secret_value()
        .secret_id(&arn)
        .secret_string(secret(&listeners.password))
        .send()
        .await
        .unwrap();
    let publisher = connect(config.clone())
        .await
        .expect("connect with the rotated secret");
    publish_and_read_back(&publisher, "from the secret").await;
    let debug = format!("{config:?} {publisher:?}");
    assert!(debug.contains(&arn), "{debug}");
    assert!(!debug.contains(&listeners.password), "{debug}");
}

#[tokio::test]
async fn a_mechanism_the_listener_does_not_enable_fails_the_connect_naming_kafka_auth() {
    let _serial = SERIAL.lock().await;
    let listeners = SecureListeners::from_stack();
    // MSK IAM (SASL/OAUTHBEARER) to a listener with SCRAM and PLAIN only; the token is
    // signed with the stack's dummy AWS credentials
    let config = sasl_ssl_config(
        &listeners,
        &listeners.sasl_ssl,
        "msk-iam",
        &[(env::REGION, "us-east-1")],
    );
    assert_eq!(config.auth, KafkaAuth::MskIam);
    let err = connect(config)
        .await
        .expect_err("OAUTHBEARER is not enabled");
    assert_eq!(
        err.to_string(),
        "kafka: the SASL/MSK-IAM exchange with the brokers failed (is KAFKA_AUTH=msk-iam \
         enabled on this listener?)",
        "{err:?}"
    );
    assert!(!err.is_retryable());
}
