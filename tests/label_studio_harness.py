"""A real Label Studio for the bridge's tests, and the bridge run in-process against it.

* ``label_studio`` (session fixture): `stratameter.demo.label_studio.EmbeddedLabelStudio` from
  ``.venv-label-studio`` (or ``$STRATAMETER_LABEL_STUDIO_BIN``), started once per test session
  (SQLite in a temp dir copied from a migrated template: about 5 s; the first time ever about 35 s
  more for ``label-studio init``).  Missing, it fails the test with the command that installs it:
  CI's ``.ci/run`` and ``make test`` create it, so a skip would only hide a broken install.
  Registered in ``tests/conftest.py``, so every module that asks for it shares the one process.
* `running_bridge`: topics, settings and a `Bridge` with its HTTP server on a free port, the
  webhook pointing at it (or wherever `webhook_url` says, ``None`` for none).
* `api` helpers: annotate a task as a reviewer would, read a project's tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer

from stratameter.api.client import http_get
from stratameter.bridge.bridge import Bridge
from stratameter.bridge.client import LabelStudio
from stratameter.bridge.http import serve
from stratameter.demo.label_studio import EmbeddedLabelStudio, LabelStudioMissing
from stratameter.config import load_settings
from stratameter.embedded import create_topics, find_free_port
from stratameter.schemas.outbound import label_request_bytes

@pytest.fixture(scope="session")
def label_studio() -> Iterator[EmbeddedLabelStudio]:
    """The session's Label Studio (one process per test session; `tests/conftest.py` registers this
    fixture, so every module that asks for it shares it)."""
    try:
        ls = EmbeddedLabelStudio()
    except LabelStudioMissing as exc:
        pytest.fail(f"{exc}. CI's .ci/run and `make test` create it (`make label-studio`).", pytrace=False)
    started = time.monotonic()
    ls.start()
    ls.fixture_seconds = time.monotonic() - started  # template (first time) + start, for the record
    try:
        yield ls
    finally:
        ls.close()


@dataclass
class RunningBridge:
    bridge: Bridge
    port: int
    topics: dict[str, str]
    bootstrap: str
    producer: AIOKafkaProducer
    ls: LabelStudio  # a client of the same Label Studio, for the test's own calls
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def project(self) -> int:
        return self.bridge.project_id

    async def send_request(self, request_id: str, classifier_id: str = "clf", item_id: str | None = None,
                           score: float = 0.8, expires_in: float = 600.0, context: dict | None = None,
                           times: int = 1) -> None:
        now = time.time()
        value = label_request_bytes(request_id, classifier_id, item_id or f"item-{request_id}", score, 0, now,
                                    now + expires_in, context)
        for _ in range(times):
            await self.producer.send_and_wait(self.topics["requests"], value, key=classifier_id.encode())

    async def metrics(self) -> dict[str, float]:
        """``{series: value}`` of the bridge's /metrics (``name{labels}`` as exposed)."""
        status, body = await http_get(self.port, "/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    async def project_tasks(self) -> list[dict]:
        return await project_tasks(self.ls, self.project)


async def project_tasks(ls: LabelStudio, project: int) -> list[dict]:
    """Every task of `project` with its annotations."""
    doc = await ls.call("GET", f"/api/tasks?project={project}&fields=all&page_size=1000")
    return doc["tasks"]


async def annotate(ls: LabelStudio, task_id: int, choice: str | None, cancelled: bool = False) -> dict:
    """Annotate a task through Label Studio's API as a reviewer would (a choice, or a skip)."""
    result = [] if choice is None else [{"from_name": "label", "to_name": "item", "type": "choices",
                                         "value": {"choices": [choice]}}]
    return await ls.call("POST", f"/api/tasks/{task_id}/annotations", json={"result": result,
                                                                            "was_cancelled": cancelled})


@contextlib.asynccontextmanager
async def running_bridge(kafka_bootstrap: str, redis_url: str, label_studio: EmbeddedLabelStudio, unique_name,
                         topics: dict[str, str] | None = None, webhook_url: str | None = "self", start: bool = True,
                         **settings: str):
    """A bridge in-process (its HTTP server on a free port) on fresh topics (or `topics`), a fresh
    project, Redis key prefix and consumer group; `settings` are STRATAMETER_ names without the prefix
    and win.  `webhook_url`: "self" (the bridge's own /webhook), a URL, or None (polling only)."""
    if topics is None:
        topics = {"requests": unique_name("requests"), "labels": unique_name("labels")}
        await create_topics(kafka_bootstrap, list(topics.values()), partitions=2)
    port = find_free_port()
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA_SESSION_TIMEOUT_MS": "6000",
           "REDIS_URL": redis_url, "REDIS_KEY_PREFIX": unique_name("br"),
           "TOPIC_LABEL_REQUESTS": topics["requests"], "TOPIC_LABELS": topics["labels"],
           "BRIDGE_CONSUMER_GROUP": unique_name("bridge"), "BRIDGE_HTTP_HOST": "127.0.0.1",
           "BRIDGE_HTTP_PORT": str(port), "LABEL_STUDIO_URL": label_studio.url,
           "LABEL_STUDIO_TOKEN": label_studio.token, "LABEL_STUDIO_PROJECT": f"test-{uuid.uuid4().hex[:12]}",
           "LABEL_STUDIO_POLL_SECONDS": "60", "INSTANCE_ID": unique_name("bridge")}
    if webhook_url == "self":
        env["LABEL_STUDIO_WEBHOOK_URL"] = f"http://127.0.0.1:{port}/webhook"
    elif webhook_url is not None:
        env["LABEL_STUDIO_WEBHOOK_URL"] = webhook_url
    env.update(settings)
    bridge = Bridge(load_settings({f"STRATAMETER_{k}": v for k, v in env.items()}))
    server = await serve(bridge, "127.0.0.1", port)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    client = LabelStudio(label_studio.url, label_studio.token)
    run = RunningBridge(bridge, port, topics, kafka_bootstrap, producer, client)
    try:
        if start:
            await bridge.start()
            run.tasks = bridge.spawn()
        yield run
    finally:
        bridge.stopping.set()
        await asyncio.gather(*run.tasks, return_exceptions=True)
        server.close()
        await bridge.stop()
        await producer.stop()
        await client.aclose()
