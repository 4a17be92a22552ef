//! Checks of the SAM template (template.yaml at the workspace root), read as text: the
//! template uses CloudFormation's short tags (`!Ref`, `!If`, ...), so this reads its lines
//! instead of parsing YAML. `cfn-lint` and `sam validate --lint` check the rest.

use std::collections::BTreeSet;

/// The workspace root, read when the test runs (`cargo test` sets `CARGO_MANIFEST_DIR`):
/// a path baked in at compile time would name whichever clone last built this binary in
/// a shared target directory.
fn root() -> std::path::PathBuf {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
    std::path::Path::new(&manifest).join("../..")
}

fn template() -> String {
    std::fs::read_to_string(root().join("template.yaml")).expect("read template.yaml")
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The lines of the resource `name` (a key indented by two spaces under `Resources:`).
fn resource<'a>(template: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("  {name}:");
    let mut lines = template.lines().skip_while(|l| l.trim_end() != header);
    assert!(
        lines.next().is_some(),
        "resource {name} not in template.yaml"
    );
    lines
        .take_while(|l| l.trim().is_empty() || indent(l) > 2)
        .collect()
}

/// Every IAM action in `lines`: `Action: x`, `Action: [x, y]` or a list under `Action:`.
fn actions(lines: &[&str]) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut list_indent = None;
    for line in lines {
        let trimmed = line.trim();
        if let Some(at) = list_indent {
            // The list may be indented more than `Action:` or as much (YAML allows both).
            if indent(line) >= at && trimmed.starts_with("- ") {
                found.insert(unquote(&trimmed[2..]));
                continue;
            }
            list_indent = None;
        }
        if let Some(rest) = trimmed.strip_prefix("Action:") {
            let rest = rest.trim();
            if rest.is_empty() {
                list_indent = Some(indent(line));
            } else {
                let rest = rest.trim_start_matches('[').trim_end_matches(']');
                found.extend(rest.split(',').map(unquote));
            }
        }
    }
    found
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('"').trim_matches('\'').to_owned()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_action_reader_sees_every_form() {
    let lines = [
        "      Action:",
        "        - dynamodb:Query",
        "        - \"dynamodb:*\"",
        "      Resource: x",
        "      Action: [events:PutEvents, 's3:Get*']",
        "      Action: kafka-cluster:*",
        "      Action:",
        "      - sqs:SendMessage",
    ];
    assert_eq!(
        actions(&lines),
        set(&[
            "dynamodb:*",
            "dynamodb:Query",
            "events:PutEvents",
            "kafka-cluster:*",
            "s3:Get*",
            "sqs:SendMessage"
        ])
    );
}

#[test]
fn the_relay_gets_exactly_its_actions() {
    let t = template();
    assert_eq!(
        actions(&resource(&t, "RelayFunction")),
        set(&[
            "dynamodb:BatchWriteItem",
            "dynamodb:DeleteItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            "kafka-cluster:Connect",
            "kafka-cluster:DescribeCluster",
            "kafka-cluster:DescribeTopic",
            "kafka-cluster:WriteData",
        ])
    );
}

#[test]
fn the_enqueue_function_gets_exactly_its_actions() {
    let t = template();
    assert_eq!(
        actions(&resource(&t, "EnqueueFunction")),
        set(&[
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "events:PutEvents"
        ])
    );
    // events:PutEvents only when an event bus is configured, and only on that bus.
    let lines = resource(&t, "EnqueueFunction");
    let text = lines.join("\n");
    let at = text.find("events:PutEvents").unwrap();
    assert!(
        text[..at].contains("- HasEventBus"),
        "PutEvents is conditional"
    );
    assert!(text[at..].contains("event-bus/${EventBusName}"));
}

#[test]
fn no_wildcard_actions_or_tables() {
    let t = template();
    let all = actions(&t.lines().collect::<Vec<_>>());
    assert!(!all.is_empty());
    for a in &all {
        assert!(!a.contains('*'), "wildcard action {a}");
        assert!(a.contains(':'), "action without a service prefix: {a}");
    }
    for line in t.lines() {
        let l = line.trim();
        assert!(!l.contains("table/*"), "wildcard table: {l}");
        assert!(
            !l.contains(":table/${TableName}/"),
            "index or stream ARN: {l}"
        );
        if let Some(r) = l.strip_prefix("Resource:") {
            assert_ne!(unquote(r), "*", "wildcard resource: {l}");
        }
    }
    // Topic patterns are the only wildcard resource, and only inside the cluster's topics.
    assert!(t.contains(":topic/${ClusterName}/${ClusterUuid}/${KafkaTopics}"));
}

