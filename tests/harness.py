"""Running the service in-process against the test broker and Redis, plus a
reviewer that answers label requests; shared by the service tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer

from stratameter.api.client import http_get, http_json  # noqa: F401 - the tests' HTTP client
from stratameter.config import load_settings
from stratameter.state.keys import NEGATIVES_SUFFIX
from stratameter.embedded import answer_label_requests, create_topics, find_free_port, group_consumer, start_group_consumer


@dataclass(frozen=True)
class RedisBackend:
    """A single Redis or a Redis Cluster, as the service is told about it."""

    url: str
    cluster: bool

    @property
    def settings(self) -> dict[str, str]:
        """``REDIS_URL`` and ``REDIS_CLUSTER``, for `running_service` and `Workload`."""
        return {"REDIS_URL": self.url, "REDIS_CLUSTER": "true" if self.cluster else "false"}

    def client(self):
        from redis.asyncio import Redis, RedisCluster

        return (RedisCluster if self.cluster else Redis).from_url(self.url)


@dataclass
class Running:
    service: object
    port: int
    topics: dict[str, str]
    producer: AIOKafkaProducer
    bootstrap: str
    tasks: list = field(default_factory=list)  # the service's loops (`Service.spawn`)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await http_get(self.port, path)

    async def send_score(self, **fields) -> None:
        await self.producer.send(self.topics["scores"], key=fields["classifier_id"].encode(), value=orjson.dumps(fields))

    async def send_label(self, request_id: str, label, key: bytes | None = b"any") -> None:
        await self.producer.send(self.topics["labels"], key=key,
                                 value=orjson.dumps({"request_id": request_id, "label": label}))


async def service_topics(kafka_bootstrap: str, unique_name, partitions: int) -> dict[str, str]:
    """The service's four topics ("scores", "requests", "labels", "dlq"), fresh names, created."""
    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    await create_topics(kafka_bootstrap, list(topics.values()), partitions=partitions)
    return topics


@contextlib.asynccontextmanager
async def running_service(kafka_bootstrap: str, redis_url: str, unique_name, service_bootstrap: str | None = None,
                          **settings: str):
    """Topics, settings (STRATAMETER_ names without the prefix), the service, its HTTP server.

    `service_bootstrap` lets the service reach Kafka through another address (a proxy)
    while the test's producer talks to the broker directly."""
    topics = await service_topics(kafka_bootstrap, unique_name, 3)
    env = service_env(service_bootstrap or kafka_bootstrap, redis_url, topics, unique_name, **settings)
    async with serving_env(env, kafka_bootstrap) as run:
        yield run


#: The trial configuration a user sources before `stratameter run` (docs/getting-started/your-own-producer.md).
TRIAL_ENV = Path(__file__).resolve().parents[1] / "examples" / "trial.env"


def trial_settings() -> dict[str, str]:
    """The settings of examples/trial.env (STRATAMETER_ names without the prefix, as `service_env` takes
    them): its ``STRATAMETER_NAME=value`` lines; the others are comments or blank."""
    out = {}
    for line in TRIAL_ENV.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            assert name.startswith("STRATAMETER_") and value and " " not in value, f"trial.env: {line!r}"
            out[name.removeprefix("STRATAMETER_")] = value
    return out


def service_env(kafka_bootstrap: str, redis_url: str, topics: dict[str, str], unique_name, **settings: str) -> dict:
    """The service's settings (STRATAMETER_ names without the prefix) on the test's broker, Redis and
    `topics`, with a consumer group and key prefix of their own, and `settings` on top."""
    return {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA_CONSUMER_GROUP": unique_name("group"),
            "KAFKA_SESSION_TIMEOUT_MS": "6000", "REDIS_URL": redis_url, "REDIS_KEY_PREFIX": unique_name("sm"),
            "TOPIC_SCORES": topics["scores"], "TOPIC_LABEL_REQUESTS": topics["requests"],
            "TOPIC_LABELS": topics["labels"], "TOPIC_DEAD_LETTER": topics["dlq"], **settings}


