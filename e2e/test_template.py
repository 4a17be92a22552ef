"""The SAM template (template.yaml) as each kind of user deploys it: for every named setup
(below) the template is translated by SAM's own translator (samtranslator, in the venv,
as `sam deploy` would), resolved for the setup's parameter values (outbox_e2e.cfn_template:
Conditions evaluated, what they leave out removed), and checked for what the user would
see in the deployed stack:

  - the relay's grants: kafka-cluster only with MskClusterArn, on that cluster and its
    KafkaTopics topics, and with Delivery=exactly-once also on the outbox's transactional
    ids and groups and the watermark topic; dynamodb:DescribeTable and (on the message
    partitions) dynamodb:PartiQLDelete with exactly-once only;
    secretsmanager:GetSecretValue on exactly the named Kafka secrets;
    their KMS key only with a secret; every DynamoDB item grant of the stack (relay,
    enqueue function, OutboxWriterPolicy) limited to dynamodb:LeadingKeys {KeyPrefix}#*;
    the table key through DynamoDB only with TableKmsKeyArn;
  - VpcConfig and the VPC execution policy together, only with SubnetIds;
  - the functions' Kafka and table variables, the relay's poison policy (PutItem only
    with quarantine-after), delivery mode (OUTBOX_DELIVERY and OUTBOX_WATERMARK_TOPIC with
    exactly-once only) and memory;
  - the table: created or not, its stream, SSE with the customer managed key, PITR;
  - the alarms: always there (the enqueue function's with it), actions only with
    AlarmTopicArn;
  - the outputs and their exports; the cross-account enqueue permissions.

The Rules section is evaluated too: each setup passes them, and each refused combination
(msk-iam without a cluster, mtls without a client secret, subnets without security
groups, ...) fails with its message.

Then cfn-lint on template.yaml and on every resolved setup, `sam validate --lint` on
template.yaml, and the policy scan: Checkov (--framework cloudformation) over
template.yaml and every resolved setup, from its own venv
(~/.cache/dynamo-outbox/checkov-venv/bin/checkov, installed by scripts/install.sh;
$OUTBOX_CHECKOV names another). Every check Checkov would fail is suppressed in the
template, on the resource, with its reason (Metadata: checkov: skip); a failed check here
is a new finding.

What template.rs (functions/relay/tests/template.rs) checks of the template's text, or
against the library's code, is not repeated here.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import subprocess
import sys

import pytest

from outbox_e2e import cfn_template
from outbox_e2e.paths import CACHE, ROOT, TEMPLATE
from outbox_e2e.report import step

ACCOUNT, REGION, STACK = "123456789012", "eu-west-1", "orders-outbox"
MSK = f"arn:aws:kafka:{REGION}:{ACCOUNT}:cluster/orders/0a1b2c3d-1111-2222-3333-444455556666-2"
# MSK Serverless clusters have ARNs of the same form (cluster/NAME/UUID), and their topics
# topic/NAME/UUID/TOPIC as provisioned ones.
MSK_SERVERLESS = f"arn:aws:kafka:{REGION}:{ACCOUNT}:cluster/orders-sls/9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff-s1"
SECRET = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:"
SASL = SECRET + "AmazonMSK_orders-AbCdEf"
CONFLUENT = SECRET + "confluent-orders-Zy12Xw"
CA = SECRET + "kafka-ca-QwErTy"
CLIENT = SECRET + "kafka-client-AsDfGh"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
TABLE_KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/abcd1234-ab12-cd34-ef56-0987654321ab"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:outbox-alarms"
VPC = {"SubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
       "SecurityGroupIds": "sg-0123456789abcdef0"}
TOPICS = "orders,payments-*"

BASE = {"KafkaTopics": TOPICS}

# The setups a user deploys (docs/deploy.md has the prerequisites of the first five).
SETUPS: dict[str, dict] = {
    "msk-iam-vpc": {**VPC, "MskClusterArn": MSK,
                    "KafkaBootstrapServers": "b-1.orders.kafka.eu-west-1.amazonaws.com:9098"},
    "msk-scram-vpc": {**VPC, "MskClusterArn": MSK, "KafkaAuth": "scram-sha-512",
                      "KafkaSaslSecretArn": SASL, "KafkaSecretsKmsKeyArn": KEY,
                      "KafkaBootstrapServers": "b-1.orders.kafka.eu-west-1.amazonaws.com:9096"},
    "msk-serverless-iam": {**VPC, "MskClusterArn": MSK_SERVERLESS,
                           "KafkaBootstrapServers":
                               "boot-abc.c1.kafka-serverless.eu-west-1.amazonaws.com:9098"},
    "confluent-plain-internet": {"KafkaAuth": "plain", "KafkaSaslSecretArn": CONFLUENT,
                                 "KafkaBootstrapServers":
                                     "pkc-abc12.eu-west-1.aws.confluent.cloud:9092"},
    "self-managed-mtls-vpc": {**VPC, "KafkaAuth": "mtls", "KafkaTlsCaSecretArn": CA,
                              "KafkaTlsClientSecretArn": CLIENT, "KafkaSecretsKmsKeyArn": KEY,
                              "KafkaBootstrapServers": "kafka-1.internal:9093,kafka-2.internal:9093"},
    "scram-with-ca-internet": {"KafkaAuth": "scram-sha-256", "KafkaSaslSecretArn": CONFLUENT,
                               "KafkaTlsCaSecretArn": CA,
                               "KafkaBootstrapServers": "kafka.example.com:9094"},
    "schedule-mode": {**VPC, "MskClusterArn": MSK, "WakeOn": "schedule", "EventBusName": "default",
                      "KafkaBootstrapServers": "b-1:9098"},
    "existing-table": {**VPC, "MskClusterArn": MSK, "UseExistingTable": "true",
                       "TableName": "shared-table", "KeyPrefix": "orders.v1",
                       "TableStreamArn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/shared-table"
                                         "/stream/2026-01-01T00:00:00.000",
                       "TableKmsKeyArn": TABLE_KEY, "KafkaBootstrapServers": "b-1:9098"},
    "no-enqueue-api": {**VPC, "MskClusterArn": MSK, "EnableEnqueueApi": "false",
                       "EnqueueCallerAccountIds": "111122223333",
                       "KafkaBootstrapServers": "b-1:9098"},
    "no-point-in-time-recovery": {**VPC, "MskClusterArn": MSK, "PointInTimeRecovery": "false",
                                  "KafkaBootstrapServers": "b-1:9098"},
    "table-kms-key": {**VPC, "MskClusterArn": MSK, "TableKmsKeyArn": TABLE_KEY,
                      "KafkaBootstrapServers": "b-1:9098"},
    "alarm-topic": {**VPC, "MskClusterArn": MSK, "AlarmTopicArn": TOPIC,
                    "KafkaBootstrapServers": "b-1:9098"},
    "quarantine-poison-512mb": {**VPC, "MskClusterArn": MSK, "PoisonPolicy": "quarantine-after=1",
                                "RelayMemorySize": "512", "KafkaBootstrapServers": "b-1:9098"},
    "enqueue-callers-in-other-accounts": {**VPC, "MskClusterArn": MSK,
                                          "EnqueueCallerAccountIds": "111122223333,444455556666",
                                          "KafkaBootstrapServers": "b-1:9098"},
    # Delivery=exactly-once: with MSK IAM the transactional grants on the cluster's ids,
    # groups and watermark topic; without MskClusterArn (SCRAM, mutual TLS, another Kafka:
    # ACLs authorize) DescribeTable alone.
    "exactly-once-msk-iam": {**VPC, "MskClusterArn": MSK, "Delivery": "exactly-once",
                             "KafkaBootstrapServers": "b-1:9098"},
    "exactly-once-msk-iam-existing-table": {**VPC, "MskClusterArn": MSK, "Delivery": "exactly-once",
                                            "WatermarkTopic": "orders.outbox-watermarks",
                                            "UseExistingTable": "true", "TableName": "shared-table",
                                            "KeyPrefix": "orders.v1", "WakeOn": "schedule",
                                            "KafkaBootstrapServers": "b-1:9098"},
    "exactly-once-msk-serverless-iam": {**VPC, "MskClusterArn": MSK_SERVERLESS,
                                        "Delivery": "exactly-once",
                                        "KafkaBootstrapServers":
                                            "boot-abc.c1.kafka-serverless.eu-west-1.amazonaws.com:9098"},
    "exactly-once-msk-scram-without-cluster-arn": {**VPC, "KafkaAuth": "scram-sha-512",
                                                   "Delivery": "exactly-once",
                                                   "KafkaSaslSecretArn": SASL,
                                                   "KafkaSecretsKmsKeyArn": KEY,
                                                   "KafkaBootstrapServers": "b-1:9096"},
    "exactly-once-self-managed-mtls": {**VPC, "KafkaAuth": "mtls", "Delivery": "exactly-once",
                                       "KafkaTlsCaSecretArn": CA, "KafkaTlsClientSecretArn": CLIENT,
                                       "KafkaBootstrapServers": "kafka-1.internal:9093"},
    # A watermark topic given with at-least-once is ignored: no variable, no grant.
    "at-least-once-with-a-watermark-topic": {**VPC, "MskClusterArn": MSK,
                                             "Delivery": "at-least-once",
                                             "WatermarkTopic": "orders.outbox-watermarks",
                                             "KafkaBootstrapServers": "b-1:9098"},
}

# Combinations the Rules refuse, with a word of the message the user gets.
REFUSED: dict[str, tuple[dict, str]] = {
    "msk-iam without a cluster": ({"KafkaBootstrapServers": "b:9098"}, "needs MskClusterArn"),
    "mtls without a client secret": ({"KafkaAuth": "mtls", "KafkaBootstrapServers": "k:9093"},
                                     "needs KafkaTlsClientSecretArn"),
    "mtls with a SASL secret": ({"KafkaAuth": "mtls", "KafkaTlsClientSecretArn": CLIENT,
                                 "KafkaSaslSecretArn": SASL, "KafkaBootstrapServers": "k:9093"},
                                "uses no SASL"),
    "plain without a secret": ({"KafkaAuth": "plain", "KafkaBootstrapServers": "k:9092"},
                               "need KafkaSaslSecretArn"),
    "msk-iam with a client certificate": ({"MskClusterArn": MSK, "KafkaTlsClientSecretArn": CLIENT,
                                           "KafkaBootstrapServers": "b:9098"},
                                          "leave them empty with msk-iam"),
    "a secrets key without a secret": ({"MskClusterArn": MSK, "KafkaSecretsKmsKeyArn": KEY,
                                        "KafkaBootstrapServers": "b:9098"},
                                       "name the secrets"),
    "subnets without security groups": ({"MskClusterArn": MSK, "SubnetIds": "subnet-0123456789abcdef0",
                                         "KafkaBootstrapServers": "b:9098"},
                                        "needs SecurityGroupIds"),
    "security groups without subnets": ({"MskClusterArn": MSK, "SecurityGroupIds": "sg-0123456789abcdef0",
                                         "KafkaBootstrapServers": "b:9098"},
                                        "give SubnetIds too"),
    "an empty topic entry": ({"MskClusterArn": MSK, "KafkaTopics": "orders,",
                              "KafkaBootstrapServers": "b:9098"}, "none empty"),
    "a watermark topic named '..'": ({"MskClusterArn": MSK, "Delivery": "exactly-once",
                                      "WatermarkTopic": "..", "KafkaBootstrapServers": "b:9098"},
                                     "cannot be"),
}

# The alarms every deployment has; the enqueue function's with the function.
ALARMS = {"RelayErrorsAlarm", "RelayConcurrencyAlarm", "OutboxStuckAlarm", "RefusedWritesAlarm",
          "SuccessorFailuresAlarm", "QuarantinedItemsAlarm"}
ENQUEUE_ALARMS = {"EnqueueFaultsAlarm"}
# The partitions each role may reach (dynamodb:LeadingKeys, ForAllValues:StringLike), by
# statement: a role reaches no other partition kind of its outbox, and nothing else of a
# shared table (docs/security.md).
RELAY_KEYS = {"OutboxTable": ["{p}#COORDINATION", "{p}#MESSAGES#*"],
              "StartSuccessor": ["{p}#CONTINUATION#*"],
              "RankWakeUps": ["{p}#WAKEUP"],
              "QuarantinePoison": ["{p}#DEADLETTER"],
              "QuarantineFence": ["{p}#COORDINATION"],
              "ExactlyOnceConditionalDeletes": ["{p}#MESSAGES#*"]}
ENQUEUE_KEYS = {"OutboxTable": ["{p}#MESSAGES#*", "{p}#SEQUENCE#*", "{p}#IDEMPOTENCY#*"]}
WRITER_KEYS = {"OutboxTable": ["{p}#MESSAGES#*", "{p}#SEQUENCE#*"]}
ITEM_ACTIONS = {"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:PutItem",
                "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem",
                "dynamodb:ConditionCheckItem", "dynamodb:PartiQLDelete"}
VPC_POLICY = "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
# The relay's kafka-cluster actions and the resource kind each is granted on: with
# MskClusterArn, and (EXACTLY_ONCE_KAFKA) with Delivery=exactly-once too.
MSK_KAFKA = {"kafka-cluster:Connect": "cluster", "kafka-cluster:DescribeCluster": "cluster",
             "kafka-cluster:DescribeTopic": "topics", "kafka-cluster:WriteData": "topics"}
EXACTLY_ONCE_KAFKA = {"kafka-cluster:DescribeTransactionalId": "transactional-ids",
                      "kafka-cluster:AlterTransactionalId": "transactional-ids",
                      "kafka-cluster:DescribeGroup": "groups",
                      "kafka-cluster:AlterGroup": "groups",
                      # The watermark topic: DescribeTopic here too (a statement of its own).
                      "kafka-cluster:ReadData": "watermark-topic"}
# Transactional ids and groups: dynamo-outbox.{table name}.{16 hex digits}.{bucket}
# (dynamo_outbox::protocol::watermark).
KAFKA_NAME_PREFIX = "dynamo-outbox"
DEFAULT_WATERMARK_TOPIC = "dynamo-outbox-watermarks"


def check(cond, what):
    assert cond, what


def eq(got, want, what):
    assert got == want, f"{what}: got {got!r}, want {want!r}"


class _NoManagedPolicies:
    """The translator's loader of managed policy names: the template names none (its
    Policies are statements), so it never needs IAM."""

    def load(self):
        return {}


def translate(params: dict) -> dict:
    """template.yaml as SAM translates it for these parameter values (CodeUri as `sam
    package` leaves it: an S3 location)."""
    from samtranslator.translator.transform import transform
    # The translator's usage metrics, never published here, warn at exit otherwise.
    logging.getLogger("samtranslator").setLevel(logging.ERROR)
    doc = cfn_template.load_yaml(TEMPLATE)
    for res in doc["Resources"].values():
        if res.get("Type") == "AWS::Serverless::Function":
            res["Properties"]["CodeUri"] = "s3://bucket/outbox.zip"
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    return transform(copy.deepcopy(doc), dict(params), _NoManagedPolicies())


def deployed(params: dict) -> tuple[dict, cfn_template.Template]:
    tpl = cfn_template.Template.from_doc(translate(params), params, name="translated")
    tpl.pseudo.update({"AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
                       "AWS::StackName": STACK})
    return tpl.resolved(), tpl


def statements(role: dict) -> list[dict]:
    out = []
    for policy in role["Properties"].get("Policies", []):
        out.extend(policy["PolicyDocument"]["Statement"])
    return out


def actions(stmt: dict) -> set[str]:
    a = stmt["Action"]
    return {a} if isinstance(a, str) else set(a)


def granted(stmts: list[dict], prefix: str) -> list[dict]:
    return [s for s in stmts if any(a.startswith(prefix) for a in actions(s))]


def as_list(v):
    return v if isinstance(v, list) else [v]


# ------------------------------------------------------------------------ the checks

def check_setup(name: str, p: dict, t: dict) -> None:
    res, out = t["Resources"], t.get("Outputs", {})
    get = lambda k, d="": p.get(k, d)  # noqa: E731
    msk, vpc = get("MskClusterArn"), bool(get("SubnetIds"))
    enqueue = get("EnableEnqueueApi", "true") == "true"
    created = get("UseExistingTable", "false") == "false"
    prefix = get("KeyPrefix", "OUTBOX")
    stream = get("WakeOn", "stream") == "stream"

    relay_role = res["RelayFunctionRole"]
    relay = statements(relay_role)

    # kafka-cluster: only with MskClusterArn, on that cluster and its topics; with
    # Delivery=exactly-once also on the outbox's transactional ids, groups and watermark
    # topic (check_exactly_once).
    kafka = granted(relay, "kafka-cluster:")
    exactly_once = get("Delivery", "at-least-once") == "exactly-once"
    if msk:
        want_actions = sorted(list(MSK_KAFKA) + (list(EXACTLY_ONCE_KAFKA) + ["kafka-cluster:DescribeTopic"]
                                                 if exactly_once else []))
        eq(sorted(a for s in kafka for a in actions(s)), want_actions, "kafka-cluster actions")
        cluster = [s for s in kafka if "kafka-cluster:Connect" in actions(s)][0]
        eq(cluster["Resource"], msk, "the cluster")
        topics = [s for s in kafka if "kafka-cluster:WriteData" in actions(s)][0]
        base = msk.replace(":cluster/", ":topic/")
        eq(as_list(topics["Resource"]), [f"{base}/{x}" for x in TOPICS.split(",")],
           "one topic ARN per KafkaTopics entry")
    else:
        eq(kafka, [], "no kafka-cluster permission without MskClusterArn")
    check_exactly_once(p, relay, created)

    # Secrets: exactly the named ones; their key via Secrets Manager only with one.
    named = [get(k) for k in ("KafkaSaslSecretArn", "KafkaTlsCaSecretArn",
                              "KafkaTlsClientSecretArn") if get(k)]
    reads = granted(relay, "secretsmanager:")
    eq(sorted(r for s in reads for r in as_list(s["Resource"])), sorted(named),
       "GetSecretValue on exactly the named secrets")
    for s in reads:
        eq(actions(s), {"secretsmanager:GetSecretValue"}, "secret actions")
    secret_keys = [s for s in granted(relay, "kms:")
                   if "secretsmanager" in json.dumps(s.get("Condition", {}))]
    if named and get("KafkaSecretsKmsKeyArn"):
        eq(len(secret_keys), 1, "the secrets' key")
        eq((actions(secret_keys[0]), secret_keys[0]["Resource"]),
           ({"kms:Decrypt"}, get("KafkaSecretsKmsKeyArn")), "kms:Decrypt on the secrets' key")
        eq(secret_keys[0]["Condition"], {"StringEquals": {
            "kms:ViaService": f"secretsmanager.{REGION}.amazonaws.com"}}, "through Secrets Manager")
    else:
        eq(secret_keys, [], "no secrets key grant")

    # Item grants: every DynamoDB item action of the stack under LeadingKeys naming the
    # role's own partition kinds (no "{prefix}#*" anywhere).
    roles = [("relay", relay, RELAY_KEYS)]
    if enqueue:
        roles.append(("enqueue", statements(res["EnqueueFunctionRole"]), ENQUEUE_KEYS))
    roles.append(("writer policy",
                  res["OutboxWriterPolicy"]["Properties"]["PolicyDocument"]["Statement"],
                  WRITER_KEYS))
    table_arn = ({"Fn::GetAtt": ["OutboxTable", "Arn"]} if created else
                 f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{get('TableName')}")
    for who, stmts, kinds in roles:
        items = [s for s in stmts if actions(s) & ITEM_ACTIONS]
        check(items, f"{who}: has item grants")
        for s in items:
            want = [k.format(p=prefix) for k in kinds.get(s.get("Sid"), ["(no such statement)"])]
            eq(s.get("Condition"), {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": want}},
               f"{who}: {s.get('Sid')} {sorted(actions(s))} limited to its partitions")
            check(f"{prefix}#*" not in json.dumps(s), f"{who}: no {prefix}#* grant")
            eq(s["Resource"], table_arn, f"{who}: on the table")
        for s in granted(stmts, "dynamodb:"):
            check(not (actions(s) & {"dynamodb:Scan", "dynamodb:*"}), f"{who}: no Scan")
            if actions(s) == {"dynamodb:DescribeTable"}:
                # A table action (no item key): the relay's, with exactly-once only
                # (check_exactly_once).
                check(who == "relay" and exactly_once, f"{who}: DescribeTable")
                continue
            if not actions(s) & ITEM_ACTIONS:
                check(stream and all(a.startswith("dynamodb:") and "Stream" in a
                                     or a in ("dynamodb:GetRecords", "dynamodb:GetShardIterator")
                                     for a in actions(s)),
                      f"{who}: only stream actions go without LeadingKeys: {actions(s)}")
        table_keys = [s for s in stmts if "dynamodb." in json.dumps(s.get("Condition", {}))]
        if get("TableKmsKeyArn"):
            eq(len(table_keys), 1, f"{who}: the table's key")
            eq((actions(table_keys[0]), table_keys[0]["Resource"], table_keys[0]["Condition"]),
               ({"kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"}, get("TableKmsKeyArn"),
                {"StringEquals": {"kms:ViaService": f"dynamodb.{REGION}.amazonaws.com"}}),
               f"{who}: the table's key through DynamoDB")
        else:
            eq(table_keys, [], f"{who}: no table key grant")

    # The network: VpcConfig, and the ENI permissions with it, only in a VPC.
    fn = res["RelayFunction"]["Properties"]
    if vpc:
        eq(fn.get("VpcConfig"), {"SubnetIds": p["SubnetIds"].split(","),
                                 "SecurityGroupIds": p["SecurityGroupIds"].split(",")}, "VpcConfig")
    else:
        check("VpcConfig" not in fn, "no VpcConfig without SubnetIds")
    managed = relay_role["Properties"]["ManagedPolicyArns"]
    eq(VPC_POLICY in managed, vpc, "AWSLambdaVPCAccessExecutionRole only in a VPC")
    for r in res.values():
        if r["Type"] == "AWS::IAM::Role":
            eq(VPC_POLICY in r["Properties"].get("ManagedPolicyArns", []),
               vpc and r is relay_role, "no other role has the VPC policy")
    if enqueue:
        check("VpcConfig" not in res["EnqueueFunction"]["Properties"],
              "the enqueue function runs outside a VPC")

    # The relay's variables: the mechanism and each named secret, nothing else secret.
    env = fn["Environment"]["Variables"]
    eq(env["KAFKA_AUTH"], get("KafkaAuth", "msk-iam"), "KAFKA_AUTH")
    eq(env["KAFKA_BOOTSTRAP_SERVERS"], get("KafkaBootstrapServers"), "KAFKA_BOOTSTRAP_SERVERS")
    for var, param in (("KAFKA_SASL_SECRET_ARN", "KafkaSaslSecretArn"),
                       ("KAFKA_TLS_CA_SECRET_ARN", "KafkaTlsCaSecretArn"),
                       ("KAFKA_TLS_CLIENT_SECRET_ARN", "KafkaTlsClientSecretArn")):
        eq(env.get(var), get(param) or None, var)
    eq(env["OUTBOX_KEY_PREFIX"], prefix, "OUTBOX_KEY_PREFIX")
    # The delivery mode: set with exactly-once only (the relay's default is at-least-once),
    # the watermark topic with it.
    eq(env.get("OUTBOX_DELIVERY"), "exactly-once" if exactly_once else None, "OUTBOX_DELIVERY")
    eq(env.get("OUTBOX_WATERMARK_TOPIC"),
       get("WatermarkTopic", DEFAULT_WATERMARK_TOPIC) if exactly_once else None,
       "OUTBOX_WATERMARK_TOPIC")
    # The poison policy; PutItem of dead letters under every policy (an unpublishable
    # record is moved aside under block too), of continuations with the doorbell.
    policy = get("PoisonPolicy", "block")
    eq(env["OUTBOX_POISON_POLICY"], policy, "OUTBOX_POISON_POLICY")
    puts = sorted(k for s in relay if "dynamodb:PutItem" in actions(s)
                  for k in s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
    eq(puts, sorted(([f"{prefix}#CONTINUATION#*"] if stream else [])
                    + [f"{prefix}#DEADLETTER", f"{prefix}#WAKEUP"]),
       "the relay puts continuations with the doorbell, dead letters and wake-ups")
    checks = sorted(k for s in relay if "dynamodb:ConditionCheckItem" in actions(s)
                    for k in s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
    eq(checks, [f"{prefix}#COORDINATION"], "the move checks the bucket's lease only")
    # The successor through the stream (a continuation in its own partitions) with the
    # doorbell; without it, Lambda's Invoke on the function itself.
    eq(env["OUTBOX_SUCCESSOR"], "stream" if stream else "invoke", "OUTBOX_SUCCESSOR")
    eq("RelaySuccessorPolicy" in res, not stream, "lambda:InvokeFunction without the doorbell only")
    eq(fn.get("RecursiveLoop"), None if stream else "Allow", "RecursiveLoop")
    eq(int(fn["MemorySize"]), int(get("RelayMemorySize", "128")), "the relay's memory")
    if enqueue:
        envq = res["EnqueueFunction"]["Properties"]["Environment"]["Variables"]
        check(not any(k.startswith("KAFKA_") for k in envq), "the enqueue function has no Kafka")
        check(not {"OUTBOX_DELIVERY", "OUTBOX_WATERMARK_TOPIC"} & set(envq),
              "the delivery mode is the relay's only")

    # The table.
    if created:
        props = res["OutboxTable"]["Properties"]
        eq(props.get("SSESpecification"),
           {"SSEEnabled": True, "SSEType": "KMS", "KMSMasterKeyId": get("TableKmsKeyArn")}
           if get("TableKmsKeyArn") else None, "SSE with the customer managed key")
        eq(props.get("PointInTimeRecoverySpecification"),
           None if get("PointInTimeRecovery") == "false"
           else {"PointInTimeRecoveryEnabled": True}, "PITR, on unless turned off")
        eq(props.get("DeletionProtectionEnabled"), True, "deletion protection")
        eq(props.get("TimeToLiveSpecification"),
           {"AttributeName": "TimeToLive", "Enabled": True}, "TTL on TimeToLive")
        eq((res["OutboxTable"].get("DeletionPolicy"), res["OutboxTable"].get("UpdateReplacePolicy")),
           ("Retain", "Retain"), "retained on delete and on replacement")
        eq(props.get("StreamSpecification"), {"StreamViewType": "KEYS_ONLY"} if stream else None,
           "the stream")
    else:
        check("OutboxTable" not in res, "no table created with UseExistingTable")
    doorbell = res.get("RelayDoorbell")
    eq(bool(doorbell), stream, "the doorbell with WakeOn=stream")
    if doorbell:
        mapping = doorbell["Properties"]
        eq(mapping["MetricsConfig"], {"Metrics": ["EventCount"]}, "MetricsConfig")
        # No record expires (-1), so a continuation queued behind a run as long as the
        # longest RelayTimeout is still delivered, and a batch is dropped only when its
        # invocation failed (RelayErrorsAlarm); one invocation at a time per shard.
        eq(int(mapping["MaximumRecordAgeInSeconds"]), -1, "MaximumRecordAgeInSeconds")
        eq(int(mapping["MaximumRetryAttempts"]), 0, "MaximumRetryAttempts")
        eq(int(mapping["ParallelizationFactor"]), 1, "ParallelizationFactor")
        patterns = [json.loads(f["Pattern"]) for f in mapping["FilterCriteria"]["Filters"]]
        pk = get("PartitionKeyAttribute", "PK")
        eq([p["dynamodb"]["Keys"][pk]["S"][0]["prefix"] for p in patterns],
           [f"{prefix}#MESSAGES#", f"{prefix}#CONTINUATION#"], "the doorbell's filters")
        eq({tuple(p["eventName"]) for p in patterns}, {("INSERT",)}, "inserts only")
    eq("CommitNotificationRule" in res, bool(get("EventBusName")) and not stream,
       "commit notifications only in schedule mode with a bus")

    # Alarms: always, the enqueue function's with it; actions only with a topic.
    alarms = {k for k, r in res.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    eq(alarms, ALARMS | (ENQUEUE_ALARMS if enqueue else set()), "alarms")
    eq("EnqueueFaultsMetricFilter" in res, enqueue, "the enqueue faults' metric filter")
    # The relay's log level keeps its EMF lines (which Lambda files as INFO): every
    # alarm on an Outbox metric depends on them.
    logging_config = fn["LoggingConfig"]
    eq((logging_config.get("LogFormat"), logging_config.get("ApplicationLogLevel")),
       ("JSON", "INFO"), "the relay's log format and application log level")
    for a in alarms:
        props = res[a]["Properties"]
        want = [get("AlarmTopicArn")] if get("AlarmTopicArn") else None
        eq((props.get("AlarmActions"), props.get("OKActions")), (want, want), f"{a} actions")

    # Enqueue callers: the caller policy here, a permission per other account.
    accounts = [x for x in get("EnqueueCallerAccountIds").split(",") if x] if enqueue else []
    perms = sorted(r["Properties"]["Principal"] for k, r in res.items()
                   if k.startswith("EnqueueCallerAccount"))
    eq(perms, sorted(accounts), "one permission per caller account")
    eq("EnqueueFunction" in res, enqueue, "the enqueue function")

    # Outputs, each exported as {stack}-{name}.
    want = {"RelayFunctionArn", "RelayLogGroupName", "OutboxTableName", "OutboxTableArn",
            "OutboxWriterPolicyArn"}
    if enqueue:
        want |= {"EnqueueFunctionArn", "EnqueueCallerPolicyArn"}
    if stream:
        want |= {"DoorbellStreamArn"}
    eq(set(out), want, "outputs")
    for k, o in out.items():
        eq(o["Export"]["Name"], f"{STACK}-{k}", f"{k} exported")


def check_exactly_once(p: dict, relay: list[dict], created: bool) -> None:
    """Delivery=exactly-once and only it: OUTBOX_DELIVERY and OUTBOX_WATERMARK_TOPIC in the
    relay's environment (is_set_in check_setup), DescribeTable on the table, PartiQLDelete
    on its message partitions, and with
    MskClusterArn each transactional action on its own resource, in the cluster's
    partition, region and account: the transactional ids and groups of this stack's
    table (dynamo-outbox.{table}.*), and the watermark topic. Nothing of it otherwise."""
    get = lambda k, d="": p.get(k, d)  # noqa: E731
    exactly_once = get("Delivery", "at-least-once") == "exactly-once"
    msk = get("MskClusterArn")
    describe = [s for s in relay if "dynamodb:DescribeTable" in actions(s)]
    partiql = [s for s in relay if "dynamodb:PartiQLDelete" in actions(s)]
    transactional = [s for s in relay if actions(s) & set(EXACTLY_ONCE_KAFKA)]
    if not exactly_once:
        eq(describe, [], "no DescribeTable without exactly-once")
        eq(partiql, [], "no PartiQLDelete without exactly-once")
        eq(transactional, [], "no transactional, group or ReadData grant without exactly-once")
        return
    table_arn = ({"Fn::GetAtt": ["OutboxTable", "Arn"]} if created else
                 f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{get('TableName')}")
    eq([(actions(s), s["Resource"], s.get("Condition")) for s in describe],
       [({"dynamodb:DescribeTable"}, table_arn, None)], "DescribeTable on the table only")
    # Its LeadingKeys (the message partitions) are checked with every item grant.
    eq([actions(s) for s in partiql], [{"dynamodb:PartiQLDelete"}],
       "PartiQLDelete, one statement of its own")
    if not msk:
        eq(transactional, [], "no kafka-cluster grant of transactions without MskClusterArn")
        return
    table = "${OutboxTable}" if created else get("TableName")

    def arn(kind: str, name: str):
        text = f"{msk.replace(':cluster/', f':{kind}/')}/{name}"
        # A created table's name is known at deploy time only: a kept Fn::Sub.
        return {"Fn::Sub": text} if "${" in text else text

    want = {
        "transactional-ids": arn("transactional-id", f"{KAFKA_NAME_PREFIX}.{table}.*"),
        "groups": arn("group", f"{KAFKA_NAME_PREFIX}.{table}.*"),
        "watermark-topic": arn("topic", get("WatermarkTopic", DEFAULT_WATERMARK_TOPIC)),
    }
    for action, kind in EXACTLY_ONCE_KAFKA.items():
        where = [s["Resource"] for s in relay if action in actions(s)]
        eq(where, [want[kind]], f"{action} on the {kind} only")
    watermark = [s for s in relay if "kafka-cluster:ReadData" in actions(s)]
    eq(actions(watermark[0]), {"kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"},
       "DescribeTopic and ReadData on the watermark topic")
    check("kafka-cluster:WriteDataIdempotently" not in json.dumps(relay),
          "no WriteDataIdempotently (a transactional producer is authorized on its id)")


def check_rules(name: str, params: dict, tpl: cfn_template.Template) -> None:
    failed = tpl.failed_rules()
    eq(failed, [], f"{name}: the Rules pass")


def check_refused(label: str, params: dict, word: str) -> None:
    tpl = cfn_template.Template(TEMPLATE, {**BASE, **params})
    failed = tpl.failed_rules()
    check(failed, f"{label}: refused by a rule")
    check(any(word in msg for _, msg in failed), f"{label}: message with {word!r}: {failed}")


# ------------------------------------------------------------------------ lint and scan

def tool(name: str) -> str:
    """A tool of this Python's venv (cfn-lint, sam) when there, else from PATH."""
    own = os.path.join(os.path.dirname(sys.executable), name)
    return own if os.access(own, os.X_OK) else name


