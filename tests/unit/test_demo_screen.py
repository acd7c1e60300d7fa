"""The demo's figures and live screen without running it: the random sample a whole-stream
classifier is compared with, the chunks shown (the last closed one beside the open one), no savings
for a chunk still in its pilot, and a screen that fits 80 columns with its legend."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from stratameter.demo import screen, view
from stratameter.demo.options import DemoOptions
from stratameter.demo.scenarios import SCENARIOS, GroundTruth


def test_a_whole_stream_item_s_variance_is_that_of_a_simple_random_sample():
    """`unit_variance` / n (with the finite population correction) is the variance of each metric
    over simple random samples of n items of a population on both sides of the threshold."""
    rng = np.random.default_rng(0)
    N, n = 20000, 2000
    y = rng.random(N) < 0.05
    pred = np.where(y, rng.random(N) < 0.9, rng.random(N) < 0.02)
    tp, fp, fn = (y & pred).mean(), (~y & pred).mean(), (y & ~pred).mean()
    truth = {"precision": tp / (tp + fp), "recall": tp / (tp + fn), "f1": 2 * tp / (2 * tp + fp + fn),
             "accuracy": (y == pred).mean()}
    draws = {m: [] for m in truth}
    for _ in range(2000):
        i = rng.choice(N, n, replace=False)
        t, f, m = (y[i] & pred[i]).sum(), (~y[i] & pred[i]).sum(), (y[i] & ~pred[i]).sum()
        for metric, value in (("precision", t / (t + f)), ("recall", t / (t + m)), ("f1", 2 * t / (2 * t + f + m)),
                              ("accuracy", (y[i] == pred[i]).mean())):
            draws[metric].append(value)
    metrics = {m: {"estimate": v} for m, v in truth.items()}
    for metric in truth:
        unit = view.unit_variance(metric, metrics, pred.mean())
        assert unit / n * (N - n) / (N - 1) == pytest.approx(np.var(draws[metric]), rel=0.1), metric
        # and back: the variance of n random labels is worth n random labels
        se = (unit / n * (N - n) / (N - 1)) ** 0.5
        assert view.random_equivalent_labels(truth[metric], se, N, True, unit) == pytest.approx(n)
    assert view.unit_variance("precision", {"precision": {"estimate": 0.8}}, 1.0) == pytest.approx(0.16)
    assert view.unit_variance("recall", {"recall": {"estimate": 0.8}}, 0.1) is None  # no precision: no share


def _chunk(start: str, closed: bool, status: str, labels: int, estimate: float | None, stderr: float | None):
    return {"chunk": {"start": f"2026-12-06T22:{start}.000Z", "end": ""}, "closed": closed, "status": status,
            "labels": labels, "population": 2000,
            "metrics": {"precision": {"estimate": estimate, "ci_lower": estimate and estimate - 0.05,
                                      "ci_upper": estimate and estimate + 0.05, "stderr": stderr}},
            "strata": [{"stratum": k, "side": "positive", "lower_score": 0.5 + k / 8, "upper_score": 0.625 + k / 8,
                        "items": 500, "labels": labels // 4, "precision": 0.8} for k in range(4)]}


def _starts(chunks) -> list[str | None]:
    return [c and c["chunk"]["start"][14:19] for c in chunks]


def _doc(reported: dict, *history: dict) -> dict:
    last = max((c for c in (reported, *history) if c["closed"]), key=lambda c: c["chunk"]["start"])
    return {**reported, "history": list(history), "last_closed": {"chunk": last["chunk"]}}


def test_the_last_closed_chunk_beside_the_open_one_and_no_savings_in_a_pilot():
    """Right after a switch the new chunk has a pilot's labels and a wide interval, more than a
    random sample would need: its 'saved' stays '-' until it converges; the closed chunk's stands."""
    closed = _chunk("42:00", True, "converged", 130, 0.83, 0.022)
    ended = _chunk("42:20", False, "converged", 120, 0.84, 0.023)  # ended, not closed yet (lateness)
    pilot = _chunk("42:40", False, "open", 8, 0.80, 0.15)
    # the reported chunk is still the ended one until the new one has an interval: it stays in view
    assert _starts(view.closed_and_open(_doc(ended, closed, pilot))) == ["42:00", "42:20"]
    assert _starts(view.closed_and_open(_doc(pilot, closed, ended))) == ["42:00", "42:40"]
    assert _starts(view.closed_and_open(_doc(closed))) == ["42:00", None]
    rows = [view.row(pilot, "spam-steady", lambda *a: 0.81, 20)]
    assert rows[0]["random_equivalent_labels"] < rows[0]["labels"]  # would show negative savings
    text = _printed(view.summary_table(rows, {"spam-steady": pilot}, 0.95, "open"))
    assert text.count("%") == 1 and " - open" in text, text  # the "95% CI" alone
    rows = [view.row(closed, "spam-steady", lambda *a: 0.81, 20)]
    assert "49%" in _printed(view.summary_table(rows, {"spam-steady": closed}, 0.95, "closed"))  # 1 - 130 / 255


def test_a_classifier_s_labels_are_weighed_against_the_random_sample_that_gives_every_interval():
    rows = [{"classifier": "fraud-rare", "metric": m, "estimate": 0.8, "lower": 0.75, "upper": 0.85, "truth": 0.8,
             "labels": 1000, "random_equivalent_labels": r} for m, r in (("precision", 3000.0), ("recall", 900.0),
                                                                        ("f1", 2000.0))]
    text = _printed(view.summary_table(rows, {"fraud-rare": {"closed": True, "status": "converged"}}, 0.95, "t"))
    assert "67%" in text and text.count("%") == 2, text  # 1 - 1000 / 3000, once (and the "95% CI")


def _printed(renderable, width: int = 80) -> str:
    console = Console(width=width, force_terminal=False)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def test_the_screen_fits_80_columns_with_its_legend():
    truth = GroundTruth()
    docs = {}
    for s in SCENARIOS:
        truth.add(s.classifier, 0, np.ones(10, dtype=np.int8))
        chunks = [_chunk(f"42:{20 * k:02d}", k < 2, "converged" if k < 2 else "open", 120, 0.83, 0.022)
                  for k in range(3)]
        docs[s.classifier] = _doc(chunks[2], *chunks[:2])
    demo = SimpleNamespace(opts=DemoOptions(duration=60), docs=docs, truth=truth, started=time.time() - 30,
                           ends_at=time.time() + 30, phase="streaming", answered=3000, skipped=150,
                           label_studio=None, switch_chunk=0, metrics_url="http://127.0.0.1:40000/metrics")
    text = _printed(screen.render(demo))
    assert max(len(line) for line in text.splitlines()) <= 80, text
    legend_end = next(i for i, line in enumerate(text.splitlines()) if "Ctrl-C stops" in line)
    assert legend_end < 50, text  # the legend is on a 50-line terminal, above the boundaries
    for piece in ("last closed chunk 22:42:20", "open chunk 22:42:40", "fraud-rare", "  recall", "0.62 0.75 0.88",
                  "strata boundaries"):
        assert piece in text, (piece, text)
    summary = _printed(screen.summary(demo, "summary"))
    assert "summary: the last closed chunk 22:42:20" in summary
    assert "the reported chunk 22:42:40 (the one --json reports)" in summary, summary
