"""The demo's backends and its service: embedded tansu and Redis unless given, the
settings `stratameter run` gets from the demo, and the service as a subprocess (start,
wait for /readyz, stop), so the demo exercises exactly what production runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

from ..api.client import http_get
from .options import DemoOptions

Backend = TypeVar("Backend")


class DemoError(RuntimeError):
    pass


async def start_embedded(backend: Backend, what: str, err) -> Backend:
    """Start an embedded `backend` (off the event loop) and say so on `err`."""
    await asyncio.to_thread(backend.start)
    err.print(f"started an embedded {what} on {backend.address}")
    return backend


def close_keeping_log(backend, into: Path | None) -> None:
    """Stop an embedded `backend` and delete its temporary folder, its log first copied into
    `into` when given (`--keep-logs`)."""
    if into is not None:
        backend.stop()
        with contextlib.suppress(OSError):
            shutil.copy2(backend.log_path, into / backend.log_path.name)
    backend.close()


def service_env(opts: DemoOptions, bootstrap: str, redis_url: str, port: int, run_id: str, *,
                own_kafka: bool, own_redis: bool, overrides: str | None = None) -> dict[str, str]:
    """The environment of the demo's `stratameter run`.  On a broker or Redis of yours
    (not `own_*`), everything the demo writes gets run-specific names."""
    ns = "" if own_kafka else f"stratameter-demo-{run_id}."
    return {
        **os.environ,
        "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "STRATAMETER_KAFKA_CONSUMER_GROUP": f"stratameter-demo-{run_id}",
        "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "STRATAMETER_REDIS_URL": redis_url,
        "STRATAMETER_REDIS_KEY_PREFIX": "stratameter" if own_redis else f"stratameter-demo-{run_id}",
        "STRATAMETER_HTTP_HOST": "127.0.0.1",
        "STRATAMETER_HTTP_PORT": str(port),
        "STRATAMETER_TOPIC_SCORES": ns + "stratameter.scores",
        "STRATAMETER_TOPIC_LABEL_REQUESTS": ns + "stratameter.label-requests",
        "STRATAMETER_TOPIC_LABELS": ns + "stratameter.labels",
        "STRATAMETER_TOPIC_DEAD_LETTER": ns + "stratameter.dead-letter",
        "STRATAMETER_CHUNK_SECONDS": str(opts.chunk_seconds),
        # the demo's records are stamped now: a chunk closes (final interval) 2 s after its end
        "STRATAMETER_ALLOWED_LATENESS_SECONDS": "2",
        "STRATAMETER_DELTA": repr(opts.delta),
        "STRATAMETER_CONFIDENCE": repr(opts.confidence),
        "STRATAMETER_STRATA": str(opts.strata),
        "STRATAMETER_ROUND_LABELS_PER_STRATUM": str(opts.round_labels),
        "STRATAMETER_MAX_LABELS_PER_HOUR": "1000000",
        "STRATAMETER_LABEL_TIMEOUT_SECONDS": repr(opts.label_timeout),
        "STRATAMETER_INSTANCE_ID": f"demo-{run_id}",
        # per-classifier settings (the whole-stream scenarios' METRICS)
        **({"STRATAMETER_CLASSIFIERS_CONFIG_FILE": overrides} if overrides else {}),
    }


class ServiceProcess:
    """`stratameter run` (or another `command` of the CLI, such as the Label Studio bridge: `what` names
    it in messages) in its own session (a Ctrl-C in the terminal reaches only the demo), logging to
    `log_path`; `failed` once it exited early or never got ready."""

    def __init__(self, env: dict[str, str], port: int, log_path: Path, cwd: Path,
                 command: tuple[str, ...] = ("run",), what: str = "the service") -> None:
        self.env, self.port, self.log_path, self.cwd = env, port, log_path, cwd
        self.command, self.what = command, what
        self.proc: subprocess.Popen | None = None
        self.failed = False

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stratameter.cli", *self.command], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True)

    async def wait_ready(self, stop: asyncio.Event, timeout: float = 60.0) -> None:
        """Until /readyz answers 200 (or `stop` is set); DemoError if it exits or times out."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            if self.proc.poll() is not None:
                self._fail(f"{self.what} exited with code {self.proc.returncode}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                if (await http_get(self.port, "/readyz"))[0] == 200:
                    return
            if time.monotonic() > deadline:
                self._fail(f"{self.what} was not ready after {timeout:.0f}s")
            await asyncio.sleep(0.2)

    def _fail(self, what: str) -> None:
        self.failed = True  # its log is kept
        raise DemoError(f"{what}; log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds: then DemoError (its log is kept)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
            self.failed = True
            raise DemoError(f"{self.what} did not stop within {timeout:.0f}s of SIGTERM and was killed; "
                            f"log {self.log_path}") from None
