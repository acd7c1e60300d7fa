"""`stratameter demo` end to end, as a user runs it: a subprocess with no Kafka or
Redis configured, so it starts its own tansu broker, Redis and service.

The demo's processes are found in /proc as the descendants of the demo (pid and
start time, so a reused pid is not mistaken for one) and by a marker variable in
their environment, set only for this demo: never those of other test sessions
running on the same machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stratameter.demo.scenarios import SCENARIOS

pytestmark = pytest.mark.integration

MARKER = "STRATAMETER_DEMO_TEST_MARKER"


def _env(marker: str) -> dict[str, str]:
    # No STRATAMETER_* settings (above all no KAFKA_BOOTSTRAP_SERVERS / REDIS_URL): the demo must
    # start its own backends.  Only the binary overrides of service/embedded/ pass through.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAMETER_") or k in ("STRATAMETER_TANSU_BIN", "STRATAMETER_REDIS_SERVER")}
    env[MARKER] = marker
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack: what a demo that does not stop waits on
    return env


def _processes() -> dict[int, tuple[int, str, str, bytes]]:
    """pid -> (parent pid, start time, command line, environment) of the live processes."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z":  # a zombie is already dead
                continue
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out[int(d.name)] = (int(stat[1]), stat[19], cmdline, (d / "environ").read_bytes())
        except (OSError, IndexError, ValueError):
            continue
    return out


def _tree(marker: str, root: int) -> dict[tuple[int, str], str]:
    """(pid, start time) -> command line of the demo's processes: the descendants of `root`,
    and any process whose environment holds the marker (an orphan has lost its parent; redis
    rewrites its process title over its environment, hence both)."""
    procs = _processes()
    needle = f"{MARKER}={marker}".encode()
    found = {pid for pid, (_, _, _, env) in procs.items() if needle in env.split(b"\0")}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _, _) in procs.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    found.discard(root)
    return {(pid, procs[pid][1]): procs[pid][2] for pid in found if pid in procs}


def _alive(seen: dict[tuple[int, str], str], marker: str) -> dict[tuple[int, str], str]:
    """Those of `seen` still running (same pid and start time), and any marked process."""
    procs = _processes()
    left = {key: cmd for key, cmd in seen.items() if key[0] in procs and procs[key[0]][1] == key[1]}
    left.update(_tree(marker, -1))
    return left


def _start(args: list[str], marker: str, tmp_path: Path):
    out = open(tmp_path / "stdout", "wb")
    err = open(tmp_path / "stderr", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "stratameter.cli", "demo", *args], stdin=subprocess.DEVNULL,
                            stdout=out, stderr=err, env=_env(marker), cwd=tmp_path)
    return proc, out, err


