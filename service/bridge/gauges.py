"""The gauges read from Redis at scrape time (`/metrics`): the project's open tasks, across replicas,
and the poll lag (since any replica last completed a poll; -1 before the first)."""

from __future__ import annotations

import logging
import time

from redis.exceptions import RedisError

from ..errors import describe
from .context import Context

log = logging.getLogger(__name__)


async def refresh(ctx: Context) -> None:
    """Set `metrics.open_tasks` and `metrics.poll_lag`; a failure is logged (and counted, Redis's)."""
    try:
        ctx.metrics.open_tasks.set(await ctx.redis.zcard(ctx.open_key()))
        polled = await ctx.redis.get(ctx.keys.label_studio(ctx.project_id, "polled"))
        ctx.metrics.poll_lag.set(time.time() - int(polled) / 1000 if polled else -1)
    except (RedisError, OSError, ValueError) as exc:
        ctx.redis_failed(exc, "gauges")
        log.warning("reading the bridge's gauges failed: %s", describe(exc))