@contextlib.asynccontextmanager
async def serving_env(env: dict, kafka_bootstrap: str):
    """The service on the settings `env` (`service_env`, its topics named there) and its HTTP server
    on a free port, with the test's producer and reviewers on `kafka_bootstrap` (`serving`)."""
    from stratameter.app.runner import Service

    port = find_free_port()
    topics = {"scores": env["TOPIC_SCORES"], "requests": env["TOPIC_LABEL_REQUESTS"], "labels": env["TOPIC_LABELS"],
              "dlq": env["TOPIC_DEAD_LETTER"]}
    service = Service(load_settings({f"STRATAMETER_{k}": v for k, v in {**env, "HTTP_PORT": str(port)}.items()}))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    async with serving(service, port, topics, producer, kafka_bootstrap) as running:
        yield running


async def run_until(env: dict, kafka_bootstrap: str, unique_name, scores, answer, until, cid: str = "c",
                    timeout: float = 150.0) -> dict:
    """One run of the service on `env` (`service_env`): send `scores` ((item id, score, event time ms),
    ...) for classifier `cid`, answer its label requests with `answer` (`Reviewer`), and return its
    /v1/classifiers view once `until(view)` holds.  Run it again on the same `env` with a setting
    changed to test that setting changed under a state the service left."""
    async with serving_env(env, kafka_bootstrap) as running:
        for item, score, ms in scores:
            await running.send_score(classifier_id=cid, item_id=item, score=float(score), event_time=ms)
        await running.producer.flush()

        async def done():
            status, body = await running.get(f"/v1/classifiers/{cid}")
            doc = orjson.loads(body) if status == 200 else None
            return doc if doc and until(doc) else None

        async with Reviewer(running, unique_name("rev"), answer):
            return await wait_for(done, timeout, "the service")


@contextlib.asynccontextmanager
async def serving(service, port: int, topics: dict[str, str], producer: AIOKafkaProducer, bootstrap: str):
    """Start `service` and its HTTP server on `port`; on exit stop both and `producer` (already started)."""
    from stratameter.api.http import serve

    server = await serve(service, "127.0.0.1", port)
    tasks = []
    try:
        await service.start()
        tasks = service.spawn()
        yield Running(service, port, topics, producer, bootstrap, tasks)
    finally:
        service.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.close()
        await service.stop()
        await producer.stop()


@dataclass
class Reviewer:
    """Consumes label requests; `answer(request) -> label | None | ...` decides (Ellipsis = ignore)."""

    running: Running
    group: str
    answer: object
    requests: list[dict] = field(default_factory=list)

    async def __aenter__(self) -> "Reviewer":
        self.consumer = await start_group_consumer(self.running.topics["requests"],
                                                   bootstrap_servers=self.running.bootstrap, group_id=self.group)
        self.task = asyncio.create_task(answer_label_requests(
            self.consumer, self.running.producer, self.running.topics["labels"], self._decide, key=b"any"))
        return self

    def _decide(self, request):
        """`answer` on the request as a dict (decoded and checked by the codec)."""
        req = request.model_dump()
        self.requests.append(req)
        return self.answer(req)

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