def run(cmd: list[str], what: str) -> tuple[int, str]:
    """Runs a tool of the venv from the repository's root: its status and output."""
    cmd = [tool(cmd[0]), *cmd[1:]]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return p.returncode, (p.stdout + p.stderr).strip()


def checkov(checkov_bin: str, files: list[str]) -> tuple[list[str], dict]:
    """Checkov over template.yaml and the resolved setups (one run): the failed checks
    (none expected) and the skipped ones (each with the template's reason)."""
    problems, skipped = [], {}
    targets = [TEMPLATE, *files]
    cmd = [checkov_bin, "--framework", "cloudformation", "--output", "json", "--compact",
           # No Prisma Cloud API call (guidelines, severities): offline, and quicker.
           "--skip-download"]
    for target in targets:
        cmd += ["-f", target]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    try:
        reports = json.loads(p.stdout)
    except json.JSONDecodeError:
        return [f"checkov: unreadable output (exit {p.returncode})\n{p.stdout[-2000:]}"
                f"{p.stderr[-2000:]}"], {}
    reports = reports if isinstance(reports, list) else [reports]
    scanned = {}
    for report in reports:
        results = report.get("results", {})
        for kind in ("passed_checks", "failed_checks", "skipped_checks"):
            for r in results.get(kind, []):
                scanned.setdefault(os.path.basename(r["file_path"]), set()).add(kind)
        for f in results.get("failed_checks", []):
            problems.append(f"checkov {os.path.basename(f['file_path'])}: {f['check_id']} "
                            f"{f['check_name']} on {f['resource']}")
        for s in results.get("skipped_checks", []):
            key = (s["check_id"], s["resource"].split(".")[-1])
            skipped.setdefault(key, (s.get("check_result") or {}).get("suppress_comment", ""))
    for (cid, resource), why in skipped.items():
        if not why.strip():
            problems.append(f"checkov: {cid} on {resource} is skipped without a reason")
    for target in targets:
        if "passed_checks" not in scanned.get(os.path.basename(target), set()):
            problems.append(f"checkov: {os.path.basename(target)} not scanned (no check passed)")
    return problems, skipped


