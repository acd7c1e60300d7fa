"""`stratameter soak`: run the service for minutes at a steady rate while
breaking things every minute, then check every count.

Starts an embedded tansu broker with a `tansu proxy` in front of it, a Redis
with an append-only file, and `stratameter run` as a subprocess reaching Kafka
through the proxy.  A producer sends score records at `--rate` per second
(straight to the broker, so it keeps producing through outages) and a reviewer
answers every label request from ground truth.  Every `--fault-every` seconds
one fault, in turn: SIGKILL the service and restart it; stop the proxy for
`--outage` seconds; stop Redis for `--outage` seconds.  At the end: records in
vs records counted, labels answered vs folded, the same two read off every
stratum of every chunk (on both sides of the threshold with `--metrics` naming
recall, F1 or accuracy), the service's RSS and Redis' used memory (the most, and
the most in each minute, so growth over a long soak shows), and the seconds
/readyz was not 200.  Exit code 1 if a count differs.

`--metrics` (STRATAMETER_METRICS of the service, default precision): with a
metric that needs the predicted negatives, the records carry no
``predicted_positive`` and the service's 0.5 threshold splits them about in
half, so the negatives' state (its own chunks, strata, reservoirs, offsets and
label requests) goes through the same faults.

`--chunk-seconds` and `--chunk-retention` (the service's CHUNK_SECONDS, default
120 here, and CHUNK_RETENTION, default the service's): short chunks and a short
retention make a soak of minutes open, close and purge the many chunks a
service opens in days, so the purges go through the faults too and the memory
series shows whether anything grows with the chunks.  HISTORY_CHUNKS is raised
to hold every chunk of the soak, so the strata's sums still cover every record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from stratameter.schemas.outbound import score_record_bytes

from ..api.client import http_json
from ..config.checks import metric_list
from ..stats.confusion import needs_negatives

#: injected in turn, one every `--fault-every` seconds
FAULTS = ("kill-9 service", "kafka outage", "redis outage")
#: the service's chunk length in the soak unless `--chunk-seconds` says otherwise
CHUNK_SECONDS = 120
#: seconds `_drain` waits at most for the last counts
DRAIN_SECONDS = 180


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="run the service under steady load with faults injected; check every count")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=1000, help="score records per second (default 1000)")
    p.add_argument("--classifiers", type=int, default=5)
    p.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults (default 60)")
    p.add_argument("--outage", type=float, default=15.0, help="seconds a broker/Redis outage lasts (default 15)")
    p.add_argument("--metrics", type=_metrics, default="precision",
                   help="the service's STRATAMETER_METRICS (default precision); with recall, f1 or accuracy the "
                        "records are split by the 0.5 threshold and both sides' state is checked")
    p.add_argument("--chunk-seconds", type=int, default=CHUNK_SECONDS,
                   help=f"the service's STRATAMETER_CHUNK_SECONDS (default {CHUNK_SECONDS})")
    p.add_argument("--chunk-retention", type=int, default=None,
                   help="the service's STRATAMETER_CHUNK_RETENTION, chunks whose reservoirs are kept (default the "
                        "service's)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    p.set_defaults(handler=main)


def _metrics(text: str) -> str:
    """`--metrics`, checked and made canonical as STRATAMETER_METRICS is (`config.checks.metric_list`)."""
    try:
        return metric_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(args) -> int:
    if (args.minutes <= 0 or args.rate < 1 or args.classifiers < 1 or args.fault_every <= args.outage
            or args.chunk_seconds < 1 or (args.chunk_retention is not None and args.chunk_retention < 1)):
        print("stratameter soak: error: need --minutes > 0, --rate >= 1, --classifiers >= 1, "
              "--fault-every > --outage, --chunk-seconds >= 1, --chunk-retention >= 1", file=sys.stderr)
        return 2
    from ..embedded import BackendError

    try:
        report = asyncio.run(soak(args.minutes * 60, args.rate, args.classifiers, args.fault_every, args.outage,
                                  quiet=args.json, metrics=args.metrics, chunk_seconds=args.chunk_seconds,
                                  chunk_retention=args.chunk_retention))
    except BackendError as exc:  # e.g. no broker binary: the [local] extra
        print(f"stratameter soak: cannot start a backend: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report) if args.json else "\n".join(f"{k:>28}: {v}" for k, v in report.items()))
    return 0 if report["exact"] else 1


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class _Traffic:
    """What the load sent and the reviewer answered: the truth every count is checked against."""

    classifiers: list[str]
    truth: dict[str, int] = field(default_factory=dict)  # item -> label
    answered: dict[str, bool | None] = field(default_factory=dict)  # request id -> label
    records: int = 0  # score records sent
    closed: bool = False  # the reviewer has stopped: later requests stay unanswered

    def answer(self, request):
        """The item's true label; a request seen again gets the same answer; none once `closed`
        (Ellipsis: `embedded.answer_label_requests` sends nothing)."""
        if self.closed:
            return ...
        return self.answered.setdefault(request.request_id, bool(self.truth[request.item_id]))

    def answered_count(self) -> int:
        return sum(1 for v in self.answered.values() if v is not None)


@dataclass
class _Watch:
    """What `_observe` and the faults saw: the service's RSS and Redis' used memory, the most
    in each minute of the soak (bytes), and the seconds `/readyz` said not ready."""

    rss_by_minute: list[int] = field(default_factory=list)
    redis_by_minute: list[int] = field(default_factory=list)
    not_ready_s: float = 0.0
    faults: list[str] = field(default_factory=list)

    def note(self, minute: int, rss: int, redis: int | None) -> None:
        for series, value in ((self.rss_by_minute, rss), (self.redis_by_minute, redis)):
            while len(series) <= minute:
                series.append(0)
            if value is not None:
                series[minute] = max(series[minute], value)


class _Service:
    """`stratameter run` as a subprocess writing to `log`."""

    def __init__(self, env: dict[str, str], log: IO[bytes]) -> None:
        self.env, self.log = env, log
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "stratameter.cli", "run"], env=self.env, stdout=self.log,
                                stderr=self.log)

    async def kill_and_restart(self, outage: float) -> None:
        """SIGKILL, a new process a second later, then the rest of the outage."""
        self.proc.kill()
        self.proc.wait()
        await asyncio.sleep(1)
        self.proc = self._spawn()
        await asyncio.sleep(outage - 1)

    def terminate(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


#: The service's Redis key prefix in the soak (`_strata_counts` reads its state under it).
KEY_PREFIX = "soak"


def _service_env(bootstrap: str, redis_url: str, port: int, topics: dict[str, str], metrics: str,
                 chunks: dict[str, str]) -> dict[str, str]:
    """The service's settings; `chunks`: CHUNK_SECONDS and the like (`_chunk_settings`)."""
    return {**os.environ, **{f"STRATAMETER_{k}": v for k, v in {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "KAFKA_SESSION_TIMEOUT_MS": "6000",
        "REDIS_URL": redis_url, "REDIS_KEY_PREFIX": KEY_PREFIX, "METRICS": metrics,
        "HTTP_PORT": str(port), "HTTP_HOST": "127.0.0.1", "LOG_LEVEL": "WARNING",
        "TOPIC_SCORES": topics["scores"], "TOPIC_LABEL_REQUESTS": topics["requests"],
        "TOPIC_LABELS": topics["labels"], "TOPIC_DEAD_LETTER": topics["dlq"], **chunks,
        "DELTA": "0.03", "MAX_LABELS_PER_HOUR": "100000", "INSTANCE_ID": "soak"}.items()}}


