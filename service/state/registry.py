"""The registry port: what the service keeps about itself rather than about a classifier's data.
The service-wide set of classifiers (and when this process last added each, `Registrations`),
the request loop's leases and the instances' heartbeats (`app.ownership`), and the ``settings`` a
start notes: the chunk length, the first topics, when the state began and up to when a lost state
counted records (`app.probes`, `app.state_watch`)."""

from __future__ import annotations

import time

from .connection import StateConnection, text

#: A classifier is added to the service-wide set at most this often per process, not with every
#: batch, so the set's slot does not take a write per batch (a forgotten classifier that comes
#: back is listed again within this time).
REGISTER_EVERY_S = 30.0


class Registrations:
    """When this process last added each classifier to the service-wide set (``classifiers``):
    INGEST's batches add the ones due (`chunk_store.ChunkStore.apply_ingest`)."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}  # classifier -> time.monotonic() of its last SADD

    def due(self, owners: set[str]) -> list[str]:
        """The classifiers of `owners` this process has not added to the set for `REGISTER_EVERY_S`."""
        now = time.monotonic()
        if len(self._at) > 1024:
            self._at = {c: t for c, t in self._at.items() if now - t < REGISTER_EVERY_S}
        return [c for c in owners if now - self._at.get(c, -REGISTER_EVERY_S) >= REGISTER_EVERY_S]

    def added(self, cids: list[str]) -> None:
        """`cids` were added to the set just now."""
        now = time.monotonic()
        self._at.update((c, now) for c in cids)

    def drop(self, cid: str) -> None:
        self._at.pop(cid, None)

    def clear(self) -> None:
        self._at.clear()


class Registry:
    """The service-wide classifiers, leases, heartbeats and noted settings."""

    def __init__(self, connection: StateConnection, registrations: Registrations) -> None:
        self.connection, self.keys, self.redis = connection, connection.keys, connection.redis
        self.registrations = registrations

    # ---- the classifiers ----------------------------------------------------------------
    async def classifiers(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(self.keys.classifiers))

    async def known_classifiers(self, cids: list[str]) -> list[bool]:
        return [bool(x) for x in await self.redis.smismember(self.keys.classifiers, cids)] if cids else []

    async def classifier_count(self) -> int:
        return int(await self.redis.scard(self.keys.classifiers))

    async def drop_classifier(self, cid: str) -> None:
        """Take a forgotten classifier out of the set (`request_store.RequestStore.forget`)."""
        self.registrations.drop(cid)
        await self.redis.srem(self.keys.classifiers, cid)

    def forget_registrations(self) -> None:
        """Add every classifier to the set again at its next batch (the set was lost)."""
        self.registrations.clear()

    # ---- leases and heartbeats ----------------------------------------------------------
    async def acquire_lease(self, cid: str, instance: str, ttl_ms: int) -> bool:
        return bool(await self.connection.scripts.call("LEASE", [self.keys.lease(cid)], [instance, ttl_ms]))

    async def acquire_leases(self, cids: list[str], instance: str, ttl_ms: int) -> list[bool]:
        """`acquire_lease` for each of `cids`, in one pipeline (per classifier on a cluster)."""
        calls = [([self.keys.lease(cid)], [instance, ttl_ms]) for cid in cids]
        return [bool(int(r)) for r in await self.connection.scripts.each("LEASE", calls)] if calls else []

    async def release_lease(self, cid: str, instance: str) -> bool:
        return bool(await self.connection.scripts.call("RELEASE", [self.keys.lease(cid)], [instance]))

    async def lease_holders(self, cids: list[str]) -> dict[str, str | None]:
        if not cids:
            return {}
        pipe = self.connection.pipeline()
        for cid in cids:
            pipe.get(self.keys.lease(cid))
        return {cid: text(v) for cid, v in zip(cids, await pipe.execute())}

    async def heartbeat(self, instance: str, now_ms: int, window_ms: int) -> list[str]:
        """Record this instance as alive; return the instances alive within `window_ms`."""
        key = self.keys.instances
        pipe = self.connection.pipeline()
        pipe.zadd(key, {instance: now_ms})
        pipe.zremrangebyscore(key, "-inf", now_ms - 10 * window_ms)
        pipe.zrangebyscore(key, now_ms - window_ms, "+inf")
        *_, live = await pipe.execute()
        return sorted(m.decode() for m in live)

    async def leave(self, instance: str) -> None:
        await self.redis.zrem(self.keys.instances, instance)

    # ---- the settings a start notes -----------------------------------------------------
    async def stored_chunk_seconds(self, chunk_seconds: int) -> int:
        """The chunk length the state under this prefix was written with (``settings``), this one
        if none was noted yet (it is noted now)."""
        pipe = self.connection.pipeline()
        pipe.hsetnx(self.keys.settings, "chunk_seconds", chunk_seconds)
        pipe.hget(self.keys.settings, "chunk_seconds")
        return int((await pipe.execute())[1])

    async def noted_topics(self, scores: str, labels: str) -> tuple[str, str]:
        """The scores and labels topics the state's offsets count records of (``settings``
        ``topic_scores``, ``topic_labels``), these if none were noted yet (they are noted now).
        The runner keeps them as `process.ProcessState.first_topics`."""
        pipe = self.connection.pipeline()
        pipe.hsetnx(self.keys.settings, "topic_scores", scores)
        pipe.hsetnx(self.keys.settings, "topic_labels", labels)
        pipe.hmget(self.keys.settings, "topic_scores", "topic_labels")
        noted = (await pipe.execute())[2]
        return noted[0].decode(), noted[1].decode()

    async def begin_state(self, now_ms: int) -> bool:
        """Note when the state under this prefix began (``settings`` ``started_ms``) unless noted;
        True when no state was there before: nothing noted and no classifier (a state written by a
        version before the note has classifiers)."""
        pipe = self.connection.pipeline()
        pipe.hsetnx(self.keys.settings, "started_ms", now_ms)
        pipe.exists(self.keys.classifiers)
        noted, classifiers = await pipe.execute()
        return bool(noted) and not classifiers

    async def note_state_lost(self, through_ms: int, chunk_seconds: int, now_ms: int,
                              first_topics: tuple[str, str] | None) -> int:
        """Note that the records of event times up to `through_ms` were counted in a state Redis
        lost (``settings`` ``lost_through_ms``, `chunks.lifecycle.counted_whole`), and the settings
        a start notes, so the loss is seen once (`first_topics`: the first topics as this process
        knows them, `process.ProcessState`; the offsets written since are under their fields,
        `app.batch.BatchHandler.offset_field`).  Returns the ``started_ms`` noted (this one, or
        another replica's)."""
        pipe = self.connection.pipeline()
        pipe.hsetnx(self.keys.settings, "chunk_seconds", chunk_seconds)
        if first_topics:
            pipe.hsetnx(self.keys.settings, "topic_scores", first_topics[0])
            pipe.hsetnx(self.keys.settings, "topic_labels", first_topics[1])
        pipe.hsetnx(self.keys.settings, "started_ms", now_ms)
        pipe.hset(self.keys.settings, "lost_through_ms", through_ms)
        pipe.hget(self.keys.settings, "started_ms")
        return int((await pipe.execute())[-1])

    async def state_marks(self) -> tuple[bool, int | None, int | None]:
        """Whether the service-wide ``settings`` are noted (a start notes them: gone, Redis lost
        the state), their ``lost_through_ms`` (`note_state_lost`; None: no loss seen) and their
        ``started_ms`` (when the state began, `begin_state`; None: not noted)."""
        noted, lost, started = await self.redis.hmget(self.keys.settings, "chunk_seconds", "lost_through_ms",
                                                      "started_ms")
        return noted is not None, None if lost is None else int(lost), None if started is None else int(started)
