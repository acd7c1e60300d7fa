"""stratameter's wire contract: topics, message models, limits and reject codes.

This module is the single source of the contract; docs/reference/wire-contract.md documents the
models from here (``Model.model_json_schema()``).  Four topics::

    stratameter.scores          in   ScoreRecord    one classifier decision per record
    stratameter.label-requests  out  LabelRequest   an item to be labelled (key = classifier_id)
    stratameter.labels          in   LabelRecord    the answer to a LabelRequest
    stratameter.dead-letter     out  DeadLetter     an input record that was rejected

Values are UTF-8 JSON objects.  Unknown fields are ignored (producers may add
their own), and ``null`` for an optional field means the same as leaving it
out.  Times are RFC 3339 strings with a ``Z`` or ``+hh:mm`` offset (naive
times are rejected) or epoch milliseconds as a JSON number; a score record's
``event_time`` may also be epoch seconds (`event_time_to_ms`: a number below
`EPOCH_MS_FROM` is seconds, at or above it milliseconds; negative is rejected).
Whether an event time lies in the window the service accepts (not too far in
the future, its chunk not closed) depends on the service's clock: the parser
and `ScoreRecord` take that window from their caller (`event_time_window`).
The time rules live in `stratameter.schemas.times` and are re-exported here.

The pydantic models are for documentation, JSON schema, outbound
serialization and tests.  The consumers' hot path does not build them: it uses
the batch parsers in `stratameter.schemas.inbound`, which apply exactly the rules below
(the tests check the two against each other) and report every rejected record
with one of the `REJECT_REASONS` codes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from .times import (  # noqa: F401 - the contract's times (schemas.times), re-exported
    EPOCH_MS_FROM,
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    event_time_to_ms,
    event_time_window,
    format_time,
    rfc3339_to_ms,
    time_to_ms,
    to_epoch_ms,
)

# --------------------------------------------------------------------------- topics

TOPIC_SCORES = "stratameter.scores"
TOPIC_LABEL_REQUESTS = "stratameter.label-requests"
TOPIC_LABELS = "stratameter.labels"
TOPIC_DEAD_LETTER = "stratameter.dead-letter"

# --------------------------------------------------------------------------- limits

#: classifier ids: 1-128 characters of this set (they end up in Redis keys and metric labels).
#: The rule is `is_classifier_id`; `CLASSIFIER_ID_RULE` says it in words (error messages).
CLASSIFIER_ID_CHARS = "A-Za-z0-9._:-"
MAX_CLASSIFIER_ID_CHARS = 128
CLASSIFIER_ID_RULE = f"1-{MAX_CLASSIFIER_ID_CHARS} characters of [{CLASSIFIER_ID_CHARS}]"
CLASSIFIER_ID_PATTERN = rf"^[{CLASSIFIER_ID_CHARS}]{{1,{MAX_CLASSIFIER_ID_CHARS}}}$"  # JSON schema / pydantic
_CLASSIFIER_ID_RE = re.compile(rf"[{CLASSIFIER_ID_CHARS}]{{1,{MAX_CLASSIFIER_ID_CHARS}}}")


def is_classifier_id(value: object) -> bool:
    """The classifier-id rule: a string of `CLASSIFIER_ID_RULE` (the parsers, the HTTP API, request
    ids, per-classifier settings and the models all apply this one)."""
    return (type(value) is str and len(value) <= MAX_CLASSIFIER_ID_CHARS
            and _CLASSIFIER_ID_RE.fullmatch(value) is not None)

MAX_ITEM_ID_CHARS = 512
MAX_REQUEST_ID_CHARS = 256
MAX_LABELER_ID_CHARS = 256
#: a score record's context, serialized compactly (orjson), may not exceed this.
MAX_CONTEXT_BYTES = 8 * 1024
#: input records larger than this are rejected as ``too_large`` without being parsed.
MAX_RECORD_BYTES = 64 * 1024
#: a dead letter carries at most this much of the original value (and flags ``truncated``).
MAX_DEAD_LETTER_ORIGINAL_BYTES = 64 * 1024
MAX_DEAD_LETTER_KEY_BYTES = 1024
MAX_DEAD_LETTER_DETAIL_BYTES = 1024

# --------------------------------------------------------------------------- label outcomes

#: What became of one label record (the ``outcome`` of ``stratameter_labels_total``, the API's
#: ``labels_by_outcome``): folded into the counts (``accepted``; ``skipped`` for ``label: null``),
#: or not folded and dead-lettered with the reason `LABEL_OUTCOME_REJECTS` gives.
LABEL_OUTCOMES = ("accepted", "skipped", "duplicate", "unknown", "expired")
#: The outcomes whose label was folded into the counts.
FOLDED_OUTCOMES = ("accepted", "skipped")
#: Dead-letter reason of each outcome that is not folded (``unknown``: the request id names no
#: request the service knows).
LABEL_OUTCOME_REJECTS = {"duplicate": "duplicate", "unknown": "unknown_request", "expired": "expired"}

# --------------------------------------------------------------------------- reject reasons

#: Reject / dead-letter reason codes.  ``<field>`` stands for the field name,
#: e.g. ``missing_field:score``.  The last four are decided by the service (label
#: bookkeeping, the classifier cap), not by the parsers.  A label whose request id puts another
#: classifier's token under a classifier's name is ``unknown_request``: the id's classifier part
#: is the route, and that classifier never issued the token.
REJECT_REASONS: dict[str, str] = {
    "tombstone": "the value is null (a Kafka tombstone) or empty",
    "too_large": f"the value is larger than the record limit ({MAX_RECORD_BYTES} bytes by default); not parsed",
    "invalid_json": "the value is not valid UTF-8 JSON",
    "not_object": "the value is valid JSON but not a JSON object",
    "missing_field:<field>": "a required field is absent (or null where null is not allowed)",
    "wrong_type:<field>": "a field has the wrong JSON type (a string or boolean where a number is expected, ...)",
    "not_finite:score": "the score is NaN, +-Infinity, or outside the double range (e.g. 1e999)",
    "bad_classifier_id": f"classifier_id is not {CLASSIFIER_ID_RULE}",
    "bad_item_id": f"item_id is empty or longer than {MAX_ITEM_ID_CHARS} characters",
    "bad_event_time": "event_time is neither an RFC 3339 time with offset nor a finite, non-negative epoch number "
                      "(seconds below 1e11, else milliseconds) up to year 9999",
    "event_time_in_future": "the event time (event_time, else the record timestamp) is more than "
                            "STRATAMETER_MAX_EVENT_TIME_SKEW_SECONDS after the service's clock",
    "event_time_too_late": "the event time's chunk has closed (its end is more than "
                           "STRATAMETER_ALLOWED_LATENESS_SECONDS in the past)",
    "context_too_large": f"context is larger than {MAX_CONTEXT_BYTES} bytes serialized compactly (or nests too deeply)",
    "bad_request_id": f"request_id is empty or longer than {MAX_REQUEST_ID_CHARS} characters",
    "bad_labeler_id": f"labeler_id is longer than {MAX_LABELER_ID_CHARS} characters",
    "bad_labeled_at": "labeled_at is neither an RFC 3339 time with offset nor finite epoch milliseconds in years 1-9999",
    "unknown_request": "a label for a request_id the service never issued (or already forgot)",
    "duplicate": "a second label for a request that was already answered",
    "expired": "a label that arrived after the request's expires_at",
    "too_many_classifiers": "a score for a classifier id not seen before while STRATAMETER_MAX_CLASSIFIERS "
                            "classifiers exist: it creates no state",
}

# --------------------------------------------------------------------------- field types


def _check_time(value: Any) -> Any:
    if time_to_ms(value) is None:
        raise ValueError("must be an RFC 3339 date-time with offset (e.g. 2024-06-10T08:13:20Z) "
                         "or epoch milliseconds in years 1-9999")
    return value


def _check_event_time(value: Any) -> Any:
    if event_time_to_ms(value) is None:
        raise ValueError("must be an RFC 3339 date-time with offset (e.g. 2024-06-10T08:13:20Z) or a non-negative "
                         "epoch number up to year 9999: seconds below 1e11, else milliseconds")
    return value


def _check_context(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        size = len(orjson.dumps(value))
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"context cannot be serialized: {exc}") from None
    if size > MAX_CONTEXT_BYTES:
        raise ValueError(f"context is {size} bytes serialized, more than {MAX_CONTEXT_BYTES}")
    return value


ClassifierId = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=MAX_CLASSIFIER_ID_CHARS, pattern=CLASSIFIER_ID_PATTERN),
    Field(description=CLASSIFIER_ID_RULE,
          examples=["fraud-v3"]),
]
ItemId = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=MAX_ITEM_ID_CHARS),
    Field(description=f"the classified item, 1-{MAX_ITEM_ID_CHARS} characters", examples=["txn-000123"]),
]
FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]
#: A wire time: RFC 3339 string with offset, or epoch milliseconds.
WireTime = Annotated[
    Annotated[StrictStr, Field(json_schema_extra={"format": "date-time"})] | StrictInt | FiniteNumber,
    AfterValidator(_check_time),
]
#: A score record's event time: RFC 3339 with offset, or epoch seconds (< 1e11) / milliseconds (>= 1e11).
EventTime = Annotated[
    Annotated[StrictStr, Field(json_schema_extra={"format": "date-time"})] | StrictInt | FiniteNumber,
    AfterValidator(_check_event_time),
]
UtcTime = Annotated[
    StrictStr,
    StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"),
    Field(json_schema_extra={"format": "date-time"}, examples=["2024-06-10T08:13:20.000Z"],
          description="RFC 3339, UTC, millisecond precision"),
]
Context = Annotated[
    dict[str, Any] | None,
    AfterValidator(_check_context),
    Field(description=f"free-form JSON object carried into label requests, at most "
                      f"{MAX_CONTEXT_BYTES} bytes serialized compactly"),
]


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


# --------------------------------------------------------------------------- messages


class ScoreRecord(_Message):
    """One classifier decision, consumed from ``stratameter.scores`` (the Kafka key is not used)."""

    classifier_id: ClassifierId
    item_id: ItemId
    score: FiniteNumber = Field(
        description="the classifier's score: a finite JSON number, any range (probability, logit, margin); "
                    "strings and booleans are rejected", examples=[0.87])
    predicted_positive: StrictBool | None = Field(
        default=None,
        description="the classifier's decision; when present it wins over the threshold (both ways); "
                    "when absent the decision is score >= threshold of the classifier")
    event_time: EventTime | None = Field(
        default=None, validate_default=True,
        description="when the decision was made: RFC 3339 with offset, or a non-negative epoch number: "
                    "seconds below 1e11, else milliseconds; default: the Kafka record timestamp. "
                    "It must lie in the window the service accepts (see event_time_window)",
        examples=["2024-06-10T08:13:20Z", 1718007200000, 1718007200])
    context: Context = None

    @field_validator("event_time")
    @classmethod
    def _in_window(cls, v: Any, info: ValidationInfo) -> Any:
        """With a validation context ``{"event_time_window": (min_ms, max_ms), "timestamp_ms": ts}``
        (as `stratameter.schemas.inbound.parse_scores` takes them), the event time (`event_time`, else the
        record timestamp `ts`) must lie in the window: the service's rule, see `event_time_window`."""
        ctx = info.context or {}
        window = ctx.get("event_time_window")
        if window is None:
            return v
        ms = ctx.get("timestamp_ms") if v is None else event_time_to_ms(v)
        if ms is None:
            return v
        lo, hi = window
        if ms > hi:
            raise PydanticCustomError("event_time_in_future", "the event time {ms} ms is after {hi} ms",
                                      {"ms": ms, "hi": hi})
        if ms < lo:
            raise PydanticCustomError("event_time_too_late", "the event time {ms} ms is before {lo} ms",
                                      {"ms": ms, "lo": lo})
        return v

    def is_positive(self, threshold: float) -> bool:
        """The resolved decision: `predicted_positive` if given, else ``score >= threshold``."""
        return self.score >= threshold if self.predicted_positive is None else self.predicted_positive

    def event_time_ms(self, default_ms: int) -> int:
        """`event_time` in epoch ms, `default_ms` (the Kafka timestamp) if absent."""
        return default_ms if self.event_time is None else event_time_to_ms(self.event_time)  # type: ignore[return-value]


