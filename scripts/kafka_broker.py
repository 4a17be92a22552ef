#!/usr/bin/env python3
"""Apache Kafka as the local stack runs it: one KRaft node (broker and controller in one
process) from the jars scripts/install.sh fetched, started as a plain `java` process.

  kafka_broker.py version | check
      Print the version the stack runs; fail unless its jars are installed.

  kafka_broker.py tls DIR
      A throwaway CA and, signed by it, the broker's certificate (SAN 127.0.0.1 and
      localhost) and two client certificates (CN=outbox, the relay's principal
      User:CN=outbox, and CN=nogrant, with no grant): DIR/ca.pem, DIR/broker.pem (key and chain,
      the broker's PEM keystore), DIR/{outbox,nogrant}.{crt,key}. openssl, once.

  kafka_broker.py run --dir DIR --plaintext PORT --controller PORT
                      [--sasl-ssl PORT --ssl PORT --tls DIR --password-file FILE]
                      [--proxy-listener UPSTREAM:ADVERTISED ...]
      Writes DIR/server.properties, formats DIR/data the first time (with the SCRAM users
      when secured) and execs the broker (`java -cp 'lib/*' kafka.Kafka`), so the process
      is the broker: SIGKILL kills it, and `run` again on the same DIR restarts it with its
      data. Without --sasl-ssl it is an open broker (PLAINTEXT only, no authorizer), for a
      test that needs a broker's own lifecycle.

  kafka_broker.py grant --bootstrap HOST:PORT --principal User:NAME
                        (--topic NAME | --all-topics | --group NAME | --transactional-id NAME)
                        [--operation OP ...]
      Creates allow ACLs (default operations: WRITE, DESCRIBE on a topic or transactional id,
      READ, DESCRIBE on a group) through the admin listener.

The secured broker is configured as a managed cluster is (docs/testing.md, "The
broker"): listeners PLAINTEXT (the tests' admin and reader, whose anonymous principal is a
super user), SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN), SSL (client certificates
required, the principal their subject, User:CN=NAME), and one PLAINTEXT listener per proxy slot, listening on
UPSTREAM and advertising ADVERTISED (the port where a test's proxy listens, so every
connection of a client bootstrapped through the proxy stays on it); StandardAuthorizer with
allow.everyone.if.no.acl.found=false; internal topics of replication factor 1 (one node:
transactions work); auto.create.topics.enable=false.

The version is KAFKA_VERSION (default: the first of scripts/install.sh's KAFKA_VERSIONS),
its jars in $DYNAMO_OUTBOX_CACHE/kafka/VERSION/lib. Standard library only, but `grant` needs
confluent-kafka (the stack's venv).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("DYNAMO_OUTBOX_CACHE", Path.home() / ".cache" / "dynamo-outbox"))

# The principals of the secured broker. `outbox` may write every topic; `nogrant` nothing
# until a test grants it (the authorization tests).
USERS = ("outbox", "nogrant")


def default_version() -> str:
    text = (SCRIPTS / "install.sh").read_text()
    m = re.search(r"^KAFKA_VERSIONS=\(([^ )]+)", text, re.M)
    if not m:
        sys.exit("kafka_broker.py: KAFKA_VERSIONS not found in scripts/install.sh")
    return m.group(1)


def version() -> str:
    return os.environ.get("KAFKA_VERSION") or default_version()


def kafka_lib(v: str) -> Path:
    lib = CACHE / "kafka" / v / "lib"
    if not (lib / f"kafka_2.13-{v}.jar").is_file():
        sys.exit(f"kafka_broker.py: Apache Kafka {v} is not installed in {lib}; run scripts/install.sh")
    return lib


def java_cmd(v: str, *args: str) -> list[str]:
    logging = (
        [f"-Dlog4j.configuration=file:{SCRIPTS / 'kafka' / 'log4j.properties'}"]
        if v.startswith("3.")
        else [f"-Dlog4j2.configurationFile={SCRIPTS / 'kafka' / 'log4j2.yaml'}"]
    )
    return [
        "java",
        "-Xms256m",
        os.environ.get("KAFKA_HEAP_MAX", "-Xmx1g"),
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        *logging,
        "-cp",
        f"{kafka_lib(v)}/*",
        *args,
    ]


# ------------------------------------------------------------------------------- tls


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def cmd_tls(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
            "-subj", "/CN=dynamo-outbox local stack CA")

    def sign(name: str, subject: str, ext: str) -> None:
        (d / f"{name}.ext").write_text(ext)
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{name}.key"),
                "-out", str(d / f"{name}.csr"), "-subj", subject)
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "30",
                "-out", str(d / f"{name}.crt"), "-extfile", str(d / f"{name}.ext"))

    sign("broker", "/CN=localhost",
         "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    (d / "broker.pem").write_text((d / "broker.key").read_text() + (d / "broker.crt").read_text())
    for user in USERS:
        sign(user, f"/CN={user}", "extendedKeyUsage=clientAuth\n")
    return 0


# ------------------------------------------------------------------------------- run


def read_passwords(path: str) -> dict[str, str]:
    """USER=PASSWORD lines (the --password-file)."""
    return dict(line.split("=", 1) for line in Path(path).read_text().split())


def server_properties(args: argparse.Namespace, data: Path) -> str:
    listeners = [f"PLAINTEXT://127.0.0.1:{args.plaintext}", f"CONTROLLER://127.0.0.1:{args.controller}"]
    advertised = [f"PLAINTEXT://127.0.0.1:{args.plaintext}"]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    for i, slot in enumerate(args.proxy_listener):
        upstream, adv = slot.split(":")
        listeners.append(f"PROXY{i}://127.0.0.1:{upstream}")
        advertised.append(f"PROXY{i}://127.0.0.1:{adv}")
        protocols.append(f"PROXY{i}:PLAINTEXT")
    lines = [
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{args.controller}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data}",
        "num.partitions=1",
        # One node: the internal topics of groups and transactions must fit on it.
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        # As on MSK: a topic exists only once created.
        "auto.create.topics.enable=false",
    ]
    if args.sasl_ssl:
        tls = Path(args.tls).resolve()
        passwords = read_passwords(args.password_file)
        plain_users = " ".join(f'user_{u}="{passwords[u]}"' for u in USERS)
        listeners += [f"SASL_SSL://127.0.0.1:{args.sasl_ssl}", f"SSL://127.0.0.1:{args.ssl}"]
        advertised += [f"SASL_SSL://127.0.0.1:{args.sasl_ssl}", f"SSL://127.0.0.1:{args.ssl}"]
        protocols += ["SASL_SSL:SASL_SSL", "SSL:SSL"]
        lines += [
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            # The tests' admin and reader (PLAINTEXT, anonymous) and the broker itself.
            "super.users=User:ANONYMOUS",
            "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={tls / 'broker.pem'}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={tls / 'ca.pem'}",
            # A client certificate's principal is its subject's distinguished name
            # (User:CN=outbox): Kafka's default mapping, which MSK keeps.
            "listener.name.ssl.ssl.client.auth=required",
        ]
    lines += [
        "listeners=" + ",".join(listeners),
        "advertised.listeners=" + ",".join(advertised),
        "listener.security.protocol.map=" + ",".join(protocols),
    ]
    return "\n".join(lines) + "\n"


def random_cluster_id() -> str:
    """A cluster id as `kafka-storage random-uuid` prints it (16 random bytes, base64url
    without padding, never starting with '-'), without a JVM's start."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def cmd_run(args: argparse.Namespace) -> int:
    v = version()
    d = Path(args.dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    data = d / "data"
    props = d / "server.properties"
    props.write_text(server_properties(args, data))
    if not (data / "meta.properties").exists():
        cluster = random_cluster_id()
        scram = []
        if args.sasl_ssl:
            passwords = read_passwords(args.password_file)
            for user in USERS:
                for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
                    scram += ["--add-scram", f"{mechanism}=[name={user},password={passwords[user]}]"]
        fmt = subprocess.run(
            java_cmd(v, "kafka.tools.StorageTool", "format", "--standalone",
                     "-t", cluster, "-c", str(props), *scram),
            capture_output=True, text=True,
        )
        if fmt.returncode != 0:
            sys.stderr.write(fmt.stdout + fmt.stderr)
            sys.exit(f"kafka_broker.py: formatting {data} failed")
    sys.stdout.flush()
    cmd = java_cmd(v, "kafka.Kafka", str(props))
    os.execvp(cmd[0], cmd)


# ----------------------------------------------------------------------------- grant


def cmd_grant(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import (  # the stack's venv
        AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
        ResourcePatternType, ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": args.bootstrap, "log_level": 3})
    if args.group:
        restype, name, default_ops = ResourceType.GROUP, args.group, ["READ", "DESCRIBE"]
    elif args.transactional_id:
        restype, name, default_ops = (ResourceType.TRANSACTIONAL_ID, args.transactional_id,
                                      ["WRITE", "DESCRIBE"])
    else:
        restype, name = ResourceType.TOPIC, "*" if args.all_topics else args.topic
        default_ops = ["WRITE", "DESCRIBE"]
    bindings = [
        AclBinding(restype, name, ResourcePatternType.LITERAL, args.principal,
                   "*", AclOperation[op.upper()], AclPermissionType.ALLOW)
        for op in args.operation or default_ops
    ]
    for future in admin.create_acls(bindings, request_timeout=args.timeout).values():
        future.result()
    # The controller has committed them; the broker's authorizer applies them when it replays
    # the metadata log. DescribeAcls is answered from that authorizer: wait until it lists
    # every binding, so that a request right after this command meets the grant.
    deadline = time.monotonic() + args.timeout
    while True:
        found = set()
        for b in bindings:
            query = AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                     b.host, b.operation, b.permission_type)
            for acl in admin.describe_acls(query, request_timeout=args.timeout).result():
                found.add((acl.name, acl.principal, acl.operation))
        if all((b.name, b.principal, b.operation) in found for b in bindings):
            return 0
        if time.monotonic() > deadline:
            sys.exit(f"kafka_broker.py: the grants to {args.principal} were not in force "
                     f"after {args.timeout:g}s")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kafka_broker.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("version", help="print the version the stack runs")
    p.set_defaults(func=lambda _: print(version()) or 0)

    p = sub.add_parser("check", help="fail unless that version's jars are installed")
    p.set_defaults(func=lambda _: kafka_lib(version()) and 0)

    p = sub.add_parser("tls", help="make the throwaway CA and the certificates")
    p.add_argument("dir")
    p.set_defaults(func=cmd_tls)

    p = sub.add_parser("run", help="write the configuration, format once, exec the broker")
    p.add_argument("--dir", required=True)
    p.add_argument("--plaintext", type=int, required=True)
    p.add_argument("--controller", type=int, required=True)
    p.add_argument("--sasl-ssl", type=int)
    p.add_argument("--ssl", type=int)
    p.add_argument("--tls")
    p.add_argument("--password-file", help="lines USER=PASSWORD for outbox and nogrant")
    p.add_argument("--proxy-listener", action="append", default=[], metavar="UPSTREAM:ADVERTISED")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("grant", help="allow a principal operations on a topic, group or "
                       "transactional id")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--principal", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--topic")
    g.add_argument("--all-topics", action="store_true")
    g.add_argument("--group")
    g.add_argument("--transactional-id")
    p.add_argument("--operation", action="append")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_grant)

    args = ap.parse_args(argv)
    if args.cmd == "run" and bool(args.sasl_ssl) != bool(args.ssl and args.tls and args.password_file):
        ap.error("--sasl-ssl needs --ssl, --tls and --password-file")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
