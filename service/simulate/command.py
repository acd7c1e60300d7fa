"""`stratameter simulate`: argument handling, progress, table, JSON and plot."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..stats.allocation import ALLOCATIONS
from ..stats.strata import STRATIFICATIONS
from .engine import Protocol
from .populations import BUILTIN, builtin, load
from .study import StudyRequest, as_json, designs_for, run_study, summarise, summarise_budget


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="label-efficiency study: labels needed per sampling method on a population",
        description="Runs Bennett & Carvalho's protocol R times per method and reports labels "
        "used at stop, InConf, %%Change vs random and %%Oracle (or, with --budget, the MSE ratio "
        "vs random at a fixed label count).",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--builtin", default="calibrated", choices=list(BUILTIN),
                     help="built-in synthetic population (default: calibrated)")
    src.add_argument("--population", metavar="FILE",
                     help="CSV or JSONL with columns score,label (label 0/1), predicted positives only "
                          "unless --threshold is given")
    p.add_argument("--threshold", type=float, help="keep rows with score >= THRESHOLD")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--delta", type=float, default=0.01, help="target half-width (default 0.01)")
    p.add_argument("--alpha", type=float, default=0.05, help="1 - confidence (default 0.05)")
    p.add_argument("--strata", type=int, default=4)
    p.add_argument("--methods", help=f"comma list of {','.join(ALLOCATIONS)} or 'all' "
                                     "(default: random and the default method)")
    p.add_argument("--stratifications", default=None,
                   help=f"comma list of {','.join(STRATIFICATIONS)} or 'all' (default: perc)")
    p.add_argument("--interval", default="wilson", choices=["wilson", "normal"],
                   help="interval for the stopping rule (default wilson; normal = the paper's)")
    p.add_argument("--without-replacement", action="store_true",
                   help="sample without replacement (hypergeometric, with fpc); default is Bennett's "
                        "with-replacement protocol")
    p.add_argument("--budget", type=int, help="report MSE ratio vs random at this fixed label count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--plot", metavar="FILE.png", help="draw error vs labels and coverage (needs matplotlib)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    p.set_defaults(handler=main)


def _list(value: str | None, universe, option: str) -> list[str] | None:
    """Parse a comma list (or 'all'), raising a ValueError that names `option`."""
    if value is None:
        return None
    if value.strip() == "all":
        return list(universe)
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in universe]
    if unknown or not items:
        got = ", ".join(map(repr, unknown)) if unknown else "nothing"
        raise ValueError(f"{option}: unknown {got}; choose from {', '.join(universe)} or 'all'")
    return items


def _check(args) -> None:
    if args.runs < 2:
        raise ValueError("--runs must be >= 2")
    if not 0 < args.delta < 0.5:
        raise ValueError("--delta must be in (0, 0.5)")
    if not 0 < args.alpha < 1:
        raise ValueError("--alpha must be in (0, 1)")
    if args.strata < 1:
        raise ValueError("--strata must be >= 1")
    if args.budget is not None and args.budget < 2:
        raise ValueError("--budget must be >= 2")


def main(args) -> int:
    try:
        _check(args)
        pop = load(args.population, args.threshold) if args.population else builtin(args.builtin)
        if args.threshold is not None and not args.population:
            keep = pop.scores >= args.threshold
            pop = type(pop)(pop.name, pop.scores[keep], pop.labels[keep], pop.description, pop.informative)
            if pop.size < 2:
                raise ValueError(f"--threshold {args.threshold} leaves {pop.size} predicted positives; need at least 2")
        designs = designs_for(_list(args.methods, ALLOCATIONS, "--methods"),
                              _list(args.stratifications, STRATIFICATIONS, "--stratifications"),
                              args.strata)
        designs = [type(d)(d.method, d.stratification, d.strata, args.interval) for d in designs]
    except ValueError as exc:
        print(f"stratameter simulate: error: {exc}", file=sys.stderr)
        return 2
    protocol = Protocol(delta=args.delta, confidence=1.0 - args.alpha,
                        with_replacement=not args.without_replacement)
    curve = []
    if args.plot:
        top = args.budget or int(1.96**2 * pop.truth * (1 - pop.truth) / args.delta**2) + 10
        curve = sorted(set(np.unique(np.geomspace(10, max(top, 20), 25).astype(int)).tolist()))
    req = StudyRequest(pop, designs, protocol, args.runs, args.seed, args.budget, curve)
    results = _run_with_progress(req, args.workers, quiet=args.json)
    rows = summarise(req, results) if args.budget is None else summarise_budget(req, results)
    if args.json:
        print(json.dumps(as_json(req, rows)))
    else:
        _print_table(req, rows)
    if args.plot:
        _plot(req, results, args.plot)
    return 0


def _run_with_progress(req: StudyRequest, workers, quiet: bool):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if quiet or not sys.stderr.isatty():
        return run_study(req, workers=workers)
    with Progress(TextColumn("simulating {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} designs"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(req.population.name, total=len(req.designs))
        return run_study(req, lambda done, total: bar.update(task, completed=done), workers)


def _print_table(req: StudyRequest, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    pop = req.population
    title = (f"{pop.name}: {pop.size} predicted positives, precision {pop.truth:.4f}; "
             f"delta={req.protocol.delta}, alpha={1 - req.protocol.confidence:.2g}, runs={req.runs}")
    t = Table(title=title)
    if req.budget is None:
        for col in ("method", "strata", "labels +- se", "InConf", "cover", "%Change", "%Oracle", "%Jeffreys"):
            t.add_column(col, justify="left" if col in ("method", "strata") else "right", no_wrap=True)
        for r in rows:
            t.add_row(r.method, r.stratification, f"{r.labels_mean:.0f} +- {r.labels_se:.0f}",
                      f"{r.in_conf:.3f}", f"{r.ci_coverage:.3f}", f"{r.change_vs_random:+.1f}",
                      _pct(r.pct_oracle), _pct(r.pct_jeffreys_oracle))
    else:
        for col in ("method", "stratification", "labels", "MSE", "MSE ratio vs random", "CI cover"):
            t.add_column(col)
        for r in rows:
            ratio = "-" if r.mse_ratio_vs_random is None else f"{r.mse_ratio_vs_random:.3f}"
            t.add_row(r.method, r.stratification, str(r.budget), f"{r.mse:.2e}", ratio, f"{r.ci_coverage:.3f}")
    console = Console()
    if not console.is_terminal:  # a file or pipe: no terminal width to fit, print the whole table
        console = Console(width=120)
    console.print(t)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def _plot(req: StudyRequest, results, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("stratameter simulate: --plot needs matplotlib: pip install 'stratameter[plot]'", file=sys.stderr)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for d, r in zip(req.designs, results):
        ax1.plot(r["curve_labels"], r["curve_mae"], marker=".", label=d.label)
        ax2.plot(r["curve_labels"], r["curve_coverage"], marker=".", label=d.label)
    ax1.set(xscale="log", yscale="log", xlabel="labels", ylabel="mean absolute error",
            title=f"{req.population.name}: error vs labels")
    ax2.axhline(req.protocol.confidence, color="grey", ls="--", lw=1)
    ax2.set(xscale="log", xlabel="labels", ylabel="interval coverage", ylim=(0.8, 1.0),
            title=f"{req.protocol.confidence:.0%} interval coverage ({req.designs[0].interval})")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
