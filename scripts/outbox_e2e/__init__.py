"""The Python side of the local stack: the stand-ins for the AWS services a deployment
meets, the independent Kafka client, and the pieces the end-to-end suite (e2e/) and the
command-line tools beside this package share.

It lives in scripts/ because the tools there (lambda_runtime.py, streams.py, kafka.py,
...) import it: a script's own directory is where Python finds its imports, with no path
to set.  The suite finds it through pytest.ini's `pythonpath`.

Layout
------
Stand-ins, each with a command in scripts/:
  lambda_runtime/  the Lambda service emulator for one function binary (lambda_runtime.py)
  streams/         DynamoDB Streams and the stream's event source mapping (streams.py)
  alarms/          the CloudWatch alarm evaluator over EMF documents (alarms.py)
  cfn_template.py  what the local model reads out of the SAM template (cfn_template.py)
  kafka_proxy.py   an MSK IAM listener in front of the local broker (kafka_proxy.py)
  events.py        EventBridge's commit notifications on moto (events.py)
  kafka.py         the independent Kafka client, confluent-kafka (kafka.py)

What the scenarios are made of:
  paths.py         the repository, the cache, the build output
  report.py        steps on the `outbox_e2e` logger, a failed check as an AssertionError
  stack.py         the stack's endpoints as scripts/stack.sh exports them
  procs.py         background processes and the registry that stops them
  emulator.py      a function binary under the emulator (start, invoke, stats, stop)
  mapping.py       the event source mapping as a process (streams.py poll)
  dynamodb.py      the outbox table as the library creates it, scans, a DynamoDB Local
  items.py         the bytes a writer commits (murmur2, header blob, ticks), in Python
  serverless.py    the deployment's settings and the checks the scenarios share
  continuity/      the continuity scenarios (burst, outage, stuck, bus; continuity_e2e.py)
"""
