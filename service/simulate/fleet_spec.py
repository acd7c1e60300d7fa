"""A fleet file for `stratameter simulate --fleet FILE`: several classifiers that share one review
team's hourly budget.  TOML::

    budget_share_of_need = 0.5   # or budget_per_hour = 1500: one of the two
    hours = 1                    # hours simulated, each a fresh chunk per classifier (default 1)

    [[classifier]]
    name = "spam"                # unique
    population = "steep"         # a built-in population: precision (`simulate --builtin`), or
                                 # whole-stream when its metrics need the predicted negatives
    items_per_hour = 20000       # the hourly chunk's predicted positives
    delta = 0.02                 # its own target half-width
    weight = 1.0                 # its claim on the shared budget (default 1)
    metrics = "precision"        # as STRATAMETER_METRICS (default precision); with recall, f1 or
                                 # accuracy the population is a whole-stream one (`simulate --metric`)
                                 # and items_per_hour counts every item scored, not only the positives

``budget_share_of_need`` sets the hourly budget to that share of the labels the classifiers need
together to reach their deltas, each alone with no budget (measured in the same run)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..stats.confusion import METRICS, needs_negatives
from .populations import BUILTIN
from .whole_populations import WHOLE_BUILTIN

_TOP = {"budget_share_of_need", "budget_per_hour", "hours", "classifier"}
_MEMBER = {"name", "population", "items_per_hour", "delta", "weight", "metrics"}


@dataclass(frozen=True)
class Member:
    """One classifier of the fleet."""

    name: str
    population: str
    items_per_hour: int
    delta: float
    weight: float = 1.0
    metrics: str = "precision"


@dataclass(frozen=True)
class FleetSpec:
    members: tuple[Member, ...]
    budget_per_hour: int | None = None
    budget_share_of_need: float | None = None
    hours: int = 1


class FleetFileError(ValueError):
    """A fleet file that cannot be read; the message names the file and the field."""


def load_fleet(path: str | Path) -> FleetSpec:
    """The fleet of the TOML file `path` (module docstring); FleetFileError naming the field."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FleetFileError(f"{path}: {exc}") from exc
    return parse_fleet(doc, str(path))


def parse_fleet(doc: dict, where: str = "fleet") -> FleetSpec:
    """`load_fleet` on a parsed document."""
    unknown = sorted(set(doc) - _TOP)
    if unknown:
        raise FleetFileError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_TOP))})")
    given = [k for k in ("budget_per_hour", "budget_share_of_need") if k in doc]
    if len(given) != 1:
        raise FleetFileError(f"{where}: give exactly one of budget_per_hour and budget_share_of_need")
    budget = doc.get("budget_per_hour")
    if budget is not None and not (isinstance(budget, int) and budget > 0):
        raise FleetFileError(f"{where}: budget_per_hour must be a positive integer, got {budget!r}")
    share = doc.get("budget_share_of_need")
    if share is not None and not (isinstance(share, (int, float)) and 0 < share):
        raise FleetFileError(f"{where}: budget_share_of_need must be > 0, got {share!r}")
    hours = doc.get("hours", 1)
    if not (isinstance(hours, int) and hours >= 1):
        raise FleetFileError(f"{where}: hours must be an integer >= 1, got {hours!r}")
    rows = doc.get("classifier")
    if not isinstance(rows, list) or not rows:
        raise FleetFileError(f"{where}: no [[classifier]] table")
    members = tuple(_member(row, f"{where}: classifier {i + 1}") for i, row in enumerate(rows))
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise FleetFileError(f"{where}: classifier names must be unique, got {names}")
    return FleetSpec(members, budget, None if share is None else float(share), hours)


def _member(row: dict, where: str) -> Member:
    unknown = sorted(set(row) - _MEMBER)
    if unknown:
        raise FleetFileError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_MEMBER))})")
    missing = sorted({"name", "population", "items_per_hour", "delta"} - set(row))
    if missing:
        raise FleetFileError(f"{where}: missing field {missing[0]!r}")
    metrics = row.get("metrics", "precision")
    names = metrics.split(",") if isinstance(metrics, str) else []
    if not names or any(m not in METRICS for m in names) or len(set(names)) != len(names):
        raise FleetFileError(f"{where}: metrics must be a comma list of {', '.join(METRICS)}, got {metrics!r}")
    known = WHOLE_BUILTIN if needs_negatives(names) else BUILTIN
    if row["population"] not in known:
        kind = "whole-stream population (its metrics need the predicted negatives)" if known is WHOLE_BUILTIN \
            else "precision population"
        raise FleetFileError(f"{where}: population must be a {kind}: one of {', '.join(known)}, "
                             f"got {row['population']!r}")
    items, delta, weight = row["items_per_hour"], row["delta"], row.get("weight", 1.0)
    if not (isinstance(items, int) and items >= 100):
        raise FleetFileError(f"{where}: items_per_hour must be an integer >= 100, got {items!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 0.5):
        raise FleetFileError(f"{where}: delta must be in (0, 0.5), got {delta!r}")
    if not (isinstance(weight, (int, float)) and weight > 0):
        raise FleetFileError(f"{where}: weight must be > 0, got {weight!r}")
    return Member(str(row["name"]), row["population"], items, float(delta), float(weight), metrics)
