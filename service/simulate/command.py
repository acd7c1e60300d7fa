"""`stratameter simulate`: argument handling, progress, table, JSON and plot
(and, with ``--stream``, the stream design of `stream`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

import numpy as np

from ..stats.allocation import ALLOCATIONS
from ..stats.confusion import METRICS
from ..stats.strata import STRATIFICATIONS
from .arrivals import SCENARIOS, StreamSettings
from .engine import Protocol
from .populations import BUILTIN, builtin, load
from .whole_populations import WHOLE_BUILTIN, whole_builtin
from .stream_study import StreamStudy
from .study import StudyRequest, as_json, designs_for, run_study, summarise, summarise_budget

STATIC_DELTA = 0.01
STREAM_DELTA = 0.02  # the service's DELTA


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `simulate` subcommand: one `add_argument` per option, which is why it runs past 60 lines."""
    p = sub.add_parser(
        "simulate",
        help="label-efficiency study: labels needed per sampling method on a population",
        description="Runs Bennett & Carvalho's protocol R times per method and reports labels "
        "used at stop, InConf, %%Change vs random and %%Oracle (or, with --budget, the MSE ratio "
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
    p.add_argument("--threshold", type=float,
                   help="predicted positive means score >= THRESHOLD (precision keeps only those rows; "
                        "recall, F1 and accuracy keep every row)")
    _add_metric_arguments(p)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--delta", type=float, default=None,
                   help=f"target half-width (default {STATIC_DELTA}; {STREAM_DELTA} with --stream, the service's DELTA)")
    p.add_argument("--alpha", type=float, default=None, help="1 - confidence (default 0.05)")
    p.add_argument("--confidence", type=float, default=None, help="confidence level (default 0.95 = 1 - alpha)")
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
    p.add_argument("--calibration", action="store_true",
                   help="the service's design on the population as one closed chunk, with and without precision's "
                        "difference estimator (the score inside the strata, CALIBRATION_MIN_LABELS 100), paired on "
                        "common random numbers: labels at the stop, the saving, coverage (per-item draws: minutes); "
                        "with --stream, per scenario on the same chunks")
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


STREAM_ONLY = ("scenario", "chunk_seconds", "rate", "review_delay", "skip_rate", "lateness", "max_labels_per_hour")


def _check(args) -> None:
    if args.runs < 2:
        raise ValueError("--runs must be >= 2")
    if args.delta is None:
        args.delta = STREAM_DELTA if args.stream else STATIC_DELTA
    if not 0 < args.delta < 0.5:
        raise ValueError("--delta must be in (0, 0.5)")
    if args.alpha is not None and args.confidence is not None:
        raise ValueError("--alpha and --confidence: give one of them")
    if args.confidence is not None:
        if not 0 < args.confidence < 1:
            raise ValueError("--confidence must be in (0, 1)")
        args.alpha = 1.0 - args.confidence
    if args.alpha is None:
        args.alpha = 0.05
    if not 0 < args.alpha < 1:
        raise ValueError("--alpha must be in (0, 1)")
    if args.strata < 1:
        raise ValueError("--strata must be >= 1")
    if args.budget is not None and args.budget < 2:
        raise ValueError("--budget must be >= 2")


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


