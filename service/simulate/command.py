"""`stratameter simulate`: its arguments, and the precision study's progress, table, JSON and plot;
``--stream`` goes to `stream_command`, ``--metric recall|f1|accuracy`` to `whole_command`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np

from ..stats.allocation import ALLOCATIONS
from ..stats.confusion import METRICS
from ..stats.strata import STRATIFICATIONS
from . import stream_command
from .arrivals import SCENARIOS
from .engine import Protocol
from .options import DEFAULT_DELTA, check_common, check_stream, parse_list
from .populations import BUILTIN, above, builtin, load
from .whole_populations import WHOLE_BUILTIN, whole_builtin
from .budget import budget_table
from .study import (StudyRequest, as_json, designs_for, pct_text, run_study, srs_normal_labels, summarise,
                    summarise_budget)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `simulate` subcommand: one `add_argument` per option (--metric's in `_add_metric_arguments`,
    --stream's in `_add_stream_arguments`)."""
    p = sub.add_parser(
        "simulate",
        help="label-efficiency study: labels needed per sampling method on a population",
        description="Runs Bennett & Carvalho's protocol R times per method and reports labels "
        "used at stop, InConf, %Change vs random and %Oracle (or, with --budget, the MSE ratio "
        "vs random at a fixed label count).",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--builtin", default=None, choices=list(BUILTIN) + list(WHOLE_BUILTIN),
                     help="built-in synthetic population (default: calibrated; with --metric other than "
                          "precision: moderation). Whole-stream populations (every item, a threshold): "
                          + ", ".join(WHOLE_BUILTIN))
    src.add_argument("--population", metavar="FILE",
                     help="CSV or JSONL with columns score,label (label 0/1), predicted positives only "
                          "unless --threshold is given")
    src.add_argument("--fleet", metavar="FILE.toml",
                     help="several classifiers sharing one review team's hourly budget (a fleet file): each "
                          "classifier's half-width against its delta at the end of the hour, labels and "
                          "coverage, with the budget shared, split equally and split by volume (takes --runs, "
                          "--seed, --confidence or --alpha, --json)")
    p.add_argument("--threshold", type=float,
                   help="predicted positive means score >= THRESHOLD (precision keeps only those rows; "
                        "recall, F1 and accuracy keep every row)")
    _add_metric_arguments(p)
    p.add_argument("--runs", type=int, default=1000,
                   help="independent runs per design (default 1000; the coverage's s.e. is about 0.007 at 1000)")
    p.add_argument("--delta", type=float, default=None,
                   help=f"target half-width (default {DEFAULT_DELTA}, the service's DELTA)")
    p.add_argument("--alpha", type=float, default=None, help="1 - confidence (default 0.05)")
    p.add_argument("--confidence", type=float, default=None, help="confidence level (default 0.95 = 1 - alpha)")
    p.add_argument("--strata", type=int, default=4,
                   help="strata on the predicted positives (default 4, the service's STRATA)")
    p.add_argument("--methods", help=f"comma list of {','.join(ALLOCATIONS)} or 'all' "
                                     "(default: random and the default method)")
    p.add_argument("--stratifications", default=None,
                   help=f"comma list of {','.join(STRATIFICATIONS)} or 'all' (default: perc)")
    p.add_argument("--interval", default="wilson", choices=["wilson", "normal"],
                   help="interval for the stopping rule (default wilson; normal = the paper's)")
    p.add_argument("--without-replacement", action="store_true",
                   help="sample without replacement (hypergeometric, with fpc); default is Bennett's "
                        "with-replacement protocol")
    p.add_argument("--budget", metavar="N[,N...]",
                   help="fixed label counts (e.g. 100,200,400,800): report, at each, the MSE as a ratio to "
                        "p(1-p)/n and to random's, bias, coverage and width, each with its standard error")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--plot", metavar="FILE.png", help="draw error vs labels and coverage (needs matplotlib)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    p.add_argument("--calibration", action="store_true",
                   help="the service's design on the population as one closed chunk, with and without precision's "
                        "difference estimator (the score inside the strata, CALIBRATION_MIN_LABELS 100), paired on "
                        "common random numbers: labels at the stop, the saving, coverage (per-item draws: minutes); "
                        "with --stream, per scenario on the same chunks")
    _add_shadow_arguments(p)
    _add_stream_arguments(p)
    p.set_defaults(handler=main)


