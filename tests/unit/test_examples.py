"""The tutorial's files under examples/ (docs/getting-started/your-own-producer.md): the trial block the
page shows is examples/trial.env as it is, each of its settings is explained and valid, and the
example scripts read the files they say they read.  `tests/system/test_trial.py` runs them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stratameter.config import load_settings
from stratameter.config.settings import Settings
from tests.harness import TRIAL_ENV, trial_settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started" / "your-own-producer.md"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_shows_the_trial_block_as_it_is():
    blocks = re.findall(r"<!-- trial: examples/trial.env -->\n```sh\n(.*?)```", PAGE.read_text(), re.S)
    assert blocks == [TRIAL_ENV.read_text()], "copy examples/trial.env into the page's trial block"


def test_every_trial_setting_is_explained_valid_and_not_the_default():
    lines = TRIAL_ENV.read_text().splitlines()
    settings = trial_settings()
    assert settings
    for i, line in enumerate(lines):
        if line.startswith("STRATAMETER_"):
            assert lines[i - 1].startswith(("#", "STRATAMETER_")), f"no comment explains {line}"
    loaded = load_settings({f"STRATAMETER_{k}": v for k, v in settings.items()})
    for name in settings:
        field = name.lower()
        assert getattr(loaded, field) != Settings.model_fields[field].default, f"{name} is the default"


def test_the_producer_reads_csv_and_jsonl(tmp_path):
    producer = _example("producer")
    (tmp_path / "s.csv").write_text("item_id,score,label\na,0.9,1\nb,0.2,false\nc,0.7,\n")
    (tmp_path / "s.jsonl").write_text('{"item_id": 7, "score": 0.9, "label": true}\n\n{"item_id": "d", "score": 1}\n')
    assert list(producer.from_file(str(tmp_path / "s.csv"))) == [("a", 0.9, True), ("b", 0.2, False), ("c", 0.7, None)]
    assert list(producer.from_file(str(tmp_path / "s.jsonl"))) == [("7", 0.9, True), ("d", 1.0, None)]
    rows = list(producer.synthetic(2000, seed=3))
    assert rows == list(producer.synthetic(2000, seed=3)) and len({r[0] for r in rows}) == 2000
    positives = [label for _, score, label in rows if score >= 0.5]
    assert 0.62 < sum(positives) / len(positives) < 0.76  # calibrated Beta(2, 2) scores: 0.6875


def test_the_reviewer_answers_from_its_truth(tmp_path):
    reviewer = _example("reviewer")
    (tmp_path / "gold.csv").write_text("item_id,label\na,1\nb,False\nc,\n")
    truth = reviewer.read_truth(str(tmp_path / "gold.csv"))
    assert truth == {"a": True, "b": False}
    never = _NeverSkip()
    assert reviewer.decide({"item_id": "b", "context": {"truth": True}}, truth, 0.0, never) is False
    assert reviewer.decide({"item_id": "c"}, truth, 0.0, never) is None
    assert reviewer.decide({"item_id": "c", "context": {"truth": True}}, None, 0.0, never) is True
    assert reviewer.decide({"item_id": "c", "context": None}, None, 0.0, never) is None
    assert reviewer.decide({"item_id": "a"}, truth, 1.0, never) is None


class _NeverSkip:
    def random(self) -> float:
        return 0.5


@pytest.mark.parametrize("name", ["producer", "reviewer"])
def test_the_scripts_explain_their_options(name):
    run = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "--bootstrap" in run.stdout, run.stderr


def test_the_page_quotes_the_scripts_as_they_are():
    """Each ```python block after ``<!-- excerpt: examples/<script> -->`` is the script's lines, abridged:
    every line of it is one of the script's (indentation aside), in the script's order."""
    excerpts = re.findall(r"<!-- excerpt: (examples/\S+) -->\n```python\n(.*?)```", PAGE.read_text(), re.S)
    assert sorted(path for path, _ in excerpts) == ["examples/producer.py", "examples/reviewer.py"]
    for path, body in excerpts:
        script = [line.strip() for line in (ROOT / path).read_text().splitlines()]
        at = 0
        for line in filter(None, (line.strip() for line in body.splitlines())):
            assert line in script[at:], f"{path} has no line {line!r} (after line {at})"
            at = script.index(line, at) + 1
