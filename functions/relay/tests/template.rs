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
        actions(&resource(&t, "RelayFunctionRole")),
        set(&[
            // The trust policy: Lambda assumes the role.
            "sts:AssumeRole",
            "dynamodb:BatchWriteItem",
            "dynamodb:DeleteItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            // Dead letters (the move of an unpublishable record or a poison head) and, with
            // the doorbell, continuations; each on its own partition (e2e/test_template.py).
            "dynamodb:PutItem",
            // The move's check of the bucket's lease item.
            "dynamodb:ConditionCheckItem",
            "kafka-cluster:Connect",
            "kafka-cluster:DescribeCluster",
            "kafka-cluster:DescribeTopic",
            "kafka-cluster:WriteData",
            // Only with named Kafka secrets (and their key), on them only
            // (e2e/test_template.py checks each setup).
            "secretsmanager:GetSecretValue",
            "kms:Decrypt",
            // Only with TableKmsKeyArn, through DynamoDB.
            "kms:Encrypt",
            "kms:GenerateDataKey",
            // Only with the stream doorbell, on its stream only (see below).
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator",
            "dynamodb:ListStreams",
            // Only with Delivery=exactly-once: the table's ARN, the conditional deletes, and
            // with MskClusterArn the transactional ids, groups and watermark topic (see
            // below).
            "dynamodb:DescribeTable",
            "dynamodb:PartiQLDelete",
            "kafka-cluster:DescribeTransactionalId",
            "kafka-cluster:AlterTransactionalId",
            "kafka-cluster:DescribeGroup",
            "kafka-cluster:AlterGroup",
            "kafka-cluster:ReadData",
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
            "events:PutEvents",
            // Only with TableKmsKeyArn, through DynamoDB (e2e/test_template.py).
            "kms:Decrypt",
            "kms:Encrypt",
            "kms:GenerateDataKey",
        ])
    );
    // events:PutEvents only when commits are notified over a bus (an event bus is
    // configured, and the stream's doorbell does not wake the relay already), and only on
    // that bus.
    let lines = resource(&t, "EnqueueFunction");
    let text = lines.join("\n");
    let at = text.find("events:PutEvents").unwrap();
    assert!(
        text[..at].contains("- NotifyOnCommit"),
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
    // The only wildcards in an ARN: ListStreams on the outbox table's own streams (topic
    // patterns come from KafkaTopics, checked below).
    for line in section(&t, "Resources") {
        let l = line.trim();
        if l.starts_with('#') {
            continue;
        }
        if l.contains("arn:") || l.contains(".Arn}") || l.contains("\"stream\"") {
            assert!(
                !l.contains('*')
                    || l == "- !Sub \"${OutboxTable.Arn}/stream/*\""
                    || l == "- !Join [\"/\", [!Select [0, !Split [\"/stream/\", !Ref TableStreamArn]], \"stream\", \"*\"]]",
                "wildcard in an ARN: {l}"
            );
        }
    }
}

#[test]
fn functions_build_with_cargo_lambda_on_provided_al2023() {
    let t = template();
    for (name, member, package) in [
        ("RelayFunction", "functions/relay", "outbox-relay-function"),
        (
            "EnqueueFunction",
            "functions/enqueue",
            "outbox-enqueue-function",
        ),
    ] {
        let text = resource(&t, name).join("\n");
        assert!(text.contains("BuildMethod: rust-cargolambda"), "{name}");
        // Binary selects the executable (cargo lambda build --bin) among the workspace's.
        assert!(text.contains(&format!("Binary: {package}")), "{name}");
        let manifest = std::fs::read_to_string(root().join(member).join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{package}\"")),
            "{member} builds {package}"
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
        "Architectures:\n      - arm64\n",
        "LogFormat: JSON",
    ] {
        assert!(globals.contains(expected), "Globals lack {expected}");
    }
    // The machine type is no parameter: a deploy-time answer (sam deploy --guided saves
    // its answers where sam build does not read them) could pair an x86_64 function with
    // the arm64 executable sam build made. scripts/sam_build_check.sh checks the built
    // templates.
    assert!(
        !t.contains("Ref Architecture") && !t.contains("\n  Architecture:\n"),
        "the architecture is a literal of the Globals, not a parameter"
    );
}

/// Both functions build from the workspace root (cargo-lambda builds the workspace in
/// place). SAM's build cache would key on a checksum of that whole directory, target/
/// and .git included, which the build itself changes: samconfig.toml turns it off and
/// cargo's incremental build is the cache (scripts/sam_build_check.sh builds twice).
#[test]
fn both_functions_build_from_the_workspace_root_with_cargo_as_the_build_cache() {
    let t = template();
    for name in ["RelayFunction", "EnqueueFunction"] {
        let text = resource(&t, name).join("\n");
        let code_uri = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("CodeUri: "))
            .unwrap_or_else(|| panic!("{name} has no CodeUri"));
        assert_eq!(code_uri, ".", "{name}: CodeUri is the workspace root");
        let dir = root().join(code_uri);
        for inside in ["Cargo.lock", "Cargo.toml", "lib/src/lib.rs", "functions"] {
            assert!(dir.join(inside).exists(), "{name}: CodeUri holds {inside}");
        }
    }
    let samconfig = std::fs::read_to_string(root().join("samconfig.toml")).unwrap();
    assert!(samconfig.contains("\ncached = false\n"), "{samconfig}");
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
fn the_relay_compresses_as_kafka_compression_says_and_every_allowed_value_parses() {
    use dynamo_outbox::publish::KafkaCompression;
    let t = template();
    let relay = resource(&t, "RelayFunction").join("\n");
    assert_eq!(value(&relay, "KAFKA_COMPRESSION"), "!Ref KafkaCompression");
    let parameter = entry(&section(&t, "Parameters"), "KafkaCompression");
    assert_eq!(value(&parameter, "Default"), "none");
    assert_eq!(
        value(&parameter, "AllowedValues"),
        "[none, gzip, snappy, lz4, zstd]"
    );
    for (v, want) in [
        ("none", KafkaCompression::None),
        ("gzip", KafkaCompression::Gzip),
        ("snappy", KafkaCompression::Snappy),
        ("lz4", KafkaCompression::Lz4),
        ("zstd", KafkaCompression::Zstd),
    ] {
        assert_eq!(v.parse::<KafkaCompression>().ok(), Some(want), "{v}");
    }
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
        // Never retried (the relay answers every batch successfully).
        "MaximumRetryAttempts: 0",
        // One invocation at a time per shard.
        "ParallelizationFactor: 1",
        // The mapping's event counts (polled, filtered out, invoked, dropped) in CloudWatch.
        "MetricsConfig:\n        Metrics:\n          - EventCount",
    ] {
        assert!(
            mapping.contains(expected),
            "{expected:?} missing from the mapping:\n{mapping}"
        );
    }
    let number = |key: &str| -> u32 { value(&mapping, key).parse().unwrap() };
    // Lambda's default: at a steady load, half the doorbells of BatchSize 10 (BENCHMARKS.md).
    let batch = number("BatchSize");
    assert_eq!(batch, 100, "BatchSize {batch}");
    // No batching window: it adds its length to every doorbell's latency (the
    // doorbell's trickle goal, p50 <= 1.5 s, was missed with 1 s and met with 0 s).
    let window = number("MaximumBatchingWindowInSeconds");
    assert_eq!(window, 0, "MaximumBatchingWindowInSeconds {window}");

    // No record expires (-1: until the stream's 24 hours), so a continuation written
    // behind a run as long as the longest RelayTimeout is still delivered, and a batch is
    // dropped only when its invocation failed (no retries), which RelayErrorsAlarm counts.
    let age = value(&mapping, "MaximumRecordAgeInSeconds");
    assert_eq!(age, "-1", "MaximumRecordAgeInSeconds");

    // Two filters: inserts whose partition key is a message partition of this outbox, and
    // inserts of its continuations.
    assert_eq!(mapping.matches("- Pattern:").count(), 2, "{mapping}");
    let patterns: Vec<&str> = mapping
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- Pattern: "))
        .collect();
    let sub = |pattern: &str| -> String {
        pattern
            .strip_prefix("!Sub '")
            .and_then(|p| p.strip_suffix('\''))
            .unwrap_or_else(|| panic!("pattern is not a single-quoted !Sub: {pattern}"))
            .to_owned()
    };
    let (pattern, continuation) = (sub(patterns[0]), sub(patterns[1]));
    // A single-table design's key name, as PartitionKeyAttribute gives it to the filter
    // and, as OUTBOX_PARTITION_KEY_ATTRIBUTE, to the library.
    let mut options = dynamo_outbox::OutboxOptions::new("t");
    options.partition_key_attribute = "pk".into();
    let keys = dynamo_outbox::protocol::schema::Keys::new(&options);
    let pattern = pattern
        .replace("${KeyPrefix}", &keys.prefix)
        .replace("${PartitionKeyAttribute}", &keys.pk);
    let pattern: serde_json::Value = serde_json::from_str(&pattern).unwrap();
    let prefix = keys.messages_prefix();
    let filter = |prefix: &str| {
        serde_json::json!({
            "eventName": ["INSERT"],
            "dynamodb": {"Keys": {keys.pk.as_str(): {"S": [{"prefix": prefix}]}}}
        })
    };
    assert_eq!(pattern, filter(&prefix));
    let continuation = continuation
        .replace("${KeyPrefix}", &keys.prefix)
        .replace("${PartitionKeyAttribute}", &keys.pk);
    let continuation: serde_json::Value = serde_json::from_str(&continuation).unwrap();
    assert_eq!(continuation, filter(&keys.continuations_prefix()));
    assert!(keys
        .continuation_pk("fn-req")
        .starts_with(&keys.continuations_prefix()));
    // The prefix is the library's message partition key, and only that.
    assert!(keys.message_pk(3).starts_with(&prefix));
    for other in [
        keys.sequence_pk(3),
        keys.coordination_pk(),
        keys.idempotency_pk("k"),
        keys.dead_letter_pk(),
        keys.continuation_pk("fn-req"),
    ] {
        assert!(!other.starts_with(&prefix), "{other}");
    }
    for other in [
        keys.message_pk(3),
        keys.sequence_pk(3),
        keys.coordination_pk(),
        keys.idempotency_pk("k"),
        keys.dead_letter_pk(),
    ] {
        assert!(!other.starts_with(&keys.continuations_prefix()), "{other}");
    }
    // The template's table key is the attribute the pattern names.
    assert!(resource(&t, "OutboxTable")
        .join("\n")
        .contains("- AttributeName: !Ref PartitionKeyAttribute\n          KeyType: HASH"));
}

