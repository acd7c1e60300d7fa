"""The online OPT loop of one classifier (Bennett & Carvalho 2010, Fig. 1),
driven by events instead of a timer.

A chunk's population grows while it is sampled, so the loop runs the stream
design of `stats.streams` (threshold sampling: the sample is every item whose
reservoir priority is at or below its stratum's threshold).  One step, for the
newest chunk that has started, the one before it, and every older chunk whose
reservoirs are kept and that has not finished (`lifecycle.sampled_chunks`: slow
reviewers stretch a chunk's rounds past the next chunk's start): expire overdue requests;
when a round has completed with new labels, evaluate it once (interval,
T-round streak); while items still arrive, raise the thresholds to the paced
target; once arrivals have stopped or the chunk has closed, run an online OPT
round (allocation by the core) by raising thresholds past the next-lowest
priorities; then request every unrequested reservoir item at or below its
threshold, as far as the paced hourly budget allows (and a review group's shared
budget, `requests.group_budget`; an item another member of a group that shares
items asked for is joined, not requested again, `requests.shared_items`): record
the requests in Redis (outbox) and publish them all at once.  Skipped and expired requests
leave the sample (missing at random within the stratum); the next round's
allocation makes up for them.

Only the instance holding the classifier's lease runs its loop; the ISSUE
script checks the lease (fencing) so a paused former owner cannot issue.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import orjson

from ..chunks import lifecycle
from ..chunks.lifecycle import chunk_closed
from ..chunks.plan import ChunkPlan, ChunkSnapshot, Side, chunk_snapshot, plan_chunk, sampled_sides
from ..chunks.report import ChunkReport, chunk_report
from ..labels.calibrated import chunk_calibrations
from ..stats.calibration import stratum_mean_probability
from ..stats.sketch import ScoreHistogram
from ..state.group_store import ItemClaim
from ..state.keys import first_negative_stratum, negatives_of, owner_of
from ..state.process import ProcessState
from ..state.records import ChunkState
from ..state.store import Store
from .due import due_by_side
from .group_budget import GroupGrants
from .memory import ClassifierMemory, Prior, Purge
from .messages import new_request_id, request_message
from .shared_items import FEW_JOINS, NOT_ISSUED, RESOLVE_EVERY_MS, SharedItems

log = logging.getLogger(__name__)

class RequestLoop:
    def __init__(self, store: Store, process: ProcessState, settings, publish) -> None:
        """`publish(list[(key, value)])` sends records to the label-requests topic and waits for acks."""
        self.chunks, self.requests, self.registry, self.process = store.chunks, store.requests, store.registry, process
        self.settings, self.publish, self.instance = settings, publish, settings.instance_id
        self.group_grants = GroupGrants(store.groups, settings)  # a review group's shared budget, if any
        self.shared_items = SharedItems(store, settings)  # and its shared items, if it shares them
        self._memory: dict[str, ClassifierMemory] = {}  # per classifier it steps (`requests.memory`)

    def _remember(self, cid: str) -> ClassifierMemory:
        return self._memory.setdefault(cid, ClassifierMemory())

    def forget_unowned(self, owned: set[str]) -> None:
        """Drop what this loop remembers of the classifiers not in `owned` (a lease lost: another
        instance steps them meanwhile, so what was remembered may be stale when it comes back)."""
        for cid in [cid for cid in self._memory if cid not in owned]:
            del self._memory[cid]

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
        positive = {cs.chunk: cs.strata for cs in await self.chunks.chunk_states(cid, sorted(chunks))}
        return {t: first_negative_stratum(first, positive.get(t, 0)) for t in chunks}

    async def republish_outbox(self, cid: str) -> int:
        """Publish requests recorded but not acknowledged by Kafka before a crash."""
        done = 0
        for sid, first in self._states(cid):
            pending = await self.requests.unpublished(sid)
            if not pending:
                continue
            records, at = [], await self._first_strata(cid, first, {int(h["chunk"]) for _, h in pending})
            for rid, h in pending:
                member = orjson.loads(h["item"])
                records.append((cid, request_message(rid, cid, at[int(h["chunk"])] + int(h["stratum"]), member,
                                                     int(h["requested_ms"]), int(h["deadline_ms"]), first == 0)))
            await self.publish(records)
            await self.requests.mark_published(sid, [rid for rid, _ in pending])
            done += len(records)
        return done

    async def step(self, cid: str) -> int:
        """One step of the loop for every chunk still sampling; returns the number of requests issued."""
        cfg = self.settings.for_classifier(cid)
        now = int(time.time() * 1000)
        states = self._states(cid)
        memory = self._remember(cid)
        resolving = memory.joins_waiting <= FEW_JOINS or now - memory.resolved_ms >= RESOLVE_EVERY_MS
        by_state: dict[str, list[int]] = {}
        waiting = 0
        for sid, _ in states:
            if resolving:
                waiting += await self.shared_items.resolve(sid, now)
            await self.requests.expire(sid, now)
            by_state[sid] = await self._chunk_ids(sid, cfg, now)
        if resolving:
            memory.resolved_ms, memory.joins_waiting = now, waiting
        if await self._forget_if_silent(cid, by_state, cfg, now):
            return 0
        stepped = self._chunks_to_step(cid, set().union(*by_state.values()), cfg, now)
        memory.keep_chunks(stepped)
        if not stepped:
            return 0
        pending = {sid: await self._pending_by_chunk(sid) for sid, _ in states}
        unpaired = await self.chunks.unpaired_through(cid) if len(states) > 1 else None
        active, older = stepped[:lifecycle.ACTIVE_CHUNKS], stepped[lifecycle.ACTIVE_CHUNKS:]
        issued = await self._step_chunks(cid, states, pending, active, cfg, now, 0, older=False, unpaired=unpaired)
        # older chunks are read only when the hour's budget has room for them, but for a verdict (and
        # all of them once after a start, which forgot the chunks finished while open)
        if older and memory.surveyed and await self._budget_left([sid for sid, _ in states], cfg, now, issued) <= 0:
            older = [t for t in older if t in memory.unjudged and chunk_closed(t, cfg, now / 1000)]
        if older:
            issued += await self._step_chunks(cid, states, pending, older, cfg, now, issued, older=True,
                                              unpaired=unpaired)
        memory.surveyed = True
        return issued

    async def _step_chunks(self, cid: str, states, pending: dict, chunks: list[int], cfg, now: int,
                           issued_before: int, older: bool, unpaired: int | None = None) -> int:
        """Step each of `chunks` in turn (an `older` one only until it has finished); `unpaired`:
        the classifier's ``unpaired_through_ms`` (`lifecycle.counted_whole`).

        An older chunk is not even read while it is quiet: closed (no score reaches it), its last
        step issued nothing and left it waiting for answers (some pending, not waiting for budget),
        and its pending requests are the same.  Only the lease holder issues, evaluates and sets
        its status, and an answer, a skip or an expiry changes its pending requests, so nothing it
        is stepped on has changed (with slow reviewers most older chunks are quiet most of the
        time; `bench --loop-pass`)."""
        quiet, waiting = self._remember(cid).quiet, {}
        if older:
            waiting = {t: tuple(pending[sid].get(t, 0) for sid, _ in states) for t in chunks}
            chunks = [t for t in chunks if quiet.get(t) != waiting[t]]
            if not chunks:
                return 0
        found = {sid: {cs.chunk: cs for cs in await self.chunks.chunk_states(sid, chunks)} for sid, _ in states}
        moved = await self._freeze_closed(found, cfg, now)
        issued = 0
        for t in chunks:
            if t in moved or not lifecycle.counted_whole(t, cfg.chunk_seconds, self.process.lost_through_ms):
                continue  # moved: read again next pass; not counted whole: part of it was lost with Redis
            complete = lifecycle.counted_whole(t, cfg.chunk_seconds, unpaired)
            positive_strata = found[cid][t].strata if t in found[cid] else 0
            sides = sampled_sides([Side(sid, found[sid].get(t), self.settings.for_classifier(sid),
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
            if more == 0 and sum(waiting[t]) and status != "waiting_for_budget" and chunk_closed(t, cfg, now / 1000):
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
                if cs.provisional and chunk_closed(t, cfg, now / 1000):
                    if await self.chunks.freeze(sid, t):
                        by_chunk[t] = dataclasses.replace(cs, provisional=False)
                    else:
                        moved.add(t)
        return moved

    async def _budget_left(self, state_ids: list[str], cfg, now: int, issued: int) -> int:
        """Requests the paced hourly budget of the states `state_ids` still allows after `issued`
        this step (the clock hour's requests, `lifecycle.allowance_at`)."""
        used = sum([await self.requests.issued_this_hour(sid, now) for sid in state_ids])
        return lifecycle.allowance_at(cfg.max_labels_per_hour, now) - used - issued

    def _chunks_to_step(self, cid: str, ids: set[int], cfg, now: int) -> list[int]:
        """The chunks this step samples, in the order they draw on the hourly budget: the newest
        that has started and the one before it (oldest first, as always), then the older chunks
        still kept that have not finished (`lifecycle.sampled_chunks`), newest first."""
        sampled = lifecycle.sampled_chunks(ids, cfg.chunk_seconds, now / 1000, cfg.chunk_retention)
        finished = self._remember(cid).finished
        finished.intersection_update(ids)
        active = sampled[-lifecycle.ACTIVE_CHUNKS:]
        return active + [t for t in reversed(sampled[:-lifecycle.ACTIVE_CHUNKS]) if t not in finished]

    def _finished_chunk(self, cid: str, t: int, live: list, cfg, now: int) -> bool:
        """Whether older chunk `t` is closed with a `lifecycle.FINISHED` status (its lead side's) judged
        after it closed: then it is noted, and not read again."""
        if live[0].status in lifecycle.FINISHED and live[0].status_closed and chunk_closed(t, cfg, now / 1000):
            self._remember(cid).finished.add(t)
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
            doomed.append((negatives_of(cid), await self.chunks.chunk_ids(negatives_of(cid))))
        for sid, ids in reversed(doomed):
            if not await self.requests.forget(sid, ids):
                return False
        await self.registry.drop_classifier(cid)
        self._memory.pop(cid, None)
        log.info("forgot a silent classifier", extra={"classifier": cid, "newest_chunk": newest})
        return True

    async def _pending_by_chunk(self, sid: str) -> dict[int, int]:
        """The state's pending requests per chunk, each request's chunk read once (`RequestStore.pending_by_chunk`)."""
        chunks = self._remember(owner_of(sid)[0]).request_chunks.setdefault(sid, {})
        return await self.requests.pending_by_chunk(sid, chunks)

    async def _chunk_ids(self, sid: str, cfg, now: int) -> list[int]:
        """The state's chunks, purging those past the retention once per new chunk: the chunks
        purged before are skipped once closed (a late score may still reach an open one)."""
        ids = await self.chunks.chunk_ids(sid)
        purges = self._remember(owner_of(sid)[0]).purges
        last = purges.get(sid)
        purged_through = last.purged_through if last is not None else None
        if len(ids) > cfg.chunk_retention and (last is None or last.newest != ids[-1]):
            await self.requests.purge_chunks(sid, ids, cfg.chunk_retention,
                                             max(cfg.history_chunks, cfg.chunk_retention), purged_through)
            closed = [t for t in ids[:-cfg.chunk_retention] if chunk_closed(t, cfg, now / 1000)]
            purges[sid] = Purge(ids[-1], closed[-1] if closed else purged_through)
        return ids

    async def _step_chunk(self, cid: str, t: int, sides: list[Side], cfg, now: int, issued_before: int
                          ) -> tuple[int, str]:
        """One step of chunk `t` (both sides when the classifier's metrics need its predicted
        negatives): read what changed, plan (`chunks.plan.plan_chunk`), request as far as the
        budget allows, record the status.  The chunk's streak and status live with its lead side
        (the positives, else the negatives).  Returns the requests issued and the chunk's status."""
        memory = self._remember(cid)
        snapshot = chunk_snapshot(t, sides, cfg, now)
        lead = snapshot.lead
        if memory.seen.get(t) == snapshot.key and lead.cs.status != "waiting_for_budget":
            return 0, lead.cs.status  # nothing the design looks at has changed since the last step
        report = await self._report(snapshot, cfg)
        prior = np.concatenate([await self._prior(sd) for sd in sides])
        plan = plan_chunk(snapshot, report, prior, cfg)
        if plan.evaluated:
            await self.chunks.evaluate_round(lead.state_id, t, int(snapshot.n.sum()), plan.streak, lead.cs.status)
        issued, status = await self._carry_out(cid, snapshot, plan, cfg, now, issued_before)
        if status in lifecycle.FINISHED and not snapshot.closed:
            memory.unjudged.add(t)
        else:
            memory.unjudged.discard(t)
        # remembered only once every write of the step went through: a step cut short plans again
        memory.seen[t] = snapshot.key
        return issued, status

    async def _carry_out(self, cid: str, snapshot: ChunkSnapshot, plan: ChunkPlan, cfg, now: int,
                         issued_before: int) -> tuple[int, str]:
        """Request the items due under the plan's thresholds, the most urgent first, as far as the
        hourly budget allows (and, in a review group with a budget, what the group granted:
        `group_grants`); items another member of a group that shares items asked for are joined
        at no cost (`shared_items`).  Record the chunk's status.  Returns the requests published
        and the status."""
        sides, lead = snapshot.sides, snapshot.lead
        due, taus, left = await due_by_side(self.chunks, self.requests, sides, plan.tau, plan.want)
        free = await self.shared_items.free(cid, due)
        joinable = [d for d, f in zip(due, free) if f]
        paid = [d for d, f in zip(due, free) if not f]
        budget = max(0, await self._budget_left([sd.state_id for sd in sides], cfg, now, issued_before))
        budget = await self.group_grants.labels_for(cid, snapshot, plan, cfg, now, len(paid), budget)
        status = plan.status(snapshot, cfg, len(paid), left, budget)
        joining = {d[3] for d in joinable}
        chosen = joinable + paid[:budget]
        issued = 0
        for sd, tau_side in zip(sides, taus):
            mine = [(new_request_id(sd.state_id), k, orjson.loads(raw), raw) for _, side_id, k, raw in chosen
                    if side_id == sd.state_id]
            if mine:
                issued += await self._request(cid, sd, now, mine, tau_side, joining)
        if chosen or status != lead.cs.status or snapshot.closed != lead.cs.status_closed:
            await self.chunks.set_status(lead.state_id, snapshot.chunk, status, snapshot.closed)
        return issued, status

    async def _request(self, cid: str, sd: Side, now: int, requests: list, tau: np.ndarray,
                       joining: set[str]) -> int:
        """Record one side's requests and the thresholds they were drawn under (outbox), publish, mark.
        In a group that shares items the items are CLAIMed first: a joined request is recorded, not
        published, and one of `joining` (members' raw JSON budgeted as joined) that found nothing to
        join is not issued.  Returns the requests published."""
        cs, cfg = sd.cs, sd.cfg
        deadline = now + int(cfg.label_timeout_seconds * 1000)
        joins = await self.shared_items.claim(sd.state_id, deadline, [ItemClaim(m["i"], rid, raw in joining)
                                                                      for rid, _, m, raw in requests])
        requests = [r for r in requests if joins.get(r[0]) != NOT_ISSUED]
        issued = await self.requests.issue(sd.state_id, cs.chunk, now, deadline, cs.round + 1, self.instance,
                                           [[rid, k, m["i"], repr(float(m["s"])), raw, joins.get(rid, "")]
                                            for rid, k, m, raw in requests],
                                           {}, int(cfg.request_retention_seconds * 1000), tau)
        if issued is None:
            log.warning("lost the lease while issuing", extra={"classifier": cid})
            return 0
        ok = {rid for rid in issued if not joins.get(rid)}
        records = [(cid, request_message(rid, cid, sd.first_stratum + k, m, now, deadline, sd.positive))
                   for rid, k, m, _ in requests if rid in ok]
        await self.publish(records)
        await self.requests.mark_published(sd.state_id, [rid for rid in issued if rid in ok])
        return len(ok)

    async def _report(self, snapshot: ChunkSnapshot, cfg) -> ChunkReport:
        """The chunk's report of the strata the loop samples (`chunks.report.chunk_report`), with the
        difference estimator where it is active for an enabled metric
        (`labels.calibrated.chunk_calibrations`): what the stopping rule reads and the rounds are
        sized on."""
        target = snapshot.target
        metrics = ("precision",) if target is None else target.metrics
        sides = [(sd.state_id, sd.cs, sd.positive) for sd in snapshot.sides]
        calibration = await chunk_calibrations(self.chunks, sides, cfg, snapshot.closed, metrics)
        return chunk_report(snapshot.columns, metrics, cfg.confidence, snapshot.closed, calibration)

    async def _prior(self, sd: Side) -> np.ndarray:
        """Mean calibrated score per stratum of one side (the allocation's prior), 1/2 where unknown;
        re-read from the chunk's histogram when the chunk has grown by a tenth."""
        if sd.cs is None:
            return np.full(1, 0.5)
        cid, cs, cfg = sd.state_id, sd.cs, sd.cfg
        total = float(cs.N.sum())
        priors = self._remember(owner_of(cid)[0]).priors.setdefault(cid, {})
        cached = priors.get(cs.chunk)
        if cached is not None and total <= 1.1 * cached.size and cached.q.size == cs.strata:
            return cached.q
        counts = await self.chunks.chunk_histogram(cid, cs.chunk)
        q = np.full(cs.strata, 0.5)
        if counts.any() and np.isfinite(cs.min) and np.isfinite(cs.max):
            hist = ScoreHistogram(counts=counts, min=cs.min, max=cs.max)
            q = stratum_mean_probability(hist, cs.cuts, cfg.score_kind)
        priors[cs.chunk] = Prior(total, q)
        return q
