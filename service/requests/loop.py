"""The online OPT loop of one classifier (Bennett & Carvalho 2010, Fig. 1),
driven by events instead of a timer.

One step: expire overdue requests; if the round still has open requests, wait;
otherwise evaluate the finished round once (interval, T-round streak), and
unless the chunk has converged or the hourly budget is spent, allocate the
next round with the statistics core, pick unrequested items from the
strata reservoirs (lowest priorities first, i.e. a uniform sample), record the
requests in Redis (outbox) and publish them all at once.  Skipped and expired
requests are replaced in their stratum in the next round.

Only the instance holding the classifier's lease runs its loop; the ISSUE
script checks the lease (fencing) so a paused former owner cannot issue.
"""

from __future__ import annotations

import logging
import secrets
import time
from datetime import datetime, timezone

import numpy as np
import orjson

from ..stats import allocation, estimator, stopping
from ..stats.calibration import stratum_mean_probability
from ..stats.sketch import ScoreHistogram
from ..state.store import ChunkState, Store

log = logging.getLogger("stratameter.requests")


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def new_request_id(cid: str) -> str:
    return f"{cid}/{secrets.token_urlsafe(16)}"


def request_message(rid: str, cid: str, stratum: int, member: dict, requested_ms: int, deadline_ms: int) -> bytes:
    """A `stratameter.label-requests` record (see schemas.messages.LabelRequest)."""
    return orjson.dumps({
        "request_id": rid, "classifier_id": cid, "item_id": member["i"], "score": member["s"],
        "stratum": stratum, "requested_at": rfc3339(requested_ms), "expires_at": rfc3339(deadline_ms),
        "context": member.get("x"),
    })


def round_interval(cs: ChunkState, confidence: float) -> estimator.Interval:
    return estimator.interval(cs.N, cs.n, cs.h, confidence, "wilson", fpc=True)


class RequestLoop:
    def __init__(self, store: Store, settings, publish, rng: np.random.Generator | None = None) -> None:
        """`publish(list[(key, value)])` sends records to the label-requests topic and waits for acks."""
        self.store = store
        self.settings = settings
        self.publish = publish
        self.rng = rng or np.random.default_rng()
        self.instance = settings.instance_id
        self._purged: dict[str, int] = {}  # classifier -> newest chunk when last purged

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
        """One step of the loop; returns the number of requests issued."""
        cfg = self.settings.for_classifier(cid)
        now = int(time.time() * 1000)
        await self.store.expire(cid, now)
        if await self.store.pending_count(cid) > 0:
            return 0
        ids = await self.store.chunk_ids(cid)
        if not ids:
            return 0
        if len(ids) > cfg.chunk_retention and self._purged.get(cid) != ids[-1]:
            await self.store.purge_chunks(cid, ids, cfg.chunk_retention, max(cfg.history_chunks, cfg.chunk_retention))
            self._purged[cid] = ids[-1]
        chunks = await self.store.chunks(cid, ids[-1:])
        if not chunks:
            return 0
        cs = chunks[0]
        if cs.round > cs.evaluated_round:
            iv = round_interval(cs, cfg.confidence)
            streak = int(stopping.next_streak(cs.streak, iv.halfwidth, cfg.delta))
            status = "converged" if stopping.should_stop(streak, cfg.stop_rounds) else "open"
            await self.store.evaluate_round(cid, cs.chunk, cs.round, streak, status)
            cs.streak, cs.status, cs.evaluated_round = streak, status, cs.round
        if cs.status == "converged" or cs.N.sum() == 0:
            return 0
        budget = cfg.max_labels_per_hour - await self.store.issued_this_hour(cid, now)
        if budget <= 0:
            return 0
        want = self._allocate(cid, cs, cfg, await self.store.chunk_histogram(cid, cs.chunk))
        requests, used_replace = await self._pick(cid, cs, want, budget)
        if not requests:
            return 0
        deadline = now + int(cfg.label_timeout_seconds * 1000)
        issued = await self.store.issue(cid, cs.chunk, now, deadline, cs.round + 1, self.instance,
                                        [[rid, k, m["i"], m["s"], raw] for rid, k, m, raw in requests], used_replace,
                                        int(cfg.request_retention_seconds * 1000))
        if issued is None:
            log.warning("lost the lease while issuing", extra={"classifier": cid})
            return 0
        ok = set(issued)
        records = [(cid, request_message(rid, cid, k, m, now, deadline)) for rid, k, m, _ in requests if rid in ok]
        await self.publish(records)
        await self.store.mark_published(cid, issued)
        return len(issued)

    def _allocate(self, cid: str, cs: ChunkState, cfg, hist_sparse: dict[int, int]) -> np.ndarray:
        k = cs.strata
        if hist_sparse and np.isfinite(cs.min) and np.isfinite(cs.max):
            hist = ScoreHistogram.from_sparse(hist_sparse, cs.min, cs.max)
            q = stratum_mean_probability(hist, cs.cuts, cfg.score_kind)
        else:
            q = np.full(k, 0.5)
        D = allocation.round_size(k, cfg.round_labels_per_stratum)
        want = allocation.allocate(cfg.allocation, N=cs.N, n=cs.n, h=cs.h, q=q, D=D,
                                   round_index=cs.round, rng=self.rng, with_replacement=False)
        for stratum, count in cs.replace.items():
            if 0 <= stratum < k:
                want[stratum] += count
        return want

    async def _pick(self, cid: str, cs: ChunkState, want: np.ndarray, budget: int):
        requests, used_replace = [], {}
        for k in np.flatnonzero(want > 0):
            if len(requests) >= budget:
                break
            members = await self.store.reservoir(cid, cs.chunk, int(k))
            parsed = [orjson.loads(m) for m in members]
            taken = await self.store.sampled(cid, cs.chunk, [p["i"] for p in parsed])
            free = [(p, raw) for p, raw, t in zip(parsed, members, taken) if not t]
            seen: set[str] = set()
            chosen = []
            for p, raw in free:
                if p["i"] in seen:
                    continue
                seen.add(p["i"])
                chosen.append((p, raw))
                if len(chosen) >= min(int(want[k]), budget - len(requests)):
                    break
            for p, raw in chosen:
                requests.append((new_request_id(cid), int(k), p, raw))
            if cs.replace.get(int(k)):
                used_replace[int(k)] = min(cs.replace[int(k)], len(chosen))
        return requests, used_replace