/// The key attribute names are parameters (PK and SK by default) that reach the created
/// table, the doorbell's filter (above) and both functions; the key prefix is limited to
/// characters that need no escaping in the filter's JSON, IAM conditions and names.
#[test]
fn key_names_and_the_prefix_are_parameters_safe_everywhere() {
    let t = template();
    let parameters = section(&t, "Parameters");
    for (name, default, variable) in [
        (
            "PartitionKeyAttribute",
            "PK",
            "OUTBOX_PARTITION_KEY_ATTRIBUTE",
        ),
        ("SortKeyAttribute", "SK", "OUTBOX_SORT_KEY_ATTRIBUTE"),
    ] {
        let p = entry(&parameters, name);
        assert_eq!(value(&p, "Default"), default, "{name}");
        assert!(
            t.contains(&format!("        {variable}: !Ref {name}\n")),
            "the functions' {variable} is not {name}"
        );
        let table = resource(&t, "OutboxTable").join("\n");
        assert_eq!(
            table
                .matches(&format!("AttributeName: !Ref {name}"))
                .count(),
            2,
            "{name}"
        );
    }
    let pattern = unquote(value(&entry(&parameters, "KeyPrefix"), "AllowedPattern"));
    let allowed = regex_lite_match(&pattern);
    for ok in ["OUTBOX", "shop.orders", "tenant-1:orders", "A_b"] {
        assert!(
            allowed(ok),
            "KeyPrefix {ok:?} should be allowed by {pattern}"
        );
    }
    for bad in [
        "",
        "a\"b",
        "a\\b",
        "a#b",
        "a*",
        "a?",
        "a b",
        &"x".repeat(129),
    ] {
        assert!(
            !allowed(bad),
            "KeyPrefix {bad:?} should be refused by {pattern}"
        );
    }
}

/// `^[CLASS]{1,N}$`, the shape of the key parameters' AllowedPattern, as a predicate.
fn regex_lite_match(pattern: &str) -> impl Fn(&str) -> bool {
    let inner = pattern
        .strip_prefix("^[")
        .and_then(|p| p.strip_suffix('$'))
        .unwrap_or_else(|| panic!("not ^[CLASS]{{1,N}}$: {pattern}"));
    let (class, count) = inner.split_once("]{1,").expect("a {1,N} count");
    let max: usize = count.trim_end_matches('}').parse().unwrap();
    let mut chars = Vec::new();
    let class: Vec<char> = class.chars().collect();
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == '-' {
            chars.extend(class[i]..=class[i + 2]);
            i += 3;
        } else {
            chars.push(class[i]);
            i += 1;
        }
    }
    move |s: &str| (1..=max).contains(&s.chars().count()) && s.chars().all(|c| chars.contains(&c))
}

#[test]
fn the_relay_reads_the_doorbell_stream_only() {
    let t = template();
    let lines = resource(&t, "RelayFunctionRole");
    // Both statements only with the doorbell.
    for sid in ["OutboxTableStream", "OutboxTableStreams"] {
        let policy = conditional_policy(&lines, sid);
        assert_eq!(
            policy.lines().nth(1).map(str::trim),
            Some("- Doorbell"),
            "{sid}"
        );
    }

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
        "- AttributeName: !Ref PartitionKeyAttribute\n          AttributeType: S",
        "- AttributeName: !Ref SortKeyAttribute\n          AttributeType: S",
        "- AttributeName: !Ref PartitionKeyAttribute\n          KeyType: HASH",
        "- AttributeName: !Ref SortKeyAttribute\n          KeyType: RANGE",
    ] {
        assert!(table.contains(expected), "OutboxTable lacks {expected}");
    }
    // TTL on the table's one TTL attribute (markers and continuations carry it), and the
    // table guarded: deletion protection (e2e/test_template.py checks the stack policy).
    for expected in [
        // dynamo_outbox's attr::TIME_TO_LIVE (a private module).
        "TimeToLiveSpecification:\n        AttributeName: TimeToLive\n        Enabled: true",
        "DeletionProtectionEnabled: true",
    ] {
        assert!(table.contains(expected), "OutboxTable lacks {expected}");
    }
    // The stream (WakeOn=stream only) is checked below.
    for absent in [
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
fn commit_notifications_invoke_the_relay_only_when_a_bus_is_configured_in_schedule_mode() {
    let t = template();
    // One wake-up per commit: with WakeOn=stream the doorbell rings for every commit, so
    // the bus carries no notifications then (no rule, no PutEvents, no variable).
    assert!(
        t.contains(
            "  NotifyOnCommit: !And\n    - !Condition HasEventBus\n    - !Not [!Condition WakeOnStream]\n"
        ),
        "NotifyOnCommit must be HasEventBus and not WakeOnStream"
    );
    let rule = resource(&t, "CommitNotificationRule").join("\n");
    for needle in [
        "Condition: NotifyOnCommit",
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
        "Condition: NotifyOnCommit",
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
            "OUTBOX_NOTIFY_EVENT_BUS: !If [NotifyOnCommit, !Ref EventBusName, !Ref AWS::NoValue]"
        ),
        "{enqueue}"
    );
    assert!(
        enqueue.contains("- !If\n          - NotifyOnCommit\n          - Statement:\n              - Sid: CommitNotifications"),
        "the PutEvents grant must follow NotifyOnCommit:\n{enqueue}"
    );
}

