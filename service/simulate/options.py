"""`stratameter simulate`'s option checks, shared by its precision, stream and whole-stream
studies (`command`, `stream_command`, `whole_command`): each raises a ValueError naming the option."""

from __future__ import annotations

import math

from .arrivals import SCENARIOS
from .budget import parse_budgets

#: `--delta`'s default: the service's DELTA (`config.Settings`; tests/unit/test_simulate_cli.py holds them equal)
DEFAULT_DELTA = 0.02
#: The options of the stream study alone (`--stream`).
STREAM_ONLY = ("scenario", "chunk_seconds", "rate", "review_delay", "skip_rate", "lateness", "max_labels_per_hour",
               "chunks", "drop_at_chunk", "drop_by")
#: Seconds between two readings of `--chunks` (`trace.SCRAPE_SECONDS`): a chunk is a whole number of them.
READING_SECONDS = 30


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
    check_chunks(args)


def check_chunks(args) -> None:
    """`--chunks` and the drop (`chunks_study`): a drop needs both its options, inside the chunks; one
    scenario without its own drift; no hourly budget (it couples the chunks sampled in an hour, which
    the study runs apart) and neither --trace nor --calibration."""
    drop = (args.drop_at_chunk, args.drop_by)
    if args.chunks is None:
        if any(x is not None for x in drop):
            raise ValueError("--drop-at-chunk and --drop-by need --chunks")
        return
    if args.chunks < 1:
        raise ValueError("--chunks must be >= 1")
    if (drop[0] is None) != (drop[1] is None):
        raise ValueError("--drop-at-chunk and --drop-by go together")
    if drop[0] is not None and not 0 <= drop[0] < args.chunks:
        raise ValueError(f"--drop-at-chunk must be in [0, --chunks), got {drop[0]}")
    if drop[1] is not None and not 0 < drop[1] < 1:
        raise ValueError("--drop-by must be in (0, 1)")
    chunk = args.chunk_seconds or 3600.0
    if chunk % READING_SECONDS or 86400 % chunk:
        raise ValueError(f"--chunks needs --chunk-seconds a multiple of {READING_SECONDS} s (the readings) that "
                         f"divides a day (the window)")
    for option, given in (("--max-labels-per-hour", args.max_labels_per_hour is not None),
                          ("--trace", getattr(args, "trace", None) is not None),
                          ("--calibration", getattr(args, "calibration", False)),
                          ("--metric other than precision", getattr(args, "metric", "precision") != "precision"),
                          ("--scenario with several scenarios", len(args.scenario) > 1),
                          ("--scenario drift", SCENARIOS[args.scenario[0]].drift > 0)):
        if given:
            raise ValueError(f"{option} does not apply with --chunks")


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
