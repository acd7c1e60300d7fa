"""`stratameter bench --serve`: the whole service over the classifiers the ingest run left
in Redis, measured from outside as Prometheus and a reviewer see it.

After the ingest measurement, ``stratameter run`` starts as a subprocess on the same key
prefix and consumer group (the state is there; the offsets are committed), with the
request loop and the HTTP server, fresh label-request and label topics, and the hourly
label budget raised.  Then:

1. **ownership**: seconds until ``/metrics`` exports every classifier (one instance takes
   every lease);
2. **scrape**: ``GET /metrics`` `SCRAPES` times: seconds per scrape (median, max), bytes and
   series, with every classifier owned;
3. **label round trip**: while score records stream to the scores topic at ``stream_rate``
   records/s (the ingest run's values again, paced), a reviewer answers ``answers`` label
   requests, at most one outstanding per classifier and `IN_FLIGHT` at once; the round trip
   of an answer is from just before it is produced to the labels topic until
   ``/v1/classifiers/{id}`` counts it in ``labels_by_outcome.accepted`` (its interval is
   computed from the same state, at request time).  Each outstanding classifier's document
   is polled every `POLL_S`, which bounds the resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np

from ..api.client import http_get, http_json

SCRAPES = 5
IN_FLIGHT = 16
POLL_S = 0.005


async def serve_bench(env: dict[str, str], kafka: str, topics: dict[str, str], cids: list[str],
                      stream: list[tuple[bytes, bytes]], stream_rate: float, answers: int, timeout_s: float,
                      log: Callable[[str], None]) -> dict:
    """The measurements above; `env` is the ingest run's ``STRATAMETER_*`` settings."""
    from ..embedded import create_topics, find_free_port

    port = find_free_port()
    topics = {**topics, **{k: f"{topics[k]}-{port}" for k in ("requests", "labels", "dlq")}}  # this run's own
    await create_topics(kafka, [topics[k] for k in ("requests", "labels", "dlq")], partitions=1)
    env = {**os.environ, **env, "STRATAMETER_TOPIC_LABEL_REQUESTS": topics["requests"],
           "STRATAMETER_TOPIC_LABELS": topics["labels"], "STRATAMETER_TOPIC_DEAD_LETTER": topics["dlq"],
           "STRATAMETER_HTTP_PORT": str(port), "STRATAMETER_HTTP_HOST": "127.0.0.1",
           "STRATAMETER_INSTANCE_ID": "bench", "STRATAMETER_MAX_LABELS_PER_HOUR": "100000000",
           "STRATAMETER_LABEL_TIMEOUT_SECONDS": "3600", "STRATAMETER_LOG_LEVEL": "WARNING"}
    with service_process(env) as proc:
        log(f"service with request loop and HTTP on port {port}: waiting to own {len(cids)} classifiers")
        owned_s = await _until_owned(port, cids, proc, timeout_s)
        log(f"scraping /metrics {SCRAPES} times")
        scrape = await _scrapes(port)
        log(f"label round trip: {answers} answers while scores stream at {stream_rate:,.0f} records/s")
        trip = await _round_trips(port, kafka, topics, cids, stream, stream_rate, answers, timeout_s)
    return {"owned_seconds": round(owned_s, 3), **scrape, **trip}


@contextlib.contextmanager
def service_process(env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """`stratameter run` as a subprocess under `env`, its output kept aside: the last 4,000 bytes of
    it written to stderr if the body raises; terminated on leaving (killed after 20 s)."""
    with tempfile.TemporaryFile() as logfile:
        proc = subprocess.Popen([sys.executable, "-m", "stratameter.cli", "run"], env=env, stdout=logfile,
                                stderr=subprocess.STDOUT)
        try:
            yield proc
        except BaseException:
            logfile.seek(0)
            sys.stderr.write(logfile.read()[-4000:].decode(errors="replace"))
            raise
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _until_owned(port: int, cids: list[str], proc: subprocess.Popen, timeout_s: float) -> float:
    t0 = time.monotonic()
    want = {f'stratameter_scores_total{{classifier="{c}"}}'.encode() for c in cids}
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"stratameter run exited with code {proc.returncode}")
        try:
            status, body = await http_get(port, "/metrics", timeout=30)
        except OSError:
            status, body = 0, b""
        if status == 200 and sum(line.split(b" ")[0] in want for line in body.splitlines()) == len(want):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"the service did not own all {len(cids)} classifiers in {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


