"""A small asyncio HTTP/1.1 server for GET endpoints (no web framework needed):

  /metrics                  Prometheus text exposition (computed at scrape time)
  /healthz                  the process is alive
  /readyz                   Kafka and Redis reachable recently (503 otherwise)
  /v1/classifiers           JSON list of classifier ids
  /v1/classifiers/{id}      JSON estimate, interval, strata and history
  /v1/review-groups         JSON list of the review groups with a shared label budget (`review_groups`)
  /v1/review-groups/{group} JSON of one: its budget, granted this hour, remaining, classifiers
  /                         the status page: every classifier (HTML)
  /classifiers/{id}         the status page of one classifier (HTML)
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import unquote

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from stratameter.schemas.messages import CLASSIFIER_ID_RULE, is_classifier_id

from . import page, review_groups, views

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
HTML = "text/html; charset=utf-8"


def _response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
              503: "Service Unavailable"}[status]
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


def _error(status: int, message: str) -> bytes:
    return _response(status, orjson.dumps({"error": message}))


async def route(service, method: str, path: str) -> bytes:
    if method != "GET":
        return _error(405, "only GET is supported")
    path = path.split("?", 1)[0]
    if path == "/healthz":
        return _response(200, b'{"status":"ok"}')
    if path == "/readyz":
        ok = service.ready()
        return _response(200 if ok else 503, orjson.dumps({"ready": ok}))
    if path == "/metrics":
        return _response(200, await service.render_metrics(), CONTENT_TYPE_LATEST)
    if path == "/v1/classifiers":
        return _response(200, orjson.dumps(await service.store.registry.classifiers()))
    if path.startswith("/v1/classifiers/"):
        cid = unquote(path[len("/v1/classifiers/"):])
        if not is_classifier_id(cid):
            return _error(400, f"classifier id must be {CLASSIFIER_ID_RULE}")
        doc = await _classifier_doc(service, cid, await _budgets(service))
        if doc is None:
            return _error(404, f"unknown classifier {cid!r}")
        return _response(200, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY, default=float))
    if path == "/v1/review-groups" or path.startswith("/v1/review-groups/"):
        return await _review_groups(service, path)
    if path == "/" or path.startswith("/classifiers/"):
        return await _page(service, path)
    return _error(404, "not found")


async def _budgets(service) -> dict[str, review_groups.GroupBudget]:
    """The review groups' budgets now (one read a group with a shared budget)."""
    return await review_groups.group_budgets(service.store.groups, service.settings, int(time.time() * 1000))


async def _classifier_doc(service, cid: str, budgets: dict, history: bool = True) -> dict | None:
    """`views.classifier_view` of `cid`, with its review group's budget (`budgets`)."""
    return await views.classifier_view(service.store.chunks, service.process, cid, service.settings.for_classifier(cid),
                                       history=history,
                                       group=review_groups.member_budget(budgets, service.settings, cid))


async def _review_groups(service, path: str) -> bytes:
    """``/v1/review-groups`` (every group's document) or ``/v1/review-groups/{group}`` (one; 404 for
    a group with no shared budget)."""
    budgets = await _budgets(service)
    name = unquote(path[len("/v1/review-groups/"):]) if path.startswith("/v1/review-groups/") else None
    if name is not None and name not in budgets:
        return _error(404, f"no review group {name!r} with a shared budget")
    if name is not None:
        budgets = {name: budgets[name]}
    docs = review_groups.group_docs(budgets, service.settings, await service.store.registry.classifiers())
    return _response(200, orjson.dumps(docs if name is None else docs[0]))


async def _page(service, path: str) -> bytes:
    """The status page (`page`): the overview at ``/``, one classifier at ``/classifiers/{id}``."""
    budgets = await _budgets(service)
    if path == "/":
        ids = sorted(await service.store.registry.classifiers())
        docs = [await _classifier_doc(service, cid, budgets, history=False) for cid in ids[:page.OVERVIEW_LIMIT]]
        groups = review_groups.group_docs(budgets, service.settings, ids)
        return _response(200, page.overview_page([d for d in docs if d is not None], len(ids), groups).encode(), HTML)
    cid = unquote(path[len("/classifiers/"):])
    doc = None
    if is_classifier_id(cid):
        doc = await _classifier_doc(service, cid, budgets)
    if doc is None:
        return _error(404, f"unknown classifier {cid!r}")
    return _response(200, page.classifier_page(doc).encode(), HTML)


async def serve(service, host: str, port: int) -> asyncio.base_events.Server:
    """The service's endpoints on `host`:`port` (a failed request, e.g. Redis down during a
    scrape, answers 503)."""
    return await serve_http(lambda method, path, reader, headers: route(service, method, path), host, port,
                            (503, "state store unavailable"))


def request_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """``(method, path without the query, headers by lower-case name)`` of a request head."""
    lines = head.decode("latin-1").split("\r\n")
    method, path, *_ = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, path.split("?", 1)[0], headers


async def serve_http(route_request, host: str, port: int, failure: tuple[int, str]) -> asyncio.base_events.Server:
    """A server of one request per connection: `route_request(method, path, reader, headers)`
    returns the whole response (it may read a body from `reader`); a request it fails on gets
    the `failure` status and message, logged, and never stops the server.  A head over
    `MAX_REQUEST_BYTES`, or not complete within 10 s, gets 400 or a closed connection."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            if len(head) > MAX_REQUEST_BYTES:
                writer.write(_error(400, "request head too large"))
            else:
                method, path, headers = request_head(head)
                try:
                    writer.write(await route_request(method, path, reader, headers))
                except (asyncio.IncompleteReadError, asyncio.TimeoutError):
                    raise
                except Exception as exc:  # noqa: BLE001 - nothing a request sends stops the server
                    log.warning("request %s %s failed: %r", method, path, exc)
                    writer.write(_error(*failure))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=MAX_REQUEST_BYTES)