async def wait_for(cond, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---- the service as real subprocesses ------------------------------------------------------

class ServiceProcess:
    """`stratameter run` in a subprocess, logging to a file."""

    def __init__(self, env: dict[str, str], port: int, log_path: str) -> None:
        self.env, self.port, self.log_path = env, port, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServiceProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "stratameter.cli", "run"], env=self.env, stdout=log, stderr=log)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the service's log at INFO or above (for a failing test's message)."""
        with open(self.log_path, "rb") as f:
            kept = [line for line in f.read().decode(errors="replace").splitlines() if '"level":"debug"' not in line]
        return "\n".join(kept[-lines:])


@dataclass
class Workload:
    """Topics, score records with ground truth for several classifiers, and a reviewer
    that answers every label request from the truth (some skipped) and remembers all."""

    bootstrap: str
    redis_url: str
    topics: dict[str, str]
    group: str
    prefix: str
    redis_cluster: bool = False
    truth: dict[str, int] = field(default_factory=dict)
    answered: dict[str, bool | None] = field(default_factory=dict)
    requested_items: dict[str, str] = field(default_factory=dict)

    def env(self, port: int, instance: str, **settings: str) -> dict[str, str]:
        base = {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, "KAFKA_CONSUMER_GROUP": self.group,
                "KAFKA_SESSION_TIMEOUT_MS": "6000", "REDIS_URL": self.redis_url, "REDIS_KEY_PREFIX": self.prefix,
                "REDIS_CLUSTER": "true" if self.redis_cluster else "false",
                "TOPIC_SCORES": self.topics["scores"], "TOPIC_LABEL_REQUESTS": self.topics["requests"],
                "TOPIC_LABELS": self.topics["labels"], "TOPIC_DEAD_LETTER": self.topics["dlq"],
                "HTTP_PORT": str(port), "HTTP_HOST": "127.0.0.1", "INSTANCE_ID": instance, "LOG_LEVEL": "WARNING",
                **settings}
        return {**os.environ, **{f"STRATAMETER_{k}": v for k, v in base.items()}}

    async def produce(self, producer: AIOKafkaProducer, classifiers, per_classifier: int, extra: list[bytes] = (),
                      seconds: float = 0.0):
        """`per_classifier` score records for each classifier, interleaved, then `extra` raw values;
        spread evenly over about `seconds` (a stream arriving while the service runs: a kill
        lands mid-ingest however fast the service is), or all at once with 0."""
        now_ms = int(time.time() * 1000)
        slices = max(1, per_classifier // 200)
        for i in range(per_classifier):
            for cid in classifiers:
                score = 0.5 + 0.5 * ((i * 7919) % 1000) / 1000
                item = f"{cid}#{i}"
                self.truth[item] = int(((i * 104729) % 1000) / 1000 < score)
                await producer.send(self.topics["scores"], key=cid.encode(), value=orjson.dumps(
                    {"classifier_id": cid, "item_id": item, "score": score, "event_time": now_ms}))
            if seconds and i % 200 == 199:
                await producer.flush()
                await asyncio.sleep(seconds / slices)
        for value in extra:
            await producer.send(self.topics["scores"], key=b"junk", value=value)
        await producer.flush()

    async def review(self, producer: AIOKafkaProducer, group: str) -> None:
        async with group_consumer(self.topics["requests"], bootstrap_servers=self.bootstrap, group_id=group) as consumer:
            await answer_label_requests(consumer, producer, self.topics["labels"], self._answer)

    def _answer(self, req) -> bool | None:
        """From the truth, every 13th skipped; a request seen again gets the same answer."""
        rid = req.request_id
        self.requested_items[rid] = f"{req.classifier_id}/{req.item_id}"
        label = self.answered.get(rid, None if len(self.answered) % 13 == 7 else bool(self.truth[req.item_id]))
        self.answered[rid] = label
        return label

    def assert_exact(self, docs: dict[str, dict], per_classifier: int) -> None:
        """Nothing lost, nothing counted twice, no item requested under two request ids."""
        for cid, doc in docs.items():
            assert doc["scores"] == per_classifier, (cid, doc["scores"])
            assert doc["population"] == per_classifier
            # the requests of its predicted negatives' state (`<cid>~negatives/...`) are the classifier's too
            mine = [label for rid, label in self.answered.items()
                    if rid.partition("/")[0] in (cid, cid + NEGATIVES_SUFFIX)]
            folded = doc["labels_by_outcome"]["accepted"]
            assert folded == sum(label is not None for label in mine), (cid, folded)
            assert doc["labels_by_outcome"]["skipped"] == sum(label is None for label in mine)
            assert doc["labels"] == folded == sum(s["labels"] for s in doc["strata"])
        assert len(set(self.requested_items.values())) == len(self.requested_items)


async def two_replicas_through_a_kill(work: Workload, producer: AIOKafkaProducer, settings: dict[str, str], logs: Path,
                                      unique_name, started, settled, what: str) -> dict:
    """Two `stratameter run` replicas of `work` with `settings` and its reviewer: once `started(port)`
    holds on the second, the first is SIGKILLed; returns what `settled(port)` returns on the second
    (waited for as `what`), once the second has stopped by SIGTERM (its outbox published)."""
    ports = [find_free_port() for _ in range(2)]
    procs = [ServiceProcess(work.env(p, f"inst-{i}", **settings), p, str(logs / f"i{i}.log"))
             for i, p in enumerate(ports)]
    reviewer = asyncio.create_task(work.review(producer, unique_name("rev")))
    try:
        for p in procs:
            p.start()
        await wait_for(lambda: started(ports[1]), 90, "requests out before the kill")
        procs[0].kill9()
        return await wait_for(lambda: settled(ports[1]), 150, what)
    finally:
        reviewer.cancel()
        await asyncio.gather(reviewer, return_exceptions=True)
        if procs[1].alive:
            assert procs[1].terminate() == 0  # its outbox published: every request recorded is on the topic
        if procs[0].alive:
            procs[0].kill9()


async def stored_requests(redis, keys, sid: str) -> dict[str, dict[str, str]]:
    """Every request record of state `sid` in Redis (`Keys.request`), by request id, read straight
    from Redis (SCAN: a test's check, not a service call)."""
    stem = keys.request(sid, "")
    out = {}
    async for key in redis.scan_iter(match=stem + "*", count=1000):
        out[key.decode()[len(stem):]] = {k.decode(): v.decode() for k, v in (await redis.hgetall(key)).items()}
    return out


async def new_workload(kafka_bootstrap: str, backend: RedisBackend, unique_name, partitions: int) -> Workload:
    """A `Workload` on fresh topics (`service_topics`), consumer group and key prefix."""
    topics = await service_topics(kafka_bootstrap, unique_name, partitions)
    return Workload(kafka_bootstrap, backend.url, topics, unique_name("group"), unique_name("sm"),
                    redis_cluster=backend.cluster)


async def converged(port: int, classifiers) -> dict | None:
    docs = {}
    for cid in classifiers:
        status, doc = await http_json(port, f"/v1/classifiers/{cid}")
        if status != 200 or doc["status"] != "converged":
            return None
        docs[cid] = doc
    return docs


async def summed(port: int, classifiers, read) -> int:
    """`read(document)` summed over the `classifiers` the API knows (an unknown one counts 0)."""
    total = 0
    for cid in classifiers:
        status, doc = await http_json(port, f"/v1/classifiers/{cid}")
        total += read(doc) if status == 200 else 0
    return total


async def scores_counted(port: int, classifiers) -> int:
    return await summed(port, classifiers, lambda doc: doc["scores"])


async def progress(port: int, classifiers) -> dict[str, dict]:
    """Per classifier what a stuck test wants to know: scores, label outcomes, pending, status."""
    out = {}
    for cid in classifiers:
        status, doc = await http_json(port, f"/v1/classifiers/{cid}")
        out[cid] = ({k: doc[k] for k in ("scores", "labels_by_outcome", "pending", "status")} if status == 200
                    else {"http_status": status})
    return out


async def labels_folded(port: int, classifiers) -> int:
    return await summed(port, classifiers, lambda doc: doc["labels_by_outcome"]["accepted"])


async def read_topic(bootstrap: str, topic: str, group: str, expect: int | None = None, timeout: float = 60.0,
                     **consumer_options) -> list[dict]:
    """The JSON values on `topic` from its start (a fresh `group`): until `expect` values have
    arrived, or with `expect` None until a poll after the first values finds no more; at
    most `timeout` seconds either way."""
    out: list[dict] = []
    async with group_consumer(topic, bootstrap_servers=bootstrap, group_id=group, **consumer_options) as consumer:
        deadline = time.time() + timeout
        while (expect is None or len(out) < expect) and time.time() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            records = [r for rs in batch.values() for r in rs]
            out += [orjson.loads(r.value) for r in records]
            if expect is None and out and not records:
                break
    return out
