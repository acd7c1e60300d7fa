"""Which instance runs a classifier's request loop and exports its gauges.

Exactly one at a time: the holder of the classifier's Redis lease (a PX key
renewed every third of its TTL; the ISSUE script checks it, so a paused former
owner cannot issue requests: fencing).  Which instance *tries* to hold it is
decided by rendezvous (highest-random-weight) hashing over the live instances
(a heartbeat sorted set), so classifiers spread evenly over replicas and move
as little as possible when one joins or leaves.  An instance that is not the
preferred one hands its lease over, and takes a lease that stayed free for a
whole renewal period (the preferred instance may be alive but stuck).
"""

from __future__ import annotations

import hashlib
import time

from ..state.registry import Registry

#: Lease TTL; a lease is renewed every third of it.
LEASE_MS = 10_000
#: Service-wide series (invalid records, unroutable labels) are exported by one replica only, the
#: rendezvous owner of this pseudo-classifier, so summing over replicas never double-counts them.
GLOBAL_SERIES_OWNER = ""


def weight(classifier_id: str, instance: str) -> int:
    digest = hashlib.blake2b(f"{classifier_id}\0{instance}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preferred_owner(classifier_id: str, instances: list[str]) -> str | None:
    """The live instance that should own `classifier_id` (None if there is none)."""
    if not instances:
        return None
    return max(instances, key=lambda inst: (weight(classifier_id, inst), inst))


class Leases:
    """This instance's leases: which classifiers it owns now, and whether it exports the
    service-wide series (it is the rendezvous owner of `GLOBAL_SERIES_OWNER`)."""

    def __init__(self, registry: Registry, instance: str) -> None:
        self.registry, self.instance = registry, instance
        self.owned: set[str] = set()
        self.exports_global = True  # until the first heartbeat says otherwise
        self._free_since: dict[str, float] = {}

    async def renew(self) -> None:
        """Take or keep the leases this instance should hold, hand over the others (the leases
        taken or kept in one pipeline: a replica may own thousands)."""
        me = self.instance
        live = await self.registry.heartbeat(me, int(time.time() * 1000), LEASE_MS)
        self.exports_global = preferred_owner(GLOBAL_SERIES_OWNER, live) == me
        cids = await self.registry.classifiers()
        holders = await self.registry.lease_holders(cids)
        take = []
        for cid in cids:
            holder = holders[cid]
            preferred = preferred_owner(cid, live) == me
            if holder is None:
                seen_free = self._free_since.setdefault(cid, time.monotonic())
                if preferred or time.monotonic() - seen_free >= LEASE_MS / 3000:
                    take.append(cid)
                continue
            self._free_since.pop(cid, None)
            if holder != me:
                continue
            if not preferred and preferred_owner(cid, live) is not None:
                await self.registry.release_lease(cid, me)  # hand over to the preferred live instance
            else:
                take.append(cid)
        held = await self.registry.acquire_leases(take, me, LEASE_MS)
        self.owned = {cid for cid, ok in zip(take, held) if ok}
        self._free_since = {c: t for c, t in self._free_since.items() if c in holders}

    async def release_all(self) -> None:
        """On shutdown: give every lease back so another instance takes over at once."""
        for cid in list(self.owned):
            await self.registry.release_lease(cid, self.instance)
        self.owned = set()
        await self.registry.leave(self.instance)
