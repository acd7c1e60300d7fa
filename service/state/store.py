"""The Redis adapter: every Redis call of the service, typed calls around the atomic
scripts (`scripts`, ``lua/*.lua``) and the reads the request loop, the HTTP API and the
metrics collector need.  Key names come from `keys.Keys`.  Holds no state of its own
that another instance would need (only script SHAs and when it last registered each
classifier).

On a Redis Cluster (``redis.asyncio.RedisCluster``) every script call keeps its keys in one
classifier's slot; the cluster client refuses scripts in a pipeline, so a batch's script
calls go as one pipeline per node, and what a node refused (slots moving, a restarted node)
again classifier by classifier through the cluster client (`dispatch.ScriptCalls`, which
`Store` extends, as it does `reads.Reads`).  Plain reads and writes still go in (cluster)
pipelines, which the client splits by node."""

from __future__ import annotations

import time

import numpy as np
import orjson
from redis.asyncio import Redis, RedisCluster

from ..stats.sketch import ScoreHistogram
from .dispatch import ScriptCalls
from .keys import UNKNOWN_LABELS_SCOPE, Keys, ingest_chunks, owner_of
from .reads import Reads
from .records import ChunkCuts, ChunkState, ReservoirWindow, histogram_counts
from .scripts import decode_ingest

__all__ = ["ChunkCuts", "ChunkState", "MAX_STRATA", "ReservoirWindow", "Store"]

