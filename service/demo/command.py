"""`stratameter demo`: argument handling, the run, the summary (table or one JSON line)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import orjson

#: Chunk length without --chunk-seconds: with people reviewing in Label Studio, and with simulated reviewers.
PEOPLE_CHUNK_SECONDS, SIMULATED_CHUNK_SECONDS = 300, 20


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole loop on this machine: embedded broker and Redis, the service, simulated "
             "classifiers and reviewers, a live view",
        description="Starts an embedded Kafka-protocol broker (tansu) and Redis on free ports (unless "
                    "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS / STRATAMETER_REDIS_URL or --kafka / --redis name "
                    "yours), the service (`stratameter run` as a subprocess), simulated classifiers streaming "
                    "scores and reviewers answering label requests from ground truth, and shows each "
                    "classifier's estimate against the true precision of the reported chunk. Ctrl-C or "
                    "--duration ends it with a summary; every process it started is stopped.",
    )
    p.add_argument("--duration", type=float, metavar="SECONDS",
                   help="run the traffic for SECONDS (scores stop --settle seconds before the end so the "
                        "reviewers can finish the last chunk), print the summary and stop "
                        "(default: until Ctrl-C)")
    p.add_argument("--json", action="store_true",
                   help='print the summary as one JSON line {"classifiers": [{"classifier", "metric", "estimate", '
                        '"lower", "upper", "truth", "labels", "random_equivalent_labels"}]} (one entry per '
                        'classifier and metric) instead of the live view')
    p.add_argument("--kafka", metavar="HOST:PORT", help="use this Kafka instead of an embedded broker")
    p.add_argument("--redis", metavar="URL", help="use this Redis instead of an embedded one")
    p.add_argument("--port", type=int, help="HTTP port of the service (default: a free port)")
    p.add_argument("--chunk-seconds", type=int, help="chunk length (default 20; 300 with --reviewers label-studio)")
    p.add_argument("--rate", type=float, default=100.0, help="scores per second per classifier (default 100)")
    p.add_argument("--delta", type=float, default=0.05, help="target half-width (default 0.05)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval confidence (default 0.95)")
    p.add_argument("--strata", type=int, default=4, help="strata per classifier (default 4)")
    p.add_argument("--settle", type=float, default=10.0,
                   help="with --duration, the scores stop this many seconds (at most a quarter of the run) "
                        "before the end, and the reviewers keep labelling the last chunk (default 10)")
    p.add_argument("--seed", type=int, help="seed of the traffic and the reviewers")
    p.add_argument("--reviewers", choices=("simulated", "label-studio"), default="simulated",
                   help="who answers the label requests: simulated reviewers (from the ground truth, default), or "
                        "you, in a local Label Studio that `stratameter bridge label-studio` connects (Label Studio "
                        "installed in .venv-label-studio: `make label-studio`); its URL and login are printed, "
                        "requests wait an hour for an answer")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the logs of the service, the backends and the bridge (in the demo's temporary "
                        "folder, named at the end) instead of deleting them on exit")
    p.set_defaults(handler=main)


def main(args) -> int:
    from rich.console import Console

    from ..embedded import BackendError
    from .launch import DemoError
    from .orchestra import Demo
    from .screen import summary

    opts = _options(args)
    if opts is None:
        return 2
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    # The live view goes to stdout, or with --json to stderr when that is a terminal.
    out = Console(stderr=True, highlight=False) if args.json else Console(highlight=False)
    demo = Demo(opts, out, err)

    # Until the event loop installs its handlers, SIGTERM ends the process the way Ctrl-C does,
    # through the `finally` blocks that stop the children.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        rows = asyncio.run(demo.run())
    except DemoError as exc:
        print(f"stratameter demo: {exc}", file=sys.stderr)
        return 1
    except BackendError as exc:
        print(f"stratameter demo: cannot start a backend: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from aiokafka.errors import KafkaError

        if not isinstance(exc, (KafkaError, OSError)):
            raise
        print(f"stratameter demo: {exc}", file=sys.stderr)  # e.g. an unreachable broker of yours
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    if rows is None:  # stopped before the traffic started
        return 0
    if args.json:
        sys.stdout.write(orjson.dumps({"classifiers": rows}).decode() + "\n")
        sys.stdout.flush()
    else:
        title = "summary" + (f" (stopped by {demo.signal_name})" if demo.signal_name else "")
        console = Console(highlight=False)
        console.print()
        console.print(summary(demo, title))
    return 0


def _options(args):
    """The demo's `DemoOptions` from the arguments; None (the invalid one printed) if one is out of range."""
    from .options import DemoOptions

    people = args.reviewers == "label-studio"
    chunk_seconds = args.chunk_seconds
    if chunk_seconds is None:
        chunk_seconds = PEOPLE_CHUNK_SECONDS if people else SIMULATED_CHUNK_SECONDS
    for name, value, ok in (("--duration", args.duration, args.duration is None or args.duration > 0),
                            ("--chunk-seconds", chunk_seconds, chunk_seconds >= 2),
                            ("--rate", args.rate, args.rate > 0),
                            ("--delta", args.delta, 0 < args.delta < 1),
                            ("--confidence", args.confidence, 0 < args.confidence < 1),
                            ("--strata", args.strata, 1 <= args.strata <= 64),
                            ("--settle", args.settle, args.settle >= 0)):
        if not ok:
            print(f"stratameter demo: invalid {name} {value!r}", file=sys.stderr)
            return None
    return DemoOptions(duration=args.duration, json=args.json, kafka=args.kafka, redis=args.redis, port=args.port,
                       chunk_seconds=chunk_seconds, rate=args.rate, delta=args.delta,
                       confidence=args.confidence, strata=args.strata, settle=args.settle, seed=args.seed,
                       reviewers=args.reviewers, label_timeout=3600.0 if people else 30.0,
                       round_labels=2 if people else 4, keep_logs=args.keep_logs)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
