"""The inbound codec: the batch parsers of the records the service consumes, a poll's worth of
Kafka values at a time (the consumers' hot path).

`parse_scores` and `parse_labels` turn the values into columns (`ScoreBatch`, `LabelBatch`:
numpy arrays and lists) plus a list of `Reject` records, applying the rules of the models in
`stratameter.schemas.messages` without building a model per record.  They never raise on
record content; every input index ends up either in ``batch.index`` or in a reject.

Each value is decoded and type-checked in one pass by msgspec into a `msgspec.Struct`
(`_ScoreWire`, `_LabelWire`: JSON types, string lengths, a finite score); the few
rules a struct cannot say (the classifier id, event times, the context's compact size,
the event-time window) follow in a short loop.  Everything the fast path does not
accept is set aside and diagnosed by the reference rules
(`stratameter.schemas.reference_rules`, on ``orjson.loads``), which give each rejected record
its reason code and a detail naming the field.

`parse_scores` also applies the service's event-time window when its caller
passes one (`stratameter.schemas.messages.event_time_window`, computed per batch from the
wall clock): an event time after the window is ``event_time_in_future``, before it
``event_time_too_late``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Annotated, Any, NamedTuple

import msgspec
import numpy as np
import orjson

from .batches import LabelBatch, Reject, ScoreBatch
from .messages import (
    MAX_CONTEXT_BYTES,
    MAX_ITEM_ID_CHARS,
    MAX_LABELER_ID_CHARS,
    MAX_RECORD_BYTES,
    MAX_REQUEST_ID_CHARS,
    EPOCH_MS_FROM,
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    event_time_to_ms,
    is_classifier_id,
    time_to_ms,
)
from .reference_rules import ANY_TIME, diagnose, label_row, score_row

__all__ = ["DEFAULT_THRESHOLD", "parse_labels", "parse_scores"]

#: threshold for classifiers missing from a `threshold_for` mapping
DEFAULT_THRESHOLD = 0.5

_DOUBLE_MAX = sys.float_info.max

# --------------------------------------------------------------------------- the fast path's structs


class _ScoreWire(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A score record as the fast path decodes it: JSON types, item_id length and a finite
    score checked in the one decoding pass.  The classifier id, the event time, the context's
    compact size and the event-time window are checked in `parse_scores`."""

    classifier_id: str
    item_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ITEM_ID_CHARS)]
    score: Annotated[float, msgspec.Meta(ge=-_DOUBLE_MAX, le=_DOUBLE_MAX)]  # an integer is read as a float
    predicted_positive: bool | None = None
    event_time: int | float | str | None = None
    context: dict[str, Any] | None = None


