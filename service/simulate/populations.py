"""Populations of predicted positives with ground truth, for the label-efficiency study.

Built-in synthetic populations are deterministic (fixed seed) and chosen to be
as varied as real classifiers: probabilities and raw margins/logits, steep and
flat score-precision curves, calibrated, over- and under-confident, and one
whose score carries no signal.  Their precision spans 0.6 to 0.97.

A user population is a CSV or JSONL file with columns ``score,label``
(label 0/1); ``threshold`` keeps only rows with ``score >= threshold``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.special import expit

from ..stats.sketch import require_finite

POPULATION_SIZE = 200_000


@dataclass(frozen=True)
class Population:
    name: str
    scores: np.ndarray
    labels: np.ndarray  # int8, 1 = truly positive
    description: str = ""
    informative: bool = True

    @property
    def truth(self) -> float:
        return float(self.labels.mean())

    @property
    def size(self) -> int:
        return int(self.labels.size)


def _calibrated(rng: np.random.Generator, n: int):
    s = 0.5 + 0.5 * rng.beta(4.0, 1.0, n)
    return s, expit(np.log(s / (1 - s)))  # P(y|s) = s


def _steep(rng, n):
    s = rng.uniform(0.5, 1.0, n)
    return s, expit(25.0 * (s - 0.58))


def _flat(rng, n):
    s = 0.5 + 0.5 * rng.beta(1.5, 1.5, n)
    return s, 0.55 + 0.3 * (s - 0.5)


def _svm_margin(rng, n):
    m = rng.gamma(2.0, 0.8, n)
    return m, expit(2.5 * m - 0.6)


def _overconfident(rng, n):
    s = 1.0 - 0.5 * rng.beta(0.6, 6.0, n)  # most scores above 0.95
    return s, 0.35 + 0.45 * (s - 0.5) / 0.5


def _uninformative(rng, n):
    s = rng.uniform(0.5, 1.0, n)
    return s, np.full(n, 0.6)


def _near_perfect(rng, n):
    s = 1.0 - 0.5 * rng.beta(1.0, 16.0, n)
    return s, expit(40.0 * (s - 0.86))


def _underconfident_logit(rng, n):
    z = rng.exponential(1.2, n)
    return z, expit(2.2 * z + 0.8)


BUILTIN: dict[str, tuple[Callable, str, bool]] = {
    "calibrated": (_calibrated, "probabilities, calibrated, P(y|s) = s", True),
    "steep": (_steep, "probabilities, steep logistic score-precision curve", True),
    "flat": (_flat, "probabilities, weak (flat) score-precision slope", True),
    "svm-margin": (_svm_margin, "raw SVM margins >= 0, logistic in the margin", True),
    "overconfident": (_overconfident, "probabilities near 1, true precision far lower (miscalibrated)", True),
    "uninformative": (_uninformative, "scores carry no signal: P(y|s) = 0.6", False),
    "near-perfect": (_near_perfect, "probabilities, precision near 1", True),
    "logit-underconfident": (_underconfident_logit, "logits >= 0, the classifier is better than it says", True),
}


def builtin(name: str, size: int = POPULATION_SIZE, seed: int = 20100726) -> Population:
    """A deterministic built-in population (names in `BUILTIN`)."""
    if name not in BUILTIN:
        raise ValueError(f"unknown population {name!r}; built-in: {', '.join(BUILTIN)}")
    make, description, informative = BUILTIN[name]
    rng = np.random.default_rng([seed, list(BUILTIN).index(name)])
    scores, p_true = make(rng, size)
    labels = (rng.random(size) < p_true).astype(np.int8)
    return Population(name, np.asarray(scores, float), labels, description, informative)


def above(pop: Population, threshold: float) -> Population:
    """The items of `pop` scored at or above `threshold` (its predicted positives at that threshold);
    a ValueError naming ``--threshold`` when fewer than 2 remain."""
    keep = pop.scores >= threshold
    kept = Population(pop.name, pop.scores[keep], pop.labels[keep], pop.description, pop.informative)
    if kept.size < 2:
        raise ValueError(f"--threshold {threshold} leaves {kept.size} predicted positives; need at least 2")
    return kept


def load(path: str | Path, threshold: float | None = None) -> Population:
    """Read ``score,label`` rows from CSV or JSONL (by extension; ``.json`` too).

    Raises ValueError naming the line and field of the first bad row.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"population file {str(path)!r} does not exist")
    rows = _read_jsonl(path) if path.suffix.lower() in (".jsonl", ".json", ".ndjson") else _read_csv(path)
    scores, labels = [], []
    for line, row in rows:
        scores.append(_field_score(row, line))
        labels.append(_field_label(row, line))
    scores_arr = require_finite(np.asarray(scores, dtype=float), "score")
    labels_arr = np.asarray(labels, dtype=np.int8)
    if threshold is not None:
        keep = scores_arr >= threshold
        scores_arr, labels_arr = scores_arr[keep], labels_arr[keep]
    if labels_arr.size < 2:
        raise ValueError(f"{path}: need at least 2 predicted positives, found {labels_arr.size}")
    return Population(path.stem, scores_arr, labels_arr, f"from {path.name}", True)


def _read_csv(path: Path):
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or not {"score", "label"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: CSV header must contain 'score' and 'label', got {reader.fieldnames}")
        for i, row in enumerate(reader, start=2):
            yield i, row


def _read_jsonl(path: Path):
    with path.open() as fh:
        for i, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: each line must be a JSON object")
            yield i, row


def _field_score(row: dict, line: int) -> float:
    value = row.get("score")
    if isinstance(value, bool) or value is None or value == "":
        raise ValueError(f"line {line}: field 'score' is missing or not a number: {value!r}")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"line {line}: field 'score' is not a number: {value!r}") from None
    if not np.isfinite(score):
        raise ValueError(f"line {line}: field 'score' must be finite, got {value!r}")
    return score


def _field_label(row: dict, line: int) -> int:
    value = row.get("label")
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip() in ("0", "1", "true", "false"):
        return int(value.strip() in ("1", "true"))
    raise ValueError(f"line {line}: field 'label' must be 0 or 1, got {value!r}")
