"""Wire times: RFC 3339 date-times and epoch numbers read to epoch milliseconds, the event-time
window the service accepts, and the one time format the service writes (`format_time`).
Part of the wire contract (`stratameter.schemas.messages` re-exports every name)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any


#: epoch milliseconds accepted for event_time / labeled_at: years 0001 to 9999 UTC.
MIN_EPOCH_MS = -62_135_596_800_000
MAX_EPOCH_MS = 253_402_300_799_999
#: a numeric ``event_time`` below this is epoch *seconds*, at or above it epoch *milliseconds*.
#: 1e11 ms is 1973-03-03T09:46:40Z and 1e11 s is in year 5138, so every date from 1973-03-03 to
#: year 5138 reads the same either way it is sent.
EPOCH_MS_FROM = 100_000_000_000


_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
# RFC 3339 date-time (section 5.6); "T"/"t"/" " separator, fraction of any length, Z or offset.
_RFC3339 = (r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
            r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))")
_RFC3339_RE = re.compile(_RFC3339)
_RFC3339_SHAPE = re.compile(  # the same without groups (faster), for the fromisoformat path
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})")


def rfc3339_to_ms(text: str) -> int | None:
    """Epoch milliseconds (floored) of an RFC 3339 date-time, or None if it is not one.

    The offset (``Z`` or ``+hh:mm``) is required: a naive time is not RFC 3339.
    A leap second (``:60``) counts as the next second.  Years 1-9999 (UTC).
    """
    if _RFC3339_SHAPE.fullmatch(text) is None:
        return None
    if text[-1] not in "Zz" and (text[-2] > "5" or text[-5:-3] > "23"):
        return None  # offset minutes > 59 or hours > 23 (fromisoformat would take them)
    try:
        ms = (datetime.fromisoformat(text) - _EPOCH_UTC) // _MS
    except (ValueError, OverflowError):  # lower-case "z", a leap second, or truly invalid
        return _rfc3339_to_ms_by_parts(text)
    return ms if MIN_EPOCH_MS <= ms <= MAX_EPOCH_MS else None


def _rfc3339_to_ms_by_parts(text: str) -> int | None:
    """`rfc3339_to_ms` without `datetime.fromisoformat` (the reference; also the slow path)."""
    m = _RFC3339_RE.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, z, sign, off_h, off_m = m.groups()
    sec = int(second)
    if sec > 60 or int(off_h or 0) > 23 or int(off_m or 0) > 59:
        return None
    try:
        naive = datetime(int(year), int(month), int(day), int(hour), int(minute), min(sec, 59))
    except ValueError:
        return None
    ms = (naive - _EPOCH) // _MS + (1000 if sec == 60 else 0)
    if frac:
        ms += int(frac[:3].ljust(3, "0"))
    if not z:
        offset = (int(off_h) * 60 + int(off_m)) * 60_000
        ms += -offset if sign == "+" else offset
    return ms if MIN_EPOCH_MS <= ms <= MAX_EPOCH_MS else None


def time_to_ms(value: Any) -> int | None:
    """Epoch ms of a wire time (RFC 3339 string or epoch ms number), None if invalid.

    Booleans, NaN, infinities and numbers outside years 1-9999 are invalid.
    """
    t = type(value)
    if t is int:
        return value if MIN_EPOCH_MS <= value <= MAX_EPOCH_MS else None
    if t is float:
        # NaN fails both comparisons
        return int(value // 1) if MIN_EPOCH_MS <= value <= MAX_EPOCH_MS else None
    if t is str:
        return rfc3339_to_ms(value)
    return None


def event_time_to_ms(value: Any) -> int | None:
    """Epoch ms of a score record's ``event_time``, None if invalid.

    An RFC 3339 string as in `rfc3339_to_ms`.  A number below `EPOCH_MS_FROM` (1e11) is epoch
    *seconds*, at or above it epoch *milliseconds* (floats floored to the millisecond); a
    negative number, NaN, an infinity, a boolean or a time after year 9999 is invalid.
    """
    t = type(value)
    if t is int:
        if value >= EPOCH_MS_FROM:
            return value if value <= MAX_EPOCH_MS else None
        return value * 1000 if value >= 0 else None
    if t is float:  # NaN fails every comparison
        if value >= EPOCH_MS_FROM:
            return int(value // 1) if value <= MAX_EPOCH_MS else None
        # seconds: round away the binary error of x * 1000 (1.1 s is 1100 ms, not 1100.0000000000002)
        return int(round(value * 1000, 3) // 1) if value >= 0 else None
    if t is str:
        return rfc3339_to_ms(value)
    return None


def event_time_window(now_ms: int, chunk_seconds: int, max_skew_seconds: float, allowed_lateness_seconds: float
                      ) -> tuple[int, int]:
    """The event times (epoch ms, both ends included) the service accepts at wall-clock `now_ms`.

    Upper end: ``now + max_skew``; later is ``event_time_in_future``.  Lower end: the start of
    the oldest chunk not yet closed, ``floor((now - lateness) / chunk) * chunk``; a chunk ``t``
    closes once ``now >= (t + 1) * chunk + lateness``, and an earlier time is ``event_time_too_late``.
    """
    chunk_ms = 1000 * int(chunk_seconds)
    oldest_open = (int(now_ms) - int(allowed_lateness_seconds * 1000)) // chunk_ms * chunk_ms
    return oldest_open, int(now_ms) + int(max_skew_seconds * 1000)


def format_time(ms: int) -> str:
    """RFC 3339 UTC string with millisecond precision: ``2024-06-10T08:13:20.000Z``."""
    d = _EPOCH + timedelta(milliseconds=int(ms))
    return (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
        f".{d.microsecond // 1000:03d}Z"
    )


def to_epoch_ms(t: datetime | float | int) -> int:
    """Epoch ms of a `datetime` (naive = UTC) or of epoch *seconds* (as from `time.time()`)."""
    if isinstance(t, datetime):
        if t.tzinfo is not None:
            t = t.astimezone(timezone.utc).replace(tzinfo=None)
        return (t - _EPOCH) // _MS
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"expected a datetime or epoch seconds, got {type(t).__name__}")
    return int((t * 1000) // 1)