class LabelRequest(_Message):
    """An item to be labelled, produced to ``stratameter.label-requests`` with key = classifier_id."""

    request_id: StrictStr = Field(description="opaque id to quote in the LabelRecord",
                                  max_length=MAX_REQUEST_ID_CHARS)
    classifier_id: ClassifierId
    item_id: ItemId
    score: FiniteNumber
    stratum: StrictInt = Field(ge=0, description="score stratum: 0..K-1 the predicted positives (0 = lowest "
                               "scores), K.. the predicted negatives (recall, F1, accuracy)")
    predicted_positive: StrictBool = Field(
        default=True, description="the classifier's decision on the item; the label says what the item truly "
                                  "is, whatever the prediction")
    requested_at: UtcTime
    expires_at: UtcTime = Field(description="labels arriving later are rejected as `expired`")
    context: Context = Field(description="the score record's context, or null")


class LabelRecord(_Message):
    """A human (or oracle) label, consumed from ``stratameter.labels``."""

    request_id: Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_REQUEST_ID_CHARS)] = Field(
        description="the LabelRequest's request_id")
    label: StrictBool | None = Field(
        description="true = the item really is positive, false = it is not, null = skipped "
                    "(the labeller could not tell); the field itself is required")
    labeler_id: Annotated[StrictStr, StringConstraints(max_length=MAX_LABELER_ID_CHARS)] | None = None
    labeled_at: WireTime | None = Field(
        default=None, description="RFC 3339 with offset or epoch milliseconds; default: the Kafka record timestamp")


