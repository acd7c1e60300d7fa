"""Redis: :class:`EmbeddedRedis`, a redis-server (or valkey-server) without persistence."""

from __future__ import annotations

from .binaries import redis_binary
from .probes import redis_ping
from .process import ManagedProcess


class EmbeddedRedis(ManagedProcess):
    """redis-server / valkey-server on 127.0.0.1 without persistence, in its own temp dir.

    ``restart()`` (or ``stop()`` + ``start()``) keeps the port; data does not survive it.
    Options as for ``ManagedProcess``: ``port``, ``host``, ``binary``, ``extra_args``
    (appended to the command line, e.g. ``["--appendonly", "yes"]``).
    """

    name = "redis"

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
