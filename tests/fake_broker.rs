//! What only a fake broker can show (`outbox_testkit::fake_broker`), through the public
//! API: Amazon MSK IAM's SASL/OAUTHBEARER (only MSK verifies its token; the token's SigV4
//! signature is checked independently by the signer's own tests in `tests/msk_iam.rs`),
//! a SCRAM broker that does not know the password, and a broker that never answers.
//! SCRAM and PLAIN against a broker that checks them are in `kafka_auth.rs`, against the
//! stack's Apache Kafka. No local stack needed: the fakes run in the test.

use std::time::{Duration, SystemTime};

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD};
use base64::Engine as _;
use dynamo_outbox::publish::{KafkaAuth, KafkaConfig, KafkaPublisher, KafkaTls, SaslCredentials};
use dynamo_outbox::Error;
use outbox_testkit::fake_broker::{FakeBroker, FakeSasl, METADATA};

const ACCESS_KEY: &str = "AKIDEXAMPLE";
const SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const SESSION_TOKEN: &str = "IQoJb3JpZ2luX2Vj/session+token=";

/// MSK IAM in eu-west-1 with the SigV4 suite's example keys, to the fake (plaintext: the
/// fake speaks no TLS; MSK itself needs it).
fn msk_iam_config(broker: &FakeBroker) -> KafkaConfig {
    let credentials = Credentials::new(
        ACCESS_KEY,
        SECRET_KEY,
        Some(SESSION_TOKEN.into()),
        None,
        "test",
    );
    let mut config = KafkaConfig::new([broker.address.clone()])
        .with_msk_iam("eu-west-1")
        .with_credentials(SharedCredentialsProvider::new(credentials));
    config.tls = KafkaTls::Off;
    config.retry_budget = Duration::from_millis(300);
    config
}

/// `%XX` decoded (the token's query parameters).
fn percent_decode(s: &str) -> String {
    let mut out = Vec::new();
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex: String = bytes.by_ref().take(2).map(char::from).collect();
            out.push(u8::from_str_radix(&hex, 16).expect("a %XX escape"));
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).expect("UTF-8")
}

/// The UTC day of `t` as SigV4's credential scope writes it (`YYYYMMDD`).
fn sigv4_day(t: SystemTime) -> String {
    let days = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() / 86_400;
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}")
}

#[tokio::test]
async fn msk_iam_sends_its_presigned_token_as_the_oauthbearer_initial_response() {
    let broker = FakeBroker::start(FakeSasl::AcceptOauthBearer).await;
    let before = sigv4_day(SystemTime::now());
    let publisher = KafkaPublisher::connect(
        msk_iam_config(&broker),
        tokio::time::Instant::now() + Duration::from_secs(10),
    )
    .await
    .expect("connect through SASL/OAUTHBEARER");
    let after = sigv4_day(SystemTime::now());

    assert_eq!(broker.mechanisms()[0], "OAUTHBEARER");
    let sent = String::from_utf8(broker.auth_bytes()[0].clone()).unwrap();
    // RFC 7628's initial client response: gs2 header "n,,", then \x01-separated pairs
    let token = sent
        .strip_prefix("n,,\x01auth=Bearer ")
        .and_then(|rest| rest.strip_suffix("\x01\x01"))
        .unwrap_or_else(|| panic!("not an OAUTHBEARER initial response: {sent:?}"));
    // MSK's token: the presigned kafka-cluster:Connect URL, base64url without padding
    let url = String::from_utf8(URL_SAFE_NO_PAD.decode(token).expect("base64url")).unwrap();
    let query = url
        .strip_prefix("https://kafka.eu-west-1.amazonaws.com/?")
        .unwrap_or_else(|| panic!("not the region's kafka endpoint: {url}"));
    let params: Vec<(String, String)> = query
        .split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_owned(), percent_decode(v))
        })
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} missing from {url}"))
    };
    assert_eq!(params[0].0, "Action", "{url}");
    assert_eq!(param("Action"), "kafka-cluster:Connect");
    assert_eq!(param("X-Amz-Algorithm"), "AWS4-HMAC-SHA256");
    let credential = param("X-Amz-Credential");
    assert!(
        [&before, &after]
            .iter()
            .any(|day| credential
                == format!("{ACCESS_KEY}/{day}/eu-west-1/kafka-cluster/aws4_request")),
        "{credential}"
    );
    assert_eq!(param("X-Amz-Security-Token"), SESSION_TOKEN);
    let signature = param("X-Amz-Signature");
    assert!(
        signature.len() == 64 && signature.bytes().all(|b| b.is_ascii_hexdigit()),
        "{signature}"
    );
    // the client went on to use the authenticated connection
    assert_eq!(broker.after_auth().first(), Some(&METADATA));
    // the token and the secret key are in no Debug output
    let debug = format!("{publisher:?}");
    assert!(
        !debug.contains(token) && !debug.contains(SECRET_KEY) && !debug.contains(signature),
        "{debug}"
    );
}

