"""12-factor configuration: ``STRATAMETER_*`` environment variables (pydantic-settings).

`load_settings()` reads the environment (or a given mapping) and raises
`ConfigError` naming the variable on any wrong value, e.g.
``STRATAMETER_DELTA: must be in (0, 0.5), got 2``.  Variable names are upper
case; an empty value counts as unset.

Secrets (`KAFKA_SASL_PASSWORD`, `REDIS_PASSWORD`, and for convenience the two
user names) may instead come from a mounted file named by the ``*_FILE``
variant (``STRATAMETER_REDIS_PASSWORD_FILE=/run/secrets/redis``; one trailing
newline is dropped).  Passwords are `SecretStr`: masked in repr, str and
`Settings.safe_dict()`, which also masks a password inside ``REDIS_URL``.

Per-classifier overrides come from the JSON file named by
``STRATAMETER_CLASSIFIERS_CONFIG_FILE``::

    {"fraud-v3": {"threshold": 0.7, "delta": 0.01, "max_labels_per_hour": 200}}

validated with the same rules as the variables (unknown keys are rejected);
`Settings.for_classifier(cid)` returns the effective `ClassifierConfig`.

Variables (``STRATAMETER_`` + name; default):

Kafka   KAFKA_BOOTSTRAP_SERVERS (localhost:9092), KAFKA_CONSUMER_GROUP (stratameter),
        KAFKA_SECURITY_PROTOCOL (PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL),
        KAFKA_SASL_MECHANISM (PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512; PLAIN),
        KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD (required with SASL_*),
        KAFKA_SSL_CAFILE, KAFKA_SSL_CERTFILE, KAFKA_SSL_KEYFILE (readable files),
        KAFKA_SESSION_TIMEOUT_MS (10000)
Redis   REDIS_URL (redis://localhost:6379/0; redis://, rediss:// or unix://), REDIS_USERNAME,
        REDIS_PASSWORD, REDIS_SSL_CAFILE, REDIS_SSL_CERTFILE, REDIS_SSL_KEYFILE (readable files;
        rediss:// only), REDIS_KEY_PREFIX (stratameter; [A-Za-z0-9._:-]+)
HTTP    HTTP_HOST (0.0.0.0), HTTP_PORT (9108)
Topics  TOPIC_SCORES, TOPIC_LABEL_REQUESTS, TOPIC_LABELS, TOPIC_DEAD_LETTER (stratameter.scores,
        stratameter.label-requests, stratameter.labels, stratameter.dead-letter; all different)
Stats   DELTA (0.02, in (0, 0.5)), CONFIDENCE (0.95, in (0.5, 1)), STRATA (4, 1..20),
        STRATIFICATION (perc | equal | cum_sqrt_f), ALLOCATION (opt_track | opt | opt_a2 | opt_conf |
        pps | uni | random), THRESHOLD (0.5, finite), SCORE_KIND (auto | probability | logit),
        CHUNK_SECONDS (3600, >= 1), MAX_LABELS_PER_HOUR (500 per classifier, >= 1),
        LABEL_TIMEOUT_SECONDS (86400, > 0), ROUND_LABELS_PER_STRATUM (2), STOP_ROUNDS (2),
        RESERVOIR_SIZE (256 per stratum, 8..100000), CHUNK_RETENTION (24), HISTORY_CHUNKS (168)
Events  MAX_EVENT_TIME_SKEW_SECONDS (300, >= 0): a score whose event time is further ahead of
        the service's clock is dead-lettered (event_time_in_future);
        ALLOWED_LATENESS_SECONDS (300, >= 0, at most HISTORY_CHUNKS x CHUNK_SECONDS; left unset,
        it is 300 or that product if smaller): a chunk closes this long after its end, and a
        score for a closed chunk is dead-lettered (event_time_too_late)
Process BATCH_MAX_RECORDS (5000), DEAD_LETTER_MAX_PER_SECOND (1000), LOG_LEVEL (INFO),
        INSTANCE_ID (hostname-pid), CLASSIFIERS_CONFIG_FILE
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from schemas.messages import (
    CLASSIFIER_ID_RULE,
    TOPIC_DEAD_LETTER,
    TOPIC_LABEL_REQUESTS,
    TOPIC_LABELS,
    TOPIC_SCORES,
    event_time_window,
    is_classifier_id,
)

from .stats.allocation import ALLOCATIONS
from .stats.calibration import SCORE_KINDS
from .stats.strata import STRATIFICATIONS

ENV_PREFIX = "STRATAMETER_"

SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: settings that may also come from a file named by the ``*_FILE`` variable
FILE_SECRETS: tuple[str, ...] = ("kafka_sasl_username", "kafka_sasl_password", "redis_username", "redis_password")
#: keys allowed per classifier in the overrides file
OVERRIDABLE: tuple[str, ...] = ("threshold", "delta", "confidence", "strata", "stratification", "allocation",
                                "max_labels_per_hour", "label_timeout_seconds", "score_kind")

_NAME_RE = re.compile(r"[A-Za-z0-9._:-]+")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_MASK = "**********"


def env_var(field: str) -> str:
    """The environment variable of a settings field: ``delta`` -> ``STRATAMETER_DELTA``."""
    return ENV_PREFIX + field.upper()


class ConfigError(ValueError):
    """A wrong setting.  The message names the variable(s); `errors` lists ``(variable, message)``."""

    def __init__(self, errors: list[tuple[str, str]] | str) -> None:
        self.errors: list[tuple[str, str]] = [("", errors)] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(f"{var}: {msg}" if var else msg for var, msg in self.errors))


# --------------------------------------------------------------------------- rules
# One rule per field, shared by `Settings` and `ClassifierConfig` (so the
# overrides file is checked exactly like the variables).  A rule gets the
# typed value and returns it (maybe normalised) or raises ValueError whose
# message completes "STRATAMETER_X: ...".


def _num(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return repr(v) if isinstance(v, str) else str(v)


def _open(lo: float, hi: float) -> Callable[[float], float]:
    def rule(v: float) -> float:
        if not lo < v < hi:  # NaN fails too
            raise ValueError(f"must be in ({_num(lo)}, {_num(hi)}), got {_num(v)}")
        return v
    return rule


def _closed(lo: int, hi: int | None = None) -> Callable[[Any], Any]:
    def rule(v: Any) -> Any:
        if not (v >= lo and (hi is None or v <= hi)):  # NaN fails too
            raise ValueError(f"must be >= {_num(lo)}, got {_num(v)}" if hi is None
                             else f"must be in {lo}..{hi}, got {_num(v)}")
        return v
    return rule


def _positive(v: float) -> float:
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"must be a finite number > 0, got {_num(v)}")
    return v


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {_num(v)}")
    return v


def _choice(options: tuple[str, ...], case: Callable[[str], str] = str.lower) -> Callable[[str], str]:
    def rule(v: str) -> str:
        norm = case(v.strip())
        if norm not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {v!r}")
        return norm
    return rule


def _name(what: str, max_len: int = 256) -> Callable[[str], str]:
    def rule(v: str) -> str:
        if not (len(v) <= max_len and _NAME_RE.fullmatch(v)):
            raise ValueError(f"{what} must be 1-{max_len} characters of [A-Za-z0-9._:-], got {v!r}")
        return v
    return rule


def _nonempty(v: str) -> str:
    v = v.strip()
    if not v:
        raise ValueError("must not be empty")
    return v


def _topic(v: str) -> str:
    if not _TOPIC_RE.fullmatch(v) or v in (".", ".."):
        raise ValueError(f"must be a Kafka topic name (1-249 characters of [A-Za-z0-9._-]), got {v!r}")
    return v


def _bootstrap(v: str) -> str:
    servers = [s.strip() for s in v.split(",")]
    for s in servers:
        host, sep, port = s.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536) or any(c.isspace() for c in s):
            raise ValueError(f"must be a comma-separated list of host:port, got {v!r}")
    return ",".join(servers)


def _redis_url(v: str) -> str:
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


def _readable_file(v: Path | None) -> Path | None:
    if v is not None and not (v.is_file() and os.access(v, os.R_OK)):
        raise ValueError(f"is not a readable file: {str(v)!r}")
    return v


_RULES: dict[str, Callable[[Any], Any]] = {
    "kafka_bootstrap_servers": _bootstrap,
    "kafka_consumer_group": _nonempty,
    "kafka_security_protocol": _choice(SECURITY_PROTOCOLS, str.upper),
    "kafka_sasl_mechanism": _choice(SASL_MECHANISMS, str.upper),
    "kafka_ssl_cafile": _readable_file,
    "kafka_ssl_certfile": _readable_file,
    "kafka_ssl_keyfile": _readable_file,
    "kafka_session_timeout_ms": _closed(1000),
    "redis_url": _redis_url,
    "redis_ssl_cafile": _readable_file,
    "redis_ssl_certfile": _readable_file,
    "redis_ssl_keyfile": _readable_file,
    "redis_key_prefix": _name("the prefix"),
    "http_host": _nonempty,
    "http_port": _closed(1, 65535),
    "topic_scores": _topic,
    "topic_label_requests": _topic,
    "topic_labels": _topic,
    "topic_dead_letter": _topic,
    "delta": _open(0, 0.5),
    "confidence": _open(0.5, 1),
    "strata": _closed(1, 20),
    "stratification": _choice(STRATIFICATIONS),
    "allocation": _choice(ALLOCATIONS),
    "threshold": _finite,
    "score_kind": _choice(SCORE_KINDS),
    "chunk_seconds": _closed(1),
    "max_labels_per_hour": _closed(1),
    "label_timeout_seconds": _positive,
    "round_labels_per_stratum": _closed(1),
    "stop_rounds": _closed(1),
    "reservoir_size": _closed(8, 100_000),
    "chunk_retention": _closed(1),
    "history_chunks": _closed(1),
    "max_event_time_skew_seconds": _closed(0),
    "allowed_lateness_seconds": _closed(0),
    "request_retention_seconds": _positive,
    "batch_max_records": _closed(1),
    "dead_letter_max_per_second": _positive,
    "log_level": _choice(LOG_LEVELS, str.upper),
    "instance_id": _name("the id"),
}


def _apply_rule(name: str, v: Any) -> Any:
    rule = _RULES.get(name)
    return v if rule is None or v is None else rule(v)


def _type_message(err: dict[str, Any]) -> str:
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
    msg = err["msg"]
    return msg.removeprefix("Value error, ")


def _errors(exc: ValidationError, name_of: Callable[[str], str], secret: Callable[[str], bool]
            ) -> list[tuple[str, str]]:
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
                msg += f", got {_num(got) if not isinstance(got, bool) else str(got).lower()}"
        out.append((name_of(field) if field else "", msg))
    return out


# --------------------------------------------------------------------------- per classifier


class ClassifierConfig(BaseModel):
    """The effective settings of one classifier: the globals, with its overrides applied."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classifier_id: str | None = None
    threshold: float = 0.5
    delta: float = 0.02
    confidence: float = 0.95
    strata: int = 4
    stratification: str = "perc"
    allocation: str = "opt_track"
    score_kind: str = "auto"
    max_labels_per_hour: int = 500
    label_timeout_seconds: float = 86400.0
    # not overridable per classifier, carried for convenience
    chunk_seconds: int = 3600
    reservoir_size: int = 1024
    round_labels_per_stratum: int = 2
    stop_rounds: int = 2
    chunk_retention: int = 24
    history_chunks: int = 168
    request_retention_seconds: float = 7 * 86400.0
    max_event_time_skew_seconds: int = 300
    allowed_lateness_seconds: int = 300

    @field_validator("*")
    @classmethod
    def _rules(cls, v: Any, info: Any) -> Any:
        return _apply_rule(info.field_name, v)


