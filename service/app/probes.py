"""Readiness: Kafka and Redis each answered within the last few seconds.

aiokafka never raises while a broker is unreachable (it waits and retries), so
readiness cannot be inferred from polling: both backends are probed.  The batch
retries and the request loop also report Redis failures and successes here.
The service and the Label Studio bridge probe Redis with PING and a write
(`probe_redis`): a Redis at its maxmemory answers PING but refuses every write,
and neither can work then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.exceptions import AuthenticationError

from ..config import Settings, mask_url
from ..errors import StartupError, describe
from ..metrics.redis_errors import redis_error_cause
from ..state.keys import Keys
from ..state.registry import Registry
from .failures import describe_outage
from .lifecycle import pause
from .patience import Unreachable, until_reachable

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 2.0
READY_WINDOW_S = 3 * PROBE_INTERVAL_S


class Health:
    """When Kafka and Redis last answered (`time.time()`; 0: not since the last failure), and
    Redis's failures so far by operation and cause (`redis_error_cause`)."""

    def __init__(self) -> None:
        self.kafka_ok_at = 0.0
        self.redis_ok_at = 0.0
        self.redis_errors: dict[tuple[str, str], int] = {}

    def ready(self) -> bool:
        """Kafka and Redis both answered a probe within the last `READY_WINDOW_S`."""
        now = time.time()
        return now - self.kafka_ok_at < READY_WINDOW_S and now - self.redis_ok_at < READY_WINDOW_S

    def redis_ok(self) -> None:
        self.redis_ok_at = time.time()

    def redis_failed(self, exc: BaseException, operation: str) -> None:
        """Redis failed the work in hand: not ready until it answers again, and counted."""
        self.redis_ok_at = 0.0
        self.count_redis_error(exc, operation)

    def count_redis_error(self, exc: BaseException, operation: str) -> None:
        """Count Redis's failure `exc` of `operation` (the label of ``stratameter_redis_errors_total``:
        `metrics.exposition.REDIS_OPERATIONS`; of the bridge's ``stratameter_bridge_redis_errors_total``:
        `bridge.metrics.REDIS_OPERATIONS`)."""
        key = (operation, redis_error_cause(exc))
        self.redis_errors[key] = self.redis_errors.get(key, 0) + 1

    async def probe_forever(self, kafka: Callable[[], Awaitable], redis: Callable[[], Awaitable],
                            stopping: asyncio.Event) -> None:
        """Probe Kafka (`kafka()`, a metadata request) and Redis (`redis()`: `probe_redis`) every
        `PROBE_INTERVAL_S` until `stopping` is set."""
        while not stopping.is_set():
            for probe, mark in ((kafka, "kafka_ok_at"), (redis, "redis_ok_at")):
                try:
                    await asyncio.wait_for(probe(), PROBE_INTERVAL_S)
                    setattr(self, mark, time.time())
                except Exception as exc:  # noqa: BLE001 - any failure means not ready
                    log.warning("%s probe failed: %s", mark.split("_")[0], describe_outage(exc))
                    if probe is redis:  # readiness lapses by itself after READY_WINDOW_S
                        self.count_redis_error(exc, "probe")
            await pause(stopping, PROBE_INTERVAL_S)


async def probe_redis(redis: Redis, keys: Keys, instance: str) -> None:
    """PING (every node of a cluster, so a killed master keeps readiness at 503 instead of
    flapping as the write below lands on a live one) and a write Redis must accept: refused while
    it is at its maxmemory (it still answers PING) or a read-only replica (``Keys.probe``, expiring
    after `READY_WINDOW_S`)."""
    await redis.ping()
    await redis.set(keys.probe(instance), b"1", px=int(1000 * READY_WINDOW_S))


async def check_redis(redis: Redis, settings: Settings) -> bool:
    """At start: raise `StartupError` (a message without secrets) when Redis rejects the
    credentials; Redis being merely down is reported by readiness instead.  Returns whether
    Redis answered."""
    try:
        await asyncio.wait_for(redis.ping(), PROBE_INTERVAL_S)
        return True
    except AuthenticationError as exc:
        user = settings.redis_username or urlsplit(settings.redis_url).username or "default"
        raise StartupError(f"Redis at {mask_url(settings.redis_url)} rejected the credentials of user "
                           f"{user!r}: {describe(exc)} (check STRATAMETER_REDIS_USERNAME / "
                           "STRATAMETER_REDIS_PASSWORD)") from None
    except Exception as exc:  # noqa: BLE001 - down or unreachable: readiness reports it, we keep trying
        log.warning("redis not reachable at start: %s", describe(exc))
        return False


async def check_chunk_seconds(registry: Registry, settings: Settings) -> None:
    """Raise `StartupError` when the state under the key prefix was written with another
    ``CHUNK_SECONDS``: a chunk id counts chunks of that length since the epoch, so under another
    one the old ids would read as chunks of other times (a longer chunk put them centuries ahead,
    where they counted as the newest: the retention purged the chunk being sampled and then never
    purged again).  The first start notes the length."""
    stored = await registry.stored_chunk_seconds(settings.chunk_seconds)
    if stored != settings.chunk_seconds:
        raise StartupError(
            f"STRATAMETER_CHUNK_SECONDS is {settings.chunk_seconds}, but the state under "
            f"STRATAMETER_REDIS_KEY_PREFIX {settings.redis_key_prefix!r} was written with {stored}-second chunks: "
            f"keep {stored}, or give the new length a key prefix of its own (its state starts empty)")


async def once_redis_answers(call: Callable[[], Awaitable], settings: Settings, stopping: asyncio.Event):
    """``await call()`` once Redis answers (its result, or None if `stopping` is set first), retrying
    by `patience.until_reachable`: with backoff, for at most ``STRATAMETER_STARTUP_TIMEOUT_SECONDS``,
    then a `StartupError`.  A `StartupError` `call` raises is raised at once."""

    async def attempt():
        try:
            return await call()
        except StartupError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis still down: readiness says so meanwhile
            raise Unreachable(f"Redis at {mask_url(settings.redis_url)}: {describe(exc)}") from None

    return await until_reachable(attempt, "Redis", settings.startup_timeout_seconds, stopping)
