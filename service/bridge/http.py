"""The bridge's HTTP endpoints (one port, `STRATAMETER_BRIDGE_HTTP_HOST` / `_PORT`), in the manner of
`stratameter.api.http` (asyncio streams, one request per connection):

  POST /webhook   Label Studio's webhook (ANNOTATION_CREATED, ANNOTATION_UPDATED): 200 at once, the
                  task is read back and forwarded by a worker; 400 with a reason (and
                  stratameter_bridge_webhook_errors_total) for a body that is not a webhook
  GET  /metrics   Prometheus text exposition
  GET  /healthz   the process is alive
  GET  /readyz    Kafka, Redis and Label Studio answered recently (503 otherwise)
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..api.http import _error, _response, serve_http
from . import gauges

log = logging.getLogger(__name__)

#: a webhook body carries the annotation, the task and the project (with its labelling config)
MAX_WEBHOOK_BYTES = 4 << 20
WEBHOOK_PATH = "/webhook"


async def _webhook(bridge, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    length = headers.get("content-length", "")
    if "transfer-encoding" in headers or not length.isdigit():
        bridge.metrics.webhook_errors.labels("bad_request").inc()
        return _error(400, "a webhook needs a Content-Length body (no chunked encoding)")
    if int(length) > MAX_WEBHOOK_BYTES:
        bridge.metrics.webhook_errors.labels("too_large").inc()
        return _error(400, f"the body is larger than {MAX_WEBHOOK_BYTES} bytes")
    body = await asyncio.wait_for(reader.readexactly(int(length)), 10)
    status, doc = bridge.answers.webhook(body)
    return _response(status, orjson.dumps(doc))


async def route(bridge, method: str, path: str, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if path == WEBHOOK_PATH:
        if method != "POST":
            return _error(405, "POST a Label Studio webhook here")
        return await _webhook(bridge, reader, headers)
    if method != "GET":
        return _error(405, "only GET is supported here")
    if path == "/healthz":
        return _response(200, b'{"status":"ok"}')
    if path == "/readyz":
        ok = bridge.ready()
        return _response(200 if ok else 503, orjson.dumps({"ready": ok, **bridge.readiness()}))
    if path == "/metrics":
        await gauges.refresh(bridge)
        return _response(200, generate_latest(bridge.metrics.registry), CONTENT_TYPE_LATEST)
    return _error(404, "not found")


async def serve(bridge, host: str, port: int) -> asyncio.base_events.Server:
    return await serve_http(lambda method, path, reader, headers: route(bridge, method, path, reader, headers),
                            host, port, (500, "internal error"))
