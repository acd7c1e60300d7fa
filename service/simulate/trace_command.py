"""`stratameter simulate --stream --trace [SECONDS]`: the gauge read every SECONDS through the stream
study (`stream_study.run_trace_study`), printed as a table or JSON (`trace.summarise` pools it)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

from ..stats.difference import CALIBRATION_MIN_LABELS
from . import stream_command, stream_study
from .arrivals import SCENARIOS
from .trace import Share


def main(args, pop) -> int:
    """`stratameter simulate --stream --trace [SECONDS]` on `pop` with the checked `args`
    (`options.check_stream`): per scenario, the gauge's bias and coverage pooled and at `MINUTES`; with
    ``--calibration`` the gauge of the difference estimator (``CALIBRATION_MIN_LABELS``, the service's
    default) where its switch keeps it."""
    every = float(args.trace)
    settings = stream_command.settings_from(args)
    if args.calibration:
        settings = replace(settings, calibration_min_labels=CALIBRATION_MIN_LABELS)
    study = stream_study.StreamStudy(pop, args.scenario, settings, args.runs, args.seed)
    problem = None
    if not (every > 0 and math.isfinite(every)):
        problem = f"--trace: the scrape interval must be > 0 seconds, got {every:g}"
    for name in study.scenarios:
        if problem is None and SCENARIOS[name].drift >= pop.truth:
            problem = (f"--scenario {name}: a precision drop of {SCENARIOS[name].drift} needs a population precision "
                       f"above it; {pop.name} has {pop.truth:.3f}")
    if problem:
        print(f"stratameter simulate: error: {problem}", file=sys.stderr)
        return 2
    cells = stream_study.run_trace_study(study, every, workers=args.workers)
    if args.json:
        print(json.dumps(stream_study.trace_json(study, every, cells)))
        return 0
    s = settings
    print(f"{pop.name} (precision {pop.truth:.4f}) as a stream: {s.chunk_seconds:g} s chunks, {s.rate:g} items/s, "
          f"delta={s.delta}, confidence={s.confidence:g}, {study.runs} runs per scenario"
          f"{', difference estimator on' if args.calibration else ''}; the gauge read every {every:g} s until the "
          f"run stops, against the precision of the items arrived so far; bias = estimate - that "
          f"(+- s.e., clustered by run) and coverage of the interval over the readings that show one (shown; null: "
          f"none yet)")
    head = f"{'scenario':<13} {'at':>7} {'shown':>9} {'null':>7} {'bias':>19} {'coverage':>17}"
    print(head)
    for name, t, _ in cells:
        rows = [("pooled", t.bias, t.coverage, t.no_interval)]
        rows += [(f"min {m}", v["bias"], v["coverage"], v["no_interval"]) for m, v in t.at_minute.items()]
        for i, (at, b, c, null) in enumerate(rows):
            print(f"{name if i == 0 else '':<13} {at:>7} {b.readings:>9} {null:>7} {_pm(b, '+.4f'):>19} "
                  f"{_pm(c, '.3f'):>17}")
    return 0


def _pm(x: Share, fmt: str) -> str:
    if x.mean is None:
        return "-"
    return f"{x.mean:{fmt}} +- {x.se:.4f}" if x.se is not None else f"{x.mean:{fmt}}"
