"""Start everything the demo needs, run the traffic and the reviewers, stop everything.

Order of start: the signal handlers, the backends (embedded tansu and Redis
unless given), the topics, the service (a `stratameter run` subprocess, so the
demo exercises exactly what production runs), then the score stream, the
reviewers and the view.  Stop, in reverse, from a `finally`, whatever ended the
run: the duration, Ctrl-C (SIGINT), SIGTERM or an error.  Every child runs in
its own session, so a Ctrl-C in the terminal reaches only the demo, which then
stops them in order (SIGTERM, SIGKILL after a timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
from pydantic import ValidationError

from stratameter.schemas.outbound import decode_label_request, label_record_bytes, score_record_bytes

from ..api.client import http_get
from ..config import ConfigError, load_settings
from ..embedded import EmbeddedKafka, EmbeddedRedis, create_topics, find_free_port, start_group_consumer
from . import screen, view
from .launch import DemoError, ServiceProcess, close_keeping_log, service_env, start_embedded
from .options import DemoOptions
from .scenarios import SCENARIOS, THRESHOLD, GroundTruth, chunk_of

REVIEWERS = ("ana", "bo", "chen", "dara")
TICK_S = 0.1
CLIENT_STOP_S = 10.0  # the demo's producer and reviewer; the service gets 15 s (`ServiceProcess.stop`)
LAST_READ_S = 2.0  # the service's figures for the summary, once stopped: they are a read away


class Demo:
    def __init__(self, opts: DemoOptions, out, err) -> None:
        self.opts = opts
        self.out = out  # rich Console for the view / summary
        self.err = err  # rich Console for messages
        self.stop = asyncio.Event()
        self.signal_name: str | None = None
        self.truth = GroundTruth()
        self.docs: dict[str, dict | None] = {s.classifier: None for s in SCENARIOS}
        self.answered = 0
        self.skipped = 0
        self.started = time.time()
        self.streaming_until: float | None = None
        self.ends_at: float | None = None
        self.phase = "starting"
        self.workdir = Path(tempfile.mkdtemp(prefix="stratameter-demo-"))
        self.kafka: EmbeddedKafka | None = None
        self.redis: EmbeddedRedis | None = None
        self.service: ServiceProcess | None = None
        self.service_log = self.workdir / "service.log"
        self.label_studio = None  # with --reviewers label-studio: EmbeddedLabelStudio, and the bridge
        self.bridge: ServiceProcess | None = None
        self.producer = None
        self.reviewer = None
        self.answers: set[asyncio.Task] = set()
        seed = opts.seed if opts.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.rng = np.random.default_rng(seed)
        self.delay_rng = random.Random(seed + 1)

    # ---- lifecycle ---------------------------------------------------------------------
    def _on_signal(self, sig: signal.Signals) -> None:
        self.signal_name = self.signal_name or sig.name
        self.stop.set()

    async def run(self) -> list[dict] | None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        tasks: list[asyncio.Task] = []
        try:
            settings = await self._start_backends_and_service()
            if settings is None:
                return None
            tasks = await self._start_traffic(settings)
            return await self._main_phase()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._shutdown()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _start_backends_and_service(self):
        """The backends, the topics, the service; the demo's clients join their groups while
        the service boots.  None when stopped meanwhile."""
        o = self.opts
        bootstrap = o.kafka or os.environ.get("STRATAMETER_KAFKA_BOOTSTRAP_SERVERS") or None
        redis_url = o.redis or os.environ.get("STRATAMETER_REDIS_URL") or None
        if o.reviewers == "label-studio":  # first: not installed says how to install it, before anything starts
            from .label_studio import EmbeddedLabelStudio

            ls = EmbeddedLabelStudio()
            self.err.print("starting Label Studio (the very first start takes about 40 s more: its database)")
            self.label_studio = await start_embedded(ls, "Label Studio", self.err)
            if self.stop.is_set():
                return None
        if bootstrap is None:
            self.kafka = await start_embedded(EmbeddedKafka(), "Kafka-protocol broker (tansu)", self.err)
            bootstrap = self.kafka.bootstrap
        if redis_url is None and not self.stop.is_set():
            self.redis = await start_embedded(EmbeddedRedis(), "Redis", self.err)
            redis_url = self.redis.url
        if self.stop.is_set():
            return None
        self.port = o.port or find_free_port()
        overrides = self.workdir / "classifiers.json"
        overrides.write_bytes(orjson.dumps({s.classifier: {"metrics": ",".join(s.metrics)}
                                            for s in SCENARIOS if s.whole_stream}))
        env = service_env(o, bootstrap, redis_url, self.port, uuid.uuid4().hex[:8],
                          own_kafka=self.kafka is not None, own_redis=self.redis is not None,
                          overrides=str(overrides))
        try:
            settings = self.settings = load_settings(env)
        except ConfigError as exc:
            raise DemoError(f"configuration error: {exc}") from None
        if settings.kafka_security_protocol == "PLAINTEXT":
            await create_topics(bootstrap, [settings.topic_scores, settings.topic_label_requests,
                                            settings.topic_labels, settings.topic_dead_letter], partitions=3)
        # else: a secured broker of yours; the topics are auto-created if it allows it
        self.service = ServiceProcess(env, self.port, self.service_log, self.workdir)
        self.service.start()
        waits = [self.service.wait_ready(self.stop), self._start_clients(settings)]
        if self.label_studio is not None:
            from .label_studio import bridge_env

            bridge_port = find_free_port()
            self.bridge = ServiceProcess(bridge_env(env, self.label_studio, bridge_port, env["STRATAMETER_INSTANCE_ID"]),
                                         bridge_port, self.workdir / "bridge.log", self.workdir,
                                         command=("bridge", "label-studio"), what="the Label Studio bridge")
            self.bridge.start()
            waits.append(self.bridge.wait_ready(self.stop))
        await _all_or_none(*waits)
        return None if self.stop.is_set() else settings

    async def _start_clients(self, settings) -> None:
        from aiokafka import AIOKafkaProducer

        kw = settings.kafka_client_kwargs()
        self.producer = AIOKafkaProducer(linger_ms=5, enable_idempotence=False, **kw)
        await self.producer.start()
        if self.opts.reviewers != "simulated":
            return
        self.reviewer = await start_group_consumer(
            settings.topic_label_requests, group_id=f"{settings.kafka_consumer_group}-reviewers", **kw)

    async def _start_traffic(self, settings) -> list[asyncio.Task]:
        self.metrics_url = f"http://127.0.0.1:{self.port}/metrics"
        self.err.print(f"status page: http://127.0.0.1:{self.port}/   metrics: {self.metrics_url}\n"
                       f"JSON: http://127.0.0.1:{self.port}/v1/classifiers/<id>\nservice log: {self.service_log}"
                       + ("" if self.opts.keep_logs else "\n(the logs are deleted on exit: --keep-logs keeps them)"))
        if self.label_studio is not None:
            ls = self.label_studio
            self.err.print(f"Label Studio: {ls.url}   login {ls.user} / {ls.password}   project "
                           f"{self.bridge.env['STRATAMETER_LABEL_STUDIO_PROJECT']!r}: label the tasks there, the view "
                           f"follows   bridge log: {self.bridge.log_path}")
        self._plan()
        loops = [self._stream(), self._poll()] + ([self._review()] if self.reviewer is not None else [])
        return [asyncio.create_task(c) for c in loops]

    async def _shutdown(self) -> None:
        """The demo's clients, the service and the bridge at once (none waits for another), then
        the backends they all use: at most 20 s after Ctrl-C (max(10, 15) + 5).  Whatever fails
        to stop, the backends are still closed.  One after the other their timeouts added up to
        65 s (10 + 10 + 15 + 15 + 5 + 5 + 5); with the clients before the processes, to 30."""
        started = time.monotonic()
        for t in list(self.answers):
            t.cancel()
        await asyncio.gather(*self.answers, return_exceptions=True)
        clients = [asyncio.wait_for(client.stop(), CLIENT_STOP_S) for client in (self.reviewer, self.producer)
                   if client is not None]
        processes = [p.stop() for p in (self.bridge, self.service) if p is not None]
        stopped = await asyncio.gather(*clients, *processes, return_exceptions=True)
        backends = (self.label_studio, self.redis, self.kafka)
        keep = self.workdir if self.opts.keep_logs else None
        stopped += await asyncio.gather(*(asyncio.to_thread(close_keeping_log, b, keep) for b in backends
                                          if b is not None), return_exceptions=True)
        failures = [str(e) or repr(e) for e in stopped if isinstance(e, BaseException)]
        took = time.monotonic() - started
        if failures or took > 10:
            self.err.print(f"stopping took {took:.1f}s" + (f"; not stopped cleanly: {', '.join(failures)}"
                                                            if failures else ""))
        if self.opts.keep_logs:
            logs = ", ".join(sorted(log.name for log in self.workdir.glob("*.log")))
            self.err.print(f"logs kept in {self.workdir}:\n  {logs}")
        elif not any(p is not None and p.failed for p in (self.service, self.bridge)):  # kept when one failed
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- the phases -------------------------------------------------------------------
    def _plan(self) -> None:
        o = self.opts
        self.started = time.time()
        if o.duration is not None:
            self.ends_at = self.started + o.duration
            self.streaming_until = o.streaming_end(self.started)

    async def _main_phase(self) -> list[dict]:
        self.phase = "streaming"
        with self._live():
            while not self.stop.is_set():
                if self.streaming_until is not None and time.time() >= self.streaming_until:
                    break
                await self._sleep(0.2)
            if not self.stop.is_set():
                self.phase = "settling"
                await self._settle()
            self.phase = "stopping"
            await self._refresh(LAST_READ_S)
        return self.summary()

    async def _settle(self) -> None:
        """Scores have stopped: let the service ingest them all (waiting past the end if it
        must: the truth is only comparable once it has), and the reviewers label the last
        chunk until it converges or the run's time is up."""
        with contextlib.suppress(Exception):  # until stopped: a broker that takes no record must not hold Ctrl-C
            await _until(self.stop, self.producer.flush())
        ingest_deadline = max(self.ends_at, time.time()) + 30
        while not self.stop.is_set() and time.time() < ingest_deadline:
            docs = await self._refresh()
            ingested = all(d is not None and d["scores"] >= self.truth.sent[c] for c, d in docs.items())
            if ingested and (time.time() >= self.ends_at or all(self._final(c, d) for c, d in docs.items())):
                return
            await self._sleep(0.25)

    def _final(self, cid: str, doc: dict) -> bool:
        chunk = view.chunk_id(doc.get("chunk"), self.opts.chunk_seconds)
        return chunk == self.truth.last_chunk.get(cid) and doc.get("status") == "converged"

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    # ---- traffic ----------------------------------------------------------------------
    async def _stream(self) -> None:
        """Predicted positives of every scenario at `rate` per second each, event time = now."""
        o = self.opts
        start_chunk = chunk_of(int(self.started * 1000), o.chunk_seconds)
        if o.duration is not None:  # the drift happens at the chunk boundary nearest halfway
            switch = max(1, round((self.started + o.duration / 2) / o.chunk_seconds) - start_chunk)
        else:
            switch = 3
        self.switch_chunk = start_chunk + switch
        carry = 0.0
        next_t = time.monotonic()
        while not self.stop.is_set():
            now_ms = int(time.time() * 1000)
            if self.streaming_until is not None and now_ms >= self.streaming_until * 1000:
                break
            chunk = chunk_of(now_ms, o.chunk_seconds)
            carry += o.rate * TICK_S
            n = int(carry)
            carry -= n
            for sc in SCENARIOS:
                if n == 0:
                    break
                scores, p = sc.draw(self.rng, n * sc.rate_factor, chunk - start_chunk, switch)
                labels = (self.rng.random(p.size) < p).astype(np.int8)
                predicted = scores >= THRESHOLD if sc.whole_stream else np.ones(p.size, dtype=bool)
                ids = self.truth.add(sc.classifier, chunk, labels, predicted)
                key = sc.classifier.encode()
                for item, s, pred in zip(ids, scores.tolist(), predicted.tolist()):
                    await self.producer.send(self.settings.topic_scores, key=key, value=score_record_bytes(
                        sc.classifier, item, s, predicted_positive=pred, event_time=now_ms))
            # requests of chunks older than this are expired long before (the label timeout)
            self.truth.forget_before(chunk - (int(2 * o.label_timeout) // o.chunk_seconds + 2))
            next_t += TICK_S
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))

    async def _review(self) -> None:
        """Reviewers answer every request from the ground truth after a random delay; some skip."""
        async for rec in self.reviewer:
            try:
                req = decode_label_request(rec.value)
            except ValidationError:
                continue
            task = asyncio.create_task(self._answer(req))
            self.answers.add(task)
            task.add_done_callback(self.answers.discard)

    async def _answer(self, req) -> None:
        """Answer the `LabelRequest` from the ground truth, after a random delay."""
        await asyncio.sleep(self.delay_rng.uniform(self.opts.min_delay, self.opts.max_delay))
        y = self.truth.label(req.item_id)
        skip = y is None or self.delay_rng.random() < self.opts.skip
        await self.producer.send(self.settings.topic_labels, key=req.classifier_id.encode(),
                                 value=label_record_bytes(req.request_id, None if skip else bool(y),
                                                          labeler_id=self.delay_rng.choice(REVIEWERS),
                                                          labeled_at=int(time.time() * 1000)))
        if skip:
            self.skipped += 1
        else:
            self.answered += 1

    # ---- view -------------------------------------------------------------------------
    async def _refresh(self, timeout: float = 5.0) -> dict[str, dict | None]:
        """Every classifier's figures from the service at once (each kept as it was when its read fails)."""
        async def read(cid: str) -> None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                status, body = await http_get(self.port, f"/v1/classifiers/{cid}", timeout=timeout)
                if status == 200:
                    self.docs[cid] = orjson.loads(body)

        await asyncio.gather(*(read(cid) for cid in self.docs))
        return self.docs

    def rows(self) -> list[dict]:
        return [view.row(self.docs.get(s.classifier), s.classifier, self.truth.truth, self.opts.chunk_seconds, m,
                         whole_stream=s.whole_stream)
                for s in SCENARIOS for m in s.metrics]

    def summary(self) -> list[dict]:
        return self.rows()

    def renderable(self):
        return screen.render(self)

    @contextlib.contextmanager
    def _live(self):
        if not self.out.is_terminal:
            yield
            return
        from rich.live import Live

        with Live(self.renderable(), console=self.out, refresh_per_second=4, transient=False) as live:
            self._live_obj = live
            yield
            live.update(self.renderable())
        self._live_obj = None

    async def _poll(self) -> None:
        while True:
            await self._refresh()
            live = getattr(self, "_live_obj", None)
            if live is not None:
                live.update(self.renderable())
            await asyncio.sleep(0.5)


async def _until(stop: asyncio.Event, aw) -> None:
    """Await `aw`, cancelled once `stop` is set; its error, if it ended on one, is raised."""
    task, waiter = asyncio.ensure_future(aw), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, waiter):
            t.cancel()
        await asyncio.gather(task, waiter, return_exceptions=True)
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()


async def _all_or_none(*aws) -> None:
    """Await all of `aws` concurrently; when one fails, cancel the others and raise."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