def _chunk_settings(duration_s: float, chunk_seconds: int, chunk_retention: int | None) -> dict[str, str]:
    """CHUNK_SECONDS, CHUNK_RETENTION if given, and HISTORY_CHUNKS large enough that no chunk the
    soak opens (through its drain) loses its summary, which `_strata_counts` sums."""
    from ..config.settings import Settings

    spanned = int((duration_s + DRAIN_SECONDS) // chunk_seconds) + 2
    out = {"CHUNK_SECONDS": str(chunk_seconds),
           "HISTORY_CHUNKS": str(max(spanned, Settings.model_fields["history_chunks"].default))}
    if chunk_retention is not None:
        out["CHUNK_RETENTION"] = str(chunk_retention)
    return out


async def soak(duration_s: float, rate: int, n_classifiers: int, fault_every: float, outage: float,
               quiet: bool = False, metrics: str = "precision", chunk_seconds: int = CHUNK_SECONDS,
               chunk_retention: int | None = None) -> dict:
    from aiokafka import AIOKafkaProducer
    from redis.asyncio import Redis

    from ..embedded import EmbeddedKafka, EmbeddedKafkaProxy, EmbeddedRedis, create_topics, find_free_port

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    traffic = _Traffic([f"soak-{i}" for i in range(n_classifiers)])
    both_sides = needs_negatives(metrics.split(","))
    topics = {"scores": "soak.scores", "requests": "soak.requests", "labels": "soak.labels", "dlq": "soak.dlq"}
    work = Path(tempfile.mkdtemp(prefix="stratameter-soak-"))
    with EmbeddedKafka() as kafka, EmbeddedKafkaProxy(kafka.bootstrap) as proxy, \
            EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "everysec"]) as redis:
        await create_topics(kafka.bootstrap, list(topics.values()), partitions=6)
        port = find_free_port()
        chunks = _chunk_settings(duration_s, chunk_seconds, chunk_retention)
        service = _Service(_service_env(proxy.bootstrap, redis.url, port, topics, metrics, chunks),
                           open(work / "service.log", "ab"))
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=False, linger_ms=20)
        await producer.start()
        watch, stop = _Watch(), asyncio.Event()
        redis_client = Redis.from_url(redis.url, socket_timeout=2)
        tasks = [asyncio.create_task(c) for c in (
            _produce(producer, topics["scores"], traffic, rate, stop, both_sides),
            _review(kafka.bootstrap, topics, producer, traffic),
            _observe(port, service, redis_client, watch, stop))]
        t_end = time.monotonic() + duration_s
        try:
            await _inject_faults(service, {"kafka outage": proxy, "redis outage": redis}, fault_every, outage, t_end,
                                 watch, lambda fault: say(f"[{time.strftime('%H:%M:%S')}] fault: {fault} "
                                                          f"(records sent {traffic.records})"))
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            stop.set()
            await tasks[0]
            # the request loop goes on sampling the open chunks: the reviewer stops too, so the answers
            # the counts are checked against stop growing (an answer is recorded before it is sent,
            # and sending only queues it: the flush sends the last)
            traffic.closed = True
            await producer.flush()
            say(f"[{time.strftime('%H:%M:%S')}] load and answers stopped after {traffic.records} records, "
                f"{traffic.answered_count()} answers; draining")
            counted, folded = await _drain(port, traffic.classifiers, traffic.records, traffic.answered_count,
                                           DRAIN_SECONDS)
            strata = await _strata_counts(redis_client, traffic.classifiers, both_sides)
        finally:
            stop.set()
            for t in tasks[1:]:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            service.terminate()
            await producer.stop()
            await redis_client.aclose()
        return _report(duration_s, rate, metrics, chunks, traffic, watch, counted, folded, strata)


