"""`stratameter soak`: run the service for minutes at a steady rate while
breaking things every minute, then check every count.

Starts an embedded tansu broker with a `tansu proxy` in front of it, a Redis
with an append-only file, and `stratameter run` as a subprocess reaching Kafka
through the proxy.  A producer sends score records at `--rate` per second
(straight to the broker, so it keeps producing through outages) and a reviewer
answers every label request from ground truth.  Every `--fault-every` seconds
one fault, in turn: SIGKILL the service and restart it; stop the proxy for
`--outage` seconds; stop Redis for `--outage` seconds.  At the end: records in
vs records counted, labels answered vs folded, max RSS of the service, max
Redis memory, and the seconds /readyz was not 200.  Exit code 1 if a count
differs.
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
from pathlib import Path

import orjson

from ..api.client import http_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="run the service under steady load with faults injected; check every count")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=1000, help="score records per second (default 1000)")
    p.add_argument("--classifiers", type=int, default=5)
    p.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults (default 60)")
    p.add_argument("--outage", type=float, default=15.0, help="seconds a broker/Redis outage lasts (default 15)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    p.set_defaults(handler=main)


def main(args) -> int:
    if args.minutes <= 0 or args.rate < 1 or args.classifiers < 1 or args.fault_every <= args.outage:
        print("stratameter soak: error: need --minutes > 0, --rate >= 1, --classifiers >= 1, "
              "--fault-every > --outage", file=sys.stderr)
        return 2
    report = asyncio.run(soak(args.minutes * 60, args.rate, args.classifiers, args.fault_every, args.outage,
                              quiet=args.json))
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


async def _get(port: int, path: str) -> tuple[int, dict | None]:
    return await http_json(port, path)


async def soak(duration_s: float, rate: int, n_classifiers: int, fault_every: float, outage: float,
               quiet: bool = False) -> dict:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from redis.asyncio import Redis

    from ..embedded import (EmbeddedKafka, EmbeddedKafkaProxy, EmbeddedRedis, create_topics, find_free_port,
                            leave_group_on_stop)

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    classifiers = [f"soak-{i}" for i in range(n_classifiers)]
    topics = {"scores": "soak.scores", "requests": "soak.requests", "labels": "soak.labels", "dlq": "soak.dlq"}
    work = Path(tempfile.mkdtemp(prefix="stratameter-soak-"))
    with EmbeddedKafka() as kafka, EmbeddedKafkaProxy(kafka.bootstrap) as proxy, \
            EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "everysec"]) as redis:
        await create_topics(kafka.bootstrap, list(topics.values()), partitions=6)
        port = find_free_port()
        env = {**os.environ, **{f"STRATAMETER_{k}": v for k, v in {
            "KAFKA_BOOTSTRAP_SERVERS": proxy.bootstrap, "KAFKA_SESSION_TIMEOUT_MS": "6000",
            "REDIS_URL": redis.url, "HTTP_PORT": str(port), "HTTP_HOST": "127.0.0.1", "LOG_LEVEL": "WARNING",
            "TOPIC_SCORES": topics["scores"], "TOPIC_LABEL_REQUESTS": topics["requests"],
            "TOPIC_LABELS": topics["labels"], "TOPIC_DEAD_LETTER": topics["dlq"], "CHUNK_SECONDS": "120",
            "DELTA": "0.03", "MAX_LABELS_PER_HOUR": "100000", "INSTANCE_ID": "soak"}.items()}}
        log = open(work / "service.log", "ab")

        def start_service() -> subprocess.Popen:
            return subprocess.Popen([sys.executable, "-m", "service.cli", "run"], env=env, stdout=log, stderr=log)

        proc = start_service()
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=False, linger_ms=20)
        await producer.start()
        truth: dict[str, int] = {}
        answered: dict[str, bool | None] = {}
        sent = {"records": 0}
        stop = asyncio.Event()

        async def produce() -> None:
            t0, i = time.monotonic(), 0
            while not stop.is_set():
                due = int((time.monotonic() - t0) * rate)
                while i < due:
                    cid = classifiers[i % n_classifiers]
                    score = (i * 7919 % 10007) / 10007
                    item = f"{cid}#{i}"
                    truth[item] = int((i * 104729 % 10007) / 10007 < 0.4 + 0.6 * score)
                    await producer.send(topics["scores"], key=cid.encode(), value=orjson.dumps(
                        {"classifier_id": cid, "item_id": item, "score": score,
                         "predicted_positive": True, "event_time": int(time.time() * 1000)}))
                    i += 1
                sent["records"] = i
                await asyncio.sleep(0.05)
            await producer.flush()

        async def review() -> None:
            consumer = AIOKafkaConsumer(topics["requests"], bootstrap_servers=kafka.bootstrap, group_id="soak-rev",
                                        auto_offset_reset="earliest", session_timeout_ms=6000,
                                        heartbeat_interval_ms=500)
            await consumer.start()
            leave_group_on_stop(consumer)
            try:
                async for rec in consumer:
                    req = orjson.loads(rec.value)
                    rid = req["request_id"]
                    label = answered.setdefault(rid, bool(truth[req["item_id"]]))
                    await producer.send(topics["labels"], value=orjson.dumps({"request_id": rid, "label": label}))
            finally:
                await consumer.stop()

        watch = {"max_rss": 0, "max_redis": 0, "not_ready_s": 0.0, "faults": []}
        redis_client = Redis.from_url(redis.url, socket_timeout=2)

        async def observe() -> None:
            while not stop.is_set():
                status, _ = await _get(port, "/readyz")
                if status != 200:
                    watch["not_ready_s"] += 1.0
                watch["max_rss"] = max(watch["max_rss"], _rss_bytes(proc.pid))
                try:
                    watch["max_redis"] = max(watch["max_redis"], int((await redis_client.info("memory"))["used_memory"]))
                except Exception:  # noqa: BLE001 - Redis is down during its fault
                    pass
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(c) for c in (produce(), review(), observe())]
        t_end = time.monotonic() + duration_s
        n = 0
        try:
            while time.monotonic() + fault_every < t_end:
                await asyncio.sleep(fault_every - outage)
                fault = ("kill-9 service", "kafka outage", "redis outage")[n % 3]
                say(f"[{time.strftime('%H:%M:%S')}] fault: {fault} (records sent {sent['records']})")
                watch["faults"].append(fault)
                if n % 3 == 0:
                    proc.kill()
                    proc.wait()
                    await asyncio.sleep(1)
                    proc = start_service()
                    await asyncio.sleep(outage - 1)
                elif n % 3 == 1:
                    proxy.stop()
                    await asyncio.sleep(outage)
                    proxy.start()
                else:
                    redis.stop()
                    await asyncio.sleep(outage)
                    redis.start()
                n += 1
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            stop.set()
            await tasks[0]
            say(f"[{time.strftime('%H:%M:%S')}] load stopped after {sent['records']} records; draining")
            counted, folded = await _drain(port, classifiers, sent["records"], lambda: sum(
                1 for v in answered.values() if v is not None), 180)
        finally:
            stop.set()
            for t in tasks[1:]:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            proc.terminate()
            proc.wait(20)
            await producer.stop()
            await redis_client.aclose()
        answered_n = sum(1 for v in answered.values() if v is not None)
        return {
            "duration_s": round(duration_s), "rate_per_s": rate, "classifiers": n_classifiers,
            "faults": len(watch["faults"]), "fault_kinds": sorted(set(watch["faults"])),
            "records_in": sent["records"], "records_counted": counted,
            "labels_answered": answered_n, "labels_folded": folded,
            "exact": counted == sent["records"] and folded == answered_n,
            "max_rss_mib": round(watch["max_rss"] / 2**20, 1),
            "max_redis_used_memory_mib": round(watch["max_redis"] / 2**20, 1),
            "not_ready_s": watch["not_ready_s"],
        }


async def _drain(port: int, classifiers, expected: int, answered, timeout: float) -> tuple[int, int]:
    """Wait until every record is counted and every answer folded (or timeout)."""
    deadline = time.monotonic() + timeout
    counted = folded = 0
    while time.monotonic() < deadline:
        counted = folded = 0
        for cid in classifiers:
            status, doc = await _get(port, f"/v1/classifiers/{cid}")
            if doc:
                counted += doc["scores"]
                folded += doc["labels_by_outcome"]["accepted"]
        if counted == expected and folded == answered():
            await asyncio.sleep(5)  # and nothing more arrives
            return counted, folded
        await asyncio.sleep(1)
    return counted, folded