#[tokio::test]
async fn refused_msk_iam_fails_the_connect_in_bounded_time_naming_the_permission() {
    let broker = FakeBroker::start(FakeSasl::RefuseOauthBearer).await;
    let started = tokio::time::Instant::now();
    let err = KafkaPublisher::connect(msk_iam_config(&broker), started + Duration::from_secs(10))
        .await
        .expect_err("the broker refused");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Kafka { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "kafka: the brokers refused SASL/OAUTHBEARER (MSK IAM) authentication: check the \
         role's kafka-cluster:Connect permission and the cluster's IAM access control"
    );
    assert!(!err.is_retryable());
    // a retry budget of 300 ms, and at least 100 ms between attempts: a handful of
    // exchanges, not a tight loop
    let attempts = broker.auth_bytes().len();
    assert!((1..=4).contains(&attempts), "{attempts} exchanges");
    assert!(broker.after_auth().is_empty());
}

#[tokio::test]
async fn the_client_refuses_a_scram_broker_whose_server_signature_is_forged() {
    let broker = FakeBroker::start(FakeSasl::ScramSha512ForgedServer).await;
    let mut config = KafkaConfig::new([broker.address.clone()]).with_sasl(
        KafkaAuth::ScramSha512,
        SaslCredentials::new("alice", "pw-5e1c"),
    );
    config.tls = KafkaTls::Off; // the fake speaks plaintext
    config.retry_budget = Duration::from_millis(300);
    let err = KafkaPublisher::connect(
        config,
        tokio::time::Instant::now() + Duration::from_secs(10),
    )
    .await
    .expect_err("a forged server signature");
    assert!(!err.is_retryable(), "{err:?}");
    assert!(!format!("{err:?}").contains("pw-5e1c"), "{err:?}");
    // the client sent its RFC 5802 messages, the fake claimed success, and the client hung
    // up instead of going on
    let sent = broker.auth_bytes();
    let first = String::from_utf8(sent[0].clone()).unwrap();
    assert!(first.starts_with("n,,n=alice,r="), "{first:?}");
    let last = String::from_utf8(sent[1].clone()).unwrap();
    assert!(
        last.starts_with("c=biws,r=") && last.contains(",p="),
        "{last:?}"
    );
    let proof = last.rsplit_once(",p=").unwrap().1;
    assert_eq!(B64.decode(proof).unwrap().len(), 64, "a SHA-512 proof");
    assert!(broker.accepted() >= 1);
    assert!(broker.after_auth().is_empty());
}

