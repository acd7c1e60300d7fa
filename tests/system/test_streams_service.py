"""The service on real-time streams (issue 9), against the real broker and Redis:
records produced one by one at a few per second with `event_time` = now, short
chunks that close while the test runs, a reviewer answering from the truth, and for one
classifier ("sloppy") as reviewers do: some requests skipped, some answered a little late
(still in time), some answered only after they expired (with the wrong label, which must
not be folded).

What a user watching the API must never see, and what closed chunks must get right:
* a chunk reported `converged` with an interval wider than delta, or an interval of zero width;
* a closed chunk whose population differs from the records sent into it;
* closed chunks missing their true precision more often than the confidence allows,
  also when the precision drops half-way through every chunk;
* a closed chunk reported converged before the answers for its latest arrivals are in (its
  figures would still move, and lean towards the start of the chunk);
* labelling that waits for the budget without saying so;
* a new classifier without its K strata in its first chunk;
* a skipped or an expired request not counted as such, or an answer that came after its
  request expired folded into the estimate.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from datetime import datetime

import orjson
import pytest

from stratameter.chunks.lifecycle import STATUSES
from stratameter.schemas.messages import format_time
from stratameter.simulate.populations import builtin
from stratameter.stats import estimator
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration

CHUNK_SECONDS = 30
LATENESS_SECONDS = 3
DELTA = 0.1
CONFIDENCE = 0.99
RATE = 10.0  # records per second per classifier
STREAM_SECONDS = 80
SLOPPY_TIMEOUT_SECONDS = 6  # "sloppy"'s LABEL_TIMEOUT_SECONDS
IN_TIME_DELAY, TOO_LATE_DELAY = 1.0, 5.0  # seconds after the request, after its deadline


def _chunk(ms: int) -> int:
    return ms // (CHUNK_SECONDS * 1000)


class Stream:
    """Sends one record at a time for several classifiers and keeps the truth per item and chunk."""

    def __init__(self, run, seed: int) -> None:
        self.run = run
        self.rng = random.Random(seed)
        self.pop = builtin("calibrated", size=20_000)
        self.truth: dict[str, int] = {}
        self.sent: dict[tuple[str, int], list[int]] = {}  # (classifier, chunk) -> labels sent

    def label_for(self, cid: str, i: int, event_ms: int) -> tuple[float, int]:
        score, y = float(self.pop.scores[i]), int(self.pop.labels[i])
        if cid == "drops":  # precision ~0.95 in the first half of every chunk, ~0.45 in the second
            late = (event_ms / 1000) % CHUNK_SECONDS >= CHUNK_SECONDS / 2
            y = int(self.rng.random() < (0.45 if late else 0.95))
        return score, y

    async def send(self, classifiers: list[str], seconds: float) -> None:
        n, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            for cid in classifiers:
                now_ms = int(time.time() * 1000)
                score, y = self.label_for(cid, self.rng.randrange(len(self.pop.scores)), now_ms)
                item = f"{cid}-{n}"
                self.truth[item] = y
                self.sent.setdefault((cid, _chunk(now_ms)), []).append(y)
                await self.run.send_score(classifier_id=cid, item_id=item, score=score, predicted_positive=True,
                                          event_time=now_ms)
            n += 1
            await asyncio.sleep(max(0.0, start + n / RATE - time.monotonic()))
        await self.run.producer.flush()


class SloppyReviewer:
    """Answers "sloppy"'s requests as a review queue does (the others' at once, from the truth):
    of every 20 requests 3 skipped, 3 answered `IN_TIME_DELAY` late, 3 answered only
    `TOO_LATE_DELAY` after they expired, and then with the wrong label; the rest at once.
    Each answer is filed by when it was sent against the request's `expires_at`."""

    def __init__(self, run, stream: Stream, seed: int) -> None:
        self.run, self.stream, self.rng = run, stream, random.Random(seed)
        self.skipped = 0
        self.in_time = 0  # labels sent before their request's deadline (at once or a little late)
        self.too_late = 0  # labels sent after it
        self.tasks: list[asyncio.Task] = []
        self.done = False  # set once the checked chunks settled: later requests are left unanswered

    def answer(self, req: dict):
        truth = bool(self.stream.truth[req["item_id"]])
        if req["classifier_id"] != "sloppy":
            return truth
        if self.done:
            return ...
        deadline, draw = datetime.fromisoformat(req["expires_at"]).timestamp(), self.rng.randrange(20)
        if draw < 3:
            self.skipped += 1
            return None
        if draw >= 9 or (draw < 6 and time.time() + IN_TIME_DELAY > deadline - 2):  # at once
            self._file(deadline)
            return truth
        too_late = draw >= 6
        at = deadline + TOO_LATE_DELAY if too_late else time.time() + IN_TIME_DELAY
        self.tasks.append(asyncio.ensure_future(self._later(req["request_id"], truth != too_late, at, deadline)))
        return ...

    def _file(self, deadline: float) -> None:
        if time.time() < deadline:
            self.in_time += 1
        else:
            self.too_late += 1

    async def _later(self, rid: str, label: bool, at: float, deadline: float) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        self._file(deadline)
        await self.run.send_label(rid, label)

    async def counted(self) -> dict | None:
        """"sloppy"'s document once every answer was sent and each has its one outcome."""
        if not all(t.done() for t in self.tasks):
            return None
        _, body = await self.run.get("/v1/classifiers/sloppy")
        doc = orjson.loads(body)
        seen = doc["labels_by_outcome"]
        if seen["accepted"] + seen["skipped"] + seen["expired"] == self.skipped + self.in_time + self.too_late:
            return doc
        return None


