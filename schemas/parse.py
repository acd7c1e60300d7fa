"""The wire codec: every message on stratameter's topics is decoded and encoded here.

Inbound, a poll's worth of Kafka values at a time (the consumers' hot path):
`parse_scores` and `parse_labels` turn the values into columns (numpy arrays and
lists) plus a list of `Reject` records, applying the rules of the models in
`stratameter.schemas.messages` without building a model per record.  They never raise on
record content; every input index ends up either in ``batch.index`` or in a reject.

Each value is decoded and type-checked in one pass by msgspec into a `msgspec.Struct`
(`_ScoreWire`, `_LabelWire`: JSON types, string lengths, a finite score); the few
rules a struct cannot say (the classifier id, event times, the context's compact size,
the event-time window) follow in a short loop.  Everything the fast path does not
accept is set aside and diagnosed by the reference rules (`_score_row`, `_label_row`,
on ``orjson.loads``), which give each rejected record its reason code and a detail
naming the field.  A record that orjson cannot parse is parsed again by the standard
library (only for bad records) so that e.g. ``"score": 1e999`` or ``"score": NaN`` is
reported as ``not_finite:score`` rather than as a generic ``invalid_json``.

`parse_scores` also applies the service's event-time window when its caller
passes one (`event_time_window`, computed per batch from the wall clock): an
event time after the window is ``event_time_in_future``, before it
``event_time_too_late``.

Outbound: `label_request_bytes` and `dead_letter_record` serialize the service's
messages; `score_record_bytes` and `label_record_bytes` the ones producers send (the
benchmark, tools, tests).  `decode_label_request` and `decode_dead_letter` read the
service's messages back, checked against their models.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, NamedTuple

import msgspec
import numpy as np
import orjson

from .messages import (
    CLASSIFIER_ID_RULE,
    MAX_CONTEXT_BYTES,
    MAX_DEAD_LETTER_DETAIL_BYTES,
    MAX_DEAD_LETTER_KEY_BYTES,
    MAX_DEAD_LETTER_ORIGINAL_BYTES,
    MAX_ITEM_ID_CHARS,
    MAX_LABELER_ID_CHARS,
    MAX_RECORD_BYTES,
    MAX_REQUEST_ID_CHARS,
    EPOCH_MS_FROM,
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    DeadLetter,
    LabelRequest,
    event_time_to_ms,
    event_time_window,
    format_time,
    is_classifier_id,
    time_to_ms,
    to_epoch_ms,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "LabelBatch",
    "Reject",
    "ScoreBatch",
    "dead_letter_record",
    "decode_dead_letter",
    "decode_label_request",
    "event_time_window",
    "label_record_bytes",
    "label_request_bytes",
    "parse_labels",
    "parse_scores",
    "score_record_bytes",
]

#: threshold for classifiers missing from a `threshold_for` mapping
DEFAULT_THRESHOLD = 0.5

_MISSING = object()
#: a window that accepts every valid event time (`parse_scores` without a window)
_ANY_TIME = (-(2**63), 2**63 - 1)
_DOUBLE_MAX = sys.float_info.max


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


# --------------------------------------------------------------------------- helpers

_JSON_TYPES = {str: "string", bool: "boolean", int: "number", float: "number", type(None): "null",
               list: "array", dict: "object"}


def _jtype(x: Any) -> str:
    return _JSON_TYPES.get(type(x), type(x).__name__)


def _show(x: Any, limit: int = 80) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[: limit - 3] + "..."


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


def _precheck(value: Any, max_bytes: int) -> tuple[str, str] | None:
    """Reason for a value that is not parsed at all (tombstone, too large), else None."""
    if value is None:
        return "tombstone", "the value is null (tombstone)"
    if not value:
        return "tombstone", "the value is empty"
    if len(value) > max_bytes:
        return "too_large", f"the value is {len(value)} bytes, more than the limit of {max_bytes}"
    return None


def _loads_slow(value: Any, exc: Exception) -> tuple[Any, tuple[str, str] | None]:
    """After orjson failed: the standard library's reading (it accepts NaN, Infinity, 1e999 -> inf)
    so that the field checks can name the culprit; `invalid_json` if that fails too."""
    invalid = ("invalid_json", f"the value is not valid JSON: {_show(str(exc), 200)}")
    try:
        return json.loads(value), invalid
    except Exception:  # ValueError, UnicodeDecodeError, RecursionError, ...
        return _MISSING, invalid


def _bad_time(x: Any, field: str) -> str:
    if type(x) is str:
        return (f"{field}: {_show(x)} is not an RFC 3339 date-time with offset "
                "(e.g. 2024-06-10T08:13:20Z or 2024-06-10T10:13:20+02:00)")
    if type(x) in (int, float):
        return f"{field}: {_show(x)} epoch milliseconds is outside years 1-9999 or not finite"
    return f"{field}: expected an RFC 3339 string or epoch milliseconds, got {_jtype(x)}"


def _show_ms(ms: int) -> str:
    """An epoch-ms time for a message: RFC 3339 when in years 1-9999, else the number."""
    return format_time(ms) if MIN_EPOCH_MS <= ms <= MAX_EPOCH_MS else f"{ms} ms since the epoch"


def _event_time(r: dict, ts: int) -> int | tuple[str, str]:
    """The record's event time in epoch ms (the record timestamp `ts` when absent or null),
    or the ``bad_event_time`` reject."""
    value = r.get("event_time")
    if value is None:
        return ts
    ms = event_time_to_ms(value)
    if ms is not None:
        return ms
    t = type(value)
    if t is str:
        return "bad_event_time", _bad_time(value, "event_time")
    if t in (int, float):
        return ("bad_event_time", f"event_time: {_show(value)} is negative, not finite or after year 9999 "
                "(a number below 1e11 is epoch seconds, else epoch milliseconds)")
    return "bad_event_time", f"event_time: expected an RFC 3339 string or an epoch number, got {_jtype(value)}"


def _outside_window(r: dict, ms: int, window: tuple[int, int]) -> tuple[str, str] | None:
    """The ``event_time_in_future`` / ``event_time_too_late`` reject of an event time outside
    `window`, else None."""
    lo, hi = window
    if lo <= ms <= hi:
        return None
    what = (f"event_time: {_show_ms(ms)}" if r.get("event_time") is not None
            else f"event_time: absent; the record timestamp {_show_ms(ms)}")
    if ms > hi:
        return ("event_time_in_future", f"{what} is after {_show_ms(hi)}, the service clock plus "
                "STRATAMETER_MAX_EVENT_TIME_SKEW_SECONDS")
    return ("event_time_too_late", f"{what} is before {_show_ms(lo)}: its chunk has closed "
            "(STRATAMETER_ALLOWED_LATENESS_SECONDS after its end)")


# --------------------------------------------------------------------------- scores


def _absent(r: dict, field: str, expected: str) -> tuple[str, str]:
    """The reject for a required field that is None: missing, or present as null."""
    if field in r:
        return f"wrong_type:{field}", f"{field}: expected {expected}, got null"
    return f"missing_field:{field}", f"{field}: required"


def _check_text(r: dict, field: str, limit: int) -> tuple[str, str] | None:
    """The reject of a required string field (``item_id``, ``request_id``) that is absent, not
    a string, or not 1-`limit` characters (``bad_<field>``), else None."""
    value = r.get(field)
    if value is None:
        return _absent(r, field, "a string")
    if type(value) is not str:
        return f"wrong_type:{field}", f"{field}: expected a string, got {_jtype(value)}"
    if not 0 < len(value) <= limit:
        return f"bad_{field}", f"{field}: {len(value)} characters, must be 1-{limit}"
    return None


def _check_classifier_id(r: dict) -> tuple[str, str] | None:
    cid = r.get("classifier_id")
    if cid is None:
        return _absent(r, "classifier_id", "a string")
    if type(cid) is not str:
        return "wrong_type:classifier_id", f"classifier_id: expected a string, got {_jtype(cid)}"
    if not is_classifier_id(cid):
        return "bad_classifier_id", f"classifier_id: {_show(cid)} is not {CLASSIFIER_ID_RULE}"
    return None


def _optional_time(r: dict, field: str, default_ms: int) -> int | tuple[str, str]:
    """An optional RFC 3339 / epoch-ms field in epoch ms (`default_ms` when absent),
    or the ``(bad_<field>, detail)`` reject."""
    value = r.get(field)
    if value is None:
        return default_ms
    ms = time_to_ms(value)
    if ms is None:
        return f"bad_{field}", _bad_time(value, field)
    return ms


def _score_row(r: Any, ts: int, threshold: Callable[[str], float], window: tuple[int, int] = _ANY_TIME
               ) -> tuple | tuple[str, str]:
    """The full rule set for one parsed score record.

    Returns ``(reason, detail)`` for a reject, else the 6-tuple row
    ``(classifier_id, item_id, score, predicted_positive, event_time_ms, context_json)``.
    The event-time window is checked last: a record outside it is otherwise valid.
    This is the reference: the fast path of `parse_scores` (`_ScoreWire` and its loop) accepts
    exactly what it accepts, and it names the reason of every record the fast path sets aside.
    """
    if type(r) is not dict:
        return "not_object", f"the value is a JSON {_jtype(r)}, not an object"
    bad = _check_classifier_id(r)
    if bad:
        return bad
    cid = r["classifier_id"]
    bad = _check_text(r, "item_id", MAX_ITEM_ID_CHARS)
    if bad:
        return bad
    item = r["item_id"]
    s = r.get("score")
    if s is None:
        return _absent(r, "score", "a number")
    if type(s) is int:
        try:
            s = float(s)
        except OverflowError:
            return "not_finite:score", "score: the number is outside the double range"
    elif type(s) is not float:
        return "wrong_type:score", f"score: expected a number, got {_jtype(s)}"
    if s - s != 0.0:
        return "not_finite:score", f"score: {s!r} is not finite (outside the double range or NaN)"
    pp = r.get("predicted_positive")
    if pp is None:
        pp = s >= threshold(cid)
    elif type(pp) is not bool:
        return "wrong_type:predicted_positive", f"predicted_positive: expected a boolean, got {_jtype(pp)}"
    et = _event_time(r, ts)
    if type(et) is tuple:
        return et
    ctx = r.get("context")
    if ctx is not None:
        if type(ctx) is not dict:
            return "wrong_type:context", f"context: expected an object, got {_jtype(ctx)}"
        try:
            ctx = orjson.dumps(ctx)
        except orjson.JSONEncodeError as exc:
            return "context_too_large", f"context: cannot be serialized ({exc})"
        if len(ctx) > MAX_CONTEXT_BYTES:
            return "context_too_large", f"context: {len(ctx)} bytes serialized, more than {MAX_CONTEXT_BYTES}"
        ctx = ctx.decode()
    outside = _outside_window(r, et, window)
    if outside:
        return outside
    return cid, item, s, pp, et, ctx


def _settle(n: int, bad: list[int], values, max_bytes: int, row) -> tuple[np.ndarray, list[Reject], list[tuple]]:
    """Diagnose the records the fast path set aside with the reference rules `row(record, i)`.
    Returns the positions the fast path accepted, the rejects with their reasons, and the
    valid records the fast path passed over (none expected) as ``(position, *row)``."""
    rejects: list[Reject] = []
    late: list[tuple] = []
    for i in bad:
        out = _diagnose(values[i], max_bytes, lambda r, i=i: row(r, i))
        if len(out) == 2:
            rejects.append(Reject(i, *out))
        else:
            late.append((i, *out))
    return _accepted_index(n, bad), rejects, late


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
    `_score_row`); what it sets aside is diagnosed by the reference rules (`_settle`).
    """
    n = len(values)
    if len(timestamps_ms) != n:
        raise ValueError(f"{n} values but {len(timestamps_ms)} timestamps")
    window = _ANY_TIME if window is None else (int(window[0]), int(window[1]))
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
                                   lambda r, i: _score_row(r, timestamps_ms[i], threshold, window))
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



