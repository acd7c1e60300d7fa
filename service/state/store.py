"""The Redis adapter: typed calls around the atomic scripts and the reads the
request loop, the HTTP API and the metrics collector need.  Holds no state of
its own that another instance would need (only script SHAs)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson
from redis.asyncio import Redis

from ..stats.sketch import ScoreHistogram
from . import scripts
from .keys import Keys

MAX_STRATA = 20  # the largest STRATAMETER_STRATA allowed


@dataclass
class ChunkState:
    """One chunk of one classifier as stored."""

    chunk: int
    cuts: np.ndarray
    N: np.ndarray
    n: np.ndarray
    h: np.ndarray
    round: int = 0
    evaluated_round: int = 0
    streak: int = 0
    status: str = "open"
    replace: dict[int, int] = field(default_factory=dict)
    min: float = float("nan")
    max: float = float("nan")
    tau: np.ndarray | None = None  # per stratum the inclusion threshold (stats.streams), None before any request
    first_ms: int = -1  # wall-clock time of the chunk's first and last arrival
    last_ms: int = -1
    provisional: bool = False  # one stratum until its items let RESTRATIFY set its K strata: never sample it

    @property
    def strata(self) -> int:
        return self.cuts.size + 1

    @property
    def thresholds(self) -> np.ndarray:
        tau = np.zeros(self.strata) if self.tau is None else np.asarray(self.tau, dtype=float)
        return tau if tau.size == self.strata else np.zeros(self.strata)


@dataclass
class ReservoirWindow:
    """The part of one stratum's reservoir the request loop needs (see `Store.reservoir_windows`)."""

    below: list[tuple[str, float]]  # (member, priority) at or below the threshold
    above: list[tuple[str, float]]  # the lowest few above it
    above_count: int
    size: int
    largest: float  # the largest priority kept


def _vec(raw: dict, k: int) -> np.ndarray:
    out = np.zeros(k, dtype=np.int64)
    for key, val in raw.items():
        i = int(key)
        if 0 <= i < k:
            out[i] = int(val)
    return out


@dataclass(frozen=True)
class ChunkCuts:
    """A chunk's strata boundaries as stored, with their version (see scripts.RESTRATIFY).

    `provisional`: opened with one stratum (no earlier histogram, opening batch too small);
    its cuts change once, when it is re-stratified, and `version` then increments."""

    cuts: np.ndarray
    version: int = 0
    provisional: bool = False


