"""The label-request loop of `stratameter run`: the classifiers this instance leases,
stepped one after the other (`requests.loop.RequestLoop`), woken by labels and applied
batches, else every 0.25 s; leases renewed every third of their TTL."""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from ..config import Settings
from ..requests.loop import RequestLoop
from ..state.store import Store
from .consumer import KafkaClients
from .ownership import LEASE_MS, Leases
from .probes import Health

log = logging.getLogger("stratameter")


class RequestTask:
    def __init__(self, store: Store, settings: Settings, kafka: KafkaClients, leases: Leases, health: Health,
                 stopping: asyncio.Event, wake: asyncio.Event) -> None:
        self.settings, self.kafka, self.leases, self.health = settings, kafka, leases, health
        self.stopping, self.wake = stopping, wake
        self.loop = RequestLoop(store, settings, self.publish)
        self._republished: set[str] = set()  # owned classifiers whose outbox was republished

    async def publish(self, records: list[tuple[str, bytes]]) -> None:
        """Send (key, value) records to the label-requests topic and wait for the acks."""
        futures = [await self.kafka.producer.send(self.settings.topic_label_requests, value=v, key=k.encode())
                   for k, v in records]
        if futures:
            await asyncio.gather(*futures)

    async def requests_forever(self) -> None:
        next_lease = 0.0
        while not self.stopping.is_set():
            try:
                now = time.monotonic()
                if now >= next_lease:
                    before = self.leases.owned
                    await self.leases.renew()
                    self._republished -= before - self.leases.owned
                    next_lease = now + LEASE_MS / 3000
                for cid in sorted(self.leases.owned):
                    if cid not in self._republished:  # newly owned: requests a crash left unpublished
                        await self.loop.republish_outbox(cid)
                        self._republished.add(cid)
                    await self.loop.step(cid)
                self.health.redis_ok()
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                self.health.redis_failed()
                log.warning("request loop: redis unavailable", extra={"error": repr(exc)})
            except Exception:  # noqa: BLE001 - never let the loop die; report and go on
                log.exception("request loop step failed")
            try:
                await asyncio.wait_for(self.wake.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
