"""What every part of the bridge shares: the settings, the clients (Label Studio, Redis, Kafka once
started), the project, the metrics and readiness counts, the stop event; and the three things each
loop does alike: sleep until the next try unless stopping, count a Redis failure, retry a call that
failed transiently (`Context.retrying`, raising `Stopped` once the bridge stops)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from ..app.lifecycle import pause
from ..app.probes import Health
from ..config import Settings
from ..errors import describe
from ..state.keys import Keys
from .client import LabelStudio, LabelStudioError
from .mapping import Choices, TaskRequest
from .metrics import BridgeMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")


class Stopped(Exception):
    """The bridge is stopping: the work in hand is left for a replay."""


class Context:
    """The bridge's shared state (the token must be set: `startup.require_token`).  `project_id`
    and the Kafka clients are set by the start (`bridge.Bridge.start`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = s = settings
        self.choices = Choices.parse(s.label_studio_choices)
        self.ls = LabelStudio(s.label_studio_url, s.label_studio_token.get_secret_value())
        self.redis = s.redis_client()
        self.keys = Keys(s.redis_key_prefix)
        self.health = Health()
        self.metrics = BridgeMetrics(self.health.redis_errors)
        self.stopping = asyncio.Event()
        self.project_id = 0
        self.project_title = ""
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None

    def request_key(self, req: TaskRequest) -> str:
        """The key of a label request's claim (`claims`) in this project."""
        return self.keys.label_studio_request(req.classifier_id, self.project_id, req.request_id)

    def open_key(self) -> str:
        """The sorted set of this project's tasks awaiting an answer."""
        return self.keys.label_studio(self.project_id, "open")

    async def sleep(self, seconds: float) -> None:
        await pause(self.stopping, seconds)

    def redis_failed(self, exc: BaseException, operation: str) -> None:
        """Where `exc` is Redis failing `operation` (`metrics.REDIS_OPERATIONS`): counted, and not
        ready until Redis answers the probe again (as the service's `Health.redis_failed`)."""
        if isinstance(exc, RedisError):
            self.health.redis_failed(exc, operation)

    async def retrying(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` until it succeeds, with backoff (0.5 s to 10 s) while Label Studio, Redis or Kafka
        fail transiently; raises `Stopped` when the bridge stops meanwhile."""
        delay = 0.5
        while True:
            if self.stopping.is_set():
                raise Stopped
            try:
                return await call()
            except LabelStudioError as exc:
                if not exc.transient:
                    raise
                self.metrics.ls_errors.labels(op).inc()
                log.warning("%s failed, retrying in %.1f s: %s", op, delay, exc)
            except (RedisError, KafkaError, OSError) as exc:
                self.redis_failed(exc, "requests" if op == "create_task" else "poll")
                log.warning("%s failed, retrying in %.1f s: %s", op, delay, describe(exc))
            await self.sleep(delay)
            delay = min(10.0, delay * 2)