#[test]
fn the_relay_starts_its_successor_through_the_stream_or_without_one_by_invoking_itself() {
    let t = template();
    // Without the doorbell: Lambda's Invoke on the function itself, and the chain (on
    // purpose, bounded by the relay) allowed past Lambda's recursive loop detection.
    let policy = resource(&t, "RelaySuccessorPolicy");
    assert_eq!(actions(&policy), set(&["lambda:InvokeFunction"]));
    let text = policy.join("\n");
    for needle in [
        "Type: AWS::IAM::Policy",
        "Condition: SuccessorByInvoke",
        "- !Ref RelayFunctionRole",
        "Resource: !GetAtt RelayFunction.Arn",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    assert!(
        t.contains("  SuccessorByInvoke: !Not [!Condition Doorbell]\n"),
        "Invoke only without the doorbell"
    );
    let relay = resource(&t, "RelayFunction").join("\n");
    assert!(
        relay.contains("      RecursiveLoop: !If [Doorbell, !Ref AWS::NoValue, Allow]"),
        "{relay}"
    );
    assert!(
        relay.contains("OUTBOX_SUCCESSOR: !If [Doorbell, stream, invoke]"),
        "{relay}"
    );
    // With the doorbell: a PutItem of continuations, in their own partitions only, the
    // one put of the relay's code outside the quarantine.
    let lines = resource(&t, "RelayFunctionRole");
    let start = statement(&lines, "StartSuccessor");
    assert_eq!(
        actions(&start.lines().collect::<Vec<_>>()),
        set(&["dynamodb:PutItem"])
    );
    let keys = dynamo_outbox::protocol::schema::Keys::new(&dynamo_outbox::OutboxOptions::new("t"));
    let leading = format!(
        "- !Sub \"${{KeyPrefix}}{}*\"",
        keys.continuations_prefix()
            .strip_prefix(&keys.prefix)
            .unwrap()
    );
    assert!(start.contains(&leading), "{leading} missing:\n{start}");
    let code =
        std::fs::read_to_string(root().join("lib/src/notification/continuation.rs")).unwrap();
    assert_eq!(code.matches(".put_item()").count(), 1);
    assert!(
        code.contains("continuation_pk("),
        "the put is of a continuation"
    );
}

/// A woken relay's tie-break (`lib/src/notification/wakeup.rs`, the one module that
/// touches the wake-up partition): its PutItem and Query are granted in a statement of
/// their own, on that partition only, and the module's only writes are to it.
#[test]
fn wake_ups_are_ranked_in_their_own_partition_only() {
    let t = template();
    let lines = resource(&t, "RelayFunctionRole");
    let rank = statement(&lines, "RankWakeUps");
    assert_eq!(
        actions(&rank.lines().collect::<Vec<_>>()),
        set(&["dynamodb:PutItem", "dynamodb:Query"])
    );
    let keys = dynamo_outbox::protocol::schema::Keys::new(&dynamo_outbox::OutboxOptions::new("t"));
    let leading = format!(
        "- !Sub \"${{KeyPrefix}}{}\"",
        keys.wakeup_pk().strip_prefix(&keys.prefix).unwrap()
    );
    assert!(rank.contains(&leading), "{leading} missing:\n{rank}");
    let code = std::fs::read_to_string(root().join("lib/src/notification/wakeup.rs")).unwrap();
    let code = code.split("#[cfg(test)]").next().unwrap();
    assert_eq!(code.matches(".put_item()").count(), 1);
    assert_eq!(code.matches(".query()").count(), 1);
    assert_eq!(
        code.matches("wakeup_pk()").count(),
        2,
        "both on the wake-up partition"
    );
    for other in [".update_item()", ".delete_item()", ".batch_write_item()"] {
        assert!(!code.contains(other), "{other}");
    }
}

/// The DynamoDB operations the relay's code calls under the template's poison policy,
/// `block` (the store the relay function runs: `lib/src/protocol/store/` without
/// `quarantine.rs`, which `outboxctl quarantine` and only the `quarantine-after` policy use;
/// the relay's phases; the function itself), read from the sources as SDK calls.
fn relay_dynamodb_operations() -> BTreeSet<String> {
    let calls = [
        (".query()", "Query"),
        (".scan()", "Scan"),
        (".get_item()", "GetItem"),
        (".batch_get_item()", "BatchGetItem"),
        (".put_item()", "PutItem"),
        (".update_item()", "UpdateItem"),
        (".delete_item()", "DeleteItem"),
        (".batch_write_item()", "BatchWriteItem"),
        (".transact_write_items()", "TransactWriteItems"),
        (".transact_get_items()", "TransactGetItems"),
        // PartiQL: the relay runs DELETE statements only (exactly-once's conditional
        // deletes, a statement of their own: exactly_once_is_opt_in_and_brings_its_grants_only_with_it).
        (".batch_execute_statement()", "PartiQLDelete"),
        (".execute_statement()", "PartiQLDelete"),
        (".execute_transaction()", "PartiQLDelete"),
    ];
    let mut files = Vec::new();
    for dir in [
        "lib/src/protocol/store",
        "lib/src/relay",
        "functions/relay/src",
    ] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            // quarantine.rs and inspect.rs are the operator's (outboxctl), not the relay's
            // (quarantine.rs also the quarantine-after policy's, which the template does not
            // set).
            if path.extension().is_some_and(|e| e == "rs")
                && path
                    .file_name()
                    .is_some_and(|n| n != "quarantine.rs" && n != "inspect.rs")
            {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 5, "{files:?}");
    let mut found = BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        // Unit tests of the store (DynamoDB Local fixtures) are not the relay's requests.
        let code = text.split("#[cfg(test)]").next().unwrap();
        // The relay quarantines only under OUTBOX_POISON_POLICY=quarantine-after=N
        // (relay/poison_policy.rs), which needs a transaction with a Put: the template's
        // PoisonPolicy grants PutItem for it only (see below).
        let policy_step = path.ends_with("relay/poison_policy.rs");
        assert!(
            policy_step
                || !(code.contains(".quarantine(") || code.contains(".quarantine_because(")),
            "{} quarantines",
            path.display()
        );
        for (call, operation) in calls {
            if code.contains(call) {
                found.insert(format!("dynamodb:{operation}"));
            }
        }
    }
    found
}

/// Least privilege: the relay is granted exactly the table operations
/// its code calls outside the move of a poison head; it never puts an item there
/// otherwise (the heartbeat is an UpdateItem). The move (a record the brokers refuse for
/// a partition its topic lacks or for its size, under every policy; any poison head under
/// PoisonPolicy quarantine-after=N) is a transaction with a Put, the Delete above, and a
/// ConditionCheck of the bucket's lease item: PutItem and ConditionCheckItem, in a
/// statement of their own, granted under every policy.
#[test]
fn the_relay_is_granted_the_table_operations_its_code_calls_and_put_item_only_to_quarantine() {
    let t = template();
    let lines = resource(&t, "RelayFunctionRole");
    let table = statement(&lines, "OutboxTable");
    let granted = actions(&table.lines().collect::<Vec<_>>());
    let mut called = relay_dynamodb_operations();
    // Granted with exactly-once only, in a statement of its own.
    assert!(called.remove("dynamodb:PartiQLDelete"), "{called:?}");
    assert_eq!(granted, called);
    assert!(!granted.contains("dynamodb:PutItem"), "{granted:?}");
    // The move: a Put into the dead-letter partition and a check of the bucket's lease
    // item (ConditionCheckItem, so that a relay that lost the bucket moves nothing), each
    // on its own partition only, under every policy (no `!If` around them).
    for (sid, action, partition) in [
        ("QuarantinePoison", "dynamodb:PutItem", "DEADLETTER"),
        (
            "QuarantineFence",
            "dynamodb:ConditionCheckItem",
            "COORDINATION",
        ),
    ] {
        let s = statement(&lines, sid);
        assert_eq!(
            actions(&s.lines().collect::<Vec<_>>()),
            set(&[action]),
            "{sid}"
        );
        assert!(
            s.lines()
                .any(|l| l.trim() == format!("- !Sub \"${{KeyPrefix}}#{partition}\"")),
            "{sid}: {partition}\n{s}"
        );
        let at = lines
            .iter()
            .position(|l| l.trim() == format!("- Sid: {sid}"))
            .unwrap();
        assert!(
            !lines[at.saturating_sub(3)..at]
                .iter()
                .any(|l| l.contains("!If")),
            "{sid} must not depend on a condition"
        );
    }
    let code =
        std::fs::read_to_string(root().join("lib/src/protocol/store/quarantine.rs")).unwrap();
    assert!(
        code.contains("ConditionCheck::builder()"),
        "the move is fenced"
    );
    let parameters = section(&t, "Parameters").join("\n");
    assert!(
        parameters.contains("  PoisonPolicy:\n    Type: String\n    Default: block\n"),
        "{parameters}"
    );
    let relay = resource(&t, "RelayFunction").join("\n");
    assert!(
        relay.contains("OUTBOX_POISON_POLICY: !Ref PoisonPolicy"),
        "{relay}"
    );
}

