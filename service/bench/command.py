"""`stratameter bench`: argument handling, table and JSON output."""

from __future__ import annotations

import argparse
import json
import sys


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


SUMMARY = "ingestion throughput: the service (Kafka -> Redis state) vs a bare consumer, and Redis memory"
DESCRIPTION = (
    "Produces score records once, then measures in the same run: a bare aiokafka consumer reading them "
    "(raw, and orjson-decoding each), and one service instance ingesting them into Redis with a fresh "
    "consumer group, until Redis counts them all. Rates are taken from each consumer's first fetched "
    "record (the group join is excluded). Also reports the Redis memory per classifier at two stream "
    "lengths. Starts an embedded tansu broker and Redis unless --kafka / --redis are given."
)


#: --loop-pass's default --older-chunks.
OLDER_CHUNKS = 12
#: The options of the Kafka ingest measurement (option -> attribute).  Those a mode does not use
#: (`_MODES`) are refused with it, not ignored.
_INGEST_ONLY = {"--records": "records", "--partitions": "partitions", "--kafka": "kafka", "--seed": "seed",
                "--all-metrics": "all_metrics", "--redis-cluster": "redis_cluster", "--serve": "serve",
                "--serve-load": "serve_load", "--repeat": "repeat"}
#: The modes instead of the Kafka ingest: (attribute, what it is, the options of `_INGEST_ONLY` it uses).
_MODES = {"--loop-pass": ("loop_pass", "no Kafka, one run", ()),
          "--ingest-cpu": ("ingest_cpu", "no Kafka, both ingests", ("--records", "--partitions", "--seed", "--repeat")),
          "--scrape-chunks": ("scrape_chunks", "no score records, the scrape alone", ("--kafka",))}


def _misplaced(args) -> str | None:
    """The error for options that do not go together, or None (`ingest_defaults`: the parser's
    defaults of `_INGEST_ONLY`, set by `add_parser`)."""
    modes = [opt for opt, (name, _, _) in _MODES.items() if getattr(args, name, False)]
    if len(modes) > 1:
        return f"{', '.join(modes)}: one at a time"
    if getattr(args, "older_chunks", None) and modes != ["--loop-pass"]:
        return "--older-chunks goes with --loop-pass"
    if not modes:
        return None
    _, what, uses = _MODES[modes[0]]
    given = [opt for opt, name in _INGEST_ONLY.items()
             if opt not in uses and getattr(args, name) != args.ingest_defaults[name]]
    return f"{', '.join(given)}: not with {modes[0]} ({what})" if given else None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("--records", type=_positive_int, default=500_000, help="score records (default 500000)")
    p.add_argument("--classifiers", type=_positive_int, default=10, help="classifiers (default 10)")
    p.add_argument("--partitions", type=_positive_int, default=3, help="partitions of the scores topic (default 3)")
    p.add_argument("--kafka", metavar="HOST:PORT", help="use these bootstrap servers instead of an embedded broker")
    p.add_argument("--redis", metavar="URL", help="use this Redis instead of an embedded one (redis://...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--all-metrics", action="store_true",
                   help="also run the service's ingest with STRATAMETER_METRICS=precision,recall,f1,accuracy "
                        "(the predicted negatives kept too) and report its rate against precision alone")
    p.add_argument("--redis-cluster", nargs="?", const=True, default=False, metavar="URL",
                   help="also run the service's ingest against a Redis Cluster (STRATAMETER_REDIS_CLUSTER=true): "
                        "a local three-master cluster, or the cluster whose node URL is given")
    p.add_argument("--serve", type=_positive_int, nargs="?", const=1000, default=0, metavar="ANSWERS",
                   help="then run `stratameter run` (request loop, HTTP) over the ingested classifiers on each "
                        "backend: seconds to own them all, /metrics scrape time and size, and the label round "
                        "trip (answer produced -> counted by /v1/classifiers/{id}) of ANSWERS answers (default "
                        "1000) while scores stream at --serve-load times the measured ingest rate")
    p.add_argument("--serve-load", type=float, default=0.5, metavar="SHARE",
                   help="with --serve: the score stream during the round trip, as a share of the ingest rate "
                        "measured before (default 0.5; 1 saturates the service)")
    p.add_argument("--repeat", type=_positive_int, default=1, metavar="N",
                   help="time every consumer N times on the same records, one after the other in each repeat "
                        "(fresh consumer groups and keys); rates are the medians, ratios the medians of the "
                        "per-repeat ratios, and JSON lists every repeat (default 1)")
    p.add_argument("--loop-pass", action="store_true",
                   help="instead of the ingest: the request loop's pass per classifier (milliseconds, Redis "
                        "commands) when --older-chunks closed chunks per classifier still await their answers "
                        "(slow reviewers), against the newest two chunks alone, in the same run; no Kafka")
    p.add_argument("--ingest-cpu", action="store_true",
                   help="instead of the Kafka ingest: the CPU microseconds per record of this process and of Redis "
                        "when the records are parsed and applied straight into Redis, precision alone and every "
                        "metric on the same records, over the first --records of a chunk (its reservoirs filling) "
                        "and the next --records (full), and the reservoir candidates per record; medians of "
                        "--repeat; no Kafka")
    p.add_argument("--scrape-chunks", type=_positive_int, default=None, metavar="C",
                   help="instead of the ingest: the /metrics scrape with the default 1d window against the "
                        "windows disabled, when each of --classifiers classifiers holds C one-hour chunks (the "
                        "C - 1 before the current one closed) with labels in every stratum, written straight "
                        "into Redis; `stratameter run` started 5 times each way, alternating; per-round scrape "
                        "medians and the median of the rounds' ratios")
    p.add_argument("--older-chunks", type=_positive_int, default=None, metavar="M",
                   help=f"with --loop-pass: closed chunks per classifier awaiting answers (default {OLDER_CHUNKS})")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.set_defaults(handler=main, ingest_defaults={name: p.get_default(name) for name in _INGEST_ONLY.values()})


