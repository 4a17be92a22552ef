"""End-to-end runs of the real function binaries against Kafka set up as a deployment
would find it: mutual TLS, SCRAM, MSK IAM and SASL/PLAIN, each over TLS with a private
CA, with the certificates, keys and passwords in Secrets Manager (moto's), and with the
functions' environment taken from the SAM template for that setup's parameter values.

Needs the stack (DynamoDB Local, Apache Kafka, moto); scripts/test.sh runs it against
each Kafka line (the kafka_lines mark).  The debug binaries of both functions (the
debug_binaries fixture) are linked into the module's work directory at once (a shared
CARGO_TARGET_DIR may receive another checkout's build of them meanwhile; the relay must be
one that reads KAFKA_TLS_CLIENT_SECRET_ARN) and each runs under the Lambda emulator (real
deadlines; --clean-env: the environment is the template's plus what Lambda and the
execution role provide, i.e. the stack's endpoints, region and credentials).

mTLS, SCRAM and PLAIN go to the stack broker's own listeners, with nothing in between:
OUTBOX_KAFKA_SSL (TLS, a client certificate from the stack's CA required, the principal
its CN) and OUTBOX_KAFKA_SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN over TLS).  The
broker's certificate is from the stack's throwaway CA (OUTBOX_KAFKA_TLS_DIR/ca.pem, SAN
127.0.0.1), which the relay gets as a secret, as a private CA would be; the client
certificate is the stack's outbox.crt/outbox.key (CN outbox), the SASL user
OUTBOX_KAFKA_USER (outbox) with OUTBOX_KAFKA_PASSWORD.  The broker's authorizer allows
nobody else to write (allow.everyone.if.no.acl.found=false; only User:outbox has grants,
and these listeners have no anonymous principal), so a record in the topic was written
by a connection authenticated as outbox.  Kafka has no MSK IAM: that setup puts the MSK
IAM proxy (scripts/outbox_e2e/kafka_proxy.py) in front of the PLAINTEXT listener
(KAFKA_BOOTSTRAP_SERVERS), a TLS listener with the broker's certificate that checks the
OAUTHBEARER token and rewrites Metadata so that every connection goes through it (see its
docstring).

The relay's environment: outbox_e2e.cfn_template resolves template.yaml's Globals and
RelayFunction variables for the setup's parameters (KafkaAuth, KafkaBootstrapServers
(the listener), KafkaSaslSecretArn, KafkaTlsCaSecretArn, KafkaTlsClientSecretArn,
MskClusterArn, SubnetIds, SecurityGroupIds, UseExistingTable=true, TableName,
KafkaTopics); a parameter the template does not declare (yet) is reported, and its
agreed variable (KAFKA_TLS_CA_SECRET_ARN, KAFKA_TLS_CLIENT_SECRET_ARN) is set as the
template would set it.  OUTBOX_TABLE_NAME and the rest come from the template as they
are (OUTBOX_MAX_RUN_TIME 900s: the invocation's deadline bounds each run).

Setups, each: 20 messages over 5 keys through the enqueue function (answer checked), one
relay invocation with the schedule's payload (no function error, published 20, leases
released), the topic read back from the broker's PLAINTEXT listener with confluent-kafka
(each id once, per-key order, default partitions, headers):
  a. mtls: KafkaAuth=mtls against OUTBOX_KAFKA_SSL, which requires a client certificate
     from the stack's CA; the CA bundle and the client certificate and key are secrets
     (KAFKA_TLS_CA_SECRET_ARN, KAFKA_TLS_CLIENT_SECRET_ARN as JSON {"certificate",
     "privateKey"}); the records prove the relay presented CN outbox (the only principal
     with a grant); the private key is nowhere in the relay's log.
  b. scram: KafkaAuth=scram-sha-512 against OUTBOX_KAFKA_SASL_SSL, the CA as a secret,
     the SASL secret {"username","password"} first with user outbox and a WRONG password:
     the relay publishes nothing, its log says the brokers refused SASL/SCRAM-SHA-512
     authentication, names the secret (to check its password) and holds neither
     password; then the secret is rotated to the right password and the same warm
     environment publishes the messages that waited within at most 3 invocations (the
     refused credentials are forgotten; a connect cut by a run's deadline keeps what it
     read, so the next run may meet one more refusal, which rskafka retries for its 5 s
     budget before the relay reads the secret again; and in the debug build each new
     connection's SCRAM proof, PBKDF2 with 4096 rounds of SHA-512, takes a noticeable
     part of a second on a loaded machine).
  c. msk-iam: KafkaAuth=msk-iam with MskClusterArn, fake AWS credentials with a session
     token; the proxy verifies the OAUTHBEARER token's presigned URL (host
     kafka.{region}.amazonaws.com, Action kafka-cluster:Connect, SigV4 signature
     recomputed with the fake secret key, expiry, credential scope, session token) and
     saw the produce requests.  The CA is a secret here because the proxy's certificate
     is the broker's, from the stack's CA (MSK's are publicly trusted: leave it unset
     there).
  d. no-vpc: the template's settings for a function outside a VPC (SubnetIds and
     SecurityGroupIds empty, no MskClusterArn) with Confluent-style SASL/PLAIN over TLS
     against OUTBOX_KAFKA_SASL_SSL (user outbox, the CA as a secret): the template gives
     the relay the same environment as with subnets and no VpcConfig (present with
     subnets; both checked), and the run publishes as the others do; the password is
     not in the relay's log.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
import uuid

import boto3
import pytest

from outbox_e2e import cfn_template
from outbox_e2e import kafka as kafka_client
from outbox_e2e.dynamodb import create_outbox_table
from outbox_e2e.emulator import Emulator
from outbox_e2e.kafka_proxy import Proxy, check_msk_iam_token
from outbox_e2e.paths import TEMPLATE
from outbox_e2e.procs import Started
from outbox_e2e.report import Failed, check, step
from outbox_e2e.serverless import (ENQUEUE_TIMEOUT_S, SCHEDULE_PAYLOAD, TOPIC_PARTITIONS,
                                   check_topic, enqueue_batch)
from outbox_e2e.stack import Stack, aws_env

pytestmark = pytest.mark.kafka_lines

# The relay's timeout here: the run ends 3 s (OUTBOX_SHUTDOWN_MARGIN) before it.
RELAY_TIMEOUT = 8.0
# Template parameters this script sets that the template may not declare yet, and the
# variable each one becomes (the agreed names).
AGREED_VARIABLES = {"KafkaTlsCaSecretArn": "KAFKA_TLS_CA_SECRET_ARN",
                    "KafkaTlsClientSecretArn": "KAFKA_TLS_CLIENT_SECRET_ARN"}
WITH_VPC = {"SubnetIds": "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
            "SecurityGroupIds": "sg-0123456789abcdef0"}
NO_VPC = {"SubnetIds": "", "SecurityGroupIds": ""}


# ------------------------------------------------------------------ the stack's Kafka

class StackKafka:
    """The broker's listeners and the stack's TLS material and credentials: the CA that
    signed the broker's certificate, the relay's client certificate and key (CN outbox)
    and the outbox user's password."""

    def __init__(self, stack: Stack):
        self.plaintext = stack.kafka
        self.ssl = stack.kafka_ssl
        self.sasl_ssl = stack.kafka_sasl_ssl
        self.user = stack.kafka_user
        self.password = stack.kafka_password
        tls = stack.kafka_tls_dir
        self.ca_pem = self._read(tls, "ca.pem")
        self.client_cert_pem = self._read(tls, f"{self.user}.crt")
        self.client_key_pem = self._read(tls, f"{self.user}.key")
        # The broker's key and certificate in one PEM file (scripts/kafka_broker.py tls):
        # the MSK IAM proxy's server certificate, trusted through the same CA.
        self.broker_pem = os.path.join(tls, "broker.pem")
        check(os.path.isfile(self.broker_pem), f"{self.broker_pem} missing")

    @staticmethod
    def _read(tls: str, name: str) -> str:
        path = os.path.join(tls, name)
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            raise Failed(f"the stack's TLS material: {e}") from e