/// Low-quota accounts: ReservedConcurrentExecutions only when
/// RelayReservedConcurrency is set and not 0; the default sets none.
#[test]
fn reserved_concurrency_is_optional_and_off_by_default() {
    let t = template();
    let parameter = entry(&section(&t, "Parameters"), "RelayReservedConcurrency");
    assert_eq!(value(&parameter, "Type"), "String", "{parameter}");
    assert_eq!(value(&parameter, "Default"), "\"\"", "{parameter}");
    let pattern = unquote(value(&parameter, "AllowedPattern"));
    assert_eq!(pattern, "^$|^0$|^[2-9]$|^[1-9][0-9]+$");
    assert_eq!(
        entry(&section(&t, "Conditions"), "HasReservedConcurrency"),
        "!Not [!Or [!Equals [!Ref RelayReservedConcurrency, \"\"], !Equals [!Ref RelayReservedConcurrency, \"0\"]]]"
    );
    let relay = resource(&t, "RelayFunction").join("\n");
    assert_eq!(
        value(&relay, "ReservedConcurrentExecutions"),
        "!If [HasReservedConcurrency, !Ref RelayReservedConcurrency, !Ref AWS::NoValue]"
    );
    assert_eq!(t.matches("ReservedConcurrentExecutions:").count(), 1);
}

/// Tags: a stack's tags (`sam deploy --tags`) reach every resource CloudFormation tags;
/// the functions' own tags reach the resources SAM generates for them only with
/// PropagateTags, set once for both functions in the Globals.
#[test]
fn the_functions_tags_reach_the_resources_sam_generates_for_them() {
    let t = template();
    let globals = section(&t, "Globals").join("\n");
    assert_eq!(value(&globals, "PropagateTags"), "true", "{globals}");
    assert_eq!(t.matches("PropagateTags:").count(), 1);
}

/// Invocation reports: Lambda's START/REPORT lines are system logs at
/// INFO; WARN dropped them.
#[test]
fn system_logs_keep_the_invocation_reports() {
    let t = template();
    let globals = section(&t, "Globals").join("\n");
    assert!(globals.contains("SystemLogLevel: INFO"), "{globals}");
    assert_eq!(t.matches("SystemLogLevel:").count(), 1);
}

/// Log retention: each function logs to a log group the stack creates
/// with RetentionInDays from LogRetentionDays (30 days by default).
#[test]
fn both_functions_log_to_groups_with_a_retention() {
    let t = template();
    let parameter = entry(&section(&t, "Parameters"), "LogRetentionDays");
    assert_eq!(value(&parameter, "Default"), "30");
    assert!(
        value(&parameter, "AllowedValues").contains(" 30, "),
        "{parameter}"
    );
    for (function, group) in [
        ("RelayFunction", "RelayLogGroup"),
        ("EnqueueFunction", "EnqueueLogGroup"),
    ] {
        let f = resource(&t, function).join("\n");
        assert!(
            f.contains(&format!("LoggingConfig:\n        LogGroup: !Ref {group}")),
            "{function}: {f}"
        );
        let g = resource(&t, group).join("\n");
        assert!(g.contains("Type: AWS::Logs::LogGroup"), "{g}");
        assert_eq!(value(&g, "RetentionInDays"), "!Ref LogRetentionDays");
        // A generated name: no clash with a group Lambda made for an earlier function.
        assert!(!g.contains("LogGroupName"), "{g}");
    }
    assert_eq!(t.matches("Type: AWS::Logs::LogGroup").count(), 2);
}

/// Topics: KafkaTopics is a list; each entry becomes one topic ARN
/// built from the cluster ARN (its partition, region, account, name and uuid).
#[test]
fn every_kafka_topics_entry_is_one_topic_arn_in_the_clusters_region_and_account() {
    let t = template();
    let parameter = entry(&section(&t, "Parameters"), "KafkaTopics");
    assert_eq!(
        value(&parameter, "Type"),
        "CommaDelimitedList",
        "{parameter}"
    );
    let relay = resource(&t, "RelayFunctionRole");
    let topics = statement(&relay, "MskTopics");
    assert_eq!(
        actions(&topics.lines().collect::<Vec<_>>()),
        set(&["kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"])
    );
    // No pseudo parameter of the stack in the topic ARNs.
    assert!(!topics.contains("AWS::Region") && !topics.contains("AWS::AccountId"));
    let prefix = "Topics: !Join [\":topic/\", !Split [\":cluster/\", !Ref MskClusterArn]]";
    assert_eq!(topics.matches(prefix).count(), 10, "{topics}");
    assert_eq!(topics.matches("\"${Topics}/${Topic}\"").count(), 10);
    let padded = "!Split [\",\", !Join [\"\", [!Join [\",\", !Ref KafkaTopics], \",,,,,,,,,,\"]]]";
    assert!(topics.contains("Topic: !Select [0, !Ref KafkaTopics]"));
    let conditions = section(&t, "Conditions");
    for i in 2..=10 {
        assert!(
            topics.contains(&format!("- HasTopic{i}\n")),
            "slot {i} is conditional"
        );
        assert!(
            topics.contains(&format!("Topic: !Select [{}, {padded}]", i - 1)),
            "slot {i} takes entry {}",
            i - 1
        );
        assert_eq!(
            entry(&conditions, &format!("HasTopic{i}")),
            format!("!Not [!Equals [\"\", !Select [{}, {padded}]]]", i - 1)
        );
    }
    // An eleventh entry fails the deployment instead of being dropped.
    assert_eq!(
        entry(&conditions, "TooManyTopics"),
        format!("!Not [!Equals [\"\", !Select [10, {padded}]]]")
    );
    assert!(topics.contains("- TooManyTopics\n"), "{topics}");
    let rule = entry(&section(&t, "Rules"), "KafkaTopicsHasNoEmptyEntry");
    assert!(
        rule.contains("Assert: !Not [!Contains [!Ref KafkaTopics, \"\"]]"),
        "{rule}"
    );

    // What those functions compute, for a cluster in another region and account than
    // any stack's: one ARN per entry.
    let cluster = "arn:aws-cn:kafka:cn-north-1:111122223333:cluster/orders/abcd-1";
    let topics_of = |list: &str| -> Vec<String> {
        let topic_prefix = cluster
            .split(":cluster/")
            .collect::<Vec<_>>()
            .join(":topic/");
        let padded: Vec<String> = format!("{list},,,,,,,,,,")
            .split(',')
            .map(str::to_owned)
            .collect();
        (0..10)
            .filter(|&i| i == 0 || !padded[i].is_empty())
            .map(|i| format!("{topic_prefix}/{}", padded[i]))
            .collect()
    };
    assert_eq!(
        topics_of("orders,payments-*"),
        [
            "arn:aws-cn:kafka:cn-north-1:111122223333:topic/orders/abcd-1/orders",
            "arn:aws-cn:kafka:cn-north-1:111122223333:topic/orders/abcd-1/payments-*",
        ]
    );
    assert_eq!(topics_of("*").len(), 1);
    assert_eq!(topics_of("a,b,c,d,e,f,g,h,i,j").len(), 10);
}

/// Asserts that `text` contains every one of `expected`, naming the first it lacks.
fn assert_contains_all(text: &str, expected: &[&str]) {
    for e in expected {
        assert!(text.contains(e), "{e}: {text}");
    }
}

/// The alarm named `name`: its lines joined. Every alarm exists whatever the parameters,
/// but the enqueue function's (with the function); `AlarmTopicArn` only adds its actions.
fn alarm(t: &str, name: &str) -> String {
    let a = resource(t, name).join("\n");
    assert!(a.contains("Type: AWS::CloudWatch::Alarm"), "{a}");
    let condition = match name {
        n if n.starts_with("Enqueue") => Some("EnqueueApi"),
        _ => None,
    };
    match condition {
        Some(c) => {
            assert!(
                a.contains(&format!("    Condition: {c}\n")),
                "{name}: with {c}\n{a}"
            );
            assert_eq!(a.matches("Condition:").count(), 1, "{name}\n{a}");
        }
        None => assert!(!a.contains("Condition:"), "{name}: always created\n{a}"),
    }
    for actions in ["AlarmActions", "OKActions"] {
        assert!(
            a.contains(&format!(
                "{actions}: !If [HasAlarms, [!Ref AlarmTopicArn], !Ref AWS::NoValue]"
            )),
            "{name}: {actions} only with AlarmTopicArn\n{a}"
        );
    }
    a
}

