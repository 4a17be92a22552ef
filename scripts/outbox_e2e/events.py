"""EventBridge on moto's server (the endpoints come from $AWS_ENDPOINT_URL_EVENTBRIDGE and
$AWS_ENDPOINT_URL_SQS, as scripts/stack.sh exports them): the commit notifications of an
event bus routed to an SQS queue, as the SAM template's rule routes them to the relay, and
read back.  scripts/events.py is the command line."""

from __future__ import annotations

import json
import uuid

import boto3

SOURCE = "dynamo-outbox"
DETAIL_TYPE = "OutboxCommitted"


def clients():
    return boto3.client("events"), boto3.client("sqs")


def watch(bus: str) -> str:
    """Creates the event bus (if missing), an SQS queue, and a rule on the bus matching
    commit notifications (source dynamo-outbox, detail-type OutboxCommitted) that targets
    the queue; the queue's URL."""
    events, sqs = clients()
    try:
        events.create_event_bus(Name=bus)
    except events.exceptions.ResourceAlreadyExistsException:
        pass
    name = f"outbox-notifications-{uuid.uuid4().hex[:12]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    events.put_rule(
        Name=name,
        EventBusName=bus,
        EventPattern=json.dumps({"source": [SOURCE], "detail-type": [DETAIL_TYPE]}),
    )
    events.put_targets(Rule=name, EventBusName=bus, Targets=[{"Id": "queue", "Arn": arn}])
    return url


def receive(url: str, wait: float = 2.0) -> list[dict]:
    """Every event delivered to the queue so far (as a Lambda target receives it), deleted
    from it; waits up to `wait` seconds for the first one."""
    _, sqs = clients()
    out, first = [], True
    while True:
        got = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=int(wait) if first else 0,
        )
        first = False
        messages = got.get("Messages", [])
        if not messages:
            return out
        for m in messages:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
