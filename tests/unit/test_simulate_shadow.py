"""`stratameter simulate --shadow` (`simulate.shadow`): a model and its shadow on the same items,
their requests with independent and with shared priorities."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter import cli
from stratameter.simulate import shadow
from stratameter.simulate.whole_populations import whole_builtin


def test_a_stratum_s_sample_is_its_items_of_the_lowest_priority():
    """One stratum of 6 items (all predicted positive, labels 1 0 1 1 0 1), priorities chosen by
    hand: the first round takes 2 labels, the 2 lowest priorities (items 4 and 1, labels 0 0); the
    rounds go on until the stopping rule holds, every request an item of lower priority than any
    not requested."""
    sd = shadow.Side(np.zeros(6, np.int64), np.array([6]), np.array([4]), np.array([0.6]))
    y = np.array([1, 0, 1, 1, 0, 1])
    u = np.array([[0.5, 0.2, 0.9, 0.7, 0.1, 0.3]])
    run = shadow.sample(sd, y, u, delta=0.45, confidence=0.95)
    got = run.requested[0]
    assert run.labels[0] == got.sum() >= 2
    assert got[[4, 1]].all()
    if (~got).any():
        assert u[0][got].max() < u[0][~got].min()


def test_identical_models_share_every_request_and_independent_priorities_nearly_double_them():
    r = shadow.study(whole_builtin("moderation"), 0.05, 100, 0, noise=0.0)
    assert r["decisions_agree"] == 1.0
    assert r["pair_vs_larger"]["shared"] == pytest.approx(1.0)
    assert r["pair_vs_larger"]["independent"] > 1.5


@pytest.mark.slow
def test_a_shadow_shares_most_requests_and_both_estimates_cover():
    """`moderation` with a shadow (noise 0.5 on the margin, 97 % of decisions agree), delta 0.05,
    2000 runs: shared priorities need about 1.2 x the larger classifier's requests alone, against
    1.8 x with independent ones (issue 52 asks 1.05 x: the docs' page measures why this design
    cannot, `docs/concepts/shared-budget.md`); both intervals cover their chunk's precision."""
    r = shadow.study(whole_builtin("moderation"), 0.05, 2000, 1)
    assert 1.0 <= r["pair_vs_larger"]["shared"] <= 1.25 < 1.6 <= r["pair_vs_larger"]["independent"]
    assert min(r["coverage"].values()) >= 0.93, r["coverage"]


def test_the_command_refuses_a_population_without_a_threshold(capsys):
    assert cli.main(["simulate", "--shadow", "--builtin", "multiclass-confidence"]) == 2
    assert "--shadow needs a whole-stream --builtin with a threshold" in capsys.readouterr().err
