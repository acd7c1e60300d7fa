"""The online OPT loop of one classifier (Bennett & Carvalho 2010, Fig. 1),
driven by events instead of a timer.

A chunk's population grows while it is sampled, so the loop runs the stream
design of `stats.streams` (threshold sampling: the sample is every item whose
reservoir priority is at or below its stratum's threshold).  One step, for the
newest chunk that has started and the one before it: expire overdue requests;
when a round has completed with new labels, evaluate it once (interval,
T-round streak); while items still arrive, raise the thresholds to the paced
target; once arrivals have stopped or the chunk has closed, run an online OPT
round (allocation by the core) by raising thresholds past the next-lowest
priorities; then request every unrequested reservoir item at or below its
threshold, as far as the paced hourly budget allows: record the requests in
Redis (outbox) and publish them all at once.  Skipped and expired requests
leave the sample (missing at random within the stratum); the next round's
allocation makes up for them.

Only the instance holding the classifier's lease runs its loop; the ISSUE
script checks the lease (fencing) so a paused former owner cannot issue.
"""

from __future__ import annotations

import logging
import secrets
import time

import numpy as np
import orjson

from stratameter.schemas.parse import label_request_bytes

from ..stats import allocation, stopping, streams
from ..stats.calibration import stratum_mean_probability
from ..stats.sketch import ScoreHistogram
from ..state.store import ChunkState, Store

log = logging.getLogger("stratameter.requests")

#: Chunks the loop samples at once: the newest that has started, and the one before it
#: (still open for late records, or topping up its sample after closing).
ACTIVE_CHUNKS = 2


def new_request_id(cid: str) -> str:
    return f"{cid}/{secrets.token_urlsafe(16)}"


def request_message(rid: str, cid: str, stratum: int, member: dict, requested_ms: int, deadline_ms: int) -> bytes:
    """A `stratameter.label-requests` record (the contract: schemas.messages.LabelRequest)."""
    return label_request_bytes(rid, cid, member["i"], member["s"], stratum, requested_ms / 1000, deadline_ms / 1000,
                               member.get("x"))