def _diagnose(value: Any, max_bytes: int, check: Callable[[Any], tuple]) -> tuple:
    """The reference verdict on one raw value: ``(reason, detail)`` or a row from `check`."""
    early = _precheck(value, max_bytes)
    if early:
        return early
    try:
        r = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        r, invalid = _loads_slow(value, exc)
        if r is _MISSING:
            return invalid
        out = check(r)
        return out if len(out) == 2 else invalid
    return check(r)


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


def _label_row(r: Any, ts: int) -> tuple | tuple[str, str]:
    """The full rule set for one parsed label record: ``(reason, detail)`` or
    ``(request_id, label, labeler_id, labeled_at_ms)``."""
    if type(r) is not dict:
        return "not_object", f"the value is a JSON {_jtype(r)}, not an object"
    bad = _check_text(r, "request_id", MAX_REQUEST_ID_CHARS)
    if bad:
        return bad
    rid = r["request_id"]
    label = r.get("label", _MISSING)
    if label is _MISSING:
        return "missing_field:label", "label: required (true, false, or null for skipped)"
    if label is not None and type(label) is not bool:
        return "wrong_type:label", f"label: expected true, false or null, got {_jtype(label)}"
    who = r.get("labeler_id")
    if who is not None:
        if type(who) is not str:
            return "wrong_type:labeler_id", f"labeler_id: expected a string, got {_jtype(who)}"
        if len(who) > MAX_LABELER_ID_CHARS:
            return "bad_labeler_id", f"labeler_id: {len(who)} characters, more than {MAX_LABELER_ID_CHARS}"
    at = _optional_time(r, "labeled_at", ts)
    if type(at) is tuple:
        return at
    return rid, label, who, at


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
    index, rejects, late = _settle(n, bad, values, max_bytes, lambda r, i: _label_row(r, timestamps_ms[i]))
    columns = [flat[k::4] for k in range(4)]
    if late:
        index, columns = _merge_late_columns(index, columns, late)
    request_id, label, labeler_id, labeled_at = columns
    batch = LabelBatch(index=index, request_id=request_id, label=label, labeler_id=labeler_id,
                       labeled_at_ms=np.asarray(labeled_at, dtype=np.int64))
    return batch, rejects