def start_iso(t: int) -> str:
    return format_time(t * CHUNK_SECONDS * 1000)


def _settled(chunk: dict | None) -> bool:
    """A closed chunk the loop is done with.  Also "sloppy"'s: its rounds, slowed by skipped and
    expired requests, go on after newer chunks have started (`lifecycle.sampled_chunks`)."""
    return chunk is not None and chunk["closed"] and chunk["status"] in ("converged", "exhausted")


#: What a settled (closed, converged or exhausted) chunk reports for good.
FINAL = ("labels", "estimate", "ci_lower", "ci_upper", "status")


def _reported_estimate(chunk: dict) -> float:
    """The estimate a closed chunk reports, from its strata's counts: the stratified estimate with the
    adaptive allocation's bias term, and the stopping rule's too once converged (not the interval's
    centre); the difference estimator's where the calibration is active (`calibration.active`), which
    these counts cannot rebuild: there, the reported interval's own point is checked to lie inside it."""
    if chunk["calibration"] and chunk["calibration"]["active"]:
        assert chunk["ci_lower"] <= chunk["estimate"] <= chunk["ci_upper"], chunk
        return chunk["estimate"]
    strata = chunk["strata"]
    iv = estimator.wilson_interval([s["items"] for s in strata], [s["labels"] for s in strata],
                                   [s["positives"] for s in strata], CONFIDENCE, fpc=True)
    assert (float(iv.lower), float(iv.upper)) == (pytest.approx(chunk["ci_lower"]), pytest.approx(chunk["ci_upper"]))
    return float(iv.estimate_at_stop if chunk["status"] == "converged" else iv.estimate)


def _halfwidth(doc: dict) -> float:
    return (doc["ci_upper"] - doc["ci_lower"]) / 2


