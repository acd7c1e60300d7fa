"""The Label Studio bridge without Label Studio: the pure mapping functions (one function each), its
settings, its Redis keys, and its part of the Helm chart (rendered, schema-checked, fed to the
settings loader).  The bridge against a real Label Studio: tests/e2e/test_label_studio.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

import orjson
import pytest

from stratameter.bridge import mapping
from stratameter.bridge.mapping import BadWebhook, Choices, UnknownChoice
from stratameter.bridge.startup import require_token
from stratameter.config import ConfigError, Settings, load_settings
from stratameter.schemas.outbound import decode_label_request, label_request_bytes
from stratameter.state.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "stratameter"
CHOICES = Choices.parse("Positive,Negative,Unsure")


def _request(context=None, score=0.87):
    now = time.time()
    return decode_label_request(label_request_bytes("fraud-v3/tok", "fraud-v3", "txn-1", score, 2, now, now + 60,
                                                    context))


def _annotation(*choices, cancelled=False):
    return {"id": 7, "was_cancelled": cancelled, "result": [
        {"from_name": "label", "to_name": "item", "type": "choices", "value": {"choices": list(choices)}}]}


# --------------------------------------------------------------------------- mapping


def test_task_payload_puts_the_context_in_the_data_and_the_request_in_the_meta():
    data, meta = mapping.task_payload(_request({"text": "win a prize", "tags": ["a", "b"]}))
    assert data["text"] == "win a prize" and data["tags"] == ["a", "b"]
    assert data[mapping.VIEW_FIELD] == {"item_id": "txn-1", "text": "win a prize", "tags": '["a","b"]'}
    assert "fraud-v3" in data[mapping.QUESTION_FIELD]
    assert "score" not in data and "score" not in data[mapping.VIEW_FIELD]
    assert set(meta) == {"request_id", "classifier_id", "item_id", "requested_at", "expires_at"}
    assert meta["request_id"] == "fraud-v3/tok" and meta["item_id"] == "txn-1"


def test_task_payload_without_context_shows_the_item_and_the_score_only_when_asked():
    data, _ = mapping.task_payload(_request(None))
    assert data[mapping.VIEW_FIELD] == {"item_id": "txn-1"}
    data, _ = mapping.task_payload(_request(None), show_score=True)
    assert data[mapping.VIEW_FIELD] == {"item_id": "txn-1", "score": 0.87} and data["score"] == 0.87


def test_label_config_names_each_choice_once_with_a_hotkey():
    config = mapping.label_config(Choices.parse('Spam,Not spam'))
    assert config.count("<Choice ") == 2 and 'value="Not spam" hotkey="2"' in config
    assert f"${mapping.VIEW_FIELD}" in config and f"${mapping.QUESTION_FIELD}" in config


@pytest.mark.parametrize("annotation, label", [
    (_annotation("Positive"), True), (_annotation("Negative"), False), (_annotation("Unsure"), None),
    (_annotation(cancelled=True), None), ({"id": 1, "result": []}, None),
    (_annotation("Positive", "Negative"), None),  # contradicting choices: cannot tell
])
def test_answer_label(annotation, label):
    assert mapping.answer_label(annotation, CHOICES) is label


def test_answer_label_refuses_a_choice_that_is_not_configured():
    with pytest.raises(UnknownChoice, match="STRATAMETER_LABEL_STUDIO_CHOICES"):
        mapping.answer_label(_annotation("Maybe"), CHOICES)
    assert mapping.answer_label(_annotation("Positive"), Choices.parse("Positive,Negative")) is True
    with pytest.raises(UnknownChoice):  # without an unsure choice, "Unsure" is unknown
        mapping.answer_label(_annotation("Unsure"), Choices.parse("Positive,Negative"))


def test_first_annotation_is_the_lowest_id():
    task = {"annotations": [{"id": 9}, {"id": 3}, "junk", {"id": "x"}]}
    assert mapping.first_annotation(task) == {"id": 3}
    assert mapping.first_annotation({"annotations": []}) is None


@pytest.mark.parametrize("meta, ok", [
    ({"request_id": "c/x", "classifier_id": "c"}, True), ({"request_id": "c/x"}, False),
    ({"request_id": "", "classifier_id": "c"}, False), ({"request_id": "c/x", "classifier_id": "bad id"}, False),
    (None, False), ("text", False),
])
def test_task_request_only_from_the_bridges_meta(meta, ok):
    assert (mapping.TaskRequest.of({"meta": meta}) is not None) is ok


@pytest.mark.parametrize("body, reason", [
    (b"{", "invalid_json"), (b'"x"', "not_object"), (b"{}", "no_action"), (b'{"action": 3}', "no_action"),
    (b'{"action": "ANNOTATION_CREATED"}', "bad_annotation"),
    (b'{"action": "ANNOTATION_CREATED", "annotation": {"task": "7"}}', "bad_annotation"),
    (b'{"action": "ANNOTATIONS_CREATED", "annotation": [{"task": 1}, {"id": 2}]}', "bad_annotation"),
])
def test_webhook_events_refuses_what_is_not_a_webhook(body, reason):
    with pytest.raises(BadWebhook) as exc:
        mapping.webhook_events(body)
    assert exc.value.reason == reason and reason in mapping.WEBHOOK_ERRORS


def test_webhook_events_names_the_tasks():
    assert mapping.webhook_events(b'{"action": "ANNOTATION_CREATED", "annotation": {"id": 1, "task": 5}}') \
        == ("ANNOTATION_CREATED", [5])
    assert mapping.webhook_events(orjson.dumps({"action": "ANNOTATION_UPDATED", "annotation": {"id": 1},
                                                "task": {"id": 6}})) == ("ANNOTATION_UPDATED", [6])
    assert mapping.webhook_events(b'{"action": "ANNOTATIONS_CREATED", "annotation": [{"task": 1}, {"task": {"id": 1}},'
                                  b' {"task": 2}]}') == ("ANNOTATIONS_CREATED", [1, 2])
    assert mapping.webhook_events(b'{"action": "PROJECT_UPDATED", "project": {}}') == ("PROJECT_UPDATED", [])


# --------------------------------------------------------------------------- settings and keys


def test_bridge_settings_are_checked_and_named():
    s = load_settings({"STRATAMETER_LABEL_STUDIO_TOKEN": "t0k3n-value", "STRATAMETER_LABEL_STUDIO_CHOICES": " Spam , Ham "})
    assert s.label_studio_choices == "Spam,Ham" and "t0k3n-value" in s.secret_values()
    assert "t0k3n-value" not in repr(s) and "t0k3n-value" not in str(s.safe_dict())
    for env, var in (({"STRATAMETER_LABEL_STUDIO_URL": "ftp://x"}, "STRATAMETER_LABEL_STUDIO_URL"),
                     ({"STRATAMETER_LABEL_STUDIO_CHOICES": "Yes"}, "STRATAMETER_LABEL_STUDIO_CHOICES"),
                     ({"STRATAMETER_LABEL_STUDIO_CHOICES": "A,A"}, "STRATAMETER_LABEL_STUDIO_CHOICES"),
                     ({"STRATAMETER_LABEL_STUDIO_PROJECT": "x" * 51}, "STRATAMETER_LABEL_STUDIO_PROJECT"),
                     ({"STRATAMETER_LABEL_STUDIO_WEBHOOK_URL": "nowhere"}, "STRATAMETER_LABEL_STUDIO_WEBHOOK_URL"),
                     ({"STRATAMETER_LABEL_STUDIO_POLL_SECONDS": "0"}, "STRATAMETER_LABEL_STUDIO_POLL_SECONDS"),
                     ({"STRATAMETER_BRIDGE_HTTP_PORT": "70000"}, "STRATAMETER_BRIDGE_HTTP_PORT"),
                     ({"STRATAMETER_LABEL_STUDIO_TOKN": "x"}, "did you mean STRATAMETER_LABEL_STUDIO_TOKEN")):
        with pytest.raises(ConfigError, match=var):
            load_settings(env)
    with pytest.raises(ConfigError, match="STRATAMETER_LABEL_STUDIO_TOKEN: required"):
        require_token(load_settings({}))
    # the service accepts the bridge's variables (one environment for both), and the tool variable
    load_settings({"STRATAMETER_LABEL_STUDIO_URL": "https://ls.example.com", "STRATAMETER_BRIDGE_HTTP_PORT": "1",
                   "STRATAMETER_LABEL_STUDIO_BIN": "/nowhere"})


def test_bridge_keys_are_bounded_and_in_the_classifiers_slot():
    keys = Keys("sm")
    assert keys.label_studio_request("fraud-v3", 4, "fraud-v3/tok") == "sm:{fraud-v3}:ls:4:fraud-v3/tok"
    assert keys.label_studio(4, "open") == "sm:{_global}:ls:4:open"
    with pytest.raises(ValueError):
        keys.label_studio(4, "anything")


# --------------------------------------------------------------------------- Helm chart


def _render(values: dict) -> list[dict]:
    helm = pytest.importorskip("helm_python", reason="PyPI helm-python-sdk not installed")
    yaml = pytest.importorskip("yaml")
    out = helm.Chart.load(CHART).render(values, name="sm", namespace="ml")
    return [d for path, text in sorted(out.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def _full(**bridge) -> dict:
    yaml = pytest.importorskip("yaml")
    values = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())
    values["bridge"] = {"enabled": True, "labelStudio": {"tokenSecret": {"name": "ls-token"}}, **bridge}
    return values


def test_chart_bridge_is_off_by_default_and_needs_its_token_secret():
    assert not [d for d in _render({}) if "bridge" in d["metadata"]["name"]]
    helm = pytest.importorskip("helm_python")
    with pytest.raises(helm.HelmError, match="tokenSecret"):
        helm.Chart.load(CHART).render({"bridge": {"enabled": True}}, name="sm", namespace="ml")


def test_chart_refuses_a_poll_lag_alert_at_or_below_the_poll_interval():
    """The lag reaches the poll interval between two polls: such an alert would always fire."""
    helm = pytest.importorskip("helm_python")
    values = _full(labelStudio={"tokenSecret": {"name": "ls-token"}, "pollSeconds": 30})
    values["prometheusRule"]["bridge"] = {"pollLag": {"maxSeconds": 30}}
    with pytest.raises(helm.HelmError, match=r"pollLag.maxSeconds \(30\) must exceed bridge.labelStudio.pollSeconds"):
        helm.Chart.load(CHART).render(values, name="sm", namespace="ml")
    values["prometheusRule"]["bridge"]["pollLag"]["maxSeconds"] = 31
    assert [d for d in _render(values) if d["kind"] == "PrometheusRule"]


def test_chart_bridge_renders_valid_objects_apart_from_the_service(tmp_path):
    kv = pytest.importorskip("kubernetes_validate", reason="PyPI kubernetes-validate not installed")
    helm = pytest.importorskip("helm_python")
    report = helm.lint(CHART, _full(), strict=True)
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report
    docs = _render(_full())
    bridge = [d for d in docs if d["metadata"]["name"] == "sm-stratameter-bridge"]
    assert sorted(d["kind"] for d in bridge) == ["Deployment", "Service", "ServiceMonitor"]
    for doc in bridge:
        if doc["kind"] != "ServiceMonitor":
            kv.validate(doc, kv.latest_version(), strict=True)
    dep = next(d for d in bridge if d["kind"] == "Deployment")
    svc = next(d for d in bridge if d["kind"] == "Service")
    service_pods = next(d for d in docs if d["kind"] == "Deployment" and d is not dep)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    for doc in docs:  # nothing of the service selects the bridge's pods, and the reverse
        selector = doc.get("spec", {}).get("selector")
        selector = selector.get("matchLabels", selector) if isinstance(selector, dict) else None
        if doc not in bridge and selector:
            assert not selector.items() <= pod_labels.items(), doc["metadata"]["name"]
    assert not svc["spec"]["selector"].items() <= service_pods["spec"]["template"]["metadata"]["labels"].items()

    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["bridge", "label-studio"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["securityContext"]["readOnlyRootFilesystem"]
    env = dict(next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sm-stratameter")["data"])
    env.update({e["name"]: e["value"] for e in c["env"] if "value" in e})
    assert env["STRATAMETER_LABEL_STUDIO_WEBHOOK_URL"] == "http://sm-stratameter-bridge.ml.svc:9109/webhook"
    for var in ("STRATAMETER_LABEL_STUDIO_TOKEN_FILE", "STRATAMETER_KAFKA_SASL_PASSWORD_FILE",
                "STRATAMETER_REDIS_PASSWORD_FILE", "STRATAMETER_KAFKA_SSL_CAFILE", "STRATAMETER_KAFKA_SSL_CERTFILE",
                "STRATAMETER_KAFKA_SSL_KEYFILE", "STRATAMETER_CLASSIFIERS_CONFIG_FILE"):
        if var in env:  # the container's paths, as files under tmp_path
            local = tmp_path / env[var].lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text("{}" if var.endswith("CONFIG_FILE") else "s3cret\n")
            env[var] = str(local)
    settings = load_settings(env)
    require_token(settings)
    assert settings.label_studio_token.get_secret_value() == "s3cret"
    assert settings.bridge_http_port == c["ports"][0]["containerPort"] == 9109
    assert settings.bridge_consumer_group != settings.kafka_consumer_group
    assert settings.topic_label_requests == "ml.label-requests"  # from the service's ConfigMap


def test_chart_bridge_defaults_are_the_declared_ones():
    yaml = pytest.importorskip("yaml")
    values = yaml.safe_load((CHART / "values.yaml").read_text())["bridge"]
    declared = Settings.model_fields
    ls = values["labelStudio"]
    pairs = {"label_studio_url": None, "label_studio_project": ls["project"], "label_studio_choices": ls["choices"],
             "label_studio_show_score": ls["showScore"], "label_studio_poll_seconds": ls["pollSeconds"],
             "bridge_consumer_group": values["consumerGroup"], "bridge_http_port": values["httpPort"]}
    for name, chart in pairs.items():
        if chart is not None:
            assert chart == declared[name].default, name
    assert values["enabled"] is False
    template = (CHART / "templates" / "bridge.yaml").read_text()
    rendered = set(re.findall(r"STRATAMETER_(LABEL_STUDIO_[A-Z_]+|BRIDGE_[A-Z_]+)", template))
    assert {f.upper() for f in declared if f.startswith(("label_studio_", "bridge_"))} <= rendered | {"LABEL_STUDIO_TOKEN"}
