"""Polling and expiry: webhooks are sent once, so every `poll_seconds` one replica (a PX lease) reads
the open tasks (`Keys.label_studio(project, "open")`) and forwards what the webhooks missed
(`answers.Answers.forward`), then deletes the tasks whose request expired unanswered."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from ..errors import describe
from . import mapping
from .client import TASKS_PER_QUERY
from .context import Context, Stopped

log = logging.getLogger(__name__)


class Poller:
    """`forever` polls every `label_studio_poll_seconds`; `forward` is `Answers.forward`."""

    def __init__(self, ctx: Context, forward: Callable[[dict, str], Awaitable[str | None]]) -> None:
        self.ctx, self.forward = ctx, forward

    async def forever(self) -> None:
        ctx = self.ctx
        while not ctx.stopping.is_set():
            await ctx.sleep(ctx.settings.label_studio_poll_seconds)
            if ctx.stopping.is_set():
                return
            try:
                await self.once()
            except Stopped:
                return
            except Exception as exc:  # noqa: BLE001 - the next interval tries again
                ctx.redis_failed(exc, "poll")
                log.warning("polling Label Studio failed: %s", describe(exc))

    async def once(self, lease: bool = True) -> bool:
        """One replica per interval (a PX lease): forward the answers of the open tasks the webhooks
        missed, then delete the tasks whose request expired unanswered.  False when another
        replica holds this interval's lease."""
        ctx = self.ctx
        poller = ctx.keys.label_studio(ctx.project_id, "poller")
        interval_ms = int(ctx.settings.label_studio_poll_seconds * 1000)
        if lease and not await ctx.redis.set(poller, ctx.settings.instance_id, nx=True,
                                             px=max(100, interval_ms * 9 // 10)):
            return False
        await self._forward_open()
        await self._expire()
        await ctx.redis.set(ctx.keys.label_studio(ctx.project_id, "polled"), str(int(time.time() * 1000)))
        return True

    async def _tasks(self, ids: list[int]) -> list[dict]:
        return await self.ctx.retrying("list_tasks", lambda: self.ctx.ls.tasks(self.ctx.project_id, ids))

    async def _forward_open(self) -> None:
        """Forward the answered open tasks; forget those deleted in Label Studio."""
        open_key = self.ctx.open_key()
        ids = [int(m) for m in await self.ctx.redis.zrange(open_key, 0, -1)]
        for chunk in _chunks(ids, TASKS_PER_QUERY):
            tasks = await self._tasks(chunk)
            for task in tasks:
                if mapping.first_annotation(task) is not None:
                    await self.forward(task, "poll")
            gone = set(chunk) - {t.get("id") for t in tasks}
            if gone:  # deleted in Label Studio by a person: nothing to wait for
                log.info("%d open tasks are gone from Label Studio", len(gone))
                await self.ctx.redis.zrem(open_key, *map(str, gone))

    async def _expire(self) -> None:
        """Delete the open tasks whose request's deadline passed unanswered."""
        ctx, open_key = self.ctx, self.ctx.open_key()
        now_ms = int(time.time() * 1000)
        due = [int(m) for m in await ctx.redis.zrangebyscore(open_key, "-inf", now_ms)]
        for chunk in _chunks(due, TASKS_PER_QUERY):
            for task in await self._tasks(chunk):
                if mapping.first_annotation(task) is not None:  # answered at the last moment: the service judges
                    await self.forward(task, "expiry")
                else:
                    await ctx.retrying("delete_task", lambda t=task: ctx.ls.delete_task(int(t["id"])))
                    ctx.metrics.removed.labels("expired").inc()
            await ctx.redis.zrem(open_key, *map(str, chunk))


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
