"""`stratameter bridge label-studio`: label requests become Label Studio tasks, reviewers' annotations
come back as labels.

Requests in (`consume_forever`): the bridge's own consumer group reads the label-request topic; each
request gets one task in the project (`mapping.task_payload`), then the batch's offsets are committed
(a crash replays the batch).  One task per request, across replicas and replays: the request's Redis
key (`Keys.label_studio_request`) is claimed with SET NX before the task is created and then holds
the task id.  A claim left by a replica that died mid-way (older than `CLAIM_STALE_S`) is taken over
with SET XX GET, and the new owner first looks the request up in Label Studio (the task may exist).
A request that arrives after its ``expires_at`` gets no task.

Answers out: Label Studio's webhook (ANNOTATION_CREATED, `http`) names a task; a worker reads the task
back from Label Studio (a forged body cannot make a label) and forwards its first annotation
(`_forward`: `mapping.answer_label`, the annotator's e-mail, the annotation's time) to the labels
topic, then marks the request answered.  Webhooks are sent once, so every `poll_seconds` one replica
(a PX lease) also reads the open tasks (`Keys.label_studio(project, "open")`) and forwards what the
webhooks missed, and deletes the tasks whose request expired unanswered.  An edited annotation
(ANNOTATION_UPDATED) is counted, never forwarded: the service keeps the first answer.

At least once: an answer is marked forwarded only after the labels topic acknowledged it, so a crash
in between forwards it again (the service counts the second copy as a duplicate).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from pydantic import ValidationError
from redis.exceptions import RedisError

from stratameter.schemas.parse import decode_label_request, label_record_bytes
from stratameter.schemas.times import format_time, rfc3339_to_ms

from ..app.consumer import stop_clients
from ..app.lifecycle import pause
from ..app.probes import PROBE_INTERVAL_S, READY_WINDOW_S, Health, check_redis, probe_redis
from ..config import ConfigError, Settings, env_var
from ..errors import StartupError, describe, kafka_startup_error
from ..state.keys import Keys
from . import mapping
from .client import TASKS_PER_QUERY, LabelStudio, LabelStudioError
from .mapping import Choices, TaskRequest
from .metrics import BridgeMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")

#: a claim older than this was left by a replica that died while creating the task (a call to Label
#: Studio times out after 30 s, so a live creator is never taken over)
CLAIM_STALE_S = 60.0
#: a request key lives until a day after the request's deadline ...
GRACE_S = 86_400
#: ... counted from a deadline at most this far ahead (a request expiring later is tracked this long)
MAX_AHEAD_S = 30 * 86_400
#: label requests per consumer poll, and tasks created concurrently
BATCH_RECORDS = 200
CONCURRENCY = 8
WEBHOOK_QUEUE = 10_000
WEBHOOK_WORKERS = 4
PROJECT_DESCRIPTION = ("Items stratameter chose for review (stratameter bridge label-studio). The first answer "
                       "per task counts; Skip sends 'cannot tell'.")


def require_token(settings: Settings) -> None:
    """`ConfigError` naming STRATAMETER_LABEL_STUDIO_TOKEN when it is not set (the service does not need it)."""
    if settings.label_studio_token is None:
        raise ConfigError([(env_var("label_studio_token"), "required by `stratameter bridge label-studio`: an API "
                            "token of the Label Studio user the bridge acts as (Label Studio: Account & Settings), "
                            "or STRATAMETER_LABEL_STUDIO_TOKEN_FILE naming a file holding it")])


class Stopped(Exception):
    """The bridge is stopping: the work in hand is left for a replay."""


class Bridge:
    """One bridge process.  `start()` checks Label Studio, the project, the webhook, Redis and Kafka;
    `spawn()` runs the loops until `stopping` is set; `stop()` closes."""

    def __init__(self, settings: Settings) -> None:
        require_token(settings)
        self.settings = s = settings
        self.choices = Choices.parse(s.label_studio_choices)
        self.ls = LabelStudio(s.label_studio_url, s.label_studio_token.get_secret_value())
        self.redis = s.redis_client()
        self.keys = Keys(s.redis_key_prefix)
        self.health = Health()
        self.metrics = BridgeMetrics(self.health.redis_errors)
        self.ls_ok_at = 0.0
        self.stopping = asyncio.Event()
        self.queue: asyncio.Queue[int] = asyncio.Queue(maxsize=WEBHOOK_QUEUE)
        self.project_id = 0
        self.project_title = ""
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self._inflight: set[int] = set()
        self._nonce = 0

    # ---- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Raises `StartupError` naming the setting when Label Studio is unreachable, refuses the
        token, lacks the project or its choices, or Kafka cannot be bootstrapped."""
        await self._check_label_studio()
        await self._ensure_project()
        await self._ensure_webhook()
        self.ls_ok_at = time.time()
        await check_redis(self.redis, self.settings)
        await self._start_kafka()

    def ready(self) -> bool:
        return self.health.ready() and time.time() - self.ls_ok_at < READY_WINDOW_S

    def readiness(self) -> dict[str, bool]:
        now = time.time()
        return {"kafka": now - self.health.kafka_ok_at < READY_WINDOW_S,
                "redis": now - self.health.redis_ok_at < READY_WINDOW_S,
                "label_studio": now - self.ls_ok_at < READY_WINDOW_S}

    def spawn(self) -> list[asyncio.Task]:
        loops = [self.consume_forever(), self.poll_forever(),
                 self.health.probe_forever(self._probe_kafka, self._probe_redis, self.stopping),
                 self._probe_label_studio_forever()]
        loops += [self._webhook_worker() for _ in range(WEBHOOK_WORKERS)]
        return [asyncio.create_task(c) for c in loops]

    async def stop(self) -> None:
        await stop_clients(self.consumer, self.producer)
        await self.ls.aclose()
        await self.redis.aclose()

    # ---- start-up checks ------------------------------------------------------------------
    async def _check_label_studio(self) -> None:
        url = self.settings.label_studio_url
        try:
            await self.ls.whoami()
        except LabelStudioError as exc:
            if exc.status in (401, 403):
                raise StartupError(
                    f"Label Studio at {url} refused the token (STRATAMETER_LABEL_STUDIO_TOKEN): {exc}. Use a "
                    "personal access token, or a legacy token with LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true on "
                    "Label Studio (Account & Settings shows both)") from None
            if exc.status == 0:
                raise StartupError(f"cannot reach Label Studio at {url} (STRATAMETER_LABEL_STUDIO_URL): {exc}") from None
            raise StartupError(f"STRATAMETER_LABEL_STUDIO_URL: {url} does not answer as Label Studio: {exc}") from None

    async def _ensure_project(self) -> None:
        """Find the project (an id, or a title: created with `mapping.label_config` when absent) and
        check that its config has the configured choices."""
        wanted = self.settings.label_studio_project
        try:
            if wanted.isdigit():
                doc = await self.ls.project(int(wanted))
                if doc is None:
                    raise StartupError(f"STRATAMETER_LABEL_STUDIO_PROJECT: Label Studio at "
                                       f"{self.settings.label_studio_url} has no project with id {wanted}")
            else:
                found = await self.ls.projects_titled(wanted)
                if not found:
                    created = await self.ls.create_project(wanted, mapping.label_config(self.choices),
                                                           PROJECT_DESCRIPTION)
                    found = await self.ls.projects_titled(wanted) or [created]
                    if found[0]["id"] != created["id"]:  # another replica created it at the same moment
                        await self.ls.delete_project(created["id"])
                    else:
                        log.info("created the Label Studio project %r (id %d)", wanted, created["id"])
                elif len(found) > 1:
                    log.warning("Label Studio has %d projects titled %r: using the first, id %d", len(found), wanted,
                                found[0]["id"])
                doc = await self.ls.project(found[0]["id"]) or found[0]
        except LabelStudioError as exc:
            raise StartupError(f"STRATAMETER_LABEL_STUDIO_PROJECT: cannot find or create the project {wanted!r}: "
                               f"{exc}") from None
        self.project_id, self.project_title = int(doc["id"]), str(doc.get("title", ""))
        have = mapping.config_choices(doc)
        missing = [c for c in self.choices.names if c not in have]
        if missing:
            raise StartupError(
                f"STRATAMETER_LABEL_STUDIO_CHOICES: the project {self.project_title!r} (id {self.project_id}) has "
                f"no choice {', '.join(map(repr, missing))} in its labelling config (its choices: "
                f"{', '.join(sorted(have)) or 'none'}); name its choices for true, false and optionally unsure")

    async def _ensure_webhook(self) -> None:
        """The project's webhook to STRATAMETER_LABEL_STUDIO_WEBHOOK_URL (one; the actions the bridge
        needs).  Without that setting the bridge polls only."""
        url = self.settings.label_studio_webhook_url
        if url is None:
            log.info("STRATAMETER_LABEL_STUDIO_WEBHOOK_URL is not set: answers come by polling only, every %g s",
                     self.settings.label_studio_poll_seconds)
            return
        actions = list(mapping.ACTIONS)
        try:
            hooks = [h for h in await self.ls.webhooks(self.project_id) if h.get("url") == url]
            if not hooks:
                await self.ls.create_webhook(self.project_id, url, actions)
                hooks = [h for h in await self.ls.webhooks(self.project_id) if h.get("url") == url]
            for extra in hooks[1:]:  # replicas starting at once each created one
                await self.ls.delete_webhook(extra["id"])
            hook = hooks[0]
            if sorted(hook.get("actions") or ()) != sorted(actions) or not hook.get("is_active") \
                    or not hook.get("send_payload"):
                await self.ls.update_webhook(hook["id"], actions)
        except (LabelStudioError, KeyError, IndexError) as exc:
            raise StartupError(f"STRATAMETER_LABEL_STUDIO_WEBHOOK_URL: cannot register the webhook {url} in the "
                               f"project {self.project_id}: {exc}") from None

    async def _start_kafka(self) -> None:
        s = self.settings
        kafka = s.kafka_client_kwargs()
        try:
            self.producer = AIOKafkaProducer(acks="all", linger_ms=5, enable_idempotence=False, **kafka)
            await self.producer.start()
            self.consumer = AIOKafkaConsumer(
                s.topic_label_requests, group_id=s.bridge_consumer_group, enable_auto_commit=False,
                auto_offset_reset="earliest", session_timeout_ms=s.kafka_session_timeout_ms,
                heartbeat_interval_ms=500, max_poll_records=BATCH_RECORDS, **kafka)
            await self.consumer.start()
        except KafkaError as exc:
            raise kafka_startup_error(s, exc) from None

    async def _probe_kafka(self) -> None:
        await self.producer.client.fetch_all_metadata()

    async def _probe_redis(self) -> None:
        """As the service's: a full Redis answers PING but refuses the claims and tasks' writes."""
        await probe_redis(self.redis, self.keys, self.settings.instance_id)

    def _redis_failed(self, exc: BaseException, operation: str) -> None:
        """Where `exc` is Redis failing `operation` (`metrics.REDIS_OPERATIONS`): counted, and not
        ready until Redis answers the probe again (as the service's `Health.redis_failed`)."""
        if isinstance(exc, RedisError):
            self.health.redis_failed(exc, operation)

    async def _probe_label_studio_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.ls.whoami(), PROBE_INTERVAL_S)
                self.ls_ok_at = time.time()
            except Exception as exc:  # noqa: BLE001 - any failure means not ready
                self.metrics.ls_errors.labels("probe").inc()
                log.warning("label studio probe failed: %s", describe(exc))
            await self._sleep(PROBE_INTERVAL_S)

    async def _sleep(self, seconds: float) -> None:
        await pause(self.stopping, seconds)

    async def _retrying(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` until it succeeds, with backoff (0.5 s to 10 s) while Label Studio, Redis or Kafka
        fail transiently; raises `Stopped` when the bridge stops meanwhile."""
        delay = 0.5
        while True:
            if self.stopping.is_set():
                raise Stopped
            try:
                return await call()
            except LabelStudioError as exc:
                if not exc.transient:
                    raise
                self.metrics.ls_errors.labels(op).inc()
                log.warning("%s failed, retrying in %.1f s: %s", op, delay, exc)
            except (RedisError, KafkaError, OSError) as exc:
                self._redis_failed(exc, "requests" if op == "create_task" else "poll")
                log.warning("%s failed, retrying in %.1f s: %s", op, delay, describe(exc))
            await self._sleep(delay)
            delay = min(10.0, delay * 2)

    # ---- requests in ---------------------------------------------------------------------
    async def consume_forever(self) -> None:
        """Poll label requests, make their tasks, commit; a batch cut short by a stop is not committed.
        Nothing a batch holds ends the loop: an unexpected error is logged and the batch replayed."""
        while not self.stopping.is_set():
            try:
                if not await self._consume_once():
                    return
            except Exception as exc:  # noqa: BLE001 - not committed: the batch comes again
                self._redis_failed(exc, "requests")
                log.error("handling a batch of label requests failed; it is read again: %s", describe(exc),
                          exc_info=True)
                await self._sleep(1.0)
                try:
                    for tp in self.consumer.assignment():  # back to the last committed offsets
                        committed = await self.consumer.committed(tp)
                        if committed is not None:
                            self.consumer.seek(tp, committed)
                        else:
                            await self.consumer.seek_to_beginning(tp)
                except Exception as again:  # noqa: BLE001 - the next poll goes on from where it is
                    log.warning("rewinding to the committed offsets failed: %s", describe(again))

    async def _consume_once(self) -> bool:
        """One poll: False when the bridge stopped in the middle of the batch (left uncommitted)."""
        try:
            batch = await self.consumer.getmany(timeout_ms=500, max_records=BATCH_RECORDS)
        except KafkaError as exc:
            log.warning("polling label requests failed: %s", describe(exc))
            await self._sleep(1.0)
            return True
        records = [r for rs in batch.values() for r in rs]
        if not records:
            return True
        requests = {}
        for r in records:
            try:
                req = decode_label_request(r.value)
            except (ValidationError, ValueError, TypeError) as exc:
                self.metrics.requests.labels("invalid").inc()
                log.warning("not a label request: %s", _first_error(exc),
                            extra={"topic": r.topic, "partition": r.partition, "offset": r.offset})
                continue
            if req.request_id in requests:  # a request published twice: one task
                self.metrics.requests.labels("task_exists").inc()
            requests.setdefault(req.request_id, req)
        try:
            await self._make_tasks(list(requests.values()))
        except Stopped:
            return False
        try:
            await self.consumer.commit()
        except KafkaError as exc:  # a rebalance: the batch is replayed elsewhere, no second task
            log.warning("committing label-request offsets failed: %s", describe(exc))
        return True

    async def _make_tasks(self, requests: list) -> None:
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(req) -> None:
            async with sem:
                await self._retrying("create_task", lambda: self.task_for(req))

        results = await asyncio.gather(*(one(r) for r in requests), return_exceptions=True)
        for req, res in zip(requests, results):
            if isinstance(res, Stopped):
                raise res
            if isinstance(res, BaseException):  # Label Studio refused a call for good: no task, said loudly
                self.metrics.requests.labels("rejected").inc()
                log.error("no task for label request %s: %s", req.request_id, describe(res))

    async def task_for(self, req, now: float | None = None) -> str:
        """Make the task of label request `req` unless it has one: the outcome (`metrics.REQUEST_OUTCOMES`).
        Raises `LabelStudioError` (transient ones are retried by the caller) or a Redis error."""
        now_ms = int((time.time() if now is None else now) * 1000)
        deadline = rfc3339_to_ms(req.expires_at)
        if deadline is None or deadline <= now_ms:
            self.metrics.requests.labels("expired").inc()
            return "expired"
        ahead_ms = min(deadline - now_ms, MAX_AHEAD_S * 1000)
        ttl = int(ahead_ms / 1000) + GRACE_S
        key = self.keys.label_studio_request(req.classifier_id, self.project_id, req.request_id)
        how, token = await self._claim(key, ttl)
        if how == "exists":
            self.metrics.requests.labels("task_exists").inc()
            return "task_exists"
        task_id = None
        if how == "takeover":  # a replica died between claiming and recording: the task may exist
            for t in await self.ls.tasks_of_request(self.project_id, req.request_id):
                found = TaskRequest.of(t)
                if found is not None and found.request_id == req.request_id:
                    task_id = int(t["id"])
                    break
        outcome = "task_exists" if task_id is not None else "task_created"
        if task_id is None:
            data, meta = mapping.task_payload(req, self.settings.label_studio_show_score)
            try:
                task_id = await self.ls.create_task(self.project_id, data, meta)
            except LabelStudioError as exc:
                if exc.transient:  # it may have been made all the same: the retry looks it up first
                    await self.redis.set(key, _claim_value(self.settings.instance_id, 0, token), xx=True, ex=ttl)
                    raise
                await self.redis.delete(key)
                self.metrics.requests.labels("rejected").inc()
                log.error("Label Studio refused the task of request %s: %s", req.request_id, exc)
                return "rejected"
        await self.redis.zadd(self.keys.label_studio(self.project_id, "open"),
                              {str(task_id): now_ms + ahead_ms})
        await self.redis.set(key, f"task {task_id}", ex=ttl)
        self.metrics.requests.labels(outcome).inc()
        return outcome

    async def _claim(self, key: str, ttl: int) -> tuple[str, str]:
        """``("exists", "")`` when the request has a task; else ``("create", claim)`` (ours, first) or
        ``("takeover", claim)`` (a stale claim taken over: look the task up before creating it)."""
        me = self.settings.instance_id
        while True:
            raw = await self.redis.get(key)
            now_ms = int(time.time() * 1000)
            self._nonce += 1
            mine = f"{os.getpid()}.{self._nonce}"
            if raw is None:
                if await self.redis.set(key, _claim_value(me, now_ms, mine), nx=True, ex=ttl):
                    return "create", mine
                continue
            value = raw.decode(errors="replace")
            kind, _, rest = value.partition(" ")
            if kind in ("task", "answered"):
                return "exists", ""
            parts = rest.split(" ")
            if kind == "claim" and len(parts) == 3 and parts[1].isdigit():
                if parts[1] != "0" and now_ms - int(parts[1]) < CLAIM_STALE_S * 1000:
                    if self.stopping.is_set():
                        raise Stopped
                    await asyncio.sleep(0.25)  # another replica is creating it right now
                    continue
            # a stale claim (its creator died, or failed transiently: "0"), or a value no bridge writes
            old = await self.redis.set(key, _claim_value(me, now_ms, mine), xx=True, get=True, ex=ttl)
            if old == raw:
                return "takeover", mine
            if old is not None and old.split(b" ", 1)[0] in (b"task", b"answered"):
                await self.redis.set(key, old, xx=True, keepttl=True)  # put back what a finished replica wrote
                return "exists", ""
            # another replica took it over first (or it expired): look again

    # ---- answers out ---------------------------------------------------------------------
    def webhook(self, body: bytes) -> tuple[int, dict]:
        """A webhook body: (HTTP status, JSON answer).  Annotations created are queued for a worker;
        an edited one is counted; a body that is not a Label Studio webhook is refused with 400."""
        try:
            action, task_ids = mapping.webhook_events(body)
        except mapping.BadWebhook as exc:
            self.metrics.webhook_errors.labels(exc.reason).inc()
            log.warning("webhook refused (%s): %s", exc.reason, str(exc)[:300])
            return 400, {"error": str(exc), "reason": exc.reason}
        if action == "ANNOTATION_UPDATED":  # the service keeps the first answer: an edit cannot change it
            self.metrics.answers.labels("updated", "webhook").inc(len(task_ids))
            return 200, {"ok": True, "action": action, "forwarded": False}
        for task_id in task_ids:
            try:
                self.queue.put_nowait(task_id)
            except asyncio.QueueFull:
                self.metrics.webhook_dropped.inc()  # polling forwards it
        return 200, {"ok": True, "action": action, "tasks": len(task_ids)}

    async def _webhook_worker(self) -> None:
        while not self.stopping.is_set():
            try:
                task_id = await asyncio.wait_for(self.queue.get(), 0.5)
            except asyncio.TimeoutError:
                continue
            try:
                task = await self.ls.task(task_id)
                if task is not None:
                    await self.forward(task, "webhook")
            except LabelStudioError as exc:
                self.metrics.ls_errors.labels("read_task").inc()
                log.warning("reading task %d after its webhook failed (polling will forward it): %s", task_id, exc)
            except Exception as exc:  # noqa: BLE001 - Kafka or Redis down: polling forwards it later
                self._redis_failed(exc, "webhook")
                log.warning("forwarding task %d failed (polling will retry): %s", task_id, describe(exc))

    async def forward(self, task: dict, via: str) -> str | None:
        """Forward the first annotation of `task` (read from Label Studio) as a label, unless it was
        forwarded already: the outcome (`metrics.ANSWER_OUTCOMES`), None when it has no annotation."""
        req = TaskRequest.of(task)
        if req is None or task.get("project") != self.project_id:
            self.metrics.answers.labels("not_ours", via).inc()
            return "not_ours"
        annotation = mapping.first_annotation(task)
        if annotation is None:
            return None
        task_id = int(task["id"])
        if task_id in self._inflight:  # the webhook and a poll at the same moment
            return None
        self._inflight.add(task_id)
        try:
            return await self._forward(task_id, req, annotation, via)
        finally:
            self._inflight.discard(task_id)

    async def _forward(self, task_id: int, req: TaskRequest, annotation: dict, via: str) -> str:
        key = self.keys.label_studio_request(req.classifier_id, self.project_id, req.request_id)
        open_key = self.keys.label_studio(self.project_id, "open")
        state = await self.redis.get(key)
        if state is not None and state.startswith(b"answered "):
            await self.redis.zrem(open_key, str(task_id))
            self.metrics.answers.labels("already_forwarded", via).inc()
            return "already_forwarded"
        done = f"answered {task_id} {annotation['id']}"
        try:
            label = mapping.answer_label(annotation, self.choices)
        except mapping.UnknownChoice as exc:
            log.warning("task %d: %s; not forwarded", task_id, exc, extra={"request_id": req.request_id})
            await self.redis.set(key, done, xx=True, keepttl=True)
            await self.redis.zrem(open_key, str(task_id))
            self.metrics.answers.labels("unknown_choice", via).inc()
            return "unknown_choice"
        labeler = (await self.ls.user_email(annotation.get("completed_by")))[:256]
        created = annotation.get("created_at")
        created_ms = rfc3339_to_ms(created) if isinstance(created, str) else None
        now_ms = int(time.time() * 1000)
        value = label_record_bytes(req.request_id, label, labeler, format_time(created_ms or now_ms))
        await self.producer.send_and_wait(self.settings.topic_labels, value, key=req.classifier_id.encode())
        await self.redis.set(key, done, xx=True, keepttl=True)
        await self.redis.zrem(open_key, str(task_id))
        outcome = "label_null" if label is None else f"label_{str(label).lower()}"
        self.metrics.answers.labels(outcome, via).inc()
        if created_ms:
            self.metrics.delay.labels(via).observe(max(0.0, (now_ms - created_ms) / 1000))
        log.debug("forwarded", extra={"request_id": req.request_id, "label": label, "via": via, "task": task_id})
        return outcome

    # ---- polling and expiry ---------------------------------------------------------------
    async def poll_forever(self) -> None:
        while not self.stopping.is_set():
            await self._sleep(self.settings.label_studio_poll_seconds)
            if self.stopping.is_set():
                return
            try:
                await self.poll_once()
            except Stopped:
                return
            except Exception as exc:  # noqa: BLE001 - the next interval tries again
                self._redis_failed(exc, "poll")
                log.warning("polling Label Studio failed: %s", describe(exc))

    async def poll_once(self, lease: bool = True) -> bool:
        """One replica per interval (a PX lease): forward the answers of the open tasks the webhooks
        missed, then delete the tasks whose request expired unanswered.  False when another
        replica holds this interval's lease."""
        poller = self.keys.label_studio(self.project_id, "poller")
        interval_ms = int(self.settings.label_studio_poll_seconds * 1000)
        if lease and not await self.redis.set(poller, self.settings.instance_id, nx=True,
                                              px=max(100, interval_ms * 9 // 10)):
            return False
        open_key = self.keys.label_studio(self.project_id, "open")
        ids = [int(m) for m in await self.redis.zrange(open_key, 0, -1)]
        for chunk in _chunks(ids, TASKS_PER_QUERY):
            tasks = await self._retrying("list_tasks", lambda c=chunk: self.ls.tasks(self.project_id, c))
            for task in tasks:
                if mapping.first_annotation(task) is not None:
                    await self.forward(task, "poll")
            gone = set(chunk) - {t.get("id") for t in tasks}
            if gone:  # deleted in Label Studio by a person: nothing to wait for
                log.info("%d open tasks are gone from Label Studio", len(gone))
                await self.redis.zrem(open_key, *map(str, gone))
        now_ms = int(time.time() * 1000)
        due = [int(m) for m in await self.redis.zrangebyscore(open_key, "-inf", now_ms)]
        for chunk in _chunks(due, TASKS_PER_QUERY):
            tasks = await self._retrying("list_tasks", lambda c=chunk: self.ls.tasks(self.project_id, c))
            for task in tasks:
                if mapping.first_annotation(task) is not None:  # answered at the last moment: the service judges
                    await self.forward(task, "expiry")
                else:
                    await self._retrying("delete_task", lambda t=task: self.ls.delete_task(int(t["id"])))
                    self.metrics.removed.labels("expired").inc()
            await self.redis.zrem(open_key, *map(str, chunk))
        await self.redis.set(self.keys.label_studio(self.project_id, "polled"), str(int(time.time() * 1000)))
        return True

    async def refresh_gauges(self) -> None:
        """The gauges read from Redis at scrape time (open tasks, poll lag)."""
        try:
            self.metrics.open_tasks.set(await self.redis.zcard(self.keys.label_studio(self.project_id, "open")))
            polled = await self.redis.get(self.keys.label_studio(self.project_id, "polled"))
            self.metrics.poll_lag.set(time.time() - int(polled) / 1000 if polled else -1)
        except (RedisError, OSError, ValueError) as exc:
            self._redis_failed(exc, "gauges")
            log.warning("reading the bridge's gauges failed: %s", describe(exc))


def _claim_value(instance: str, now_ms: int, nonce: str) -> str:
    """A claim: who creates the task and since when (0: failed transiently, free to take over)."""
    return f"claim {instance} {now_ms} {nonce}"


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors(include_url=False)[0]
        return f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}"
    return str(exc)[:300]


async def run(settings: Settings) -> int:
    """`stratameter bridge label-studio` until SIGTERM/SIGINT: the batch in hand is finished and
    committed, the consumer leaves its group, exit 0.  Exit 1 when it cannot start."""
    from ..app.lifecycle import run_until_stopped
    from .http import serve

    bridge = Bridge(settings)
    return await run_until_stopped(
        bridge, settings, serve, "STRATAMETER_BRIDGE_HTTP", settings.bridge_http_host, settings.bridge_http_port,
        lambda: ("stratameter bridge label-studio started",
                 {"project": bridge.project_id, "project_title": bridge.project_title}), log)
