"""Tests of `stratameter peers` (service/simulate/peers.py, peers_command.py): the Platt fit and the
PPI++ wrapper against hand computations and ``ppi_py`` itself, the command end to end, and the
message when the [peers] extra is missing."""

from __future__ import annotations

import functools
import json
import math
import sys

import numpy as np
import pytest

from stratameter.cli import main


def test_platt_fit_hand_case():
    from stratameter.simulate.peers import platt_fit

    # two score values, a saturated model: at x = -1 one positive of 2, at x = +1 three of 4, so
    # a - b = logit(1/2) = 0 and a + b = logit(3/4) = ln 3: a = b = ln(3) / 2 (ridge ~ 0)
    x = np.array([[-1.0, -1.0, 1.0, 1.0, 1.0, 1.0]])
    y = np.array([[0.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    assert platt_fit(x, y, ridge=1e-12)[0] == pytest.approx([math.log(3) / 2] * 2, abs=1e-9)
    # with the ridge: the penalised score equations hold, row by row; labels that all agree stay finite
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 50))
    y = (rng.random((3, 50)) < 1 / (1 + np.exp(-(0.5 + 2 * x)))).astype(float)
    y[2] = 1.0
    theta = platt_fit(x, y, ridge=0.1)
    p = 1 / (1 + np.exp(-(theta[:, :1] + theta[:, 1:] * x)))
    assert np.allclose(((p - y)).sum(1) + 0.1 * theta[:, 0], 0, atol=1e-8)
    assert np.allclose(((p - y) * x).sum(1) + 0.1 * theta[:, 1], 0, atol=1e-8)
    assert np.all(np.isfinite(theta)) and theta[2, 0] > 3


@pytest.mark.slow
def test_ppi_plus_plus_hand_case():
    pytest.importorskip("ppi_py")
    from stratameter.simulate.peers import ppi_plus_plus

    Y = np.array([1.0, 0.0, 1.0, 1.0])
    F = np.array([0.8, 0.5, 0.6, 0.9])
    U = np.array([0.8, 0.3, 0.5, 0.9, 0.6, 0.4])
    # power tuning (n = 4, N = 6): lam = cov_n(Y, F) / ((1 + n/N) var_{N+n-1}(F and U))
    #   cov_n = (.25*.1 + .75*.2 - .25*.1 + .25*.2) / 4 = 0.05, var = 0.401 / 9
    lam = 0.05 / ((1 + 4 / 6) * 0.401 / 9)
    assert lam == pytest.approx(0.673317, abs=1e-6)
    est = 0.75 + lam * (U.mean() - 0.7)  # lam mean(U) + mean(Y - lam F)
    se = math.sqrt((lam * U).var() / 6 + (Y - lam * F).var() / 4)
    got = ppi_plus_plus(Y[:, None], F[:, None], U[:, None])
    assert [g[0] for g in got] == pytest.approx([est, est - 1.959964 * se, est + 1.959964 * se], abs=1e-6)
    assert est == pytest.approx(0.671446, abs=1e-6)


@pytest.mark.slow
def test_ppi_plus_plus_batched_equals_ppi_py_per_run():
    ppi_py = pytest.importorskip("ppi_py")
    from stratameter.simulate.peers import ppi_plus_plus

    rng = np.random.default_rng(11)
    runs, n, N = 5, 40, 300
    Yhat_u = rng.random((N, runs))
    Yhat = rng.random((n, runs))
    Y = (rng.random((n, runs)) < Yhat).astype(float)
    est, lower, upper = ppi_plus_plus(Y, Yhat, Yhat_u, 0.9)
    for j in range(runs):
        e = ppi_py.ppi_mean_pointestimate(Y[:, j], Yhat[:, j], Yhat_u[:, j], lam=None)
        lo, hi = ppi_py.ppi_mean_ci(Y[:, j], Yhat[:, j], Yhat_u[:, j], alpha=0.1, lam=None)
        assert [est[j], lower[j], upper[j]] == pytest.approx([float(np.squeeze(v)) for v in (e, lo, hi)],
                                                             abs=1e-12)


def test_command_end_to_end(monkeypatch, capsys):
    pytest.importorskip("ppi_py")
    from stratameter.simulate import peers_command, populations

    # the steep built-in at 20,000 items: PPI++'s cost is its passes over every item's prediction
    monkeypatch.setattr(peers_command, "builtin", functools.partial(populations.builtin, size=20_000))
    assert main(["peers", "--builtin", "steep", "--budget", "200,50", "--runs", "200", "--seed", "3",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["population"] == "steep" and doc["size"] == 20_000 and doc["budgets"] == [50, 200]
    rows = {(r["method"], r["budget"]): r for r in doc["rows"]}
    assert set(rows) == {(m, b) for m in ("default", "random", "ppi++") for b in (50, 200)}
    for (method, budget), r in rows.items():
        assert r["runs"] == 200 and r["no_estimate"] == 0
        assert 0.8 <= r["coverage"] <= 1 and r["width"] > 0 and r["mse_ratio_se"] > 0
        assert (r["diff_vs_ppi"] is None) == (method == "ppi++")
        if method == "random":  # SRS with replacement: MSE = p(1-p)/n exactly in expectation (s.e. ~0.1 here)
            assert 0.6 < r["mse_ratio"] < 1.5
        if method == "default":
            ppi = rows["ppi++", budget]
            assert r["diff_vs_ppi"] == pytest.approx(r["mse_ratio"] - ppi["mse_ratio"])
            assert r["diff_vs_ppi_se"] == pytest.approx(math.hypot(r["mse_ratio_se"], ppi["mse_ratio_se"]))
    # on steep the score carries most of the signal: both use it and beat random
    assert rows["default", 200]["mse_ratio"] < 0.8 and rows["ppi++", 200]["mse_ratio"] < 0.8


def test_missing_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ppi_py", None)  # `import ppi_py` raises ImportError
    assert main(["peers", "--builtin", "steep", "--runs", "10"]) == 2
    assert "stratameter peers needs the [peers] extra: pip install 'stratameter[peers]'" in capsys.readouterr().err


def test_bad_budget(capsys):
    pytest.importorskip("ppi_py")
    assert main(["peers", "--budget", "100,x"]) == 2
    assert "--budget" in capsys.readouterr().err