def _add_metric_arguments(p: argparse.ArgumentParser) -> None:
    """--metric and the predicted negatives' strata (`whole_command`)."""
    p.add_argument("--metric", default="precision", choices=list(METRICS),
                   help="what to estimate (default precision); recall, f1 and accuracy sample the whole stream")
    p.add_argument("--negative-strata", type=int, default=4,
                   help="strata on the predicted negatives for recall, f1 and accuracy (default 4)")
    p.add_argument("--negative-stratifications", default=None,
                   help=f"comma list of {','.join(STRATIFICATIONS)} or 'all' for the predicted negatives "
                        "(default: the default design's)")
    p.add_argument("--margin-strata", action="store_true",
                   help="with --metric accuracy: also Kumar & Raj's strata on |score - threshold| pooled across "
                        "both sides (label = the prediction was right), beside the two-sided design")


def _add_shadow_arguments(p: argparse.ArgumentParser) -> None:
    """--shadow and its noise (`shadow`)."""
    p.add_argument("--shadow", action="store_true",
                   help="a model and its shadow scoring the same items of a whole-stream --builtin population, each "
                        "estimating its precision to --delta: the pair's label requests with independent and with "
                        "shared (item-hash) priorities against each alone, and each one's coverage")
    p.add_argument("--shadow-noise", type=float, default=None, metavar="SIGMA",
                   help="with --shadow: standard deviation of the noise on the shadow's margin (default 0.5)")


def _add_stream_arguments(p: argparse.ArgumentParser) -> None:
    """--stream and its options (`stream_command`, `trace`)."""
    st = p.add_argument_group(
        "streams", "--stream replays the population as the arrivals of one chunk and runs the service's stream "
        "design on it (threshold sampling, paced thresholds, OPT rounds once arrivals stop, the chunk's interval "
        "with the finite population correction once closed), reporting per scenario labels, the share of chunks "
        "that reached delta, their InConf, the coverage of every closed chunk against its own precision, and "
        "the static design's labels for comparison")
    st.add_argument("--stream", action="store_true", help="simulate a chunk whose population arrives while it is sampled")
    st.add_argument("--scenario", default=None,
                    help=f"comma list of {','.join(SCENARIOS)} or 'all' (default: slow): "
                         + "; ".join(f"{k}: {v.description}" for k, v in SCENARIOS.items()))
    st.add_argument("--chunk-seconds", type=float, default=None, help="chunk length in seconds (default 3600)")
    st.add_argument("--rate", type=float, default=None, help="predicted positives per second (default 1)")
    st.add_argument("--review-delay", default=None, metavar="SECONDS|LO-HI",
                    help="seconds until a reviewer answers, uniform between LO and HI (default: the scenario's, "
                         "2-10; late-answers 600-1800)")
    st.add_argument("--skip-rate", type=float, default=None,
                    help="share of requests the reviewers skip (no label; default: the scenario's, 0)")
    st.add_argument("--lateness", type=float, default=None,
                    help="ALLOWED_LATENESS_SECONDS: a chunk closes this long after its end (default 300)")
    st.add_argument("--max-labels-per-hour", type=int, default=None,
                    help="hourly label budget, paced over the clock hour (default: no budget)")
    st.add_argument("--trace", type=float, nargs="?", const=30.0, default=None, metavar="SECONDS",
                    help="instead of the study: read the chunk's estimate gauge every SECONDS (default 30, a scrape) "
                         "of every run until it stops, as the service computes it then, and report per scenario "
                         "the bias of the estimate (minus the precision of the items arrived so far) and the "
                         "coverage of its interval, pooled over the readings and at minutes 5, 10 and 30; with "
                         "--calibration, the difference estimator's gauge (the service's default)")
    st.add_argument("--chunks", type=int, default=None, metavar="C",
                    help="instead of the study: C consecutive chunks (each sampled alone, as without an hourly "
                         "budget), read every 30 s as the service reads them: coverage and bias of the 1d window and "
                         "of the last closed chunk, the window's half-width against a chunk's, and the default "
                         "precision SLO alert (the window's upper bound below the SLO for 15 minutes) at SLOs 0.01 "
                         "under and at the population's precision: hours from a drop until it fires, false alarms "
                         "per day before it; with --json, the document")
    st.add_argument("--drop-at-chunk", type=int, default=None, metavar="K",
                    help="with --chunks: the precision of the chunks from chunk K on (0-based) is lower by --drop-by")
    st.add_argument("--drop-by", type=float, default=None, metavar="D",
                    help="with --chunks: the precision drop from --drop-at-chunk on (positives relabelled negative at "
                         "random, as the drift scenario)")


