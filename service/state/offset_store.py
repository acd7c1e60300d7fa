"""The offsets port: every offset Redis keeps of the topics' records.  The offsets each state's
guards stored (INGEST's ``offsets:scores``, LABEL's ``offsets:labels``), the service-wide counts
guarded the same way (GLOBAL_COUNT: invalid records, labels naming no classifier), the partitions'
applied marks (``applied``) and the copies of what the states' guards acknowledged
(``acknowledged:<sid>``), which the checkpoint writes before each commit (`app.checkpoint`) and a
start reads to replay what a Redis that went back lost (`app.state_watch`, `offsets`)."""

from __future__ import annotations

from .connection import StateConnection, text
from .keys import UNKNOWN_LABELS_SCOPE


class OffsetStore:
    """The states' stored offsets, the guarded service-wide counts, the applied and acknowledged marks."""

    def __init__(self, connection: StateConnection) -> None:
        self.connection, self.keys, self.redis = connection, connection.keys, connection.redis

    # ---- the states' offset guards ------------------------------------------------------
    async def scores_offsets(self, cids: list[str], partition) -> dict[str, int]:
        """INGEST's stored offset of each state on `partition` (-1: none)."""
        return await self._stored_offsets(self.keys.scores_offsets, cids, partition)

    async def labels_offsets(self, cids: list[str], partition) -> dict[str, int]:
        """LABEL's stored offset of each state on `partition` (-1: none)."""
        return await self._stored_offsets(self.keys.labels_offsets, cids, partition)

    async def _stored_offsets(self, key_of, cids: list[str], partition) -> dict[str, int]:
        vals = await self.connection.hgets([key_of(cid) for cid in cids], str(partition))
        return {cid: int(v) if v is not None else -1 for cid, v in zip(cids, vals)}

    # ---- service-wide counts (GLOBAL_COUNT, offset-guarded per scope and partition) -----
    async def count_invalid(self, topic: str, partition: int, expected: int, new: int,
                            counts: dict[str, int]) -> tuple[bool, int]:
        """Add rejected records of `topic` by reason if the stored offset is `expected`;
        (applied, stored offset)."""
        return await self._count_global(topic, self.keys.invalid, partition, expected, new,
                                        {f"{topic}|{reason}": c for reason, c in counts.items()})

    async def invalid_offset(self, topic: str, partition: int) -> int:
        return await self._global_offset(topic, partition)

    async def invalid_counts(self) -> dict[tuple[str, str], int]:
        """(topic, reason) -> records rejected, service-wide."""
        raw = await self.redis.hgetall(self.keys.invalid)
        out = {}
        for k, v in raw.items():
            topic, _, reason = k.decode().partition("|")
            out[(topic, reason)] = int(v)
        return out

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
        r = await self.connection.scripts.call("GLOBAL_COUNT", [self.keys.global_offsets(scope), counts_key], args)
        return int(r[0]) == 1, int(r[1])

    async def _global_offset(self, scope: str, partition: int) -> int:
        v = await self.redis.hget(self.keys.global_offsets(scope), str(partition))
        return int(v) if v is not None else -1

    # ---- the partitions' applied marks --------------------------------------------------
    async def note_applied(self, marks: dict[str, tuple[int, int]]) -> list[int | None]:
        """Raise the applied marks (``applied``: field ``<topic>:<partition>`` -> the next offset to
        read): `marks` maps a field to the mark this process noted last (-1: none) and the new one.
        A mark below the last one noted is left as it is (Redis rolled back).  Returns each field's
        mark before (None: none)."""
        args = [x for field, (last, new) in marks.items() for x in (field, last, new)]
        before = await self.connection.scripts.call("NOTE_APPLIED", [self.keys.applied], args)
        return [None if b is None else int(b) for b in before]

    async def lower_applied(self, field: str, offset: int) -> bool:
        """Lower the applied mark of `field` to `offset` (a classifier's state went back there)."""
        return bool(await self.connection.scripts.call("LOWER_APPLIED", [self.keys.applied], [field, offset]))

    async def applied_marks(self, fields: list[str]) -> list[int | None]:
        """The applied marks of `fields` (None: none noted)."""
        return [None if v is None else int(v) for v in await self.redis.hmget(self.keys.applied, fields)]

    # ---- the copies of the offsets the states' guards acknowledged ----------------------
    async def note_acknowledged(self, by_state: dict[str, dict[str, int]]) -> None:
        """Raise the service-wide copy of the offsets each state's guards acknowledged
        (``acknowledged:<sid>``, `state.offsets.Acknowledged`), never lower it."""
        if not by_state:
            return
        args: list = []
        for fields in by_state.values():
            args.append(len(fields))
            args += [x for pair in fields.items() for x in pair]
        await self.connection.scripts.call("NOTE_ACKNOWLEDGED", [self.keys.acknowledged(sid) for sid in by_state], args)

    async def acknowledged_offsets(self, sids: list[str], fields: list[str]) -> dict[str, dict[str, int]]:
        """state id -> {field: offset} of the acknowledged offsets noted for `fields` (states with
        none left out).  Each state's whole hash is read (HGETALL: a state has a field for each
        partition it was written from, a few, and naming every assigned partition's field in an
        HMGET made the pipeline slow to pack for thousands of classifiers)."""
        pipe = self.connection.pipeline()
        for sid in sids:
            pipe.hgetall(self.keys.acknowledged(sid))
        wanted = set(fields)
        out: dict[str, dict[str, int]] = {}
        for sid, noted in zip(sids, await pipe.execute()):
            kept = {f: int(v) for f, v in ((text(f), v) for f, v in noted.items()) if f in wanted}
            if kept:
                out[sid] = kept
        return out
