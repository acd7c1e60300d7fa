"""`app.patience.until_reachable`: the one start-up rule for a Kafka or Redis that does not answer
(retried with backoff for at most STRATAMETER_STARTUP_TIMEOUT_SECONDS, then a `StartupError`
naming it).  A fake clock: `pause` is patched to advance it instead of sleeping."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from stratameter.app import patience
from stratameter.app.patience import Unreachable, backoff_delays, until_reachable
from stratameter.errors import StartupError


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def pause(self, stopping, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return stopping.is_set()


@pytest.fixture
def fake_time(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(patience, "pause", fake.pause)
    return fake


def failing(times: int, result="up"):
    """An attempt that is unreachable `times` times, then returns `result`."""
    calls = itertools.count()

    async def attempt():
        if next(calls) < times:
            raise Unreachable("cannot connect to X at h:1: ConnectionRefusedError")
        return result
    return attempt


def test_the_waits_double_from_one_second_up_to_ten():
    assert list(itertools.islice(backoff_delays(), 7)) == [1, 2, 4, 8, 10, 10, 10]


async def test_a_backend_that_comes_back_is_taken_with_the_waits_between_tries(fake_time, caplog):
    caplog.set_level(logging.WARNING)
    assert await until_reachable(failing(3), "Kafka", 300, asyncio.Event(), fake_time.clock) == "up"
    assert fake_time.waits == [1, 2, 4]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and warnings[0].startswith("Kafka not reachable at start, retrying in 1 s (300 s left")
    assert "STRATAMETER_STARTUP_TIMEOUT_SECONDS" in warnings[0] and "ConnectionRefusedError" in warnings[0]


async def test_it_gives_up_after_the_timeout_naming_the_setting(fake_time):
    with pytest.raises(StartupError) as info:
        await until_reachable(failing(100), "Redis", 20, asyncio.Event(), fake_time.clock)
    # 1 + 2 + 4 + 8 = 15 s, then the 5 s left (not 10), then the try at 20 s fails: give up
    assert fake_time.waits == [1, 2, 4, 8, 5] and fake_time.now == 20
    assert str(info.value) == ("cannot connect to X at h:1: ConnectionRefusedError; Redis did not answer within "
                               "STRATAMETER_STARTUP_TIMEOUT_SECONDS (20 s)")


async def test_zero_means_one_try(fake_time):
    with pytest.raises(StartupError, match=r"within STRATAMETER_STARTUP_TIMEOUT_SECONDS \(0 s\)"):
        await until_reachable(failing(1), "Kafka", 0, asyncio.Event(), fake_time.clock)
    assert fake_time.waits == []


async def test_a_stop_while_waiting_ends_it_without_an_error(fake_time):
    stopping = asyncio.Event()
    stopping.set()
    assert await until_reachable(failing(5), "Kafka", 300, stopping, fake_time.clock) is None
    assert fake_time.waits == [1]


async def test_other_errors_are_not_retried(fake_time):
    async def refused():
        raise StartupError("Redis rejected the credentials")
    with pytest.raises(StartupError, match="rejected the credentials"):
        await until_reachable(refused, "Redis", 300, asyncio.Event(), fake_time.clock)
    assert fake_time.waits == []
