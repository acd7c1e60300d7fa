"""`Settings`: each setting declared once, with its check, default and marks; `ClassifierConfig` derived.

A field reads ``name: Annotated[type, check, mark...] = default``.  The check (`.checks`) runs on
``STRATAMETER_<NAME>`` and, for a per-classifier setting, on the overrides file alike (`.overrides`
reads that file: the overrides and the review groups); the marks
(`Mark`) say what else the field is: FROM_FILE (a ``*_FILE`` variant), OVERRIDE (may differ per
classifier, docs/reference/configuration.md's ``*``), CARRY (per classifier, the same for all).  `ClassifierConfig`,
`OVERRIDABLE` and `FILE_SECRETS` are read off these declarations; tests/unit/test_config_docs.py holds
the configuration table (docs/reference/configuration.md) and the Helm chart to them.
"""

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, get_args
from urllib.parse import urlsplit

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, create_model,
                      model_validator)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from stratameter.schemas.messages import (
    TOPIC_DEAD_LETTER,
    TOPIC_LABEL_REQUESTS,
    TOPIC_LABELS,
    TOPIC_SCORES,
    event_time_window,
)

from ..state.keys import owner_of
from ..stats.allocation import SERVICE_ALLOCATIONS
from ..stats.calibration import SCORE_KINDS
from ..stats.confusion import DEFAULT_NEGATIVE_STRATIFICATION, needs_negatives
from ..stats.difference import CALIBRATION_MIN_LABELS
from ..stats.strata import STRATIFICATIONS
from .checks import (
    ENV_PREFIX,
    ConfigError,
    Mark,
    check,
    choice_list,
    classifier_id_like,
    duration_list,
    env_var,
    field_errors,
    finite,
    host_port_list,
    http_url,
    in_range,
    name_chars,
    nonempty,
    one_of,
    open_interval,
    project_name,
    metric_list,
    positive,
    readable_file,
    topic,
    valid_redis_url,
)
from .clients import ClientOptions
from .overrides import DEFAULT_GROUP, ClassifiersFile, load_classifiers_file, review_budgets
from .source import ENVIRON, EnvSource

SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

OVERRIDE, CARRY, FROM_FILE = Mark.OVERRIDE, Mark.CARRY, Mark.FROM_FILE
AtLeast1 = Annotated[int, in_range(1)]
NonEmpty = Annotated[str, check(nonempty)]
Topic = Annotated[str, check(topic)]
ReadableFile = Annotated[Path, check(readable_file)] | None
UserName = Annotated[str | None, FROM_FILE]
Password = Annotated[SecretStr | None, FROM_FILE]


def _default_instance_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname()) or "localhost"
    return f"{host[:200]}-{os.getpid()}"