/// Alarms: relay errors, a stuck outbox, refused writes, successor failures, a quiet or
/// runaway relay, always; dropped doorbells with the doorbell; quarantined items with
/// quarantine-after; the enqueue function's faults with the function (seven in the
/// default deployment: docs/design.md, "Alarms"). Built on free Lambda metrics and on
/// metrics the relay emits only when they carry information: missing data is not
/// breaching, but for the concurrency alarm, whose missing data is a relay not running.
#[test]
fn alarms_watch_errors_a_stuck_outbox_refused_writes_successors_and_the_relays_concurrency() {
    let t = template();
    assert_eq!(
        entry(&section(&t, "Conditions"), "HasAlarms"),
        "!Not [!Equals [!Ref AlarmTopicArn, \"\"]]"
    );
    let parameters = section(&t, "Parameters");
    assert_eq!(
        value(&entry(&parameters, "AlarmTopicArn"), "Default"),
        "\"\""
    );
    assert_eq!(t.matches("Type: AWS::CloudWatch::Alarm").count(), 7);

    assert_contains_all(
        &alarm(&t, "RelayErrorsAlarm"),
        &[
            "Namespace: AWS/Lambda",
            "MetricName: Errors",
            "Value: !Ref RelayFunction",
            "TreatMissingData: notBreaching",
        ],
    );
    assert_contains_all(
        &alarm(&t, "RelayConcurrencyAlarm"),
        &[
            "Namespace: AWS/Lambda",
            "MetricName: ConcurrentExecutions",
            "Value: !Ref RelayFunction",
            "Statistic: Maximum",
            "Period: 60",
            "EvaluationPeriods: !Ref RelayQuietMinutes",
            "DatapointsToAlarm: !Ref RelayQuietMinutes",
            "Threshold: !Ref RelayRunawayConcurrency",
            "ComparisonOperator: GreaterThanThreshold",
            "TreatMissingData: breaching",
        ],
    );
    assert_contains_all(
        &alarm(&t, "EnqueueFaultsAlarm"),
        &[
            "MetricName: EnqueueFaults",
            "TreatMissingData: notBreaching",
        ],
    );
    assert_relay_metric_alarms(&t);
}

/// The alarms on the relay's own metrics (EMF): the namespace and service it is given, the
/// table dimension, each metric's statistic, window and missing-data treatment.
fn assert_relay_metric_alarms(t: &str) {
    let relay = resource(t, "RelayFunction").join("\n");
    use dynamo_outbox::metrics::{emf, RelayMetrics};
    assert_eq!(
        value(&relay, emf::NAMESPACE_ENV),
        emf::DEFAULT_NAMESPACE,
        "{relay}"
    );
    assert_eq!(value(&relay, emf::SERVICE_ENV), emf::DEFAULT_SERVICE);
    let metrics = emf::EmfMetrics::from_lookup("orders-outbox", |_| None);
    metrics.refused_write(dynamo_outbox::protocol::store::WriteKind::Claim);
    metrics.head_age(0, std::time::Duration::from_secs(400));
    metrics.quarantined(0);
    let doc: serde_json::Value =
        serde_json::from_str(&metrics.flush_at(1_764_500_000_000)[0]).unwrap();
    let directive = &doc["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(
        directive["Dimensions"],
        serde_json::json!([["service", "table"]])
    );
    // SuccessorFailures is the relay's too (written only when not zero).
    for (name, metric, statistic, window) in [
        (
            "OutboxStuckAlarm",
            "OldestPendingAge",
            "Maximum",
            "EvaluationPeriods: 10\n      DatapointsToAlarm: 1",
        ),
        (
            "RefusedWritesAlarm",
            "RefusedWrites",
            "Sum",
            "EvaluationPeriods: !Ref RefusedWritesWindowMinutes\n      DatapointsToAlarm: !Ref RefusedWritesMinutes",
        ),
        (
            "QuarantinedItemsAlarm",
            "QuarantinedItems",
            "Sum",
            "EvaluationPeriods: 1",
        ),
        (
            "SuccessorFailuresAlarm",
            "SuccessorFailures",
            "Sum",
            "EvaluationPeriods: 10\n      DatapointsToAlarm: 2",
        ),
    ] {
        let a = alarm(t, name);
        if metric != "SuccessorFailures" {
            assert!(doc[metric].is_number(), "the relay emits {metric}");
        }
        for expected in [
            format!("Namespace: {}", directive["Namespace"].as_str().unwrap()),
            format!("MetricName: {metric}"),
            format!("Statistic: {statistic}"),
            "- Name: service\n          Value: outbox-relay".to_string(),
            "- Name: table\n          Value: !If [CreateTable, !Ref OutboxTable, !Ref TableName]"
                .to_string(),
            "TreatMissingData: notBreaching".to_string(),
            window.to_string(),
        ] {
            assert!(a.contains(&expected), "{name}: {expected}\n{a}");
        }
    }
}

/// Callers of the enqueue function: a managed policy they can attach.
#[test]
fn callers_of_the_enqueue_function_get_a_managed_policy() {
    let t = template();
    let policy = resource(&t, "EnqueueCallerPolicy");
    let text = policy.join("\n");
    assert!(text.contains("Type: AWS::IAM::ManagedPolicy"), "{text}");
    assert_eq!(actions(&policy), set(&["lambda:InvokeFunction"]));
    assert!(
        text.contains("Resource: !GetAtt EnqueueFunction.Arn"),
        "{text}"
    );
    assert!(t.contains("\n  EnqueueCallerPolicyArn:\n"));
}

/// `sam deploy --guided` offers what samconfig.toml holds as its default answers: the
/// file ships no parameter values (placeholders would be offered as answers).
#[test]
fn samconfig_offers_no_placeholder_answers() {
    let samconfig = std::fs::read_to_string(root().join("samconfig.toml")).unwrap();
    let settings: Vec<&str> = samconfig
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .collect();
    for line in &settings {
        assert!(
            !line.starts_with("parameter_overrides") && !line.starts_with("region"),
            "samconfig.toml answers a deploy question for the user: {line}"
        );
    }
    assert!(
        settings.contains(&"stack_name = \"dynamo-outbox\""),
        "{samconfig}"
    );
}

