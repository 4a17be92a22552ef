#!/usr/bin/env python3
"""End-to-end runs of the real function binaries against Kafka set up as a deployment
would find it: mutual TLS, SCRAM, MSK IAM and SASL/PLAIN, each over TLS with a private
CA, with the certificates, keys and passwords in Secrets Manager (moto's), and with the
functions' environment taken from the SAM template for that setup's parameter values.

  scripts/kafka_setups_e2e.py [--setup NAME ...] [--template FILE] [--keep]

Runs inside `scripts/stack.sh run` (DynamoDB Local, tansu, moto) with the stack's venv
python, from any directory; builds the debug binaries of both functions (cargo build,
reused when lambda_e2e.py built them), links them into its work directory at once (a
shared CARGO_TARGET_DIR may receive another checkout's build of them meanwhile; the
relay must be one that reads KAFKA_TLS_CLIENT_SECRET_ARN) and runs each under
scripts/lambda_runtime.py
(real deadlines; --clean-env: the environment is the template's plus what Lambda and the
execution role provide, i.e. the stack's endpoints, region and credentials).

tansu speaks neither TLS nor SASL: each setup puts scripts/kafka_proxy.py in front of it
(a TLS listener with a server certificate from a test CA, the broker's SASL layer, and
Metadata rewritten so that every connection goes through it; see its docstring).  The
certificates are made here with `cryptography`: a CA for the listener, a second CA for
client certificates, the listener's certificate for 127.0.0.1, the relay's client
certificate (CN outbox-relay).

The relay's environment: scripts/cfn_template.py resolves template.yaml's Globals and
RelayFunction variables for the setup's parameters (KafkaAuth, KafkaBootstrapServers
(the proxy), KafkaSaslSecretArn, KafkaTlsCaSecretArn, KafkaTlsClientSecretArn,
MskClusterArn, SubnetIds, SecurityGroupIds, UseExistingTable=true, TableName,
KafkaTopics); a parameter the template does not declare (yet) is reported, and its
agreed variable (KAFKA_TLS_CA_SECRET_ARN, KAFKA_TLS_CLIENT_SECRET_ARN) is set as the
template would set it.  OUTBOX_TABLE_NAME and the rest come from the template as they
are (OUTBOX_MAX_RUN_TIME 900s: the invocation's deadline bounds each run).

Setups, each: 20 messages over 5 keys through the enqueue function (answer checked), one
relay invocation with the schedule's payload (no function error, published 20, leases
released), the topic read back straight from tansu with confluent-kafka (each id once,
per-key order, default partitions, headers), and what the proxy saw:
  a. mtls: KafkaAuth=mtls, the listener requires a client certificate from the client
     CA; the CA bundle and the client certificate and key are secrets
     (KAFKA_TLS_CA_SECRET_ARN, KAFKA_TLS_CLIENT_SECRET_ARN as JSON {"certificate",
     "privateKey"}); the proxy saw TLS connections presenting CN outbox-relay and the
     produce requests; the private key is nowhere in the relay's log.
  b. scram: KafkaAuth=scram-sha-512, the CA as a secret, the SASL secret
     {"username","password"} first with a WRONG password: the relay publishes nothing,
     the proxy refused the proof, the relay's log names the secret and says to check
     the password (and holds neither password); then the secret is rotated to the right
     password and the same warm environment publishes the messages that waited within
     at most 3 invocations (the refused credentials are forgotten; a connect cut by a
     run's deadline keeps what it read, so the next run may meet one more refusal, which
     rskafka retries for its 5 s budget before the relay reads the secret again; and in
     the debug build each new connection's SCRAM proof, PBKDF2 with 4096 rounds of
     SHA-512, takes a noticeable part of a second on a loaded machine).
  c. msk-iam: KafkaAuth=msk-iam with MskClusterArn, fake AWS credentials with a session
     token; the proxy verifies the OAUTHBEARER token's presigned URL (host
     kafka.{region}.amazonaws.com, Action kafka-cluster:Connect, SigV4 signature
     recomputed with the fake secret key, expiry, credential scope, session token).  The
     CA is a secret here because the proxy's certificate is from the test CA (MSK's are
     publicly trusted: leave it unset there).
  d. no-vpc: the template's settings for a function outside a VPC (SubnetIds and
     SecurityGroupIds empty, no MskClusterArn) with Confluent-style SASL/PLAIN over TLS
     (the CA as a secret): the template gives the relay the same environment as with
     subnets and no VpcConfig (present with subnets; both checked), and the run publishes
     as the others do.

Prints what it checks; on a failure the function logs' last lines; exits 1 then.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import boto3
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
sys.path.insert(0, SCRIPTS)

import cfn_template  # noqa: E402
import serverless_e2e as sls  # noqa: E402
from kafka_proxy import Proxy, check_msk_iam_token  # noqa: E402

NAME = "kafka-setups-e2e"
sls.NAME = NAME  # the shared helpers print under this script's name
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
TEMPLATE = os.path.join(ROOT, "template.yaml")
# The relay's timeout here: the run ends 3 s (OUTBOX_SHUTDOWN_MARGIN) before it.
RELAY_TIMEOUT = 8.0
# Template parameters this script sets that the template may not declare yet, and the
# variable each one becomes (the agreed names).
AGREED_VARIABLES = {"KafkaTlsCaSecretArn": "KAFKA_TLS_CA_SECRET_ARN",
                    "KafkaTlsClientSecretArn": "KAFKA_TLS_CLIENT_SECRET_ARN"}
WITH_VPC = {"SubnetIds": "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
            "SecurityGroupIds": "sg-0123456789abcdef0"}
NO_VPC = {"SubnetIds": "", "SecurityGroupIds": ""}

step = sls.step
check = sls.check
Failed = sls.Failed


# ------------------------------------------------------------------ certificates

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: str, issuer: x509.Name, key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False))


def make_ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(cn, _name(cn), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca, cn: str, server: bool):
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    b = (_builder(cn, ca_cert.subject, key)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
             ca_key.public_key()), critical=False)
         .add_extension(x509.ExtendedKeyUsage(
             [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
             critical=False))
    if server:
        import ipaddress
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def pem(cert) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


class Pki:
    """The listener's CA and certificate, the client CA, the relay's client certificate."""

    def __init__(self, workdir: str):
        self.ca = make_ca("outbox e2e listener CA")
        self.client_ca = make_ca("outbox e2e client CA")
        server_cert, server_key = issue(self.ca, "127.0.0.1", server=True)
        client_cert, client_key = issue(self.client_ca, "outbox-relay", server=False)
        self.ca_pem = pem(self.ca[0])
        self.client_cert_pem = pem(client_cert)
        self.client_key_pem = key_pem(client_key)
        self.server_cert = self._write(workdir, "server.pem", pem(server_cert))
        self.server_key = self._write(workdir, "server.key", key_pem(server_key))
        self.client_ca_file = self._write(workdir, "client-ca.pem", pem(self.client_ca[0]))

    @staticmethod
    def _write(workdir: str, name: str, text: str) -> str:
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(text)
        return path


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
    out = {}
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SECRETS_MANAGER",
                "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY"):
        if os.environ.get(var):
            out[var] = os.environ[var]
    out.update(extra or {})
    return out


# ------------------------------------------------------------------------ a run

class Run:
    """What the setups share: the table, the enqueue function, the secrets client."""

    def __init__(self, workdir: str, started: list, suffix: str, binaries: dict):
        self.workdir, self.started, self.suffix, self.binaries = \
            workdir, started, suffix, binaries
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
        self.enqueue = sls.Function("EnqueueFunction", self.binaries["enqueue"], self.workdir,
                                    sls.ENQUEUE_TIMEOUT_S, dict(env, **lambda_provided()), "",
                                    10, 30)
        self.started.append(self.enqueue)
        self.enqueue.wait_ready()

    def relay(self, name: str, params: dict[str, str], extra: dict | None = None,
              timeout: float = RELAY_TIMEOUT):
        env, notes = template_environment("RelayFunction", dict(self.common_params(), **params))
        for n in notes:
            step(f"{name}: {n}")
        fn = sls.Function(f"Relay-{name}", self.binaries["relay"], self.workdir,
                          timeout, dict(env, **lambda_provided(extra)), "", 1, 30)
        fn.timeout = timeout
        self.started.append(fn)
        fn.wait_ready()
        kafka = {k: v for k, v in sorted(env.items()) if k.startswith("KAFKA_")}
        step(f"{name}: RelayFunction under lambda_runtime.py (timeout {timeout:g}s) "
             f"with the template's environment: {kafka}")
        return fn, env

    def topic(self, name: str) -> str:
        topic = f"kset-{self.suffix}-{name}"
        sls.kafka_py("create-topic", topic, "--partitions", str(sls.TOPIC_PARTITIONS))
        return topic

    def invoke_relay(self, relay, name: str) -> dict:
        started = time.time()
        status, function_error, body = relay.invoke(sls.SCHEDULE_PAYLOAD,
                                                    timeout=relay.timeout + 30)
        check(status == 200 and not function_error,
              f"{name}: relay invocation HTTP {status} {function_error or ''} {body[:500]!r}")
        s = json.loads(body)
        check(s.get("released") is True and s.get("refused_writes") == 0,
              f"{name}: leases not released or refused writes: {s}")
        step(f"{name}: relay published {s['published']} in {time.time() - started:.1f}s "
             f"(stop_reason {s['stop_reason']}, {s.get('publish_failures')} failed publishes)")
        return s

    def publish_through(self, relay, name: str, proxy: Proxy) -> None:
        """20 messages enqueued, one relay invocation, read back; the produce requests
        went through the proxy."""
        topic = self.topic(name)
        sent, _ = sls.enqueue_batch(self.enqueue, topic, name)
        s = self.invoke_relay(relay, name)
        check(s["published"] == 20, f"{name}: published {s['published']}, 20 enqueued: {s}")
        records, nkeys = sls.check_topic(topic, sent, 15)
        produced = [e for e in proxy.events_of("forwarded") if e["api_key"] == 0]
        check(produced, f"{name}: no produce request went through the proxy")
        step(f"{name}: confluent-kafka read the {len(records)} ids back from tansu, each once, "
             f"per-key order over {nkeys} keys; {len(produced)} produce request(s) through "
             f"the proxy")


def log_of(fn) -> str:
    try:
        with open(fn.function_log, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------------- setups

def setup_mtls(run: Run, pki: Pki) -> None:
    name = "mtls"
    proxy = Proxy(os.environ["KAFKA_BOOTSTRAP_SERVERS"], pki.server_cert, pki.server_key,
                  client_ca=pki.client_ca_file).start()
    run.started.append(proxy)
    ca = run.secret("ca", pki.ca_pem)
    client = run.secret("client", json.dumps({"certificate": pki.client_cert_pem,
                                              "privateKey": pki.client_key_pem}))
    step(f"{name}: listener {proxy.address} requires a client certificate of the client CA; "
         f"secrets {ca.rsplit(':', 1)[-1]} (CA bundle), {client.rsplit(':', 1)[-1]} "
         f"(certificate and privateKey)")
    relay, env = run.relay(name, dict(WITH_VPC, MskClusterArn="", KafkaAuth="mtls",
                                      KafkaBootstrapServers=proxy.address,
                                      KafkaTlsCaSecretArn=ca, KafkaTlsClientSecretArn=client))
    check(env.get("KAFKA_AUTH") == "mtls" and env.get("KAFKA_TLS_CLIENT_SECRET_ARN") == client,
          f"{name}: the relay's environment: {env}")
    run.publish_through(relay, name, proxy)
    conns = proxy.events_of("connection")
    check(conns and all(c["client_cn"] == "outbox-relay" for c in conns),
          f"{name}: connections without the relay's client certificate: {conns}")
    log = log_of(relay)
    body = "".join(line for line in pki.client_key_pem.splitlines() if "-----" not in line)
    check(body[:24] not in log and "PRIVATE KEY" not in log,
          f"{name}: the private key is in the relay's log")
    step(f"{name}: ok: {len(conns)} TLS connection(s) ({conns[0]['tls']}) presented CN "
         f"outbox-relay; the key is not in the relay's log")


def setup_scram(run: Run, pki: Pki) -> None:
    name = "scram"
    username, password = "outbox-relay", f"right-{secrets.token_hex(8)}"
    wrong = f"wrong-{secrets.token_hex(8)}"
    proxy = Proxy(os.environ["KAFKA_BOOTSTRAP_SERVERS"], pki.server_cert, pki.server_key,
                  mechanism="SCRAM-SHA-512", username=username, password=password).start()
    run.started.append(proxy)
    ca = run.secret("scram-ca", pki.ca_pem)
    sasl = run.secret("scram", json.dumps({"username": username, "password": wrong}))
    step(f"{name}: listener {proxy.address}, SASL/SCRAM-SHA-512 for {username}; the SASL "
         f"secret holds a wrong password first")
    # A refused password is retried for rskafka's budget (KafkaConfig::retry_budget, 5 s)
    # before the connect reports it (and forgets the credentials): each run must outlast
    # that to log the diagnosis, and the run after the rotation must also have time for
    # a second connect. A connect cut by the run's deadline after it read the secret keeps
    # what it read, so the first connect of the next run may still use the old password.
    relay, _ = run.relay(name, dict(WITH_VPC, MskClusterArn="", KafkaAuth="scram-sha-512",
                                    KafkaBootstrapServers=proxy.address,
                                    KafkaSaslSecretArn=sasl, KafkaTlsCaSecretArn=ca),
                         timeout=16.0)
    topic = run.topic(name)
    sent, _ = sls.enqueue_batch(run.enqueue, topic, name)
    s = run.invoke_relay(relay, f"{name} (wrong password)")
    check(s["published"] == 0, f"{name}: published with a wrong password: {s}")
    refused = [e for e in proxy.events_of("sasl") if not e["accepted"]]
    check(refused and "wrong password" in refused[0]["why"],
          f"{name}: the proxy did not refuse the proof: {proxy.events_of('sasl')}")
    check(not proxy.events_of("forwarded") or all(
        e["api_key"] == 18 for e in proxy.events_of("forwarded")),
        f"{name}: requests other than ApiVersions forwarded before authentication")
    log = log_of(relay)
    check("refused SASL/SCRAM-SHA-512 authentication" in log and sasl in log,
          f"{name}: the relay's log does not say the brokers refused the secret's "
          f"credentials:\n{relay.function_tail()}")
    check(wrong not in log and password not in log, f"{name}: a password in the relay's log")
    step(f"{name}: wrong password: nothing published, {len(refused)} proof(s) refused by the "
         f"proxy, the relay's log names the secret (and no password)")
    run.sm.put_secret_value(SecretId=sasl, SecretString=json.dumps(
        {"username": username, "password": password}))
    # Within a few runs of the same environment: the first connect after the rotation may
    # still use the password a connect cut by the last run's deadline had read; refused,
    # it is forgotten, and rskafka spends its 5 s budget on that refusal first.
    published, runs = 0, 0
    while published < 20 and runs < 3:
        runs += 1
        published += run.invoke_relay(relay, f"{name} (rotated secret, run {runs})")["published"]
    check(published == 20, f"{name}: {published} of 20 published in {runs} runs after the "
                           f"rotation")
    records, nkeys = sls.check_topic(topic, sent, 15)
    accepted = [e for e in proxy.events_of("sasl") if e["accepted"]]
    check(accepted, f"{name}: no accepted exchange")
    check(relay.stats()["totals"]["cold_starts"] == 1,
          f"{name}: the second invocation was not the warm environment")
    step(f"{name}: ok: after the rotation the warm environment read the secret again and "
         f"published in {runs} run(s), {len(accepted)} SCRAM-SHA-512 exchange(s) accepted, "
         f"{len(records)} ids read back once each over {nkeys} keys")


def setup_msk_iam(run: Run, pki: Pki) -> None:
    name = "msk-iam"
    region = os.environ.get("AWS_REGION", "us-east-1")
    creds = {"AWS_ACCESS_KEY_ID": f"ASIA{secrets.token_hex(8).upper()}",
             "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
             "AWS_SESSION_TOKEN": f"IQoJ/{secrets.token_urlsafe(24)}+="}
    proxy = Proxy(os.environ["KAFKA_BOOTSTRAP_SERVERS"], pki.server_cert, pki.server_key,
                  mechanism="OAUTHBEARER", region=region,
                  access_key=creds["AWS_ACCESS_KEY_ID"],
                  secret_key=creds["AWS_SECRET_ACCESS_KEY"],
                  session_token=creds["AWS_SESSION_TOKEN"]).start()
    run.started.append(proxy)
    ca = run.secret("msk-ca", pki.ca_pem)
    step(f"{name}: listener {proxy.address} verifying MSK IAM tokens for region {region} "
         f"and the role's (fake) credentials")
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


def setup_no_vpc(run: Run, pki: Pki) -> None:
    name = "no-vpc"
    username, password = "confluent-key", f"pw-{secrets.token_hex(8)}"
    proxy = Proxy(os.environ["KAFKA_BOOTSTRAP_SERVERS"], pki.server_cert, pki.server_key,
                  mechanism="PLAIN", username=username, password=password).start()
    run.started.append(proxy)
    ca = run.secret("plain-ca", pki.ca_pem)
    sasl = run.secret("plain", json.dumps({"username": username, "password": password}))
    params = dict(MskClusterArn="", KafkaAuth="plain", KafkaBootstrapServers=proxy.address,
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
    run.publish_through(relay, name, proxy)
    verdicts = proxy.events_of("sasl")
    check(verdicts and all(e["accepted"] for e in verdicts), f"{name}: {verdicts}")
    check(password not in log_of(relay), f"{name}: the password is in the relay's log")
    step(f"{name}: ok: SASL/PLAIN over TLS, {len(verdicts)} exchange(s) accepted")


SETUPS = {"mtls": setup_mtls, "scram": setup_scram, "msk-iam": setup_msk_iam,
          "no-vpc": setup_no_vpc}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setup", action="append", choices=list(SETUPS),
                   help="run only these setups (default: all)")
    p.add_argument("--template", default=TEMPLATE,
                   help="the SAM template the environments come from (default: template.yaml)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args()
    globals()["TEMPLATE"] = os.path.abspath(args.template)
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "KAFKA_BOOTSTRAP_SERVERS",
                "AWS_ENDPOINT_URL_SECRETS_MANAGER"):
        if not os.environ.get(var):
            p.error(f"{var} is not set: run inside scripts/stack.sh run")
    sls.interrupt_on_signals()
    t0 = time.time()
    step("building both functions (dev profile)")
    out = subprocess.run(["cargo", "build", "-q", "-p", "outbox-enqueue-function",
                          "-p", "outbox-relay-function"], cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        step("FAILED: cargo build")
        return 1
    workdir = tempfile.mkdtemp(prefix="outbox-kafka-setups.")
    # Taken at once: a shared CARGO_TARGET_DIR may get another checkout's build of the
    # same binaries while this runs. The relay must be one that reads the TLS secrets.
    binaries = {}
    for fn, binary in (("relay", "outbox-relay-function"),
                       ("enqueue", "outbox-enqueue-function")):
        binaries[fn] = os.path.join(workdir, binary)
        try:  # a hard link keeps this build's file (the linkers write a new one)
            os.link(os.path.join(TARGET, "debug", binary), binaries[fn])
        except OSError:
            shutil.copy2(os.path.join(TARGET, "debug", binary), binaries[fn])
    with open(binaries["relay"], "rb") as f:
        if b"KAFKA_TLS_CLIENT_SECRET_ARN" not in f.read():
            step(f"FAILED: {TARGET}/debug/outbox-relay-function does not read "
                 f"KAFKA_TLS_CLIENT_SECRET_ARN: another checkout's build?")
            shutil.rmtree(workdir, ignore_errors=True)
            return 1
    started: list = []
    ok = False
    try:
        run = Run(workdir, started, uuid.uuid4().hex[:8], binaries)
        sls.create_outbox_table(run.table)
        pki = Pki(workdir)
        run.start_enqueue()
        step(f"table {run.table}, topics {run.topics}, EnqueueFunction under "
             f"lambda_runtime.py with the template's environment; certificates made "
             f"(build and setup {time.time() - t0:.1f}s)")
        for name in args.setup or list(SETUPS):
            t = time.time()
            SETUPS[name](run, pki)
            step(f"{name}: {time.time() - t:.1f}s")
        ok = True
        step(f"ok in {time.time() - t0:.0f}s: {', '.join(args.setup or SETUPS)}")
        return 0
    except (sls.Failed, sls.Interrupted) as e:
        step(f"FAILED: {e}")
        for fn in started:
            if isinstance(fn, sls.Function):
                print(f"---- last lines of {fn.name}'s log ----\n{fn.function_tail(60)}",
                      file=sys.stderr)
            elif isinstance(fn, Proxy):
                print(f"---- the proxy {fn.address} saw ----\n"
                      + "\n".join(str(e) for e in fn.events if e["kind"] != "forwarded"),
                      file=sys.stderr)
        return 1
    finally:
        for thing in reversed(started):
            thing.stop()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            step(f"logs kept in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