def _default(name: str) -> Any:
    """The default of a per-classifier setting, as declared on `ClassifierConfig`."""
    return ClassifierConfig.model_fields[name].default


_PER_CLASSIFIER: tuple[str, ...] = tuple(f for f in ClassifierConfig.model_fields if f != "classifier_id")


# --------------------------------------------------------------------------- environment source

_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("stratameter_environ", default=None)


def _read_secret_file(var: str, path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([(var, f"cannot read {path!r}: {exc.__class__.__name__}: "
                                 f"{getattr(exc, 'strerror', None) or exc}")]) from None
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    if not text:
        raise ConfigError([(var, f"the file {path!r} is empty")])
    return text


class _EnvSource(PydanticBaseSettingsSource):
    """``STRATAMETER_<FIELD>`` (upper case; empty = unset) and ``<FIELD>_FILE`` for `FILE_SECRETS`."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = self.environ.get(env_var(field_name)) or None
        return value, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        errors: list[tuple[str, str]] = []
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if name in FILE_SECRETS:
                file_var = env_var(name) + "_FILE"
                path = self.environ.get(file_var) or None
                if path is not None:
                    if value is not None:
                        errors.append((file_var, f"set either {env_var(name)} or {file_var}, not both"))
                        continue
                    try:
                        value = _read_secret_file(file_var, path)
                    except ConfigError as exc:
                        errors.extend(exc.errors)
                        continue
            if value is not None:
                values[name] = value
        if errors:
            raise ConfigError(errors)
        return values


# --------------------------------------------------------------------------- settings


def _default_instance_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname()) or "localhost"
    return f"{host[:200]}-{os.getpid()}"


_QUERY_PASSWORD = re.compile(r"(?i)([?&;]password=)[^&#;]*")


def mask_url(url: str) -> str:
    """`url` with the password of its user info (if any) and a ``password=`` query value masked.

    Works on malformed URLs too: a password with an unencoded ``#``, ``/`` or ``?`` makes
    `urlsplit` see no password at all, so the user info is cut at the last ``@`` instead.
    """
    url = _QUERY_PASSWORD.sub(lambda m: m.group(1) + _MASK, url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.rpartition("@")[2]
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:{_MASK}@{host}"


class Settings(BaseSettings):
    """All settings; see the module docstring.  Build with `load_settings()`.

    ``Settings()`` reads ``os.environ`` too, and like `load_settings` raises
    `ConfigError` naming the variables.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    kafka_bootstrap_servers: str = "localhost:9092"
    kafka_consumer_group: str = "stratameter"
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    kafka_session_timeout_ms: int = 10_000
    redis_url: str = "redis://localhost:6379/0"
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_ssl_cafile: Path | None = None
    redis_ssl_certfile: Path | None = None
    redis_ssl_keyfile: Path | None = None
    redis_key_prefix: str = "stratameter"
    http_host: str = "0.0.0.0"
    http_port: int = 9108
    topic_scores: str = TOPIC_SCORES
    topic_label_requests: str = TOPIC_LABEL_REQUESTS
    topic_labels: str = TOPIC_LABELS
    topic_dead_letter: str = TOPIC_DEAD_LETTER
    # defaults of the per-classifier settings: one source, `ClassifierConfig`
    delta: float = _default("delta")
    confidence: float = _default("confidence")
    strata: int = _default("strata")
    stratification: str = _default("stratification")
    allocation: str = _default("allocation")
    threshold: float = _default("threshold")
    score_kind: str = _default("score_kind")
    chunk_seconds: int = _default("chunk_seconds")
    max_labels_per_hour: int = _default("max_labels_per_hour")
    label_timeout_seconds: float = _default("label_timeout_seconds")
    round_labels_per_stratum: int = _default("round_labels_per_stratum")
    stop_rounds: int = _default("stop_rounds")
    reservoir_size: int = _default("reservoir_size")
    chunk_retention: int = _default("chunk_retention")
    history_chunks: int = _default("history_chunks")
    request_retention_seconds: float = _default("request_retention_seconds")
    max_event_time_skew_seconds: int = _default("max_event_time_skew_seconds")
    allowed_lateness_seconds: int = _default("allowed_lateness_seconds")
    # process
    batch_max_records: int = 5000
    dead_letter_max_per_second: float = 1000.0
    log_level: str = "INFO"
    instance_id: str = Field(default_factory=_default_instance_id)
    classifiers_config_file: Path | None = None

    _defaults: ClassifierConfig = PrivateAttr()
    _overrides: dict[str, ClassifierConfig] = PrivateAttr(default_factory=dict)
    _cache: dict[str, ClassifierConfig] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_errors(exc, env_var, lambda f: f in _SECRETS)) from None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        return init_settings, _EnvSource(settings_cls, os.environ if environ is None else environ)

    @field_validator("*")
    @classmethod
    def _rules(cls, v: Any, info: Any) -> Any:
        return _apply_rule(info.field_name, v)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        errors: list[tuple[str, str]] = []
        if self.kafka_security_protocol.startswith("SASL_"):
            for name in ("kafka_sasl_username", "kafka_sasl_password"):
                if getattr(self, name) is None:
                    errors.append((env_var(name), f"required when {env_var('kafka_security_protocol')} "
                                                  f"is {self.kafka_security_protocol}"))
        if self.kafka_ssl_keyfile is not None and self.kafka_ssl_certfile is None:
            errors.append((env_var("kafka_ssl_keyfile"), f"needs {env_var('kafka_ssl_certfile')}"))
        if self.redis_ssl_keyfile is not None and self.redis_ssl_certfile is None:
            errors.append((env_var("redis_ssl_keyfile"), f"needs {env_var('redis_ssl_certfile')}"))
        if not self.redis_url.startswith("rediss://"):
            for name in ("redis_ssl_cafile", "redis_ssl_certfile", "redis_ssl_keyfile"):
                if getattr(self, name) is not None:
                    errors.append((env_var(name), f"needs a rediss:// {env_var('redis_url')} (TLS), got "
                                                  f"{urlsplit(self.redis_url).scheme}://"))
        seen: dict[str, str] = {}
        for name in ("topic_scores", "topic_label_requests", "topic_labels", "topic_dead_letter"):
            topic = getattr(self, name)
            if topic in seen:
                errors.append((env_var(name), f"{topic!r} is also {env_var(seen[topic])}; the topics must differ"))
            seen.setdefault(topic, name)
        held = self.history_chunks * self.chunk_seconds  # seconds of event time still held
        if self.allowed_lateness_seconds > held:
            if "allowed_lateness_seconds" in self.model_fields_set:
                errors.append((env_var("allowed_lateness_seconds"),
                               f"must be at most {env_var('history_chunks')} x {env_var('chunk_seconds')} = "
                               f"{self.history_chunks} x {self.chunk_seconds} = {held} (a chunk must close while "
                               f"it is still held), got {self.allowed_lateness_seconds}"))
            else:  # the default never outlasts the history (short chunks in tests and demos)
                self.__dict__["allowed_lateness_seconds"] = held
        if errors:
            raise ConfigError(errors)
        self._defaults = ClassifierConfig(**{k: getattr(self, k) for k in _PER_CLASSIFIER})
        if self.classifiers_config_file is not None:
            self._overrides = _load_overrides(self.classifiers_config_file, self._defaults)
        return self

    # ---- per classifier

    def defaults(self) -> ClassifierConfig:
        """The per-classifier settings of a classifier without overrides (``classifier_id=None``)."""
        return self._defaults

    def for_classifier(self, cid: str) -> ClassifierConfig:
        """The effective settings of classifier `cid`: its overrides, else the global values."""
        cfg = self._cache.get(cid)
        if cfg is None:
            cfg = self._overrides.get(cid)
            if cfg is None:
                cfg = self._defaults.model_copy(update={"classifier_id": cid})
            if len(self._cache) >= 10_000:
                self._cache.clear()
            self._cache[cid] = cfg
        return cfg

    def event_time_window(self, now_ms: int) -> tuple[int, int]:
        """The event times (epoch ms, both ends included) a score is accepted with at wall-clock
        `now_ms`: the `window` of `schemas.parse.parse_scores` (see `schemas.messages.event_time_window`)."""
        return event_time_window(now_ms, self.chunk_seconds, self.max_event_time_skew_seconds,
                                 self.allowed_lateness_seconds)

    def threshold_for(self, cid: str) -> float:
        """The decision threshold of `cid` (the `threshold_for` of `schemas.parse.parse_scores`)."""
        return self.for_classifier(cid).threshold

    @property
    def overridden_classifiers(self) -> tuple[str, ...]:
        return tuple(sorted(self._overrides))

    # ---- clients

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments for aiokafka consumers and producers (includes the password)."""
        kw: dict[str, Any] = {"bootstrap_servers": self.kafka_bootstrap_servers,
                              "security_protocol": self.kafka_security_protocol}
        if self.kafka_security_protocol.startswith("SASL_"):
            kw.update(sasl_mechanism=self.kafka_sasl_mechanism, sasl_plain_username=self.kafka_sasl_username,
                      sasl_plain_password=self.kafka_sasl_password.get_secret_value()
                      if self.kafka_sasl_password else None)
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kw["ssl_context"] = create_ssl_context(
                cafile=str(self.kafka_ssl_cafile) if self.kafka_ssl_cafile else None,
                certfile=str(self.kafka_ssl_certfile) if self.kafka_ssl_certfile else None,
                keyfile=str(self.kafka_ssl_keyfile) if self.kafka_ssl_keyfile else None)
        return kw

    def redis_client_kwargs(self) -> dict[str, Any]:
        """TLS keyword arguments for ``redis.asyncio.Redis.from_url`` (empty unless REDIS_SSL_* are set)."""
        kw: dict[str, Any] = {}
        for name, arg in (("redis_ssl_cafile", "ssl_ca_certs"), ("redis_ssl_certfile", "ssl_certfile"),
                          ("redis_ssl_keyfile", "ssl_keyfile")):
            if getattr(self, name) is not None:
                kw[arg] = str(getattr(self, name))
        return kw

    def redis_url_with_credentials(self) -> str:
        """`redis_url` with REDIS_USERNAME / REDIS_PASSWORD put in (they win over the URL's own)."""
        if self.redis_password is None and self.redis_username is None:
            return self.redis_url
        parts = urlsplit(self.redis_url)
        if parts.scheme == "unix":  # no netloc: credentials go in the query string
            query = "&".join(q for q in parts.query.split("&") if q and not q.startswith(("username=", "password=")))
            extra = []
            if self.redis_username is not None:
                extra.append("username=" + quote(self.redis_username, safe=""))
            if self.redis_password is not None:
                extra.append("password=" + quote(self.redis_password.get_secret_value(), safe=""))
            query = "&".join(([query] if query else []) + extra)
            return f"unix://{parts.netloc}{parts.path}?{query}" + (f"#{parts.fragment}" if parts.fragment else "")
        user = quote(self.redis_username, safe="") if self.redis_username is not None else (parts.username or "")
        if self.redis_password is not None:
            password = quote(self.redis_password.get_secret_value(), safe="")
        else:
            password = parts.password or ""
        host = parts.netloc.rpartition("@")[2]
        netloc = f"{user}:{password}@{host}" if password else f"{user}@{host}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    # ---- display

    def secret_values(self) -> list[str]:
        """The secrets to keep out of every log line: passwords, also the one inside REDIS_URL."""
        from urllib.parse import unquote

        out = [p.get_secret_value() for p in (self.kafka_sasl_password, self.redis_password) if p is not None]
        _scheme, _, rest = self.redis_url.partition("://")
        userinfo, at, _host = rest.rpartition("@")
        if at and ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            out += [raw, unquote(raw)]
        for match in _QUERY_PASSWORD.finditer(self.redis_url):
            out.append(unquote(self.redis_url[match.end(1):match.end()]))
        return [s for s in dict.fromkeys(out) if s]

    def safe_dict(self) -> dict[str, Any]:
        """All settings as JSON-able values for logs: secrets and URL passwords masked."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, SecretStr):
                v = _MASK
            elif isinstance(v, Path):
                v = str(v)
            elif name == "redis_url":
                v = mask_url(v)
            out[name] = v
        out["overridden_classifiers"] = list(self.overridden_classifiers)
        return out

    def __repr_args__(self):  # type: ignore[override]
        for name, v in super().__repr_args__():
            yield name, (mask_url(v) if name == "redis_url" and isinstance(v, str) else v)


_SECRETS = frozenset(name for name, f in Settings.model_fields.items() if "SecretStr" in str(f.annotation))


def _load_overrides(path: Path, defaults: ClassifierConfig) -> dict[str, ClassifierConfig]:
    var = env_var("classifiers_config_file")
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError([(var, f"cannot read {str(path)!r}: {exc.strerror or exc}")]) from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError([(var, f"{str(path)!r} is not valid JSON: {exc}")]) from None
    if not isinstance(doc, dict):
        raise ConfigError([(var, f"{str(path)!r} must hold a JSON object "
                                 '{"<classifier_id>": {"<setting>": value, ...}, ...}')])
    base = defaults.model_dump(exclude={"classifier_id"})
    out: dict[str, ClassifierConfig] = {}
    errors: list[tuple[str, str]] = []
    for cid, over in doc.items():
        if not is_classifier_id(cid):
            errors.append((var, f"{cid!r} is not a classifier id ({CLASSIFIER_ID_RULE})"))
            continue
        if not isinstance(over, dict):
            errors.append((var, f"{cid}: must be an object of settings, got {type(over).__name__}"))
            continue
        unknown = sorted(set(over) - set(OVERRIDABLE))
        if unknown:
            errors.append((var, f"{cid}: unknown setting(s) {', '.join(map(repr, unknown))}; "
                                f"allowed: {', '.join(OVERRIDABLE)}"))
            continue
        try:
            out[cid] = ClassifierConfig.model_validate({**base, **over, "classifier_id": cid}, strict=True)
        except ValidationError as exc:
            errors.extend((var, f"{cid}.{field}: {msg}")
                          for field, msg in _errors(exc, lambda f: f, lambda f: False))
    if errors:
        raise ConfigError(errors)
    return out


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: ``os.environ``).  Raises `ConfigError` naming the variables."""
    token = _ENVIRON.set(env)
    try:
        return Settings()
    finally:
        _ENVIRON.reset(token)
