"""Label Studio's REST API, as far as the bridge uses it (httpx, async).

Calls: ``GET /api/current-user/whoami`` (the token), ``GET/POST /api/projects`` (find or create the
project), ``GET/POST/PATCH/DELETE /api/webhooks/`` (the project's webhook), ``POST /api/tasks``
(one task per label request), ``GET /api/tasks/{id}`` (a task with its annotations),
``GET /api/tasks?project=..&query=..`` (many tasks by id, or the task holding a request id),
``DELETE /api/tasks/{id}`` (an expired request's task), ``GET /api/users/{id}`` (the annotator's
e-mail, cached).

Tokens: a legacy API token is sent as ``Authorization: Token <t>``; a personal access token (a
JWT, Label Studio's default since 1.18) is exchanged at ``POST /api/token/refresh`` for a short-lived
access token sent as ``Bearer``, renewed when it is refused.

Errors: `LabelStudioError` (HTTP status and Label Studio's ``detail``); `transient` says whether a retry
can help (no answer, a timeout, 429, 5xx), and the message never holds the token.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any
from urllib.parse import quote

import httpx
import orjson

log = logging.getLogger(__name__)

#: seconds for one call; Label Studio answers the bridge's calls in milliseconds on a small project
TIMEOUT_S = 30.0
#: tasks asked for in one ``GET /api/tasks`` by id (the query string stays well under 8 KiB)
TASKS_PER_QUERY = 100
USERS_CACHED = 1024


class LabelStudioError(RuntimeError):
    """A call to Label Studio failed: `status` (0: no answer), `transient` (a retry may help)."""

    def __init__(self, message: str, status: int = 0, transient: bool = False) -> None:
        super().__init__(message)
        self.status, self.transient = status, transient


def _is_jwt(token: str) -> bool:
    parts = token.split(".")
    return len(parts) == 3 and all(parts) and token.startswith("eyJ")


class LabelStudio:
    """A client of one Label Studio at `url` with API `token` (legacy token or personal access token)."""

    def __init__(self, url: str, token: str, timeout: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._jwt = _is_jwt(token)
        self._access: str | None = None
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, follow_redirects=False,
                                       headers={"Accept": "application/json"})
        self._users: OrderedDict[int, str] = OrderedDict()
        self._refreshing = asyncio.Lock()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---- plumbing ------------------------------------------------------------------------
    async def _auth(self, renew: bool = False) -> dict[str, str]:
        if not self._jwt:
            return {"Authorization": f"Token {self._token}"}
        async with self._refreshing:
            if self._access is None or renew:
                r = await self._send("POST", "/api/token/refresh", {}, json={"refresh": self._token})
                if r.status_code != 200:
                    raise self._error("POST /api/token/refresh", r)
                self._access = r.json().get("access")
                if not isinstance(self._access, str):
                    raise LabelStudioError("POST /api/token/refresh answered no access token", r.status_code)
        return {"Authorization": f"Bearer {self._access}"}

    async def _send(self, method: str, path: str, headers: dict[str, str], **kw: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, headers=headers, **kw)
        except httpx.TimeoutException as exc:
            raise LabelStudioError(f"{method} {self.url}{path}: no answer within {self._http.timeout.read}s "
                                   f"({type(exc).__name__})", 0, True) from None
        except httpx.HTTPError as exc:
            raise LabelStudioError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc or 'no answer'}",
                                   0, True) from None

    async def call(self, method: str, path: str, ok: tuple[int, ...] = (200, 201, 204), **kw: Any) -> Any:
        """`method` `path`; the decoded JSON body (None when empty).  Raises `LabelStudioError`
        when the status is not in `ok`."""
        r = await self._send(method, path, await self._auth(), **kw)
        if r.status_code == 401 and self._jwt:  # the access token expired: renew it once
            r = await self._send(method, path, await self._auth(renew=True), **kw)
        if r.status_code not in ok:
            raise self._error(f"{method} {path}", r)
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise LabelStudioError(f"{method} {self.url}{path} answered {r.status_code} with a body that is not "
                                   f"JSON: {r.text[:200]!r} (is this Label Studio?)", r.status_code) from None

    def _error(self, what: str, r: httpx.Response) -> LabelStudioError:
        detail = r.text[:300]
        try:
            doc = r.json()
            if isinstance(doc, dict):
                detail = " ".join(str(doc[k]) for k in ("detail", "validation_errors") if doc.get(k))[:300] \
                    or str(doc)[:300]
        except ValueError:
            pass
        transient = r.status_code == 429 or r.status_code >= 500
        return LabelStudioError(f"{what} at {self.url}: HTTP {r.status_code}: {detail}", r.status_code, transient)

    # ---- the calls ------------------------------------------------------------------------
    async def whoami(self) -> dict:
        return await self.call("GET", "/api/current-user/whoami")

    async def project(self, project_id: int) -> dict | None:
        """The project, None when there is none with that id."""
        try:
            return await self.call("GET", f"/api/projects/{project_id}")
        except LabelStudioError as exc:
            if exc.status == 404:
                return None
            raise

    async def projects_titled(self, title: str) -> list[dict]:
        """Every project whose title is exactly `title`, lowest id first."""
        out, page = [], 1
        while True:
            doc = await self.call("GET", "/api/projects", params={"title": title, "page": page, "page_size": 100})
            results = doc.get("results", []) if isinstance(doc, dict) else doc
            out += [p for p in results if p.get("title") == title]
            if not isinstance(doc, dict) or not doc.get("next"):
                return sorted(out, key=lambda p: p["id"])
            page += 1

    async def create_project(self, title: str, label_config: str, description: str) -> dict:
        return await self.call("POST", "/api/projects", json={
            "title": title, "label_config": label_config, "description": description,
            "show_skip_button": True, "maximum_annotations": 1})

    async def delete_project(self, project_id: int) -> None:
        await self.call("DELETE", f"/api/projects/{project_id}", ok=(200, 204, 404))

    async def webhooks(self, project_id: int) -> list[dict]:
        doc = await self.call("GET", "/api/webhooks/", params={"project": project_id})
        return sorted((w for w in doc if w.get("project") == project_id), key=lambda w: w["id"])

    async def create_webhook(self, project_id: int, url: str, actions: list[str]) -> dict:
        return await self.call("POST", "/api/webhooks/", json={
            "project": project_id, "url": url, "send_payload": True, "send_for_all_actions": False,
            "is_active": True, "actions": actions})

    async def update_webhook(self, webhook_id: int, actions: list[str]) -> dict:
        return await self.call("PATCH", f"/api/webhooks/{webhook_id}/", json={
            "send_payload": True, "send_for_all_actions": False, "is_active": True, "actions": actions})

    async def delete_webhook(self, webhook_id: int) -> None:
        await self.call("DELETE", f"/api/webhooks/{webhook_id}/", ok=(200, 204, 404))

    async def create_task(self, project_id: int, data: dict, meta: dict) -> int:
        doc = await self.call("POST", "/api/tasks", json={"project": project_id, "data": data, "meta": meta})
        return int(doc["id"])

    async def task(self, task_id: int) -> dict | None:
        """The task with its annotations, None when it does not exist (any more)."""
        try:
            return await self.call("GET", f"/api/tasks/{task_id}")
        except LabelStudioError as exc:
            if exc.status == 404:
                return None
            raise

    async def tasks(self, project_id: int, task_ids: list[int]) -> list[dict]:
        """The tasks of `project_id` among `task_ids` (at most `TASKS_PER_QUERY`), with their annotations."""
        query = orjson.dumps({"selectedItems": {"all": False, "included": [int(t) for t in task_ids]}}).decode()
        return await self._task_list(project_id, query, len(task_ids))

    async def tasks_of_request(self, project_id: int, request_id: str) -> list[dict]:
        """The tasks of `project_id` whose meta holds `request_id` (Label Studio's filter is a substring
        match on the meta's text; the caller checks ``meta.request_id``)."""
        query = orjson.dumps({"filters": {"conjunction": "and", "items": [
            {"filter": "filter:tasks:meta", "operator": "contains", "type": "String", "value": request_id}]}}).decode()
        return await self._task_list(project_id, query, TASKS_PER_QUERY)

    async def _task_list(self, project_id: int, query: str, size: int) -> list[dict]:
        doc = await self.call("GET", f"/api/tasks?project={int(project_id)}&fields=all&page_size={max(1, size)}"
                                     f"&query={quote(query)}")
        tasks = doc.get("tasks", []) if isinstance(doc, dict) else doc
        return [t for t in tasks if isinstance(t, dict)]

    async def delete_task(self, task_id: int) -> None:
        await self.call("DELETE", f"/api/tasks/{task_id}", ok=(200, 204, 404))

    async def user_email(self, user_id: Any) -> str:
        """The e-mail (else username) of Label Studio user `user_id`, remembered; ``label-studio-user-<id>``
        when Label Studio does not say."""
        if isinstance(user_id, dict):  # some payloads nest the user
            user_id = user_id.get("id")
        if not isinstance(user_id, int) or isinstance(user_id, bool):
            return "label-studio-user"
        name = self._users.get(user_id)
        if name is None:
            try:
                doc = await self.call("GET", f"/api/users/{user_id}")
                name = str(doc.get("email") or doc.get("username") or "") or f"label-studio-user-{user_id}"
            except LabelStudioError as exc:
                if exc.transient:
                    raise
                name = f"label-studio-user-{user_id}"
            self._users[user_id] = name
            if len(self._users) > USERS_CACHED:
                self._users.popitem(last=False)
        self._users.move_to_end(user_id)
        return name
