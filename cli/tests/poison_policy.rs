//! `outboxctl relay` with `OUTBOX_POISON_POLICY=quarantine-after=N` from the environment:
//! a bucket parked behind a message on a topic outside `OUTBOX_ALLOWED_TOPICS` goes on
//! after N attempts, the item is in the dead-letter partition, the relay logs it, and its
//! OpenTelemetry export counts it (`dekaf.outbox.poison.quarantined`, received by a small
//! OTLP/HTTP receiver, the testkit's). A bad value is refused at start, naming the variable.

use std::process::Command;

use dynamo_outbox::dead_letters::{self, Filter};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use outbox_testkit::otlp::OtlpReceiver;
use outbox_testkit::*;
use prost::Message as _;

/// Every metrics export the receiver got (not the publish spans, `/v1/traces`), decoded.
fn metrics_exports(receiver: &OtlpReceiver) -> Vec<ExportMetricsServiceRequest> {
    receiver
        .metrics_requests()
        .iter()
        .map(|r| ExportMetricsServiceRequest::decode(r.body.as_slice()).unwrap())
        .collect()
}

/// The value of the counter `name` in `request`, if it has one.
fn counter(request: &ExportMetricsServiceRequest, name: &str) -> Option<i64> {
    let m = request
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .find(|m| m.name == name)?;
    let metric::Data::Sum(sum) = m.data.as_ref()? else {
        return None;
    };
    match sum.data_points.first()?.value? {
        number_data_point::Value::AsInt(v) => Some(v),
        number_data_point::Value::AsDouble(v) => Some(v as i64),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn outboxctl_relay_quarantines_after_n_attempts_and_its_export_counts_it() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let topic = random_name("orders");
    create_topic(&topic, 1);
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let msg = |t: &str| writer.message(t).with_partition(0).with_key("k");
    let bad = msg("audit");
    let after = msg(&topic);
    let placed = writer.enqueue(&[bad.clone(), after.clone()]).await.unwrap();

    let receiver = OtlpReceiver::start();
    let endpoint = receiver.endpoint.clone();
    let out = tokio::task::spawn_blocking({
        let table = options.table_name.clone();
        let topic = topic.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_outboxctl"))
                .args(["relay", "--table", &table, "--bucket-count", "2"])
                .args(["--for", "8s"])
                .env("RUST_LOG", "info")
                .env("OUTBOX_POISON_POLICY", "quarantine-after=2")
                .env("OUTBOX_ALLOWED_TOPICS", &topic)
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
                .env("OTEL_METRIC_EXPORT_INTERVAL", "300")
                .env("OUTBOX_LEASE_DURATION", "3s")
                .env("OUTBOX_LEASE_RENEW_INTERVAL", "1s")
                .env("OUTBOX_POLL_INTERVAL", "100ms")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");

    // The bucket went on: the message behind the poison item is in Kafka, once.
    let delivered = topic_deliveries(&topic);
    delivered.assert_exactly_once(&id_set([&after]));
    // The poison item is a dead letter, moved by the relay after 2 attempts.
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let (dead, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].bucket, dead[0].sequence),
        (Some(0), Some(placed[0].sequence))
    );
    assert!(
        dead[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("after 2 attempt(s), quarantine-after=2"),
        "{:?}",
        dead[0].reason
    );
    assert!(log.contains("quarantined a poison item"), "{log}");
    assert_eq!(pending_messages(&client, &options).await, 0);
    // The export counted it: 0 at first (the series exists from the start), 1 at the end.
    let got = metrics_exports(&receiver);
    let values: Vec<i64> = got
        .iter()
        .filter_map(|r| counter(r, "dekaf.outbox.poison.quarantined"))
        .collect();
    assert_eq!(values.first(), Some(&0), "{values:?}");
    assert_eq!(values.last(), Some(&1), "{values:?}");
}

#[test]
fn a_bad_poison_policy_is_refused_at_start_naming_the_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args(["relay", "--table", "t-123", "--for", "1s"])
        .env("OUTBOX_POISON_POLICY", "quarantine-after=0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("OUTBOX_POISON_POLICY") && err.contains("quarantine-after=N"),
        "{err}"
    );
}