class _LabelWire(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A label record as the fast path decodes it (``labeled_at`` is checked in `parse_labels`)."""

    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID_CHARS)]
    label: bool | None  # required; null = skipped
    labeler_id: Annotated[str, msgspec.Meta(max_length=MAX_LABELER_ID_CHARS)] | None = None
    labeled_at: int | float | str | None = None


class _ScoreWireExtra(_ScoreWire, forbid_unknown_fields=False):
    """`_ScoreWire` for a record with fields of the producer's own (ignored)."""


class _LabelWireExtra(_LabelWire, forbid_unknown_fields=False):
    """`_LabelWire` for a record with fields of the producer's own (ignored)."""


# A record with a field the struct does not declare fails the strict decoder; it is then
# decoded by the ``...Extra`` struct, but only after ``orjson.loads`` accepted the whole value:
# msgspec skips an unknown field without reading it (invalid UTF-8 or a number out of the
# double range there would pass), and the contract rejects such a value as ``invalid_json``.
class _Codec(NamedTuple):
    strict: Callable[[Any], Any]  # the strict struct's decode
    extra: Callable[[Any], Any]  # the lenient struct's decode


_SCORE_CODEC = _Codec(msgspec.json.Decoder(_ScoreWire).decode, msgspec.json.Decoder(_ScoreWireExtra).decode)
_LABEL_CODEC = _Codec(msgspec.json.Decoder(_LabelWire).decode, msgspec.json.Decoder(_LabelWireExtra).decode)


def _decode_again(value: Any, exc: Exception, codec: _Codec, decode: Callable[[Any], Any]
                  ) -> tuple[Any, Callable[[Any], Any]]:
    """After `decode` (a parser's current decode function) raised `exc` on `value`: the
    struct, or None, and the decode function for the next values.  A value the strict
    struct refused with a field of the producer's own is decoded by the lenient struct once
    orjson accepted the whole value, and the next values are read that way first (they likely
    have such fields too).  Called only when decoding failed: the parsers' loops decode
    inline, so the fallback costs nothing on a batch of plain records."""
    if decode is not codec.strict or not isinstance(exc, msgspec.ValidationError):
        return None, decode
    try:
        return _lenient(value, codec), partial(_lenient, codec=codec)
    except Exception:  # not JSON to orjson, or invalid by the lenient struct as well
        return None, decode


def _lenient(value: Any, codec: _Codec) -> Any:
    """`value` by the lenient struct, once ``orjson.loads`` accepted it whole (raises if not)."""
    orjson.loads(value)
    return codec.extra(value)


def _decode_each(values: Sequence[Any], max_bytes: int, codec: _Codec, bad: list[int]) -> Iterator[tuple[int, Any]]:
    """(position, struct) of each value that decodes (`_decode_again` after a failure); the
    positions of the others (a tombstone, an empty value or one over `max_bytes` too) go to `bad`."""
    decode = codec.strict
    for i, v in enumerate(values):
        r = None
        if v and len(v) <= max_bytes:
            try:
                r = decode(v)
            except Exception as exc:
                r, decode = _decode_again(v, exc, codec, decode)
        if r is None:
            bad.append(i)
        else:
            yield i, r


# --------------------------------------------------------------------------- scores


def _threshold_resolver(threshold_for: Callable[[str], float] | Mapping[str, float] | float
                        ) -> Callable[[str], float]:
    if callable(threshold_for):
        return threshold_for
    if isinstance(threshold_for, Mapping):
        mapping = threshold_for

        def lookup(cid: str) -> float:
            try:
                return mapping[cid]
            except KeyError:
                return DEFAULT_THRESHOLD
        return lookup
    if isinstance(threshold_for, bool) or not isinstance(threshold_for, (int, float)):
        raise TypeError(f"threshold_for must be a callable, a mapping or a number, got {type(threshold_for).__name__}")
    value = float(threshold_for)
    return lambda cid: value


def parse_scores(
    values: Sequence[bytes | None],
    timestamps_ms: Sequence[int],
    threshold_for: Callable[[str], float] | Mapping[str, float] | float = DEFAULT_THRESHOLD,
    max_bytes: int = MAX_RECORD_BYTES,
    window: tuple[int, int] | None = None,
) -> tuple[ScoreBatch, list[Reject]]:
    """Parse a batch of ``stratameter.scores`` values (see `stratameter.schemas.messages.ScoreRecord`).

    `timestamps_ms` are the Kafka record timestamps (the default event time).
    `threshold_for` gives a classifier's decision threshold, used when a record
    has no ``predicted_positive``: a callable ``classifier_id -> threshold``
    (called once per classifier per batch), a mapping (classifiers not in it
    use `DEFAULT_THRESHOLD`), or one number for all.
    `window` is ``(min_ms, max_ms)``, the event times accepted (both ends
    included; the service computes it per batch with `event_time_window`): a
    later event time is rejected as ``event_time_in_future``, an earlier one as
    ``event_time_too_late``.  None accepts every valid time (tests, tools).

    Returns the accepted records as a `ScoreBatch` (in input order) and the
    others as `Reject` records (in input order); together they cover every input
    position exactly once.

    The fast path (`_score_rows`) accepts exactly the valid records (the rules of
    `score_row`); what it sets aside is diagnosed by the reference rules (`_settle`).
    """
    n = len(values)
    if len(timestamps_ms) != n:
        raise ValueError(f"{n} values but {len(timestamps_ms)} timestamps")
    window = ANY_TIME if window is None else (int(window[0]), int(window[1]))
    resolve = _threshold_resolver(threshold_for)
    thresholds: dict[str, float] = {}   # valid classifier ids seen in this batch -> threshold

    def threshold(cid: str) -> float:
        thr = thresholds.get(cid)
        if thr is None:
            thr = thresholds[cid] = float(resolve(cid))
        return thr

    bad: list[int] = []
    flat = _score_rows(values, timestamps_ms, max_bytes, thresholds.get, threshold, window, bad)
    columns = [flat[k::6] for k in range(6)]
    index, rejects, late = _settle(n, bad, values, max_bytes,
                                   lambda r, i: score_row(r, timestamps_ms[i], threshold, window))
    if late:
        index, columns = _merge_late_columns(index, columns, late)
    cid, item, score, positive, event_ms, context = columns
    batch = ScoreBatch(index=index, classifier_id=cid, item_id=item, score=np.asarray(score, dtype=np.float64),
                       predicted_positive=np.asarray(positive, dtype=np.bool_),
                       event_time_ms=np.asarray(event_ms, dtype=np.int64), context=context)
    return batch, rejects


def _score_rows(values: Sequence[Any], timestamps_ms: Sequence[int], max_bytes: int,
                known: Callable[[str], float | None], threshold: Callable[[str], float], window: tuple[int, int],
                bad: list[int]) -> list:
    """The fast path: each value decoded and type-checked in one pass by msgspec (`_ScoreWire`),
    then the rules a struct cannot say (classifier id, event time, context size, window).
    Accepted rows go flat into one list of untracked objects, six a record (no per-record
    containers for the garbage collector); the others' positions go to `bad` (`_settle`).
    `known(cid)`: the threshold of an id found valid in this batch, else None."""
    flat: list[Any] = []
    ext = flat.extend
    note = bad.append
    decode, dumps, codec = _SCORE_CODEC.strict, orjson.dumps, _SCORE_CODEC
    lo, hi = EPOCH_MS_FROM, MAX_EPOCH_MS  # an int event_time in here is epoch ms as it is
    wlo, whi = window
    to_ms = event_time_to_ms
    for i, v in enumerate(values):
        if not v or len(v) > max_bytes:
            note(i)
            continue
        try:
            r = decode(v)
        except Exception as exc:  # a field of the producer's own, not JSON, invalid, ...
            r, decode = _decode_again(v, exc, codec, decode)
            if r is None:
                note(i)
                continue
        cid = r.classifier_id
        thr = known(cid)
        if thr is None:
            if not is_classifier_id(cid):
                note(i)
                continue
            thr = threshold(cid)
        et = r.event_time
        if et is None:
            et = timestamps_ms[i]
        elif type(et) is not int or not lo <= et <= hi:
            et = to_ms(et)
            if et is None:
                note(i)
                continue
        if not wlo <= et <= whi:
            note(i)
            continue
        ctx = r.context
        if ctx is not None:
            try:
                ctx = dumps(ctx)
            except orjson.JSONEncodeError:  # nested too deeply, an integer beyond 64 bits
                note(i)
                continue
            if len(ctx) > MAX_CONTEXT_BYTES:
                note(i)
                continue
            ctx = ctx.decode()  # see `ScoreBatch.context`
        s = r.score
        pp = r.predicted_positive
        ext((cid, r.item_id, s, s >= thr if pp is None else pp, et, ctx))
    return flat


# --------------------------------------------------------------------------- what the fast path set aside


def _settle(n: int, bad: list[int], values, max_bytes: int, row) -> tuple[np.ndarray, list[Reject], list[tuple]]:
    """Diagnose the records the fast path set aside with the reference rules `row(record, i)`.
    Returns the positions the fast path accepted, the rejects with their reasons, and the
    valid records the fast path passed over (none expected) as ``(position, *row)``."""
    rejects: list[Reject] = []
    late: list[tuple] = []
    for i in bad:
        out = diagnose(values[i], max_bytes, lambda r, i=i: row(r, i))
        if len(out) == 2:
            rejects.append(Reject(i, *out))
        else:
            late.append((i, *out))
    return _accepted_index(n, bad), rejects, late


def _accepted_index(n: int, bad: list[int]) -> np.ndarray:
    if not bad:
        return np.arange(n, dtype=np.int64)
    keep = np.ones(n, dtype=np.bool_)
    keep[bad] = False
    return np.flatnonzero(keep).astype(np.int64, copy=False)


def _merge_late(index: np.ndarray, flat: list[Any], late: list[tuple], width: int
                ) -> tuple[np.ndarray, list[Any]]:
    """Add rows accepted by the reference check to the fast path's, in input order."""
    rows = [flat[j * width:(j + 1) * width] for j in range(len(index))]
    pairs = sorted([*zip(index.tolist(), rows), *((t[0], list(t[1:])) for t in late)], key=lambda p: p[0])
    merged = np.array([p[0] for p in pairs], dtype=np.int64)
    return merged, [x for _, row in pairs for x in row]


def _merge_late_columns(index: np.ndarray, columns: list, late: list[tuple]) -> tuple[np.ndarray, list]:
    """`_merge_late` for a batch held as columns."""
    width = len(columns)
    rows = zip(*(c.tolist() if isinstance(c, np.ndarray) else c for c in columns))
    index, flat = _merge_late(index, [x for row in rows for x in row], late, width)
    return index, [flat[k::width] for k in range(width)]


# --------------------------------------------------------------------------- labels


def parse_labels(
    values: Sequence[bytes | None],
    timestamps_ms: Sequence[int],
    max_bytes: int = MAX_RECORD_BYTES,
) -> tuple[LabelBatch, list[Reject]]:
    """Parse a batch of ``stratameter.labels`` values (see `stratameter.schemas.messages.LabelRecord`).

    `timestamps_ms` (Kafka record timestamps) are the default ``labeled_at``.
    Whether a request_id is known, answered twice or expired is the service's
    business, not the parser's.  Accepted and rejected records together cover
    every input position exactly once, each in input order.
    """
    n = len(values)
    if len(timestamps_ms) != n:
        raise ValueError(f"{n} values but {len(timestamps_ms)} timestamps")
    flat: list[Any] = []
    ext = flat.extend
    bad: list[int] = []
    lo, hi = MIN_EPOCH_MS, MAX_EPOCH_MS
    for i, r in _decode_each(values, max_bytes, _LABEL_CODEC, bad):
        at = r.labeled_at  # absent: the record timestamp; an int in range: epoch ms as it is
        at = timestamps_ms[i] if at is None else at if type(at) is int and lo <= at <= hi else time_to_ms(at)
        if at is None:  # not a wire time
            bad.append(i)
        else:
            ext((r.request_id, r.label, r.labeler_id, at))
    index, rejects, late = _settle(n, bad, values, max_bytes, lambda r, i: label_row(r, timestamps_ms[i]))
    columns = [flat[k::4] for k in range(4)]
    if late:
        index, columns = _merge_late_columns(index, columns, late)
    request_id, label, labeler_id, labeled_at = columns
    batch = LabelBatch(index=index, request_id=request_id, label=label, labeler_id=labeler_id,
                       labeled_at_ms=np.asarray(labeled_at, dtype=np.int64))
    return batch, rejects