def main(args) -> int:
    from .core import bench

    def log(msg: str) -> None:
        if not args.json:
            print(f"  {msg}", file=sys.stderr, flush=True)

    wrong = _misplaced(args)
    if wrong:
        print(f"stratameter bench: {wrong}", file=sys.stderr)
        return 2
    if args.loop_pass:
        from . import loop_pass

        return _report(args, lambda: loop_pass.run(args.redis, args.classifiers, args.older_chunks or OLDER_CHUNKS),
                       _loop_pass_table)
    if args.ingest_cpu:
        from . import ingest_cpu

        return _report(args, lambda: ingest_cpu.run(args.redis, args.records, args.classifiers, args.partitions,
                                                    args.seed, args.repeat), _ingest_cpu_table)
    if args.scrape_chunks:
        from . import scrape

        return _report(args, lambda: scrape.run(args.kafka, args.redis, args.classifiers, args.scrape_chunks, log),
                       _scrape_table)
    return _report(args, lambda: bench(args.records, args.classifiers, args.partitions, kafka=args.kafka,
                                       redis=args.redis, seed=args.seed, log=log, all_metrics=args.all_metrics,
                                       redis_cluster=args.redis_cluster, serve=args.serve,
                                       serve_load=args.serve_load, repeat=args.repeat).as_json(), _table)


def _report(args, measure, table) -> int:
    """Run `measure` (a benchmark: its JSON document) and print the document as one JSON line or,
    without --json, as `table` draws it; an error is reported in one line, not a traceback."""
    try:
        doc = measure()
    except Exception as exc:  # noqa: BLE001 - a benchmark error is reported, not a traceback
        print(f"stratameter bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc))
    else:
        table(doc)
    return 0


def _loop_pass_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"request loop, one pass over {doc['classifiers']} classifiers (medians of {doc['passes']} "
                    f"passes; chunks of {doc['chunk_seconds']} s, {doc['items_per_chunk']} items each)")
    for col in ("chunks stepped", "ms / classifier", "CPU ms / classifier", "Redis commands / classifier",
                "requests pending / classifier"):
        t.add_column(col, justify="right")
    for key, what in (("with_older_chunks", f"newest two + {doc['with_older_chunks']['older_chunks']} older"),
                      ("newest_two_only", "newest two")):
        r = doc[key]
        t.add_row(what, f"{r['ms_per_classifier']:.2f}", f"{r['cpu_ms_per_classifier']:.2f}",
                  f"{r['redis_commands_per_classifier']:.0f}", f"{r['requests_pending_per_classifier']:.0f}")
    Console().print(t)


def _scrape_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"/metrics over {doc['classifiers']:,} classifiers of {doc['chunks']} chunks each "
                    f"({doc['labels_accepted']:,} labels; the {doc['window']} window pools "
                    f"{doc['window_chunks']}): seconds, median of each start's scrapes")
    for col in ("round", "windows off", f"{doc['window']} window", "on / off"):
        t.add_column(col, justify="right")
    for i, (r, ratio) in enumerate(zip(doc["rounds"], doc["ratios"])):
        t.add_row(str(i + 1), f"{r['off']['scrape_seconds_median']:.3f}", f"{r['on']['scrape_seconds_median']:.3f}",
                  f"{ratio:.3f}")
    t.add_row("median", f"{doc['off_median']:.3f}", f"{doc['on_median']:.3f}", f"{doc['on_vs_off']:.3f}")
    Console().print(t)


