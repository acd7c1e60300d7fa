"""The wheel as a user gets it: built from the checkout, installed into a fresh virtualenv outside
it, run from a folder outside it.  A plain install runs `stratameter --help`, `run --help` and a small
`simulate`, and `backends` and `demo` say which extra they need (no traceback); with the [local]
extra, `stratameter backends` brings a broker and Redis up and, on Ctrl-C, down.

About 70 s on the 2-core machine busy with other work (load 7): the wheel, the virtualenv and the
plain install 18 s; its commands 24 s (a module compiles on its first import: `--no-compile`); each
refusal 8 s; [local] on top and backends up and down 10 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from stratameter.embedded import kafka_metadata

# one worker builds and installs the wheel once for the four tests (`make test`: --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]

ROOT = Path(__file__).resolve().parents[2]
#: What building the wheel reads: pyproject.toml names README.md (the long description) and the two folders.
SOURCES = ("pyproject.toml", "README.md", "service", "schemas")
PIP = ("-m", "pip", "--disable-pip-version-check", "--no-input")


def _env() -> dict[str, str]:
    """This environment without the checkout's virtualenv, Python path or STRATAMETER_* settings (a
    binary override would hide a missing extra)."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("STRATAMETER_")}


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, f"{out.args}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the wheel, the virtualenv's bin folder, a folder outside the checkout): the wheel built from a
    copy of the sources (the build's `build/` and egg-info stay out of the checkout) and installed
    without extras."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, work = tmp / "src", tmp / "dist", tmp / "work"
    work.mkdir()
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    _ok(_run([sys.executable, *PIP, "wheel", "--no-deps", "-w", str(dist), str(src)], work))
    (wheel,) = dist.glob("stratameter-*.whl")
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], work))
    bin_dir = tmp / "venv" / "bin"
    _ok(_run(_pip_install(bin_dir, str(wheel)), work))
    return wheel, bin_dir, work


def _pip_install(bin_dir: Path, requirement: str) -> list[str]:
    """This pip installing into the virtualenv (`--python`: no pip of its own to set up), compiling
    only what runs (`--no-compile`: numpy's and scipy's thousands of files took most of the time)."""
    return [sys.executable, *PIP, "--python", str(bin_dir / "python"), "install", "--no-compile", requirement]


def test_a_plain_install_runs_the_service_s_help_and_a_small_simulate(installed):
    _, bin_dir, work = installed
    code = ("import stratameter, stratameter.state.scripts as s; assert 'return' in s.source('INGEST'); "
            "print(stratameter.__file__)")  # the Redis scripts are package data
    where = _ok(_run([str(bin_dir / "python"), "-c", code], work))
    assert Path(where.strip()).is_relative_to(bin_dir.parent), where  # the installed copy, not the checkout
    assert "simulate" in _ok(_run([str(bin_dir / "stratameter"), "--help"], work))
    assert "stratameter config" in _ok(_run([str(bin_dir / "stratameter"), "run", "--help"], work))
    doc = json.loads(_ok(_run([str(bin_dir / "stratameter"), "simulate", "--runs", "20", "--delta", "0.05",
                               "--seed", "1", "--workers", "1", "--json"], work)))
    assert doc["runs"] == 20 and {m["method"] for m in doc["methods"]} >= {"random"}


@pytest.mark.parametrize("command", [["backends"], ["demo", "--duration", "5"]], ids=["backends", "demo"])
def test_without_the_local_extra_backends_and_demo_name_it(installed, command):
    _, bin_dir, work = installed
    if shutil.which("tansu", path=os.environ.get("PATH")):
        pytest.skip("a tansu on PATH stands in for the [local] extra")
    out = _run([str(bin_dir / "stratameter"), *command], work, timeout=60)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "[local]" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_with_the_local_extra_backends_go_up_and_down(installed):
    wheel, bin_dir, work = installed
    _ok(_run(_pip_install(bin_dir, f"{wheel}[local]"), work))
    proc = subprocess.Popen([str(bin_dir / "stratameter"), "backends", "--json"], cwd=work, env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        env = json.loads(proc.stdout.readline() or "null") or pytest.fail(proc.stderr.read())
        url = env["STRATAMETER_REDIS_URL"]
        assert redis.Redis.from_url(url).ping()
        assert kafka_metadata(env["STRATAMETER_KAFKA_BOOTSTRAP_SERVERS"])
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(30) == 0, proc.stderr.read()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
