"""`stratameter bench --scrape-chunks C`: what the windows cost a scrape.  Each classifier holds C
one-hour chunks, the C - 1 before the current one closed (the lateness is 0), every chunk with labels
in every stratum (so each has an interval and the default ``1d`` window is computed over its chunks).  The state is
written straight into Redis through the service's own state layer: the scores by the ingestor
(`ScoreIngestor`: the chunk of a score is its event time's; the lateness rule is the consumer's, which
this does not pass through), the label requests by ISSUE on each chunk's reservoir members and their
answers by LABEL (`RequestStore`), as the request loop and the label folder write them.  Then
``stratameter run`` starts over that state `ROUNDS` times with the windows disabled
(``STRATAMETER_WINDOWS=none``, the scrape before windows; an empty value is the default) and as many
with the default ``1d``, alternating (off, on, off, ...), and each start's `/metrics` is scraped
`serve.SCRAPES` times once it owns every classifier.  The hourly label budget is left spent by the seeding, so the request loop
issues nothing and the state does not change between starts; one untimed start first (``1d``) checks
that the window pools C chunks with a finite estimate and stays until the request loop has judged
every chunk (`_settled`): the timed starts run over a settled state, as a restarted service does."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import numpy as np

#: Starts of each setting, alternating.
ROUNDS = 5
#: Predicted positives ingested into each chunk (above the 25 a stratum a chunk needs for its own strata).
ITEMS_PER_CHUNK = 120
#: Labels answered in each stratum of each chunk (an interval needs 2).
LABELS_PER_STRATUM = 3
#: The window measured (the default `STRATAMETER_WINDOWS`) and its one-hour chunks.
WINDOW, WINDOW_CHUNKS = "1d", 24
#: The seeding's instance (its lease is the fence ISSUE checks).
SEEDER = "bench-seed"


async def _ingest(store, settings, cids: list[str], chunks: list[int], now_ms: int) -> None:
    """`ITEMS_PER_CHUNK` predicted positives of every classifier into every chunk of `chunks`, oldest
    first, one batch a chunk (offsets of partition 0 in order)."""
    from ..ingest.ingestor import ScoreIngestor

    ingest, rng = ScoreIngestor(store, settings, np.random.default_rng(0)), np.random.default_rng(1)
    n, offset, ms = ITEMS_PER_CHUNK, 0, settings.chunk_seconds * 1000
    for t in chunks:
        who = [c for c in cids for _ in range(n)]
        items = [f"{c}-{t}-{k}" for c in cids for k in range(n)]
        size = len(items)
        await ingest.apply(0, np.arange(offset, offset + size), who, items, 0.5 + rng.random(size) / 2,
                           np.ones(size, bool), np.full(size, min(t * ms + 1000, now_ms)), [None] * size)
        offset += size


async def _label(store, cid: str, chunks: list[int], now_ms: int, rng: np.random.Generator) -> int:
    """One classifier's chunks labelled: per chunk and stratum `LABELS_PER_STRATUM` reservoir members
    requested (ISSUE, under the seeder's lease) and answered, 80% positive (LABEL); the labels accepted."""
    from ..requests.messages import new_request_id
    from ..state.calls import LabelCall

    states = await store.chunks.chunk_states(cid, chunks)
    deadline = now_ms + 48 * 3_600_000
    rids = []
    for cs in states:
        members = await store.chunks.reservoirs(cid, cs.chunk, cs.strata)
        reqs = [[new_request_id(cid), k, *_item(raw)] for k, res in enumerate(members)
                for raw, _ in res[:LABELS_PER_STRATUM]]
        issued = await store.requests.issue(cid, cs.chunk, now_ms, deadline, 1, SEEDER, reqs, {}, 3_600_000)
        if issued is None:
            raise RuntimeError(f"the seeder lost the lease of {cid}")
        rids += issued
    calls = [LabelCall(cid, 0, i, rid, "1" if rng.random() < 0.8 else "0", now_ms, "bench")
             for i, rid in enumerate(rids)]
    return sum(r.outcome == "accepted" for r in await store.requests.apply_labels(calls))


def _item(raw: str) -> list:
    """A reservoir member's item id, score (its repr, as ISSUE takes it) and the member itself."""
    import orjson

    m = orjson.loads(raw)
    return [m["i"], repr(float(m["s"])), raw]


async def seed(env: dict[str, str], cids: list[str], chunks: int, log: Callable[[str], None]) -> int:
    """The state described above under `env`'s key prefix; the labels accepted."""
    from ..config import load_settings
    from ..state.store import Store

    settings = load_settings(env)
    redis = settings.redis_client()
    store = Store(redis, env["STRATAMETER_REDIS_KEY_PREFIX"])
    now_ms = int(time.time() * 1000)
    ids = list(range(now_ms // (settings.chunk_seconds * 1000) - chunks + 1,
                     now_ms // (settings.chunk_seconds * 1000) + 1))
    try:
        log(f"ingesting {ITEMS_PER_CHUNK} predicted positives into each of {chunks} chunks of {len(cids)} classifiers")
        await _ingest(store, settings, cids, ids, now_ms)
        log(f"issuing and answering {LABELS_PER_STRATUM} labels a stratum in every chunk")
        if not all(await store.registry.acquire_leases(cids, SEEDER, 3_600_000)):
            raise RuntimeError("the seeder could not take every lease")
        rng, accepted = np.random.default_rng(2), 0
        for i in range(0, len(cids), 50):
            accepted += sum(await asyncio.gather(*(_label(store, c, ids, now_ms, rng) for c in cids[i:i + 50])))
        for c in cids:  # the service takes them at once
            await store.registry.release_lease(c, SEEDER)
        return accepted
    finally:
        await redis.aclose()


async def _start(env: dict[str, str], cids: list[str], windows: str, timeout_s: float, check: bool
                 ) -> dict:
    """`stratameter run` over the state with ``STRATAMETER_WINDOWS=windows`` until it owns every
    classifier, then `SCRAPES` scrapes of /metrics (`serve._scrapes`); with `check`, the window of the
    first classifier's document (`_checked`) instead of the scrapes."""
    from ..embedded import find_free_port
    from .serve import _scrapes, _until_owned, service_process

    port = find_free_port()
    env = {**os.environ, **env, "STRATAMETER_WINDOWS": windows, "STRATAMETER_HTTP_PORT": str(port),
           "STRATAMETER_HTTP_HOST": "127.0.0.1", "STRATAMETER_INSTANCE_ID": "bench",
           "STRATAMETER_MAX_LABELS_PER_HOUR": "1", "STRATAMETER_LOG_LEVEL": "WARNING"}
    with service_process(env) as proc:
        owned_s = await _until_owned(port, cids, proc, timeout_s)
        out = {**await _checked(port, cids[0]), **await _settled(env, cids)} if check else await _scrapes(port)
    return {"owned_seconds": round(owned_s, 3), **out}


async def _settled(env: dict[str, str], cids: list[str], quiet_s: float = 10.0, timeout_s: float = 300.0) -> dict:
    """Wait until the request loop has judged every seeded chunk: the classifiers' ``status_changes``
    (each closed chunk's first status write counts once, `state.lua.set_status`) unchanged for
    `quiet_s`, so the timed starts run over a settled state, as a restarted service does."""
    from ..config import load_settings
    from ..state.keys import Keys

    redis, keys = load_settings(env).redis_client(), Keys(env["STRATAMETER_REDIS_KEY_PREFIX"])
    t0, last, since = time.monotonic(), None, time.monotonic()
    try:
        while time.monotonic() - t0 < timeout_s:
            pipe = redis.pipeline()
            for c in cids:
                pipe.hget(keys.counters(c), "status_changes")
            total = sum(int(x or 0) for x in await pipe.execute())
            if total != last:
                last, since = total, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
            await asyncio.sleep(1.0)
    finally:
        await redis.aclose()
    return {"settled_seconds": round(time.monotonic() - t0, 1), "status_changes": last}


async def _checked(port: int, cid: str) -> dict:
    """Classifier `cid`'s `WINDOW` window as `/v1/classifiers/{cid}` reports it (its chunks pooled,
    labels, precision's estimate); RuntimeError unless the estimate is finite."""
    from ..api.client import http_json

    status, doc = await http_json(port, f"/v1/classifiers/{cid}", timeout=30)
    window = (doc or {}).get("windows", {}).get(WINDOW)
    if status != 200 or window is None or window["metrics"]["precision"]["estimate"] is None:
        raise RuntimeError(f"/v1/classifiers/{cid} answered {status} without a {WINDOW} window's estimate")
    return {"window_chunks": window["chunks"], "window_labels": window["labels"],
            "window_estimate": window["metrics"]["precision"]["estimate"]}


async def scrape_bench(kafka: str, redis_url: str, classifiers: int, chunks: int,
                       log: Callable[[str], None] = lambda msg: None, rounds: int = ROUNDS) -> dict:
    """Seed (`seed`), check the window once, then `rounds` starts with the windows off and as many
    with `WINDOW`, alternating: each start's scrape median and, per round, on / off; the ratio is the
    median of the rounds' ratios."""
    from .core import _fresh_names
    from .records import classifier_ids

    _, env = await _fresh_names(kafka, redis_url, 1)
    # no lateness: the chunk before the current one is closed from the hour's first second, as the
    # seeding says (the default 300 s left it open in the hour's first five minutes: one chunk less judged)
    env = {**env, "STRATAMETER_ALLOWED_LATENESS_SECONDS": "0"}
    cids = classifier_ids(classifiers)
    timeout_s = 120 + classifiers / 10
    t0 = time.perf_counter()
    labels = await seed(env, cids, chunks, log)
    seed_s = time.perf_counter() - t0
    log(f"checking the {WINDOW} window of {cids[0]} (an untimed start)")
    check = await _start(env, cids, WINDOW, timeout_s, check=True)
    if check["window_chunks"] != min(chunks, WINDOW_CHUNKS):
        raise RuntimeError(f"the {WINDOW} window pooled {check['window_chunks']} chunks, not "
                           f"{min(chunks, WINDOW_CHUNKS)}")
    runs = []
    for r in range(rounds):
        pair = {}
        for name, windows in (("off", "none"), ("on", WINDOW)):
            log(f"round {r + 1} of {rounds}: windows {name}")
            pair[name] = await _start(env, cids, windows, timeout_s, check=False)
        runs.append(pair)
    ratios = [p["on"]["scrape_seconds_median"] / p["off"]["scrape_seconds_median"] for p in runs]
    return {"classifiers": classifiers, "chunks": chunks, "window": WINDOW, "items_per_chunk": ITEMS_PER_CHUNK,
            "labels_per_stratum": LABELS_PER_STRATUM, "labels_accepted": labels, "seed_seconds": round(seed_s, 1),
            **check, "rounds": runs, "ratios": [round(x, 3) for x in ratios],
            "off_median": round(float(np.median([p["off"]["scrape_seconds_median"] for p in runs])), 3),
            "on_median": round(float(np.median([p["on"]["scrape_seconds_median"] for p in runs])), 3),
            "on_vs_off": round(float(np.median(ratios)), 3)}


def run(kafka: str | None, redis: str | None, classifiers: int, chunks: int, log: Callable[[str], None]) -> dict:
    """`scrape_bench` with an embedded tansu and Redis for those not given."""
    from contextlib import ExitStack

    from .core import embedded_backends

    with ExitStack() as stack:
        kafka, redis = embedded_backends(stack, kafka, redis, log)
        return asyncio.run(scrape_bench(kafka, redis, classifiers, chunks, log))