/// Whether `entry` matches KafkaTopics' AllowedPattern, `^(\*|[a-zA-Z0-9._-]{1,249}\*?)$`
/// (CloudFormation applies it to each entry of a CommaDelimitedList).
fn kafka_topics_pattern_matches(entry: &str) -> bool {
    let name = entry.strip_suffix('*').unwrap_or(entry);
    entry == "*"
        || ((1..=249).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
}

/// Topics: KafkaTopics has no default (a deploy names its topics,
/// nothing grants every topic unless `*` is given), and that one list is both functions'
/// OUTBOX_ALLOWED_TOPICS and the relay's topic ARNs, so the allow-lists and IAM agree.
#[test]
fn kafka_topics_has_no_default_and_is_both_allow_lists_and_the_relays_topic_arns() {
    let t = template();
    let parameters = section(&t, "Parameters");
    let parameter = entry(&parameters, "KafkaTopics");
    assert!(
        !parameter.lines().any(|l| l.trim().starts_with("Default:")),
        "KafkaTopics has a default: {parameter}"
    );
    // Entries IAM and the functions read alike: exact names and `prefix*`, or `*`.
    assert_eq!(
        value(&parameter, "AllowedPattern"),
        r#""^(\\*|[a-zA-Z0-9._-]{1,249}\\*?)$""#,
        "{parameter}"
    );
    for expected in [
        "prefix*",
        "a lone *",
        "one stack (one enqueue function) per trust",
    ] {
        assert!(
            parameter.replace('\n', " ").contains(expected),
            "{expected:?} not in {parameter}"
        );
    }

    // Both functions: one variable in Globals, overridden by neither.
    let globals = section(&t, "Globals").join("\n");
    assert_eq!(
        value(&globals, "OUTBOX_ALLOWED_TOPICS"),
        "!Join [\",\", !Ref KafkaTopics]",
        "{globals}"
    );
    assert_eq!(t.matches("OUTBOX_ALLOWED_TOPICS:").count(), 1);

    // The relay's topic ARNs: every topic in them is an entry of KafkaTopics.
    let relay = resource(&t, "RelayFunctionRole");
    let topics = statement(&relay, "MskTopics");
    let entries: Vec<&str> = topics
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Topic: "))
        .collect();
    assert_eq!(entries.len(), 10, "{topics}");
    for e in &entries {
        assert!(
            e.contains("!Ref KafkaTopics"),
            "a topic ARN not from KafkaTopics: {e}"
        );
    }
    // KafkaTopics is read by the rule, the slot conditions, the topic ARNs and the
    // allow-list, nowhere else.
    let refs = |text: &str| text.matches("!Ref KafkaTopics").count();
    assert_eq!(
        refs(&t),
        refs(&section(&t, "Rules").join("\n"))
            + refs(&section(&t, "Conditions").join("\n"))
            + refs(&topics)
            + refs(&globals),
        "KafkaTopics used elsewhere"
    );

    // What the functions make of the list CloudFormation joins: the same topics as the
    // ARNs (exact names, `prefix*` as IAM's trailing wildcard, `*` every topic), and a
    // refusal of what the AllowedPattern refuses.
    let joined = ["orders", "payments-*", "audit.v1"].join(",");
    let options = dynamo_outbox::OutboxOptions::from_lookup(|name| match name {
        "OUTBOX_TABLE_NAME" => Some("outbox".into()),
        "OUTBOX_ALLOWED_TOPICS" => Some(joined.clone()),
        _ => None,
    })
    .unwrap();
    let allowed = &options.allowed_topics;
    assert!(!allowed.allows_every_topic());
    for topic in ["orders", "payments-eu", "payments-", "audit.v1"] {
        assert!(allowed.allows(topic), "{topic}");
    }
    for topic in ["orders2", "payments", "audit.v2", "x-orders"] {
        assert!(!allowed.allows(topic), "{topic}");
    }
    let every =
        dynamo_outbox::options::TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", "*").unwrap();
    assert!(every.allows_every_topic());
    for entry in ["*", "orders", "payments-*", "a.b_c-d*"] {
        assert!(kafka_topics_pattern_matches(entry), "{entry}");
        dynamo_outbox::options::TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", entry)
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    for entry in [
        "", "a*b", "*-orders", "orders?", "o?ders*", "**", "orders/x",
    ] {
        assert!(!kafka_topics_pattern_matches(entry), "{entry:?}");
        assert!(
            dynamo_outbox::options::TopicAllowList::parse("OUTBOX_ALLOWED_TOPICS", entry).is_err(),
            "{entry:?}"
        );
    }
    // The functions trim spaces around an entry, IAM would not: the pattern refuses them.
    assert!(!kafka_topics_pattern_matches(" orders"));
}

/// The statement entry of the relay's role that holds the statement `sid`: from the `- !If`
/// before it to the `- !Ref AWS::NoValue` that closes it.
fn conditional_policy(lines: &[&str], sid: &str) -> String {
    let text = lines.join("\n");
    let at = text
        .find(&format!("- Sid: {sid}\n"))
        .unwrap_or_else(|| panic!("no statement {sid}"));
    let start = text[..at].rfind("- !If\n").unwrap();
    let end = at + text[at..].find("- !Ref AWS::NoValue").unwrap();
    text[start..end].to_owned()
}

/// The relay is told the mechanism and each Kafka secret, a secret only when it is named.
/// Which secrets it may read, per setup, is checked over the SAM-translated template
/// (e2e/test_template.py).
#[test]
fn the_relay_is_told_each_kafka_secret_only_when_it_is_named() {
    let t = template();
    let relay = resource(&t, "RelayFunction").join("\n");
    assert_eq!(value(&relay, "KAFKA_AUTH"), "!Ref KafkaAuth");
    let conditions = section(&t, "Conditions");
    for (variable, parameter, condition) in [
        (
            "KAFKA_SASL_SECRET_ARN",
            "KafkaSaslSecretArn",
            "HasSaslSecret",
        ),
        (
            "KAFKA_TLS_CA_SECRET_ARN",
            "KafkaTlsCaSecretArn",
            "HasTlsCaSecret",
        ),
        (
            "KAFKA_TLS_CLIENT_SECRET_ARN",
            "KafkaTlsClientSecretArn",
            "HasTlsClientSecret",
        ),
    ] {
        assert_eq!(
            value(&relay, variable),
            format!("!If [{condition}, !Ref {parameter}, !Ref AWS::NoValue]")
        );
        assert_eq!(
            entry(&conditions, condition),
            format!("!Not [!Equals [!Ref {parameter}, \"\"]]")
        );
    }
    let parameters = section(&t, "Parameters");
    for (name, pattern) in [
        (
            "KafkaSaslSecretArn",
            r#""^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6})?$""#,
        ),
        (
            "KafkaTlsCaSecretArn",
            r#""^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6})?$""#,
        ),
        (
            "KafkaTlsClientSecretArn",
            r#""^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6})?$""#,
        ),
        (
            "KafkaSecretsKmsKeyArn",
            r#""^(arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[^\\s]+)?$""#,
        ),
    ] {
        let p = entry(&parameters, name);
        assert_eq!(value(&p, "Default"), "\"\"", "{name}");
        assert_eq!(value(&p, "AllowedPattern"), pattern, "{name}");
    }
}

/// KafkaAuth defaults to MSK IAM and allows only mechanisms the relay reads, each over
/// TLS, with the variables the template passes for it (a SASL mechanism its secret, mtls
/// its client certificate's secret).
#[test]
fn every_kafka_auth_value_is_one_the_relay_reads() {
    let t = template();
    let auth = entry(&section(&t, "Parameters"), "KafkaAuth");
    assert_eq!(value(&auth, "Default"), "msk-iam");
    let allowed = value(&auth, "AllowedValues");
    let values: Vec<&str> = allowed
        .trim_matches(['[', ']'])
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(
        values,
        ["msk-iam", "scram-sha-512", "scram-sha-256", "plain", "mtls"]
    );
    let secret = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:AmazonMSK_outbox-AbCdEf";
    for v in &values {
        let sasl = !matches!(*v, "msk-iam" | "mtls");
        let vars = [
            ("KAFKA_BOOTSTRAP_SERVERS", "b-1.example:9096"),
            ("KAFKA_AUTH", v),
            ("AWS_REGION", "eu-west-1"),
            ("KAFKA_SASL_SECRET_ARN", if sasl { secret } else { "" }),
            (
                "KAFKA_TLS_CLIENT_SECRET_ARN",
                if *v == "mtls" { secret } else { "" },
            ),
        ];
        let config = dynamo_outbox::publish::KafkaConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, v)| *k == name && !v.is_empty())
                .map(|(_, v)| v.to_string())
        })
        .unwrap_or_else(|e| panic!("KafkaAuth={v}: {e}"));
        assert_eq!(config.auth.name(), *v);
        assert!(config.tls.is_on(), "KafkaAuth={v} is over TLS");
    }
}

/// Every output is exported as `{stack name}-{output}`, and the table's ARN is one of them
/// (for the policies of services that write the table directly).
#[test]
fn outputs_are_exported_with_the_table_arn() {
    let t = template();
    let outputs = section(&t, "Outputs");
    let names: Vec<&str> = outputs
        .iter()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':'))
        .map(|l| l.trim().trim_end_matches(':'))
        .collect();
    for name in [
        "RelayFunctionArn",
        "EnqueueCallerPolicyArn",
        "OutboxTableName",
        "OutboxTableArn",
        "DoorbellStreamArn",
    ] {
        assert!(names.contains(&name), "output {name} missing: {names:?}");
    }
    for name in &names {
        let e = entry(&outputs, name);
        assert!(
            e.contains(&format!(
                "Export:\nName: !Sub \"${{AWS::StackName}}-{name}\""
            )),
            "output {name} is not exported as {{stack}}-{name}:\n{e}"
        );
    }
    let arn = entry(&outputs, "OutboxTableArn");
    assert!(arn.contains("!GetAtt OutboxTable.Arn"), "{arn}");
    assert!(arn.contains(":table/${TableName}"), "{arn}");
}

