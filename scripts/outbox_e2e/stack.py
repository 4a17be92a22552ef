"""The local stack's endpoints, as scripts/stack.sh exports them to the command it runs
(its usage lists every variable)."""

from __future__ import annotations

import os
from dataclasses import dataclass

# What a scenario needs of the stack: it runs inside `scripts/stack.sh run`.
REQUIRED = ("AWS_ENDPOINT_URL_DYNAMODB", "KAFKA_BOOTSTRAP_SERVERS", "OUTBOX_KAFKA_SSL",
            "OUTBOX_KAFKA_SASL_SSL", "OUTBOX_KAFKA_TLS_DIR", "OUTBOX_KAFKA_USER",
            "OUTBOX_KAFKA_PASSWORD", "OUTBOX_KAFKA_PROXY_SLOTS", "AWS_ENDPOINT_URL_EVENTBRIDGE",
            "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SECRETS_MANAGER")

# The variables through which the functions reach DynamoDB Local: what Lambda and the
# execution role provide in AWS (a region and credentials).
AWS_VARIABLES = ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_REGION", "AWS_DEFAULT_REGION",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class NotInStack(Exception):
    """A variable of the stack is not set: the command does not run inside stack.sh run."""


@dataclass(frozen=True)
class Stack:
    dynamodb: str                   # AWS_ENDPOINT_URL_DYNAMODB
    region: str                     # AWS_REGION
    kafka: str                      # KAFKA_BOOTSTRAP_SERVERS: PLAINTEXT, a super user
    kafka_version: str              # KAFKA_VERSION
    kafka_ssl: str                  # OUTBOX_KAFKA_SSL: TLS, client certificate required
    kafka_sasl_ssl: str             # OUTBOX_KAFKA_SASL_SSL: SCRAM and PLAIN over TLS
    kafka_tls_dir: str              # OUTBOX_KAFKA_TLS_DIR: ca.pem, broker.pem, NAME.crt/.key
    kafka_user: str                 # OUTBOX_KAFKA_USER: may write every topic
    kafka_password: str
    proxy_slots: tuple              # OUTBOX_KAFKA_PROXY_SLOTS: (upstream, advertised) ports
    eventbridge: str                # AWS_ENDPOINT_URL_EVENTBRIDGE (moto)
    sqs: str                        # AWS_ENDPOINT_URL_SQS (moto)
    secrets_manager: str            # AWS_ENDPOINT_URL_SECRETS_MANAGER (moto)

    @classmethod
    def from_env(cls, env=os.environ) -> "Stack":
        missing = [v for v in REQUIRED if not env.get(v)]
        if missing:
            raise NotInStack(f"{', '.join(missing)} not set: run inside scripts/stack.sh run "
                             f"(scripts/test.sh does)")
        slots = []
        for pair in env["OUTBOX_KAFKA_PROXY_SLOTS"].split():
            upstream, sep, advertised = pair.partition(":")
            if not (sep and upstream.isdigit() and advertised.isdigit()):
                raise NotInStack(f"OUTBOX_KAFKA_PROXY_SLOTS: {pair!r} is not UPSTREAM:ADVERTISED")
            slots.append((int(upstream), int(advertised)))
        return cls(
            dynamodb=env["AWS_ENDPOINT_URL_DYNAMODB"],
            region=env.get("AWS_REGION") or "us-east-1",
            kafka=env["KAFKA_BOOTSTRAP_SERVERS"], kafka_version=env.get("KAFKA_VERSION", ""),
            kafka_ssl=env["OUTBOX_KAFKA_SSL"], kafka_sasl_ssl=env["OUTBOX_KAFKA_SASL_SSL"],
            kafka_tls_dir=env["OUTBOX_KAFKA_TLS_DIR"], kafka_user=env["OUTBOX_KAFKA_USER"],
            kafka_password=env["OUTBOX_KAFKA_PASSWORD"], proxy_slots=tuple(slots),
            eventbridge=env["AWS_ENDPOINT_URL_EVENTBRIDGE"], sqs=env["AWS_ENDPOINT_URL_SQS"],
            secrets_manager=env["AWS_ENDPOINT_URL_SECRETS_MANAGER"])


def aws_env(extra: tuple = ()) -> dict[str, str]:
    """The stack's DynamoDB endpoint, region and credentials (and the `extra` variables)
    as this process has them: what a function under the emulator gets from its role."""
    return {v: os.environ[v] for v in AWS_VARIABLES + tuple(extra) if os.environ.get(v)}
