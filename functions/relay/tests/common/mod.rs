//! Helpers shared by the relay function's test suites: an invocation with a real deadline
//! in its context, and the function's settings for the local stack.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use dynamo_outbox::lambda::RelaySettings;
use dynamo_outbox::OutboxOptions;
use lambda_runtime::LambdaEvent;
use outbox_testkit::stack_var;
use serde_json::Value;

/// An invocation of the function `outbox-relay-test` with `payload`, whose context has
/// the request id and the deadline (Unix milliseconds) Lambda would send.
pub(crate) fn invocation(request_id: &str, deadline_ms: u64, payload: Value) -> LambdaEvent<Value> {
    outbox_testkit::lambda::invocation("outbox-relay-test", request_id, deadline_ms, payload)
}

/// The Unix milliseconds `time_left` from now.
pub(crate) fn in_ms(time_left: Duration) -> u64 {
    outbox_testkit::lambda::deadline_in(time_left)
}

/// The function's settings for the outbox `options` on the local stack (poll interval
/// 100 ms), then `defaults` of the suite, then `extra` of the test (later ones win).
pub(crate) fn settings(
    options: &OutboxOptions,
    defaults: &[(&str, &str)],
    extra: &[(&str, &str)],
) -> RelaySettings {
    let mut vars: HashMap<String, String> = HashMap::from([
        ("OUTBOX_TABLE_NAME".into(), options.table_name.clone()),
        (
            "OUTBOX_BUCKET_COUNT".into(),
            options.bucket_count.to_string(),
        ),
        (
            "KAFKA_BOOTSTRAP_SERVERS".into(),
            stack_var("KAFKA_BOOTSTRAP_SERVERS"),
        ),
        ("OUTBOX_POLL_INTERVAL".into(), "100ms".into()),
    ]);
    for (k, v) in defaults.iter().chain(extra) {
        vars.insert((*k).into(), (*v).into());
    }
    RelaySettings::from_lookup(|name| vars.get(name).cloned()).unwrap()
}

/// A topic of one partition on the stack's broker, reached through the harness's fault
/// proxy on one of the broker's proxy slots (so a test can refuse and pass the function's
/// Kafka connections).
pub(crate) struct ProxiedTopic {
    pub(crate) broker: outbox_harness::broker::ProxiedBroker,
    pub(crate) bootstrap: String,
    pub(crate) topic: String,
}

impl ProxiedTopic {
    /// Takes a proxy slot and creates a topic named after `prefix`.
    pub(crate) async fn start(prefix: &str) -> Self {
        let broker = outbox_harness::broker::ProxiedBroker::start()
            .await
            .expect("the stack's broker behind the fault proxy");
        let bootstrap = broker.bootstrap();
        let topic = outbox_testkit::random_name(prefix);
        outbox_harness::kafka_py(&[
            "--bootstrap",
            &bootstrap,
            "create-topic",
            &topic,
            "--partitions",
            "1",
        ])
        .unwrap();
        ProxiedTopic {
            broker,
            bootstrap,
            topic,
        }
    }

    /// Every record of the topic, read with confluent-kafka.
    pub(crate) fn records(&self) -> Vec<outbox_testkit::ReadRecord> {
        let out = outbox_harness::kafka_py(&["--bootstrap", &self.bootstrap, "read", &self.topic])
            .unwrap();
        outbox_testkit::parse_records(&out).unwrap()
    }
}