# --------------------------------------------------------------------------- outbound


def _time_str(t: datetime | float | int) -> str:
    return format_time(to_epoch_ms(t))


def label_request_bytes(
    request_id: str,
    classifier_id: str,
    item_id: str,
    score: float,
    stratum: int,
    requested_at: datetime | float,
    expires_at: datetime | float,
    context: str | bytes | Mapping[str, Any] | None = None,
    predicted_positive: bool = True,
) -> bytes:
    """Serialize a `stratameter.schemas.messages.LabelRequest` value (produce it with key = classifier_id).

    `requested_at` / `expires_at`: aware `datetime` (naive = UTC) or epoch
    *seconds* as from `time.time()`; written as RFC 3339 UTC with milliseconds.
    `context`: the compact JSON text from `ScoreBatch.context` (or its bytes; embedded
    as it is, not re-parsed: it must be a serialized JSON object), a mapping, or None.
    """
    score = float(score)
    if score - score != 0.0:
        raise ValueError(f"score must be finite, got {score!r}")
    if isinstance(context, str):
        context = orjson.Fragment(context)
    elif isinstance(context, (bytes, bytearray, memoryview)):
        context = orjson.Fragment(bytes(context))
    elif context is not None and not isinstance(context, Mapping):
        raise TypeError(f"context must be a JSON object's text or bytes, a mapping or None, got "
                        f"{type(context).__name__}")
    return orjson.dumps({
        "request_id": request_id,
        "classifier_id": classifier_id,
        "item_id": item_id,
        "score": score,
        "stratum": int(stratum),
        "predicted_positive": bool(predicted_positive),
        "requested_at": _time_str(requested_at),
        "expires_at": _time_str(expires_at),
        "context": context,
    })


