"""The typed calls and replies of the two scripts sent in batches: INGEST (`chunk_store.ChunkStore.
apply_ingest`, built by `ingest.ingestor`) and LABEL (`request_store.RequestStore.apply_labels`,
built by `labels.folder`).  Each maps field by field onto the script's ARGV and reply (the header
of ``lua/ingest.lua`` and ``lua/label.lua``); the Redis protocol itself is unchanged."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from .connection import text
from .scripts import EncodedIngest


class IngestRefusal(enum.IntEnum):
    """Why INGEST's chunk guard refused a chunk of a call (the number the script returns, named in
    the header of ``lua/ingest.lua``); nothing of the call is applied then."""

    STALE_CUTS = 1  # the chunk's cuts version is not the payload's, or it has none: reload its cuts
    RESTRATIFY_FIRST = 2  # the provisional chunk would reach its cap: RESTRATIFY it first
    BINS_CHANGED = 3  # its histogram is not what the payload's runs expect (`ingest.bins`): read it again


@dataclass(frozen=True, slots=True)
class IngestCall:
    """One classifier state's aggregated batch from one scores partition, applied only if the
    partition's stored offset is `expected_offset` (then it becomes `new_offset`)."""

    state_id: str
    partition: int | str  # the name the state keeps the partition's offset under
    expected_offset: int
    new_offset: int
    payload: EncodedIngest  # `scripts.encode_ingest`'s
    #: (chunk, strata whose reservoirs the payload adds to) in the payload's order
    #: (`keys.ingest_chunks`): they name the KEYS; None: read from the payload
    chunks: list[tuple[str, list[int]]] | None = None


class ReservoirCutoff(NamedTuple):
    """A full reservoir the call touched: a candidate above `cutoff` can never enter it."""

    chunk: int
    stratum: int
    cutoff: float  # the larger of the largest priority kept and the stratum's threshold


class ChunkRefusal(NamedTuple):
    """A chunk INGEST's guard refused, and why."""

    chunk: int
    reason: IngestRefusal


@dataclass(frozen=True, slots=True)
class IngestReply:
    """INGEST's answer to one `IngestCall`.  Not `applied`: another writer moved the offset, or a
    chunk's guard refused (`refused`); the caller re-aggregates from `stored_offset`."""

    applied: bool
    stored_offset: int  # the partition's offset as the state holds it after the call
    cutoffs: list[ReservoirCutoff]  # applied calls only
    refused: list[ChunkRefusal]  # refused calls only (empty: the offset guard refused)


def ingest_reply(raw: list) -> IngestReply:
    """Parse INGEST's reply: ``{1, stored, (chunk, stratum, cutoff)...}`` or ``{0, stored, (chunk,
    reason)...}``."""
    if int(raw[0]) == 1:
        return IngestReply(True, int(raw[1]), [ReservoirCutoff(int(raw[i]), int(raw[i + 1]), float(raw[i + 2]))
                                               for i in range(2, len(raw) - 2, 3)], [])
    return IngestReply(False, int(raw[1]), [], [ChunkRefusal(int(raw[i]), IngestRefusal(int(raw[i + 1])))
                                                for i in range(2, len(raw) - 1, 2)])


@dataclass(frozen=True, slots=True)
class LabelCall:
    """One label record for LABEL: folded once into its request's chunk, guarded by the labels
    partition's offset."""

    state_id: str
    partition: int | str  # the name the state keeps the partition's offset under
    offset: int
    request_id: str
    label: str  # "1", "0", or "null" (skipped)
    now_ms: int
    labeler: str


@dataclass(frozen=True, slots=True)
class LabelReply:
    """LABEL's answer to one `LabelCall`.  `outcome`: ``replay`` and ``rolled_back`` (with the
    `stored_offset`), ``no_state``, ``unknown``, ``duplicate``, ``expired``, ``skipped`` or
    ``accepted`` (the last three with the request's `chunk` and `stratum`, when it was pending)."""

    outcome: str
    stored_offset: int | None = None
    chunk: int | None = None
    stratum: int | None = None


#: The outcomes whose reply carries the offset the state applied, not a chunk and a stratum.
_WITH_OFFSET = ("replay", "rolled_back")


def label_reply(raw: list) -> LabelReply:
    """Parse LABEL's reply ``{outcome[, stored offset | chunk, stratum]}`` (``retry`` is the store's
    own business and never returned)."""
    outcome = text(raw[0])
    if outcome in _WITH_OFFSET:
        return LabelReply(outcome, stored_offset=int(raw[1]))
    return LabelReply(outcome, chunk=int(raw[1]) if len(raw) > 1 else None,
                      stratum=int(raw[2]) if len(raw) > 2 else None)
