"""`stratameter peers`: the default design against PPI++ (Angelopoulos, Duchi & Zrnic 2023, "PPI++:
Efficient Prediction-Powered Inference") and simple random sampling at fixed label budgets
(`peers`).  PPI++ runs from ``ppi_py``, the ``[peers]`` extra; without it the command exits 2."""

from __future__ import annotations

import argparse
import json
import sys

from .budget import parse_budgets
from .populations import BUILTIN, above, builtin, load

MISSING_EXTRA = "stratameter peers needs the [peers] extra: pip install 'stratameter[peers]'"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `peers` subcommand and its options."""
    p = sub.add_parser(
        "peers",
        help="peer benchmark: the default design vs PPI++ and random sampling at fixed label budgets",
        description="Runs stratameter's default design (opt_track on K = 4 perc strata), simple random "
        "sampling and PPI++ (prediction-powered inference with power tuning, ppi_py, on a Platt fit of each "
        "run's own labels) R times each at fixed label budgets, with replacement, and reports per budget the "
        "MSE as a ratio to p(1-p)/n, bias, 95% interval coverage and width, each +- its standard error.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--builtin", default=None, choices=list(BUILTIN),
                     help="built-in synthetic population of predicted positives (default: calibrated)")
    src.add_argument("--population", metavar="FILE",
                     help="CSV or JSONL with columns score,label (label 0/1), predicted positives only "
                          "unless --threshold is given")
    p.add_argument("--threshold", type=float,
                   help="predicted positive means score >= THRESHOLD (keeps only those rows)")
    p.add_argument("--budget", default="100,200,400,800",
                   help="comma list of label budgets n, each >= 2 (default 100,200,400,800)")
    p.add_argument("--runs", type=int, default=1000,
                   help="runs per method (default 1000; PPI++ costs about 40 ms per run and budget on "
                        "200,000 items)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0); each method has its own stream")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.set_defaults(handler=main)


def _population(args):
    if args.population:
        return load(args.population, args.threshold)
    pop = builtin(args.builtin or "calibrated")
    return pop if args.threshold is None else above(pop, args.threshold)


def main(args) -> int:
    try:
        import ppi_py  # noqa: F401  (only to tell a missing extra from a failure later)
    except ImportError:
        print(MISSING_EXTRA, file=sys.stderr)
        return 2
    from . import peers

    try:
        budgets = parse_budgets(args.budget)
        if budgets[0] < 2:
            raise ValueError(f"--budget takes label counts >= 2, got {args.budget!r}")
        if args.runs < 2:
            raise ValueError("--runs must be >= 2")
        pop = _population(args)
    except ValueError as exc:
        print(f"stratameter peers: error: {exc}", file=sys.stderr)
        return 2
    rows = peers.compare(pop, budgets, args.runs, args.seed)
    if args.json:
        print(json.dumps(peers.as_json(pop, rows, args.seed)))
    else:
        peers.print_table(pop, rows, args.seed)
    return 0
