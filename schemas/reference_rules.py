"""The reference rules of the inbound records: the full rule set of a score record and of a
label record, applied to one record at a time on ``orjson.loads``, each reject with its reason
code (`stratameter.schemas.messages.REJECT_REASONS`) and a detail naming the field.

The batch parsers (`stratameter.schemas.inbound`) do not run these rules on every record: their
fast path accepts exactly the records the rules accept, and only what it sets aside is diagnosed
here (`diagnose`), so that each rejected record gets its reason.  The tests check the fast path
against these rules and these rules against the models of `stratameter.schemas.messages`.

A record that orjson cannot parse is parsed again by the standard library (only for bad
records) so that e.g. ``"score": 1e999`` or ``"score": NaN`` is reported as
``not_finite:score`` rather than as a generic ``invalid_json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

from .messages import (
    CLASSIFIER_ID_RULE,
    MAX_CONTEXT_BYTES,
    MAX_ITEM_ID_CHARS,
    MAX_LABELER_ID_CHARS,
    MAX_REQUEST_ID_CHARS,
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    event_time_to_ms,
    format_time,
    is_classifier_id,
    time_to_ms,
)

__all__ = ["ANY_TIME", "diagnose", "label_row", "score_row"]

_MISSING = object()
#: a window that accepts every valid event time (`parse_scores` without a window)
ANY_TIME = (-(2**63), 2**63 - 1)

# --------------------------------------------------------------------------- helpers

_JSON_TYPES = {str: "string", bool: "boolean", int: "number", float: "number", type(None): "null",
               list: "array", dict: "object"}


def _jtype(x: Any) -> str:
    return _JSON_TYPES.get(type(x), type(x).__name__)


def _show(x: Any, limit: int = 80) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[: limit - 3] + "..."


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


# --------------------------------------------------------------------------- fields


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


# --------------------------------------------------------------------------- scores


def score_row(r: Any, ts: int, threshold: Callable[[str], float], window: tuple[int, int] = ANY_TIME
              ) -> tuple | tuple[str, str]:
    """The full rule set for one parsed score record.

    Returns ``(reason, detail)`` for a reject, else the 6-tuple row
    ``(classifier_id, item_id, score, predicted_positive, event_time_ms, context_json)``.
    The event-time window is checked last: a record outside it is otherwise valid.
    This is the reference: the fast path of `stratameter.schemas.inbound.parse_scores` accepts
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


# --------------------------------------------------------------------------- labels


def label_row(r: Any, ts: int) -> tuple | tuple[str, str]:
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


# --------------------------------------------------------------------------- a raw value


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


def diagnose(value: Any, max_bytes: int, check: Callable[[Any], tuple]) -> tuple:
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