def _wait_or_dump(proc: subprocess.Popen, timeout: float, tmp_path: Path, what: str) -> None:
    """Wait for the demo to exit; when it does not within `timeout` s, abort it (the faulthandler
    writes its threads' stacks to its stderr) and fail with the end of its stderr."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        stderr = (tmp_path / "stderr").read_text(errors="replace")
        pytest.fail(f"the demo did not exit within {timeout:.0f}s {what}; the end of its stderr:\n{stderr[-6000:]}")


def _kinds(cmdlines) -> set[str]:
    kinds = set()
    for c in cmdlines:
        if "tansu" in c:
            kinds.add("tansu")
        elif "redis-server" in c or "valkey-server" in c:
            kinds.add("redis")
        elif "stratameter.cli run" in c:
            kinds.add("service")
    return kinds


def _wait_gone(seen, marker: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while (left := _alive(seen, marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_demo_estimates_cover_truth_with_fewer_labels_than_random(tmp_path):
    """`stratameter demo --duration 60 --json`, as CI requires: scores for 50 s, the last
    10 s for the reviewers to finish the last chunk; ~67 s with start and stop.

    Coverage: 7 intervals at confidence 0.99 (four classifiers' precision; the fraud-like
    classifier's precision, recall and F1), at most one may miss.  All covering would fail a
    correct implementation in ~7% of CI runs (1 - 0.99^7); two or more misses happen by
    chance with probability ~0.2 %, so one miss is the nominal rate and two are a bug.
    Efficiency: the three informative positives-only classifiers must use fewer labels than
    a uniform random sample needs for the same variance (their Neyman gains are 0.4-0.5
    of the random variance, far from the boundary), and the whole-stream classifier fewer
    than a random sample of its whole stream needs for all three intervals (1458 against
    3801 in one run); the uninformative control has none to show and is not asserted.
    """
    marker = uuid.uuid4().hex
    proc, out, err = _start(["--duration", "60", "--json", "--confidence", "0.99"], marker,
                            tmp_path)
    seen: dict[tuple[int, str], str] = {}
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < 150:
            seen.update(_tree(marker, proc.pid))
            time.sleep(1.0)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            _wait_or_dump(proc, 30, tmp_path, "of SIGTERM (it had not ended by itself after 150 s)")
        out.close()
        err.close()
    stderr = (tmp_path / "stderr").read_text(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    assert _kinds(seen.values()) == {"tansu", "redis", "service"}, (seen, stderr[-2000:])
    assert "/metrics" in stderr  # the metrics URL was printed while it ran
    assert not (left := _wait_gone(seen, marker)), f"processes left running: {left}"

    lines = (tmp_path / "stdout").read_text().strip().splitlines()
    assert len(lines) == 1, lines
    summary = json.loads(lines[0])
    rows = {(r["classifier"], r["metric"]): r for r in summary["classifiers"]}
    assert set(rows) == {(s.classifier, m) for s in SCENARIOS for m in s.metrics}
    whole = {s.classifier for s in SCENARIOS if s.whole_stream}
    assert {m for c, m in rows if c in whole} == {"precision", "recall", "f1"}  # the fraud classifier's three
    misses = []
    for r in rows.values():
        assert set(r) == {"classifier", "metric", "estimate", "lower", "upper", "truth", "labels",
                          "random_equivalent_labels"}
        assert None not in r.values(), r  # the whole-stream classifier's random comparison too
        assert 0 <= r["lower"] <= r["estimate"] <= r["upper"] <= 1, r
        assert r["upper"] - r["lower"] < 0.3, r  # a real estimate, not a vacuous interval
        if not r["lower"] <= r["truth"] <= r["upper"]:
            misses.append(r)
    assert len(misses) <= 1, misses  # 7 intervals at 0.99: two misses happen by chance ~0.2 % of runs
    for s in SCENARIOS:
        if s.informative and not s.whole_stream:
            r = rows[(s.classifier, "precision")]
            assert 0 < r["labels"] < r["random_equivalent_labels"], r
        elif s.whole_stream:  # its labels serve every metric: against the random sample giving every interval
            ms = [rows[(s.classifier, m)] for m in s.metrics]
            assert 0 < ms[0]["labels"] < max(r["random_equivalent_labels"] for r in ms), ms


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_stops_everything_on_signal(tmp_path, sig):
    """...and deletes its logs, unless `--keep-logs` (the SIGTERM run): then the service's and the
    backends' logs are in the folder it names at the end."""
    marker = uuid.uuid4().hex
    keep = sig == signal.SIGTERM
    proc, out, err = _start(["--json"] + (["--keep-logs"] if keep else []), marker, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while "metrics:" not in (tmp_path / "stderr").read_text(errors="replace"):
            assert proc.poll() is None, (tmp_path / "stderr").read_text(errors="replace")
            assert time.monotonic() < deadline, "the demo did not start"
            time.sleep(0.2)
        time.sleep(2.0)  # traffic and reviewers running
        seen = _tree(marker, proc.pid)
        assert _kinds(seen.values()) == {"tansu", "redis", "service"}, seen
        proc.send_signal(sig)
        _wait_or_dump(proc, 40, tmp_path, f"of {sig.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()
    assert proc.returncode == 0, (tmp_path / "stderr").read_text(errors="replace")[-3000:]
    assert not (left := _wait_gone(seen, marker)), f"processes left running: {left}"
    summary = json.loads((tmp_path / "stdout").read_text().strip().splitlines()[-1])
    assert {r["classifier"] for r in summary["classifiers"]} == {s.classifier for s in SCENARIOS}
    stderr = (tmp_path / "stderr").read_text(errors="replace")
    service_log = Path(re.search(r"service log: (\S+)", stderr).group(1))
    kept = re.search(r"logs kept in (\S+):", stderr)
    assert bool(kept) == keep and service_log.exists() == keep, stderr
    if keep:
        folder = Path(kept.group(1))
        assert {p.name for p in folder.glob("*.log")} == {"service.log", "tansu-broker.log", "redis.log"}
        assert service_log.parent == folder and service_log.stat().st_size > 0  # the service wrote to it
        shutil.rmtree(folder)


def test_live_view_fits_an_80_column_terminal_without_losing_a_number():
    """Every number of the summary table stays whole at 80 columns (rich used to squeeze
    estimates to `0.8…` and drop the truth and savings columns)."""
    from rich.console import Console

    from stratameter.demo import view

    rows = [{"classifier": "toxicity-shifting", "estimate": 0.843356, "lower": 0.797849, "upper": 0.888862,
             "truth": 0.8415, "labels": 18700, "random_equivalent_labels": 22500.0}]
    docs = {"toxicity-shifting": {"chunk": {"start": "2026-11-23T19:22:30.000Z"}, "status": "converged",
                                  "strata": []}}
    console = Console(width=80, force_terminal=False)
    with console.capture() as cap:
        console.print(view.summary_table(rows, docs, 0.95, "summary"))
    text = cap.get()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    for piece in ("toxicity-shifting", "0.843", "[0.798, 0.889]", "0.842", "in", "18700", "22500", "17%",
                  "converged", "truth", "random", "saved", "status"):
        assert piece in text, (piece, text)


def test_random_equivalent_labels_use_the_interval_s_own_finite_population_correction():
    """A random sample of n' labels has the variance the service reports: with the finite
    population correction for a closed chunk, p(1-p)/n' (N-n')/(N-1) = V, and without it while
    the chunk is open, p(1-p)/n' = V, as the service's interval (`api.views.chunk_view`)."""
    from stratameter.demo.view import random_equivalent_labels

    p, N = 0.6, 2000
    for n_random in (50.0, 600.0):
        v_closed = p * (1 - p) / n_random * (N - n_random) / (N - 1)
        assert random_equivalent_labels(p, v_closed ** 0.5, N, closed=True) == pytest.approx(n_random)
        assert random_equivalent_labels(p, (p * (1 - p) / n_random) ** 0.5, N, closed=False) == pytest.approx(n_random)
    # the case it fixes: 618 labels' open-chunk variance read as a closed chunk's looked like 472
    v_open = p * (1 - p) / 618
    assert random_equivalent_labels(p, v_open ** 0.5, N, closed=True) == pytest.approx(472.3, abs=0.5)
    assert random_equivalent_labels(p, v_open ** 0.5, N, closed=False) == pytest.approx(618)
    assert random_equivalent_labels(1.0, 0.01, N) == 0.0 and random_equivalent_labels(None, 0.01, N) is None


def test_a_child_that_ignores_sigterm_is_killed_and_reported(tmp_path):
    """`ServiceProcess.stop`: SIGTERM, SIGKILL after the timeout, then a DemoError naming the
    child and its log (the demo prints it and keeps the log), never a wait without end."""
    import asyncio

    from stratameter.demo.launch import DemoError, ServiceProcess

    child = ServiceProcess(dict(os.environ), 0, tmp_path / "child.log", tmp_path, what="the stubborn child")
    child.proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                                   "time.sleep(60)"], stdout=subprocess.PIPE)
    assert child.proc.stdout.readline() == b"up\n"
    t0 = time.monotonic()
    with pytest.raises(DemoError, match="the stubborn child did not stop within 1s of SIGTERM and was killed"):
        asyncio.run(child.stop(timeout=1.0))
    assert time.monotonic() - t0 < 10
    assert child.proc.returncode == -signal.SIGKILL and child.failed


def test_a_wait_the_demo_makes_after_the_traffic_ends_the_signal_cuts_short():
    """`orchestra._until`: a producer flush that never ends (a broker taking no record) is
    cancelled once Ctrl-C sets the stop event; one that ends on an error raises it."""
    import asyncio

    from stratameter.demo.orchestra import _until

    async def scenario():
        stop = asyncio.Event()
        never = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        await asyncio.wait_for(_until(stop, never), 5)
        assert never.cancelled()

        async def fails():
            raise OSError("broker gone")

        with pytest.raises(OSError, match="broker gone"):
            await _until(asyncio.Event(), fails())

    asyncio.run(scenario())
