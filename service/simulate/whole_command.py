"""`stratameter simulate --metric recall|f1|accuracy`: options, table and JSON of the whole-stream study."""

from __future__ import annotations

import json
import sys

from ..stats.allocation import ALLOCATIONS
from ..stats.strata import STRATIFICATIONS
from . import budget, stream_command
from .engine import Protocol
from .options import STREAM_ONLY, check_common, check_stream, parse_list
from .whole_populations import WHOLE_BUILTIN, whole_builtin, whole_from_file
from .study import pct_text
from .whole_study import (WholeStudyRequest, floor_labels, run_whole_study, summarise_whole, whole_designs,
                          whole_json)

DEFAULT_POPULATION = "moderation"
#: Options of the precision study that do not apply to the whole stream.
PRECISION_ONLY = (("--plot", "plot"), ("--without-replacement", "without_replacement"))


def _population(args):
    if args.population:
        if args.threshold is None and args.metric != "accuracy":
            raise ValueError(f"--metric {args.metric} with --population needs --threshold (predicted positive "
                             "means score >= THRESHOLD)")
        if args.threshold is None:  # the multi-class recipe: every record predicted, label = it was right
            from .populations import load
            from .whole_populations import WholeStream

            pop = load(args.population)
            return WholeStream(pop.name, pop.scores, pop.labels, None, pop.description)
        return whole_from_file(args.population, args.threshold)
    name = args.builtin or DEFAULT_POPULATION
    if name not in WHOLE_BUILTIN:
        raise ValueError(f"--metric {args.metric} needs a whole-stream population: --builtin one of "
                         f"{', '.join(WHOLE_BUILTIN)}, or --population FILE --threshold T")
    if args.threshold is not None:
        raise ValueError("--threshold applies to --population; a built-in population has its own")
    return whole_builtin(name)


def defined_population(args):
    """The population, checked to define the metric."""
    pop = _population(args)
    if args.metric not in pop.metrics_defined():
        raise ValueError(f"--metric {args.metric} is not defined on {pop.name}; it has "
                         f"{', '.join(pop.metrics_defined())}")
    return pop


def _request(args) -> WholeStudyRequest:
    check_common(args)
    for option, attr in PRECISION_ONLY:
        if getattr(args, attr):
            raise ValueError(f"{option} applies to --metric precision only")
    for name in STREAM_ONLY:
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} applies to --metric precision with --stream only")
    if args.interval != "wilson":
        raise ValueError("--interval applies to --metric precision only (recall and F1 use the linearised Wilson)")
    if args.negative_strata < 1:
        raise ValueError("--negative-strata must be >= 1")
    pop = defined_population(args)
    if args.margin_strata and (args.metric != "accuracy" or pop.threshold is None):
        raise ValueError("--margin-strata needs --metric accuracy on a population with a threshold (strata that "
                         "pool both sides estimate the share of right predictions, not recall or F1)")
    designs = whole_designs(parse_list(args.methods, ALLOCATIONS, "--methods"),
                            parse_list(args.stratifications, STRATIFICATIONS, "--stratifications"),
                            parse_list(args.negative_stratifications, STRATIFICATIONS, "--negative-stratifications"),
                            args.strata, args.negative_strata, args.margin_strata)
    protocol = Protocol(delta=args.delta, confidence=1.0 - args.alpha)
    return WholeStudyRequest(pop, args.metric, designs, protocol, args.runs, args.seed, args.budgets)


def main(args) -> int:
    try:
        if args.stream:  # the service's stream design over a chunk of the whole stream
            check_common(args)
            check_stream(args)
            if args.negative_strata < 1:
                raise ValueError("--negative-strata must be >= 1")
            if args.negative_stratifications is not None or args.margin_strata:
                raise ValueError("--negative-stratifications and --margin-strata do not apply with --stream "
                                 "(the default design)")
            pop = defined_population(args)
        else:
            req = _request(args)
    except ValueError as exc:
        print(f"stratameter simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.stream:
        return stream_command.main(args, pop)
    results = run_whole_study(req, workers=args.workers)
    rows = summarise_whole(req, results) if req.budgets is None else budget.summaries(req.designs, results, req.budgets)
    if args.json:
        print(json.dumps(whole_json(req, rows)))
    else:
        _print_table(req, rows)
    return 0


def _print_table(req: WholeStudyRequest, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    pop = req.population
    threshold = "all predicted positive" if pop.threshold is None else f"threshold {pop.threshold:g}"
    title = (f"{pop.name}: {pop.size} items, prevalence {pop.prevalence:.4f}, {threshold}, "
             f"{req.metric} {pop.truth(req.metric):.4f}; delta={req.protocol.delta}, "
             f"alpha={1 - req.protocol.confidence:.2g}, runs={req.runs}")
    t = Table(title=title)
    if req.budgets is not None:
        budget.budget_table(t, rows)
    else:
        for col in ("method", "strata (pos+neg)", "labels +- se", "cover", "InConf", "%Change", "%Oracle"):
            t.add_column(col, justify="left" if col.startswith(("method", "strata")) else "right", no_wrap=True)
        for r in rows:
            t.add_row(r.method, r.stratification, f"{r.labels_mean:.0f} +- {r.labels_se:.0f}", f"{r.ci_coverage:.3f}",
                      f"{r.in_conf:.3f}", f"{r.change_vs_random:+.1f}", pct_text(r.pct_oracle))
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    console.print(t)
    if req.budgets is None:
        floor = floor_labels(req)
        console.print(f"Neyman floor with 500-item strata (true rates): {floor:.0f} labels, "
                      f"{floor / rows[0].labels_mean:.3f} x random's")
