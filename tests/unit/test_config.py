"""stratameter.config: STRATAMETER_* variables, *_FILE secrets, per-classifier overrides, masking."""

from __future__ import annotations

import os
import socket

import orjson
import pytest
from pydantic import ValidationError

from stratameter.schemas.inbound import parse_scores
from stratameter.config import (
    FILE_SECRETS,
    OVERRIDABLE,
    PER_CLASSIFIER,
    ClassifierConfig,
    ConfigError,
    Settings,
    load_settings,
)
from stratameter.stats.allocation import ALLOCATIONS, SERVICE_ALLOCATIONS
from stratameter.stats.calibration import SCORE_KINDS
from stratameter.stats.strata import STRATIFICATIONS
from tests.settings_env import P, env, error_of


# --------------------------------------------------------------------------- defaults and overrides


def test_defaults():
    s = load_settings({})
    assert s.kafka_bootstrap_servers == "localhost:9092"
    assert s.kafka_consumer_group == "stratameter"
    assert s.kafka_security_protocol == "PLAINTEXT"
    assert s.kafka_sasl_password is None and s.redis_password is None
    assert s.redis_url == "redis://localhost:6379/0"
    assert s.redis_key_prefix == "stratameter"
    assert (s.http_host, s.http_port) == ("0.0.0.0", 9108)
    assert (s.topic_scores, s.topic_label_requests, s.topic_labels, s.topic_dead_letter) == (
        "stratameter.scores", "stratameter.label-requests", "stratameter.labels", "stratameter.dead-letter")
    assert (s.delta, s.confidence, s.strata, s.stratification, s.allocation) == (0.02, 0.95, 4, "perc", "opt_track")
    assert (s.threshold, s.score_kind, s.chunk_seconds) == (0.5, "auto", 3600)
    assert (s.max_labels_per_hour, s.label_timeout_seconds) == (500, 86400)
    assert (s.round_labels_per_stratum, s.stop_rounds, s.reservoir_size) == (2, 2, 1024)
    assert (s.chunk_retention, s.history_chunks) == (24, 168)
    assert (s.max_event_time_skew_seconds, s.allowed_lateness_seconds) == (300, 300)
    assert (s.defaults().max_event_time_skew_seconds, s.defaults().allowed_lateness_seconds) == (300, 300)
    assert (s.batch_max_records, s.dead_letter_max_per_second, s.log_level) == (20_000, 1000, "INFO")
    assert s.classifiers_config_file is None
    host = socket.gethostname()
    assert s.instance_id.endswith(f"-{os.getpid()}") and s.instance_id.startswith(host.split(".")[0][:10])


def test_env_overrides():
    s = load_settings(env(kafka_bootstrap_servers="k1:9092, k2:9093", kafka_consumer_group="g1",
                          redis_url="rediss://cache.internal:6380/2", redis_key_prefix="sm:prod",
                          http_host="127.0.0.1", http_port="9200", topic_scores="s", topic_label_requests="rq",
                          topic_labels="l", topic_dead_letter="d", delta="0.05", confidence="0.99", strata="6",
                          stratification="cum_sqrt_f", allocation="OPT_TRACK", threshold="-1.5", score_kind="logit",
                          chunk_seconds="600", max_labels_per_hour="50", label_timeout_seconds="90.5",
                          round_labels_per_stratum="3", stop_rounds="4", reservoir_size="8",
                          batch_max_records="100", dead_letter_max_per_second="2.5", log_level="debug",
                          instance_id="pod-7", kafka_session_timeout_ms="6000"))
    assert s.kafka_bootstrap_servers == "k1:9092,k2:9093"
    assert (s.kafka_consumer_group, s.redis_url, s.redis_key_prefix) == ("g1", "rediss://cache.internal:6380/2",
                                                                         "sm:prod")
    assert (s.http_host, s.http_port) == ("127.0.0.1", 9200)
    assert (s.topic_scores, s.topic_label_requests, s.topic_labels, s.topic_dead_letter) == ("s", "rq", "l", "d")
    assert (s.delta, s.confidence, s.strata, s.stratification, s.allocation) == (0.05, 0.99, 6, "cum_sqrt_f", "opt_track")
    assert (s.threshold, s.score_kind, s.chunk_seconds, s.max_labels_per_hour) == (-1.5, "logit", 600, 50)
    assert (s.label_timeout_seconds, s.round_labels_per_stratum, s.stop_rounds, s.reservoir_size) == (90.5, 3, 4, 8)
    assert (s.batch_max_records, s.dead_letter_max_per_second, s.log_level) == (100, 2.5, "DEBUG")
    assert (s.instance_id, s.kafka_session_timeout_ms) == ("pod-7", 6000)


