"""The label-efficiency study for recall, F1 and accuracy (`stratameter simulate --metric`).

Same protocol and columns as `study` (labels at stop, InConf, coverage,
%Change vs random), on a whole-stream population: each design stratifies the
predicted positives and the predicted negatives, allocates with the linearised
variable of the metric (`stats.confusion`) and stops when the metric's
half-width is <= delta in T consecutive rounds.  ``random`` is simple random
sampling of the whole stream (post-stratified on the known side sizes).
%Oracle compares with the closed-form Neyman bound on the linearised variable
at the design's own strata, ``z^2 (sum_k |dM/dp_k| sigma_k)^2 / delta^2``
(the Jeffreys floor of `stats.oracle` is for a stratified mean and is not
reported here); the same bound on strata of 500 items (`whole.fine_strata`)
is the population's floor (``floor_labels`` in the JSON, under the table).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from ..stats import confusion
from ..stats.allocation import ALLOCATIONS, DEFAULT_ALLOCATION
from ..stats.estimator import z_value
from ..stats.strata import STRATIFICATIONS
from . import budget
from .engine import Protocol
from .parallel import map_in_processes
from .study import DesignSummary, _json_number, _pct_over
from .whole import (FLOOR_STRATUM_ITEMS, WholeDesign, WholeTruth, fine_strata, max_labels, prepare_whole,
                    run_whole_budget, run_whole_until_stop)
from .whole_populations import WholeStream

#: The default stratification of the predicted negatives (docs/concepts/statistics.md "Recall, F1 and accuracy").
DEFAULT_NEGATIVE_STRATIFICATION = WholeDesign().negative_stratification


@dataclass
class WholeStudyRequest:
    population: WholeStream
    metric: str
    designs: list[WholeDesign]
    protocol: Protocol
    runs: int
    seed: int
    budgets: list[int] | None = None  # fixed label counts (`--budget`); None: the stopping mode


def whole_designs(methods, stratifications, negative_stratifications, strata: int, negative_strata: int,
                  margin: bool = False) -> list[WholeDesign]:
    """Random first, then every method x positive x negative stratification; with `margin`
    also every method x stratification on |score - threshold| (`WholeDesign.margin`)."""
    for m in methods or []:
        if m not in ALLOCATIONS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(ALLOCATIONS)}")
    for s in (stratifications or []) + (negative_stratifications or []):
        if s not in STRATIFICATIONS:
            raise ValueError(f"unknown stratification {s!r}; choose from {', '.join(STRATIFICATIONS)}")
    out = [WholeDesign("random", strata=1, negative_strata=1)]
    for m in methods or [DEFAULT_ALLOCATION]:
        if m == "random":
            continue
        for s in stratifications or [WholeDesign().stratification]:
            for ns in negative_stratifications or [DEFAULT_NEGATIVE_STRATIFICATION]:
                out.append(WholeDesign(m, s, strata, ns, negative_strata))
            if margin:
                out.append(WholeDesign(m, s, strata, margin=True))
    return out


def oracle_labels(st: WholeTruth, metric: str, delta: float, confidence: float) -> float:
    """Neyman bound on the linearised variable at the true stratum proportions."""
    g = confusion.gradient(metric, st.N, st.P, st.positive)
    spread = float(np.sum(np.abs(g) * np.sqrt(st.P * (1.0 - st.P))))
    z = z_value(confidence)
    return z * z * spread * spread / (delta * delta)


def floor_labels(req: WholeStudyRequest) -> float:
    """The Neyman bound of `req.metric` on the population's 500-item strata (`whole.fine_strata`)."""
    return oracle_labels(fine_strata(req.population), req.metric, req.protocol.delta, req.protocol.confidence)


def _one_design(args) -> tuple[int, dict]:
    index, req, design = args
    st = prepare_whole(req.population, design, [req.metric])
    truth = req.population.truth(req.metric)
    if req.budgets is not None:
        b = run_whole_budget(st, design, [req.metric], req.budgets, req.runs,
                             np.random.SeedSequence([req.seed, index]), req.protocol.confidence)
        est, lo, hi = b.estimate[req.metric], b.lower[req.metric], b.upper[req.metric]
        return index, {"budgets": [budget.figures(est[i], lo[i], hi[i], truth,
                                                  req.population.srs_variance(req.metric, n))
                                   for i, n in enumerate(req.budgets)]}
    r = run_whole_until_stop(st, design, [req.metric], req.protocol, req.runs,
                             np.random.SeedSequence([req.seed, index]), max_labels(req.population, req.protocol))
    est, lo, hi = r.estimate[req.metric], r.lower[req.metric], r.upper[req.metric]
    return index, {
        "labels": r.labels,
        "in_conf": float(np.mean(np.abs(est - truth) <= req.protocol.delta)),
        "coverage": float(np.mean((lo <= truth) & (truth <= hi))),
        "stopped": float(np.mean(r.stopped)),
        "oracle": oracle_labels(st, req.metric, req.protocol.delta, req.protocol.confidence),
        "strata": [int(st.positive.sum()), int((~st.positive).sum())],
    }


def run_whole_study(req: WholeStudyRequest, progress: Callable[[int, int], None] | None = None,
                    workers: int | None = None) -> list[dict]:
    """Run every design (in parallel processes); results in the order of `req.designs`."""
    tasks = [(i, req, d) for i, d in enumerate(req.designs)]
    return [r for _, r in map_in_processes(_one_design, tasks, progress, workers)]


def summarise_whole(req: WholeStudyRequest, results: list[dict]) -> list[DesignSummary]:
    """One row per design with %Change vs random (row 0) and %Oracle."""
    rows = []
    for d, r in zip(req.designs, results):
        labels = r["labels"]
        strat = "none" if d.method == "random" else d.label.partition("/")[2]
        rows.append(DesignSummary(
            method=d.method, stratification=strat, labels_mean=float(labels.mean()),
            labels_se=float(labels.std(ddof=1) / math.sqrt(labels.size)) if labels.size > 1 else 0.0,
            in_conf=r["in_conf"], ci_coverage=r["coverage"], stopped=r["stopped"],
            oracle_labels=r["oracle"], jeffreys_oracle_labels=math.nan,
        ))
    base = rows[0].labels_mean
    for row in rows:
        row.change_vs_random = 100.0 * (row.labels_mean / base - 1.0)
        row.pct_oracle = _pct_over(row.labels_mean, row.oracle_labels)
    return rows


def whole_json(req: WholeStudyRequest, rows: list[DesignSummary]) -> dict:
    """The `--json` document: today's keys plus ``metric``, ``threshold``, ``prevalence``."""
    pop = req.population
    default = req.designs[1] if len(req.designs) > 1 else WholeDesign()
    return {
        "population": pop.name,
        "size": pop.size,
        "metric": req.metric,
        "threshold": pop.threshold,
        "prevalence": pop.prevalence,
        "default": {"method": default.method, "stratification": default.stratification,
                    "negative_stratification": default.negative_stratification},
        "truth": pop.truth(req.metric),
        "delta": req.protocol.delta,
        "alpha": round(1.0 - req.protocol.confidence, 10),
        "runs": req.runs,
        "strata": default.strata,
        "negative_strata": default.negative_strata,
        "budget": req.budgets,
        "floor_labels": floor_labels(req),
        "floor_stratum_items": FLOOR_STRATUM_ITEMS,
        "methods": [{k: _json_number(v) for k, v in asdict(r).items()} for r in rows],
    }