class Settings(ClientOptions, BaseSettings):
    """All settings (docs/reference/configuration.md).  Build with `load_settings()`.

    ``Settings()`` reads ``os.environ`` too, and like `load_settings` raises
    `ConfigError` naming the variables.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    kafka_bootstrap_servers: Annotated[str, check(host_port_list)] = "localhost:9092"
    kafka_consumer_group: NonEmpty = "stratameter"
    kafka_security_protocol: Annotated[str, one_of(SECURITY_PROTOCOLS, str.upper)] = "PLAINTEXT"
    kafka_sasl_mechanism: Annotated[str, one_of(SASL_MECHANISMS, str.upper)] = "PLAIN"
    kafka_sasl_username: UserName = None  # required with SASL_* (below)
    kafka_sasl_password: Password = None
    kafka_ssl_cafile: ReadableFile = None
    kafka_ssl_certfile: ReadableFile = None
    kafka_ssl_keyfile: ReadableFile = None  # needs the certfile
    kafka_session_timeout_ms: Annotated[int, in_range(1000)] = 10_000
    redis_url: Annotated[str, check(valid_redis_url)] = "redis://localhost:6379/0"
    redis_username: UserName = None
    redis_password: Password = None
    redis_ssl_cafile: ReadableFile = None  # the three: rediss:// only
    redis_ssl_certfile: ReadableFile = None
    redis_ssl_keyfile: ReadableFile = None
    redis_key_prefix: Annotated[str, name_chars("the prefix")] = "stratameter"
    redis_cluster: bool = False  # REDIS_URL names any node of a Redis Cluster (below: database 0, no unix://)
    http_host: NonEmpty = "0.0.0.0"
    http_port: Annotated[int, in_range(1, 65535)] = 9108
    topic_scores: Topic = TOPIC_SCORES  # the four topics must differ
    topic_label_requests: Topic = TOPIC_LABEL_REQUESTS
    topic_labels: Topic = TOPIC_LABELS
    topic_dead_letter: Topic = TOPIC_DEAD_LETTER
    # per classifier: OVERRIDE may differ per classifier (CLASSIFIERS_CONFIG_FILE), CARRY is the same for all
    delta: Annotated[float, open_interval(0, 0.5), OVERRIDE] = 0.02
    confidence: Annotated[float, open_interval(0.5, 1), OVERRIDE] = 0.95
    strata: Annotated[int, in_range(1, 20), OVERRIDE] = 4
    stratification: Annotated[str, one_of(STRATIFICATIONS), OVERRIDE] = "perc"
    # precision, recall, f1, accuracy (comma list); recall, f1 and accuracy sample the predicted negatives too
    metrics: Annotated[str, check(metric_list), OVERRIDE] = "precision"
    negative_strata: Annotated[int, in_range(1, 20), OVERRIDE] = 4
    # the stream design (pacing, catch-up and shortfall rounds) is built on opt_track; the papers' other
    # allocations are compared in `stratameter simulate --methods`, not offered as a switch that would be ignored
    allocation: Annotated[str, one_of(SERVICE_ALLOCATIONS), OVERRIDE] = "opt_track"
    threshold: Annotated[float, check(finite), OVERRIDE] = 0.5
    score_kind: Annotated[str, one_of(SCORE_KINDS), OVERRIDE] = "auto"
    # precision's difference estimator (the score inside the strata): considered from this many labels of
    # a chunk, used while it beats the plain estimator (labels.calibrated); 0 turns it off
    calibration_min_labels: Annotated[int, in_range(0), OVERRIDE] = CALIBRATION_MIN_LABELS
    chunk_seconds: Annotated[AtLeast1, CARRY] = 3600
    max_labels_per_hour: Annotated[AtLeast1, OVERRIDE] = 500
    # a label budget shared by a review group (named groups: "$review_groups" in CLASSIFIERS_CONFIG_FILE,
    # `.overrides`); a request needs room in its group's budget and in MAX_LABELS_PER_HOUR alike
    review_budget_per_hour: Annotated[int, in_range(0)] = 0  # the group "default"'s (global); 0: none
    review_group: Annotated[str, classifier_id_like("a group name"), OVERRIDE] = DEFAULT_GROUP
    review_weight: Annotated[float, check(positive), OVERRIDE] = 1.0  # lowers the largest weight x halfwidth / delta
    label_timeout_seconds: Annotated[float, check(positive), OVERRIDE] = 86400.0
    round_labels_per_stratum: Annotated[AtLeast1, CARRY] = 2
    stop_rounds: Annotated[AtLeast1, CARRY] = 2
    reservoir_size: Annotated[int, in_range(8, 100_000), CARRY] = 1024
    chunk_retention: Annotated[AtLeast1, CARRY] = 24
    history_chunks: Annotated[AtLeast1, CARRY] = 168
    request_retention_seconds: Annotated[float, check(positive), CARRY] = 7 * 86400.0
    max_event_time_skew_seconds: Annotated[int, in_range(0), CARRY] = 300
    # at most history_chunks x chunk_seconds; left unset, 300 or that product if smaller (below)
    allowed_lateness_seconds: Annotated[int, in_range(0), CARRY] = 300
    # estimates pooled over the reported chunk and those before it (chunks.window): durations, each a multiple
    # of chunk_seconds and at most history_chunks chunks (none: no window); unset, 1d or what the history holds
    windows: Annotated[str, check(duration_list), CARRY] = "1d"
    # every classifier id creates state, series and a request loop: new ids past this are dead-lettered
    max_classifiers: AtLeast1 = 5_000  # one replica scrapes 5,000 owned classifiers in ~5 s (docs/development/benchmarks.md, Scale)
    # process
    # the most a poll takes; polls are sized to the ingest rate (app.pipeline.PollSize), from 5,000 up
    batch_max_records: AtLeast1 = 20_000
    dead_letter_max_per_second: Annotated[float, check(positive)] = 1000.0
    # start-up retries an unreachable Kafka or Redis with backoff this long (/readyz 503), then exits 1; 0: one try
    startup_timeout_seconds: Annotated[int, in_range(0)] = 300
    log_level: Annotated[str, one_of(LOG_LEVELS, str.upper)] = "INFO"
    instance_id: Annotated[str, name_chars("the id")] = Field(default_factory=_default_instance_id)
    classifiers_config_file: Path | None = None
    # the Label Studio bridge (`stratameter bridge label-studio`, docs/how-to/label-studio.md); the service
    # ignores these, the bridge also reads the Kafka, Redis and topic settings above
    label_studio_url: Annotated[str, check(http_url)] = "http://localhost:8080"
    label_studio_token: Password = None  # required by the bridge: Label Studio's API token
    label_studio_project: Annotated[str, check(project_name)] = "stratameter"  # an id (digits) or a title; a title not found is created
    label_studio_choices: Annotated[str, check(choice_list)] = "Positive,Negative,Unsure"  # true, false[, unsure]
    label_studio_show_score: bool = False  # the classifier's score anchors the reviewer's judgement
    label_studio_webhook_url: Annotated[str | None, check(http_url)] = None  # the bridge's /webhook as LS reaches it
    label_studio_poll_seconds: Annotated[float, check(positive)] = 30.0
    bridge_consumer_group: NonEmpty = "stratameter-bridge-label-studio"
    bridge_http_host: NonEmpty = "0.0.0.0"
    bridge_http_port: Annotated[int, in_range(1, 65535)] = 9109

    _defaults: BaseModel = PrivateAttr()
    _overrides: dict[str, BaseModel] = PrivateAttr(default_factory=dict)
    _review_budgets: dict[str, int] = PrivateAttr(default_factory=dict)
    _sharing_groups: frozenset[str] = PrivateAttr(default_factory=frozenset)
    _cache: dict[str, BaseModel] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(field_errors(exc, env_var, lambda f: f in _SECRETS)) from None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = ENVIRON.get()
        return init_settings, EnvSource(settings_cls, os.environ if environ is None else environ)

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        errors = _cross_field_errors(self)
        held = self.history_chunks * self.chunk_seconds  # seconds of event time still held
        if self.allowed_lateness_seconds > held:
            if "allowed_lateness_seconds" in self.model_fields_set:
                errors.append((env_var("allowed_lateness_seconds"),
                               f"must be at most {env_var('history_chunks')} x {env_var('chunk_seconds')} = "
                               f"{self.history_chunks} x {self.chunk_seconds} = {held} (a chunk must close while "
                               f"it is still held), got {self.allowed_lateness_seconds}"))
            else:  # the default never outlasts the history (short chunks in tests and demos)
                self.__dict__["allowed_lateness_seconds"] = held
        errors += _window_errors(self)
        if errors:
            raise ConfigError(errors)
        self._defaults = ClassifierConfig(**{k: getattr(self, k) for k in PER_CLASSIFIER})
        file = ClassifiersFile() if self.classifiers_config_file is None else \
            load_classifiers_file(self.classifiers_config_file, self._defaults, OVERRIDABLE)
        self._overrides = file.overrides
        self._review_budgets = review_budgets(file.groups, self.review_budget_per_hour, self.review_group)
        self._sharing_groups = file.sharing
        return self

    # ---- per classifier

    def defaults(self) -> "ClassifierConfig":
        """The per-classifier settings of a classifier without overrides (``classifier_id=None``)."""
        return self._defaults

    def for_classifier(self, cid: str) -> "ClassifierConfig":
        """The effective `ClassifierConfig` of classifier `cid`: its overrides, else the global values.

        For the state of a classifier's predicted negatives (`state.keys.negatives_of`): the
        classifier's settings with its negative strata (`negative_strata`, stratified by
        `confusion.DEFAULT_NEGATIVE_STRATIFICATION`) as the strata."""
        cfg = self._cache.get(cid)
        if cfg is None:
            owner, negative = owner_of(cid)
            cfg = self._overrides.get(owner)
            if cfg is None:
                cfg = self._defaults.model_copy(update={"classifier_id": owner})
            if negative:
                cfg = cfg.model_copy(update={"classifier_id": cid, "strata": cfg.negative_strata,
                                             "stratification": DEFAULT_NEGATIVE_STRATIFICATION})
            if len(self._cache) >= 10_000:
                self._cache.clear()
            self._cache[cid] = cfg
        return cfg

    def event_time_window(self, now_ms: int) -> tuple[int, int]:
        """The event times (epoch ms, both ends included) a score is accepted with at wall-clock
        `now_ms`: the `window` of `stratameter.schemas.inbound.parse_scores` (see
        `stratameter.schemas.messages.event_time_window`)."""
        return event_time_window(now_ms, self.chunk_seconds, self.max_event_time_skew_seconds,
                                 self.allowed_lateness_seconds)

    def samples_negatives(self, cid: str) -> bool:
        """Whether classifier `cid`'s metrics need its predicted negatives sampled."""
        return needs_negatives(self.for_classifier(cid).metrics.split(","))

    def threshold_for(self, cid: str) -> float:
        """The decision threshold of `cid` (the `threshold_for` of `stratameter.schemas.inbound.parse_scores`)."""
        return self.for_classifier(cid).threshold  # type: ignore[no-any-return]

    @property
    def overridden_classifiers(self) -> tuple[str, ...]:
        return tuple(sorted(self._overrides))

    # ---- review groups

    @property
    def review_budgets(self) -> dict[str, int]:
        """Every review group with a shared budget and its labels per hour (a new dict): those under
        ``$review_groups``, and ``default`` with REVIEW_BUDGET_PER_HOUR (or its file entry) if it has one."""
        return dict(self._review_budgets)

    def group_of(self, cid: str) -> str | None:
        """The review group whose shared budget classifier `cid` draws from: its `review_group` if that
        group has a budget, else None (its own MAX_LABELS_PER_HOUR alone holds).  For the state of its
        predicted negatives (`state.keys.negatives_of(cid)`), the classifier's group."""
        group: str = self.for_classifier(cid).review_group
        return group if group in self._review_budgets else None

    def sharing_group_of(self, cid: str) -> str | None:
        """The review group of `cid` if that group shares items (``share_items``: its classifiers draw
        an item's priority from its id, and one request serves every member wanting the item,
        `requests.shared_items`), else None."""
        group = self.group_of(cid)
        return group if group in self._sharing_groups else None