class DeadLetter(_Message):
    """A rejected input record, produced to ``stratameter.dead-letter``."""

    original: StrictStr | None = Field(
        description=f"base64 of the original value bytes (at most the first {MAX_DEAD_LETTER_ORIGINAL_BYTES} "
                    "bytes), null for a tombstone")
    key: StrictStr | None = Field(
        description=f"base64 of the original key (at most {MAX_DEAD_LETTER_KEY_BYTES} bytes), null if none")
    topic: StrictStr
    partition: StrictInt
    offset: StrictInt
    reason: StrictStr = Field(description="machine code, see REJECT_REASONS", examples=["wrong_type:score"])
    detail: StrictStr = Field(description=f"human-readable, names the field; at most {MAX_DEAD_LETTER_DETAIL_BYTES} bytes")
    rejected_at: UtcTime
    truncated: StrictBool = Field(default=False, description="original or key was cut to its limit")

    @field_validator("detail")
    @classmethod
    def _short_detail(cls, v: str) -> str:
        if len(v.encode()) > MAX_DEAD_LETTER_DETAIL_BYTES:
            raise ValueError(f"detail is longer than {MAX_DEAD_LETTER_DETAIL_BYTES} bytes")
        return v


#: topic -> message model
MESSAGES: dict[str, type[BaseModel]] = {
    TOPIC_SCORES: ScoreRecord,
    TOPIC_LABEL_REQUESTS: LabelRequest,
    TOPIC_LABELS: LabelRecord,
    TOPIC_DEAD_LETTER: DeadLetter,
}