#[tokio::test]
async fn connect_gives_up_at_the_deadline() {
    // a listener that accepts and never answers
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let started = tokio::time::Instant::now();
    let err = KafkaPublisher::connect(
        KafkaConfig::new([address]),
        started + Duration::from_millis(500),
    )
    .await
    .expect_err("nobody answers");
    assert!(matches!(err, Error::DeadlineExceeded(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    keep.abort();
}

/// Connects with SCRAM-SHA-512 to a fake broker that answers `server_first` and
/// `server_final`; the connect's error, and how long it took.
async fn scram_with(
    server_first: &'static str,
    server_final: &'static str,
) -> (Error, Duration, FakeBroker) {
    let broker = FakeBroker::start(FakeSasl::ScramSha512Answers {
        server_first,
        server_final,
    })
    .await;
    let mut config = KafkaConfig::new([broker.address.clone()]).with_sasl(
        KafkaAuth::ScramSha512,
        SaslCredentials::new("alice", "pw-5e1c"),
    );
    config.tls = KafkaTls::Off; // the fake speaks plaintext
    config.retry_budget = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let err = KafkaPublisher::connect(
        config,
        tokio::time::Instant::now() + Duration::from_secs(10),
    )
    .await
    .expect_err("a broken SCRAM broker");
    (err, started.elapsed(), broker)
}

#[tokio::test]
async fn the_client_refuses_a_scram_iteration_count_above_kafkas_ceiling() {
    // 100 million PBKDF2-HMAC-SHA-512 rounds would hold the connecting thread for minutes,
    // past any deadline (the hashing never yields)
    let (err, took, broker) = scram_with("r={nonce},s=c2FsdHNhbHQ=,i=100000000", "e=other").await;
    assert_eq!(
        err.to_string(),
        "kafka: the SASL/SCRAM-SHA-512 exchange with the brokers was refused: the broker's \
         SCRAM server-first message has an iteration count i=100000000 above the ceiling of \
         16384 (Apache Kafka's own maximum)"
    );
    assert_eq!(rskafka_ceiling(), 16_384);
    assert!(!err.is_retryable());
    assert!(took < Duration::from_secs(5), "{took:?}");
    // no client-final message was sent: only client-first messages reached the broker
    assert!(broker
        .auth_bytes()
        .iter()
        .all(|sent| sent.starts_with(b"n,,n=alice,r=")));
    assert!(broker.after_auth().is_empty());
}

/// The ceiling the library documents (`docs/security.md`).
fn rskafka_ceiling() -> u32 {
    dynamo_outbox::publish::SCRAM_MAX_ITERATIONS
}

#[tokio::test]
async fn the_client_refuses_malformed_scram_server_messages_without_panicking() {
    for (server_first, server_final, rule) in [
        // short attributes made rsasl's parser index out of bounds
        (
            "r={nonce},s",
            "e=other",
            "server-first message has no salt (s=...)",
        ),
        (
            "r={nonce}",
            "e=other",
            "server-first message has no salt (s=...)",
        ),
        (
            "r={nonce},s=c2FsdA==",
            "e=other",
            "server-first message has no iteration count (i=...)",
        ),
        ("", "e=other", "server-first message has no nonce (r=...)"),
        (
            "r={nonce},s=c2F*dA==,i=4096",
            "e=other",
            "server-first message has a salt (s=) that is empty or not canonical base64",
        ),
        (
            "r={nonce},s=c2FsdA==,i=4k",
            "e=other",
            "has an iteration count (i=) that is not a decimal number",
        ),
        (
            "r={nonce},s=c2FsdA==,i=4096",
            "v",
            "server-final message has neither a verifier (v=...) nor an error (e=...)",
        ),
        (
            "r={nonce},s=c2FsdA==,i=4096",
            "",
            "server-final message has neither a verifier (v=...) nor an error (e=...)",
        ),
        (
            "r={nonce},s=c2FsdA==,i=4096",
            "v=%%%",
            "server-final message has a verifier (v=) that is empty or not canonical base64",
        ),
    ] {
        let (err, _, broker) = scram_with(server_first, server_final).await;
        let text = err.to_string();
        assert!(
            text.starts_with(
                "kafka: the SASL/SCRAM-SHA-512 exchange with the brokers was refused: the \
                 broker's SCRAM "
            ) && text.contains(rule),
            "{server_first:?} / {server_final:?}: {text}"
        );
        assert!(!err.is_retryable());
        assert!(!format!("{err:?}").contains("pw-5e1c"), "{err:?}");
        assert!(broker.after_auth().is_empty());
    }
}
