"""`stratameter bridge label-studio`: label requests become Label Studio tasks, reviewers' annotations
come back as labels.  One `Bridge` per process: its start-up checks (`startup`), its loops (requests
in: `intake`, one task per request through `claims`; answers out: `answers`, webhook workers, and
`polling`, which also expires tasks), its readiness probes (here) and its gauges (`gauges`); the
shared clients and helpers are its `context.Context`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..app.consumer import stop_clients
from ..app.probes import PROBE_INTERVAL_S, READY_WINDOW_S, check_redis, probe_redis
from ..config import Settings
from ..errors import describe
from . import startup
from .answers import WEBHOOK_WORKERS, Answers
from .claims import Claims
from .context import Context
from .intake import Intake
from .polling import Poller

log = logging.getLogger(__name__)


class Bridge(Context):
    """One bridge process.  `start()` checks Label Studio, the project, the webhook, Redis and Kafka;
    `spawn()` runs the loops until `stopping` is set; `stop()` closes."""

    def __init__(self, settings: Settings) -> None:
        startup.require_token(settings)
        super().__init__(settings)
        self.ls_ok_at = 0.0
        claims = Claims(self.redis, settings.instance_id, self.stopping)
        self.intake = Intake(self, claims)
        self.answers = Answers(self, claims)
        self.poller = Poller(self, self.answers.forward)

    async def start(self) -> None:
        """Raises `StartupError` naming the setting when Label Studio is unreachable, refuses the
        token, lacks the project or its choices, or Kafka cannot be bootstrapped."""
        await startup.check_label_studio(self.ls, self.settings.label_studio_url)
        await startup.ensure_project(self)
        await startup.ensure_webhook(self)
        self.ls_ok_at = time.time()
        await check_redis(self.redis, self.settings)
        await startup.start_kafka(self)

    def ready(self) -> bool:
        return self.health.ready() and time.time() - self.ls_ok_at < READY_WINDOW_S

    def readiness(self) -> dict[str, bool]:
        now = time.time()
        return {"kafka": now - self.health.kafka_ok_at < READY_WINDOW_S,
                "redis": now - self.health.redis_ok_at < READY_WINDOW_S,
                "label_studio": now - self.ls_ok_at < READY_WINDOW_S}

    def spawn(self) -> list[asyncio.Task]:
        loops = [self.intake.forever(), self.poller.forever(),
                 self.health.probe_forever(self._probe_kafka, self._probe_redis, self.stopping),
                 self._probe_label_studio_forever()]
        loops += [self.answers.worker() for _ in range(WEBHOOK_WORKERS)]
        return [asyncio.create_task(c) for c in loops]

    async def stop(self) -> None:
        await stop_clients(self.consumer, self.producer)
        await self.ls.aclose()
        await self.redis.aclose()

    async def _probe_kafka(self) -> None:
        await self.producer.client.fetch_all_metadata()

    async def _probe_redis(self) -> None:
        """As the service's: a full Redis answers PING but refuses the claims and tasks' writes."""
        await probe_redis(self.redis, self.keys, self.settings.instance_id)

    async def _probe_label_studio_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.ls.whoami(), PROBE_INTERVAL_S)
                self.ls_ok_at = time.time()
            except Exception as exc:  # noqa: BLE001 - any failure means not ready
                self.metrics.ls_errors.labels("probe").inc()
                log.warning("label studio probe failed: %s", describe(exc))
            await self.sleep(PROBE_INTERVAL_S)


async def run(settings: Settings) -> int:
    """`stratameter bridge label-studio` until SIGTERM/SIGINT: the batch in hand is finished and
    committed, the consumer leaves its group, exit 0.  Exit 1 when it cannot start."""
    from ..app.lifecycle import run_until_stopped
    from .http import serve

    bridge = Bridge(settings)
    return await run_until_stopped(
        bridge, settings, serve, "STRATAMETER_BRIDGE_HTTP", settings.bridge_http_host, settings.bridge_http_port,
        lambda: ("stratameter bridge label-studio started",
                 {"project": bridge.project_id, "project_title": bridge.project_title}), log)
