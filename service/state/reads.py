"""The store's reads for the request loop, the HTTP API and the metrics (a part of `store.Store`)."""

from __future__ import annotations

import numpy as np
import orjson

from .records import ChunkState, LabelledRecords, _vec, histogram_counts, labelled_records


class Reads:
    """Reads of the service-wide set and of one state's chunks and summaries (needs ``redis``
    and ``keys``, which `store.Store` sets)."""

    async def classifiers(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(self.keys.classifiers))

    async def known_classifiers(self, cids: list[str]) -> list[bool]:
        return [bool(x) for x in await self.redis.smismember(self.keys.classifiers, cids)] if cids else []

    async def classifier_count(self) -> int:
        return int(await self.redis.scard(self.keys.classifiers))

    async def chunk_ids(self, cid: str) -> list[int]:
        return [int(x) for x in await self.redis.zrange(self.keys.chunks(cid), 0, -1)]

    async def state_marks(self) -> tuple[bool, int | None, int | None]:
        """Whether the service-wide ``settings`` are noted (a start notes them: gone, Redis lost
        the state), their ``lost_through_ms`` (`note_state_lost`; None: no loss seen) and their
        ``started_ms`` (when the state began, `begin_state`; None: not noted)."""
        noted, lost, started = await self.redis.hmget(self.keys.settings, "chunk_seconds", "lost_through_ms",
                                                      "started_ms")
        return noted is not None, None if lost is None else int(lost), None if started is None else int(started)

    async def unpaired_through(self, cid: str) -> int | None:
        """The classifier's ``unpaired_through_ms`` (INGEST, `chunks.lifecycle.counted_whole`):
        None while it has counted no record its predicted negatives' state did not get."""
        raw = await self.redis.hget(self.keys.meta(cid), "unpaired_through_ms")
        return None if raw is None else int(raw)

    async def chunks(self, cid: str, ids: list[int]) -> list[ChunkState]:
        pipe = self.redis.pipeline(transaction=False)
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
                t, cuts, _vec(N, k), _vec(n, k), _vec(h, k), int(meta.get("round", 0)),
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

    async def chunk_histogram(self, cid: str, t: int) -> np.ndarray:
        """Chunk `t`'s score histogram counts (`records.histogram_counts`)."""
        pipe = self.redis.pipeline(transaction=False)
        self._queue_histogram(pipe, cid, t)
        return histogram_counts(*await pipe.execute())

    async def chunk_labelled(self, cid: str, t: int) -> tuple[np.ndarray, LabelledRecords]:
        """Chunk `t`'s score histogram counts and labelled items (the difference estimator's
        inputs, `labels.calibrated`), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        self._queue_histogram(pipe, cid, t)
        pipe.hgetall(self.keys.chunk_labelled(cid, t))
        packed, legacy, raw = await pipe.execute()
        return histogram_counts(packed, legacy), labelled_records(raw)

    async def chunk_bins(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], bytes | None]:
        """The ``bins`` string of each (cid, chunk) as stored (None: none yet), for the ingestor's
        copy of the counters (`ingest.bins`)."""
        pipe = self.redis.pipeline(transaction=False)
        for cid, t in pairs:
            pipe.get(self.keys.chunk_bins(cid, t))
        return dict(zip(pairs, await pipe.execute()))

    def _queue_histogram(self, pipe, cid: str, t: int) -> None:
        """The two reads `records.histogram_counts` takes, in its order."""
        pipe.get(self.keys.chunk_bins(cid, t))
        pipe.hgetall(self.keys.chunk_hist(cid, t))

    async def classifier_summary(self, cid: str) -> dict:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.meta(cid))
        pipe.hgetall(self.keys.counters(cid))
        pipe.zcard(self.keys.pending(cid))
        meta, counters, pending = await pipe.execute()
        dec = lambda d: {k.decode(): v.decode() for k, v in d.items()}  # noqa: E731
        return {"meta": dec(meta), "counters": dec(counters), "pending": int(pending)}

    async def overviews(self, sids: list[str], now_ms: int) -> list[dict]:
        """Per state, in one pipeline: `classifier_summary`, its chunk ids (``chunk_ids``) and the
        requests issued in the hour of `now_ms` (``issued``): what a view needs before its chunks."""
        k, hour = self.keys, str(now_ms // 3_600_000)
        pipe = self.redis.pipeline(transaction=False)
        for sid in sids:
            pipe.hgetall(k.meta(sid))
            pipe.hgetall(k.counters(sid))
            pipe.zcard(k.pending(sid))
            pipe.zrange(k.chunks(sid), 0, -1)
            pipe.hget(k.hourly(sid), hour)
        raw = await pipe.execute()
        dec = lambda d: {a.decode(): b.decode() for a, b in d.items()}  # noqa: E731
        return [{"meta": dec(meta), "counters": dec(counters), "pending": int(pending),
                 "chunk_ids": [int(x) for x in ids], "issued": int(issued or 0)}
                for meta, counters, pending, ids, issued in (raw[i: i + 5] for i in range(0, len(raw), 5))]

    async def invalid_counts(self) -> dict[tuple[str, str], int]:
        raw = await self.redis.hgetall(self.keys.invalid)
        out = {}
        for k, v in raw.items():
            topic, _, reason = k.decode().partition("|")
            out[(topic, reason)] = int(v)
        return out
