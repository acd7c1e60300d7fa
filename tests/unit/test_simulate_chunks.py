"""`stratameter simulate --stream --chunks C --drop-at-chunk K --drop-by D` (service/simulate/chunk_*.py,
chunks_*.py): its options, the drop, the reported chunk and the window read as the service reads them,
the alert's ``for:``, and a small study's coverage and bias."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stratameter.chunks.report import StrataColumns
from stratameter.chunks.window import WindowPart, window_chunks, window_report
from stratameter.cli import main
from stratameter.simulate import populations
from stratameter.simulate.arrivals import SCENARIOS, StreamSettings, draw
from stratameter.simulate.chunk_readings import Stream, read_block
from stratameter.simulate.chunk_states import ChunkStates, draw_states, drop_scenario
from stratameter.simulate.chunk_summary import ALERT_FOR_SECONDS, ALERT_WINDOW, firing, summarise_alert
from stratameter.simulate.chunks_study import ChunksStudy, run_study
from tests.product_modules import ROOT

SHORT = StreamSettings(chunk_seconds=600.0, lateness=60.0)  # 600 items a chunk at 1 item/s


@pytest.mark.parametrize("args, option", [
    (["--chunks", "3"], "--chunks"),  # needs --stream
    (["--stream", "--drop-at-chunk", "1", "--drop-by", "0.05"], "--drop-at-chunk"),  # needs --chunks
    (["--stream", "--chunks", "0"], "--chunks"),
    (["--stream", "--chunks", "4", "--drop-at-chunk", "4", "--drop-by", "0.05"], "--drop-at-chunk"),
    (["--stream", "--chunks", "4", "--drop-at-chunk", "1"], "--drop-by"),
    (["--stream", "--chunks", "4", "--drop-at-chunk", "1", "--drop-by", "1.5"], "--drop-by"),
    (["--stream", "--chunks", "4", "--max-labels-per-hour", "100"], "--max-labels-per-hour"),
    (["--stream", "--chunks", "4", "--chunk-seconds", "45"], "--chunk-seconds"),
    (["--stream", "--chunks", "4", "--chunk-seconds", "4200"], "--chunk-seconds"),  # not a divisor of a day
    (["--stream", "--chunks", "4", "--scenario", "slow,burst"], "--scenario"),
    (["--stream", "--chunks", "4", "--scenario", "drift"], "--scenario drift"),
    (["--stream", "--chunks", "4", "--calibration"], "--calibration"),
    (["--stream", "--chunks", "4", "--trace"], "--trace"),
    (["--stream", "--chunks", "4", "--builtin", "flat", "--drop-at-chunk", "1", "--drop-by", "0.7"], "--drop-by"),
])
def test_bad_chunk_options_exit_2_naming_the_option(capsys, args, option):
    assert main(["simulate", *args, "--runs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stratameter simulate: error:") and option in err, err


def test_the_options_reach_the_study(capsys):
    """Two 600 s chunks (a day's window is 144 of them), the second one's precision 0.05 lower."""
    assert main(["simulate", "--stream", "--chunks", "2", "--drop-at-chunk", "1", "--drop-by", "0.05",
                 "--chunk-seconds", "600", "--lateness", "60", "--runs", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["mode"], doc["chunks"], doc["drop_at_chunk"], doc["drop_by"], doc["runs"]) == (
        "stream-chunks", 2, 1, 0.05, 2)
    assert (doc["window_chunks"], doc["scrape_seconds"], doc["alert_for_seconds"]) == (144, 30.0, 900)
    assert [a["slo_offset"] for a in doc["alerts"]] == [0.01, 0.01, 0.0, 0.0]


def _all_positive(n: int = 1000) -> populations.Population:
    rng = np.random.default_rng(0)
    return populations.Population("all-positive", rng.uniform(0.5, 1.0, n), np.ones(n, dtype=np.int8))


def test_the_drop_lowers_a_chunks_precision_by_d_over_the_whole_chunk():
    """By hand: a classifier whose every positive is right (precision 1) dropped by 0.25 relabels each
    positive negative with probability 0.25 / 1, so a dropped chunk's precision is 0.75 on average
    (400 chunks of about 600 items: s.e. 0.0009); chunks before the drop stay at 1 exactly.  The
    drift scenario still drops only the second half of its chunk."""
    pop = _all_positive()
    dropped = draw(pop, drop_scenario(SCENARIOS["slow"], 0.25), SHORT, 400, np.random.default_rng(1))
    assert abs(float(dropped.truth.mean()) - 0.75) < 0.005
    kept = draw(pop, SCENARIOS["slow"], SHORT, 20, np.random.default_rng(2))
    assert np.all(kept.truth == 1.0)
    drift = draw(pop, SCENARIOS["drift"], SHORT, 50, np.random.default_rng(3))
    arrived = np.isfinite(drift.a)
    first_half = arrived & (drift.a < 300.0)
    assert np.all(drift.y[first_half] == 1) and 0.7 < drift.y[arrived & ~first_half].mean() < 0.9


def test_states_lay_chunks_out_chunk_by_chunk_with_the_drop_from_chunk_k():
    states = draw_states(_all_positive(), SCENARIOS["slow"], SHORT, 3, 4, 2, 0.25, 30.0, np.random.default_rng(4))
    truth = states.truth.reshape(4, 3)  # chunk i of run b at i * runs + b
    assert np.all(truth[:2] == 1.0) and np.all(truth[2:] < 0.9)
    assert states.N.shape[1:] == (12, 4) and states.closed[-1] and not states.closed[1]
    assert np.all(states.N[0] == 0) and np.array_equal(states.N[-1].sum(axis=1) * states.truth, states.G[-1])


def _hand_states(upper: np.ndarray) -> ChunkStates:
    slots, chunks = upper.shape
    zero = np.zeros((slots, chunks, 1))
    return ChunkStates(30.0, zero, zero, zero, zero[..., 0], np.arange(slots) >= 3, np.full(chunks, 90.0),
                       np.ones(chunks, bool), np.ones(chunks), upper=upper, lower=upper - 0.1)


def test_the_reported_chunk_is_the_newest_once_its_interval_exists_by_hand():
    """One run of three 60 s chunks read every 30 s (two readings a chunk), slots: its start, its two
    readings, its end.  Chunk 1 has no interval at its first reading (t = 90 s) and chunk 2 has one from
    its first (t = 150 s): the gauges report chunk 0 until t = 90 s, chunk 1 at 120 s, chunk 2 after;
    a window of two chunks pools the reported one and the one before it."""
    nan = np.nan
    upper = np.array([[nan, nan, nan],   # slot 0: a chunk's start, nothing
                      [nan, nan, 0.9],   # its first reading
                      [0.9, 0.9, 0.9],   # its second
                      [0.9, 0.9, 0.9]])  # its end
    stream = Stream(_hand_states(upper), runs=1, chunks=3, chunk_readings=2, length=2, lateness_readings=1.0)
    g = np.arange(1, 7)[None, :]  # t = 30, 60, ..., 180 s
    assert stream.reported(g).tolist() == [[0, 0, 0, 1, 2, 2]]


def test_read_block_is_window_report_over_window_chunks_at_every_reading():
    """Every reading of a small stream, against the service's path computed one reading at a time:
    the reported chunk, `window_chunks`, `window_report` over their states at that moment; the last
    closed chunk's interval as its state gives it."""
    pop = populations.builtin("calibrated")
    runs, chunks, length, P = 2, 4, 3, 20
    states = draw_states(pop, SCENARIOS["slow"], SHORT, runs, chunks, 2, 0.05, 30.0, np.random.default_rng(5))
    r = read_block(Stream(states, runs, chunks, P, length, 2.0), 0.95)
    for b in range(runs):
        for g in range(1, chunks * P + 1):
            slot = lambda i: min(g - i * P, states.slots - 1)  # noqa: E731
            started = [i for i in range(chunks) if i * P <= g]
            shows = [np.isfinite(states.upper[slot(i), i * runs + b]) for i in started]
            rep = started[-2] if len(started) > 1 and not shows[-1] and shows[-2] else started[-1]
            parts = [WindowPart(i, StrataColumns(states.N[slot(i), i * runs + b], states.n[slot(i), i * runs + b],
                                                 states.h[slot(i), i * runs + b], np.ones(4, bool)),
                                bool(states.closed[slot(i)])) for i in window_chunks(rep, started, length)]
            iv = window_report(parts, ["precision"], 0.95).intervals["precision"]
            assert r.window.upper[b, g - 1] == pytest.approx(float(iv.upper), abs=1e-6, nan_ok=True)
            closed = [i for i in started if g - i * P >= P + 2]
            want = states.upper[slot(closed[-1]), closed[-1] * runs + b] if closed else np.nan
            assert r.last_closed.upper[b, g - 1] == pytest.approx(want, abs=1e-6, nan_ok=True)


def test_the_alert_fires_after_its_for_by_hand():
    """`for: 15m` read every 30 s: pending from the first true reading, firing 30 readings (15 min)
    later, so 31 true readings in a row; a false reading resets it."""
    cond = np.array([[True] * 30 + [False] + [True] * 31 + [False]])
    fires = firing(cond, 30)
    assert np.flatnonzero(fires[0]).tolist() == [61]
    seconds = (np.arange(cond.shape[1]) + 1) * 30.0
    upper = np.where(cond, 0.85, 0.95)
    a = summarise_alert("window", upper, np.ones_like(cond), np.ones_like(cond), seconds, 0.9, 0.0, 30.0,
                        drop_seconds=32 * 30.0)  # the drop at the second run's first true reading
    assert a.fired == 1.0 and a.hours_mean == pytest.approx(30 * 30.0 / 3600)  # 15 minutes
    assert a.false_alarms == 0 and a.days == pytest.approx(31 * 30.0 / 86400)  # the 31 readings before it


def test_the_alert_constants_are_the_charts_defaults():
    values = (ROOT / "helm" / "stratameter" / "values.yaml").read_text()
    slo = values[values.index("  precisionSLO:"):values.index("  recallSLO:")]
    assert f'window: "{ALERT_WINDOW}"' in slo and f"for: {ALERT_FOR_SECONDS // 60}m" in slo


@pytest.mark.slow
def test_a_drop_study_covers_and_is_unbiased():
    """240 runs of six one-hour chunks (seed 3), the precision 0.05 lower from chunk 3 on: about 1200
    closed chunks (coverage s.e. about 0.006) and 240 runs' windows (clustered s.e. of the bias about
    0.0004).  The last closed chunk's interval covers 0.943 on this population (its per-chunk
    interval, docs/development/label-efficiency.md): 0.925 is three s.e. under it, while an
    interval of the wrong chunk (its truth off by the drop) or read from the wrong moment would
    cover far less (half the chunks are dropped: a truth an hour off misses by 0.05 there).  The
    window (at most six chunks here, open: no finite population correction) must cover at least
    0.93, five s.e. under nominal.  Bias within 0.003 plus 3 clustered s.e. (about 0.004): the
    estimator's own first-order bias is removed (`estimator.adaptive_bias_corrected`), what is left is
    an order smaller, while a window pooling the wrong chunks around the drop is off by 0.05 / 6 per
    chunk misplaced.  About 15 CPU seconds."""
    study = ChunksStudy(populations.builtin("calibrated"), "slow", StreamSettings(), 240, 6, 3, 0.05, 3)
    r = run_study(study, workers=1)
    assert r.last_closed.coverage.mean >= 0.925 and r.window.coverage.mean >= 0.93
    for series in (r.window, r.last_closed):
        assert abs(series.bias.mean) <= 0.003 + 3 * series.bias.se
    window = {(a.alert, a.slo_offset): a for a in r.alerts}[("window", 0.0)]
    assert window.fired > 0.9  # a classifier 0.05 under its SLO for three hours is seen