def _window_errors(s: Settings) -> list[tuple[str, str]]:
    """`WINDOWS` against the chunks: each a whole number of chunks, at most `HISTORY_CHUNKS` of them.
    Left unset, the default day becomes the whole chunks of a day the history holds (at least one)."""
    from ..chunks.window import format_duration, parse_duration

    if "windows" not in s.model_fields_set:
        chunks = max(1, min(s.history_chunks, parse_duration(s.windows) // s.chunk_seconds))
        s.__dict__["windows"] = format_duration(chunks * s.chunk_seconds)
        return []
    bad = [w for w in s.windows.split(",") if w and (parse_duration(w) % s.chunk_seconds
                                                     or parse_duration(w) // s.chunk_seconds > s.history_chunks)]
    if not bad:
        return []
    return [(env_var("windows"), f"each window must be a whole number of {env_var('chunk_seconds')} "
                                 f"({s.chunk_seconds} s) and at most {env_var('history_chunks')} = {s.history_chunks} "
                                 f"chunks long, got {', '.join(bad)}")]


def _cross_field_errors(s: Settings) -> list[tuple[str, str]]:
    """The rules that tie settings together (the lateness bound aside), in the order they are reported."""
    errors: list[tuple[str, str]] = []
    if s.kafka_security_protocol.startswith("SASL_"):
        for name in ("kafka_sasl_username", "kafka_sasl_password"):
            if getattr(s, name) is None:
                errors.append((env_var(name), f"required when {env_var('kafka_security_protocol')} "
                                              f"is {s.kafka_security_protocol}"))
    for side in ("kafka", "redis"):
        if getattr(s, f"{side}_ssl_keyfile") is not None and getattr(s, f"{side}_ssl_certfile") is None:
            errors.append((env_var(f"{side}_ssl_keyfile"), f"needs {env_var(f'{side}_ssl_certfile')}"))
    if not s.redis_url.startswith("rediss://"):
        for name in ("redis_ssl_cafile", "redis_ssl_certfile", "redis_ssl_keyfile"):
            if getattr(s, name) is not None:
                errors.append((env_var(name), f"needs a rediss:// {env_var('redis_url')} (TLS), got "
                                              f"{urlsplit(s.redis_url).scheme}://"))
    if s.redis_cluster:
        parts = urlsplit(s.redis_url)
        if parts.scheme == "unix":
            errors.append((env_var("redis_url"), f"must name a cluster node (redis:// or rediss://) when "
                                                 f"{env_var('redis_cluster')} is true, got unix://"))
        elif parts.path.strip("/") not in ("", "0"):
            errors.append((env_var("redis_url"), f"Redis Cluster has only database 0 "
                                                 f"({env_var('redis_cluster')} is true), got /{parts.path.strip('/')}"))
    seen: dict[str, str] = {}
    for name in ("topic_scores", "topic_label_requests", "topic_labels", "topic_dead_letter"):
        topic_name = getattr(s, name)
        if topic_name in seen:
            errors.append((env_var(name),
                           f"{topic_name!r} is also {env_var(seen[topic_name])}; the topics must differ"))
        seen.setdefault(topic_name, name)
    return errors


# --------------------------------------------------------------------------- read off the declarations

_FIELDS = Settings.model_fields
#: the settings of one classifier (`ClassifierConfig`): those marked OVERRIDE or CARRY
PER_CLASSIFIER: tuple[str, ...] = tuple(n for n, f in _FIELDS.items() if OVERRIDE in f.metadata or CARRY in f.metadata)
#: keys allowed per classifier in the overrides file
OVERRIDABLE: tuple[str, ...] = tuple(n for n, f in _FIELDS.items() if OVERRIDE in f.metadata)
#: settings that may also come from a file named by the ``*_FILE`` variable
FILE_SECRETS: tuple[str, ...] = tuple(n for n, f in _FIELDS.items() if FROM_FILE in f.metadata)
_SECRETS = frozenset(n for n, f in _FIELDS.items() if SecretStr in get_args(f.annotation))

ClassifierConfig: type[BaseModel] = create_model(
    "ClassifierConfig",
    __doc__="The effective settings of one classifier: the globals, with its overrides applied.",
    __config__=ConfigDict(frozen=True, extra="forbid"),
    __module__="stratameter.config",
    classifier_id=(str | None, None),
    **{n: (_FIELDS[n].rebuild_annotation(), _FIELDS[n].default) for n in PER_CLASSIFIER},  # type: ignore[call-overload]
)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: ``os.environ``).  Raises `ConfigError` naming the variables."""
    token = ENVIRON.set(env)
    try:
        return Settings()
    finally:
        ENVIRON.reset(token)