MAX_STRATA = 20  # the largest STRATAMETER_STRATA allowed
#: A classifier is added to the service-wide set at most this often per process, not with every
#: batch, so the set's slot does not take a write per batch (a forgotten classifier that comes
#: back is listed again within this time).
REGISTER_EVERY_S = 30.0


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Store(Reads, ScriptCalls):
    """Every Redis call of the service.  Key names come from `keys.Keys`; each script gets
    every key it touches in KEYS (see `scripts`)."""

    def __init__(self, redis: Redis | RedisCluster, prefix: str) -> None:
        super().__init__(redis)
        self.keys = Keys(prefix)
        self._registered: dict[str, float] = {}  # classifier -> time.monotonic() of its last SADD
        #: this process's copy of the service-wide ``lost_through_ms`` (`app.state_watch`)
        self.lost_through_ms: int | None = None
        #: the scores and labels topics the state's offsets were first written from (`noted_topics`);
        #: None: not read yet (the configured ones)
        self.first_topics: tuple[str, str] | None = None

    def forget_registrations(self) -> None:
        """Add every classifier to the set again at its next batch (the set was lost)."""
        self._registered.clear()

    def _unregistered(self, owners: set[str]) -> list[str]:
        """The classifiers of `owners` this process has not added to the set for `REGISTER_EVERY_S`."""
        now = time.monotonic()
        if len(self._registered) > 1024:
            self._registered = {c: t for c, t in self._registered.items() if now - t < REGISTER_EVERY_S}
        return [c for c in owners if now - self._registered.get(c, -REGISTER_EVERY_S) >= REGISTER_EVERY_S]

    # ---- ingest -------------------------------------------------------------------------
    async def scores_offsets(self, cids: list[str], partition) -> dict[str, int]:
        """INGEST's stored offset of each state on `partition` (-1: none)."""
        return await self._stored_offsets(self.keys.scores_offsets, cids, partition)

    async def labels_offsets(self, cids: list[str], partition) -> dict[str, int]:
        """LABEL's stored offset of each state on `partition` (-1: none)."""
        return await self._stored_offsets(self.keys.labels_offsets, cids, partition)

    async def _stored_offsets(self, key_of, cids: list[str], partition) -> dict[str, int]:
        vals = await self._hgets([key_of(cid) for cid in cids], str(partition))
        return {cid: int(v) if v is not None else -1 for cid, v in zip(cids, vals)}

    async def chunk_strata(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], ChunkCuts | None]:
        """Cuts, cuts version and provisional flag of each (cid, chunk); None if not opened."""
        pipe = self.redis.pipeline(transaction=False)
        for cid, t in pairs:
            pipe.hmget(self.keys.chunk_meta(cid, t), "cuts", "cuts_version", "provisional")
        out: dict[tuple[str, int], ChunkCuts | None] = {}
        for p, (cuts, version, prov) in zip(pairs, await pipe.execute()):
            out[p] = None if cuts is None else ChunkCuts(
                np.asarray(orjson.loads(cuts), dtype=float), int(version or 0), prov == b"1")
        return out

    async def open_chunk(self, cid: str, t: int, cuts: np.ndarray, now_ms: int, reservoir_size: int,
                         provisional: bool = False) -> ChunkCuts:
        """Open a chunk with `cuts` (one stratum and the provisional flag if `provisional`) and
        its reservoirs' size unless it is open already; returns the stored cuts (the first opener's)."""
        cuts_raw, version, prov = await self._scripts["OPEN_CHUNK"](
            keys=[self.keys.chunk_meta(cid, t)],
            args=[orjson.dumps(cuts.tolist()), now_ms, "1" if provisional else "0", reservoir_size])
        return ChunkCuts(np.asarray(orjson.loads(cuts_raw), dtype=float), int(version), prov == b"1")

    async def restratify(self, cid: str, t: int, version: int, cuts: np.ndarray) -> bool:
        """Give a provisional chunk its final `cuts` (RESTRATIFY) if it is still provisional
        at `version`; False if it is not (re-stratified by another instance): reload its cuts."""
        done, _ = await self._scripts["RESTRATIFY"](keys=self.keys.restratify_keys(cid, t, cuts.size + 1),
                                                    args=[version, orjson.dumps(cuts.tolist())])
        return int(done) == 1

    async def freeze(self, cid: str, t: int) -> bool:
        """Keep a provisional chunk that has closed in its one stratum for good (FREEZE), so it
        can be sampled; False if it is not provisional any more (re-stratified meanwhile)."""
        return int(await self._scripts["FREEZE"](keys=self.keys.freeze_keys(cid, t))) == 1

    async def chunk_score_histogram(self, cid: str, t: int) -> ScoreHistogram | None:
        """The score histogram of chunk `t` (None while it has none)."""
        pipe = self.redis.pipeline(transaction=False)
        self._queue_histogram(pipe, cid, t)
        pipe.hmget(self.keys.chunk_meta(cid, t), "min", "max")
        packed, legacy, (lo, hi) = await pipe.execute()
        counts = histogram_counts(packed, legacy)
        if not counts.any() or lo is None or hi is None:
            return None
        return ScoreHistogram(counts=counts, min=float(lo), max=float(hi))

    async def recent_histogram(self, cid: str, before: int) -> ScoreHistogram | None:
        """The histogram of the latest chunk before `before` (the drift-following sketch)."""
        prev = await self.redis.zrevrangebyscore(self.keys.chunks(cid), f"({before}", "-inf", start=0, num=1)
        if not prev:
            return None
        return await self.chunk_score_histogram(cid, int(prev[0]))

    async def apply_ingest(self, calls: list[tuple]
                           ) -> list[tuple[bool, int, list[tuple[int, int, float]], list[tuple[int, int]]]]:
        """INGEST for (cid, partition, expected_offset, new_offset, payload[, chunks]) in one pipeline;
        `chunks` (`keys.ingest_chunks`, else read from the payload) name the KEYS.  Returns
        (applied, stored_offset, cutoffs, refused) per call: not applied, another writer moved the
        offset or, if `refused` lists (chunk, reason), a chunk's guard refused (1: stale cuts; 2:
        re-stratify the provisional chunk first; 3: its histogram is not what the payload's runs
        expect, `ingest.bins`); the caller re-aggregates from `stored_offset`.  `payload`:
        `scripts.encode_ingest`'s.
        `cutoffs`: (chunk, stratum, largest priority kept) of the full reservoirs touched."""
        if not calls:
            return []
        ingests = [(self.keys.ingest_keys(cid, hint[0] if hint else ingest_chunks(decode_ingest(payload))),
                    [part, expected, new, *payload]) for cid, part, expected, new, payload, *hint in calls]
        owners = {owner_of(c[0])[0] for c in calls}  # a classifier's predicted negatives are not a classifier
        due = self._unregistered(owners)
        res = await self._each("INGEST", ingests, (lambda pipe: pipe.sadd(self.keys.classifiers, *due)) if due else None)
        self._registered.update((c, time.monotonic()) for c in due)
        return [(True, int(r[1]), [(int(r[i]), int(r[i + 1]), float(r[i + 2])) for i in range(2, len(r) - 2, 3)], [])
                if int(r[0]) == 1 else
                (False, int(r[1]), [], [(int(r[i]), int(r[i + 1])) for i in range(2, len(r) - 1, 2)])
                for r in res]

    # ---- service-wide counts (GLOBAL_COUNT, offset-guarded per scope and partition) -----
    async def count_invalid(self, topic: str, partition: int, expected: int, new: int,
                            counts: dict[str, int]) -> tuple[bool, int]:
        """Add rejected records of `topic` by reason if the stored offset is `expected`;
        (applied, stored offset)."""
        return await self._count_global(topic, self.keys.invalid, partition, expected, new,
                                        {f"{topic}|{reason}": c for reason, c in counts.items()})

    async def invalid_offset(self, topic: str, partition: int) -> int:
        return await self._global_offset(topic, partition)

    async def count_unknown_labels(self, partition: int, expected: int, new: int, count: int) -> tuple[bool, int]:
        """Add labels whose request id names no classifier, like `count_invalid`."""
        return await self._count_global(UNKNOWN_LABELS_SCOPE, self.keys.labels_unknown, partition, expected, new,
                                        {"unknown": count} if count else {})

    async def unknown_labels_offset(self, partition: int) -> int:
        return await self._global_offset(UNKNOWN_LABELS_SCOPE, partition)

    async def unknown_labels(self) -> int:
        """Labels whose request id names no classifier, service-wide."""
        return int(await self.redis.hget(self.keys.labels_unknown, "unknown") or 0)

    async def _count_global(self, scope: str, counts_key: str, partition: int, expected: int, new: int,
                            counts: dict[str, int]) -> tuple[bool, int]:
        args = [partition, expected, new, *(x for pair in counts.items() for x in pair)]
        r = await self._scripts["GLOBAL_COUNT"](keys=[self.keys.global_offsets(scope), counts_key], args=args)
        return int(r[0]) == 1, int(r[1])

    async def _global_offset(self, scope: str, partition: int) -> int:
        v = await self.redis.hget(self.keys.global_offsets(scope), str(partition))
        return int(v) if v is not None else -1

    # ---- labels -------------------------------------------------------------------------
    async def apply_labels(self, calls: list[tuple[str, int, int, str, str, int, str]],
                           applied: dict | None = None) -> list[list]:
        """LABEL for (cid, partition, offset, request_token, label, now_ms, labeler) in one pipeline;
        `applied`: (cid, partition) -> the offset last seen applied for them (a state gone back
        below it answers ``rolled_back``).

        Each request's chunk is read first (its chunk keys go into KEYS); a call whose request
        changed meanwhile is refused by the script and retried here, with every later call of
        its classifier and partition (refused with it, so the offsets stay in order)."""
        out: list[list] = [[] for _ in calls]
        todo = list(range(len(calls)))
        while todo:
            chunks = await self._hgets([self.keys.request(calls[i][0], calls[i][3]) for i in todo], "chunk")
            labels, previous = [], {}
            for i, chunk in zip(todo, chunks):
                cid, part, off, rid, label, now_ms, labeler = calls[i]
                t = _text(chunk) or ""
                labels.append((self.keys.label_keys(cid, rid, t),
                               [part, off, rid, label, now_ms, labeler, t, previous.get((cid, part), ""),
                                (applied or {}).get((cid, part), "")]))
                previous[(cid, part)] = off
            retry = []
            for i, r in zip(todo, await self._each("LABEL", labels)):
                r = [_text(x) for x in r]
                if r[0] == "retry":
                    retry.append(i)
                else:
                    out[i] = r
            todo = retry
        return out

    # ---- request loop -------------------------------------------------------------------
    async def acquire_lease(self, cid: str, instance: str, ttl_ms: int) -> bool:
        return bool(await self._scripts["LEASE"](keys=[self.keys.lease(cid)], args=[instance, ttl_ms]))

    async def acquire_leases(self, cids: list[str], instance: str, ttl_ms: int) -> list[bool]:
        """`acquire_lease` for each of `cids`, in one pipeline (per classifier on a cluster)."""
        calls = [([self.keys.lease(cid)], [instance, ttl_ms]) for cid in cids]
        return [bool(int(r)) for r in await self._each("LEASE", calls)] if calls else []

    async def release_lease(self, cid: str, instance: str) -> bool:
        return bool(await self._scripts["RELEASE"](keys=[self.keys.lease(cid)], args=[instance]))

    async def lease_holders(self, cids: list[str]) -> dict[str, str | None]:
        if not cids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for cid in cids:
            pipe.get(self.keys.lease(cid))
        return {cid: (v.decode() if v is not None else None) for cid, v in zip(cids, await pipe.execute())}

    async def heartbeat(self, instance: str, now_ms: int, window_ms: int) -> list[str]:
        """Record this instance as alive; return the instances alive within `window_ms`."""
        key = self.keys.instances
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(key, {instance: now_ms})
        pipe.zremrangebyscore(key, "-inf", now_ms - 10 * window_ms)
        pipe.zrangebyscore(key, now_ms - window_ms, "+inf")
        *_, live = await pipe.execute()
        return sorted(m.decode() for m in live)

    async def leave(self, instance: str) -> None:
        await self.redis.zrem(self.keys.instances, instance)

    async def expire(self, cid: str, now_ms: int) -> int:
        """Expire the requests due at `now_ms` (EXPIRE); the number due.  The due requests and
        their chunks are read first and re-checked by the script; read again if they changed."""
        k = self.keys
        while True:
            due = [_text(r) for r in await self.redis.zrangebyscore(k.pending(cid), "-inf", now_ms)]
            if not due:  # nothing to re-check: no script call (a step of every owned classifier reads this)
                return 0
            chunks = [_text(c) or "" for c in await self._hgets([k.request(cid, rid) for rid in due], "chunk")]
            keys = [k.pending(cid), k.counters(cid)] + [k.request(cid, rid) for rid in due]
            replace: dict[str, int] = {}  # chunk -> index of its replace hash in KEYS (1-based)
            args: list = [now_ms]
            for rid, t in zip(due, chunks):
                if t and t not in replace:
                    replace[t] = len(keys) + len(replace) + 1
                args += [rid, t, replace.get(t, 0)]
            keys += [k.chunk_replace(cid, t) for t in replace]
            n = int(await self._scripts["EXPIRE"](keys=keys, args=args))
            if n >= 0:
                return n

    async def unpublished(self, cid: str) -> list[tuple[str, dict]]:
        """Requests written but not yet marked published (the outbox)."""
        rids = [r.decode() for r in await self.redis.zrange(self.keys.pending(cid), 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for rid in rids:
            pipe.hgetall(self.keys.request(cid, rid))
        out = []
        for rid, h in zip(rids, await pipe.execute()):
            h = {k.decode(): v.decode() for k, v in h.items()}
            if h.get("state") == "new":
                out.append((rid, h))
        return out

    async def reservoirs(self, cid: str, t: int, strata: int) -> list[list[tuple[str, float]]]:
        """Every stratum's reservoir as (member, priority), lowest priority first."""
        pipe = self.redis.pipeline(transaction=False)
        for k in range(strata):
            pipe.zrange(self.keys.reservoir(cid, t, k), 0, -1, withscores=True)
        return [[(m.decode(), float(p)) for m, p in res] for res in await pipe.execute()]

    async def reservoir_windows(self, cid: str, t: int, thresholds, extra) -> list["ReservoirWindow"]:
        """Per stratum: the reservoir members at or below the threshold, the first
        `extra[k]` above it (the candidates of a round), how many lie above it,
        the reservoir's size and its largest priority."""
        pipe = self.redis.pipeline(transaction=False)
        for k, tau in enumerate(thresholds):
            key = self.keys.reservoir(cid, t, k)
            pipe.zrangebyscore(key, "-inf", repr(float(tau)), withscores=True)
            pipe.zrangebyscore(key, f"({float(tau)!r}", "+inf", start=0, num=max(int(extra[k]), 0), withscores=True)
            pipe.zcount(key, f"({float(tau)!r}", "+inf")
            pipe.zrange(key, -1, -1, withscores=True)
            pipe.zcard(key)
        raw = await pipe.execute()
        out = []
        for k in range(len(thresholds)):
            below, above, above_count, last, size = raw[5 * k: 5 * k + 5]
            if int(extra[k]) <= 0:
                above = []
            out.append(ReservoirWindow([(m.decode(), float(p)) for m, p in below],
                                       [(m.decode(), float(p)) for m, p in above], int(above_count), int(size),
                                       float(last[0][1]) if last else float("inf")))
        return out

    async def pending_by_chunk(self, cid: str, known: dict[str, int] | None = None) -> dict[int, int]:
        """Outstanding requests per chunk.  `known` (request id -> chunk, the caller's between
        calls) spares the read of each request's chunk after the first: a request never changes
        chunk, so with slow reviewers a step reads the pending ids, not every pending request
        again.  It is left holding exactly the pending requests whose chunk was found."""
        rids = [r.decode() for r in await self.redis.zrange(self.keys.pending(cid), 0, -1)]
        memo = {} if known is None else known
        new = [rid for rid in rids if rid not in memo]
        if new:
            for rid, chunk in zip(new, await self._hgets([self.keys.request(cid, rid) for rid in new], "chunk")):
                if chunk is not None:
                    memo[rid] = int(chunk)
        out: dict[int, int] = {}
        for rid in rids:
            t = memo.get(rid)
            if t is not None:
                out[t] = out.get(t, 0) + 1
        if known is not None and len(known) > sum(out.values()):  # answered or expired since: forgotten
            live = set(rids)
            for rid in [r for r in known if r not in live]:
                del known[rid]
        return out

    async def set_status(self, cid: str, t: int, status: str, closed: bool) -> None:
        """The chunk's status as the request loop last saw it (derived state, not guarded), and
        whether it saw the chunk closed (`ChunkState.status_closed`)."""
        await self.redis.hset(self.keys.chunk_meta(cid, t), mapping={"status": status, "status_closed": int(closed)})

    async def sampled(self, cid: str, t: int, item_ids: list[str]) -> list[bool]:
        if not item_ids:
            return []
        return [bool(x) for x in await self.redis.smismember(self.keys.chunk_sampled(cid, t), item_ids)]

    async def issue(self, cid: str, t: int, now_ms: int, deadline_ms: int, round_no: int, fence: str,
                    requests: list[list], replaced: dict[int, int], retention_ms: int,
                    thresholds: np.ndarray | None = None) -> list[str] | None:
        """Record a round's requests (ISSUE) and the thresholds they were drawn under;
        None if this instance lost the lease."""
        args = [str(t), now_ms, deadline_ms, now_ms // 3_600_000, round_no, fence,
                orjson.dumps(requests), orjson.dumps({str(k): v for k, v in replaced.items()}), retention_ms]
        if thresholds is not None:
            args.append(orjson.dumps([float(x) for x in thresholds]))
        res = await self._scripts["ISSUE"](keys=self.keys.issue_keys(cid, t, [r[0] for r in requests]), args=args)
        if res and not isinstance(res[0], bytes) and int(res[0]) == -1:
            return None
        return [r.decode() for r in res]

    async def mark_published(self, cid: str, rids: list[str]) -> None:
        if rids:
            await self._scripts["MARK_PUBLISHED"](keys=[self.keys.request(cid, rid) for rid in rids])

    async def evaluate_round(self, cid: str, t: int, round_no: int, streak: int, status: str) -> bool:
        return bool(await self._scripts["EVALUATE_ROUND"](
            keys=[self.keys.chunk_meta(cid, t)], args=[round_no, streak, status]))

    async def issued_this_hour(self, cid: str, now_ms: int) -> int:
        v = await self.redis.hget(self.keys.hourly(cid), str(now_ms // 3_600_000))
        return int(v) if v is not None else 0

    async def purge_chunks(self, cid: str, ids: list[int], keep_full: int, keep_history: int,
                           purged_through: int | None = None) -> int:
        """Bound a classifier's memory by time as well as by stream length: chunks
        older than the newest `keep_full` lose their reservoirs, sampled sets and
        histograms (no longer needed); chunks older than the newest `keep_history`
        are deleted.  `purged_through`: the newest chunk an earlier call purged that no
        score could reach since (closed), whose keys and those of the chunks before it
        are not deleted again (without it a call deletes the 26 keys of every chunk past
        `keep_full` again: 3,744 at the defaults, once a new chunk a side); a chunk leaving the
        history loses every key (a straggler a late score added goes with it).  Returns the
        number of chunks touched."""
        old = ids[:-keep_full] if len(ids) > keep_full else []
        drop = set(ids[:-keep_history]) if len(ids) > keep_history else set()
        if purged_through is not None:
            old = [t for t in old if t > purged_through or t in drop]
        if not old:
            return 0
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        for t in old:
            pipe.delete(k.chunk_sampled(cid, t), k.chunk_bins(cid, t), k.chunk_hist(cid, t), k.chunk_replace(cid, t),
                        k.chunk_pscores(cid, t), k.chunk_labelled(cid, t), *(k.reservoir(cid, t, s) for s in range(MAX_STRATA)))
            if t in drop:
                pipe.delete(k.chunk_meta(cid, t), k.chunk_items(cid, t), k.chunk_labels(cid, t),
                            k.chunk_positives(cid, t))
                pipe.zrem(k.chunks(cid), t)
        await pipe.execute()
        return len(old)

    async def forget(self, sid: str, ids: list[int]) -> bool:
        """FORGET a state whose newest chunk is still ``ids[-1]``; False if a newer one came.  Its
        acknowledged offsets go after it (another slot: a second call)."""
        keys = self.keys.forget_keys(sid, ids, MAX_STRATA)
        if not await self._scripts["FORGET"](keys=keys, args=[str(ids[-1]) if ids else ""]):
            return False
        await self.redis.delete(self.keys.acknowledged(sid))
        return True

    async def stored_chunk_seconds(self, chunk_seconds: int) -> int:
        """The chunk length the state under this prefix was written with (``settings``), this one
        if none was noted yet (it is noted now)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.settings, "chunk_seconds", chunk_seconds)
        pipe.hget(self.keys.settings, "chunk_seconds")
        return int((await pipe.execute())[1])

    async def noted_topics(self, scores: str, labels: str) -> tuple[str, str]:
        """The scores and labels topics the state's offsets count records of (``settings``
        ``topic_scores``, ``topic_labels``), these if none were noted yet (they are noted now)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.settings, "topic_scores", scores)
        pipe.hsetnx(self.keys.settings, "topic_labels", labels)
        pipe.hmget(self.keys.settings, "topic_scores", "topic_labels")
        noted = (await pipe.execute())[2]
        self.first_topics = noted[0].decode(), noted[1].decode()
        return self.first_topics

    async def begin_state(self, now_ms: int) -> bool:
        """Note when the state under this prefix began (``settings`` ``started_ms``) unless noted;
        True when no state was there before: nothing noted and no classifier (a state written by a
        version before the note has classifiers)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.settings, "started_ms", now_ms)
        pipe.exists(self.keys.classifiers)
        noted, classifiers = await pipe.execute()
        return bool(noted) and not classifiers

    async def note_state_lost(self, through_ms: int, chunk_seconds: int, now_ms: int) -> int:
        """Note that the records of event times up to `through_ms` were counted in a state Redis
        lost (``settings`` ``lost_through_ms``, `chunks.lifecycle.counted_whole`), and the settings
        a start notes, so the loss is seen once (the first topics as this process knows them: the
        offsets written since are under their fields, `app.batch.BatchHandler.offset_field`).  Returns
        the ``started_ms`` noted (this one, or another replica's)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.settings, "chunk_seconds", chunk_seconds)
        if self.first_topics:
            pipe.hsetnx(self.keys.settings, "topic_scores", self.first_topics[0])
            pipe.hsetnx(self.keys.settings, "topic_labels", self.first_topics[1])
        pipe.hsetnx(self.keys.settings, "started_ms", now_ms)
        pipe.hset(self.keys.settings, "lost_through_ms", through_ms)
        pipe.hget(self.keys.settings, "started_ms")
        return int((await pipe.execute())[-1])

    async def note_applied(self, marks: dict[str, tuple[int, int]]) -> list[int | None]:
        """Raise the applied marks (``applied``: field ``<topic>:<partition>`` -> the next offset to
        read): `marks` maps a field to the mark this process noted last (-1: none) and the new one.
        A mark below the last one noted is left as it is (Redis rolled back).  Returns each field's
        mark before (None: none)."""
        args = [x for field, (last, new) in marks.items() for x in (field, last, new)]
        before = await self._scripts["NOTE_APPLIED"](keys=[self.keys.applied], args=args)
        return [None if b is None else int(b) for b in before]

    async def note_acknowledged(self, by_state: dict[str, dict[str, int]]) -> None:
        """Raise the service-wide copy of the offsets each state's guards acknowledged
        (``acknowledged:<sid>``, `state.offsets.Acknowledged`), never lower it."""
        if not by_state:
            return
        args: list = []
        for fields in by_state.values():
            args.append(len(fields))
            args += [x for pair in fields.items() for x in pair]
        await self._scripts["NOTE_ACKNOWLEDGED"](keys=[self.keys.acknowledged(sid) for sid in by_state], args=args)

    async def acknowledged_offsets(self, sids: list[str], fields: list[str]) -> dict[str, dict[str, int]]:
        """state id -> {field: offset} of the acknowledged offsets noted for `fields` (states with
        none left out).  Each state's whole hash is read (HGETALL: a state has a field for each
        partition it was written from, a few, and naming every assigned partition's field in an
        HMGET made the pipeline slow to pack for thousands of classifiers)."""
        pipe = self.redis.pipeline(transaction=False)
        for sid in sids:
            pipe.hgetall(self.keys.acknowledged(sid))
        wanted = set(fields)
        out: dict[str, dict[str, int]] = {}
        for sid, noted in zip(sids, await pipe.execute()):
            kept = {f: int(v) for f, v in ((_text(f), v) for f, v in noted.items()) if f in wanted}
            if kept:
                out[sid] = kept
        return out

    async def lower_applied(self, field: str, offset: int) -> bool:
        """Lower the applied mark of `field` to `offset` (a classifier's state went back there)."""
        return bool(await self._scripts["LOWER_APPLIED"](keys=[self.keys.applied], args=[field, offset]))

    async def applied_marks(self, fields: list[str]) -> list[int | None]:
        """The applied marks of `fields` (None: none noted)."""
        return [None if v is None else int(v) for v in await self.redis.hmget(self.keys.applied, fields)]

    async def drop_classifier(self, cid: str) -> None:
        self._registered.pop(cid, None)
        await self.redis.srem(self.keys.classifiers, cid)