class Store:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self._scripts = {
            name: redis.register_script(getattr(scripts, name))
            for name in ("INGEST", "OPEN_CHUNK", "LABEL", "EXPIRE", "ISSUE", "MARK_PUBLISHED",
                         "EVALUATE_ROUND", "LEASE", "RELEASE", "GLOBAL_COUNT", "RESTRATIFY")
        }

    # ---- ingest -------------------------------------------------------------------------
    async def scores_offsets(self, cids: list[str], partition: int) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        for cid in cids:
            pipe.hget(f"{self.keys.classifier(cid)}:offsets:scores", str(partition))
        vals = await pipe.execute()
        return {cid: int(v) if v is not None else -1 for cid, v in zip(cids, vals)}

    async def chunk_cuts(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], np.ndarray | None]:
        pipe = self.redis.pipeline(transaction=False)
        for cid, t in pairs:
            pipe.hget(f"{self.keys.chunk(cid, t)}:meta", "cuts")
        vals = await pipe.execute()
        return {p: (np.asarray(orjson.loads(v), dtype=float) if v is not None else None) for p, v in zip(pairs, vals)}

    async def chunk_strata(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], ChunkCuts | None]:
        """Cuts, cuts version and provisional flag of each (cid, chunk); None if not opened."""
        pipe = self.redis.pipeline(transaction=False)
        for cid, t in pairs:
            pipe.hmget(f"{self.keys.chunk(cid, t)}:meta", "cuts", "cuts_version", "provisional")
        out: dict[tuple[str, int], ChunkCuts | None] = {}
        for p, (cuts, version, prov) in zip(pairs, await pipe.execute()):
            out[p] = None if cuts is None else ChunkCuts(
                np.asarray(orjson.loads(cuts), dtype=float), int(version or 0), prov == b"1")
        return out

    async def open_chunk(self, cid: str, t: int, cuts: np.ndarray, now_ms: int,
                         provisional: bool = False) -> ChunkCuts:
        """Open a chunk with `cuts` (one stratum and the provisional flag if `provisional`)
        unless it is open already; returns the stored cuts (the first opener's)."""
        cuts_raw, version, prov = await self._scripts["OPEN_CHUNK"](
            keys=[self.keys.classifier(cid)],
            args=[str(t), orjson.dumps(cuts.tolist()), now_ms, "1" if provisional else "0"])
        return ChunkCuts(np.asarray(orjson.loads(cuts_raw), dtype=float), int(version), prov == b"1")

    async def restratify(self, cid: str, t: int, version: int, cuts: np.ndarray) -> bool:
        """Give a provisional chunk its final `cuts` (RESTRATIFY) if it is still provisional
        at `version`; False if it is not (re-stratified by another instance): reload its cuts."""
        ck = self.keys.chunk(cid, t)
        keys = [f"{ck}:meta", f"{ck}:N", f"{ck}:pscores"] + [f"{ck}:res:{k}" for k in range(cuts.size + 1)]
        done, _ = await self._scripts["RESTRATIFY"](keys=keys, args=[version, orjson.dumps(cuts.tolist())])
        return int(done) == 1

    async def chunk_score_histogram(self, cid: str, t: int) -> ScoreHistogram | None:
        """The score histogram of chunk `t` (None while it has none)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(f"{self.keys.chunk(cid, t)}:hist")
        pipe.hmget(f"{self.keys.chunk(cid, t)}:meta", "min", "max")
        raw, (lo, hi) = await pipe.execute()
        if not raw or lo is None or hi is None:
            return None
        return ScoreHistogram.from_sparse({int(k): int(v) for k, v in raw.items()}, float(lo), float(hi))

    async def recent_histogram(self, cid: str, before: int) -> ScoreHistogram | None:
        """The histogram of the latest chunk before `before` (the drift-following sketch)."""
        stem = self.keys.classifier(cid)
        prev = await self.redis.zrevrangebyscore(f"{stem}:chunks", f"({before}", "-inf", start=0, num=1)
        if not prev:
            return None
        return await self.chunk_score_histogram(cid, int(prev[0]))

    async def apply_ingest(self, calls: list[tuple[str, int, int, int, bytes]]
                           ) -> list[tuple[bool, int, list[tuple[int, int, float]], list[tuple[int, int]]]]:
        """Run INGEST for (cid, partition, expected_offset, new_offset, payload) in one pipeline.

        Returns (applied, stored_offset, cutoffs, refused) per call; not applied means another
        writer moved the offset or, if `refused` lists (chunk, reason), the cuts guard refused
        (reason 1: the payload's cuts are stale; 2: the provisional chunk must be
        re-stratified first): the caller re-aggregates from `stored_offset`.
        `cutoffs`: (chunk, stratum, largest priority kept) of the full reservoirs the
        call touched (a candidate above it can never enter that reservoir).
        """
        pipe = self.redis.pipeline(transaction=False)
        for cid, part, expected, new, payload in calls:
            await self._scripts["INGEST"](keys=[self.keys.classifier(cid)], args=[part, expected, new, payload], client=pipe)
        for cid, *_ in calls:
            pipe.sadd(self.keys.classifiers, cid)
        res = (await pipe.execute())[: len(calls)]
        return [(True, int(r[1]), [(int(r[i]), int(r[i + 1]), float(r[i + 2])) for i in range(2, len(r) - 2, 3)], [])
                if int(r[0]) == 1 else
                (False, int(r[1]), [], [(int(r[i]), int(r[i + 1])) for i in range(2, len(r) - 1, 2)]) for r in res]

    async def count_invalid(self, topic: str, partition: int, expected: int, new: int,
                            counts: dict[str, int]) -> tuple[bool, int]:
        args: list = [partition, expected, new]
        for reason, c in counts.items():
            args += [f"{topic}|{reason}", c]
        r = await self._scripts["GLOBAL_COUNT"](keys=[self.keys.global_offsets(topic), self.keys.invalid], args=args)
        return int(r[0]) == 1, int(r[1])

    async def invalid_offset(self, topic: str, partition: int) -> int:
        v = await self.redis.hget(self.keys.global_offsets(topic), str(partition))
        return int(v) if v is not None else -1

    # ---- labels -------------------------------------------------------------------------
    async def apply_labels(self, calls: list[tuple[str, int, int, str, str, int, str]]) -> list[list]:
        """LABEL for (cid, partition, offset, request_token, label, now_ms, labeler) in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for cid, part, off, rid, label, now_ms, labeler in calls:
            await self._scripts["LABEL"](keys=[self.keys.classifier(cid)],
                                   args=[part, off, rid, label, now_ms, labeler], client=pipe)
        return [[x.decode() if isinstance(x, bytes) else x for x in r] for r in await pipe.execute()]

    # ---- request loop -------------------------------------------------------------------
    async def acquire_lease(self, cid: str, instance: str, ttl_ms: int) -> bool:
        return bool(await self._scripts["LEASE"](keys=[f"{self.keys.classifier(cid)}:lease"], args=[instance, ttl_ms]))

    async def release_lease(self, cid: str, instance: str) -> bool:
        return bool(await self._scripts["RELEASE"](keys=[f"{self.keys.classifier(cid)}:lease"], args=[instance]))

    async def lease_holders(self, cids: list[str]) -> dict[str, str | None]:
        if not cids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for cid in cids:
            pipe.get(f"{self.keys.classifier(cid)}:lease")
        return {cid: (v.decode() if v is not None else None) for cid, v in zip(cids, await pipe.execute())}

    async def heartbeat(self, instance: str, now_ms: int, window_ms: int) -> list[str]:
        """Record this instance as alive; return the instances alive within `window_ms`."""
        key = f"{self.keys.global_stem}:instances"
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(key, {instance: now_ms})
        pipe.zremrangebyscore(key, "-inf", now_ms - 10 * window_ms)
        pipe.zrangebyscore(key, now_ms - window_ms, "+inf")
        *_, live = await pipe.execute()
        return sorted(m.decode() for m in live)

    async def leave(self, instance: str) -> None:
        await self.redis.zrem(f"{self.keys.global_stem}:instances", instance)

    async def lease_holder(self, cid: str) -> str | None:
        v = await self.redis.get(f"{self.keys.classifier(cid)}:lease")
        return v.decode() if v is not None else None

    async def expire(self, cid: str, now_ms: int) -> int:
        return int(await self._scripts["EXPIRE"](keys=[self.keys.classifier(cid)], args=[now_ms]))

    async def pending_count(self, cid: str) -> int:
        return int(await self.redis.zcard(f"{self.keys.classifier(cid)}:pending"))

    async def unpublished(self, cid: str) -> list[tuple[str, dict]]:
        """Requests written but not yet marked published (the outbox)."""
        stem = self.keys.classifier(cid)
        rids = [r.decode() for r in await self.redis.zrange(f"{stem}:pending", 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for rid in rids:
            pipe.hgetall(f"{stem}:req:{rid}")
        out = []
        for rid, h in zip(rids, await pipe.execute()):
            h = {k.decode(): v.decode() for k, v in h.items()}
            if h.get("state") == "new":
                out.append((rid, h))
        return out

    async def reservoir(self, cid: str, t: int, k: int) -> list[str]:
        return [m.decode() for m in await self.redis.zrange(f"{self.keys.chunk(cid, t)}:res:{k}", 0, -1)]

    async def reservoirs(self, cid: str, t: int, strata: int) -> list[list[tuple[str, float]]]:
        """Every stratum's reservoir as (member, priority), lowest priority first."""
        pipe = self.redis.pipeline(transaction=False)
        for k in range(strata):
            pipe.zrange(f"{self.keys.chunk(cid, t)}:res:{k}", 0, -1, withscores=True)
        return [[(m.decode(), float(p)) for m, p in res] for res in await pipe.execute()]

    async def reservoir_windows(self, cid: str, t: int, thresholds, extra) -> list["ReservoirWindow"]:
        """Per stratum: the reservoir members at or below the threshold, the first
        `extra[k]` above it (the candidates of a round), how many lie above it,
        the reservoir's size and its largest priority."""
        pipe = self.redis.pipeline(transaction=False)
        for k, tau in enumerate(thresholds):
            key = f"{self.keys.chunk(cid, t)}:res:{k}"
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

    async def pending_by_chunk(self, cid: str) -> dict[int, int]:
        """Outstanding requests per chunk."""
        stem = self.keys.classifier(cid)
        rids = [r.decode() for r in await self.redis.zrange(f"{stem}:pending", 0, -1)]
        if not rids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for rid in rids:
            pipe.hget(f"{stem}:req:{rid}", "chunk")
        out: dict[int, int] = {}
        for chunk in await pipe.execute():
            if chunk is not None:
                out[int(chunk)] = out.get(int(chunk), 0) + 1
        return out

    async def set_status(self, cid: str, t: int, status: str) -> None:
        """The chunk's status as the request loop last saw it (derived state, not guarded)."""
        await self.redis.hset(f"{self.keys.chunk(cid, t)}:meta", "status", status)

    async def sampled(self, cid: str, t: int, item_ids: list[str]) -> list[bool]:
        if not item_ids:
            return []
        return [bool(x) for x in await self.redis.smismember(f"{self.keys.chunk(cid, t)}:sampled", item_ids)]

    async def issue(self, cid: str, t: int, now_ms: int, deadline_ms: int, round_no: int, fence: str,
                    requests: list[list], replaced: dict[int, int], retention_ms: int,
                    thresholds: np.ndarray | None = None) -> list[str] | None:
        """Record a round's requests (ISSUE) and the thresholds they were drawn under;
        None if this instance lost the lease."""
        args = [str(t), now_ms, deadline_ms, now_ms // 3_600_000, round_no, fence,
                orjson.dumps(requests), orjson.dumps({str(k): v for k, v in replaced.items()}), retention_ms]
        if thresholds is not None:
            args.append(orjson.dumps([float(x) for x in thresholds]))
        res = await self._scripts["ISSUE"](keys=[self.keys.classifier(cid)], args=args)
        if res and not isinstance(res[0], bytes) and int(res[0]) == -1:
            return None
        return [r.decode() for r in res]

    async def mark_published(self, cid: str, rids: list[str]) -> None:
        if rids:
            await self._scripts["MARK_PUBLISHED"](keys=[self.keys.classifier(cid)], args=rids)

    async def evaluate_round(self, cid: str, t: int, round_no: int, streak: int, status: str) -> bool:
        return bool(await self._scripts["EVALUATE_ROUND"](
            keys=[self.keys.classifier(cid)], args=[str(t), round_no, streak, status]))

    async def issued_this_hour(self, cid: str, now_ms: int) -> int:
        v = await self.redis.hget(f"{self.keys.classifier(cid)}:hourly", str(now_ms // 3_600_000))
        return int(v) if v is not None else 0

    async def purge_chunks(self, cid: str, ids: list[int], keep_full: int, keep_history: int) -> int:
        """Bound a classifier's memory by time as well as by stream length: chunks
        older than the newest `keep_full` lose their reservoirs, sampled sets and
        histograms (no longer needed); chunks older than the newest `keep_history`
        are deleted.  Returns the number of chunks touched."""
        old = ids[:-keep_full] if len(ids) > keep_full else []
        if not old:
            return 0
        drop = set(ids[:-keep_history]) if len(ids) > keep_history else set()
        pipe = self.redis.pipeline(transaction=False)
        for t in old:
            ck = self.keys.chunk(cid, t)
            pipe.delete(f"{ck}:sampled", f"{ck}:hist", f"{ck}:replace", f"{ck}:pscores",
                        *(f"{ck}:res:{k}" for k in range(MAX_STRATA)))
            if t in drop:
                pipe.delete(f"{ck}:meta", f"{ck}:N", f"{ck}:n", f"{ck}:h")
                pipe.zrem(f"{self.keys.classifier(cid)}:chunks", t)
        await pipe.execute()
        return len(old)

    # ---- reads --------------------------------------------------------------------------
    async def classifiers(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(self.keys.classifiers))

    async def chunk_ids(self, cid: str) -> list[int]:
        return [int(x) for x in await self.redis.zrange(f"{self.keys.classifier(cid)}:chunks", 0, -1)]

    async def chunks(self, cid: str, ids: list[int]) -> list[ChunkState]:
        pipe = self.redis.pipeline(transaction=False)
        for t in ids:
            ck = self.keys.chunk(cid, t)
            pipe.hgetall(f"{ck}:meta")
            for part in ("N", "n", "h", "replace"):
                pipe.hgetall(f"{ck}:{part}")
        raw = await pipe.execute()
        out = []
        for i, t in enumerate(ids):
            meta, N, n, h, rep = (
                {k.decode(): v.decode() for k, v in d.items()} for d in raw[5 * i: 5 * i + 5])
            if "cuts" not in meta:
                continue
            cuts = np.asarray(orjson.loads(meta["cuts"]), dtype=float)
            k = cuts.size + 1
            out.append(ChunkState(
                t, cuts, _vec(N, k), _vec(n, k), _vec(h, k), int(meta.get("round", 0)),
                int(meta.get("evaluated_round", 0)), int(meta.get("streak", 0)), meta.get("status", "open"),
                {int(a): int(b) for a, b in rep.items()},
                float(meta.get("min", "nan")), float(meta.get("max", "nan")),
                np.asarray(orjson.loads(meta["tau"]), dtype=float) if "tau" in meta else None,
                int(meta.get("first_ms", -1)), int(meta.get("last_ms", -1)),
                provisional=meta.get("provisional") == "1",
            ))
        return out

    async def chunk_histogram(self, cid: str, t: int) -> dict[int, int]:
        raw = await self.redis.hgetall(f"{self.keys.chunk(cid, t)}:hist")
        return {int(k): int(v) for k, v in raw.items()}

    async def classifier_summary(self, cid: str) -> dict:
        stem = self.keys.classifier(cid)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(f"{stem}:meta")
        pipe.hgetall(f"{stem}:counters")
        pipe.zcard(f"{stem}:pending")
        meta, counters, pending = await pipe.execute()
        dec = lambda d: {k.decode(): v.decode() for k, v in d.items()}  # noqa: E731
        return {"meta": dec(meta), "counters": dec(counters), "pending": int(pending)}

    async def invalid_counts(self) -> dict[tuple[str, str], int]:
        raw = await self.redis.hgetall(self.keys.invalid)
        out = {}
        for k, v in raw.items():
            topic, _, reason = k.decode().partition("|")
            out[(topic, reason)] = int(v)
        return out
