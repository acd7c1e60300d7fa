"""`stratameter simulate`'s option checks, shared by its precision, stream and whole-stream
studies (`command`, `stream_command`, `whole_command`): each raises a ValueError naming the option."""

from __future__ import annotations

import math

from .arrivals import SCENARIOS
from .budget import parse_budgets

#: `--delta`'s default: the service's DELTA (`config.Settings`; tests/unit/test_simulate_cli.py holds them equal)
DEFAULT_DELTA = 0.02
#: The options of the stream study alone (`--stream`).
STREAM_ONLY = ("scenario", "chunk_seconds", "rate", "review_delay", "skip_rate", "lateness", "max_labels_per_hour")


def parse_list(value: str | None, universe, option: str) -> list[str] | None:
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


def check_common(args) -> None:
    """The options every study takes; fills in `--delta`'s and `--alpha`'s defaults."""
    if args.runs < 2:
        raise ValueError("--runs must be >= 2")
    if args.delta is None:
        args.delta = DEFAULT_DELTA
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
    args.budgets = parse_budgets(args.budget)
    if args.budgets is not None and args.budgets[0] < 2:
        raise ValueError("--budget must be >= 2")


def check_stream(args) -> None:
    """The stream options: refused without `--stream`, checked and parsed with it."""
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
    args.scenario = parse_list(args.scenario, list(SCENARIOS), "--scenario") or ["slow"]


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
