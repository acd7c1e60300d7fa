"""The check of one setting, and how a failed one reads: ``STRATAMETER_X: <message>``.

Each factory here returns a pydantic `AfterValidator` that a field carries in its
``Annotated[type, check, ...]`` declaration (`stratameter.config.settings`), so the environment
variables and the per-classifier overrides file are checked by the very same code.  A check
gets the typed value and returns it (maybe normalised) or raises ValueError whose message
completes "STRATAMETER_X: ...".  `field_errors` turns pydantic's errors into those lines.
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, ValidationError

from stratameter.schemas.messages import CLASSIFIER_ID_RULE, is_classifier_id

ENV_PREFIX = "STRATAMETER_"
MASK = "**********"

_NAME_RE = re.compile(r"[A-Za-z0-9._:-]+")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
QUERY_PASSWORD = re.compile(r"(?i)([?&;]password=)[^&#;]*")


def env_var(field: str) -> str:
    """The environment variable of a settings field: ``delta`` -> ``STRATAMETER_DELTA``."""
    return ENV_PREFIX + field.upper()


class Mark(enum.Enum):
    """What a field is besides its type and check, said in its ``Annotated[...]``."""

    FROM_FILE = "may instead come from the file named by STRATAMETER_<FIELD>_FILE"
    OVERRIDE = "per classifier, may differ per classifier (CLASSIFIERS_CONFIG_FILE; docs/reference/configuration.md: *)"
    CARRY = "per classifier, the same for all, carried on ClassifierConfig for convenience"


class ConfigError(ValueError):
    """A wrong setting.  The message names the variable(s); `errors` lists ``(variable, message)``."""

    def __init__(self, errors: list[tuple[str, str]] | str) -> None:
        self.errors: list[tuple[str, str]] = [("", errors)] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(f"{var}: {msg}" if var else msg for var, msg in self.errors))


def shown(v: Any) -> str:
    """A value as the messages show it: ``2`` for 2.0, ``'abc'`` for a string, ``true`` for True
    (as an environment variable says it)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return repr(v) if isinstance(v, str) else str(v)


def mask_url(url: str) -> str:
    """`url` with the password of its user info (if any) and a ``password=`` query value masked.

    Works on malformed URLs too: a password with an unencoded ``#``, ``/`` or ``?`` makes
    `urlsplit` see no password at all, so the user info is cut at the last ``@`` instead.
    """
    url = QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.rpartition("@")[2]
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:{MASK}@{host}"


# --------------------------------------------------------------------------- checks


def check(rule: Callable[[Any], Any]) -> AfterValidator:
    """`rule` as the check of a field (``Annotated[str, check(redis_url)]``)."""
    return AfterValidator(rule)


def open_interval(lo: float, hi: float) -> AfterValidator:
    def rule(v: float) -> float:
        if not lo < v < hi:  # NaN fails too
            raise ValueError(f"must be in ({shown(lo)}, {shown(hi)}), got {shown(v)}")
        return v
    return check(rule)


def in_range(lo: int, hi: int | None = None) -> AfterValidator:
    """``lo <= v <= hi`` (no upper bound without `hi`)."""
    def rule(v: Any) -> Any:
        if not (v >= lo and (hi is None or v <= hi)):  # NaN fails too
            raise ValueError(f"must be >= {shown(lo)}, got {shown(v)}" if hi is None
                             else f"must be in {lo}..{hi}, got {shown(v)}")
        return v
    return check(rule)


def one_of(options: tuple[str, ...], case: Callable[[str], str] = str.lower) -> AfterValidator:
    """One of `options`, after stripping and `case`; the options are kept as ``.func.options``."""
    def rule(v: str) -> str:
        norm = case(v.strip())
        if norm not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {v!r}")
        return norm
    rule.options = options  # type: ignore[attr-defined]
    return check(rule)


def name_chars(what: str, max_len: int = 256) -> AfterValidator:
    def rule(v: str) -> str:
        if not (len(v) <= max_len and _NAME_RE.fullmatch(v)):
            raise ValueError(f"{what} must be 1-{max_len} characters of [A-Za-z0-9._:-], got {v!r}")
        return v
    return check(rule)


def classifier_id_like(what: str) -> AfterValidator:
    """A name under the classifier-id rule (`stratameter.schemas.messages.is_classifier_id`): one that
    ends up, as a classifier id does, in Redis key hash tags and metric labels (a review group)."""
    def rule(v: str) -> str:
        if not is_classifier_id(v):
            raise ValueError(f"{what} must be {CLASSIFIER_ID_RULE} (the classifier-id rule), got {v!r}")
        return v
    return check(rule)


