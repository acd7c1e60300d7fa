"""The online OPT loop of one classifier (Bennett & Carvalho 2010, Fig. 1),
driven by events instead of a timer.

A chunk's population grows while it is sampled, so the loop runs the stream
design of `stats.streams` (threshold sampling: the sample is every item whose
reservoir priority is at or below its stratum's threshold).  One step, for the
newest chunk that has started, the one before it, and every older chunk whose
reservoirs are kept and that has not finished (`streams.sampled_chunks`: slow
reviewers stretch a chunk's rounds past the next chunk's start): expire overdue requests;
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

import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass

import numpy as np
import orjson

from stratameter.schemas.outbound import label_request_bytes

from ..labels.calibrated import chunk_calibrations
from ..stats import allocation, stopping, streams
from ..stats.calibration import stratum_mean_probability
from ..stats.sketch import ScoreHistogram
from ..state.keys import first_negative_stratum, negatives_of, owner_of
from ..state.store import ChunkState, Store
from ..stats.confusion import Target, population

log = logging.getLogger(__name__)

def new_request_id(state_id: str) -> str:
    return f"{state_id}/{secrets.token_urlsafe(16)}"


def request_message(rid: str, cid: str, stratum: int, member: dict, requested_ms: int, deadline_ms: int,
                    predicted_positive: bool = True) -> bytes:
    """A `stratameter.label-requests` record (the contract: schemas.messages.LabelRequest)."""
    return label_request_bytes(rid, cid, member["i"], member["s"], stratum, requested_ms / 1000, deadline_ms / 1000,
                               member.get("x"), predicted_positive)


@dataclass
class Side:
    """One side of a chunk: the state holding the predicted positives (the classifier's) or the
    predicted negatives (`state.keys.negatives_of`), as the loop sees it this step."""

    state_id: str
    cs: ChunkState | None  # None: no item of this side in the chunk yet
    cfg: object  # the side's settings (`Settings.for_classifier(state_id)`)
    first_stratum: int  # the stratum id of its stratum 0 in requests and the API (0, or K for negatives)
    pending: int
    #: False for the negatives of a chunk some of whose records never reached their state
    #: (`streams.counted_whole`): never sampled, and no metric that needs them is estimated
    complete: bool = True

    @property
    def positive(self) -> bool:
        return self.first_stratum == 0

    @property
    def held(self) -> bool:
        """A provisional side stepped beside a final one: counted, never sampled (`_sampled_sides`)."""
        return self.cs is not None and self.cs.provisional

    @property
    def strata(self) -> int:
        return self.cs.strata if self.cs is not None else 1

    def column(self, name: str) -> np.ndarray:
        """N, n, h or thresholds of the side's strata (zeros for a side with no items yet)."""
        if self.cs is None:
            return np.zeros(1)
        return self.cs.thresholds if name == "thresholds" else getattr(self.cs, name)


class RequestLoop:
    def __init__(self, store: Store, settings, publish) -> None:
        """`publish(list[(key, value)])` sends records to the label-requests topic and waits for acks."""
        self.store = store
        self.settings = settings
        self.publish = publish
        self.instance = settings.instance_id
        # state -> (newest chunk, newest closed chunk purged) at its last purge (`_chunk_ids`)
        self._purged: dict[str, tuple[int, int | None]] = {}
        # per classifier, per chunk it steps (`_forget_inactive` keeps only those): what the last
        # step looked at; per state and chunk: (size, q) of the prior
        self._seen: dict[str, dict[int, tuple]] = {}
        self._priors: dict[str, dict[int, tuple[float, np.ndarray]]] = {}
        self._finished: dict[str, set[int]] = {}  # per classifier: older chunks closed and finished
        self._request_chunks: dict[str, dict[str, int]] = {}  # per state: pending request id -> chunk
        # per classifier, per older chunk whose last step changed nothing: its pending requests per
        # state then (`_step_chunks` reads it again only once they change)
        self._quiet: dict[str, dict[int, tuple]] = {}
        # per classifier, the chunks whose last step found them finished while still open: each needs
        # one step once it has closed, to be judged closed (`streams.chunk_status`), budget or not
        self._unjudged: dict[str, dict[int, bool]] = {}
        # the classifiers whose older chunks this loop has read once since it started or regained
        # them: only then does `_unjudged` know every chunk finished while open (a restart forgets it)
        self._surveyed: set[str] = set()

    def forget_unowned(self, owned: set[str]) -> None:
        """Drop what this loop remembers of the classifiers not in `owned` (a lease lost: another
        instance steps them meanwhile, so what was remembered may be stale when it comes back)."""
        for cache in (self._seen, self._quiet, self._unjudged, self._finished, self._priors, self._purged,
                      self._request_chunks):
            for key in [k for k in cache if owner_of(k)[0] not in owned]:
                del cache[key]
        self._surveyed.intersection_update(owned)

    def _states(self, cid: str) -> list[tuple[str, int]]:
        """The states of classifier `cid` with the stratum id of their stratum 0."""
        if not self.settings.samples_negatives(cid):
            return [(cid, 0)]
        return [(cid, 0), (negatives_of(cid), self.settings.for_classifier(cid).strata)]

    async def _first_strata(self, cid: str, first: int, chunks: set[int]) -> dict[int, int]:
        """Per chunk, the public id of a side's stratum 0: 0 for the positives (`first` 0), else
        `first_negative_stratum` after the chunk's positive strata."""
        if not first:
            return dict.fromkeys(chunks, 0)
        positive = {cs.chunk: cs.strata for cs in await self.store.chunks(cid, sorted(chunks))}
        return {t: first_negative_stratum(first, positive.get(t, 0)) for t in chunks}

    async def republish_outbox(self, cid: str) -> int:
        """Publish requests recorded but not acknowledged by Kafka before a crash."""
        done = 0
        for sid, first in self._states(cid):
            pending = await self.store.unpublished(sid)
            if not pending:
                continue
            records, at = [], await self._first_strata(cid, first, {int(h["chunk"]) for _, h in pending})
            for rid, h in pending:
                member = orjson.loads(h["item"])
                records.append((cid, request_message(rid, cid, at[int(h["chunk"])] + int(h["stratum"]), member,
                                                     int(h["requested_ms"]), int(h["deadline_ms"]), first == 0)))
            await self.publish(records)
            await self.store.mark_published(sid, [rid for rid, _ in pending])
            done += len(records)
        return done

    async def step(self, cid: str) -> int:
        """One step of the loop for every chunk still sampling; returns the number of requests issued."""
        cfg = self.settings.for_classifier(cid)
        now = int(time.time() * 1000)
        states = self._states(cid)
        by_state: dict[str, list[int]] = {}
        for sid, _ in states:
            await self.store.expire(sid, now)
            by_state[sid] = await self._chunk_ids(sid, cfg, now)
        if await self._forget_if_silent(cid, by_state, cfg, now):
            return 0
        stepped = self._chunks_to_step(cid, set().union(*by_state.values()), cfg, now)
        self._forget_inactive(cid, states, stepped)
        if not stepped:
            return 0
        pending = {sid: await self._pending_by_chunk(sid) for sid, _ in states}
        unpaired = await self.store.unpaired_through(cid) if len(states) > 1 else None
        active, older = stepped[:streams.ACTIVE_CHUNKS], stepped[streams.ACTIVE_CHUNKS:]
        issued = await self._step_chunks(cid, states, pending, active, cfg, now, 0, older=False, unpaired=unpaired)
        # older chunks are read only when the hour's budget has room for them, but for a verdict (and
        # all of them once after a start, which forgot the chunks finished while open)
        if older and cid in self._surveyed and await self._budget_left([sid for sid, _ in states], cfg, now,
                                                                       issued) <= 0:
            unjudged = self._unjudged.get(cid, {})
            older = [t for t in older if t in unjudged and _closed(t, cfg, now)]
        if older:
            issued += await self._step_chunks(cid, states, pending, older, cfg, now, issued, older=True,
                                              unpaired=unpaired)
        self._surveyed.add(cid)
        return issued

    async def _step_chunks(self, cid: str, states, pending: dict, chunks: list[int], cfg, now: int,
                           issued_before: int, older: bool, unpaired: int | None = None) -> int:
        """Step each of `chunks` in turn (an `older` one only until it has finished); `unpaired`:
        the classifier's ``unpaired_through_ms`` (`streams.counted_whole`).

        An older chunk is not even read while it is quiet: closed (no score reaches it), its last
        step issued nothing and left it waiting for answers (some pending, not waiting for budget),
        and its pending requests are the same.  Only the lease holder issues, evaluates and sets
        its status, and an answer, a skip or an expiry changes its pending requests, so nothing it
        is stepped on has changed (with slow reviewers most older chunks are quiet most of the
        time; `bench --loop-pass`)."""
        quiet, waiting = self._quiet.setdefault(cid, {}), {}
        if older:
            waiting = {t: tuple(pending[sid].get(t, 0) for sid, _ in states) for t in chunks}
            chunks = [t for t in chunks if quiet.get(t) != waiting[t]]
            if not chunks:
                return 0
        found = {sid: {cs.chunk: cs for cs in await self.store.chunks(sid, chunks)} for sid, _ in states}
        moved = await self._freeze_closed(found, cfg, now)
        issued = 0
        for t in chunks:
            if t in moved or not streams.counted_whole(t, cfg.chunk_seconds, self.store.lost_through_ms):
                continue  # moved: read again next pass; not counted whole: part of it was lost with Redis
            complete = streams.counted_whole(t, cfg.chunk_seconds, unpaired)
            positive_strata = found[cid][t].strata if t in found[cid] else 0
            sides = _sampled_sides([Side(sid, found[sid].get(t), self.settings.for_classifier(sid),
                                         first and first_negative_stratum(first, positive_strata),
                                         pending[sid].get(t, 0), complete or first == 0) for sid, first in states], cfg)
            live = [sd.cs for sd in sides if sd.cs is not None]
            if not live or sum(cs.N.sum() for cs in live) == 0:
                continue
            if older and self._finished_chunk(cid, t, live, cfg, now):
                continue
            more, status = await self._step_chunk(cid, t, sides, cfg, now, issued_before + issued)
            issued += more
            if not older:
                continue
            if more == 0 and sum(waiting[t]) and status != "waiting_for_budget" and _closed(t, cfg, now):
                quiet[t] = waiting[t]
            else:
                quiet.pop(t, None)
        return issued

    async def _freeze_closed(self, found: dict[str, dict[int, ChunkState]], cfg, now: int) -> set[int]:
        """Keep every provisional side of a closed chunk in its one stratum for good (FREEZE): its
        25 x K items will never come, and only then may it be sampled (it was never sampled, so
        a classifier with fewer predicted positives a chunk got no estimate).  `found` is updated;
        returns the chunks re-stratified meanwhile (their strata changed: read again next pass)."""
        moved = set()
        for sid, by_chunk in found.items():
            for t, cs in list(by_chunk.items()):
                if cs.provisional and _closed(t, cfg, now):
                    if await self.store.freeze(sid, t):
                        by_chunk[t] = dataclasses.replace(cs, provisional=False)
                    else:
                        moved.add(t)
        return moved

    async def _budget_left(self, state_ids: list[str], cfg, now: int, issued: int) -> int:
        """Requests the paced hourly budget of the states `state_ids` still allows after `issued`
        this step (the clock hour's requests, `streams.budget_allowance`)."""
        used = sum([await self.store.issued_this_hour(sid, now) for sid in state_ids])
        return int(streams.budget_allowance(cfg.max_labels_per_hour, (now // 1000) % 3600)) - used - issued

    def _chunks_to_step(self, cid: str, ids: set[int], cfg, now: int) -> list[int]:
        """The chunks this step samples, in the order they draw on the hourly budget: the newest
        that has started and the one before it (oldest first, as always), then the older chunks
        still kept that have not finished (`streams.sampled_chunks`), newest first."""
        sampled = streams.sampled_chunks(ids, cfg.chunk_seconds, now / 1000, cfg.chunk_retention)
        finished = self._finished.setdefault(cid, set())
        finished.intersection_update(ids)
        active = sampled[-streams.ACTIVE_CHUNKS:]
        return active + [t for t in reversed(sampled[:-streams.ACTIVE_CHUNKS]) if t not in finished]

    def _finished_chunk(self, cid: str, t: int, live: list, cfg, now: int) -> bool:
        """Whether older chunk `t` is closed with a `streams.FINISHED` status (its lead side's) judged
        after it closed: then it is noted, and not read again."""
        if live[0].status in streams.FINISHED and live[0].status_closed and _closed(t, cfg, now):
            self._finished[cid].add(t)
            return True
        return False

    async def _forget_if_silent(self, cid: str, by_state: dict[str, list[int]], cfg, now: int) -> bool:
        """Forget a classifier that sent no score for its whole retained history (its newest
        chunk ended `HISTORY_CHUNKS` chunks ago) and awaits no answer: its keys are deleted
        (FORGET, refused if a score came meanwhile; the predicted negatives first) and its id
        leaves ``classifiers``, so it frees its place under ``MAX_CLASSIFIERS``; the state of its
        predicted negatives too when its metrics no longer need them (its requests are moot)."""
        newest = max((ids[-1] for ids in by_state.values() if ids), default=None)
        if newest is None or (newest + 1 + cfg.history_chunks) * cfg.chunk_seconds * 1000 > now:
            return False
        for sid in by_state:
            if await self._pending_by_chunk(sid):
                return False
        doomed = list(by_state.items())
        if len(doomed) == 1:  # the negatives' state of metrics enabled once, if any, goes too
            doomed.append((negatives_of(cid), await self.store.chunk_ids(negatives_of(cid))))
        for sid, ids in reversed(doomed):
            if not await self.store.forget(sid, ids):
                return False
        await self.store.drop_classifier(cid)
        for sid in by_state:
            self._priors.pop(sid, None)
            self._purged.pop(sid, None)
            self._request_chunks.pop(sid, None)
        self._seen.pop(cid, None)
        self._quiet.pop(cid, None)
        self._unjudged.pop(cid, None)
        self._surveyed.discard(cid)
        self._finished.pop(cid, None)
        log.info("forgot a silent classifier", extra={"classifier": cid, "newest_chunk": newest})
        return True

    def _forget_inactive(self, cid: str, states, started: list[int]) -> None:
        """Keep the per-chunk caches of the chunks the loop steps only: a long-running replica
        must not gain an entry per classifier and chunk for good."""
        for cache, key in [(self._seen, cid), (self._quiet, cid), (self._unjudged, cid)] + [
                (self._priors, sid) for sid, _ in states]:
            by_chunk = cache.setdefault(key, {})
            for t in [t for t in by_chunk if t not in started]:
                del by_chunk[t]

    async def _pending_by_chunk(self, sid: str) -> dict[int, int]:
        """The state's outstanding requests per chunk, each request's chunk read once
        (`Store.pending_by_chunk`)."""
        return await self.store.pending_by_chunk(sid, self._request_chunks.setdefault(sid, {}))

    async def _chunk_ids(self, sid: str, cfg, now: int) -> list[int]:
        """The state's chunks, purging those past the retention once per new chunk: the chunks
        purged before are skipped once closed (a late score may still reach an open one)."""
        ids = await self.store.chunk_ids(sid)
        newest, purged_through = self._purged.get(sid, (None, None))
        if len(ids) > cfg.chunk_retention and newest != ids[-1]:
            await self.store.purge_chunks(sid, ids, cfg.chunk_retention, max(cfg.history_chunks, cfg.chunk_retention),
                                          purged_through)
            closed = [t for t in ids[:-cfg.chunk_retention] if _closed(t, cfg, now)]
            self._purged[sid] = (ids[-1], closed[-1] if closed else purged_through)
        return ids

    async def _step_chunk(self, cid: str, t: int, sides: list[Side], cfg, now: int, issued_before: int
                          ) -> tuple[int, str]:
        """The stream design of `stats.streams` for one chunk (both sides when the classifier's
        metrics need its predicted negatives): evaluate, pace or top up, request.  The chunk's
        streak and status live with its lead side (the positives, else the negatives).  Returns
        the requests issued and the chunk's status."""
        lead = next(sd for sd in sides if sd.cs is not None)
        cs0 = lead.cs
        target = _target(cfg, sides)
        N, n, h = (np.concatenate([sd.column(c) for sd in sides]) for c in ("N", "n", "h"))
        thresholds = np.concatenate([sd.column("thresholds") for sd in sides])
        pending = sum(sd.pending for sd in sides)
        now_s, end_s = now / 1000, (t + 1) * cfg.chunk_seconds
        closed = _closed(t, cfg, now)
        total = float(N.sum())
        live = [sd.cs for sd in sides if sd.cs is not None]
        first_s = min(cs.first_ms for cs in live) / 1000
        last_s = max(cs.last_ms for cs in live) / 1000
        flowing = bool(streams.arrivals_flowing(total, first_s, last_s, now_s, end_s, cfg.chunk_seconds)) and not closed
        seen = (total, int(n.sum()), pending, flowing, closed, thresholds.tobytes())
        if self._seen[cid].get(t) == seen and cs0.status != "waiting_for_budget":
            return 0, cs0.status  # nothing the design looks at has changed since the last step
        final = float(streams.expected_final_size(total, first_s, last_s, now_s, end_s, cfg.chunk_seconds))
        halfwidth = float(streams.chunk_interval(N, n, h, cfg.confidence, closed, target).halfwidth)
        # the reported estimators' (the difference estimator's where it is used): the widest interval,
        # its variance over the plain one's and the residual spreads size and allocate the rounds
        halfwidth, ratio, scale = await self._reported(sides, cfg, closed, target, halfwidth, N)
        streak, labels = cs0.streak, int(n.sum())
        if pending == 0 and labels > cs0.evaluated_round:  # a round completed with new labels: evaluate once
            streak = int(stopping.next_streak(streak, halfwidth, cfg.delta))
            await self.store.evaluate_round(lead.state_id, t, labels, streak, cs0.status)
        converged = bool(np.isfinite(halfwidth) and halfwidth <= cfg.delta and streak >= cfg.stop_rounds)
        q = np.concatenate([await self._prior(sd) for sd in sides])
        n_plan, h_plan = _held_as_known(sides, N, n, h, q)
        if n_plan is not n:  # no round past what the sampled side needs at the held side's prior
            converged = float(streams.chunk_interval(N, n_plan, h_plan, cfg.confidence, closed, target).halfwidth
                              ) <= cfg.delta
        tau, want = streams.plan_requests(N, n_plan, h_plan, q, thresholds, N * final / total, flowing, pending == 0,
                                          converged, cfg.delta, cfg.confidence,
                                          allocation.round_size(N.size, cfg.round_labels_per_stratum),
                                          closed=closed, target=target, variance_ratio=ratio, spread_scale=scale)
        due, taus, left = await self._due_by_side(sides, tau, want)
        budget = max(0, await self._budget_left([sd.state_id for sd in sides], cfg, now, issued_before))
        complete = pending == 0 and not due  # the threshold sample is all labelled
        status = str(streams.chunk_status(streak, halfwidth, cfg.delta, cfg.stop_rounds, closed,
                                          left == 0 and complete, len(due) > budget, complete))
        chosen = due[:budget]
        issued = 0
        for sd, tau_side in zip(sides, taus):
            mine = [(new_request_id(sd.state_id), k, orjson.loads(raw), raw) for _, side_id, k, raw in chosen
                    if side_id == sd.state_id]
            if mine:
                issued += await self._request(cid, sd, now, mine, tau_side)
        if chosen or status != cs0.status or closed != cs0.status_closed:
            await self.store.set_status(lead.state_id, t, status, closed)
        unjudged = self._unjudged.setdefault(cid, {})
        if status in streams.FINISHED and not closed:
            unjudged[t] = True
        else:
            unjudged.pop(t, None)
        # remembered only once every write of the step went through: a step cut short plans again
        self._seen[cid][t] = seen
        return issued, status

    async def _due_by_side(self, sides: list[Side], tau: np.ndarray, want: np.ndarray
                           ) -> tuple[list, list, int]:
        """`_due` for each side's slice of the chunk's strata: the due items of both sides, the most
        urgent first, each side's thresholds (None for a side with no items or held), the items left."""
        due, taus, left, at = [], [], 0, 0
        for sd in sides:
            k = sd.strata
            if sd.cs is not None and not sd.held:
                d, tau_side, left_side = await self._due(sd, tau[at:at + k], want[at:at + k])
                due += d
                left += left_side
                taus.append(tau_side)
            else:
                taus.append(None)
            at += k
        due.sort(key=lambda d: d[0])
        return due, taus, left

    async def _request(self, cid: str, sd: Side, now: int, requests: list, tau: np.ndarray) -> int:
        """Record one side's requests and the thresholds they were drawn under (outbox), publish, mark."""
        cs, cfg = sd.cs, sd.cfg
        deadline = now + int(cfg.label_timeout_seconds * 1000)
        issued = await self.store.issue(sd.state_id, cs.chunk, now, deadline, cs.round + 1, self.instance,
                                        [[rid, k, m["i"], repr(float(m["s"])), raw] for rid, k, m, raw in requests], {},
                                        int(cfg.request_retention_seconds * 1000), tau)
        if issued is None:
            log.warning("lost the lease while issuing", extra={"classifier": cid})
            return 0
        ok = set(issued)
        records = [(cid, request_message(rid, cid, sd.first_stratum + k, m, now, deadline, sd.positive))
                   for rid, k, m, _ in requests if rid in ok]
        await self.publish(records)
        await self.store.mark_published(sd.state_id, issued)
        return len(issued)

    async def _reported(self, sides: list[Side], cfg, closed: bool, target, plain_halfwidth: float, N: np.ndarray
                        ) -> tuple[float, float, np.ndarray | None]:
        """(half-width, variance ratio, spread scale) of the chunk's widest reported interval among
        the metrics with a population in it (`N` per stratum, as `confusion.Target.widest`):
        `plain_halfwidth`, 1 and None unless the difference estimator is reported for some enabled
        metric (`labels.calibrated.chunk_calibrations`)."""
        metrics = ("precision",) if target is None else target.metrics
        if target is None and not sides[0].positive:
            return plain_halfwidth, 1.0, None
        found = await chunk_calibrations(self.store, [(sd.state_id, sd.cs, sd.positive) for sd in sides], cfg, closed,
                                         metrics)
        if found is None or not any(c.active for c in found.values()):
            return plain_halfwidth, 1.0, None
        if target is not None:
            found = {m: c for m, c in found.items() if population(m, N, target.positive) > 0} or found
        widest = max(found.values(), key=lambda c: float(np.nan_to_num(c.interval.halfwidth, nan=np.inf)))
        halfwidth = float(widest.interval.halfwidth)
        return halfwidth, widest.variance_ratio, widest.allocation_scale

    async def _prior(self, sd: Side) -> np.ndarray:
        """Mean calibrated score per stratum of one side (the allocation's prior), 1/2 where unknown;
        re-read from the chunk's histogram when the chunk has grown by a tenth."""
        if sd.cs is None:
            return np.full(1, 0.5)
        cid, cs, cfg = sd.state_id, sd.cs, sd.cfg
        total = float(cs.N.sum())
        cached = self._priors.setdefault(cid, {}).get(cs.chunk)
        if cached is not None and total <= 1.1 * cached[0] and cached[1].size == cs.strata:
            return cached[1]
        counts = await self.store.chunk_histogram(cid, cs.chunk)
        q = np.full(cs.strata, 0.5)
        if counts.any() and np.isfinite(cs.min) and np.isfinite(cs.max):
            hist = ScoreHistogram(counts=counts, min=cs.min, max=cs.max)
            q = stratum_mean_probability(hist, cs.cuts, cfg.score_kind)
        self._priors[cid][cs.chunk] = (total, q)
        return q

    async def _due(self, sd: Side, tau: np.ndarray, want: np.ndarray
                   ) -> tuple[list[tuple[float, str, int, str]], np.ndarray, int]:
        """Unrequested reservoir items at or below each stratum's threshold, after
        raising the thresholds of the strata a round wants `want` more labels from.

        Returns the due items as (urgency, state id, stratum, member), the most urgent first
        (lowest priority relative to its threshold), the thresholds, and the
        number of items left above them.  Items above a threshold were never
        requested (requests only ever go to items at or below it).  A full
        reservoir keeps nothing above its largest priority, so no threshold
        rises past it (the design's cap on labels per stratum and chunk)."""
        cid, cs, cfg = sd.state_id, sd.cs, sd.cfg
        tau = np.array(tau, dtype=float)
        windows = await self.store.reservoir_windows(cid, cs.chunk, tau, want)
        below = [(k, raw, p) for k, w in enumerate(windows) for raw, p in w.below]
        taken = await self.store.sampled(cid, cs.chunk, [orjson.loads(raw)["i"] for _, raw, _ in below])
        due = [(p / max(tau[k], 1e-300), k, raw) for (k, raw, p), t in zip(below, taken) if not t]
        left = 0
        for k, w in enumerate(windows):
            raised = streams.threshold_after(tau[k], [p for _, p in w.above], int(want[k]))
            if w.size >= cs.effective_reservoir_size(cfg.reservoir_size):
                raised = min(raised, w.largest)
            tau[k] = max(cs.thresholds[k], raised)
            due += [(p / max(tau[k], 1e-300), k, raw) for raw, p in w.above if p <= tau[k]]
            left += w.above_count - sum(1 for _, p in w.above if p <= tau[k])
        due.sort()
        return [(u, cid, k, raw) for u, k, raw in due], tau, left


def _lateness(cfg) -> float:
    return float(getattr(cfg, "allowed_lateness_seconds", 300))


def _closed(t: int, cfg, now_ms: int) -> bool:
    """Whether chunk `t` is closed at `now_ms`: no score can reach it any more."""
    return bool(streams.is_closed(now_ms / 1000, (t + 1) * cfg.chunk_seconds, _lateness(cfg)))


def _target(cfg, sides: list[Side]):
    """What the chunk's design aims at: None (today's precision design) for a classifier that
    samples only its predicted positives, else its metrics over both sides' strata."""
    if len(sides) == 1:
        return None
    positive = np.concatenate([np.full(sd.strata, sd.positive) for sd in sides])
    return Target(cfg.metrics.split(","), positive)


def _held_as_known(sides: list[Side], N: np.ndarray, n: np.ndarray, h: np.ndarray, q: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The labels the design plans with: a held side's stratum counts as labelled whole, its
    positives its prior's (score-based pseudo-observations, as `opt_track` uses before labels
    arrive), so the rounds go to the strata that can be sampled (a round would otherwise go to
    the held stratum, the one without a label, and never be issued) and allocate for the metrics
    at the positives' expected share; the rounds end once that plan's interval is within delta
    (the sampled side has what it needs).  Only the plan: the reported interval stays undefined."""
    held = np.concatenate([np.full(sd.strata, sd.held) for sd in sides])
    if not held.any():
        return n, h
    return np.where(held, N, n), np.where(held, q * N, h)


def _sampled_sides(sides: list[Side], cfg) -> list[Side]:
    """The sides of a chunk the loop steps now.  A provisional side (one stratum until 25 x K of
    its items have arrived and RESTRATIFY sets its strata) is never sampled (`_due_by_side`) but
    is stepped *held* beside a final one: its items count in the design, its stratum has no
    label, so no interval is reported and the chunk cannot converge, while the final side is
    sampled meanwhile (else a rare-positive chunk's negatives paused from its first predicted
    positive to its 100th, on a slow stream all chunk long).  While the negatives' side is
    provisional, the positives' is sampled alone for precision if enabled (today's precision
    design).  Nothing while no side is final.  Negatives that are not `complete` are never sampled:
    the positives alone, for precision if enabled, else nothing."""
    if not all(sd.complete for sd in sides):
        sides = sides[:1] if "precision" in cfg.metrics.split(",") else []
    if not any(sd.held for sd in sides):
        return sides
    if not any(sd.cs is not None and not sd.held for sd in sides):
        return []
    positives = sides[0]
    if not positives.held and "precision" in cfg.metrics.split(","):
        return [positives]
    return sides
