"""Label requests in: the bridge's own consumer group reads the label-request topic; each request
gets one task in the project (`mapping.task_payload`; one per request across replicas and replays:
`claims`), then the batch's offsets are committed (a crash replays the batch).  A request that
arrives after its ``expires_at`` gets no task; its key lives until a day after that deadline."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.errors import KafkaError
from pydantic import ValidationError

from stratameter.schemas.outbound import decode_label_request
from stratameter.schemas.times import rfc3339_to_ms

from ..errors import describe
from . import mapping
from .claims import Claims, Outcome
from .client import LabelStudioError
from .context import Context, Stopped
from .mapping import TaskRequest

log = logging.getLogger(__name__)

#: a request key lives until a day after the request's deadline ...
GRACE_S = 86_400
#: ... counted from a deadline at most this far ahead (a request expiring later is tracked this long)
MAX_AHEAD_S = 30 * 86_400
#: label requests per consumer poll, and tasks created concurrently
BATCH_RECORDS = 200
CONCURRENCY = 8


class Intake:
    """Consumes label requests (`forever`) and makes their tasks (`task_for`)."""

    def __init__(self, ctx: Context, claims: Claims) -> None:
        self.ctx, self.claims = ctx, claims

    async def forever(self) -> None:
        """Poll label requests, make their tasks, commit; a batch cut short by a stop is not committed.
        Nothing a batch holds ends the loop: an unexpected error is logged and the batch replayed."""
        while not self.ctx.stopping.is_set():
            try:
                if not await self.once():
                    return
            except Exception as exc:  # noqa: BLE001 - not committed: the batch comes again
                self.ctx.redis_failed(exc, "requests")
                log.error("handling a batch of label requests failed; it is read again: %s", describe(exc),
                          exc_info=True)
                await self.ctx.sleep(1.0)
                await self._rewind()

    async def _rewind(self) -> None:
        """Back to the last committed offsets of every assigned partition."""
        consumer = self.ctx.consumer
        try:
            for tp in consumer.assignment():
                committed = await consumer.committed(tp)
                if committed is not None:
                    consumer.seek(tp, committed)
                else:
                    await consumer.seek_to_beginning(tp)
        except Exception as again:  # noqa: BLE001 - the next poll goes on from where it is
            log.warning("rewinding to the committed offsets failed: %s", describe(again))

    async def once(self) -> bool:
        """One poll: False when the bridge stopped in the middle of the batch (left uncommitted)."""
        try:
            batch = await self.ctx.consumer.getmany(timeout_ms=500, max_records=BATCH_RECORDS)
        except KafkaError as exc:
            log.warning("polling label requests failed: %s", describe(exc))
            await self.ctx.sleep(1.0)
            return True
        records = [r for rs in batch.values() for r in rs]
        if not records:
            return True
        try:
            await self._make_tasks(self._requests(records))
        except Stopped:
            return False
        try:
            await self.ctx.consumer.commit()
        except KafkaError as exc:  # a rebalance: the batch is replayed elsewhere, no second task
            log.warning("committing label-request offsets failed: %s", describe(exc))
        return True

    def _requests(self, records: list) -> list:
        """The batch's label requests, each once; the records that are none are counted invalid."""
        requests = {}
        for r in records:
            try:
                req = decode_label_request(r.value)
            except (ValidationError, ValueError, TypeError) as exc:
                self.ctx.metrics.requests.labels("invalid").inc()
                log.warning("not a label request: %s", _first_error(exc),
                            extra={"topic": r.topic, "partition": r.partition, "offset": r.offset})
                continue
            if req.request_id in requests:  # a request published twice: one task
                self.ctx.metrics.requests.labels("task_exists").inc()
            requests.setdefault(req.request_id, req)
        return list(requests.values())

    async def _make_tasks(self, requests: list) -> None:
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(req) -> None:
            async with sem:
                await self.ctx.retrying("create_task", lambda: self.task_for(req))

        results = await asyncio.gather(*(one(r) for r in requests), return_exceptions=True)
        for req, res in zip(requests, results):
            if isinstance(res, Stopped):
                raise res
            if isinstance(res, BaseException):  # Label Studio refused a call for good: no task, said loudly
                self.ctx.metrics.requests.labels("rejected").inc()
                log.error("no task for label request %s: %s", req.request_id, describe(res))

    async def task_for(self, req, now: float | None = None) -> str:
        """Make the task of label request `req` unless it has one: the outcome (`metrics.REQUEST_OUTCOMES`).
        Raises `LabelStudioError` (transient ones are retried by the caller) or a Redis error."""
        ctx = self.ctx
        now_ms = int((time.time() if now is None else now) * 1000)
        deadline = rfc3339_to_ms(req.expires_at)
        if deadline is None or deadline <= now_ms:
            ctx.metrics.requests.labels("expired").inc()
            return "expired"
        ahead_ms = min(deadline - now_ms, MAX_AHEAD_S * 1000)
        ttl = int(ahead_ms / 1000) + GRACE_S
        key = ctx.request_key(req)
        how, nonce = await self.claims.claim(key, ttl)
        if how is Outcome.EXISTS:
            ctx.metrics.requests.labels("task_exists").inc()
            return "task_exists"
        # a replica died between claiming and recording: the task may exist
        task_id = await self._existing_task(req) if how is Outcome.TAKEOVER else None
        outcome = "task_exists" if task_id is not None else "task_created"
        if task_id is None:
            task_id = await self._create_task(req, key, ttl, nonce)
            if task_id is None:
                return "rejected"
        await ctx.redis.zadd(ctx.open_key(), {str(task_id): now_ms + ahead_ms})
        await self.claims.record_task(key, task_id, ttl)
        ctx.metrics.requests.labels(outcome).inc()
        return outcome

    async def _existing_task(self, req) -> int | None:
        """The id of the task Label Studio holds for `req`, if any."""
        for t in await self.ctx.ls.tasks_of_request(self.ctx.project_id, req.request_id):
            found = TaskRequest.of(t)
            if found is not None and found.request_id == req.request_id:
                return int(t["id"])
        return None

    async def _create_task(self, req, key: str, ttl: int, nonce: str) -> int | None:
        """The new task's id; None when Label Studio refused it for good (the claim dropped)."""
        ctx = self.ctx
        data, meta = mapping.task_payload(req, ctx.settings.label_studio_show_score)
        try:
            return await ctx.ls.create_task(ctx.project_id, data, meta)
        except LabelStudioError as exc:
            if exc.transient:  # it may have been made all the same: the retry looks it up first
                await self.claims.release(key, nonce, ttl)
                raise
            await self.claims.drop(key)
            ctx.metrics.requests.labels("rejected").inc()
            log.error("Label Studio refused the task of request %s: %s", req.request_id, exc)
            return None


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors(include_url=False)[0]
        return f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}"
    return str(exc)[:300]