#[test]
fn functions_build_with_cargo_lambda_on_provided_al2023() {
    let t = template();
    for (name, package) in [
        ("RelayFunction", "outbox-relay-function"),
        ("EnqueueFunction", "outbox-enqueue-function"),
    ] {
        let text = resource(&t, name).join("\n");
        assert!(text.contains("BuildMethod: rust-cargolambda"), "{name}");
        assert!(text.contains(&format!("Binary: {package}")), "{name}");
        let code_uri = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("CodeUri: "))
            .unwrap_or_else(|| panic!("{name} has no CodeUri"));
        let manifest = std::fs::read_to_string(root().join(code_uri).join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{package}\"")),
            "{code_uri} builds {package}"
        );
    }
    let globals: String = t
        .lines()
        .skip_while(|l| *l != "Globals:")
        .take_while(|l| *l != "Resources:")
        .collect::<Vec<_>>()
        .join("\n");
    for expected in [
        "Runtime: provided.al2023",
        "Handler: bootstrap",
        "- !Ref Architecture",
        "LogFormat: JSON",
    ] {
        assert!(globals.contains(expected), "Globals lack {expected}");
    }
    let parameters: String = t
        .lines()
        .skip_while(|l| *l != "Parameters:")
        .take_while(|l| *l != "Rules:")
        .collect::<Vec<_>>()
        .join("\n");
    assert!(parameters.contains("  Architecture:\n    Type: String\n    Default: arm64"));
}

#[test]
fn the_relay_runs_on_a_schedule_that_does_not_pile_up() {
    let t = template();
    let relay = resource(&t, "RelayFunction").join("\n");
    for expected in [
        "Type: ScheduleV2",
        "ScheduleExpression: !Ref ScheduleRate",
        "OmitName: true",
        "EventInvokeConfig:",
        "MaximumRetryAttempts: 0",
        "VpcConfig:",
        "Timeout: !Ref RelayTimeout",
        "OUTBOX_SHUTDOWN_MARGIN: 3s",
        "ReservedConcurrentExecutions: !Ref RelayReservedConcurrency",
    ] {
        assert!(relay.contains(expected), "RelayFunction lacks {expected}");
    }
    assert!(t.contains("Default: rate(1 minute)"));
}

#[test]
fn the_table_is_the_specifications() {
    let t = template();
    let table = resource(&t, "OutboxTable").join("\n");
    for expected in [
        "Type: AWS::DynamoDB::Table",
        "Condition: CreateTable",
        "BillingMode: PAY_PER_REQUEST",
        "- AttributeName: PK\n          AttributeType: S",
        "- AttributeName: SK\n          AttributeType: S",
        "- AttributeName: PK\n          KeyType: HASH",
        "- AttributeName: SK\n          KeyType: RANGE",
    ] {
        assert!(table.contains(expected), "OutboxTable lacks {expected}");
    }
    for absent in [
        "TimeToLiveSpecification",
        "GlobalSecondaryIndexes",
        "LocalSecondaryIndexes",
        "StreamSpecification",
        "ProvisionedThroughput",
    ] {
        assert!(!table.contains(absent), "OutboxTable has {absent}");
    }
    for output in [
        "RelayFunctionArn:",
        "EnqueueFunctionArn:",
        "OutboxTableName:",
    ] {
        assert!(t.contains(&format!("\n  {output}")), "no output {output}");
    }
}

#[test]
fn commit_notifications_invoke_the_relay_only_when_a_bus_is_configured() {
    let t = template();
    let rule = resource(&t, "CommitNotificationRule").join("\n");
    for needle in [
        "Condition: HasEventBus",
        "EventBusName: !Ref EventBusName",
        // The library's notification::SOURCE and DETAIL_TYPE.
        "source: [dynamo-outbox]",
        "detail-type: [OutboxCommitted]",
        "key_prefix: [!Ref KeyPrefix]",
        "Arn: !GetAtt RelayFunction.Arn",
        "MaximumRetryAttempts: 0",
    ] {
        assert!(
            rule.contains(needle),
            "{needle:?} missing from the rule:\n{rule}"
        );
    }
    assert_eq!(dynamo_outbox::notification::SOURCE, "dynamo-outbox");
    assert_eq!(dynamo_outbox::notification::DETAIL_TYPE, "OutboxCommitted");
    let permission = resource(&t, "CommitNotificationPermission").join("\n");
    for needle in [
        "Condition: HasEventBus",
        "Principal: events.amazonaws.com",
        "SourceArn: !GetAtt CommitNotificationRule.Arn",
        "FunctionName: !Ref RelayFunction",
    ] {
        assert!(
            permission.contains(needle),
            "{needle:?} missing from the permission:\n{permission}"
        );
    }
    let enqueue = resource(&t, "EnqueueFunction").join("\n");
    assert!(
        enqueue.contains(
            "OUTBOX_NOTIFY_EVENT_BUS: !If [HasEventBus, !Ref EventBusName, !Ref AWS::NoValue]"
        ),
        "{enqueue}"
    );
}