def _b64_capped(data: bytes | bytearray | memoryview | str | None, cap: int) -> tuple[str | None, bool]:
    if data is None:
        return None, False
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    cut = len(data) > cap
    return base64.b64encode(bytes(data[:cap])).decode("ascii"), cut


def _cap_text(text: str, limit: int) -> str:
    raw = str(text).encode("utf-8", "replace")
    if len(raw) <= limit:
        return str(text)
    return raw[: limit - 3].decode("utf-8", "ignore") + "..."


def dead_letter_record(
    value: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    reason: str,
    detail: str,
    now: datetime | float,
) -> bytes:
    """Serialize a `stratameter.schemas.messages.DeadLetter` value; its size is bounded.

    The original value is base64-encoded up to its first
    `MAX_DEAD_LETTER_ORIGINAL_BYTES` bytes and the key up to
    `MAX_DEAD_LETTER_KEY_BYTES`; ``truncated`` says whether either was cut.
    `detail` is cut to `MAX_DEAD_LETTER_DETAIL_BYTES` bytes.  `now`: aware
    `datetime` (naive = UTC) or epoch seconds as from `time.time()`.
    """
    original, cut_value = _b64_capped(value, MAX_DEAD_LETTER_ORIGINAL_BYTES)
    key_b64, cut_key = _b64_capped(key, MAX_DEAD_LETTER_KEY_BYTES)
    return orjson.dumps({
        "original": original,
        "key": key_b64,
        "topic": _cap_text(topic, 256),
        "partition": int(partition),
        "offset": int(offset),
        "reason": _cap_text(reason, 128),
        "detail": _cap_text(detail, MAX_DEAD_LETTER_DETAIL_BYTES),
        "rejected_at": _time_str(now),
        "truncated": cut_value or cut_key,
    })


