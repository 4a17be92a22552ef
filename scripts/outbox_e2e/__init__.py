"""The Python side of the local stack: the stand-ins for the AWS services a deployment
meets, the independent Kafka client, and the pieces the end-to-end suite (e2e/) and the
command-line tools beside this package share.

It lives in scripts/ because the tools there (lambda_runtime.py, streams.py, kafka.py,
...) import it: a script's own directory is where Python finds its imports, with no path
to set.  The suite finds it through pytest.ini's `pythonpath`.

Layout
------
lambda_runtime/   the Lambda service emulator (scripts/lambda_runtime.py)
"""
