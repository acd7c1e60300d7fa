"""The service's ingest path as the bench times it (`service_consume`): a `Service` without
request loop or HTTP, from its first fetch until the classifiers' counts in Redis add up, with
Redis memory snapshots on the way.  See `core` for the whole run."""

from __future__ import annotations

import asyncio
import time

from ..state.keys import Keys


# --------------------------------------------------------------------------- Redis


async def classifier_bytes(redis, prefix: str, cid: str) -> int:
    """MEMORY USAGE (exact: SAMPLES 0) summed over the classifier's keys."""
    keys = [k async for k in redis.scan_iter(match=f"{Keys(prefix).classifier(cid)}:*", count=1000)]
    if not keys:
        return 0
    pipe = redis.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("MEMORY", "USAGE", k, "SAMPLES", "0")
    return int(sum(int(x or 0) for x in await pipe.execute()))


async def counted(redis, prefix: str, cids: list[str]) -> int:
    pipe = redis.pipeline(transaction=False)
    for cid in cids:
        pipe.hget(Keys(prefix).meta(cid), "scores_total")
    return sum(int(v) for v in await pipe.execute() if v is not None)


# --------------------------------------------------------------------------- service


async def redis_cpu_seconds(redis) -> float | None:
    """Redis's CPU time so far (``INFO cpu``: user + system seconds); None on a cluster (its
    nodes' are not summed here)."""
    from redis.asyncio import RedisCluster

    if isinstance(redis, RedisCluster):
        return None
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def service_consume(settings, cids: list[str], records: int, memory_at: list[int], timeout_s: float,
                          poll_s: float = 0.005) -> tuple[float, float, list[dict], dict]:
    """Run the service's ingest path until Redis counts `records`.

    Returns (seconds from the first non-empty fetch to the full count, seconds from
    start() to the first fetch, memory snapshots, CPU seconds: ``{"python": this process's over
    the same span as the first, "redis": Redis's from just before start() (it idles until the first
    fetch's records but for the start-up reads) or None}``).  The CPU times are less noisy than
    the rate on a small shared machine: they count the work, not when it got a core.  This
    process's includes the bench's own count polls (the same for every ingest).
    """
    from ..app.runner import Service

    prefix = settings.redis_key_prefix
    service = Service(settings)
    probe = settings.redis_client()
    first: list[float] = []
    cpu0: list[float] = []
    task = None
    t_start = time.perf_counter()
    try:
        redis_cpu0 = await redis_cpu_seconds(probe)  # Redis is idle until the first fetch's records
        await service.start()
        fetch = service.consumer.getmany

        async def getmany(*args, **kwargs):
            out = await fetch(*args, **kwargs)
            if not first and any(out.values()):
                first.append(time.perf_counter())
                cpu0.append(time.process_time())
            return out

        service.consumer.getmany = getmany  # instance attribute: notes the first fetch, nothing else
        tasks = service.spawn(requests=False)
        task = tasks[0]  # consume_forever
        # each poll reads every classifier's count in the service's process: with many classifiers,
        # poll less often (0.1 s at 1000), or the poll itself takes a share of the measured rate
        poll_s = poll_s * max(1.0, len(cids) / 50)
        t_end, snaps = await _until_counted(probe, prefix, cids, records, memory_at, task, timeout_s, poll_s)
        cpu = {"python": time.process_time() - cpu0[0], "redis": None}
        if redis_cpu0 is not None:
            cpu["redis"] = await redis_cpu_seconds(probe) - redis_cpu0
        service.stopping.set()
        await asyncio.gather(*tasks)
        task = None
        snaps.append(await _memory(probe, prefix, cids))
        return t_end - first[0], first[0] - t_start, snaps, cpu
    finally:
        service.stopping.set()
        if task is not None:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await service.stop()
        await probe.aclose()


async def _memory(probe, prefix: str, cids: list[str], n: int | None = None) -> dict:
    """A memory snapshot: records counted (`n`, else read) and Redis bytes per classifier."""
    sizes = [await classifier_bytes(probe, prefix, c) for c in cids]
    return {"records": await counted(probe, prefix, cids) if n is None else n,
            "bytes_per_classifier": round(sum(sizes) / len(cids))}


async def _until_counted(probe, prefix: str, cids: list[str], records: int, memory_at: list[int], task,
                         timeout_s: float, poll_s: float) -> tuple[float, list[dict]]:
    """Poll Redis until the classifiers count `records` (raising if the consuming `task` ends
    or time runs out); returns when, and a memory snapshot at each of `memory_at` passed."""
    marks = sorted(m for m in memory_at if m < records)
    snaps: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while True:
        n = await counted(probe, prefix, cids)
        if n >= records:
            return time.perf_counter(), snaps
        if task.done():
            task.result()
            raise RuntimeError(f"the service stopped after counting {n} of {records} records")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the service counted {n} of {records} records in {timeout_s:.0f}s")
        if marks and n >= marks[0]:
            while marks and n >= marks[0]:
                marks.pop(0)
            snaps.append(await _memory(probe, prefix, cids, n))
        await asyncio.sleep(poll_s)