def _check_stream(args) -> None:
    if not args.stream:
        given = [name for name in STREAM_ONLY if getattr(args, name) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --stream")
        return
    for option, value in (("--budget", args.budget), ("--methods", args.methods), ("--plot", args.plot),
                          ("--stratifications", args.stratifications)):
        if value is not None:
            raise ValueError(f"{option} does not apply with --stream (the stream design is the default design)")
    if args.without_replacement:
        raise ValueError("--without-replacement does not apply with --stream (a chunk is always sampled without "
                         "replacement)")
    if args.interval != "wilson":
        raise ValueError("--interval does not apply with --stream (the service reports the Wilson interval)")
    if args.chunk_seconds is not None and not args.chunk_seconds >= 1:
        raise ValueError("--chunk-seconds must be >= 1")
    if args.rate is not None and not args.rate > 0:
        raise ValueError("--rate must be > 0")
    if (args.rate or 1.0) * (args.chunk_seconds or 3600.0) < 1:
        raise ValueError("--rate x --chunk-seconds must be at least one item per chunk")
    if args.skip_rate is not None and not 0 <= args.skip_rate < 1:
        raise ValueError("--skip-rate must be in [0, 1)")
    if args.lateness is not None and not args.lateness >= 0:
        raise ValueError("--lateness must be >= 0")
    if args.max_labels_per_hour is not None and args.max_labels_per_hour < 1:
        raise ValueError("--max-labels-per-hour must be >= 1")
    args.review_delay = _delay(args.review_delay)
    args.scenario = _list(args.scenario, list(SCENARIOS), "--scenario") or ["slow"]


def _delay(value: str | None) -> tuple[float, float] | None:
    """``SECONDS`` or ``LO-HI`` (uniform) as ``(lo, hi)``."""
    if value is None:
        return None
    parts = value.split("-")
    try:
        lo, hi = (float(parts[0]), float(parts[0])) if len(parts) == 1 else (float(parts[0]), float(parts[1]))
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or not (0 <= lo <= hi) or not math.isfinite(hi):
        raise ValueError(f"--review-delay: expected SECONDS or LO-HI with 0 <= LO <= HI, got {value!r}")
    return lo, hi


def main(args) -> int:
    if args.calibration:
        wrong = [o for o, given in (("--budget", args.budget is not None),
                                    ("--plot", args.plot), ("--methods", args.methods),
                                    ("--stratifications", args.stratifications), ("--strata", args.strata != 4),
                                    ("--negative-strata", args.negative_strata != 4),
                                    ("--negative-stratifications", args.negative_stratifications),
                                    ("--margin-strata", args.margin_strata),
                                    ("--stream", args.stream and args.metric != "precision"),
                                    ("--interval", args.interval != "wilson"),
                                    ("--without-replacement", args.without_replacement)) if given]
        if wrong:
            print(f"stratameter simulate: error: {wrong[0]} does not apply with --calibration (the service's design: "
                  f"K = 4 perc strata, K' = 4 on predicted negatives, the Wilson interval, without replacement; "
                  f"--stream with precision only)", file=sys.stderr)
            return 2
        if args.metric != "precision":
            from . import whole_command

            try:
                _check(args)
                pop = whole_command.defined_population(args)
            except ValueError as exc:
                print(f"stratameter simulate: error: {exc}", file=sys.stderr)
                return 2
            return _main_calibration(args, pop)
    if args.metric != "precision":
        from . import whole_command

        return whole_command.main(args)
    try:
        _check(args)
        _check_stream(args)
        if args.negative_stratifications is not None or args.negative_strata != 4 or args.margin_strata:
            raise ValueError("--negative-strata, --negative-stratifications and --margin-strata need --metric "
                             "recall, f1 or accuracy")
        name = args.builtin or "calibrated"
        if args.population:
            pop = load(args.population, args.threshold)
        elif name in WHOLE_BUILTIN:  # its predicted positives at its own threshold
            pop = whole_builtin(name).positives_only()
        else:
            pop = builtin(name)
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
    if args.stream:
        return _main_stream(args, pop)
    if args.calibration:
        return _main_calibration(args, pop)
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


def _main_stream(args, pop) -> int:
    from . import stream_study

    metric = getattr(args, "metric", "precision")
    defaults = StreamSettings()
    settings = StreamSettings(
        delta=args.delta, confidence=args.confidence if args.confidence is not None else 1.0 - args.alpha,
        chunk_seconds=args.chunk_seconds or defaults.chunk_seconds, rate=args.rate or defaults.rate,
        lateness=defaults.lateness if args.lateness is None else args.lateness,
        max_labels_per_hour=args.max_labels_per_hour, review_delay=args.review_delay, skip_rate=args.skip_rate,
        strata=args.strata, metric=metric, negative_strata=args.negative_strata,
    )
    study = StreamStudy(pop, args.scenario, settings, args.runs, args.seed)
    try:
        for name in study.scenarios:  # fail fast on what a scenario cannot do with this population
            if SCENARIOS[name].drift and metric != "precision":
                raise ValueError(f"--scenario {name} lowers precision: it applies to --metric precision only")
            if SCENARIOS[name].drift >= stream_study.population_truth(pop, metric):
                raise ValueError(f"--scenario {name}: a precision drop of {SCENARIOS[name].drift} needs a "
                                 f"population precision above it; {pop.name} has {pop.truth:.3f}")
    except ValueError as exc:
        print(f"stratameter simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.calibration:
        return _main_stream_calibration(args, study)
    if args.json or not sys.stderr.isatty():
        static, rows = stream_study.run_study(study, workers=args.workers)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("simulating {task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} (static design and scenarios)"),
                      TimeElapsedColumn(), transient=True) as bar:
            task = bar.add_task(pop.name, total=len(study.scenarios) + 1)
            static, rows = stream_study.run_study(study, lambda done, total: bar.update(task, completed=done), args.workers)
    if args.json:
        print(json.dumps(stream_study.as_json(study, static, rows)))
    else:
        _print_stream_table(study, static, rows)
    return 0


def _main_stream_calibration(args, study: StreamStudy) -> int:
    from . import stream_study

    cells = stream_study.run_calibration_study(study, workers=args.workers)
    if args.json:
        print(json.dumps(stream_study.calibration_json(study, cells)))
        return 0
    s, pop = study.settings, study.population
    print(f"{pop.name} (precision {pop.truth:.4f}) as a stream: {s.chunk_seconds:g} s chunks, {s.rate:g} items/s, "
          f"delta={s.delta}, confidence={s.confidence:g}, {study.runs} paired runs per scenario "
          f"(today's estimator / with the calibration)")
    print(f"{'scenario':<13} {'labels today':>12} {'with calibration':>17} {'saving':>15} "
          f"{'coverage':>13} {'reached delta':>13} {'active at stop':>15}")
    for name, c in cells:
        print(f"{name:<13} {c.labels_plain:>12.1f} {c.labels_calibrated:>17.1f} "
              f"{100 * c.saving:>+8.1f} ± {100 * c.saving_stderr:.1f} % {c.coverage_plain:>6.3f}/{c.coverage_calibrated:.3f} "
              f"{c.reached_plain:>6.3f}/{c.reached_calibrated:.3f} {100 * c.active_at_stop:>14.0f}%")
    return 0


def _print_stream_table(study: StreamStudy, static, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    from .stream_study import population_truth

    s, pop = study.settings, study.population
    budget = "no budget" if s.max_labels_per_hour is None else f"{s.max_labels_per_hour} labels/hour"
    title = (f"{pop.name} ({s.metric} {population_truth(pop, s.metric):.4f}) as a stream: {s.chunk_seconds:g} s chunks, {s.rate:g} items/s, "
             f"lateness {s.lateness:g} s, {budget}; delta={s.delta}, alpha={1 - s.confidence:.2g}, "
             f"runs={study.runs}; static design: {static.labels_mean:.0f} +- {static.labels_se:.0f} labels")
    t = Table(title=title)
    cols = ("scenario", "items", "labels +- se", "reached delta", "InConf (reached)", "cover (closed)",
            "vs static", "capped", "stop (min)")
    for col in cols:
        t.add_column(col, justify="left" if col == "scenario" else "right", no_wrap=True)
    for r in rows:
        inconf = "-" if r.in_conf_reached is None else f"{r.in_conf_reached:.3f}"
        ratio = "-" if r.ratio_vs_static is None else f"{r.ratio_vs_static:.3f}"
        t.add_row(r.scenario, f"{r.items_mean:.0f}", f"{r.labels_mean:.0f} +- {r.labels_se:.0f}",
                  f"{r.reached_delta:.3f}", inconf, f"{r.coverage_closed:.3f}", ratio, f"{r.capped:.3f}",
                  f"{r.stop_minutes_mean:.0f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    console.print(t)


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
