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

from stratameter.chunks import lifecycle
from stratameter.api.views import classifier_view
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.requests.loop import RequestLoop
from stratameter.schemas.messages import format_time
from stratameter.state.calls import LabelCall
from stratameter.state.process import ProcessState
from stratameter.state.store import Store


pytestmark = pytest.mark.integration

CHUNK_S = 60


def test_a_closed_chunk_converges_only_with_its_sample_complete():
    # streak, half-width, delta, T, closed, nothing left, budget blocked, complete
    assert lifecycle.chunk_status(2, 0.01, 0.02, 2, False, False, False, False) == "converged"  # open: the items so far
    assert lifecycle.chunk_status(2, 0.01, 0.02, 2, True, False, False, False) == "open"
    assert lifecycle.chunk_status(2, 0.01, 0.02, 2, True, False, False, True) == "converged"
    assert lifecycle.chunk_status(2, 0.01, 0.02, 2, True, False, True, False) == "waiting_for_budget"


class Classifier:
    """One classifier's stream on a clock the test moves (`time.time` patched): its items arrive into
    the chunk `t` the clock starts in (5 s into it), its request loop steps, and a reviewer answers
    every pending request (80 % positive)."""

    def __init__(self, store: Store, monkeypatch, cid: str, lateness_s: int, max_labels_per_hour: int) -> None:
        self.clock = [time.time()]
        monkeypatch.setattr(time, "time", lambda: self.clock[0])
        self.settings = load_settings({
            "STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_CHUNK_SECONDS": str(CHUNK_S),
            "STRATAMETER_ALLOWED_LATENESS_SECONDS": str(lateness_s), "STRATAMETER_INSTANCE_ID": "me",
            "STRATAMETER_DELTA": "0.45", "STRATAMETER_STOP_ROUNDS": "1",
            "STRATAMETER_MAX_LABELS_PER_HOUR": str(max_labels_per_hour)})
        self.store, self.cid = store, cid
        self.t = int(self.clock[0]) // CHUNK_S
        self.clock[0] = self.t * CHUNK_S + 5.0
        self.ingest = ScoreIngestor(store, self.settings, np.random.default_rng(0))
        self.rng = np.random.default_rng(1)
        self.offsets = iter(range(10_000))
        self.loop = self.new_loop()

    def new_loop(self) -> RequestLoop:
        """A request loop that remembers nothing yet (a service's start); its requests go nowhere."""
        async def publish(records):
            pass

        return RequestLoop(self.store, ProcessState(), self.settings, publish)

    async def arrive(self, n: int, chunk: int | None = None) -> None:
        """`n` predicted positives into `chunk` (default `t`), arriving now."""
        t = self.t if chunk is None else chunk
        offs = [next(self.offsets) for _ in range(n)]
        await self.ingest.apply(0, np.array(offs), [self.cid] * n, [f"i{o}" for o in offs],
                                0.5 + self.rng.random(n) / 2, np.ones(n, bool), np.full(n, t * CHUNK_S * 1000 + 1000),
                                [None] * n)

    async def answer_all(self) -> int:
        """Answer every pending request now (each accepted); how many."""
        pending = [r.decode() for r in await self.store.redis.zrange(self.store.keys.pending(self.cid), 0, -1)]
        for rid in pending:
            label = "1" if self.rng.random() < 0.8 else "0"
            (reply,) = await self.store.requests.apply_labels([LabelCall(self.cid, 0, next(self.offsets), rid, label,
                                                                         int(self.clock[0] * 1000), "rev")])
            outcome = reply.outcome
            assert outcome == "accepted", outcome
        return len(pending)

    async def status(self) -> tuple[str, str]:
        """Chunk `t`'s status: (the loop's stored one, the API's)."""
        cs = (await self.store.chunks.chunk_states(self.cid, [self.t]))[0]
        doc = await classifier_view(self.store.chunks, ProcessState(), self.cid, self.settings.for_classifier(self.cid))
        start = format_time(self.t * CHUNK_S * 1000)
        return cs.status, next(c for c in [doc, *doc["history"]] if c["chunk"]["start"] == start)["status"]

    async def converge_while_open(self) -> None:
        """Items arrive over 20 s, then rounds (every answer in) until chunk `t` converges, still open."""
        assert await self.store.registry.acquire_lease(self.cid, "me", 3_600_000)
        for _ in range(4):
            await self.arrive(100)
            self.clock[0] += 5
        for _ in range(10):
            await self.loop.step(self.cid)
            if (await self.status())[0] == "converged":
                break
            await self.answer_all()
        assert await self.status() == ("converged", "converged")

    async def close_behind_the_newest_two_with_the_budget_spent(self) -> None:
        """Two newer chunks start (chunk `t`, still open, is then an older one); then chunk `t`
        closes, with the hour's budget spent."""
        for newer in (self.t + 1, self.t + 2):
            self.clock[0] = newer * CHUNK_S + 5.0
            await self.arrive(100, newer)
            await self.loop.step(self.cid)
        self.clock[0] = (self.t + 1) * CHUNK_S + 5 * CHUNK_S + 1.0
        hour = str(int(self.clock[0] * 1000) // 3_600_000)
        await self.store.redis.hincrby(self.store.keys.hourly(self.cid), hour, 1_000_000)


async def test_a_chunk_closed_with_unanswered_requests_is_open_until_they_are_in(store: Store, monkeypatch):
    c = Classifier(store, monkeypatch, "late", lateness_s=0, max_labels_per_hour=100_000)
    await c.converge_while_open()
    c.clock[0] += 5
    await c.arrive(400)  # more arrivals: those under the thresholds are requested at once
    await c.loop.step("late")
    pending = await store.requests.pending_by_chunk("late")
    assert list(pending) == [c.t] and pending[c.t] > 0, pending
    c.clock[0] = (c.t + 1) * CHUNK_S + 1.0  # the chunk closes with them unanswered
    assert await c.status() == ("converged", "open")  # the loop's verdict predates the closing
    await c.loop.step("late")
    assert await c.status() == ("open", "open")  # judged closed: incomplete
    assert await c.answer_all() > 0
    await c.loop.step("late")  # the round is complete: evaluated, and judged closed
    assert await c.status() == ("converged", "converged")
    cs = (await store.chunks.chunk_states("late", [c.t]))[0]
    assert cs.status_closed and int(cs.n.sum()) == cs.evaluated_round
    assert await c.loop.step("late") == 0 and await c.status() == ("converged", "converged")


async def test_a_chunk_that_closes_behind_the_newest_two_gets_its_verdict_with_the_budget_spent(
        store: Store, monkeypatch):
    """With a lateness longer than a chunk, a chunk closes after two newer ones have started: the
    loop then steps it as an older chunk, which it reads only when the hour's budget has room.  A
    verdict needs no budget: with the budget spent, the chunk that converged while open is still
    judged closed, and does not read `open` until the budget comes back."""
    c = Classifier(store, monkeypatch, "behind", lateness_s=5 * CHUNK_S, max_labels_per_hour=1000)
    await c.converge_while_open()
    await c.close_behind_the_newest_two_with_the_budget_spent()
    assert await c.status() == ("converged", "open")  # not judged since it closed
    assert await c.loop.step("behind") == 0
    assert await c.status() == ("converged", "converged")
    assert (await store.chunks.chunk_states("behind", [c.t]))[0].status_closed


async def test_a_restart_does_not_leave_a_chunk_finished_while_open_without_its_verdict(store: Store, monkeypatch):
    """The same, with the service restarted (a new request loop, which has not seen the chunk
    converge) before the chunk closes: its first step reads the older chunks once, budget or not."""
    c = Classifier(store, monkeypatch, "restarted", lateness_s=5 * CHUNK_S, max_labels_per_hour=1000)
    await c.converge_while_open()
    await c.close_behind_the_newest_two_with_the_budget_spent()
    c.loop = c.new_loop()  # the restart
    assert await c.status() == ("converged", "open")
    assert await c.loop.step("restarted") == 0
    assert await c.status() == ("converged", "converged")
    assert (await store.chunks.chunk_states("restarted", [c.t]))[0].status_closed