async def _produce(producer, topic: str, traffic: _Traffic, rate: int, stop: asyncio.Event, both_sides: bool
                   ) -> None:
    """Score records at `rate` per second over the classifiers, each item's truth drawn
    (deterministically) more often positive the higher its score; flushed once stopped.  Every
    record predicted positive, or with `both_sides` none says (the service's threshold decides)."""
    t0, i = time.monotonic(), 0
    n_classifiers = len(traffic.classifiers)
    while not stop.is_set():
        due = int((time.monotonic() - t0) * rate)
        while i < due:
            cid = traffic.classifiers[i % n_classifiers]
            score = (i * 7919 % 10007) / 10007
            item = f"{cid}#{i}"
            traffic.truth[item] = int((i * 104729 % 10007) / 10007 < 0.4 + 0.6 * score)
            await producer.send(topic, key=cid.encode(), value=score_record_bytes(
                cid, item, score, predicted_positive=None if both_sides else True, event_time=int(time.time() * 1000)))
            i += 1
        traffic.records = i
        await asyncio.sleep(0.05)
    await producer.flush()


async def _review(bootstrap: str, topics: dict[str, str], producer, traffic: _Traffic) -> None:
    """A reviewer answering every label request from the truth."""
    from ..embedded import answer_label_requests, group_consumer

    async with group_consumer(topics["requests"], bootstrap_servers=bootstrap, group_id="soak-rev") as consumer:
        await answer_label_requests(consumer, producer, topics["labels"], traffic.answer)