/// `EnableEnqueueApi=false` leaves out the enqueue function with everything that names
/// it; `PointInTimeRecovery=true` turns recovery on for the created table. Both default
/// to what the stack had before (the function in, recovery off).
#[test]
fn the_enqueue_api_and_point_in_time_recovery_are_options() {
    let t = template();
    let parameters = section(&t, "Parameters");
    for (name, default) in [
        ("EnableEnqueueApi", "\"true\""),
        ("PointInTimeRecovery", "\"true\""),
    ] {
        let p = entry(&parameters, name);
        assert_eq!(value(&p, "Default"), default, "{name}");
        assert!(
            p.contains("AllowedValues: [\"true\", \"false\"]"),
            "{name}: {p}"
        );
    }
    let conditions = section(&t, "Conditions");
    assert_eq!(
        entry(&conditions, "EnqueueApi"),
        "!Equals [!Ref EnableEnqueueApi, \"true\"]"
    );
    assert_eq!(
        entry(&conditions, "HasPointInTimeRecovery"),
        "!Equals [!Ref PointInTimeRecovery, \"true\"]"
    );
    for name in ["EnqueueFunction", "EnqueueLogGroup", "EnqueueCallerPolicy"] {
        let r = resource(&t, name);
        assert_eq!(
            r.get(1).map(|l| l.trim()),
            Some("Condition: EnqueueApi"),
            "{name}: {r:?}"
        );
    }
    let outputs = section(&t, "Outputs");
    for name in ["EnqueueFunctionArn", "EnqueueCallerPolicyArn"] {
        let output = entry(&outputs, name);
        assert!(
            output.starts_with("Condition: EnqueueApi\n"),
            "output {name} must follow EnqueueApi: {output}"
        );
    }
    let table = resource(&t, "OutboxTable").join("\n");
    assert!(
        table.contains(
            "PointInTimeRecoverySpecification: !If\n        - HasPointInTimeRecovery\n        - PointInTimeRecoveryEnabled: true\n        - !Ref AWS::NoValue"
        ),
        "{table}"
    );
}

/// The DynamoDB item actions the library's writer needs (`lib/src/writer.rs`, and the
/// enqueue service on top of it, `lib/src/enqueue.rs`), read from the sources as SDK
/// calls; a transaction's items are authorized as the action of each (a `Put` as a
/// PutItem, ...).
fn writer_dynamodb_operations() -> BTreeSet<String> {
    let calls = [
        (".put_item()", "PutItem"),
        (".update_item()", "UpdateItem"),
        (".delete_item()", "DeleteItem"),
        (".get_item()", "GetItem"),
        (".query()", "Query"),
        (".batch_write_item()", "BatchWriteItem"),
        ("Put::builder()", "PutItem"),
        ("Update::builder()", "UpdateItem"),
        ("Delete::builder()", "DeleteItem"),
        ("ConditionCheck::builder()", "ConditionCheckItem"),
    ];
    let mut found = BTreeSet::new();
    for file in ["lib/src/writer.rs", "lib/src/enqueue.rs"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (call, operation) in calls {
            if code.contains(call) {
                found.insert(format!("dynamodb:{operation}"));
            }
        }
    }
    found
}

/// Direct writers (the main path) get a managed policy with exactly the item actions the
/// library's writer calls, the same as the enqueue function's (which runs that writer),
/// on the outbox's items only; it is an exported output.
#[test]
fn direct_writers_get_a_managed_policy_with_the_writers_actions() {
    let t = template();
    let policy = resource(&t, "OutboxWriterPolicy");
    let text = policy.join("\n");
    assert!(text.contains("Type: AWS::IAM::ManagedPolicy"), "{text}");
    let table = statement(&policy, "OutboxTable");
    let granted = actions(&table.lines().collect::<Vec<_>>());
    assert_eq!(granted, writer_dynamodb_operations());
    let enqueue = resource(&t, "EnqueueFunction");
    assert_eq!(
        actions(
            &statement(&enqueue, "OutboxTable")
                .lines()
                .collect::<Vec<_>>()
        ),
        granted
    );
    // Every item grant of the stack is limited to the partitions of its role (the
    // resolved conditions per setup: e2e/test_template.py).
    for (name, sid, kinds) in [
        (
            "OutboxWriterPolicy",
            "OutboxTable",
            &["MESSAGES#*", "SEQUENCE#*"][..],
        ),
        (
            "EnqueueFunction",
            "OutboxTable",
            &["MESSAGES#*", "SEQUENCE#*", "IDEMPOTENCY#*"][..],
        ),
        (
            "RelayFunctionRole",
            "OutboxTable",
            &["COORDINATION", "MESSAGES#*"][..],
        ),
    ] {
        let s = statement(&resource(&t, name), sid);
        assert!(
            s.contains("ForAllValues:StringLike:") && s.contains("dynamodb:LeadingKeys:"),
            "{name}: {s}"
        );
        for kind in kinds {
            assert!(
                s.contains(&format!("- !Sub \"${{KeyPrefix}}#{kind}\"")),
                "{name}: {kind}\n{s}"
            );
        }
        assert!(!s.contains("${KeyPrefix}#*"), "{name}: {s}");
    }
    // Every partition key the library writes starts with the prefix and '#'.
    let options = dynamo_outbox::OutboxOptions::new("t");
    let keys = dynamo_outbox::protocol::schema::Keys::new(&options);
    for pk in [
        keys.message_pk(3),
        keys.sequence_pk(3),
        keys.coordination_pk(),
        keys.idempotency_pk("k"),
        keys.dead_letter_pk(),
    ] {
        assert!(pk.starts_with(&format!("{}#", keys.prefix)), "{pk}");
    }
    assert!(t.contains("\n  OutboxWriterPolicyArn:\n"));
}

/// The statement `sid` of the relay's role: its `!If` condition (the line after `- !If`),
/// its actions, and its text.
fn relay_statement(t: &str, sid: &str) -> (String, BTreeSet<String>, String) {
    let role = resource(t, "RelayFunctionRole");
    let text = conditional_policy(&role, sid);
    let condition = text
        .lines()
        .nth(1)
        .map(|l| l.trim().trim_start_matches("- ").to_owned())
        .unwrap_or_default();
    let statement = statement(&role, sid);
    let actions = actions(&statement.lines().collect::<Vec<_>>());
    (condition, actions, statement)
}