def _main_calibration(args, pop) -> int:
    """`--calibration`: precision on `pop`'s predicted positives, or with `--metric` another metric
    on a whole-stream `pop` (strata on both sides of the threshold)."""
    from . import calibrated

    cell = calibrated.cell(pop, args.delta, args.runs, 1.0 - args.alpha, args.seed, workers=args.workers,
                           metric=args.metric)
    if args.json:
        print(json.dumps(dataclasses.asdict(cell)))
        return 0
    truth = pop.truth if args.metric == "precision" else pop.truth(args.metric)
    sides = (f"K = {calibrated.STRATA} perc strata" if args.metric == "precision" else
             f"K = K' = {calibrated.STRATA} strata on both sides")
    print(f"{pop.name} ({args.metric} {truth:.4f}), one closed chunk, {sides}, "
          f"delta={args.delta}, confidence={1.0 - args.alpha:g}, {args.runs} paired runs")
    print(f"{'labels today':>14} {'with calibration':>17} {'saving':>14} {'coverage today / with':>22} "
          f"{'active at stop':>15}")
    print(f"{cell.labels_plain:>14.1f} {cell.labels_calibrated:>17.1f} "
          f"{100 * cell.saving:>+8.1f} ± {100 * cell.saving_stderr:.1f} % "
          f"{cell.coverage_plain:>11.3f} / {cell.coverage_calibrated:.3f} {100 * cell.active_at_stop:>14.0f}%")
    return 0