async def _scrapes(port: int) -> dict:
    seconds, body = [], b""
    for _ in range(SCRAPES):
        t = time.perf_counter()
        status, body = await http_get(port, "/metrics", timeout=60)
        seconds.append(time.perf_counter() - t)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
    return {"scrape_seconds_median": round(float(np.median(seconds)), 3), "scrape_seconds_max": round(max(seconds), 3),
            "scrape_bytes": len(body),
            "scrape_series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))}


async def _round_trips(port: int, kafka: str, topics: dict[str, str], cids: list[str], stream: list[tuple[bytes, bytes]],
                       stream_rate: float, answers: int, timeout_s: float) -> dict:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from stratameter.schemas.outbound import decode_label_request, label_record_bytes

    producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=False, linger_ms=0)
    await producer.start()
    consumer = AIOKafkaConsumer(topics["requests"], bootstrap_servers=kafka, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    stop = asyncio.Event()
    streaming = asyncio.create_task(_stream(producer, topics["scores"], stream, stream_rate, stop))
    waiting: dict[str, list[str]] = {}  # classifier -> request ids not answered yet
    answered = {c: 0 for c in cids}
    trips: list[float] = []
    in_flight: dict[str, float] = {}  # classifier -> when its outstanding answer was produced
    gets: list[float] = []  # seconds per GET /v1/classifiers/{id} (the poll's own cost)
    rng = random.Random(0)
    deadline = time.monotonic() + timeout_s
    try:
        while len(trips) < answers and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=0)).values():
                for r in records:
                    req = decode_label_request(r.value)
                    waiting.setdefault(req.classifier_id, []).append(req.request_id)
            for cid in [c for c, rids in waiting.items() if rids and c not in in_flight][: IN_FLIGHT - len(in_flight)]:
                if len(trips) + len(in_flight) >= answers:
                    break
                rid = waiting[cid].pop(0)
                in_flight[cid] = time.perf_counter()
                await producer.send_and_wait(topics["labels"], key=cid.encode(),
                                             value=label_record_bytes(rid, rng.random() < 0.8))
                answered[cid] += 1
            docs = await asyncio.gather(*(_timed(gets, http_json(port, f"/v1/classifiers/{c}")) for c in in_flight))
            now = time.perf_counter()
            for cid, (status, doc) in zip(list(in_flight), docs):
                if status == 200 and doc["labels_by_outcome"]["accepted"] >= answered[cid]:
                    trips.append(now - in_flight.pop(cid))
            await asyncio.sleep(POLL_S)
    finally:
        stop.set()
        streamed = await streaming
        await consumer.stop()
        await producer.stop()
    if not trips:
        raise TimeoutError(f"no label round trip completed in {timeout_s:.0f}s")
    ms = np.asarray(trips) * 1000
    return {"label_round_trips": len(trips), "label_round_trips_complete": len(trips) == answers,
            "label_round_trip_ms_p50": round(float(np.percentile(ms, 50)), 1),
            "label_round_trip_ms_p99": round(float(np.percentile(ms, 99)), 1),
            "label_round_trip_ms_max": round(float(ms.max()), 1),
            "api_get_ms_p50": round(float(np.percentile(gets, 50)) * 1000, 1), "stream_records_per_s": round(streamed)}


async def _timed(seconds: list[float], call):
    t = time.perf_counter()
    try:
        return await call
    finally:
        seconds.append(time.perf_counter() - t)


async def _stream(producer, topic: str, records: list[tuple[bytes, bytes]], rate: float, stop: asyncio.Event
                  ) -> float:
    """Send `records` (key, value) over and over at `rate` records/s (in 50 ms slices) until `stop`; the rate achieved."""
    t0, sent, i = time.perf_counter(), 0, 0
    while not stop.is_set():
        due = int((time.perf_counter() - t0) * rate) - sent
        for _ in range(max(due, 0)):
            key, value = records[i % len(records)]
            await producer.send(topic, key=key, value=value)
            i += 1
        sent += max(due, 0)
        await asyncio.sleep(0.05)
    return sent / (time.perf_counter() - t0)
