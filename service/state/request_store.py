"""The requests port: a state's label requests, and the retention the request loop runs.
Issuing a round (ISSUE, the outbox: `unpublished`, MARK_PUBLISHED), expiring what is overdue
(EXPIRE), folding the answers (LABEL, `calls.LabelCall`), the pending requests and the hour's
budget, the joined requests of a group that shares items (`joins`); purging old chunks' keys and
forgetting a silent state (FORGET)."""

from __future__ import annotations

import numpy as np
import orjson

from .calls import LabelCall, LabelReply, label_reply
from .connection import StateConnection, text
from .keys import MAX_STRATA


class RequestStore:
    """Label requests: issued, published, expired, answered; retention."""

    def __init__(self, connection: StateConnection) -> None:
        self.connection, self.keys, self.redis = connection, connection.keys, connection.redis

    # ---- issuing ------------------------------------------------------------------------
    async def issue(self, cid: str, t: int, now_ms: int, deadline_ms: int, round_no: int, fence: str,
                    requests: list[list], replaced: dict[int, int], retention_ms: int,
                    thresholds: np.ndarray | None = None) -> list[str] | None:
        """Record a round's requests (ISSUE) and the thresholds they were drawn under;
        None if this instance lost the lease."""
        args = [str(t), now_ms, deadline_ms, now_ms // 3_600_000, round_no, fence,
                orjson.dumps(requests), orjson.dumps({str(k): v for k, v in replaced.items()}), retention_ms]
        if thresholds is not None:
            args.append(orjson.dumps([float(x) for x in thresholds]))
        res = await self.connection.scripts.call("ISSUE", self.keys.issue_keys(cid, t, [r[0] for r in requests]),
                                                 args)
        if res and not isinstance(res[0], bytes) and int(res[0]) == -1:
            return None
        return [r.decode() for r in res]

    async def unpublished(self, cid: str) -> list[tuple[str, dict]]:
        """Requests written but not yet marked published (the outbox)."""
        rids = [r.decode() for r in await self.redis.zrange(self.keys.pending(cid), 0, -1)]
        pipe = self.connection.pipeline()
        for rid in rids:
            pipe.hgetall(self.keys.request(cid, rid))
        out = []
        for rid, h in zip(rids, await pipe.execute()):
            h = {k.decode(): v.decode() for k, v in h.items()}
            if h.get("state") == "new":
                out.append((rid, h))
        return out

    async def mark_published(self, cid: str, rids: list[str]) -> None:
        if rids:
            await self.connection.scripts.call("MARK_PUBLISHED", [self.keys.request(cid, rid) for rid in rids])

    async def sampled(self, cid: str, t: int, item_ids: list[str]) -> list[bool]:
        """Whether each item was requested in chunk `t` already."""
        if not item_ids:
            return []
        return [bool(x) for x in await self.redis.smismember(self.keys.chunk_sampled(cid, t), item_ids)]

    async def issued_this_hour(self, cid: str, now_ms: int) -> int:
        v = await self.redis.hget(self.keys.hourly(cid), str(now_ms // 3_600_000))
        return int(v) if v is not None else 0

    # ---- pending and overdue ------------------------------------------------------------
    async def pending_by_chunk(self, cid: str, known: dict[str, int] | None = None) -> dict[int, int]:
        """Outstanding requests per chunk.  `known` (request id -> chunk, the caller's between
        calls) spares the read of each request's chunk after the first: a request never changes
        chunk, so with slow reviewers a step reads the pending ids, not every pending request
        again.  It is left holding exactly the pending requests whose chunk was found."""
        rids = [r.decode() for r in await self.redis.zrange(self.keys.pending(cid), 0, -1)]
        memo = {} if known is None else known
        new = [rid for rid in rids if rid not in memo]
        if new:
            for rid, chunk in zip(new, await self.connection.hgets([self.keys.request(cid, rid) for rid in new],
                                                                   "chunk")):
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

    async def expire(self, cid: str, now_ms: int) -> int:
        """Expire the requests due at `now_ms` (EXPIRE); the number due.  The due requests and
        their chunks are read first and re-checked by the script; read again if they changed."""
        k = self.keys
        while True:
            due = [text(r) for r in await self.redis.zrangebyscore(k.pending(cid), "-inf", now_ms)]
            if not due:  # nothing to re-check: no script call (a step of every owned classifier reads this)
                return 0
            chunks = [text(c) or "" for c in await self.connection.hgets([k.request(cid, rid) for rid in due], "chunk")]
            keys = [k.pending(cid), k.counters(cid)] + [k.request(cid, rid) for rid in due]
            replace: dict[str, int] = {}  # chunk -> index of its replace hash in KEYS (1-based)
            args: list = [now_ms]
            for rid, t in zip(due, chunks):
                if t and t not in replace:
                    replace[t] = len(keys) + len(replace) + 1
                args += [rid, t, replace.get(t, 0)]
            keys += [k.chunk_replace(cid, t) for t in replace]
            n = int(await self.connection.scripts.call("EXPIRE", keys, args))
            if n >= 0:
                return n

    # ---- answers --------------------------------------------------------------------------
    async def apply_labels(self, calls: list[LabelCall], applied: dict | None = None) -> list[LabelReply]:
        """LABEL each call, in one pipeline (per classifier on a cluster); `applied`: (state,
        partition) -> the offset last seen applied for them (a state gone back below it answers
        ``rolled_back``).

        Each request's chunk is read first (its chunk keys go into KEYS); a call whose request
        changed meanwhile is refused by the script and retried here, with every later call of
        its classifier and partition (refused with it, so the offsets stay in order)."""
        out: list[LabelReply | None] = [None] * len(calls)
        todo = list(range(len(calls)))
        while todo:
            chunks = await self.connection.hgets([self.keys.request(calls[i].state_id, calls[i].request_id)
                                                  for i in todo], "chunk")
            labels, previous = [], {}
            for i, chunk in zip(todo, chunks):
                c = calls[i]
                side = (c.state_id, c.partition)
                t = text(chunk) or ""
                labels.append((self.keys.label_keys(c.state_id, c.request_id, t),
                               [c.partition, c.offset, c.request_id, c.label, c.now_ms, c.labeler, t,
                                previous.get(side, ""), (applied or {}).get(side, "")]))
                previous[side] = c.offset
            retry = []
            for i, r in zip(todo, await self.connection.scripts.each("LABEL", labels)):
                if text(r[0]) == "retry":
                    retry.append(i)
                else:
                    out[i] = label_reply(r)
            todo = retry
        return out

    # ---- joined requests (a review group that shares items, `requests.shared_items`) -------
    async def joins(self, sid: str) -> dict[str, str]:
        """State `sid`'s joined requests awaiting an answer: request id -> the request id it joined."""
        return {text(k): text(v) for k, v in (await self.redis.hgetall(self.keys.joins(sid))).items()}

    async def drop_joins(self, sid: str, rids: list[str]) -> None:
        if rids:
            await self.redis.hdel(self.keys.joins(sid), *rids)

    async def request_fields(self, requests: list[tuple[str, str]], *fields: str) -> list[list[str | None]]:
        """`fields` of each (state id, request id) of `requests` (None where missing), in one pipeline."""
        pipe = self.connection.pipeline()
        for sid, rid in requests:
            pipe.hmget(self.keys.request(sid, rid), list(fields))
        return [[text(v) for v in row] for row in await pipe.execute()]

    # ---- retention --------------------------------------------------------------------------
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
        pipe = self.connection.pipeline()
        for t in old:
            pipe.delete(k.chunk_sampled(cid, t), k.chunk_bins(cid, t), k.chunk_hist(cid, t), k.chunk_replace(cid, t),
                        k.chunk_pscores(cid, t), k.chunk_labelled(cid, t),
                        *(k.reservoir(cid, t, s) for s in range(MAX_STRATA)))
            if t in drop:
                pipe.delete(k.chunk_meta(cid, t), k.chunk_items(cid, t), k.chunk_labels(cid, t),
                            k.chunk_positives(cid, t))
                pipe.zrem(k.chunks(cid), t)
        await pipe.execute()
        return len(old)

    async def forget(self, sid: str, ids: list[int]) -> bool:
        """FORGET a state whose newest chunk is still ``ids[-1]``; False if a newer one came.  Its
        acknowledged offsets go after it (another slot: a second call).  The classifier leaves the
        service-wide set by `registry.Registry.drop_classifier`."""
        keys = self.keys.forget_keys(sid, ids, MAX_STRATA)
        if not await self.connection.scripts.call("FORGET", keys, [str(ids[-1]) if ids else ""]):
            return False
        await self.redis.delete(self.keys.acknowledged(sid))
        return True
