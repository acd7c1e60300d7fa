"""Failures confined to one classifier: the request loop's step and the scrape's read of its
figures (`STAGES`).  A failure of the classifier's own (a bug, or state it cannot read: a member
written by an older version, a numerical edge case) must not stop the other classifiers' label
requests nor empty /metrics for all of them, so the caller catches it, `record`s it and goes on;
an outage (`OUTAGES`) is the service's, not the classifier's, and the caller lets it through.

Counted per classifier and stage (``stratameter_classifier_failures_total``, this process's) and
logged with the classifier and its traceback at most once a minute per classifier and stage: a
lasting failure repeats on every pass of the loop (0.25 s) and every scrape."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from aiokafka.errors import KafkaError
from redis.exceptions import OutOfMemoryError, RedisError

from ..errors import describe

log = logging.getLogger(__name__)

#: Redis's own failures: the batch in hand is retried (`checkpoint.Checkpoint`), as for `redis_outage`.
REDIS_OUTAGES = (RedisError, OSError, asyncio.TimeoutError)
#: Errors of Redis or Kafka themselves: every classifier would fail alike, so they end the pass
#: or the scrape as before and are reported as outages, not counted against a classifier.
OUTAGES = REDIS_OUTAGES + (KafkaError,)
#: Where redis-py's asyncio transport leaks a connection torn down under a write as an
#: AttributeError or TypeError (`redis_outage`).
_TRANSPORT_FILES = ("redis/asyncio/connection.py", "asyncio/streams.py", "asyncio/selector_events.py")
#: Where a classifier's failure is confined: its request-loop step, its figures on /metrics.
STAGES = ("request_loop", "metrics")
#: A lasting failure is logged with its traceback at most this often per classifier and stage.
LOG_EVERY_SECONDS = 60.0


def redis_outage(exc: BaseException) -> bool:
    """Whether `exc` is Redis failing, not the service: one of `REDIS_OUTAGES`, or redis-py's
    asyncio connection written to after it was torn down (a cluster master killed mid-pipeline:
    ``'NoneType' object has no attribute 'writelines'``; redis/redis-py#4287), which redis-py up
    to 8.1 raises as an AttributeError or TypeError from its transport instead of a
    ConnectionError (8.2 raises a ConnectionError).  Such an error from anywhere else is a bug
    and is not retried."""
    if isinstance(exc, REDIS_OUTAGES):
        return True
    if not isinstance(exc, (AttributeError, TypeError)) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(_TRANSPORT_FILES)


def describe_outage(exc: BaseException) -> str:
    """An outage for the log.  A Redis at its ``maxmemory`` (no eviction) refuses every write
    while it still answers (each script at its first write, so nothing is half-applied): the
    batch is retried as in any outage, and the message names the cause and the remedy."""
    if isinstance(exc, OutOfMemoryError):
        return ("Redis is out of memory (maxmemory reached): it refuses writes until it has room; give it "
                "more memory, or keep less per classifier (RESERVOIR_SIZE, CHUNK_RETENTION; "
                f"docs/how-to/operating.md): {describe(exc)}")
    return describe(exc)


class ClassifierFailures:
    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._logged: dict[tuple[str, str], float] = {}

    def record(self, cid: str, stage: str) -> None:
        """Count the exception being handled against `cid` at `stage` (one of `STAGES`) and log
        it unless it was logged less than `LOG_EVERY_SECONDS` ago.  Call it in an ``except``."""
        key = (cid, stage)
        failures = self.counts[key] = self.counts.get(key, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(key, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._logged[key] = now
            log.exception("classifier failure confined to it", extra={"classifier": cid, "stage": stage,
                                                                       "failures": failures})

    async def confined(self, cid: str, stage: str, work: Awaitable):
        """`work` awaited, a failure of classifier `cid`'s own recorded (`record`) and None returned
        instead, so the caller goes on with the other classifiers; an outage (`OUTAGES`) goes
        through: every classifier would fail alike."""
        try:
            return await work
        except OUTAGES:
            raise
        except Exception:  # noqa: BLE001 - confined to this classifier, counted and logged
            self.record(cid, stage)
            return None

    def of(self, cids) -> dict[tuple[str, str], int]:
        """The counts of every classifier in `cids` at every stage, 0 where none failed (a counter
        exported from 0 lets `increase` see the first failure)."""
        return {(cid, stage): self.counts.get((cid, stage), 0) for cid in cids for stage in STAGES}