def test_empty_values_count_as_unset_and_names_are_upper_case():
    s = load_settings({P + "DELTA": "", P + "KAFKA_SSL_CAFILE": "", "stratameter_delta": "0.3",
                       P + "TEST_KAFKA": "ignored:1", "OTHER": "x"})
    assert s.delta == 0.02 and s.kafka_ssl_cafile is None


def test_settings_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv(P + "STRATA", "7")
    assert Settings().strata == 7
    assert load_settings().strata == 7
    assert load_settings({}).strata == 4  # an explicit mapping replaces os.environ
    monkeypatch.setenv(P + "STRATA", "70")
    with pytest.raises(ConfigError, match=r"^STRATAMETER_STRATA: must be in 1\.\.20, got 70$"):
        Settings()


def test_the_service_offers_only_the_allocation_its_stream_design_runs():
    """The other allocations of the core are compared in `stratameter simulate`; as a service
    setting they would be accepted and ignored (the stream design paces and tops up by opt_track)."""
    assert SERVICE_ALLOCATIONS == ("opt_track",)
    assert load_settings(env(allocation="opt_track")).allocation == "opt_track"
    for other in set(ALLOCATIONS) - set(SERVICE_ALLOCATIONS):
        assert "STRATAMETER_ALLOCATION: must be one of opt_track, got" in str(error_of(env(allocation=other)))


def test_choices_come_from_the_stats_core():
    for s in STRATIFICATIONS:
        assert load_settings(env(stratification=s)).stratification == s
    for k in SCORE_KINDS:
        assert load_settings(env(score_kind=k)).score_kind == k
    msg = str(error_of(env(allocation="neyman")))
    assert all(a in msg for a in SERVICE_ALLOCATIONS)


# --------------------------------------------------------------------------- invalid values


def test_error_message_format():
    assert str(error_of(env(delta="2"))) == "STRATAMETER_DELTA: must be in (0, 0.5), got 2"