# ------------------------------------------------------------------- the template

def template_environment(function: str, params: dict[str, str]) -> tuple[dict, list[str]]:
    """The function's variables as the template sets them for `params`, and notes on the
    parameters the template does not declare (their agreed variables set directly)."""
    declared = cfn_template.Template(TEMPLATE, {})
    params = dict(params)
    direct, notes = {}, []
    for name in list(params):
        if name in declared.types:
            continue
        value = params.pop(name)
        if name not in AGREED_VARIABLES:
            raise Failed(f"template.yaml has no parameter {name}")
        if value:
            direct[AGREED_VARIABLES[name]] = value
            notes.append(f"template.yaml declares no {name}: {AGREED_VARIABLES[name]} set "
                         f"directly")
    allowed = (declared.doc["Parameters"].get("KafkaAuth") or {}).get("AllowedValues")
    if "KafkaAuth" in params and allowed and params["KafkaAuth"] not in allowed:
        notes.append(f"template.yaml's KafkaAuth does not allow {params['KafkaAuth']} (yet); "
                     f"KAFKA_AUTH resolved as given")
    try:
        env = cfn_template.Template(TEMPLATE, params).environment(function)
    except cfn_template.TemplateError as e:
        raise Failed(f"template.yaml, {function}: {e}") from e
    env.update(direct)
    return env, notes


