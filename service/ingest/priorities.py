"""Sampling priorities drawn from an item's id, for the classifiers of a review group that shares
items (``share_items``, `requests.shared_items`; issue 52).

A reservoir keeps the lowest priorities of its stratum, and the request loop samples every item at
or below its stratum's threshold (`stats.streams`).  With independent random priorities a model and
its shadow scoring the same items would sample nearly disjoint sets; with the priority a hash of the
item id, an item low for one is low for every member, so the members' samples overlap as far as
their thresholds allow (Ohlsson 1995's permanent random numbers, coordinated Poisson sampling).  A
keyed hash (BLAKE2b, keyed by the group's name) is a uniform on [0, 1) independent of the item's
score and label, so each member's sample stays a simple random sample within its strata.  The chunk
is hashed with the item: an item scored again in a later chunk draws afresh, so the samples of
different chunks stay independent, as the windows that pool them assume (`chunks.window`)."""

from __future__ import annotations

from hashlib import blake2b

import numpy as np

#: 53 bits: every value is an exact double in [0, 1)
_BITS = 53


def item_priorities(item_ids: list[str], chunks: np.ndarray, group: str) -> np.ndarray:
    """The priority of each item id in its chunk (`chunks`, the chunk id of each): the BLAKE2b hash of
    ``<chunk>:<item_id>`` keyed by `group`, as a uniform on [0, 1)."""
    key = group.encode()
    digests = b"".join(blake2b(f"{t}:{item}".encode(), digest_size=8, key=key).digest()
                       for t, item in zip(chunks.tolist(), item_ids))
    words = np.frombuffer(digests, dtype=">u8").astype(np.uint64)
    return (words >> np.uint64(64 - _BITS)).astype(np.float64) / float(1 << _BITS)