def main(args) -> int:
    if getattr(args, "fleet", None):
        from . import fleet_command

        return fleet_command.main(args)
    if getattr(args, "shadow", False):
        from . import shadow

        return shadow.main(args)
    if getattr(args, "trace", None) is not None and not (args.stream and args.metric == "precision"):
        print("stratameter simulate: error: --trace needs --stream (with --metric precision)", file=sys.stderr)
        return 2
    if args.calibration:
        wrong = _not_with_calibration(args)
        if wrong:
            print(f"stratameter simulate: error: {wrong[0]} does not apply with --calibration (the service's design: "
                  f"K = 4 perc strata, K' = 4 on predicted negatives, the Wilson interval, without replacement; "
                  f"--stream with precision only)", file=sys.stderr)
            return 2
        if args.metric != "precision":
            from . import whole_command

            try:
                check_common(args)
                pop = whole_command.defined_population(args)
            except ValueError as exc:
                print(f"stratameter simulate: error: {exc}", file=sys.stderr)
                return 2
            return _main_calibration(args, pop)
    if args.metric != "precision":
        from . import whole_command

        return whole_command.main(args)
    try:
        pop, designs = _population_and_designs(args)
    except ValueError as exc:
        print(f"stratameter simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.stream:
        if args.trace is not None:
            from . import trace_command

            return trace_command.main(args, pop)
        if args.chunks is not None:
            from . import chunks_command

            return chunks_command.main(args, pop)
        return stream_command.main(args, pop)
    if args.calibration:
        return _main_calibration(args, pop)
    return _main_study(args, pop, designs)


def _not_with_calibration(args) -> list[str]:
    """The options given that `--calibration` (the service's design) does not take."""
    return [o for o, given in (("--budget", args.budget is not None),
                               ("--plot", args.plot), ("--methods", args.methods),
                               ("--stratifications", args.stratifications), ("--strata", args.strata != 4),
                               ("--negative-strata", args.negative_strata != 4),
                               ("--negative-stratifications", args.negative_stratifications),
                               ("--margin-strata", args.margin_strata),
                               ("--stream", args.stream and args.metric != "precision"),
                               ("--interval", args.interval != "wilson"),
                               ("--without-replacement", args.without_replacement)) if given]


def _population_and_designs(args) -> tuple:
    """Precision's population (its predicted positives) and the designs to compare, from the
    options (checked: ValueError naming the option)."""
    check_common(args)
    check_stream(args)
    if args.negative_stratifications is not None or args.negative_strata != 4 or args.margin_strata:
        raise ValueError("--negative-strata, --negative-stratifications and --margin-strata need --metric "
                         "recall, f1 or accuracy")
    name = args.builtin or "calibrated"
    if args.population:
        if args.threshold is None and not args.json:
            print(f"note: no --threshold, so every row of {args.population} is taken as a predicted positive",
                  file=sys.stderr)
        pop = load(args.population, args.threshold)
    elif name in WHOLE_BUILTIN:  # its predicted positives at its own threshold
        pop = whole_builtin(name).positives_only()
    else:
        pop = builtin(name)
    if args.threshold is not None and not args.population:
        pop = above(pop, args.threshold)
    designs = designs_for(parse_list(args.methods, ALLOCATIONS, "--methods"),
                          parse_list(args.stratifications, STRATIFICATIONS, "--stratifications"),
                          args.strata)
    return pop, [type(d)(d.method, d.stratification, d.strata, args.interval) for d in designs]


def _main_study(args, pop, designs) -> int:
    """The precision study on a fixed population: the table or JSON (and the plot)."""
    protocol = Protocol(delta=args.delta, confidence=1.0 - args.alpha,
                        with_replacement=not args.without_replacement)
    curve = []
    if args.plot:
        top = max(args.budgets or [0]) or int(1.96**2 * pop.truth * (1 - pop.truth) / args.delta**2) + 10
        curve = sorted(set(np.unique(np.geomspace(10, max(top, 20), 25).astype(int)).tolist()))
    req = StudyRequest(pop, designs, protocol, args.runs, args.seed, args.budgets, curve)
    results = _run_with_progress(req, args.workers, quiet=args.json)
    rows = summarise(req, results) if args.budgets is None else summarise_budget(req, results)
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


#: what the table's columns mean, printed under it
LEGEND = ("labels: labels at the stop (mean +- s.e.); cover: share of runs whose interval covers the truth; "
          "InConf: share whose estimate is within delta of the truth (Bennett & Carvalho 2010); %Change: labels "
          "against random's (negative: fewer); %Oracle, %Jeffreys: labels over the Neyman oracle's and the "
          "Jeffreys oracle's, in percent above them")


def _print_table(req: StudyRequest, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    pop = req.population
    title = (f"{pop.name}: {pop.size} predicted positives, precision {pop.truth:.4f}; "
             f"delta={req.protocol.delta}, alpha={1 - req.protocol.confidence:.2g}, runs={req.runs}")
    t = Table(title=title)
    if req.budgets is None:
        for col in ("method", "strata", "labels +- se", "cover", "InConf", "%Change", "%Oracle", "%Jeffreys"):
            t.add_column(col, justify="left" if col in ("method", "strata") else "right", no_wrap=True)
        for r in rows:
            t.add_row(r.method, r.stratification, f"{r.labels_mean:.0f} +- {r.labels_se:.0f}",
                      f"{r.ci_coverage:.3f}", f"{r.in_conf:.3f}", f"{r.change_vs_random:+.1f}",
                      pct_text(r.pct_oracle), pct_text(r.pct_jeffreys_oracle))
        fpc = None if req.protocol.with_replacement else pop.size
        t.caption = (f"simple random sampling with a normal interval needs "
                     f"{srs_normal_labels(pop.truth, req.protocol.delta, req.protocol.confidence, fpc):.0f} labels")
    else:
        budget_table(t, rows)
    console = Console()
    if not console.is_terminal:  # a file or pipe: no terminal width to fit, print the whole table
        console = Console(width=120)
    console.print(t)
    if req.budgets is None:
        console.print(LEGEND, style="dim")


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
