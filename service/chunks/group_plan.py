"""A chunk's claim on its review group's shared budget (issue 52): pure, so that what the request
loop asks of the group can be read and tested apart from Redis (`requests.group_budget` is the
adapter).

Each step, the request loop of every classifier of a group writes each chunk it steps as a
`MemberForecast` beside the group's budget: its widest interval's half-width as it will be once
the requests out are answered, its labels counting those requests, its items, delta, room and
weight.  When the chunk has items due, the loop asks the group for labels (GRANT, atomic in the
group's slot):

* a **fixed round** (no interval yet: the warm-up; or within delta: the stopping rule's confirming
  rounds) asks for one round (two labels a stratum, `allocation.round_size`) at a time, less the
  requests it still has out, at the budget's expense, first come first served;
* any other chunk asks for its **share**: the minimax allocation of what is left of the group's
  paced budget this hour over the group's fresh forecasts (`stats.fleet.share_budget`: the next
  labels go where they lower the largest weighted ratio ``w hw / delta``, Kokan & Khan 1967 in
  minimax form), its own forecast as it is now.  A member with no interval yet is counted as hard
  as the hardest known (`as_hard_as_known`): else the first chunk with an interval would take
  what the others will claim once theirs is defined.

Every loop computes the allocation from the same forecasts, so no leader is needed; the GRANT
script alone keeps the total within the budget (docs/concepts/shared-budget.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import orjson

from ..stats import allocation, fleet
from .plan import ChunkPlan, ChunkSnapshot

#: A forecast not rewritten for this long is left out of the allocation (and deleted): its chunk is
#: finished, waits for answers without change, or its classifier lost its owner.
FORECAST_TTL_SECONDS = 300


@dataclass(frozen=True)
class MemberForecast:
    """One chunk of one classifier of a group, as the group's allocation sees it."""

    member: str  # "<classifier id>/<chunk id>"
    halfwidth: float  # the widest enabled interval once the requests out are answered (inf: none yet)
    labels: int  # labels folded plus requests out
    items: float  # the chunk's expected final size
    delta: float
    room: float  # labels it can still be given (its reservoirs' unrequested items)
    weight: float
    at_ms: int  # when its loop wrote it

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> MemberForecast:
        doc = orjson.loads(raw)  # orjson writes inf as null
        for name in ("halfwidth", "items"):
            doc[name] = float("inf") if doc[name] is None else doc[name]
        return cls(**doc)

    @property
    def fixed_round(self) -> bool:
        """No interval yet (the warm-up) or within delta (the confirming rounds): served first, not
        by the allocation, which gives nothing to either."""
        return not np.isfinite(self.halfwidth) or self.halfwidth <= self.delta


def member_name(cid: str, chunk: int) -> str:
    return f"{cid}/{chunk}"


def member_forecast(cid: str, snapshot: ChunkSnapshot, plan: ChunkPlan, cfg, now_ms: int) -> MemberForecast:
    """Chunk `snapshot` of classifier `cid` after this step's `plan`, as its group sees it: the
    requests out count as labels and the half-width is forecast past them (`fleet.halfwidth_after`)."""
    labels = int(snapshot.n.sum())
    items = max(float(snapshot.final_size), float(snapshot.N.sum()), 1.0)
    halfwidth = float(plan.halfwidth) if np.isfinite(plan.halfwidth) else float("inf")  # NaN: no interval yet
    if labels and np.isfinite(halfwidth):
        now = fleet.Forecast(np.float64(halfwidth), np.float64(labels), np.float64(items), np.float64(cfg.delta),
                             np.float64(0.0))
        halfwidth = float(fleet.halfwidth_after(now, snapshot.pending))
    room = max(0.0, float(snapshot.capacity.sum()) - labels - snapshot.pending)
    return MemberForecast(member_name(cid, snapshot.chunk), halfwidth, labels + snapshot.pending, items,
                          float(cfg.delta), room, float(cfg.review_weight), now_ms)


def fresh(forecasts: list[MemberForecast], now_ms: int) -> list[MemberForecast]:
    """The forecasts written within `FORECAST_TTL_SECONDS` of `now_ms`."""
    return [f for f in forecasts if now_ms - f.at_ms <= FORECAST_TTL_SECONDS * 1000]


def share_of(own: MemberForecast, forecasts: list[MemberForecast], left: int) -> int:
    """The labels `own` may ask of the `left` the group's budget has this hour: its share of the
    minimax allocation (`fleet.share_budget`) over `forecasts` (the fresh ones; its own replaced
    by `own`)."""
    if left <= 0:
        return 0
    members = [f for f in forecasts if f.member != own.member] + [own]
    column = lambda name: np.array([getattr(f, name) for f in members], dtype=float)  # noqa: E731
    delta = column("delta")
    group = fleet.Forecast(as_hard_as_known(column("halfwidth"), delta), np.maximum(column("labels"), 1.0),
                           column("items"), delta, column("room"), column("weight"))
    return int(fleet.share_budget(group, float(left))[-1])


def as_hard_as_known(halfwidth: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """The half-widths the allocation reads: a member without an interval gets the largest
    unweighted ratio ``hw / delta`` of the members with one, at its own delta."""
    known = np.isfinite(halfwidth)
    if not known.any():
        return halfwidth
    return np.where(known, halfwidth, np.max(halfwidth[known] / delta[known]) * delta)


def fixed_round_room(strata: int, round_labels_per_stratum: int, pending: int) -> int:
    """What a fixed round may ask now: one round (`allocation.round_size`) less the requests still out."""
    return max(0, allocation.round_size(strata, round_labels_per_stratum) - pending)


def labels_to_ask(own: MemberForecast, forecasts: list[MemberForecast], due: int, left: int, round_room: int) -> int:
    """What chunk `own` asks of its group with `due` items due and `left` labels left in the group's
    paced budget this hour: in a fixed round at most `round_room` (`fixed_round_room`), else at most
    its share (module docstring)."""
    if due <= 0 or left <= 0:
        return 0
    if own.fixed_round:
        return min(due, left, round_room)
    return min(due, share_of(own, forecasts, left))
