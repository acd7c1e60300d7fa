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


def weight(classifier_id: str, instance: str) -> int:
    digest = hashlib.blake2b(f"{classifier_id}\0{instance}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preferred_owner(classifier_id: str, instances: list[str]) -> str | None:
    """The live instance that should own `classifier_id` (None if there is none)."""
    if not instances:
        return None
    return max(instances, key=lambda inst: (weight(classifier_id, inst), inst))
