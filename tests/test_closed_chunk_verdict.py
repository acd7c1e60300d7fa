"""A closed chunk is `converged` only once its sample is complete, against a real Redis: a chunk that
converged while its items still arrived, and closed with requests for its latest arrivals still
unanswered, reads `open` (in the API too, before the loop has even stepped it since it closed)
until those answers are in and the loop has judged it closed; then `converged` for good.

Why: the sample is every item under its stratum's threshold (`stats.streams`), and while items
arrive the last of them are the last requested.  An interval read before their answers lacks the
end of the chunk: on a stream whose precision drops within the chunk it sits too high."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stratameter.api.views import classifier_view
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.requests.loop import RequestLoop
from stratameter.state.store import Store
from stratameter.stats import streams

pytestmark = pytest.mark.integration

CHUNK_S = 60


def test_a_closed_chunk_converges_only_with_its_sample_complete():
    # half-width, streak, closed, nothing left, budget blocked, complete
    assert streams.chunk_status(2, 0.01, 0.02, 2, False, False, False, False) == "converged"  # open: the items so far
    assert streams.chunk_status(2, 0.01, 0.02, 2, True, False, False, False) == "open"
    assert streams.chunk_status(2, 0.01, 0.02, 2, True, False, False, True) == "converged"
    assert streams.chunk_status(2, 0.01, 0.02, 2, True, False, True, False) == "waiting_for_budget"


async def test_a_chunk_closed_with_unanswered_requests_is_open_until_they_are_in(store: Store, monkeypatch):
    clock = [time.time()]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S),
                              "STRATAMETER_ALLOWED_LATENESS_SECONDS": "0", "STRATAMETER_INSTANCE_ID": "me",
                              "STRATAMETER_DELTA": "0.45", "STRATAMETER_STOP_ROUNDS": "1",
                              "STRATAMETER_MAX_LABELS_PER_HOUR": "100000"})
    cfg = settings.for_classifier("late")
    t = int(clock[0]) // CHUNK_S
    clock[0] = t * CHUNK_S + 5.0  # early in the chunk (its items arrive over a minute)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    offsets = iter(range(10_000))

    async def arrive(n: int) -> None:
        offs = [next(offsets) for _ in range(n)]
        await ingest.apply(0, np.array(offs), ["late"] * n, [f"i{o}" for o in offs], 0.5 + rng.random(n) / 2,
                           np.ones(n, bool), np.full(n, t * CHUNK_S * 1000 + 1000), [None] * n)

    async def answer_all() -> int:
        pending = [r.decode() for r in await store.redis.zrange(store.keys.pending("late"), 0, -1)]
        for rid in pending:
            label = "1" if rng.random() < 0.8 else "0"
            outcome = (await store.apply_labels([("late", 0, next(offsets), rid, label, int(clock[0] * 1000),
                                                  "rev")]))[0][0]
            assert outcome == "accepted", outcome
        return len(pending)

    async def status() -> tuple[str, str]:
        """(the loop's stored status, the API's)"""
        cs = (await store.chunks("late", [t]))[0]
        return cs.status, (await classifier_view(store, "late", cfg))["status"]

    async def publish(records):
        pass

    loop = RequestLoop(store, settings, publish)
    assert await store.acquire_lease("late", "me", 600_000)
    for _ in range(4):  # a stream: items arrive over the first 20 seconds
        await arrive(100)
        clock[0] += 5
    for _ in range(10):  # open: rounds until it converges on the items so far
        await loop.step("late")
        if (await status())[0] == "converged":
            break
        await answer_all()
    assert await status() == ("converged", "converged")

    clock[0] += 5
    await arrive(400)  # more arrivals: those under the thresholds are requested at once
    await loop.step("late")
    pending = await store.pending_by_chunk("late")
    assert list(pending) == [t] and pending[t] > 0, pending
    clock[0] = (t + 1) * CHUNK_S + 1.0  # the chunk closes with them unanswered
    assert await status() == ("converged", "open")  # the loop's verdict predates the closing
    await loop.step("late")
    assert await status() == ("open", "open")  # judged closed: incomplete
    assert await answer_all() > 0
    await loop.step("late")  # the round is complete: evaluated, and judged closed
    assert await status() == ("converged", "converged")
    cs = (await store.chunks("late", [t]))[0]
    assert cs.status_closed and int(cs.n.sum()) == cs.evaluated_round
    assert await loop.step("late") == 0 and await status() == ("converged", "converged")


async def test_a_chunk_that_closes_behind_the_newest_two_gets_its_verdict_with_the_budget_spent(
        store: Store, monkeypatch):
    """With a lateness longer than a chunk, a chunk closes after two newer ones have started: the
    loop then steps it as an older chunk, which it reads only when the hour's budget has room.  A
    verdict needs no budget: with the budget spent, the chunk that converged while open is still
    judged closed, and does not read `open` until the budget comes back."""
    clock = [time.time()]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S),
                              "STRATAMETER_ALLOWED_LATENESS_SECONDS": str(5 * CHUNK_S),
                              "STRATAMETER_INSTANCE_ID": "me", "STRATAMETER_DELTA": "0.45",
                              "STRATAMETER_STOP_ROUNDS": "1", "STRATAMETER_MAX_LABELS_PER_HOUR": "1000"})
    cfg = settings.for_classifier("behind")
    t = int(clock[0]) // CHUNK_S
    clock[0] = t * CHUNK_S + 5.0
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    offsets = iter(range(10_000))

    async def arrive(n: int, chunk: int) -> None:
        offs = [next(offsets) for _ in range(n)]
        await ingest.apply(0, np.array(offs), ["behind"] * n, [f"i{o}" for o in offs], 0.5 + rng.random(n) / 2,
                           np.ones(n, bool), np.full(n, chunk * CHUNK_S * 1000 + 1000), [None] * n)

    async def answer_all() -> None:
        for rid in [r.decode() for r in await store.redis.zrange(store.keys.pending("behind"), 0, -1)]:
            await store.apply_labels([("behind", 0, next(offsets), rid, "1" if rng.random() < 0.8 else "0",
                                       int(clock[0] * 1000), "rev")])

    async def status() -> tuple[str, str]:
        cs = (await store.chunks("behind", [t]))[0]
        doc = await classifier_view(store, "behind", cfg)
        return cs.status, next(c for c in [doc, *doc["history"]] if c["chunk"]["start"] == start_iso(t))["status"]

    async def publish(records):
        pass

    loop = RequestLoop(store, settings, publish)
    assert await store.acquire_lease("behind", "me", 3_600_000)
    for _ in range(4):
        await arrive(100, t)
        clock[0] += 5
    for _ in range(10):  # converges while open, with every answer in
        await loop.step("behind")
        await answer_all()
        await loop.step("behind")
        if (await status())[0] == "converged":
            break
    assert await status() == ("converged", "converged")
    for newer in (t + 1, t + 2):  # two newer chunks start: chunk t is now an older one, still open
        clock[0] = newer * CHUNK_S + 5.0
        await arrive(100, newer)
        await loop.step("behind")
    clock[0] = (t + 1) * CHUNK_S + 5 * CHUNK_S + 1.0  # chunk t closes, and the hour's budget is spent
    hour = str(int(clock[0] * 1000) // 3_600_000)
    await store.redis.hincrby(store.keys.hourly("behind"), hour, 1_000_000)
    assert await status() == ("converged", "open")  # not judged since it closed
    assert await loop.step("behind") == 0
    assert await status() == ("converged", "converged")
    assert (await store.chunks("behind", [t]))[0].status_closed


def start_iso(t: int) -> str:
    from stratameter.schemas.messages import format_time

    return format_time(t * CHUNK_S * 1000)