# ------------------------------------------------------------------------ the tests

@functools.cache
def setup_deployed(name: str) -> tuple[dict, cfn_template.Template]:
    """A setup as SAM translates and the resolver resolves it (once per session)."""
    return deployed({**BASE, **SETUPS[name]})


@pytest.mark.parametrize("name", SETUPS)
def test_setup(name):
    """A named setup: the Rules pass, and the deployed stack has the grants, network,
    variables, table, alarms, outputs and permissions its parameters call for."""
    params = {**BASE, **SETUPS[name]}
    t, tpl = setup_deployed(name)
    check_rules(name, params, tpl)
    check_setup(name, params, t)


@pytest.mark.parametrize("label", REFUSED)
def test_refused(label):
    """A combination the Rules refuse, with the message the user gets."""
    params, word = REFUSED[label]
    check_refused(label, params, word)


@pytest.fixture(scope="module")
def setup_files(tmp_path_factory) -> list[str]:
    """Every setup that translates, resolved, as a JSON template (for the linters)."""
    out_dir = tmp_path_factory.mktemp("template-setups")
    files = []
    for name in SETUPS:
        try:
            t, _ = setup_deployed(name)
        except Exception:  # that setup's own test reports it
            continue
        path = out_dir / f"{name}.json"
        path.write_text(json.dumps(t, indent=1))
        files.append(str(path))
    return files


