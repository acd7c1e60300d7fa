"""Start-up against a Kafka or a Redis that is not there yet: one rule for both.  Try, and while
the backend does not answer, retry with exponential backoff (`backoff_delays`), logging each
failure, for at most ``STRATAMETER_STARTUP_TIMEOUT_SECONDS``; `/readyz` answers 503 meanwhile (the
HTTP endpoints are up first, `app.lifecycle`).  Then give up with a `StartupError` naming the
setting: the process exits 1 and its orchestrator decides what comes next.

Credentials Redis rejects fail at once (`probes.check_redis`); aiokafka reports a broker that
rejects them as it reports one that is down (`KafkaConnectionError`), so Kafka's are retried too."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from ..errors import StartupError
from .lifecycle import pause

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The first wait after a failed try, and the longest (the waits double in between).
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 10.0
#: The setting that bounds the retries, as the error names it.
TIMEOUT_SETTING = "STRATAMETER_STARTUP_TIMEOUT_SECONDS"


class Unreachable(Exception):
    """A backend did not answer a start-up try; `reason` says what it was (no secrets)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def backoff_delays(first: float = FIRST_DELAY_S, cap: float = MAX_DELAY_S) -> Iterator[float]:
    """1, 2, 4, ... seconds, at most `cap` each (a backend that comes back is seen within `cap`), without end."""
    delay = first
    while True:
        yield delay
        delay = min(2 * delay, cap)


async def until_reachable(attempt: Callable[[], Awaitable[T]], what: str, timeout_s: float, stopping,
                          clock: Callable[[], float] = time.monotonic) -> T | None:
    """``await attempt()`` until it returns (its result), retrying while it raises `Unreachable`:
    after each failure a warning and a wait of the next `backoff_delays` (cut short by `stopping`:
    None), until `timeout_s` seconds have passed since the first try; then a `StartupError`
    naming `what` (``"Kafka"``, ``"Redis"``), the last reason and `TIMEOUT_SETTING`.
    Any other exception (a `StartupError` among them) is raised at once."""
    deadline, delays = clock() + timeout_s, backoff_delays()
    while True:
        try:
            return await attempt()
        except Unreachable as exc:
            left = deadline - clock()
            if left <= 0:
                raise StartupError(f"{exc.reason}; {what} did not answer within {TIMEOUT_SETTING} "
                                   f"({timeout_s:g} s)") from None
            wait = min(next(delays), left)
            log.warning("%s not reachable at start, retrying in %.0f s (%.0f s left of %s): %s",
                        what, wait, left, TIMEOUT_SETTING, exc.reason)
            if await pause(stopping, wait):
                return None
