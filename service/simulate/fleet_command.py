"""`stratameter simulate --fleet FILE`: the fleet's hours under the shared budget (allocated for the
whole fleet, and asked for classifier by classifier as the service does), an equal split and a split by
volume (`fleet`), as a table or one JSON document."""

from __future__ import annotations

import json
import sys

import numpy as np

from . import fleet
from .fleet_chunks import chunk_truth, need_alone
from .fleet_spec import FleetFileError, FleetSpec, load_fleet


def study(spec: FleetSpec, runs: int, seed: int, confidence: float) -> dict:
    """Every strategy on the same chunks' truths, `runs` runs an hour, `spec.hours` hours."""
    truths = [chunk_truth(m) for m in spec.members]
    need = [need_alone(m, t, runs, [seed, 1, i], confidence) for i, (m, t) in enumerate(zip(spec.members, truths))]
    budget = spec.budget_per_hour or int(round(spec.budget_share_of_need * sum(need)))
    doc = {"budget_per_hour": budget, "need_alone": round(sum(need), 1), "runs": runs, "seed": seed,
           "confidence": confidence, "hours": spec.hours,
           "classifiers": [{"name": m.name, "population": m.population, "items_per_hour": m.items_per_hour,
                            "delta": m.delta, "weight": m.weight, "metrics": m.metrics, "truth": round(t.truth, 4),
                            "need_alone": round(x, 1)} for m, t, x in zip(spec.members, truths, need)],
           "strategies": {}}
    for k, strategy in enumerate(fleet.STRATEGIES):
        rng = np.random.default_rng([seed, 2, k])
        hours = [fleet.run_hour(spec, truths, budget, strategy, runs, rng, confidence) for _ in range(spec.hours)]
        doc["strategies"][strategy] = _summary(spec, hours)
    worst = {s: doc["strategies"][s]["worst_ratio"] for s in fleet.STRATEGIES}
    doc["shared_vs_equal"] = round(worst["shared"] / worst["equal"], 4)
    doc["shared_vs_volume"] = round(worst["shared"] / worst["volume"], 4)
    doc["asks_vs_shared"] = round(worst["asks"] / worst["shared"], 4)
    return doc


def _summary(spec: FleetSpec, hours: list[fleet.HourResult]) -> dict:
    """Per classifier pooled over the hours, and per hour the worst weighted ratio (mean over runs)."""
    ratios = [r.ratio for r in hours]
    worst_by_hour = [float(np.mean(np.max(x, axis=1))) for x in ratios]
    labels = np.concatenate([r.labels for r in hours])
    ratio = np.concatenate(ratios)
    converged = np.concatenate([r.converged for r in hours])
    covered = np.concatenate([r.covered() for r in hours])
    rows = [{"name": m.name, "labels": round(float(labels[:, c].mean()), 1),
             "ratio": round(float(ratio[:, c].mean()), 4), "converged": round(float(converged[:, c].mean()), 4),
             "waiting_for_budget": round(float(1.0 - converged[:, c].mean()), 4),
             "coverage": round(float(covered[:, c].mean()), 4)} for c, m in enumerate(spec.members)]
    return {"worst_ratio": round(float(np.mean(worst_by_hour)), 4),
            "worst_ratio_by_hour": [round(x, 4) for x in worst_by_hour],
            "labels": round(float(labels.sum(axis=1).mean()), 1), "classifiers": rows}


def main(args) -> int:
    """The study of `args.fleet` (2 with a message naming the field on a bad file)."""
    try:
        spec = load_fleet(args.fleet)
    except FleetFileError as exc:
        print(f"stratameter simulate: error: {exc}", file=sys.stderr)
        return 2
    confidence = args.confidence if args.confidence is not None else 1.0 - (args.alpha or 0.05)
    doc = study(spec, args.runs, args.seed, confidence)
    if args.json:
        print(json.dumps(doc))
        return 0
    _print(doc)
    return 0


def _print(doc: dict) -> None:
    print(f"fleet of {len(doc['classifiers'])}: {doc['budget_per_hour']} labels an hour shared "
          f"(they need {doc['need_alone']:.0f} together to reach their deltas alone), {doc['runs']} runs, "
          f"{doc['hours']} hour(s)")
    print(f"{'classifier':16} {'population':22} {'items/h':>8} {'delta':>6} {'weight':>6} {'need':>7}   "
          + "   ".join(f"{s:>28}" for s in fleet.STRATEGIES))
    print(f"{'':16} {'':22} {'':>8} {'':>6} {'':>6} {'':>7}   "
          + "   ".join(f"{'labels  hw/delta  conv  cover':>28}" for _ in fleet.STRATEGIES))
    for i, c in enumerate(doc["classifiers"]):
        cells = []
        for s in fleet.STRATEGIES:
            r = doc["strategies"][s]["classifiers"][i]
            cells.append(f"{r['labels']:>6.0f} {r['ratio']:>9.3f} {r['converged']:>5.2f} {r['coverage']:>6.3f}")
        print(f"{c['name']:16} {c['population']:22} {c['items_per_hour']:>8} {c['delta']:>6} {c['weight']:>6} "
              f"{c['need_alone']:>7.0f}   " + "   ".join(f"{x:>28}" for x in cells))
    worst = "   ".join(f"{s} {doc['strategies'][s]['worst_ratio']:.3f}" for s in fleet.STRATEGIES)
    print(f"worst weighted hw/delta at the end of the hour (mean over runs): {worst}; shared / equal "
          f"{doc['shared_vs_equal']:.3f}, shared / volume {doc['shared_vs_volume']:.3f}, asks / shared "
          f"{doc['asks_vs_shared']:.3f}")