class RequestLoop:
    def __init__(self, store: Store, settings, publish) -> None:
        """`publish(list[(key, value)])` sends records to the label-requests topic and waits for acks."""
        self.store = store
        self.settings = settings
        self.publish = publish
        self.instance = settings.instance_id
        self._purged: dict[str, int] = {}  # classifier -> newest chunk when last purged
        self._seen: dict[tuple[str, int], tuple] = {}  # (classifier, chunk) -> what the last step looked at
        self._priors: dict[tuple[str, int], tuple[float, np.ndarray]] = {}  # (classifier, chunk) -> (size, q)

    async def republish_outbox(self, cid: str) -> int:
        """Publish requests recorded but not acknowledged by Kafka before a crash."""
        pending = await self.store.unpublished(cid)
        if not pending:
            return 0
        records = []
        for rid, h in pending:
            member = orjson.loads(h["item"])
            records.append((cid, request_message(rid, cid, int(h["stratum"]), member, int(h["requested_ms"]),
                                                 int(h["deadline_ms"]))))
        await self.publish(records)
        await self.store.mark_published(cid, [rid for rid, _ in pending])
        return len(records)

    async def step(self, cid: str) -> int:
        """One step of the loop for every chunk still sampling; returns the number of requests issued."""
        cfg = self.settings.for_classifier(cid)
        now = int(time.time() * 1000)
        await self.store.expire(cid, now)
        ids = await self.store.chunk_ids(cid)
        if not ids:
            return 0
        if len(ids) > cfg.chunk_retention and self._purged.get(cid) != ids[-1]:
            await self.store.purge_chunks(cid, ids, cfg.chunk_retention, max(cfg.history_chunks, cfg.chunk_retention))
            self._purged[cid] = ids[-1]
        # the newest chunk that has started and the one before it (open for its lateness, or topping up)
        started = [t for t in ids if t * cfg.chunk_seconds * 1000 <= now][-ACTIVE_CHUNKS:]
        if not started:
            return 0
        pending = await self.store.pending_by_chunk(cid)
        issued = 0
        for cs in await self.store.chunks(cid, started):
            if getattr(cs, "provisional", False) or cs.N.sum() == 0:
                continue
            issued += await self._step_chunk(cid, cs, cfg, now, pending.get(cs.chunk, 0), issued)
        return issued

    async def _step_chunk(self, cid: str, cs: ChunkState, cfg, now: int, pending: int, issued_before: int) -> int:
        """The stream design of `stats.streams` for one chunk: evaluate, pace or top up, request."""
        now_s, end_s = now / 1000, (cs.chunk + 1) * cfg.chunk_seconds
        closed = bool(streams.is_closed(now_s, end_s, _lateness(cfg)))
        total = float(cs.N.sum())
        first_s, last_s = cs.first_ms / 1000, cs.last_ms / 1000
        flowing = bool(streams.arrivals_flowing(total, first_s, last_s, now_s, end_s, cfg.chunk_seconds)) and not closed
        seen = (total, int(cs.n.sum()), pending, flowing, closed, cs.thresholds.tobytes())
        if self._seen.get((cid, cs.chunk)) == seen and cs.status != "waiting_for_budget":
            return 0  # nothing the design looks at has changed since the last step
        final = float(streams.expected_final_size(total, first_s, last_s, now_s, end_s, cfg.chunk_seconds))
        halfwidth = float(streams.chunk_interval(cs.N, cs.n, cs.h, cfg.confidence, closed).halfwidth)
        streak, labels = cs.streak, int(cs.n.sum())
        if pending == 0 and labels > cs.evaluated_round:  # a round completed with new labels: evaluate once
            streak = int(stopping.next_streak(streak, halfwidth, cfg.delta))
            await self.store.evaluate_round(cid, cs.chunk, labels, streak, cs.status)
        converged = bool(np.isfinite(halfwidth) and halfwidth <= cfg.delta and streak >= cfg.stop_rounds)
        tau, want = streams.plan_requests(cs.N, cs.n, cs.h, await self._prior(cid, cs, cfg), cs.thresholds,
                                          cs.N * final / total, flowing, pending == 0, converged, cfg.delta,
                                          cfg.confidence, allocation.round_size(cs.strata, cfg.round_labels_per_stratum),
                                          closed=closed)
        due, tau, left = await self._due(cid, cs, cfg, tau, want)
        budget = max(0, int(streams.budget_allowance(cfg.max_labels_per_hour, (now // 1000) % 3600))
                     - await self.store.issued_this_hour(cid, now) - issued_before)
        status = str(streams.chunk_status(streak, halfwidth, cfg.delta, cfg.stop_rounds, closed,
                                          left == 0 and pending == 0 and not due, len(due) > budget))
        self._seen[(cid, cs.chunk)] = seen
        requests = [(new_request_id(cid), k, orjson.loads(raw), raw) for k, raw in due[:budget]]
        if not requests:
            if status != cs.status:
                await self.store.set_status(cid, cs.chunk, status)
            return 0
        return await self._request(cid, cs, cfg, now, requests, tau, status)

    async def _request(self, cid: str, cs: ChunkState, cfg, now: int, requests: list, tau: np.ndarray,
                       status: str) -> int:
        """Record the requests and the thresholds they were drawn under (outbox), publish, mark."""
        deadline = now + int(cfg.label_timeout_seconds * 1000)
        issued = await self.store.issue(cid, cs.chunk, now, deadline, cs.round + 1, self.instance,
                                        [[rid, k, m["i"], m["s"], raw] for rid, k, m, raw in requests], {},
                                        int(cfg.request_retention_seconds * 1000), tau)
        if issued is None:
            log.warning("lost the lease while issuing", extra={"classifier": cid})
            return 0
        await self.store.set_status(cid, cs.chunk, status)
        ok = set(issued)
        records = [(cid, request_message(rid, cid, k, m, now, deadline)) for rid, k, m, _ in requests if rid in ok]
        await self.publish(records)
        await self.store.mark_published(cid, issued)
        return len(issued)

    async def _prior(self, cid: str, cs: ChunkState, cfg) -> np.ndarray:
        """Mean calibrated score per stratum (the allocation's prior), 1/2 where unknown;
        re-read from the chunk's histogram when the chunk has grown by a tenth."""
        key = (cid, cs.chunk)
        total = float(cs.N.sum())
        cached = self._priors.get(key)
        if cached is not None and total <= 1.1 * cached[0] and cached[1].size == cs.strata:
            return cached[1]
        hist_sparse = await self.store.chunk_histogram(cid, cs.chunk)
        q = np.full(cs.strata, 0.5)
        if hist_sparse and np.isfinite(cs.min) and np.isfinite(cs.max):
            hist = ScoreHistogram.from_sparse(hist_sparse, cs.min, cs.max)
            q = stratum_mean_probability(hist, cs.cuts, cfg.score_kind)
        self._priors[key] = (total, q)
        return q

    async def _due(self, cid: str, cs: ChunkState, cfg, tau: np.ndarray, want: np.ndarray
                   ) -> tuple[list[tuple[int, str]], np.ndarray, int]:
        """Unrequested reservoir items at or below each stratum's threshold, after
        raising the thresholds of the strata a round wants `want` more labels from.

        Returns the due items as (stratum, member), the most urgent first
        (lowest priority relative to its threshold), the thresholds, and the
        number of items left above them.  Items above a threshold were never
        requested (requests only ever go to items at or below it).  A full
        reservoir keeps nothing above its largest priority, so no threshold
        rises past it (the design's cap on labels per stratum and chunk)."""
        tau = np.array(tau, dtype=float)
        windows = await self.store.reservoir_windows(cid, cs.chunk, tau, want)
        below = [(k, raw, p) for k, w in enumerate(windows) for raw, p in w.below]
        taken = await self.store.sampled(cid, cs.chunk, [orjson.loads(raw)["i"] for _, raw, _ in below])
        due = [(p / max(tau[k], 1e-300), k, raw) for (k, raw, p), t in zip(below, taken) if not t]
        left = 0
        for k, w in enumerate(windows):
            raised = streams.threshold_after(tau[k], [p for _, p in w.above], int(want[k]))
            if w.size >= cfg.reservoir_size:
                raised = min(raised, w.largest)
            tau[k] = max(cs.thresholds[k], raised)
            due += [(p / max(tau[k], 1e-300), k, raw) for raw, p in w.above if p <= tau[k]]
            left += w.above_count - sum(1 for _, p in w.above if p <= tau[k])
        due.sort()
        return [(k, raw) for _, k, raw in due], tau, left


def _lateness(cfg) -> float:
    return float(getattr(cfg, "allowed_lateness_seconds", 300))
