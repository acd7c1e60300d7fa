"""Answers out: Label Studio's webhook (ANNOTATION_CREATED, `http`) names a task; a worker reads the
task back from Label Studio (a forged body cannot make a label) and forwards its first annotation
(`mapping.answer_label`, the annotator's e-mail, the annotation's time) to the labels topic, then
marks the request answered (`claims`).  An edited annotation (ANNOTATION_UPDATED) is counted, never
forwarded: the service keeps the first answer.  Polling (`polling`) forwards what webhooks missed
through the same `Answers.forward`.

At least once: an answer is marked forwarded only after the labels topic acknowledged it, so a crash
in between forwards it again (the service counts the second copy as a duplicate)."""

from __future__ import annotations

import asyncio
import logging
import time

from stratameter.schemas.outbound import label_record_bytes
from stratameter.schemas.times import format_time, rfc3339_to_ms

from ..errors import describe
from . import mapping
from .claims import Claims
from .client import LabelStudioError
from .context import Context
from .mapping import TaskRequest

log = logging.getLogger(__name__)

WEBHOOK_QUEUE = 10_000
WEBHOOK_WORKERS = 4


class Answers:
    """The webhook's queue, its workers (`worker`, `WEBHOOK_WORKERS` of them) and `forward`."""

    def __init__(self, ctx: Context, claims: Claims) -> None:
        self.ctx, self.claims = ctx, claims
        self.queue: asyncio.Queue[int] = asyncio.Queue(maxsize=WEBHOOK_QUEUE)
        self._inflight: set[int] = set()

    def webhook(self, body: bytes) -> tuple[int, dict]:
        """A webhook body: (HTTP status, JSON answer).  Annotations created are queued for a worker;
        an edited one is counted; a body that is not a Label Studio webhook is refused with 400."""
        metrics = self.ctx.metrics
        try:
            action, task_ids = mapping.webhook_events(body)
        except mapping.BadWebhook as exc:
            metrics.webhook_errors.labels(exc.reason).inc()
            log.warning("webhook refused (%s): %s", exc.reason, str(exc)[:300])
            return 400, {"error": str(exc), "reason": exc.reason}
        if action == "ANNOTATION_UPDATED":  # the service keeps the first answer: an edit cannot change it
            metrics.answers.labels("updated", "webhook").inc(len(task_ids))
            return 200, {"ok": True, "action": action, "forwarded": False}
        for task_id in task_ids:
            try:
                self.queue.put_nowait(task_id)
            except asyncio.QueueFull:
                metrics.webhook_dropped.inc()  # polling forwards it
        return 200, {"ok": True, "action": action, "tasks": len(task_ids)}

    async def worker(self) -> None:
        ctx = self.ctx
        while not ctx.stopping.is_set():
            try:
                task_id = await asyncio.wait_for(self.queue.get(), 0.5)
            except asyncio.TimeoutError:
                continue
            try:
                task = await ctx.ls.task(task_id)
                if task is not None:
                    await self.forward(task, "webhook")
            except LabelStudioError as exc:
                ctx.metrics.ls_errors.labels("read_task").inc()
                log.warning("reading task %d after its webhook failed (polling will forward it): %s", task_id, exc)
            except Exception as exc:  # noqa: BLE001 - Kafka or Redis down: polling forwards it later
                ctx.redis_failed(exc, "webhook")
                log.warning("forwarding task %d failed (polling will retry): %s", task_id, describe(exc))

    async def forward(self, task: dict, via: str) -> str | None:
        """Forward the first annotation of `task` (read from Label Studio) as a label, unless it was
        forwarded already: the outcome (`metrics.ANSWER_OUTCOMES`), None when it has no annotation."""
        req = TaskRequest.of(task)
        if req is None or task.get("project") != self.ctx.project_id:
            self.ctx.metrics.answers.labels("not_ours", via).inc()
            return "not_ours"
        annotation = mapping.first_annotation(task)
        if annotation is None:
            return None
        task_id = int(task["id"])
        if task_id in self._inflight:  # the webhook and a poll at the same moment
            return None
        self._inflight.add(task_id)
        try:
            return await self._forward(task_id, req, annotation, via)
        finally:
            self._inflight.discard(task_id)

    async def _forward(self, task_id: int, req: TaskRequest, annotation: dict, via: str) -> str:
        ctx = self.ctx
        key = ctx.request_key(req)
        if await self.claims.answered(key):
            await ctx.redis.zrem(ctx.open_key(), str(task_id))
            ctx.metrics.answers.labels("already_forwarded", via).inc()
            return "already_forwarded"
        try:
            label = mapping.answer_label(annotation, ctx.choices)
        except mapping.UnknownChoice as exc:
            log.warning("task %d: %s; not forwarded", task_id, exc, extra={"request_id": req.request_id})
            await self._answered(key, task_id, annotation)
            ctx.metrics.answers.labels("unknown_choice", via).inc()
            return "unknown_choice"
        labeler = (await ctx.ls.user_email(annotation.get("completed_by")))[:256]
        created = annotation.get("created_at")
        created_ms = rfc3339_to_ms(created) if isinstance(created, str) else None
        now_ms = int(time.time() * 1000)
        value = label_record_bytes(req.request_id, label, labeler, format_time(created_ms or now_ms))
        await ctx.producer.send_and_wait(ctx.settings.topic_labels, value, key=req.classifier_id.encode())
        await self._answered(key, task_id, annotation)
        outcome = "label_null" if label is None else f"label_{str(label).lower()}"
        ctx.metrics.answers.labels(outcome, via).inc()
        if created_ms:
            ctx.metrics.delay.labels(via).observe(max(0.0, (now_ms - created_ms) / 1000))
        log.debug("forwarded", extra={"request_id": req.request_id, "label": label, "via": via, "task": task_id})
        return outcome

    async def _answered(self, key: str, task_id: int, annotation: dict) -> None:
        """The request marked answered, and its task no longer open."""
        await self.claims.record_answer(key, task_id, annotation["id"])
        await self.ctx.redis.zrem(self.ctx.open_key(), str(task_id))