def _ingest_cpu_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from .ingest_cpu import HALVES, INGESTS

    t = Table(title=f"CPU microseconds per record, no Kafka: {doc['records']:,} records of a chunk and the next "
                    f"{doc['records']:,}, {doc['classifiers']} classifiers, {doc['partitions']} partitions, batches "
                    f"of {doc['batch_max_records']} (medians of {doc['repeat']})")
    for col in ("records", "ingest", "this process", "Redis", "reservoir candidates a record",
                "precision / every metric: process", "both"):
        t.add_column(col, justify="right")
    for half in HALVES:
        for name in INGESTS:
            cpu, r = doc[half]["cpu_us_per_record"][name], doc[half]
            last = name == "all_metrics"
            t.add_row(half, name, f"{cpu['python']:.3f}", f"{cpu['redis']:.3f}", f"{r['reservoir_candidates_per_record'][name]:.3f}",
                      f"{r['python_ratio']:.3f}" if last else "", f"{r['both_ratio']:.3f}" if last else "")
    Console().print(t)


def _table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{doc['records']:,} score records, {doc['classifiers']} classifiers, "
                    f"{doc['partitions']} partitions, batches of {doc['batch_max_records']}")
    t.add_column("consumer")
    t.add_column("records/s", justify="right")
    t.add_column("seconds", justify="right")
    t.add_column("vs bare decode", justify="right")
    dec = doc["raw_consume_decode_records_per_s"]
    for name, rate, secs in (
        ("bare aiokafka, raw", doc["raw_consume_records_per_s"], doc["raw_seconds"]),
        ("bare aiokafka + orjson.loads", dec, doc["decode_seconds"]),
        ("the same, aiokafka's own record objects", doc["raw_consume_decode_own_records_per_s"],
         doc["records"] / doc["raw_consume_decode_own_records_per_s"]),
        ("service: Kafka -> Redis state", doc["service_records_per_s"], doc["service_seconds"]),
        *((("service, every metric (both sides)", doc["service_all_metrics_records_per_s"],
            doc["records"] / doc["service_all_metrics_records_per_s"]),) if "all_metrics_vs_precision" in doc else ()),
        *((("service on a Redis Cluster", doc["service_cluster_records_per_s"],
            doc["records"] / doc["service_cluster_records_per_s"]),) if "cluster_vs_single" in doc else ()),
    ):
        t.add_row(name, f"{rate:,}", f"{secs:.2f}", f"{rate / dec:.2f}")
    console = Console()
    console.print(t)
    m = Table(title="Redis memory per classifier (MEMORY USAGE of its keys)")
    m.add_column("records counted", justify="right")
    m.add_column("bytes per classifier", justify="right")
    for snap in doc["redis_bytes_per_classifier_at"]:
        m.add_row(f"{snap['records']:,}", f"{snap['bytes_per_classifier']:,}")
    console.print(m)
    for key, what in (("redis_bytes_per_classifier_all_metrics", "every metric"),
                      ("redis_bytes_per_classifier_cluster", "on the Redis Cluster")):
        if key in doc:
            console.print(f"Redis bytes per classifier at the end, {what}: {doc[key]:,}")
    for backend, doc_serve in doc.get("serve", {}).items():
        console.print(f"the whole service on {backend}: owned every classifier in {doc_serve['owned_seconds']:.1f} s; "
                      f"/metrics {doc_serve['scrape_seconds_median']:.3f} s median ({doc_serve['scrape_seconds_max']:.3f} "
                      f"max), {doc_serve['scrape_bytes']:,} bytes, {doc_serve['scrape_series']:,} series; label round "
                      f"trip p50 {doc_serve['label_round_trip_ms_p50']:.0f} ms, p99 "
                      f"{doc_serve['label_round_trip_ms_p99']:.0f} ms over {doc_serve['label_round_trips']:,} answers, "
                      f"scores streaming at {doc_serve['stream_records_per_s']:,} records/s")
    for ingest, cpu in doc.get("cpu_us_per_record", {}).items():
        redis = "" if cpu["redis"] is None else f", Redis {cpu['redis']:.2f}"
        console.print(f"CPU per record, {ingest}: this process {cpu['python']:.2f} us{redis}")
    if "all_metrics_vs_precision_cpu" in doc:
        console.print(f"CPU per record (both processes), precision alone against every metric: "
                      f"{doc['all_metrics_vs_precision_cpu']:.3f}")
    console.print(f"service group join (excluded): {doc['service_join_seconds']:.2f} s; "
                  f"records counted in Redis: {doc['records_counted']:,}")
