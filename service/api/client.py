"""The HTTP GET client stratameter's own tools use (demo, soak, tests) to read the
service's JSON API and /metrics: one request per connection, no dependency."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


async def http_get(port: int, path: str, host: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, bytes]:
    """GET `path`; (status, body).  Raises OSError when nothing answers within `timeout`."""
    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        if not head:
            raise OSError(f"empty response from {host}:{port}{path}")
        return int(head.split(b" ")[1]), body

    try:
        return await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        raise OSError(f"no answer from {host}:{port}{path} within {timeout}s") from None


async def http_json(port: int, path: str, host: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, Any]:
    """GET `path` and decode a 200's JSON body; (0, None) when nothing listens (a stopped instance)."""
    try:
        status, body = await http_get(port, path, host, timeout)
    except (OSError, IndexError, ValueError):
        return 0, None
    return status, (orjson.loads(body) if body and status == 200 else None)
