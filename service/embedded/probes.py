"""Blocking readiness probes (no event loop): one Kafka Metadata request, one Redis PING."""

from __future__ import annotations

import socket
import struct

from .process import LOCALHOST


def split_hostport(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port``, ``[v6]:port`` or ``scheme://host:port/``."""
    address = address.strip()
    if "://" in address:
        address = address.split("://", 1)[1]
    host, _, port = address.rstrip("/").rpartition(":")
    return host.strip("[]") or LOCALHOST, int(port)


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
    host, port = split_hostport(address)
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
    host, port = split_hostport(address.split("/", 3)[2] if "://" in address else address)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return sock.recv(64).startswith(b"+PONG")
