"""What the inbound parsers (`stratameter.schemas.inbound`) return: the accepted records of a
batch as columns (`ScoreBatch`, `LabelBatch`) and the rejected ones as `Reject` records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["LabelBatch", "Reject", "ScoreBatch"]


class Reject(NamedTuple):
    """A rejected input record: its position in the batch, a reason code, a message."""

    index: int
    reason: str
    detail: str


@dataclass(frozen=True, slots=True, eq=False)
class ScoreBatch:
    """Accepted score records as columns; row ``j`` came from input position ``index[j]``.

    A context is kept as text (``str``), not as the ``bytes`` orjson returns: a batch keeps
    thousands of them alive, and orjson's output buffers, kept, come from fresh memory pages
    (a page fault each few records, about 0.4 us a record on the benchmark's machine), while
    short strings come from Python's small-object allocator."""

    index: np.ndarray                   # int64
    classifier_id: list[str]
    item_id: list[str]
    score: np.ndarray                   # float64, finite
    predicted_positive: np.ndarray      # bool, resolved against the classifier's threshold
    event_time_ms: np.ndarray           # int64
    context: list[str | None]           # the object as compact JSON text (orjson's), or None

    def __len__(self) -> int:
        return len(self.classifier_id)

    def subset(self, keep: np.ndarray) -> "ScoreBatch":
        """The rows where the boolean mask `keep` is true."""
        rows = np.flatnonzero(keep)
        return ScoreBatch(self.index[rows], [self.classifier_id[j] for j in rows], [self.item_id[j] for j in rows],
                          self.score[rows], self.predicted_positive[rows], self.event_time_ms[rows],
                          [self.context[j] for j in rows])


@dataclass(frozen=True, slots=True, eq=False)
class LabelBatch:
    """Accepted label records as columns; row ``j`` came from input position ``index[j]``."""

    index: np.ndarray                   # int64
    request_id: list[str]
    label: list[bool | None]            # None = skipped
    labeler_id: list[str | None]
    labeled_at_ms: np.ndarray           # int64

    def __len__(self) -> int:
        return len(self.request_id)

