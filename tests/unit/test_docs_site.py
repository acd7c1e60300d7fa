"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict`` without a warning
(a broken link or anchor, a page left out of the nav, a missing snippet), its example messages are
valid messages of the wire contract, and its reference pages name every metric the service and the
bridge export and every subcommand of ``stratameter``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stratameter.cli import build_parser
from stratameter.metrics import exposition
from stratameter.schemas.messages import MESSAGES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_site_builds_strict_without_warnings(tmp_path):
    pytest.importorskip("mkdocs", reason="the [docs] extra (make venv installs it)")
    pytest.importorskip("material", reason="the [docs] extra (make venv installs it)")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    warnings = [line for line in run.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert run.returncode == 0 and not warnings, run.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()


def test_every_example_message_is_valid():
    """Each ```json block after ``<!-- message: <topic> -->`` validates as that topic's model."""
    text = (DOCS / "getting-started" / "your-own-producer.md").read_text()
    examples = re.findall(r"<!-- message: (\S+) -->\n```json\n(.*?)\n```", text, re.S)
    assert sorted(topic for topic, _ in examples) == sorted(MESSAGES)
    for topic, body in examples:
        MESSAGES[topic].model_validate(json.loads(body))


def _exported_metric_names() -> set[str]:
    """Every metric name the service's and the bridge's exposition code spells out (counters without
    ``_total``), with the per-metric and window families expanded: ``{metric}`` stands for any of
    precision, recall, F1, accuracy, as the metrics page writes it."""
    names: set[str] = set()
    for module in ("service/metrics/exposition.py", "service/bridge/metrics.py"):
        code = (ROOT / module).read_text()
        names |= set(re.findall(r"""["'](stratameter_[a-z_]+)["']""", code))
    names |= {name for _, _, name, _ in exposition._METRIC_GAUGES}
    names |= {f"stratameter_{{metric}}_window{suffix}_ratio" for _, suffix, _ in exposition._WINDOW_FIELDS}
    assert len(names) > 40
    return names


def test_the_metrics_page_names_every_metric():
    page = (DOCS / "reference" / "metrics.md").read_text()
    missing = sorted(n for n in _exported_metric_names() if n not in page)
    assert not missing, f"docs/reference/metrics.md does not name {missing}"


def test_the_cli_page_names_every_subcommand():
    page = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    missing = sorted(name for name in sub.choices if f"## `stratameter {name}" not in page)
    assert not missing, f"docs/reference/cli.md has no section for {missing}"