def decode_label_request(value: bytes | str) -> LabelRequest:
    """A ``stratameter.label-requests`` value, checked against `LabelRequest` (raises
    `pydantic.ValidationError`): for labelling tools and tests."""
    return LabelRequest.model_validate_json(value)


def decode_dead_letter(value: bytes | str) -> DeadLetter:
    """A ``stratameter.dead-letter`` value, checked against `DeadLetter` (raises
    `pydantic.ValidationError`)."""
    return DeadLetter.model_validate_json(value)


def score_record_bytes(
    classifier_id: str,
    item_id: str,
    score: float,
    predicted_positive: bool | None = None,
    event_time: str | int | float | None = None,
    context: Mapping[str, Any] | None = None,
) -> bytes:
    """Serialize a `stratameter.schemas.messages.ScoreRecord` value (what a producer sends to
    ``stratameter.scores``); optional fields that are None are left out.  Not checked:
    the service's parser is the judge of what it accepts."""
    doc: dict[str, Any] = {"classifier_id": classifier_id, "item_id": item_id, "score": score}
    if predicted_positive is not None:
        doc["predicted_positive"] = predicted_positive
    if event_time is not None:
        doc["event_time"] = event_time
    if context is not None:
        doc["context"] = context
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def label_record_bytes(request_id: str, label: bool | None, labeler_id: str | None = None,
                       labeled_at: str | int | float | None = None) -> bytes:
    """Serialize a `stratameter.schemas.messages.LabelRecord` value (an answer to a label request);
    ``label`` None means skipped and is sent as null; the optional fields are left out when None."""
    doc: dict[str, Any] = {"request_id": request_id, "label": label}
    if labeler_id is not None:
        doc["labeler_id"] = labeler_id
    if labeled_at is not None:
        doc["labeled_at"] = labeled_at
    return orjson.dumps(doc)