def metric_list(v: str) -> str:
    """A comma list of metrics (`stats.confusion.METRICS`), returned canonical: lower case, in
    `METRICS` order, no duplicates."""
    from ..stats.confusion import parse_metrics

    return ",".join(parse_metrics(v))


def duration_list(v: str) -> str:
    """A comma list of durations (`chunks.window.parse_duration`), returned canonical: each in its
    largest whole unit (`format_duration`), shortest first, no duplicates; ``none``: no window
    (returned empty; an empty variable counts as unset)."""
    from ..chunks.window import format_duration, parse_duration

    if v.strip().lower() == "none":
        return ""
    seconds = sorted({parse_duration(part) for part in v.split(",") if part.strip()})
    return ",".join(format_duration(s) for s in seconds)


def positive(v: float) -> float:
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"must be a finite number > 0, got {shown(v)}")
    return v


def finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {shown(v)}")
    return v


def nonempty(v: str) -> str:
    v = v.strip()
    if not v:
        raise ValueError("must not be empty")
    return v


def topic(v: str) -> str:
    if not _TOPIC_RE.fullmatch(v) or v in (".", ".."):
        raise ValueError(f"must be a Kafka topic name (1-249 characters of [A-Za-z0-9._-]), got {v!r}")
    return v


def host_port_list(v: str) -> str:
    servers = [s.strip() for s in v.split(",")]
    for s in servers:
        host, sep, port = s.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536) or any(c.isspace() for c in s):
            raise ValueError(f"must be a comma-separated list of host:port, got {v!r}")
    return ",".join(servers)


def valid_redis_url(v: str) -> str:
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"is not a valid URL: {mask_url(v)!r}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"must start with redis://, rediss:// or unix://, got {mask_url(v)!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"has no host: {mask_url(v)!r}")
    return v


def http_url(v: str | None) -> str | None:
    """An ``http://`` or ``https://`` URL with a host (None passes: an optional setting left unset)."""
    if v is None:
        return None
    v = v.strip()
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"is not a valid URL: {mask_url(v)!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {mask_url(v)!r}")
    return v


def project_name(v: str) -> str:
    """A Label Studio project: an id (digits) or a title of 1-50 characters (Label Studio's limit)."""
    v = v.strip()
    if not 1 <= len(v) <= 50:
        raise ValueError(f"must be a project id or a title of 1-50 characters, got {v!r}")
    return v


def choice_list(v: str) -> str:
    """Two or three distinct names, comma-separated: the choices meaning true, false and (optionally)
    unsure (the Label Studio bridge's labelling choices)."""
    names = [n.strip() for n in v.split(",")]
    if not 2 <= len(names) <= 3 or not all(names) or len(set(names)) != len(names) \
            or any(len(n) > 100 or any(c in n for c in '<>&"') for n in names):
        raise ValueError("must be 2 or 3 distinct comma-separated names (the choices meaning true, false and, "
                         f"optionally, unsure; at most 100 characters each, none of < > & \"), got {v!r}")
    return ",".join(names)


def readable_file(v: Path) -> Path:
    if not (v.is_file() and os.access(v, os.R_OK)):
        raise ValueError(f"is not a readable file: {str(v)!r}")
    return v


# --------------------------------------------------------------------------- messages


def _type_message(err: Any) -> str:
    """A short message for pydantic's own (type) errors."""
    kind = err["type"]
    if kind.startswith("int_"):
        return "must be an integer"
    if kind.startswith("float_"):
        return "must be a number"
    if kind.startswith("bool_"):
        return "must be true or false"
    if kind in ("string_type", "path_type"):
        return "must be a string"
    msg: str = err["msg"]
    return msg.removeprefix("Value error, ")


def field_errors(exc: ValidationError, name_of: Callable[[str], str], secret: Callable[[str], bool]
                 ) -> list[tuple[str, str]]:
    """``(name_of(field), message)`` for each error; a secret field's value is never shown."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        inner = err.get("ctx", {}).get("error")
        if isinstance(inner, ConfigError):  # raised by a model validator: already names its variables
            out.extend(inner.errors)
            continue
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = _type_message(err)
        if not err["type"] == "value_error" and not secret(field) and "input" in err:
            got = err["input"]
            if isinstance(got, (str, int, float, bool)) or got is None:
                msg += f", got {shown(got) if not isinstance(got, bool) else str(got).lower()}"
        out.append((name_of(field) if field else "", msg))
    return out
