"""A backend child process on a fixed port: start (and wait until its probe answers),
stop (SIGTERM, then SIGKILL), restart on the same port, logs in its own temp dir.

A process still running when the interpreter exits is killed by an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Sequence

LOCALHOST = "127.0.0.1"


class BackendError(RuntimeError):
    """A backend binary is missing, or a backend process failed to start."""


def find_free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port on *host* that was free a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_LIVE: "weakref.WeakSet[ManagedProcess]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.stop(timeout=2.0)


class ManagedProcess:
    """A child process on a fixed port, logging to a file in its own temp dir."""

    name = "process"
    startup_timeout = 20.0

    def __init__(self, port: int | None = None, *, host: str = LOCALHOST, binary: str | None = None,
                 extra_args: Sequence[str] = ()):
        self.host = host
        self._port_fixed = port is not None
        self.port = port if port is not None else find_free_port(host)
        self._binary = binary
        self.extra_args = list(extra_args)  # appended to the command line
        self.workdir = Path(tempfile.mkdtemp(prefix=f"stratameter-{self.name}-"))
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None  # measured by the last start()

    # subclass API
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> bool:
        """True once the process serves requests; may raise OSError while it does not."""
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    # public API
    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    def start(self) -> "ManagedProcess":
        """Start the process (no-op when running) and wait until it serves requests."""
        if self.is_running():
            return self
        attempts = 1 if self._port_fixed else 3
        for attempt in range(attempts):
            try:
                self._spawn_and_wait()
                break
            except BackendError:
                # Port picked by find_free_port may have been taken meanwhile: retry on
                # a new one, but never when the caller chose the port or on the last try.
                if attempt == attempts - 1 or self.is_running():
                    raise
                self.port = find_free_port(self.host)
        _LIVE.add(self)
        return self

    def _spawn_and_wait(self) -> None:
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {' '.join(self._argv())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self._env(),
                start_new_session=True,  # keep terminal signals (Ctrl-C) for the parent
            )
        deadline = t0 + self.startup_timeout
        last_error: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise BackendError(
                    f"{self.name} exited with code {code} during startup on port {self.port}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if self._probe():
                    self.startup_seconds = time.monotonic() - t0
                    return
            except (OSError, struct.error, UnicodeDecodeError) as exc:
                last_error = exc
            if time.monotonic() > deadline:
                self.stop()
                raise BackendError(
                    f"{self.name} not ready after {self.startup_timeout:.0f}s on port {self.port} "
                    f"(last probe error: {last_error!r}); log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after *timeout* seconds. The port stays reserved for start()."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        _LIVE.discard(self)

    def restart(self) -> "ManagedProcess":
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the process and delete its temp dir (log included)."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        return f"<{type(self).__name__} {self.address} {state}>"
