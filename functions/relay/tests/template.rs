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

/// The lines of the top-level section `name` (`Parameters`, `Rules`, `Conditions`, ...).
fn section<'a>(template: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("{name}:");
    let mut lines = template.lines().skip_while(|l| l.trim_end() != header);
    assert!(lines.next().is_some(), "no section {name} in template.yaml");
    lines
        .take_while(|l| l.trim().is_empty() || indent(l) > 0)
        .collect()
}

/// The entry `name` of a section (a key indented by two spaces): the rest of its first
/// line and its indented lines, joined by newlines and trimmed.
fn entry(lines: &[&str], name: &str) -> String {
    let key = format!("  {name}:");
    let at = lines
        .iter()
        .position(|l| {
            l.strip_prefix(key.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
        })
        .unwrap_or_else(|| panic!("no entry {name}"));
    let mut text = vec![lines[at][key.len()..].trim()];
    text.extend(
        lines[at + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || indent(l) > 2)
            .map(|l| l.trim()),
    );
    text.join("\n").trim().to_owned()
}

/// The IAM statement `- Sid: {sid}` in `lines`: that line and the lines indented deeper.
fn statement(lines: &[&str], sid: &str) -> String {
    let at = lines
        .iter()
        .position(|l| l.trim() == format!("- Sid: {sid}"))
        .unwrap_or_else(|| panic!("no statement {sid}"));
    let own = indent(lines[at]);
    std::iter::once(lines[at])
        .chain(
            lines[at + 1..]
                .iter()
                .copied()
                .take_while(|l| indent(l) > own),
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of `key: value` on one of `lines` (the first such line), trimmed.
fn value<'a>(lines: &'a str, key: &str) -> &'a str {
    lines
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in\n{lines}"))
        .trim()
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
            // Only with the stream doorbell, on its stream only (see below).
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator",
            "dynamodb:ListStreams",
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
    // The only wildcards in an ARN: the topic pattern inside the cluster's topics and
    // ListStreams on the outbox table's own streams.
    for line in section(&t, "Resources") {
        let l = line.trim();
        if l.starts_with('#') {
            continue;
        }
        if l.contains("arn:") || l.contains(".Arn}") || l.contains("\"stream\"") {
            assert!(
                !l.contains('*')
                    || l.contains(":topic/${ClusterName}/${ClusterUuid}/${KafkaTopics}")
                    || l == "- !Sub \"${OutboxTable.Arn}/stream/*\""
                    || l == "- !Join [\"/\", [!Select [0, !Split [\"/stream/\", !Ref TableStreamArn]], \"stream\", \"*\"]]",
                "wildcard in an ARN: {l}"
            );
        }
    }
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
}

#[test]
fn the_schedule_is_every_minute_with_wake_on_schedule_and_every_5_minutes_with_the_stream() {
    let t = template();
    let parameters = section(&t, "Parameters");
    let wake_on = entry(&parameters, "WakeOn");
    assert!(wake_on.contains("Default: stream"), "{wake_on}");
    assert!(
        wake_on.contains("AllowedValues: [stream, schedule]"),
        "{wake_on}"
    );
    let rate = entry(&parameters, "ScheduleRate");
    assert_eq!(value(&rate, "Default"), "\"\"", "{rate}");
    let conditions = section(&t, "Conditions");
    assert_eq!(
        entry(&conditions, "WakeOnStream"),
        "!Equals [!Ref WakeOn, stream]"
    );
    assert_eq!(
        entry(&conditions, "HasScheduleRate"),
        "!Not [!Equals [!Ref ScheduleRate, \"\"]]"
    );
    // A given rate as given; else by mode: [WakeOnStream, stream's, schedule's].
    let relay = resource(&t, "RelayFunction")
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join("\n");
    let expression = relay
        .split_once("ScheduleExpression: ")
        .map(|(_, rest)| rest.lines().take(4).collect::<Vec<_>>())
        .expect("no ScheduleExpression");
    assert_eq!(
        expression,
        [
            "!If",
            "- HasScheduleRate",
            "- !Ref ScheduleRate",
            "- !If [WakeOnStream, rate(5 minutes), rate(1 minute)]"
        ]
    );
}

#[test]
fn the_relay_gets_its_idle_stop_from_relay_idle_stop_and_never_when_empty() {
    let t = template();
    let relay = resource(&t, "RelayFunction").join("\n");
    // Empty means never: the function's own default (5s) applies only when the variable
    // is unset, so the template sets "never" explicitly.
    assert_eq!(
        value(&relay, "OUTBOX_IDLE_STOP"),
        "!If [HasIdleStop, !Ref RelayIdleStop, never]"
    );
    assert_eq!(
        dynamo_outbox::options::parse_idle_stop("never").unwrap(),
        None
    );
    assert_eq!(
        entry(&section(&t, "Conditions"), "HasIdleStop"),
        "!Not [!Equals [!Ref RelayIdleStop, \"\"]]"
    );
    let parameter = entry(&section(&t, "Parameters"), "RelayIdleStop");
    let default = value(&parameter, "Default");
    assert_eq!(default, "5s");
    // The default is a duration the relay reads.
    assert_eq!(
        dynamo_outbox::options::parse_idle_stop(default).unwrap(),
        Some(std::time::Duration::from_secs(5))
    );
    assert!(parameter.contains("releases its leases"), "{parameter}");
}

#[test]
fn the_created_table_has_a_keys_only_stream_with_wake_on_stream_only() {
    let t = template();
    let table = resource(&t, "OutboxTable").join("\n");
    assert!(
        table.contains(
            "      StreamSpecification: !If\n        - WakeOnStream\n        - StreamViewType: KEYS_ONLY\n        - !Ref AWS::NoValue"
        ),
        "{table}"
    );
    assert_eq!(table.matches("StreamSpecification").count(), 1);
    assert_eq!(t.matches("StreamViewType:").count(), 1);
}

#[test]
fn an_existing_table_in_stream_mode_needs_its_stream_arn() {
    let t = template();
    let rules = section(&t, "Rules");
    let needs = entry(&rules, "ExistingTableStreamNeedsArn");
    for expected in [
        "RuleCondition: !And",
        "- !Equals [!Ref WakeOn, stream]",
        "- !Equals [!Ref UseExistingTable, \"true\"]",
        "- Assert: !Not [!Equals [!Ref TableStreamArn, \"\"]]",
        "AssertDescription: >-\nWakeOn=stream with UseExistingTable=true needs",
    ] {
        assert!(
            needs.contains(expected),
            "{expected:?} missing from\n{needs}"
        );
    }
    let own = entry(&rules, "CreatedTableUsesItsOwnStream");
    for expected in [
        "RuleCondition: !Equals [!Ref UseExistingTable, \"false\"]",
        "- Assert: !Equals [!Ref TableStreamArn, \"\"]",
    ] {
        assert!(own.contains(expected), "{expected:?} missing from\n{own}");
    }
    let parameter = entry(&section(&t, "Parameters"), "TableStreamArn");
    assert_eq!(value(&parameter, "Default"), "\"\"");
    assert!(
        value(&parameter, "AllowedPattern").contains(":table/[a-zA-Z0-9_.-]{3,255}/stream/"),
        "{parameter}"
    );
    // With the rules, the doorbell exists exactly in stream mode.
    assert_eq!(
        entry(&section(&t, "Conditions"), "Doorbell"),
        "!And\n- !Condition WakeOnStream\n- !Or [!Condition CreateTable, !Condition HasTableStreamArn]"
    );
}

#[test]
fn the_doorbell_maps_message_inserts_of_the_stream_to_the_relay() {
    let t = template();
    let mapping = resource(&t, "RelayDoorbell").join("\n");
    for expected in [
        "Type: AWS::Lambda::EventSourceMapping",
        "Condition: Doorbell",
        "FunctionName: !Ref RelayFunction",
        "EventSourceArn: !If\n        - HasTableStreamArn\n        - !Ref TableStreamArn\n        - !GetAtt OutboxTable.StreamArn",
        "StartingPosition: LATEST",
        // A doorbell is a hint: never retried, dropped when stale.
        "MaximumRetryAttempts: 0",
        "MaximumRecordAgeInSeconds: 60",
    ] {
        assert!(
            mapping.contains(expected),
            "{expected:?} missing from the mapping:\n{mapping}"
        );
    }
    let number = |key: &str| -> u32 { value(&mapping, key).parse().unwrap() };
    let batch = number("BatchSize");
    assert!((1..=10).contains(&batch), "BatchSize {batch}");
    // No batching window: it adds its length to every doorbell's latency (issue 10's
    // trickle goal, p50 <= 1.5 s, was missed with 1 s and met with 0 s).
    let window = number("MaximumBatchingWindowInSeconds");
    assert_eq!(window, 0, "MaximumBatchingWindowInSeconds {window}");

    // One filter: inserts whose partition key is a message partition of this outbox.
    assert_eq!(mapping.matches("- Pattern:").count(), 1, "{mapping}");
    let pattern = value(&mapping, "- Pattern");
    let pattern = pattern
        .strip_prefix("!Sub '")
        .and_then(|p| p.strip_suffix('\''))
        .unwrap_or_else(|| panic!("pattern is not a single-quoted !Sub: {pattern}"));
    let options = dynamo_outbox::OutboxOptions::new("t");
    let keys = dynamo_outbox::schema::Keys::new(&options);
    let pattern: serde_json::Value =
        serde_json::from_str(&pattern.replace("${KeyPrefix}", &keys.prefix)).unwrap();
    let prefix = format!("{}#MESSAGES#", keys.prefix);
    assert_eq!(
        pattern,
        serde_json::json!({
            "eventName": ["INSERT"],
            "dynamodb": {"Keys": {keys.pk.as_str(): {"S": [{"prefix": prefix}]}}}
        })
    );
    // The prefix is the library's message partition key, and only that.
    assert!(keys.message_pk(3).starts_with(&prefix));
    for other in [
        keys.sequence_pk(3),
        format!("{}#COORDINATION", keys.prefix),
        format!("{}#IDEMPOTENCY#k", keys.prefix),
        format!("{}#DEADLETTER", keys.prefix),
    ] {
        assert!(!other.starts_with(&prefix), "{other}");
    }
    // The template's table key is the attribute the pattern names.
    assert!(resource(&t, "OutboxTable").join("\n").contains(&format!(
        "- AttributeName: {}\n          KeyType: HASH",
        keys.pk
    )));
}

#[test]
fn the_relay_reads_the_doorbell_stream_only() {
    let t = template();
    let lines = resource(&t, "RelayFunction");
    let text = lines.join("\n");
    // Both statements only with the doorbell.
    let at = text.find("- Sid: OutboxTableStream\n").unwrap();
    let policy = &text[text[..at].rfind("- !If\n").unwrap()..];
    let mut policy_lines = policy.lines().map(str::trim);
    assert_eq!(policy_lines.nth(1), Some("- Doorbell"));
    assert!(
        policy.contains("          - !Ref AWS::NoValue"),
        "the stream policy is conditional"
    );

    let read = statement(&lines, "OutboxTableStream");
    assert_eq!(
        actions(&read.lines().collect::<Vec<_>>()),
        set(&[
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator"
        ])
    );
    let stream = "!If - HasTableStreamArn - !Ref TableStreamArn - !GetAtt OutboxTable.StreamArn";
    let flat = |text: &str, key: &str| -> String {
        let (_, rest) = text.split_once(&format!("{key}:")).unwrap();
        rest.lines()
            .take(4)
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(flat(&read, "Resource"), stream);
    // The mapping reads the same stream.
    let mapping = resource(&t, "RelayDoorbell").join("\n");
    assert_eq!(flat(&mapping, "EventSourceArn"), stream);

    let list = statement(&lines, "OutboxTableStreams");
    assert_eq!(
        actions(&list.lines().collect::<Vec<_>>()),
        set(&["dynamodb:ListStreams"])
    );
    let list_resource = list.split_once("Resource:").unwrap().1;
    for expected in [
        "- HasTableStreamArn",
        "!Split [\"/stream/\", !Ref TableStreamArn]",
        "- !Sub \"${OutboxTable.Arn}/stream/*\"",
    ] {
        assert!(list_resource.contains(expected), "{list_resource}");
    }
    // The stream actions appear nowhere else, and no managed policy or SAM event grants
    // stream reads on every stream.
    for action in [
        "DescribeStream",
        "GetRecords",
        "GetShardIterator",
        "ListStreams",
    ] {
        assert_eq!(
            t.matches(&format!("dynamodb:{action}")).count(),
            1,
            "{action}"
        );
    }
    let code: String = t
        .lines()
        .filter(|l| !l.trim().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    for absent in [
        "AWSLambdaDynamoDBExecutionRole",
        "DynamoDBStreamReadPolicy",
        "Type: DynamoDB",
        "Type: Stream",
    ] {
        assert!(!code.contains(absent), "template has {absent}");
    }
    assert_eq!(
        t.matches("Type: AWS::Lambda::EventSourceMapping").count(),
        1
    );
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
    // The stream (WakeOn=stream only) is checked below.
    for absent in [
        "TimeToLiveSpecification",
        "GlobalSecondaryIndexes",
        "LocalSecondaryIndexes",
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