async def test_real_time_streams_are_honest_while_open_and_once_closed(kafka_bootstrap, redis_url, unique_name,
                                                                      tmp_path):
    overrides = tmp_path / "classifiers.json"
    overrides.write_text(json.dumps({"budget": {"max_labels_per_hour": 20},
                                     "sloppy": {"label_timeout_seconds": SLOPPY_TIMEOUT_SECONDS}}))
    settings = {"CHUNK_SECONDS": str(CHUNK_SECONDS), "ALLOWED_LATENESS_SECONDS": str(LATENESS_SECONDS),
                "MAX_EVENT_TIME_SKEW_SECONDS": "5", "DELTA": str(DELTA), "CONFIDENCE": str(CONFIDENCE),
                "MAX_LABELS_PER_HOUR": "100000", "CLASSIFIERS_CONFIG_FILE": str(overrides)}
    classifiers = ["steady", "drops", "budget", "sloppy"]
    honest = ("steady", "drops", "sloppy")  # the classifiers whose closed chunks are checked
    violations: list = []
    seen_budget_wait: list = []
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as run:
        stream = Stream(run, seed=7)

        async def watch():
            while True:
                for cid in classifiers:
                    status, body = await run.get(f"/v1/classifiers/{cid}")
                    if status != 200:
                        continue
                    doc = orjson.loads(body)
                    if doc["status"] == "waiting_for_budget":
                        seen_budget_wait.append(doc)
                    for chunk in [doc, *doc["history"]]:
                        if chunk["ci_lower"] is None:
                            continue
                        if chunk["status"] == "converged" and _halfwidth(chunk) > DELTA + 1e-9:
                            violations.append(("converged wider than delta", cid, chunk))
                        if chunk["ci_upper"] <= chunk["ci_lower"]:
                            violations.append(("zero width", cid, chunk))
                await asyncio.sleep(0.5)

        reviewer = SloppyReviewer(run, stream, seed=11)
        async with Reviewer(run, unique_name("rev"), reviewer.answer):
            watcher = asyncio.create_task(watch())
            try:
                await asyncio.sleep(CHUNK_SECONDS - time.time() % CHUNK_SECONDS + 0.2)  # start with a chunk
                await stream.send(classifiers, STREAM_SECONDS)
                # the chunks the stream filled (the last one is partial)
                chunks = sorted({t for (cid, t) in stream.sent if cid == "steady"})[:-1]
                last_end = (chunks[-1] + 1) * CHUNK_SECONDS + LATENESS_SECONDS

                async def settled():
                    if time.time() < last_end:
                        return None
                    docs = {}
                    for cid in honest:
                        status, body = await run.get(f"/v1/classifiers/{cid}")
                        assert status == 200, (status, body[:500])
                        doc = orjson.loads(body)
                        by_start = {c["chunk"]["start"]: c for c in [doc, *doc["history"]]}
                        if not all(_settled(by_start.get(start_iso(t))) for t in chunks):
                            return None
                        docs[cid] = by_start
                    return docs

                docs = await wait_for(settled, last_end - time.time() + 90, "the streamed chunks to close and settle")
                reviewer.done = True
                sloppy = await wait_for(reviewer.counted, 60, "every skipped and too-late answer to be counted")
                later = await settled()  # a settled chunk's verdict is final: nothing folded since
                assert later is not None, "a settled chunk is no longer converged or exhausted"
                budget_metrics = (await run.get("/metrics"))[1].decode()
                budget_doc = orjson.loads((await run.get("/v1/classifiers/budget"))[1])
            finally:
                watcher.cancel()
    assert not violations, violations[:3]

    misses, checked = [], 0
    for cid in honest:
        for t in chunks:
            chunk = docs[cid][start_iso(t)]
            again = later[cid][start_iso(t)]
            assert [again[k] for k in FINAL] == [chunk[k] for k in FINAL], (cid, t, chunk, again)
            labels = stream.sent[(cid, t)]
            truth = sum(labels) / len(labels)
            assert chunk["population"] == len(labels), (cid, t, chunk["population"], len(labels))
            assert chunk["closed"] and chunk["ci_lower"] is not None, chunk
            assert chunk["labels"] < len(labels), "a census is no sample"
            assert len(chunk["strata"]) == 4, chunk["strata"]
            checked += 1
            assert chunk["estimate"] == pytest.approx(_reported_estimate(chunk), abs=1e-12), chunk
            if not chunk["ci_lower"] <= truth <= chunk["ci_upper"]:
                misses.append((cid, t, truth, chunk["ci_lower"], chunk["ci_upper"]))
            if cid == "drops":  # the late, worse half is in the sample: the interval is far below the first half's 0.95
                assert chunk["ci_upper"] < 0.9, chunk
    # at confidence 0.99 two misses among ~6-9 closed chunks have probability < 0.4 %
    assert len(misses) <= 1, (misses, checked)
    # the reviewer's habits, each answer counted once as what it was: no answer sent after its
    # request expired was folded (the wrong labels it carried would also show in the coverage);
    # a skip or an in-time label that the service read only after the deadline counts as expired
    seen = sloppy["labels_by_outcome"]
    assert reviewer.skipped and reviewer.too_late and reviewer.in_time, vars(reviewer)
    assert seen["expired"] >= reviewer.too_late and seen["accepted"] <= reviewer.in_time, (seen, vars(reviewer))
    assert 0 < seen["skipped"] <= reviewer.skipped, (seen, vars(reviewer))
    assert sloppy["requests_expired"] >= reviewer.too_late, sloppy
    # a new classifier on a slow stream gets its K strata in its very first chunk (25 x K items)
    first = docs["steady"][start_iso(chunks[0])]
    assert len(stream.sent[("steady", chunks[0])]) >= 100 and len(first["strata"]) == 4, first
    assert seen_budget_wait, "the budget-limited classifier never said it waits for the budget"
    budget_line = [line for line in budget_metrics.splitlines()
                   if line.startswith('stratameter_label_budget_remaining{classifier="budget"}')]
    assert budget_line == ['stratameter_label_budget_remaining{classifier="budget"} 0.0'], (budget_line, budget_doc)
    # the status as a state set: one series a status, 1 for the one the API reports
    states = {line.split('status="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
              for line in budget_metrics.splitlines()
              if line.startswith('stratameter_chunk_status{classifier="budget",')}
    assert states == {s: float(s == budget_doc["status"]) for s in STATUSES}, (states, budget_doc["status"])