def test_cfn_lint_setups(setup_files):
    """cfn-lint on every resolved setup."""
    rc, out = run(["cfn-lint", "--", *setup_files], "cfn-lint setups")
    assert rc == 0, f"cfn-lint on the resolved setups:\n{out}"
    step(f"cfn-lint: {len(setup_files)} setups")


def test_cfn_lint_template():
    """cfn-lint on template.yaml."""
    rc, out = run(["cfn-lint", TEMPLATE], "cfn-lint")
    assert rc == 0, f"cfn-lint template.yaml:\n{out}"


def test_sam_validate_lint():
    """`sam validate --lint` on template.yaml."""
    env = dict(os.environ, SAM_CLI_TELEMETRY="0")
    p = subprocess.run([tool("sam"), "validate", "--lint", "--template", TEMPLATE],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0, f"sam validate --lint:\n{p.stdout}{p.stderr}"


def test_checkov(setup_files):
    """Checkov over template.yaml and every resolved setup: no failed check, every skip
    with the template's reason."""
    checkov_bin = os.environ.get("OUTBOX_CHECKOV") or os.path.join(
        CACHE, "checkov-venv", "bin", "checkov")
    assert os.access(checkov_bin, os.X_OK), f"checkov not found at {checkov_bin} (scripts/install.sh)"
    problems, skipped = checkov(checkov_bin, setup_files)
    assert not problems, "\n".join(problems)
    step(f"checkov: template.yaml and {len(setup_files)} setups, no failed check")
    for (cid, resource), why in sorted(skipped.items()):
        step(f"  skipped {cid} on {resource}: {' '.join(why.split())}")


# ------------------------------------------------------------------------ the table's guard

STACK_POLICY = os.path.join(ROOT, "deploy", "stack-policy.json")
# The parameters whose change replaces a created table: its name and key schema.
KEY_SETTINGS = ("TableName", "PartitionKeyAttribute", "SortKeyAttribute")


def test_stack_policy_refuses_replacing_the_table():
    """deploy/stack-policy.json (what docs/deploy.md applies with set-stack-policy): a
    stack policy CloudFormation accepts (Statement of Effect, Action, Principal "*",
    Resource), which allows every other update and denies Update:Replace on the table's
    logical id; and the key settings a replacement would come from are the table's name
    and key schema, each documented as immutable."""
    with open(STACK_POLICY) as f:
        policy = json.load(f)
    stmts = policy["Statement"]
    for s in stmts:
        eq(set(s) - {"Effect", "Action", "NotAction", "Principal", "Resource", "NotResource",
                     "Condition"}, set(), "only stack policy elements")
        eq(s["Principal"], "*", "a stack policy's Principal is *")
    denies = [s for s in stmts if s["Effect"] == "Deny"
              and "Update:Replace" in as_list(s["Action"])]
    eq([as_list(s["Resource"]) for s in denies], [["LogicalResourceId/OutboxTable"]],
       "Update:Replace denied on the table")
    allows = [s for s in stmts if s["Effect"] == "Allow"]
    eq([(s["Action"], s["Resource"]) for s in allows], [("Update:*", "*")],
       "every other update allowed (a stack policy denies what it does not allow)")
    doc = cfn_template.load_yaml(TEMPLATE)
    table = doc["Resources"]["OutboxTable"]
    eq(table["Type"], "AWS::DynamoDB::Table", "OutboxTable is the table")
    props = table["Properties"]
    # The properties whose change CloudFormation answers with a replacement of the table:
    # its name and its key schema, set by exactly these parameters.
    eq(json.dumps(props["TableName"]),
       json.dumps({"Fn::If": ["HasTableName", {"Ref": "TableName"}, {"Ref": "AWS::NoValue"}]}),
       "TableName names the table")
    eq([(k["AttributeName"], k["KeyType"]) for k in props["KeySchema"]],
       [({"Ref": "PartitionKeyAttribute"}, "HASH"), ({"Ref": "SortKeyAttribute"}, "RANGE")],
       "the key schema")
    for name in KEY_SETTINGS:
        check("Immutable once deployed" in doc["Parameters"][name]["Description"],
              f"{name} documented as immutable")


# ------------------------------------------------------------------------ parameter patterns

def allowed(param: str, value: str) -> bool:
    """Whether CloudFormation accepts `value` for `param` (its AllowedPattern, matched
    whole, as CloudFormation does)."""
    import re
    pattern = cfn_template.load_yaml(TEMPLATE)["Parameters"][param]["AllowedPattern"]
    return re.fullmatch(pattern, value) is not None


@pytest.mark.parametrize("param", ["KafkaSaslSecretArn", "KafkaTlsCaSecretArn",
                                   "KafkaTlsClientSecretArn"])
def test_secret_arns_must_be_full(param):
    """A Kafka secret parameter takes a secret's full ARN (the name, '-', the 6 random
    characters Secrets Manager adds) or nothing; a partial ARN, which would match no
    secret in the relay's grant, is refused at deploy time."""
    for ok in ("", SASL, CA, CLIENT, SECRET + "AmazonMSK_team/orders-prod-a1B2c3",
               "arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:k-AbC123"):
        check(allowed(param, ok), f"{param}: {ok!r} accepted")
    for bad in (SECRET + "AmazonMSK_orders", SECRET + "AmazonMSK_orders-AbCdE",
                SECRET + "AmazonMSK_orders-*", SECRET + "AmazonMSK_orders-AbCdEf ",
                "AmazonMSK_orders-AbCdEf", f"arn:aws:kms:{REGION}:{ACCOUNT}:key/x-AbCdEf"):
        check(not allowed(param, bad), f"{param}: {bad!r} refused")


def test_watermark_topic_is_a_kafka_topic_name():
    """WatermarkTopic: Kafka's topic names (1 to 249 letters, digits, '.', '_', '-'; not '.'
    or '..', which the rule WatermarkTopicIsAKafkaName refuses), and no IAM wildcard: the
    name is the relay's topic ARN as is."""
    for ok in ("dynamo-outbox-watermarks", "orders.outbox_watermarks-2", "a", "x" * 249, "..."):
        check(allowed("WatermarkTopic", ok), f"{ok!r} accepted")
    for bad in ("", "x" * 250, "orders/watermarks", "watermarks*", "water?marks", "a b", "é"):
        check(not allowed("WatermarkTopic", bad), f"{bad!r} refused")
    for name in (".", ".."):
        check_refused(f"WatermarkTopic {name!r}", {"MskClusterArn": MSK, "WatermarkTopic": name,
                                                   "KafkaBootstrapServers": "b:9098"}, "cannot be")


EXACTLY_ONCE_SIDS = {"ExactlyOnceTableArn", "ExactlyOnceConditionalDeletes",
                     "MskTransactionalIds", "MskWatermarkGroups", "MskWatermarkTopic"}


@pytest.mark.parametrize("label,params", [
    ("msk-iam", {**VPC, "MskClusterArn": MSK, "KafkaBootstrapServers": "b-1:9098"}),
    ("scram-without-cluster-arn", {"KafkaAuth": "scram-sha-512", "KafkaSaslSecretArn": SASL,
                                   "KafkaBootstrapServers": "b-1:9096"}),
])
def test_exactly_once_adds_its_grants_and_variables_and_nothing_else(label, params):
    """The same deployment in both modes: exactly-once's relay role is at-least-once's plus
    exactly its own statements (DescribeTable; with MskClusterArn the transactional ids,
    groups and watermark topic), its environment plus OUTBOX_DELIVERY and
    OUTBOX_WATERMARK_TOPIC, and every other resource is the same. The default (Delivery
    unset) is at-least-once to the byte."""
    default, _ = deployed({**BASE, **params})
    at_least_once, _ = deployed({**BASE, **params, "Delivery": "at-least-once"})
    exactly_once, _ = deployed({**BASE, **params, "Delivery": "exactly-once"})
    eq(json.dumps(at_least_once, sort_keys=True), json.dumps(default, sort_keys=True),
       "Delivery=at-least-once is the default deployment")
    relay_default = statements(default["Resources"]["RelayFunctionRole"])
    relay_eo = statements(exactly_once["Resources"]["RelayFunctionRole"])
    added = [s for s in relay_eo if s.get("Sid") in EXACTLY_ONCE_SIDS]
    eq({s["Sid"] for s in added},
       EXACTLY_ONCE_SIDS if params.get("MskClusterArn")
       else {"ExactlyOnceTableArn", "ExactlyOnceConditionalDeletes"},
       "exactly-once's statements")
    eq([s for s in relay_eo if s.get("Sid") not in EXACTLY_ONCE_SIDS], relay_default,
       "every other statement as in at-least-once")
    check(not [s for s in relay_default if s.get("Sid") in EXACTLY_ONCE_SIDS],
          "at-least-once has none of them")
    env_default = default["Resources"]["RelayFunction"]["Properties"]["Environment"]["Variables"]
    env_eo = exactly_once["Resources"]["RelayFunction"]["Properties"]["Environment"]["Variables"]
    eq(env_eo, {**env_default, "OUTBOX_DELIVERY": "exactly-once",
                "OUTBOX_WATERMARK_TOPIC": DEFAULT_WATERMARK_TOPIC}, "the relay's environment")
    for name in set(default["Resources"]) | set(exactly_once["Resources"]):
        if name in ("RelayFunctionRole", "RelayFunction"):
            continue
        eq(exactly_once["Resources"].get(name), default["Resources"].get(name), name)
    fn_default = {k: v for k, v in default["Resources"]["RelayFunction"]["Properties"].items()
                  if k != "Environment"}
    fn_eo = {k: v for k, v in exactly_once["Resources"]["RelayFunction"]["Properties"].items()
             if k != "Environment"}
    eq(fn_eo, fn_default, "the relay function apart from its environment")


def test_alarm_topic_must_be_a_standard_topic():
    """AlarmTopicArn: a standard SNS topic; a FIFO (.fifo) topic, which CloudWatch cannot
    notify, is refused at deploy time."""
    check(allowed("AlarmTopicArn", ""), "empty")
    check(allowed("AlarmTopicArn", TOPIC), "a standard topic")
    check(not allowed("AlarmTopicArn", TOPIC + ".fifo"), "a FIFO topic refused")


def test_poison_policy_offers_what_fires_on_lambda():
    """PoisonPolicy: block or quarantine-after=1. quarantine-after=N counts attempts within
    one run, and a Lambda run with only a parked bucket stops at its first idle check, so
    a larger N would rarely fire on the function; it is refused at deploy time."""
    check(allowed("PoisonPolicy", "block"), "block")
    check(allowed("PoisonPolicy", "quarantine-after=1"), "quarantine-after=1")
    for refused in ("quarantine-after=2", "quarantine-after=10", "quarantine-after=0", ""):
        check(not allowed("PoisonPolicy", refused), f"{refused!r} refused")