/// Exactly-once delivery is opt-in (`Delivery`, default at-least-once, the library's own
/// default and spelling) and brings its grants with it and only with it: the relay's
/// environment gets OUTBOX_DELIVERY and OUTBOX_WATERMARK_TOPIC (the library's variables)
/// under `ExactlyOnce` only; `dynamodb:DescribeTable` (which the store calls for the table's
/// ARN) under `ExactlyOnce`; the transactional ids, groups and watermark topic under
/// `ExactlyOnceOnMsk` (exactly-once with MskClusterArn) only, their names the library's
/// (`dynamo-outbox.{table}.{id}.{bucket}`, matched by the grant of this stack's table and
/// not another's). e2e/test_template.py checks each deployed setup.
#[test]
fn exactly_once_is_opt_in_and_brings_its_grants_only_with_it() {
    use dynamo_outbox::protocol::watermark::{
        OutboxIdentity, DEFAULT_WATERMARK_TOPIC, KAFKA_NAME_PREFIX,
    };
    use dynamo_outbox::publish::{env, Delivery};
    let t = template();
    let parameters = section(&t, "Parameters");

    // Delivery: the library's two modes, spelled as it parses and prints them; the default
    // is the library's default.
    let delivery = entry(&parameters, "Delivery");
    assert_eq!(value(&delivery, "Default"), Delivery::default().to_string());
    assert_eq!(
        value(&delivery, "AllowedValues"),
        format!("[{}, {}]", Delivery::AtLeastOnce, Delivery::ExactlyOnce)
    );
    for mode in [Delivery::AtLeastOnce, Delivery::ExactlyOnce] {
        assert_eq!(mode.to_string().parse::<Delivery>().unwrap(), mode);
    }

    // WatermarkTopic: the library's default, and an AllowedPattern that agrees with the
    // library's topic rule (but '.' and '..', which the rule WatermarkTopicIsAKafkaName
    // refuses) and admits no IAM wildcard.
    let watermark = entry(&parameters, "WatermarkTopic");
    assert_eq!(value(&watermark, "Default"), DEFAULT_WATERMARK_TOPIC);
    let pattern = unquote(value(&watermark, "AllowedPattern"));
    assert_eq!(pattern, "^[a-zA-Z0-9._-]{1,249}$");
    let allowed = regex_lite_match(&pattern);
    let long = "w".repeat(249);
    let too_long = "w".repeat(250);
    for name in [
        DEFAULT_WATERMARK_TOPIC,
        "orders.wm_2-x",
        "...",
        long.as_str(),
        too_long.as_str(),
        "",
        "a*",
        "a?",
        "a/b",
        "a b",
        "é",
    ] {
        assert_eq!(
            allowed(name),
            dynamo_outbox::message::validate_topic(name).is_ok(),
            "{name:?}"
        );
    }
    let rule = entry(&section(&t, "Rules"), "WatermarkTopicIsAKafkaName");
    for name in [".", ".."] {
        assert!(allowed(name) && dynamo_outbox::message::validate_topic(name).is_err());
        assert!(
            rule.contains(&format!("!Equals [!Ref WatermarkTopic, \"{name}\"]")),
            "{rule}"
        );
    }
    assert!(
        !rule.contains("RuleCondition"),
        "the rule applies in both modes: {rule}"
    );

    // The conditions.
    let conditions = section(&t, "Conditions");
    assert_eq!(
        entry(&conditions, "ExactlyOnce"),
        format!("!Equals [!Ref Delivery, {}]", Delivery::ExactlyOnce)
    );
    assert_eq!(
        entry(&conditions, "ExactlyOnceOnMsk"),
        "!And\n- !Condition ExactlyOnce\n- !Condition HasMskCluster"
    );

    // The relay's environment: both variables with exactly-once only (at-least-once is the
    // relay's default), the library's names; the Globals (the enqueue function's) have
    // neither.
    let relay = resource(&t, "RelayFunction").join("\n");
    assert_eq!(
        value(&relay, env::DELIVERY),
        format!(
            "!If [ExactlyOnce, {}, !Ref AWS::NoValue]",
            Delivery::ExactlyOnce
        )
    );
    assert_eq!(
        value(&relay, env::WATERMARK_TOPIC),
        "!If [ExactlyOnce, !Ref WatermarkTopic, !Ref AWS::NoValue]"
    );
    for var in [env::DELIVERY, env::WATERMARK_TOPIC] {
        assert_eq!(t.matches(&format!("{var}:")).count(), 1, "{var}");
    }

    // DescribeTable: exactly-once only, on the table only; the store calls it (once per
    // process, for the table's ARN).
    let (condition, granted, text) = relay_statement(&t, "ExactlyOnceTableArn");
    assert_eq!(condition, "ExactlyOnce");
    assert_eq!(granted, set(&["dynamodb:DescribeTable"]));
    assert_contains_all(
        &text,
        &[
            "- !GetAtt OutboxTable.Arn",
            "- !Sub \"arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${TableName}\"",
        ],
    );
    assert!(
        !text.contains('*') && !text.contains("Condition:"),
        "{text}"
    );
    let store = std::fs::read_to_string(root().join("lib/src/protocol/store/mod.rs")).unwrap();
    assert!(
        store.contains(".describe_table()"),
        "the store reads the table's ARN"
    );

    // PartiQLDelete: exactly-once only, on the message partitions only; the store's
    // conditional deletes are PartiQL DELETE statements (and the relay runs no other).
    let (condition, granted, text) = relay_statement(&t, "ExactlyOnceConditionalDeletes");
    assert_eq!(condition, "ExactlyOnce");
    assert_eq!(granted, set(&["dynamodb:PartiQLDelete"]));
    assert_contains_all(
        &text,
        &[
            "- !GetAtt OutboxTable.Arn",
            "ForAllValues:StringLike:",
            "- !Sub \"${KeyPrefix}#MESSAGES#*\"",
        ],
    );
    assert!(!text.contains("#COORDINATION"), "{text}");
    let deletes = std::fs::read_to_string(root().join("lib/src/protocol/store/delete.rs")).unwrap();
    assert!(
        deletes.contains(".batch_execute_statement()")
            && deletes.contains("\"DELETE FROM {} WHERE"),
        "the conditional deletes are PartiQL DELETEs"
    );

    // The Kafka grants of transactions: exactly-once with MskClusterArn only, each on its
    // resource, built from MskClusterArn as the topic ARNs are.
    let prefix = format!("{KAFKA_NAME_PREFIX}.");
    for (sid, kind, actions_wanted, names) in [
        (
            "MskTransactionalIds",
            "transactional-id",
            &[
                "kafka-cluster:DescribeTransactionalId",
                "kafka-cluster:AlterTransactionalId",
            ][..],
            &["TransactionalIds"][..],
        ),
        (
            "MskWatermarkGroups",
            "group",
            &["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"][..],
            &["Groups"][..],
        ),
        (
            "MskWatermarkTopic",
            "topic",
            &["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"][..],
            &["Topics"][..],
        ),
    ] {
        let (condition, granted, text) = relay_statement(&t, sid);
        assert_eq!(condition, "ExactlyOnceOnMsk", "{sid}");
        assert_eq!(granted, set(actions_wanted), "{sid}");
        assert!(
            !text.contains("AWS::Region") && !text.contains("AWS::AccountId"),
            "{text}"
        );
        let var = names[0];
        let base =
            format!("{var}: !Join [\":{kind}/\", !Split [\":cluster/\", !Ref MskClusterArn]]");
        if kind == "topic" {
            assert_eq!(text.matches(&base).count(), 1, "{text}");
            assert!(text.contains("- \"${Topics}/${WatermarkTopic}\""), "{text}");
        } else {
            // This stack's table: its created name, or TableName.
            assert_eq!(text.matches(&base).count(), 2, "{text}");
            assert_contains_all(
                &text,
                &[
                    "- CreateTable",
                    &format!("- \"${{{var}}}/{prefix}${{OutboxTable}}.*\""),
                    &format!("- \"${{{var}}}/{prefix}${{TableName}}.*\""),
                ],
            );
        }
    }
    // No other kafka-cluster grant depends on the mode, and no WriteDataIdempotently: a
    // transactional producer is authorized on its transactional id.
    assert!(
        !actions(&t.lines().collect::<Vec<_>>()).contains("kafka-cluster:WriteDataIdempotently")
    );
    for sid in ["MskCluster", "MskTopics"] {
        let (condition, _, _) = relay_statement(&t, sid);
        assert_eq!(condition, "HasMskCluster", "{sid}");
    }

    // The grant's names match the library's transactional ids and groups of this table,
    // every bucket, and not those of another table (nor the bare prefix).
    let cluster = "arn:aws-cn:kafka:cn-north-1:111122223333:cluster/orders/abcd-1";
    let table_arn = "arn:aws-cn:dynamodb:cn-north-1:111122223333:table/orders-outbox";
    let identity = OutboxIdentity::new(table_arn, "OUTBOX");
    let granted_pattern = |kind: &str| {
        format!(
            "{}/{prefix}orders-outbox.",
            cluster
                .split(":cluster/")
                .collect::<Vec<_>>()
                .join(&format!(":{kind}/"))
        )
    };
    for bucket in [0, 7, 9_999_998] {
        for (kind, name) in [
            ("transactional-id", identity.transactional_id(bucket)),
            ("group", identity.group_id(bucket)),
        ] {
            let arn = format!(
                "{}/{name}",
                cluster
                    .split(":cluster/")
                    .collect::<Vec<_>>()
                    .join(&format!(":{kind}/"))
            );
            assert!(arn.starts_with(&granted_pattern(kind)), "{arn}");
        }
    }
    let other = OutboxIdentity::new(
        "arn:aws-cn:dynamodb:cn-north-1:111122223333:table/orders-outbox2",
        "OUTBOX",
    );
    assert!(!other
        .transactional_id(0)
        .starts_with(&format!("{prefix}orders-outbox.")));
}