async def _observe(port: int, service: _Service, redis_client, watch: _Watch, stop: asyncio.Event) -> None:
    """Once a second: is the service ready, its RSS, Redis' used memory (`_Watch.note`)."""
    t0 = time.monotonic()
    while not stop.is_set():
        status, _ = await http_json(port, "/readyz")
        if status != 200:
            watch.not_ready_s += 1.0
        try:
            redis_memory = int((await redis_client.info("memory"))["used_memory"])
        except Exception:  # noqa: BLE001 - Redis is down during its fault
            redis_memory = None
        watch.note(int((time.monotonic() - t0) // 60), _rss_bytes(service.proc.pid), redis_memory)
        await asyncio.sleep(1.0)


async def _inject_faults(service: _Service, backends: dict, fault_every: float, outage: float, t_end: float,
                         watch: _Watch, say) -> None:
    """Every `fault_every` seconds while another fits before `t_end`, the next of `FAULTS`:
    the service killed and restarted, or a backend (`backends[fault]`) stopped for `outage` seconds."""
    n = 0
    while time.monotonic() + fault_every < t_end:
        await asyncio.sleep(fault_every - outage)
        fault = FAULTS[n % len(FAULTS)]
        say(fault)
        watch.faults.append(fault)
        if fault in backends:
            backends[fault].stop()
            await asyncio.sleep(outage)
            backends[fault].start()
        else:
            await service.kill_and_restart(outage)
        n += 1


async def _strata_counts(redis_client, classifiers: list[str], both_sides: bool) -> dict[str, int]:
    """Items and labelled items summed over every stratum of every chunk the soak's classifiers
    keep (both sides' with `both_sides`; the predicted negatives' share apart too): each record is
    in exactly one stratum of one side and each folded label in one, so the sums must equal the
    records sent and the labels folded (`_chunk_settings` keeps every chunk's summary).  Also the
    chunks, and those the retention purged (`RequestStore.purge_chunks`: their histogram is gone)."""
    from ..state.keys import negatives_of
    from ..state.store import Store

    chunks = Store(redis_client, KEY_PREFIX).chunks
    out = dict.fromkeys(("items", "labels", "negative_items", "negative_labels", "chunks", "chunks_purged"), 0)

    async def add(sids: list[str], side: str) -> None:
        for sid in sids:
            ids = await chunks.chunk_ids(sid)
            for chunk in await chunks.chunk_states(sid, ids):
                out[f"{side}items"] += int(chunk.N.sum())
                out[f"{side}labels"] += int(chunk.n.sum())
            out["chunks"] += len(ids)
            if ids:  # one EXISTS for the state's chunks: it counts the keys present
                out["chunks_purged"] += len(ids) - await redis_client.exists(*(chunks.keys.chunk_bins(sid, t)
                                                                                for t in ids))

    await add(classifiers, "")
    await add([negatives_of(c) for c in classifiers] if both_sides else [], "negative_")
    out["items"] += out["negative_items"]
    out["labels"] += out["negative_labels"]
    return out


def _report(duration_s: float, rate: int, metrics: str, chunks: dict[str, str], traffic: _Traffic, watch: _Watch,
            counted: int, folded: int, strata: dict[str, int]) -> dict:
    answered = traffic.answered_count()
    return {
        "duration_s": round(duration_s), "rate_per_s": rate, "classifiers": len(traffic.classifiers),
        "metrics": metrics, "chunk_seconds": int(chunks["CHUNK_SECONDS"]),
        "chunk_retention": int(chunks["CHUNK_RETENTION"]) if "CHUNK_RETENTION" in chunks else None,
        "faults": len(watch.faults), "fault_kinds": sorted(set(watch.faults)),
        "records_in": traffic.records, "records_counted": counted, "strata_items": strata["items"],
        "labels_answered": answered, "labels_folded": folded, "strata_labels": strata["labels"],
        "strata_items_negative": strata["negative_items"], "strata_labels_negative": strata["negative_labels"],
        "chunks": strata["chunks"], "chunks_purged": strata["chunks_purged"],
        "exact": (counted == strata["items"] == traffic.records) and (folded == strata["labels"] == answered),
        "max_rss_mib": _mib(max(watch.rss_by_minute, default=0)),
        "max_redis_used_memory_mib": _mib(max(watch.redis_by_minute, default=0)),
        "rss_mib_by_minute": list(map(_mib, watch.rss_by_minute)),
        "redis_used_memory_mib_by_minute": list(map(_mib, watch.redis_by_minute)),
        "not_ready_s": watch.not_ready_s,
    }


def _mib(n_bytes: int) -> float:
    return round(n_bytes / 2**20, 1)


async def _drain(port: int, classifiers, expected: int, answered, timeout: float) -> tuple[int, int]:
    """Wait until every record is counted and every answer folded (or timeout)."""
    deadline = time.monotonic() + timeout
    counted = folded = 0
    while time.monotonic() < deadline:
        counted = folded = 0
        for cid in classifiers:
            status, doc = await http_json(port, f"/v1/classifiers/{cid}")
            if doc:
                counted += doc["scores"]
                folded += doc["labels_by_outcome"]["accepted"]
        if counted == expected and folded == answered():
            await asyncio.sleep(5)  # and nothing more arrives
            return counted, folded
        await asyncio.sleep(1)
    return counted, folded