@pytest.mark.parametrize("name, value, fragment", [
    ("delta", "0", "must be in (0, 0.5), got 0"),
    ("delta", "0.5", "must be in (0, 0.5), got 0.5"),
    ("delta", "-0.1", "got -0.1"),
    ("delta", "nan", "must be in (0, 0.5)"),
    ("delta", "abc", "must be a number, got 'abc'"),
    ("confidence", "0.5", "must be in (0.5, 1), got 0.5"),
    ("confidence", "1", "must be in (0.5, 1), got 1"),
    ("confidence", "95", "got 95"),
    ("strata", "0", "must be in 1..20, got 0"),
    ("strata", "21", "must be in 1..20, got 21"),
    ("strata", "4.5", "must be an integer"),
    ("stratification", "quantile",
     "must be one of perc, equal, cum_sqrt_f, cum_cbrt_f, cum_sqrt_prior, wtmn, kmeans, gmm, got 'quantile'"),
    ("allocation", "neyman", "must be one of opt_track"),
    ("threshold", "inf", "must be a finite number"),
    ("threshold", "nan", "must be a finite number"),
    ("threshold", "high", "must be a number"),
    ("score_kind", "prob", "must be one of auto, probability, logit"),
    ("chunk_seconds", "0", "must be >= 1, got 0"),
    ("chunk_seconds", "1.5", "must be an integer"),
    ("max_labels_per_hour", "0", "must be >= 1, got 0"),
    ("label_timeout_seconds", "0", "must be a finite number > 0, got 0"),
    ("label_timeout_seconds", "-5", "> 0"),
    ("label_timeout_seconds", "inf", "> 0"),
    ("round_labels_per_stratum", "0", "must be >= 1"),
    ("stop_rounds", "0", "must be >= 1"),
    ("reservoir_size", "7", "must be in 8..100000, got 7"),
    ("reservoir_size", "100001", "must be in 8..100000"),
    ("batch_max_records", "0", "must be >= 1"),
    ("max_event_time_skew_seconds", "-1", "must be >= 0, got -1"),
    ("max_event_time_skew_seconds", "2.5", "must be an integer"),
    ("allowed_lateness_seconds", "-1", "must be >= 0, got -1"),
    ("allowed_lateness_seconds", "soon", "must be an integer"),
    ("allowed_lateness_seconds", "604801", "must be at most STRATAMETER_HISTORY_CHUNKS x STRATAMETER_CHUNK_SECONDS"),
    ("dead_letter_max_per_second", "0", "> 0"),
    ("http_port", "0", "must be in 1..65535, got 0"),
    ("http_port", "70000", "must be in 1..65535"),
    ("http_port", "http", "must be an integer, got 'http'"),
    ("kafka_bootstrap_servers", "localhost", "host:port"),
    ("kafka_bootstrap_servers", "a:1,,b:2", "host:port"),
    ("kafka_bootstrap_servers", "a:port", "host:port"),
    ("kafka_security_protocol", "TLS", "must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, got 'TLS'"),
    ("kafka_sasl_mechanism", "GSSAPI", "must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ("kafka_ssl_cafile", "/nonexistent/ca.pem", "is not a readable file"),
    ("kafka_session_timeout_ms", "10", "must be >= 1000"),
    ("redis_url", "http://localhost:6379", "must start with redis://, rediss:// or unix://"),
    ("redis_url", "localhost:6379", "must start with redis://"),
    ("redis_url", "redis://", "has no host"),
    ("redis_url", "redis://h:port/0", "is not a valid URL"),
    ("redis_key_prefix", "my prefix", "[A-Za-z0-9._:-]"),
    ("redis_key_prefix", "sm{1}", "[A-Za-z0-9._:-]"),
    ("topic_scores", "bad topic", "Kafka topic name"),
    ("topic_labels", "..", "Kafka topic name"),
    ("topic_dead_letter", "t" * 250, "Kafka topic name"),
    ("log_level", "loud", "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("instance_id", "pod 7", "[A-Za-z0-9._:-]"),
])
def test_invalid_values_name_the_variable(name, value, fragment):
    err = error_of(env(**{name: value}))
    var = P + name.upper()
    assert str(err).startswith(var + ": "), str(err)
    assert fragment in str(err)
    assert err.errors[0][0] == var


@pytest.mark.parametrize("url, fragment", [
    ("unix:///run/redis.sock", "must name a cluster node (redis:// or rediss://)"),
    ("redis://node-1:6379/2", "Redis Cluster has only database 0"),
])
def test_a_cluster_url_names_a_node_of_database_0(url, fragment):
    err = error_of(env(redis_cluster="true", redis_url=url))
    assert str(err).startswith(P + "REDIS_URL: ") and fragment in str(err), str(err)
    for fine in ("redis://node-1:6379", "redis://node-1:6379/0", "rediss://u:p@node-1:6380/"):
        assert load_settings(env(redis_cluster="true", redis_url=fine)).redis_cluster
    assert error_of(env(redis_cluster="maybe")).errors[0][0] == P + "REDIS_CLUSTER"


def test_all_errors_are_reported_together():
    err = error_of(env(delta="1", strata="x", http_port="0"))
    assert [var for var, _ in err.errors] == [P + "HTTP_PORT", P + "DELTA", P + "STRATA"]
    assert str(err).count("STRATAMETER_") == 3


def test_redis_password_in_url_is_not_echoed_in_errors():
    err = error_of(env(redis_url="http://user:hunter2@host:1/0"))
    assert "hunter2" not in str(err) and "**********" in str(err)


def test_cross_field_rules():
    err = error_of(env(kafka_security_protocol="SASL_SSL"))
    assert [var for var, _ in err.errors] == [P + "KAFKA_SASL_USERNAME", P + "KAFKA_SASL_PASSWORD"]
    assert "required when STRATAMETER_KAFKA_SECURITY_PROTOCOL is SASL_SSL" in str(err)
    err = error_of(env(topic_labels="stratameter.scores"))
    assert str(err).startswith(P + "TOPIC_LABELS: 'stratameter.scores' is also STRATAMETER_TOPIC_SCORES")


def test_allowed_lateness_is_bounded_by_the_history():
    """A chunk must close while it is still held: lateness <= HISTORY_CHUNKS x CHUNK_SECONDS."""
    s = load_settings(env(chunk_seconds="10", history_chunks="6", allowed_lateness_seconds="60",
                          max_event_time_skew_seconds="0"))
    assert (s.allowed_lateness_seconds, s.max_event_time_skew_seconds) == (60, 0)
    assert s.for_classifier("x").allowed_lateness_seconds == 60
    err = error_of(env(chunk_seconds="10", history_chunks="6", allowed_lateness_seconds="61"))
    assert err.errors == [(P + "ALLOWED_LATENESS_SECONDS",
                           "must be at most STRATAMETER_HISTORY_CHUNKS x STRATAMETER_CHUNK_SECONDS = 6 x 10 = 60 "
                           "(a chunk must close while it is still held), got 61")]
    # left unset, the default (300) shrinks to the history instead of failing (short chunks)
    s = load_settings(env(chunk_seconds="1"))
    assert s.allowed_lateness_seconds == 168 and s.defaults().allowed_lateness_seconds == 168
    assert load_settings(env(allowed_lateness_seconds="0")).allowed_lateness_seconds == 0


def test_event_time_window_from_the_settings():
    s = load_settings(env(chunk_seconds="60", max_event_time_skew_seconds="30", allowed_lateness_seconds="90"))
    now = 1_800_000_125_000  # 5 s into the chunk [1_800_000_120_000, +60 s)
    # chunks that ended 90 s ago or earlier are closed: the oldest open one starts at floor((now - 90 s) / 60 s)
    assert s.event_time_window(now) == (1_800_000_000_000, now + 30_000)
    # the chunk [1_800_000_000_000, +60 s) closes 90 s after its end, at 1_800_000_150_000
    assert s.event_time_window(1_800_000_149_999)[0] == 1_800_000_000_000
    assert s.event_time_window(1_800_000_150_000) == (1_800_000_060_000, 1_800_000_180_000)


def test_sasl_and_ssl(tmp_path):
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_text("x")
    s = load_settings(env(kafka_security_protocol="sasl_plaintext", kafka_sasl_mechanism="scram-sha-512",
                          kafka_sasl_username="svc", kafka_sasl_password="s3cret"))
    assert (s.kafka_security_protocol, s.kafka_sasl_mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    kw = s.kafka_client_kwargs()
    assert kw == {"bootstrap_servers": "localhost:9092", "security_protocol": "SASL_PLAINTEXT",
                  "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "svc", "sasl_plain_password": "s3cret"}
    s = load_settings(env(kafka_security_protocol="SSL", kafka_ssl_cafile=str(ca), kafka_ssl_certfile=str(cert),
                          kafka_ssl_keyfile=str(key)))
    assert s.kafka_ssl_cafile == ca
    err = error_of(env(kafka_ssl_keyfile=str(key)))
    assert str(err) == "STRATAMETER_KAFKA_SSL_KEYFILE: needs STRATAMETER_KAFKA_SSL_CERTFILE"
    assert load_settings({}).kafka_client_kwargs() == {"bootstrap_servers": "localhost:9092",
                                                       "security_protocol": "PLAINTEXT"}


# --------------------------------------------------------------------------- secrets from files


def test_secret_files(tmp_path):
    (tmp_path / "kafka").write_text("kafka-pass\n")
    (tmp_path / "redis").write_text("redis pass with spaces \r\n")
    (tmp_path / "user").write_text("svc-user")
    s = load_settings({P + "KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "kafka"),
                       P + "KAFKA_SASL_USERNAME_FILE": str(tmp_path / "user"),
                       P + "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                       P + "REDIS_PASSWORD_FILE": str(tmp_path / "redis")})
    assert s.kafka_sasl_password.get_secret_value() == "kafka-pass"
    assert s.kafka_sasl_username == "svc-user"
    assert s.redis_password.get_secret_value() == "redis pass with spaces "


def test_secret_file_errors(tmp_path):
    err = error_of({P + "REDIS_PASSWORD_FILE": str(tmp_path / "missing")})
    assert str(err).startswith(P + "REDIS_PASSWORD_FILE: cannot read")
    (tmp_path / "empty").write_text("\n")
    err = error_of({P + "KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "empty")})
    assert str(err).startswith(P + "KAFKA_SASL_PASSWORD_FILE: the file") and "is empty" in str(err)
    (tmp_path / "pw").write_text("x")
    err = error_of({P + "REDIS_PASSWORD_FILE": str(tmp_path / "pw"), P + "REDIS_PASSWORD": "y"})
    assert str(err) == (f"{P}REDIS_PASSWORD_FILE: set either {P}REDIS_PASSWORD or {P}REDIS_PASSWORD_FILE, "
                        "not both")
    err = error_of({P + "REDIS_PASSWORD_FILE": str(tmp_path)})  # a directory
    assert str(err).startswith(P + "REDIS_PASSWORD_FILE: cannot read")


# --------------------------------------------------------------------------- masking


def test_secrets_never_shown(tmp_path):
    (tmp_path / "pw").write_text("file-secret-123\n")
    s = load_settings({P + "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", P + "KAFKA_SASL_USERNAME": "svc",
                       P + "KAFKA_SASL_PASSWORD": "kafka-secret-456", P + "REDIS_PASSWORD_FILE": str(tmp_path / "pw"),
                       P + "REDIS_URL": "redis://admin:url-secret-789@redis:6379/0"})
    shown = [repr(s), str(s), orjson.dumps(s.safe_dict()).decode(), repr(s.kafka_sasl_password),
             str(s.redis_password)]
    for text in shown:
        for secret in ("file-secret-123", "kafka-secret-456", "url-secret-789"):
            assert secret not in text, text
    safe = s.safe_dict()
    assert safe["kafka_sasl_password"] == "**********" and safe["redis_password"] == "**********"
    assert safe["redis_url"] == "redis://admin:**********@redis:6379/0"
    assert safe["kafka_sasl_username"] == "svc" and safe["delta"] == 0.02
    assert set(Settings.model_fields) <= set(safe)
    # the clients still get them
    assert s.kafka_client_kwargs()["sasl_plain_password"] == "kafka-secret-456"
    assert s.redis_url_with_credentials() == "redis://admin:file-secret-123@redis:6379/0"


def test_redis_url_with_credentials():
    assert load_settings({}).redis_url_with_credentials() == "redis://localhost:6379/0"
    s = load_settings(env(redis_url="rediss://[::1]:6380/1", redis_username="app", redis_password="p@ss/w:rd"))
    assert s.redis_url_with_credentials() == "rediss://app:p%40ss%2Fw%3Ard@[::1]:6380/1"
    s = load_settings(env(redis_url="redis://old:pw@h/0", redis_username="new"))
    assert s.redis_url_with_credentials() == "redis://new:pw@h/0"
    s = load_settings(env(redis_url="unix:///run/redis.sock?db=1", redis_password="pw"))
    assert s.redis_url_with_credentials() == "unix:///run/redis.sock?db=1&password=pw"


# --------------------------------------------------------------------------- per-classifier overrides


def overrides(tmp_path, doc) -> dict[str, str]:
    path = tmp_path / "classifiers.json"
    path.write_bytes(doc if isinstance(doc, bytes) else orjson.dumps(doc))
    return {P + "CLASSIFIERS_CONFIG_FILE": str(path)}


def test_for_classifier(tmp_path):
    s = load_settings({**overrides(tmp_path, {
        "fraud-v3": {"threshold": 0.7, "delta": 0.01, "confidence": 0.9, "strata": 8, "stratification": "equal",
                     "allocation": "opt_track", "max_labels_per_hour": 20, "label_timeout_seconds": 600,
                     "score_kind": "probability"},
        "spam.v1": {"threshold": -2}}), P + "DELTA": "0.04", P + "RESERVOIR_SIZE": "64"})
    f = s.for_classifier("fraud-v3")
    assert isinstance(f, ClassifierConfig) and f.classifier_id == "fraud-v3"
    assert (f.threshold, f.delta, f.confidence, f.strata, f.stratification, f.allocation) == (
        0.7, 0.01, 0.9, 8, "equal", "opt_track")
    assert (f.max_labels_per_hour, f.label_timeout_seconds, f.score_kind) == (20, 600.0, "probability")
    assert (f.chunk_seconds, f.reservoir_size, f.round_labels_per_stratum, f.stop_rounds) == (3600, 64, 2, 2)
    spam = s.for_classifier("spam.v1")
    assert spam.threshold == -2.0 and spam.delta == 0.04  # the rest are the globals
    other = s.for_classifier("other")
    assert other.classifier_id == "other" and other.threshold == 0.5 and other.delta == 0.04
    assert s.for_classifier("other") is other
    assert s.defaults().classifier_id is None and s.defaults().delta == 0.04
    assert s.threshold_for("fraud-v3") == 0.7 and s.threshold_for("x") == 0.5
    assert s.overridden_classifiers == ("fraud-v3", "spam.v1")
    with pytest.raises(ValidationError):
        f.threshold = 0.1  # frozen
    # as the parser's threshold
    values = [orjson.dumps({"classifier_id": c, "item_id": "i", "score": 0.6}) for c in ("fraud-v3", "x", "spam.v1")]
    batch, _ = parse_scores(values, [0, 0, 0], s.threshold_for)
    assert batch.predicted_positive.tolist() == [False, True, True]


def test_settings_are_frozen():
    s = load_settings({})
    with pytest.raises(ValidationError):
        s.delta = 0.1


@pytest.mark.parametrize("doc, fragment", [
    ({"fraud-v3": {"delta": 2}}, "fraud-v3.delta: must be in (0, 0.5), got 2"),
    ({"fraud-v3": {"strata": 0}}, "fraud-v3.strata: must be in 1..20, got 0"),
    ({"fraud-v3": {"strata": 4.5}}, "fraud-v3.strata: must be an integer"),
    ({"fraud-v3": {"strata": True}}, "fraud-v3.strata: must be an integer"),
    ({"fraud-v3": {"threshold": "0.7"}}, "fraud-v3.threshold: must be a number, got '0.7'"),
    ({"fraud-v3": {"threshold": False}}, "fraud-v3.threshold: must be a number"),
    ({"fraud-v3": {"allocation": "neyman"}}, "fraud-v3.allocation: must be one of opt_track"),
    ({"fraud-v3": {"stratification": "x"}}, "fraud-v3.stratification: must be one of perc"),
    ({"fraud-v3": {"score_kind": "odds"}}, "fraud-v3.score_kind: must be one of auto"),
    ({"fraud-v3": {"confidence": 1}}, "fraud-v3.confidence: must be in (0.5, 1), got 1"),
    ({"fraud-v3": {"label_timeout_seconds": 0}}, "fraud-v3.label_timeout_seconds: must be a finite number > 0"),
    ({"fraud-v3": {"max_labels_per_hour": 0}}, "fraud-v3.max_labels_per_hour: must be >= 1"),
    ({"fraud-v3": {"thresold": 0.7}}, "fraud-v3: unknown setting(s) 'thresold'"),
    ({"fraud-v3": {"reservoir_size": 64}}, "fraud-v3: unknown setting(s) 'reservoir_size'"),
    ({"fraud-v3": {"classifier_id": "x"}}, "unknown setting(s) 'classifier_id'"),
    ({"fraud v3": {"delta": 0.1}}, "'fraud v3' is not a classifier id"),
    ({"": {}}, "'' is not a classifier id"),
    ({"fraud-v3": 0.7}, "fraud-v3: must be an object of settings"),
    ([{"fraud-v3": {}}], "must hold a JSON object"),
    (b"{not json", "is not valid JSON"),
])
def test_invalid_overrides_name_the_file_variable(tmp_path, doc, fragment):
    err = error_of(overrides(tmp_path, doc))
    assert str(err).startswith(P + "CLASSIFIERS_CONFIG_FILE: "), str(err)
    assert fragment in str(err)


def test_overrides_file_errors(tmp_path):
    err = error_of({P + "CLASSIFIERS_CONFIG_FILE": str(tmp_path / "nope.json")})
    assert str(err).startswith(P + "CLASSIFIERS_CONFIG_FILE: cannot read")
    err = error_of(overrides(tmp_path, {"a": {"delta": 1, "strata": 50}, "b": {"x": 1}}))
    assert len(err.errors) == 3
    s = load_settings(overrides(tmp_path, {}))
    assert s.overridden_classifiers == ()


def test_overridable_keys_match_the_model():
    assert set(OVERRIDABLE) < set(ClassifierConfig.model_fields)
    assert set(OVERRIDABLE) == {"threshold", "delta", "confidence", "strata", "stratification", "allocation",
                                "max_labels_per_hour", "label_timeout_seconds", "score_kind", "metrics",
                                "negative_strata", "calibration_min_labels", "review_group", "review_weight"}


def test_per_classifier_settings_are_derived_from_the_declarations():
    """`ClassifierConfig` has no declarations of its own: each field is the `Settings` field, check and default."""
    assert list(ClassifierConfig.model_fields) == ["classifier_id", *PER_CLASSIFIER]
    assert set(OVERRIDABLE) < set(PER_CLASSIFIER)
    for name in PER_CLASSIFIER:
        mine, declared = ClassifierConfig.model_fields[name], Settings.model_fields[name]
        assert (mine.annotation, mine.default, mine.metadata) == (declared.annotation, declared.default,
                                                                  declared.metadata), name
    assert set(PER_CLASSIFIER) >= {"chunk_seconds", "reservoir_size", "history_chunks", "allowed_lateness_seconds"}
    assert FILE_SECRETS == ("kafka_sasl_username", "kafka_sasl_password", "redis_username", "redis_password",
                            "label_studio_token")


def test_metrics_setting_is_checked_and_canonical(tmp_path):
    err = error_of({P + "METRICS": "precision,recal"})
    assert str(err).startswith(P + "METRICS: unknown metric 'recal'")
    err = error_of({P + "METRICS": " , "})
    assert P + "METRICS" in str(err)
    s = load_settings({P + "METRICS": "F1, recall,recall"})
    assert s.metrics == "recall,f1" and s.samples_negatives("any")
    assert not load_settings({}).samples_negatives("any")
    s = load_settings(overrides(tmp_path, {"fraud": {"metrics": "precision,recall", "negative_strata": 6}}))
    assert s.for_classifier("fraud").metrics == "precision,recall" and s.samples_negatives("fraud")
    neg = s.for_classifier("fraud~negatives")
    assert (neg.strata, neg.stratification, neg.metrics) == (6, "cum_sqrt_prior", "precision,recall")
    err = error_of(overrides(tmp_path, {"fraud": {"metrics": "roc"}}))
    assert "fraud.metrics" in str(err) and "unknown metric 'roc'" in str(err)


def test_an_unknown_stratameter_variable_fails_naming_it():
    """A typo would leave the default in force unnoticed; the tools' own variables are not settings."""
    msg = str(error_of({**env(), P + "DELTAA": "0.01", P + "NOT_A_THING": "1"}))
    assert "STRATAMETER_DELTAA: not a setting of stratameter" in msg and "did you mean STRATAMETER_DELTA?" in msg
    assert "STRATAMETER_NOT_A_THING: not a setting" in msg
    assert "STRATAMETER_REDIS_PASSWORD_FILE" not in msg  # a *_FILE of a secret is a setting
    tools = {P + "TANSU_BIN": "/x", P + "REDIS_SERVER": "/y", P + "TEST_KAFKA": "h:1", P + "DEMO_TEST_MARKER": "1"}
    assert load_settings({**env(), **tools}).delta == 0.02