def vpc_config(params: dict[str, str]):
    declared = cfn_template.Template(TEMPLATE, {}).types
    tpl = cfn_template.Template(TEMPLATE, {k: v for k, v in params.items() if k in declared})
    raw = tpl.resources["RelayFunction"]["Properties"].get("VpcConfig")
    resolved = tpl.resolve({"VpcConfig": raw}) if raw is not None else {}
    return resolved.get("VpcConfig", "absent")


def lambda_provided(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What Lambda and the execution role provide here: the stack's endpoints, region and
    credentials."""
    return dict(aws_env(("AWS_ENDPOINT_URL_SECRETS_MANAGER",)), **(extra or {}))


# ------------------------------------------------------------------------ a run

class Run:
    """What the setups share: the table, the enqueue function, the secrets client."""

    def __init__(self, workdir: str, started: list, suffix: str, binaries: dict):
        self.workdir, self.started, self.suffix, self.binaries = \
            workdir, started, suffix, binaries
        # The running test's lambda_emulator fixture and what it started (its relays and
        # proxies stop at its end).
        self.emulator = None
        self.test_started = None
        self.table = f"kset-{suffix}"
        self.topics = f"kset-{suffix}-*"
        self.sm = boto3.client("secretsmanager")

    def common_params(self) -> dict[str, str]:
        return {"UseExistingTable": "true", "TableName": self.table,
                "KafkaTopics": self.topics}

    def secret(self, name: str, text: str) -> str:
        return self.sm.create_secret(Name=f"kset-{self.suffix}-{name}",
                                     SecretString=text)["ARN"]

    def start_enqueue(self) -> None:
        env, _ = template_environment("EnqueueFunction", dict(
            self.common_params(), MskClusterArn="", KafkaBootstrapServers="127.0.0.1:9",
            **NO_VPC))
        self.enqueue = Emulator.function("EnqueueFunction", self.binaries["enqueue"],
                                         self.workdir, ENQUEUE_TIMEOUT_S,
                                         dict(env, **lambda_provided()), max_concurrency=10,
                                         init_timeout=30)
        self.started.append(self.enqueue)
        self.enqueue.wait_ready()

    def relay(self, name: str, params: dict[str, str], extra: dict | None = None,
              timeout: float = RELAY_TIMEOUT):
        env, notes = template_environment("RelayFunction", dict(self.common_params(), **params))
        for n in notes:
            step(f"{name}: {n}")
        fn = self.emulator.function(f"Relay-{name}", self.binaries["relay"], timeout,
                                    dict(env, **lambda_provided(extra)), max_concurrency=1,
                                    init_timeout=30)
        kafka = {k: v for k, v in sorted(env.items()) if k.startswith("KAFKA_")}
        step(f"{name}: RelayFunction under lambda_runtime.py (timeout {timeout:g}s) "
             f"with the template's environment: {kafka}")
        return fn, env

    def topic(self, name: str) -> str:
        topic = f"kset-{self.suffix}-{name}"
        kafka_client.create_topic(topic, TOPIC_PARTITIONS)
        return topic

    def invoke_relay(self, relay, name: str) -> dict:
        started = time.time()
        status, function_error, body = relay.invoke(SCHEDULE_PAYLOAD,
                                                    timeout=relay.timeout + 30)
        check(status == 200 and not function_error,
              f"{name}: relay invocation HTTP {status} {function_error or ''} {body[:500]!r}")
        s = json.loads(body)
        check(s.get("released") is True and s.get("refused_writes") == 0,
              f"{name}: leases not released or refused writes: {s}")
        step(f"{name}: relay published {s['published']} in {time.time() - started:.1f}s "
             f"(stop_reason {s['stop_reason']}, {s.get('publish_failures')} failed publishes)")
        return s

    def publish_through(self, relay, name: str, proxy: Proxy | None = None) -> None:
        """20 messages enqueued, one relay invocation, read back; with a proxy, the
        produce requests went through it."""
        topic = self.topic(name)
        sent, _ = enqueue_batch(self.enqueue, topic, name)
        s = self.invoke_relay(relay, name)
        check(s["published"] == 20, f"{name}: published {s['published']}, 20 enqueued: {s}")
        records, nkeys = check_topic(topic, sent, 15)
        through = ""
        if proxy is not None:
            produced = [e for e in proxy.events_of("forwarded") if e["api_key"] == 0]
            check(produced, f"{name}: no produce request went through the proxy")
            through = f"; {len(produced)} produce request(s) through the proxy"
        step(f"{name}: confluent-kafka read the {len(records)} ids back from the broker, "
             f"each once, per-key order over {nkeys} keys{through}")


def log_of(fn) -> str:
    return fn.function_log_text()


# ---------------------------------------------------------------------- setups

def setup_mtls(run: Run, kafka: StackKafka) -> None:
    name = "mtls"
    ca = run.secret("ca", kafka.ca_pem)
    client = run.secret("client", json.dumps({"certificate": kafka.client_cert_pem,
                                              "privateKey": kafka.client_key_pem}))
    step(f"{name}: the broker's SSL listener {kafka.ssl} requires a client certificate of "
         f"the stack's CA; secrets {ca.rsplit(':', 1)[-1]} (CA bundle), "
         f"{client.rsplit(':', 1)[-1]} (certificate CN {kafka.user} and privateKey)")
    relay, env = run.relay(name, dict(WITH_VPC, MskClusterArn="", KafkaAuth="mtls",
                                      KafkaBootstrapServers=kafka.ssl,
                                      KafkaTlsCaSecretArn=ca, KafkaTlsClientSecretArn=client))
    check(env.get("KAFKA_AUTH") == "mtls" and env.get("KAFKA_TLS_CLIENT_SECRET_ARN") == client,
          f"{name}: the relay's environment: {env}")
    run.publish_through(relay, name)
    log = log_of(relay)
    body = "".join(line for line in kafka.client_key_pem.splitlines() if "-----" not in line)
    check(body[:24] not in log and "PRIVATE KEY" not in log,
          f"{name}: the private key is in the relay's log")
    step(f"{name}: ok: published over TLS with the client certificate from the secret (the "
         f"broker lets only User:{kafka.user} write); the key is not in the relay's log")


def setup_scram(run: Run, kafka: StackKafka) -> None:
    name = "scram"
    username, password = kafka.user, kafka.password
    wrong = f"wrong-{secrets.token_hex(8)}"
    ca = run.secret("scram-ca", kafka.ca_pem)
    sasl = run.secret("scram", json.dumps({"username": username, "password": wrong}))
    step(f"{name}: the broker's SASL_SSL listener {kafka.sasl_ssl}, SASL/SCRAM-SHA-512 as "
         f"{username}; the SASL secret holds a wrong password first")
    # A refused password ends the connect at once (the brokers' refusal is not retried
    # within rskafka's backoff), which forgets the credentials; the next connect, at most
    # one a second, reads the secret again.
    relay, _ = run.relay(name, dict(WITH_VPC, MskClusterArn="", KafkaAuth="scram-sha-512",
                                    KafkaBootstrapServers=kafka.sasl_ssl,
                                    KafkaSaslSecretArn=sasl, KafkaTlsCaSecretArn=ca),
                         timeout=16.0)
    topic = run.topic(name)
    sent, _ = enqueue_batch(run.enqueue, topic, name)
    s = run.invoke_relay(relay, f"{name} (wrong password)")
    check(s["published"] == 0, f"{name}: published with a wrong password: {s}")
    log = log_of(relay)
    check("refused SASL/SCRAM-SHA-512 authentication" in log and sasl in log,
          f"{name}: the relay's log does not say the brokers refused the secret's "
          f"credentials:\n{relay.function_tail()}")
    check(wrong not in log and password not in log, f"{name}: a password in the relay's log")
    step(f"{name}: wrong password: nothing published, the broker refused the exchange and "
         f"the relay's log names the secret (and no password)")
    run.sm.put_secret_value(SecretId=sasl, SecretString=json.dumps(
        {"username": username, "password": password}))
    # The first run after the rotation publishes (seen: 20 of 20 in it); a connect cut by
    # the last run's deadline after it read the secret keeps the old password for one more
    # refusal, so a loaded machine gets up to three runs.
    published, runs = 0, 0
    while published < 20 and runs < 3:
        runs += 1
        published += run.invoke_relay(relay, f"{name} (rotated secret, run {runs})")["published"]
    check(published == 20, f"{name}: {published} of 20 published in {runs} runs after the "
                           f"rotation")
    records, nkeys = check_topic(topic, sent, 15)
    check(relay.stats()["totals"]["cold_starts"] == 1,
          f"{name}: the second invocation was not the warm environment")
    check(password not in log_of(relay), f"{name}: the password is in the relay's log")
    step(f"{name}: ok: after the rotation the warm environment read the secret again and "
         f"published over SCRAM-SHA-512 in {runs} run(s), {len(records)} ids read back once "
         f"each over {nkeys} keys")


def setup_msk_iam(run: Run, kafka: StackKafka) -> None:
    name = "msk-iam"
    region = os.environ.get("AWS_REGION", "us-east-1")
    creds = {"AWS_ACCESS_KEY_ID": f"ASIA{secrets.token_hex(8).upper()}",
             "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
             "AWS_SESSION_TOKEN": f"IQoJ/{secrets.token_urlsafe(24)}+="}
    proxy = Proxy(kafka.plaintext, kafka.broker_pem, region=region,
                  access_key=creds["AWS_ACCESS_KEY_ID"],
                  secret_key=creds["AWS_SECRET_ACCESS_KEY"],
                  session_token=creds["AWS_SESSION_TOKEN"]).start()
    run.test_started.append(proxy)
    ca = run.secret("msk-ca", kafka.ca_pem)
    step(f"{name}: the MSK IAM proxy on {proxy.address} (TLS with the broker's "
         f"certificate) verifying MSK IAM tokens for region {region} and the role's (fake) "
         f"credentials, forwarding to the PLAINTEXT listener {kafka.plaintext}")
    relay, _ = run.relay(name, dict(
        WITH_VPC, KafkaAuth="msk-iam", KafkaBootstrapServers=proxy.address,
        MskClusterArn=f"arn:aws:kafka:{region}:123456789012:cluster/outbox/"
                      f"{uuid.uuid4()}-1", KafkaTlsCaSecretArn=ca), extra=creds)
    run.publish_through(relay, name, proxy)
    verdicts = proxy.events_of("sasl")
    check(verdicts and all(e["accepted"] for e in verdicts),
          f"{name}: tokens refused: {verdicts}")
    log = log_of(relay)
    check(creds["AWS_SECRET_ACCESS_KEY"] not in log and creds["AWS_SESSION_TOKEN"] not in log,
          f"{name}: the credentials are in the relay's log")
    # the check has teeth: the same token fails with another secret key, region, session
    # token, or later than its expiry
    token, now = proxy.tokens[0], time.time()
    for why, args in [
        ("the SigV4 signature does not verify",
         (region, creds["AWS_ACCESS_KEY_ID"], "another-secret", creds["AWS_SESSION_TOKEN"], now)),
        ("not https://kafka.eu-west-1.amazonaws.com",
         ("eu-west-1", creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"], None, now)),
        ("the session token is not the caller's",
         (region, creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"], "other", now)),
        ("not valid now",
         (region, creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"], None, now + 901)),
    ]:
        got = check_msk_iam_token(token, *args)
        check(got is not None and why in got, f"{name}: a token checked with "
              f"{args[0]}/another key, token or time: {got!r}, wanted {why!r}")
    step(f"{name}: ok: {len(verdicts)} OAUTHBEARER token(s) verified (SigV4, scope, expiry, "
         f"session token; the same token fails with another secret key, region, session "
         f"token or after its expiry); no credential in the relay's log")


def setup_no_vpc(run: Run, kafka: StackKafka) -> None:
    name = "no-vpc"
    username, password = kafka.user, kafka.password
    ca = run.secret("plain-ca", kafka.ca_pem)
    sasl = run.secret("plain", json.dumps({"username": username, "password": password}))
    params = dict(MskClusterArn="", KafkaAuth="plain", KafkaBootstrapServers=kafka.sasl_ssl,
                  KafkaSaslSecretArn=sasl, KafkaTlsCaSecretArn=ca)
    with_vpc, _ = template_environment("RelayFunction",
                                       dict(run.common_params(), **params, **WITH_VPC))
    without, _ = template_environment("RelayFunction",
                                      dict(run.common_params(), **params, **NO_VPC))
    check(with_vpc == without, f"{name}: the template's environment differs without a VPC: "
                               f"{with_vpc} / {without}")
    outside = vpc_config(dict(run.common_params(), **params, **NO_VPC))
    inside = vpc_config(dict(run.common_params(), **params, **WITH_VPC))
    check(outside == "absent" and inside != "absent",
          f"{name}: VpcConfig should be absent without subnets and present with them: "
          f"{outside} / {inside}")
    step(f"{name}: SubnetIds and SecurityGroupIds empty, no MskClusterArn: the template gives "
         f"the relay the same environment as with subnets and no VpcConfig (with subnets: "
         f"{json.dumps(inside)})")
    relay, _ = run.relay(name, dict(params, **NO_VPC))
    run.publish_through(relay, name)
    check(password not in log_of(relay), f"{name}: the password is in the relay's log")
    step(f"{name}: ok: published over SASL/PLAIN as {username} on the broker's SASL_SSL "
         f"listener {kafka.sasl_ssl}; the password is not in the relay's log")

SETUPS = {"mtls": setup_mtls, "scram": setup_scram, "msk-iam": setup_msk_iam,
          "no-vpc": setup_no_vpc}


@pytest.fixture(scope="module")
def setups(stack, debug_binaries, tmp_path_factory):
    """The table and the enqueue function the setups share, with the binaries linked into
    the module's work directory; the enqueue function stops after the last setup."""
    t0 = time.time()
    workdir = str(tmp_path_factory.mktemp("kafka-setups"))
    # Taken at once: a shared CARGO_TARGET_DIR may get another checkout's build of the
    # same binaries while this runs. The relay must be one that reads the TLS secrets.
    binaries = {}
    for fn in ("relay", "enqueue"):
        binaries[fn] = os.path.join(workdir, os.path.basename(debug_binaries[fn]))
        try:  # a hard link keeps this build's file (the linkers write a new one)
            os.link(debug_binaries[fn], binaries[fn])
        except OSError:
            shutil.copy2(debug_binaries[fn], binaries[fn])
    with open(binaries["relay"], "rb") as f:
        check(b"KAFKA_TLS_CLIENT_SECRET_ARN" in f.read(),
              f"{debug_binaries['relay']} does not read KAFKA_TLS_CLIENT_SECRET_ARN: another "
              f"checkout's build?")
    shared = Started()
    run = Run(workdir, shared, uuid.uuid4().hex[:8], binaries)
    try:
        create_outbox_table(run.table)
        kafka = StackKafka(stack)
        run.start_enqueue()
        step(f"table {run.table}, topics {run.topics}, EnqueueFunction under "
             f"lambda_runtime.py with the template's environment (build and setup "
             f"{time.time() - t0:.1f}s)")
        yield run, kafka
    finally:
        shared.stop_all()


@pytest.mark.parametrize("name", SETUPS)
def test_kafka_setup(name, setups, lambda_emulator, started) -> None:
    """One deployment's Kafka setup: 20 messages through the enqueue function, published
    by the relay with the template's environment for it, read back from the broker
    (the module docstring has each setup's own checks)."""
    run, kafka = setups
    run.emulator, run.test_started = lambda_emulator, started
    t = time.time()
    SETUPS[name](run, kafka)
    step(f"{name}: {time.time() - t:.1f}s")
