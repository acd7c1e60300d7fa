"""The label-request loop of `stratameter run`: the classifiers this instance leases,
stepped one after the other (`requests.loop.RequestLoop`), woken by labels and applied
batches, else every 0.25 s, resting as long as each pass took; leases renewed every third
of their TTL by a task of their own."""

from __future__ import annotations

import asyncio
import logging
import time


from ..config import Settings
from ..requests.loop import RequestLoop
from ..state.process import ProcessState
from ..state.store import Store
from .consumer import KafkaClients
from .failures import REDIS_OUTAGES, ClassifierFailures, describe_outage
from .lifecycle import pause
from .ownership import LEASE_MS, Leases
from .probes import Health

log = logging.getLogger(__name__)


class RequestTask:
    def __init__(self, store: Store, process: ProcessState, settings: Settings, kafka: KafkaClients, leases: Leases,
                 health: Health, stopping: asyncio.Event, wake: asyncio.Event, failures: ClassifierFailures) -> None:
        self.settings, self.kafka, self.leases, self.health = settings, kafka, leases, health
        self.failures = failures
        self.stopping, self.wake = stopping, wake
        self.loop = RequestLoop(store, process, settings, self.publish)
        self._republished: set[str] = set()  # owned classifiers whose outbox is known published (`_step`)

    async def publish(self, records: list[tuple[str, bytes]]) -> None:
        """Send (key, value) records to the label-requests topic and wait for the acks."""
        futures = [await self.kafka.producer.send(self.settings.topic_label_requests, value=v, key=k.encode())
                   for k, v in records]
        if futures:
            await asyncio.gather(*futures)

    async def requests_forever(self) -> None:
        """Step every owned classifier, then rest at least as long as the pass took (a replica
        owning thousands of classifiers keeps half the process for the consume pipeline and the
        HTTP API), and until woken (labels folded, a batch applied) or 0.25 s have passed.  The
        leases are renewed by a task of their own, so a long pass never lets them expire."""
        renewing = asyncio.create_task(self._renew_forever())
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                await self._pass()
                await asyncio.sleep(time.monotonic() - started)
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.25)
                except asyncio.TimeoutError:
                    pass
                self.wake.clear()
        finally:  # renewal ends by itself once stopping (not cancelled mid-way: every lease it
            await asyncio.gather(renewing, return_exceptions=True)  # took is in `owned`, released on stop)

    async def _pass(self) -> None:
        """Step every owned classifier; Redis is reported answering only if a step asked it
        (a pass with nothing owned proves nothing: the renewal reports then)."""
        try:
            stepped = 0
            for cid in sorted(self.leases.owned):
                if cid not in self.leases.owned:  # handed over during the pass
                    continue
                await self._step_alone(cid)
                stepped += 1
            if stepped:
                self.health.redis_ok()
        except REDIS_OUTAGES as exc:
            self.health.redis_failed(exc, "request_loop")
            log.warning("request loop: redis failed", extra={"error": describe_outage(exc)})
        except Exception:  # noqa: BLE001 - never let the loop die; report and go on
            log.exception("request loop step failed")

    async def _step_alone(self, cid: str) -> None:
        """`_step`, a failure of the classifier's own confined to it (`failures`): the pass goes on,
        so one classifier's failing step never stops the others' label requests.  An outage of
        Redis or Kafka ends the pass (`_pass` reports it): every classifier would fail alike."""
        await self.failures.confined(cid, "request_loop", self._step(cid))

    async def _step(self, cid: str) -> None:
        """Publish what the classifier's outbox holds if this instance has not checked it since
        it took the lease or since a step of it was cut short, then step it.  A step cut short
        (Redis gone mid-ISSUE with the write applied, Kafka refusing the requests) can leave
        requests recorded and unpublished: pending, never answered, they would hold back every
        later round of their chunk until their label timeout."""
        try:
            if cid not in self._republished:
                await self.loop.republish_outbox(cid)
                self._republished.add(cid)
            await self.loop.step(cid)
        except BaseException:
            self._republished.discard(cid)
            raise

    async def _renew_forever(self) -> None:
        """Renew the leases every third of their TTL until stopping."""
        while not self.stopping.is_set():
            try:
                await self.leases.renew()
                self._republished &= self.leases.owned  # a lease lost and taken again: republish then
                self.loop.forget_unowned(self.leases.owned)
                self.health.redis_ok()
            except REDIS_OUTAGES as exc:
                self.health.redis_failed(exc, "leases")
                log.warning("lease renewal: redis failed", extra={"error": describe_outage(exc)})
            except Exception:  # noqa: BLE001 - never let renewal die; report and go on
                log.exception("lease renewal failed")
            await pause(self.stopping, LEASE_MS / 3000)
