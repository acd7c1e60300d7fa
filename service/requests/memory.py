"""What the request loop remembers of one classifier between its steps.

Each field only saves Redis round trips or a re-plan: a loop that forgets a classifier (its lease
lost, or the classifier forgotten for silence) reads everything again on its next step and plans
the same.  One object a classifier, so forgetting a classifier is one deletion, and what is kept
per chunk is trimmed to the chunks the loop still steps (`keep_chunks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Purge:
    """A state's chunks at its last purge of chunks past the retention (`RequestLoop._chunk_ids`)."""

    newest: int  # the newest chunk id then: the next purge waits for a newer chunk
    purged_through: int | None  # the newest closed chunk purged; older ones are skipped once closed


@dataclass
class Prior:
    """The allocation's prior of one chunk of one state: the mean calibrated score per stratum,
    read off the chunk's histogram when it had `size` items (read again once it grows by a tenth)."""

    size: float
    q: np.ndarray


@dataclass
class ClassifierMemory:
    """The request loop's memory of one classifier (and of its predicted negatives' state)."""

    #: per chunk stepped: what its last step looked at (`ChunkSnapshot.key`); unchanged: nothing to plan
    seen: dict[int, tuple] = field(default_factory=dict)
    #: per older chunk whose last step changed nothing: its pending requests per state then (it is
    #: read again only once they change)
    quiet: dict[int, tuple] = field(default_factory=dict)
    #: the chunks whose last step found them finished while still open: each needs one step once it
    #: has closed, to be judged closed (`lifecycle.chunk_status`), budget or not
    unjudged: set[int] = field(default_factory=set)
    #: older chunks closed and finished: not read again
    finished: set[int] = field(default_factory=set)
    #: whether the loop has read the classifier's older chunks once since it started or regained it:
    #: only then does `unjudged` know every chunk finished while open (a restart forgets it)
    surveyed: bool = False
    #: per state: its last purge
    purges: dict[str, Purge] = field(default_factory=dict)
    #: per state and chunk: the allocation's prior
    priors: dict[str, dict[int, Prior]] = field(default_factory=dict)
    #: per state: pending request id -> its chunk (each request's chunk read once)
    request_chunks: dict[str, dict[str, int]] = field(default_factory=dict)
    #: when its joined requests were last resolved (epoch ms), and how many that left waiting
    #: (`shared_items.RESOLVE_EVERY_MS`)
    resolved_ms: int = 0
    joins_waiting: int = 0

    def keep_chunks(self, stepped) -> None:
        """Forget what is kept per chunk but for the chunks in `stepped`: a long-running replica
        must not gain an entry per classifier and chunk for good."""
        keep = set(stepped)
        for by_chunk in [self.seen, self.quiet, *self.priors.values()]:
            for t in [t for t in by_chunk if t not in keep]:
                del by_chunk[t]
        self.unjudged &= keep
