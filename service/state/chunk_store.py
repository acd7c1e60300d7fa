"""The chunks port: a state's chunks as the ingestor writes them, the request loop judges them and
every reader reads them.  Opening a chunk with its strata (OPEN_CHUNK), re-stratifying or freezing
a provisional one (RESTRATIFY, FREEZE), applying a batch (INGEST, `calls.IngestCall`), the loop's
verdict on a chunk (its evaluated round, streak and status, which `chunk_states` reads back), and
the reads of chunks, histograms, reservoirs and a state's summary the request loop, the API and
the gauges need."""

from __future__ import annotations

import numpy as np
import orjson

from ..stats.sketch import ScoreHistogram
from .calls import IngestCall, IngestReply, ingest_reply
from .connection import StateConnection
from .keys import ingest_chunks, owner_of
from .records import (ChunkCuts, ChunkState, LabelledRecords, ReservoirWindow, stratum_vector, histogram_counts,
                      labelled_records)
from .registry import Registrations
from .scripts import decode_ingest


class ChunkStore:
    """Chunks, strata, histograms, reservoirs, INGEST, and the loop's verdict on each chunk.
    `registrations`: the classifiers INGEST's batches add to the service-wide set
    (`registry.Registrations`, shared with the registry)."""

    def __init__(self, connection: StateConnection, registrations: Registrations) -> None:
        self.connection, self.keys, self.redis = connection, connection.keys, connection.redis
        self.registrations = registrations

    # ---- strata ---------------------------------------------------------------------------
    async def chunk_strata(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], ChunkCuts | None]:
        """Cuts, cuts version and provisional flag of each (cid, chunk); None if not opened."""
        pipe = self.connection.pipeline()
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
        cuts_raw, version, prov = await self.connection.scripts.call(
            "OPEN_CHUNK", [self.keys.chunk_meta(cid, t)],
            [orjson.dumps(cuts.tolist()), now_ms, "1" if provisional else "0", reservoir_size])
        return ChunkCuts(np.asarray(orjson.loads(cuts_raw), dtype=float), int(version), prov == b"1")

    async def restratify(self, cid: str, t: int, version: int, cuts: np.ndarray) -> bool:
        """Give a provisional chunk its final `cuts` (RESTRATIFY) if it is still provisional
        at `version`; False if it is not (re-stratified by another instance): reload its cuts."""
        done, _ = await self.connection.scripts.call("RESTRATIFY", self.keys.restratify_keys(cid, t, cuts.size + 1),
                                                     [version, orjson.dumps(cuts.tolist())])
        return int(done) == 1

    async def freeze(self, cid: str, t: int) -> bool:
        """Keep a provisional chunk that has closed in its one stratum for good (FREEZE), so it
        can be sampled; False if it is not provisional any more (re-stratified meanwhile)."""
        return int(await self.connection.scripts.call("FREEZE", self.keys.freeze_keys(cid, t))) == 1

    # ---- the request loop's verdict ------------------------------------------------------
    async def evaluate_round(self, cid: str, t: int, round_no: int, streak: int, status: str) -> bool:
        """Record a completed round's evaluation once (EVALUATE_ROUND); False if it was already."""
        return bool(await self.connection.scripts.call("EVALUATE_ROUND", self._status_keys(cid, t),
                                                       [round_no, streak, status]))

    async def set_status(self, cid: str, t: int, status: str, closed: bool) -> None:
        """The chunk's status as the request loop last saw it (derived state, not guarded), and
        whether it saw the chunk closed (`ChunkState.status_closed`); a closed chunk's change is
        counted in the state's ``status_changes`` (SET_STATUS)."""
        await self.connection.scripts.call("SET_STATUS", self._status_keys(cid, t), [status, int(closed)])

    def _status_keys(self, cid: str, t: int) -> list[str]:
        """The keys of the scripts that write a chunk's status: its meta and the state's counters."""
        return [self.keys.chunk_meta(cid, t), self.keys.counters(cid)]

    # ---- INGEST ---------------------------------------------------------------------------
    async def apply_ingest(self, calls: list[IngestCall]) -> list[IngestReply]:
        """INGEST each call, in one pipeline (per classifier on a cluster), with the classifiers
        due to be listed again in the service-wide set (`registry.Registrations`).  A reply not
        applied: another writer moved the offset or, if it lists refusals, a chunk's guard refused
        (`calls.IngestRefusal`); the caller re-aggregates from its stored offset."""
        if not calls:
            return []
        ingests = [(self.keys.ingest_keys(c.state_id, c.chunks if c.chunks is not None
                                          else ingest_chunks(decode_ingest(c.payload))),
                    [c.partition, c.expected_offset, c.new_offset, *c.payload]) for c in calls]
        owners = {owner_of(c.state_id)[0] for c in calls}  # a classifier's predicted negatives are not a classifier
        due = self.registrations.due(owners)
        then = (lambda pipe: pipe.sadd(self.keys.classifiers, *due)) if due else None
        res = await self.connection.scripts.each("INGEST", ingests, then)
        self.registrations.added(due)
        return [ingest_reply(r) for r in res]

    # ---- a state's chunks -----------------------------------------------------------------
    async def chunk_ids(self, cid: str) -> list[int]:
        return [int(x) for x in await self.redis.zrange(self.keys.chunks(cid), 0, -1)]

    async def chunk_states(self, cid: str, ids: list[int]) -> list[ChunkState]:
        """The chunks `ids` of state `cid` as stored (those never opened left out)."""
        pipe = self.connection.pipeline()
        k = self.keys
        for t in ids:
            for key in (k.chunk_meta(cid, t), k.chunk_items(cid, t), k.chunk_labels(cid, t),
                        k.chunk_positives(cid, t), k.chunk_replace(cid, t)):
                pipe.hgetall(key)
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
                t, cuts, stratum_vector(N, k), stratum_vector(n, k), stratum_vector(h, k), int(meta.get("round", 0)),
                int(meta.get("evaluated_round", 0)), int(meta.get("streak", 0)), meta.get("status", "open"),
                {int(a): int(b) for a, b in rep.items()},
                float(meta.get("min", "nan")), float(meta.get("max", "nan")),
                np.asarray(orjson.loads(meta["tau"]), dtype=float) if "tau" in meta else None,
                int(meta.get("first_ms", -1)), int(meta.get("last_ms", -1)),
                provisional=meta.get("provisional") == "1",
                status_closed=meta.get("status_closed", "1") == "1",  # absent: stored before the field was
                reservoir_size=int(meta["res_size"]) if "res_size" in meta else None,
            ))
        return out

    async def label_counts(self, cid: str, ids: list[int]) -> list[tuple[dict[str, str], str]]:
        """Per chunk of `ids`, its labels per stratum as stored (``{stratum: count}``; empty for a
        chunk without labels or gone) and its status as the request loop last saw it (``open`` if
        none): one small read a chunk, to tell whether a chunk read before has taken a label or
        changed its status since (`api.closed_chunks`)."""
        pipe = self.connection.pipeline()
        for t in ids:
            pipe.hgetall(self.keys.chunk_labels(cid, t))
            pipe.hget(self.keys.chunk_meta(cid, t), "status")
        replies = await pipe.execute()
        return [({k.decode(): v.decode() for k, v in counts.items()}, (status or b"open").decode())
                for counts, status in zip(replies[::2], replies[1::2])]

    # ---- histograms -----------------------------------------------------------------------
    async def chunk_histogram(self, cid: str, t: int) -> np.ndarray:
        """Chunk `t`'s score histogram counts (`records.histogram_counts`)."""
        pipe = self.connection.pipeline()
        self._queue_histogram(pipe, cid, t)
        return histogram_counts(*await pipe.execute())

    async def chunk_score_histogram(self, cid: str, t: int) -> ScoreHistogram | None:
        """The score histogram of chunk `t` (None while it has none)."""
        pipe = self.connection.pipeline()
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

    async def chunk_labelled(self, cid: str, t: int) -> tuple[np.ndarray, LabelledRecords]:
        """Chunk `t`'s score histogram counts and labelled items (the difference estimator's
        inputs, `labels.calibrated`), in one round trip."""
        pipe = self.connection.pipeline()
        self._queue_histogram(pipe, cid, t)
        pipe.hgetall(self.keys.chunk_labelled(cid, t))
        packed, legacy, raw = await pipe.execute()
        return histogram_counts(packed, legacy), labelled_records(raw)

    async def chunk_bins(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], bytes | None]:
        """The ``bins`` string of each (cid, chunk) as stored (None: none yet), for the ingestor's
        copy of the counters (`ingest.bins`)."""
        pipe = self.connection.pipeline()
        for cid, t in pairs:
            pipe.get(self.keys.chunk_bins(cid, t))
        return dict(zip(pairs, await pipe.execute()))

    def _queue_histogram(self, pipe, cid: str, t: int) -> None:
        """The two reads `records.histogram_counts` takes, in its order."""
        pipe.get(self.keys.chunk_bins(cid, t))
        pipe.hgetall(self.keys.chunk_hist(cid, t))

    # ---- reservoirs -----------------------------------------------------------------------
    async def reservoirs(self, cid: str, t: int, strata: int) -> list[list[tuple[str, float]]]:
        """Every stratum's reservoir as (member, priority), lowest priority first."""
        pipe = self.connection.pipeline()
        for k in range(strata):
            pipe.zrange(self.keys.reservoir(cid, t, k), 0, -1, withscores=True)
        return [[(m.decode(), float(p)) for m, p in res] for res in await pipe.execute()]

    async def reservoir_windows(self, cid: str, t: int, thresholds, extra) -> list[ReservoirWindow]:
        """Per stratum: the reservoir members at or below the threshold, the first
        `extra[k]` above it (the candidates of a round), how many lie above it,
        the reservoir's size and its largest priority."""
        pipe = self.connection.pipeline()
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

    # ---- a state's summary ----------------------------------------------------------------
    async def unpaired_through(self, cid: str) -> int | None:
        """The classifier's ``unpaired_through_ms`` (INGEST, `chunks.lifecycle.counted_whole`):
        None while it has counted no record its predicted negatives' state did not get."""
        raw = await self.redis.hget(self.keys.meta(cid), "unpaired_through_ms")
        return None if raw is None else int(raw)

    async def classifier_summary(self, cid: str) -> dict:
        """The state's ``meta`` and ``counters`` hashes and its pending requests' count."""
        pipe = self.connection.pipeline()
        pipe.hgetall(self.keys.meta(cid))
        pipe.hgetall(self.keys.counters(cid))
        pipe.zcard(self.keys.pending(cid))
        meta, counters, pending = await pipe.execute()
        return {"meta": _decoded(meta), "counters": _decoded(counters), "pending": int(pending)}

    async def overviews(self, sids: list[str], now_ms: int) -> list[dict]:
        """Per state, in one pipeline: `classifier_summary`, its chunk ids (``chunk_ids``) and the
        requests issued in the hour of `now_ms` (``issued``): what a view needs before its chunks."""
        k, hour = self.keys, str(now_ms // 3_600_000)
        pipe = self.connection.pipeline()
        for sid in sids:
            pipe.hgetall(k.meta(sid))
            pipe.hgetall(k.counters(sid))
            pipe.zcard(k.pending(sid))
            pipe.zrange(k.chunks(sid), 0, -1)
            pipe.hget(k.hourly(sid), hour)
        raw = await pipe.execute()
        return [{"meta": _decoded(meta), "counters": _decoded(counters), "pending": int(pending),
                 "chunk_ids": [int(x) for x in ids], "issued": int(issued or 0)}
                for meta, counters, pending, ids, issued in (raw[i: i + 5] for i in range(0, len(raw), 5))]


def _decoded(raw: dict) -> dict[str, str]:
    """A hash read with HGETALL, its fields and values as strings."""
    return {k.decode(): v.decode() for k, v in raw.items()}
