"""The subcommands of scripts/streams.py: enable, records, poll."""

from __future__ import annotations

import argparse
import json
import sys

from . import __doc__ as PACKAGE_DOC
from .poller import cmd_poll
from .records import StreamError, enable, records, say


def die(msg: str) -> None:
    say(f"error: {msg}")
    sys.exit(1)


def cmd_enable(args) -> int:
    print(enable(args.table, args.view_type, args.wait))
    return 0


def cmd_records(args) -> int:
    out = records(args.table, args.after, args.filter_prefix, args.key_attribute)
    print(json.dumps({"Records": out}, indent=1 if args.pretty else None))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=PACKAGE_DOC.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See the docstring of scripts/outbox_e2e/streams/__init__.py for "
                                            "the details.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("enable", help="turn the table's stream on, print its ARN")
    p.add_argument("table")
    p.add_argument("--view-type", default="KEYS_ONLY",
                   choices=["KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE", "NEW_AND_OLD_IMAGES"])
    p.add_argument("--wait", type=float, default=30.0)
    p.set_defaults(func=cmd_enable)

    p = sub.add_parser("records", help="print the stream's records as one Lambda event")
    p.add_argument("table")
    p.add_argument("--after", metavar="SEQ", help="only records after this sequence number")
    p.add_argument("--filter-prefix", metavar="PREFIX",
                   help="only INSERTs whose partition key begins with PREFIX")
    p.add_argument("--key-attribute", default="PK", help="partition key attribute (PK)")
    p.add_argument("--pretty", action="store_true")
    p.set_defaults(func=cmd_records)

    p = sub.add_parser("poll", help="the event source mapping: stream -> Invoke URL")
    p.add_argument("table")
    p.add_argument("--invoke", required=True, metavar="URL")
    p.add_argument("--template", metavar="FILE",
                   help="read the mapping's settings from this SAM template (template.yaml)")
    p.add_argument("--function", default="RelayFunction",
                   help="the function whose stream mapping --template reads (RelayFunction)")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a template parameter for --template (repeatable)")
    p.add_argument("--filter-prefix", metavar="PREFIX",
                   help="keep only INSERTs whose partition key begins with PREFIX "
                        "(instead of the template's FilterCriteria)")
    p.add_argument("--key-attribute", default=None,
                   help="partition key attribute (default: the table's)")
    p.add_argument("--batch-size", type=int, help="BatchSize (default 100)")
    p.add_argument("--window", type=float,
                   help="MaximumBatchingWindowInSeconds (default 0)")
    p.add_argument("--starting-position", choices=["LATEST", "TRIM_HORIZON"],
                   help="StartingPosition (default LATEST)")
    p.add_argument("--max-retries", type=int,
                   help="MaximumRetryAttempts after function errors (default -1: until the "
                        "records expire)")
    p.add_argument("--max-record-age", type=float, metavar="SECONDS",
                   help="MaximumRecordAgeInSeconds (default -1: the stream's 24 h retention)")
    p.add_argument("--bisect", action=argparse.BooleanOptionalAction, default=None,
                   help="BisectBatchOnFunctionError (default off)")
    p.add_argument("--shards", type=int, default=1,
                   help="virtual shards: the records split by a hash of the partition key, "
                        "each with its own in-order pipeline (default 1)")
    p.add_argument("--backoff", type=float, default=0.5,
                   help="first wait before retrying a failed batch, doubling (default 0.5)")
    p.add_argument("--max-backoff", type=float, default=10.0,
                   help="longest wait between retries (default 10)")
    p.add_argument("--poll-interval", type=float, default=0.25)
    p.add_argument("--discover-interval", type=float, default=1.0)
    p.add_argument("--invoke-timeout", type=float, default=960.0)
    p.add_argument("--stop-grace", type=float, default=5.0)
    p.add_argument("--ready-file")
    p.add_argument("--stats-file")
    p.add_argument("--batch-log")
    p.set_defaults(func=cmd_poll)

    args = parser.parse_args()
    if (getattr(args, "batch_size", None) or 1) < 1:
        parser.error("--batch-size must be at least 1")
    if getattr(args, "shards", 1) < 1:
        parser.error("--shards must be at least 1")
    if getattr(args, "max_record_age", None) is not None and \
            args.max_record_age < 0 and args.max_record_age != -1:
        parser.error("--max-record-age must be -1 or at least 0")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 1
    except StreamError as e:
        die(str(e))
    except Exception as e:  # boto3/botocore errors: one line, exit 1
        die(f"{type(e).__name__}: {e}")
    return 1
