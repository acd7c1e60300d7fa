"""The plan of one step of the request loop (`chunks.plan`), pure: which sides are stepped, the
labels the plan counts, and one step's evaluation, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from stratameter.chunks.plan import Side, chunk_snapshot, held_as_known, plan_chunk, sampled_sides
from stratameter.chunks.report import chunk_report
from stratameter.state.records import ChunkState


def test_a_provisional_side_is_held_beside_a_final_one():
    """A chunk with one side too small for strata yet: the other side is sampled, the provisional
    one stepped beside it held (`RequestLoop._due_by_side` never samples it); while the negatives are
    provisional and precision is enabled, the positives alone (the precision design).  Nothing
    while no side is final."""

    def side(provisional, first):
        cs = None if provisional is None else SimpleNamespace(provisional=provisional)
        return Side("c" if first == 0 else "c~negatives", cs, None, first, 0)

    cfg = SimpleNamespace(metrics="precision,recall")
    both = [side(False, 0), side(False, 4)]
    assert sampled_sides(both, cfg) == both
    assert [s.state_id for s in sampled_sides([side(False, 0), side(True, 4)], cfg)] == ["c"]
    held_positives = [side(True, 0), side(False, 4)]
    assert sampled_sides(held_positives, cfg) == held_positives
    held_negatives = [side(False, 0), side(True, 4)]
    assert sampled_sides(held_negatives, SimpleNamespace(metrics="recall")) == held_negatives
    assert sampled_sides([side(True, 0), side(True, 4)], cfg) == []
    assert sampled_sides([side(None, 0), side(True, 4)], cfg) == []
    assert sampled_sides([side(True, 0), side(None, 4)], cfg) == []
    assert sampled_sides([side(True, 0)], SimpleNamespace(metrics="precision")) == []


def test_the_plan_counts_a_held_side_as_labelled_at_its_prior():
    """`held_as_known`, by hand: the held positives' one stratum (20 items, prior 0.75) is planned
    as 20 labels with 15 positive; the sampled negatives keep their own labels."""

    held = Side("c", SimpleNamespace(provisional=True, strata=1), None, 0, 0)
    sampled = Side("c~negatives", SimpleNamespace(provisional=False, strata=2), None, 1, 0)
    N, n, h, q = np.array([20.0, 300, 200]), np.array([0.0, 8, 6]), np.array([0.0, 1, 2]), np.array([0.75, 0.01, 0.1])
    n_plan, h_plan = held_as_known([held, sampled], N, n, h, q)
    assert n_plan.tolist() == [20, 8, 6] and h_plan.tolist() == [15, 1, 2]
    final = Side("c", SimpleNamespace(provisional=False, strata=1), None, 0, 0)
    as_is = held_as_known([final, sampled], N, n, h, q)
    assert as_is[0] is n and as_is[1] is h  # nothing held: the labels as they are


def _cfg(**over):
    cfg = dict(metrics="precision", chunk_seconds=3600, allowed_lateness_seconds=300, delta=0.1, confidence=0.95,
               stop_rounds=2, round_labels_per_stratum=5, reservoir_size=1024)
    cfg.update(over)
    return SimpleNamespace(**cfg)


def _snapshot(cs: ChunkState, cfg, pending: int = 0, now_ms: int | None = None):
    now_ms = (cs.chunk * cfg.chunk_seconds + 600) * 1000 if now_ms is None else now_ms
    return chunk_snapshot(cs.chunk, [Side("c", cs, cfg, 0, pending)], cfg, now_ms)


def test_a_completed_round_is_evaluated_once_and_extends_the_streak():
    """Two strata of 1000 items, 200 labels each, no request out, the last evaluation at 0 labels: the
    round is evaluated (the report's half-width, within delta, extends the streak 1 -> 2, which
    meets STOP_ROUNDS 2); with a request out, or with the same labels evaluated already, it is not."""
    cfg = _cfg()
    cs = ChunkState(10, np.array([0.5]), np.array([1000.0, 1000]), np.array([200.0, 200]), np.array([160.0, 198]),
                    streak=1, evaluated_round=0, first_ms=36_000_000, last_ms=36_000_000 + 1)
    snapshot = _snapshot(cs, cfg)
    report = chunk_report(snapshot.columns, ["precision"], cfg.confidence, snapshot.closed)
    plan = plan_chunk(snapshot, report, np.array([0.8, 0.95]), cfg)
    assert plan.evaluated and plan.streak == 2 and plan.halfwidth == report.halfwidth
    assert 0 < report.halfwidth <= cfg.delta
    waiting = plan_chunk(_snapshot(cs, cfg, pending=1), report, np.array([0.8, 0.95]), cfg)
    assert not waiting.evaluated and waiting.streak == 1
    cs.evaluated_round = 400
    assert not plan_chunk(_snapshot(cs, cfg), report, np.array([0.8, 0.95]), cfg).evaluated


def test_the_status_follows_the_stopping_rule_and_the_budget():
    """`ChunkPlan.status`: converged once the streak meets the rule with the sample complete; an open
    chunk whose due items exceed the budget waits for it; a wide one with items due is open."""
    cfg = _cfg()
    cs = ChunkState(10, np.array([0.5]), np.array([1000.0, 1000]), np.array([200.0, 200]), np.array([160.0, 198]),
                    streak=1, first_ms=36_000_000, last_ms=36_000_001)
    snapshot = _snapshot(cs, cfg)
    report = chunk_report(snapshot.columns, ["precision"], cfg.confidence, snapshot.closed)
    plan = plan_chunk(snapshot, report, np.array([0.8, 0.95]), cfg)
    assert plan.status(snapshot, cfg, due=0, left=10, budget=5) == "converged"
    narrow = plan_chunk(snapshot, report, np.array([0.8, 0.95]), _cfg(stop_rounds=5))
    assert narrow.status(snapshot, _cfg(stop_rounds=5), due=6, left=10, budget=5) == "waiting_for_budget"
    assert narrow.status(snapshot, _cfg(stop_rounds=5), due=3, left=10, budget=5) == "open"


def test_a_round_goes_where_the_reservoirs_have_items_left():
    """Two strata of 5000 items whose arrivals have stopped; stratum 0 (half positive, the wider) has
    had every item its reservoir of 64 keeps requested: the round's labels go to stratum 1, which
    can still give them.  With reservoirs as large as the strata, stratum 0 takes its share."""
    cs = ChunkState(10, np.array([0.5]), np.array([5000.0, 5000]), np.array([64.0, 20]), np.array([32.0, 10]),
                    first_ms=36_000_000, last_ms=36_000_001)
    for size, expect_first in ((64, False), (100_000, True)):
        cfg = _cfg(delta=0.02, reservoir_size=size)
        snapshot = _snapshot(cs, cfg)
        assert not snapshot.flowing and snapshot.capacity.tolist() == [min(size, 5000)] * 2
        report = chunk_report(snapshot.columns, ["precision"], cfg.confidence, snapshot.closed)
        plan = plan_chunk(snapshot, report, np.array([0.5, 0.5]), cfg)
        assert (plan.want[0] > 0) == expect_first and plan.want[1] > 0


def test_the_snapshot_key_changes_with_what_the_design_looks_at():
    cfg = _cfg()
    cs = ChunkState(10, np.array([0.5]), np.array([1000.0, 1000]), np.array([200.0, 200]), np.array([160.0, 198]),
                    first_ms=36_000_000, last_ms=36_000_001)
    a = _snapshot(cs, cfg)
    assert a.key == _snapshot(cs, cfg).key
    assert a.key != _snapshot(cs, cfg, pending=1).key
    cs.N = np.array([1001.0, 1000])
    assert a.key != _snapshot(cs, cfg).key
    assert a.target is None and a.lead.state_id == "c"
