"""The outbound encoders: every message stratameter's code writes to a topic.

The service writes label requests (`label_request_bytes`) and dead letters
(`dead_letter_record`); its tools (the benchmark, the demo, the soak test, the Label Studio
bridge, the embedded backends' reviewer) write score records (`score_record_bytes`) and label
records (`label_record_bytes`), the inbound records the service's parsers
(`stratameter.schemas.inbound`) read.  The tools that answer label requests read them with
`decode_label_request`, checked against the `LabelRequest` model.

These are not on the ingest hot path: the values are built with ``orjson`` from plain dicts,
times written in the contract's one format (`stratameter.schemas.messages.format_time`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson

from .messages import (
    MAX_DEAD_LETTER_DETAIL_BYTES,
    MAX_DEAD_LETTER_KEY_BYTES,
    MAX_DEAD_LETTER_ORIGINAL_BYTES,
    LabelRequest,
    format_time,
    to_epoch_ms,
)

__all__ = [
    "dead_letter_record",
    "decode_label_request",
    "label_record_bytes",
    "label_request_bytes",
    "score_record_bytes",
]


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
