"""Outages: Kafka unreachable (the broker behind a `tansu proxy` that is stopped)
and Redis stopped and restarted.  The service keeps running, /readyz turns
false while it cannot work, it recovers by itself, and every count is exact."""

from __future__ import annotations

import asyncio
import re
import time

import orjson
import pytest

from redis.asyncio import Redis

from stratameter.embedded import EmbeddedRedis
from tests.harness import running_service, wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = 10


async def _scores(run, cid: str) -> int:
    status, body = await run.get(f"/v1/classifiers/{cid}")
    return orjson.loads(body)["scores"] if status == 200 else 0


async def _ready(run) -> bool:
    return (await run.get("/readyz"))[0] == 200


async def _not_ready(run) -> bool:
    return (await run.get("/readyz"))[0] == 503


async def test_kafka_outage_behind_proxy(kafka_bootstrap, kafka_proxy, redis_url, unique_name):
    async with running_service(kafka_bootstrap, redis_url, unique_name, service_bootstrap=kafka_proxy.bootstrap,
                               STRATA="2") as run:
        now = int(time.time() * 1000)
        for i in range(500):
            await run.send_score(classifier_id="k", item_id=f"a{i}", score=0.6 + i / 2000, event_time=now)
        await wait_for(lambda: _scores_at_least(run, "k", 500), 30, "first scores")
        await wait_for(lambda: _ready(run), 10, "ready")
        kafka_proxy.stop()
        for i in range(700):  # produced straight to the broker while the service cannot reach it
            await run.send_score(classifier_id="k", item_id=f"b{i}", score=0.6 + i / 2000, event_time=now)
        await run.producer.flush()
        await wait_for(lambda: _not_ready(run), 15, "/readyz to report the outage")
        await asyncio.sleep(OUTAGE_S)
        assert await _scores(run, "k") == 500
        kafka_proxy.start()
        await wait_for(lambda: _ready(run), 30, "recovery")
        await wait_for(lambda: _scores_at_least(run, "k", 1200), 60, "the backlog")
        await asyncio.sleep(2)
        assert await _scores(run, "k") == 1200


async def _restarted_mid_stream(run, redis, outage_s: float, counted: int) -> dict:
    """500 scores counted, Redis stopped, 800 more sent meanwhile, Redis started after `outage_s`;
    the classifier's document once `counted` scores are."""
    now = int(time.time() * 1000)
    for i in range(500):
        await run.send_score(classifier_id="r", item_id=f"a{i}", score=0.6 + i / 2000, event_time=now)
    await wait_for(lambda: _scores_at_least(run, "r", 500), 30, "first scores")
    redis.stop()
    for i in range(800):
        await run.send_score(classifier_id="r", item_id=f"b{i}", score=0.6 + i / 2000, event_time=now)
    await run.producer.flush()
    await wait_for(lambda: _not_ready(run), 15, "/readyz to report the outage")
    await asyncio.sleep(outage_s)
    redis.start()
    await wait_for(lambda: _ready(run), 30, "recovery")
    await wait_for(lambda: _scores_at_least(run, "r", counted), 60, "the backlog")
    await asyncio.sleep(2)
    status, body = await run.get("/v1/classifiers/r")
    return orjson.loads(body)


async def test_redis_restart_loses_and_duplicates_nothing(kafka_bootstrap, unique_name, tmp_path):
    # a Redis with an append-only file, as production runs it, so its data survives the restart
    with EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as redis:
        async with running_service(kafka_bootstrap, redis.url, unique_name, STRATA="2") as run:
            doc = await _restarted_mid_stream(run, redis, OUTAGE_S, 1300)
            assert doc["scores"] == 1300 and doc["population"] == 1300


async def test_a_redis_restarted_without_persistence_is_seen_as_a_lost_state(kafka_bootstrap, unique_name):
    """The same restart with a Redis that keeps nothing (no AOF, no snapshot): the service sees the
    loss (`app.state_watch`), counts it, and reports the chunk under way incomplete, counted from
    the restart: the records the outage held back, not the 500 Redis forgot."""
    with EmbeddedRedis() as redis:
        async with running_service(kafka_bootstrap, redis.url, unique_name, STRATA="2") as run:
            doc = await _restarted_mid_stream(run, redis, 0, 800)
            assert doc["scores"] == 800 and doc["population"] == 800
            assert doc["complete"] is False and doc["estimate"] is None and doc["pending"] == 0
            status, metrics = await run.get("/metrics")
            assert "stratameter_redis_state_lost_total 1.0" in metrics.decode()
            assert run.service.state_watch.losses == 1


def _redis_errors(response) -> dict[tuple[str, str], float]:
    """``stratameter_redis_errors_total`` of a /metrics response, by (operation, cause)."""
    status, body = response
    assert status == 200
    out = {}
    for m in re.finditer(r"^stratameter_redis_errors_total\{(.*)\} (\S+)$", body.decode(), re.M):
        labels = dict(re.findall(r'(\w+)="(\w+)"', m.group(1)))
        out[(labels["operation"], labels["cause"])] = float(m.group(2))
    return out


async def _scores_at_least(run, cid: str, n: int) -> bool:
    try:
        return await _scores(run, cid) >= n
    except (OSError, ValueError):
        return False


async def test_a_full_redis_stalls_ingest_and_loses_nothing(kafka_bootstrap, unique_name, caplog):
    """Redis at its maxmemory (no eviction, Redis's default policy) refuses every write but still
    answers PING: /readyz says 503 (its probe writes), each batch is retried with a warning naming
    the cause and the remedy, and once Redis has room every record is counted exactly once, the
    predicted negatives' side too (a script refused at its first write changes nothing)."""
    with EmbeddedRedis() as redis:
        client = Redis.from_url(redis.url)
        async with running_service(kafka_bootstrap, redis.url, unique_name, METRICS="precision,recall") as run:
            now = int(time.time() * 1000)

            async def send(cid: str, start: int, count: int, context: dict | None = None) -> None:
                for i in range(start, start + count):
                    await run.send_score(classifier_id=cid, item_id=f"i{i}", score=(i % 100) / 100,
                                         predicted_positive=i % 100 >= 50, event_time=now, context=context)
                await run.producer.flush()

            await send("c0", 0, 300)
            await wait_for(lambda: _scores_at_least(run, "c0", 300), 30, "the first scores")
            # well below what Redis uses: a limit just above it (it was 100 kB above) is crossed and
            # uncrossed by the clients' buffers alone (seen: 35-245 kB as pipelines came and went),
            # so the probe's write was refused, then taken, and the test flapped with /readyz
            used = (await client.info("memory"))["used_memory"]
            await client.config_set("maxmemory", str(used - 300_000))
            try:
                for c in range(20):
                    await send(f"c{c}", 300, 200, context={"text": "y" * 500})

                async def out_of_memory_logged() -> bool:
                    return any("Redis is out of memory" in r.getMessage() for r in caplog.records)

                await wait_for(out_of_memory_logged, 30, "the retried batch's warning naming the cause")
                assert sum([await _scores(run, f"c{c}") for c in range(20)]) < 300 + 20 * 200
                # it answers PING, but the readiness probe's write is refused too
                await wait_for(lambda: _not_ready(run), 15, "/readyz to report the full Redis")
                await asyncio.sleep(3)
                assert await _not_ready(run)
                refused = _redis_errors(await run.get("/metrics"))
                assert refused.get(("ingest", "out_of_memory"), 0) > 0 and refused.get(("probe", "out_of_memory"), 0) > 0
            finally:
                await client.config_set("maxmemory", "0")
            await wait_for(lambda: _ready(run), 15, "ready again")
            for c in range(20):
                await wait_for(lambda c=c: _scores_at_least(run, f"c{c}", 500 if c == 0 else 200), 60, "the backlog")
            await asyncio.sleep(2)
            for c in range(20):
                status, body = await run.get(f"/v1/classifiers/c{c}")
                doc = orjson.loads(body)
                assert (doc["scores"], doc["population"]) == ((500, 500) if c == 0 else (200, 200)), (c, doc)
        await client.aclose()



async def test_a_connection_torn_down_under_a_write_is_an_outage(redis_url):
    """redis-py's asyncio connection written to after a concurrent teardown raised an
    AttributeError from its transport, not a ConnectionError (redis/redis-py#4287; seen in CI as
    ``'NoneType' object has no attribute 'writelines'`` while a cluster master was killed, which
    ended the consume pipeline); redis-py 8.2 raises a ConnectionError there.  Whichever the
    installed redis-py raises, `redis_outage` takes it for an outage, so the batch is retried; the
    same AttributeError raised by our own code is not."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from stratameter.app.failures import redis_outage

    client = Redis.from_url(redis_url)
    conn = await client.connection_pool.get_connection()
    try:
        await conn.connect()
        conn._writer = None  # what a teardown leaves behind while the write is under way (CI's frame)
        with pytest.raises((AttributeError, RedisConnectionError)) as leaked:
            await conn._send_packed_command(conn.pack_command("PING"))
        assert redis_outage(leaked.value)
    finally:
        await client.connection_pool.release(conn)
        await client.aclose()
    with pytest.raises(AttributeError) as ours:
        None.writelines([])  # noqa: B018 - a bug of ours, not Redis failing
    assert not redis_outage(ours.value)


async def test_the_label_studio_bridge_probes_redis_with_a_write(unique_name):
    """The bridge's readiness probe is the service's (`probe_redis`): a full Redis answers PING,
    but the bridge could record neither claims nor tasks, so its probe fails (it PINGed only,
    and stayed ready)."""
    from redis.exceptions import OutOfMemoryError

    from stratameter.bridge.bridge import Bridge
    from stratameter.config import load_settings

    with EmbeddedRedis() as redis:
        bridge = Bridge(load_settings({"STRATAMETER_REDIS_URL": redis.url, "STRATAMETER_LABEL_STUDIO_TOKEN": "t0k3n",
                                       "STRATAMETER_REDIS_KEY_PREFIX": unique_name("br"),
                                       "STRATAMETER_INSTANCE_ID": unique_name("bridge")}))
        client = Redis.from_url(redis.url)
        try:
            await bridge._probe_redis()
            assert await client.exists(bridge.keys.probe(bridge.settings.instance_id))
            used = (await client.info("memory"))["used_memory"]
            await client.config_set("maxmemory", str(used - 300_000))
            assert await bridge.redis.ping()
            with pytest.raises(OutOfMemoryError):
                await bridge._probe_redis()
            await client.config_set("maxmemory", "0")
            await bridge._probe_redis()
        finally:
            await client.aclose()
            await bridge.redis.aclose()
            await bridge.ls.aclose()


async def test_the_label_studio_bridge_counts_redis_failures(unique_name):
    """A full Redis, as the bridge meets it: its probe and its poll (the poll lease is a write) are
    refused; each refusal is counted in ``stratameter_bridge_redis_errors_total`` by operation and
    cause (every series is there from the start, at 0) and the bridge is not ready meanwhile."""
    from prometheus_client import generate_latest

    from stratameter.bridge.bridge import Bridge
    from stratameter.bridge.metrics import REDIS_OPERATIONS
    from stratameter.config import load_settings

    def errors(bridge) -> dict[tuple[str, str], float]:
        text = generate_latest(bridge.metrics.registry).decode()
        series = [(dict(re.findall(r'(\w+)="(\w+)"', labels)), float(v)) for labels, v in
                  re.findall(r'^stratameter_bridge_redis_errors_total\{([^}]*)\} (\S+)$', text, re.M)]
        return {(labels["operation"], labels["cause"]): v for labels, v in series}

    with EmbeddedRedis() as redis:
        bridge = Bridge(load_settings({"STRATAMETER_REDIS_URL": redis.url, "STRATAMETER_LABEL_STUDIO_TOKEN": "t0k3n",
                                       "STRATAMETER_REDIS_KEY_PREFIX": unique_name("br"),
                                       "STRATAMETER_INSTANCE_ID": unique_name("bridge"),
                                       "STRATAMETER_LABEL_STUDIO_POLL_SECONDS": "0.2"}))
        client = Redis.from_url(redis.url)
        try:
            before = errors(bridge)
            assert len(before) == 3 * len(REDIS_OPERATIONS) and not any(before.values()), before
            await bridge._probe_redis()
            bridge.health.redis_ok()
            bridge.health.kafka_ok_at = time.time()
            assert bridge.health.ready()
            used = (await client.info("memory"))["used_memory"]
            await client.config_set("maxmemory", str(used - 300_000))

            async def kafka_answers() -> None:
                pass

            loops = asyncio.gather(bridge.health.probe_forever(kafka_answers, bridge._probe_redis, bridge.stopping),
                                   bridge.poller.forever())
            async def both_counted() -> bool:
                now = errors(bridge)
                return now[("poll", "out_of_memory")] >= 2 and now[("probe", "out_of_memory")] >= 1

            await wait_for(both_counted, 10, "the poll's and the probe's refusals counted")
            assert not bridge.health.ready()
            bridge.stopping.set()
            await asyncio.wait_for(loops, 10)
            after = errors(bridge)
            assert {k for k, v in after.items() if v} == {("poll", "out_of_memory"), ("probe", "out_of_memory")}, after
        finally:
            await client.config_set("maxmemory", "0")
            await client.aclose()
            await bridge.redis.aclose()
            await bridge.ls.aclose()


def test_redis_errors_are_labelled_by_cause():
    from redis.exceptions import ConnectionError, OutOfMemoryError, ReadOnlyError

    from stratameter.app.probes import Health
    from stratameter.metrics.redis_errors import redis_error_cause

    assert [redis_error_cause(e) for e in (OutOfMemoryError("oom"), ReadOnlyError("ro"), ConnectionError("down"),
                                           asyncio.TimeoutError(), OSError("reset"))] == \
        ["out_of_memory", "read_only", "unavailable", "unavailable", "unavailable"]
    health = Health()
    health.redis_ok()
    health.count_redis_error(OutOfMemoryError("oom"), "probe")  # a failed probe: readiness lapses by itself
    assert health.redis_ok_at > 0
    health.redis_failed(OutOfMemoryError("oom"), "ingest")
    health.redis_failed(OutOfMemoryError("oom"), "ingest")
    assert health.redis_ok_at == 0
    assert health.redis_errors == {("probe", "out_of_memory"): 1, ("ingest", "out_of_memory"): 2}


def test_redis_errors_are_exported_from_the_start():
    """Every operation and cause is a series at 0 before its first failure (else ``increase()``
    misses that failure and a short outage never fires StratameterRedisFailing), in the service's
    counter as in the bridge's; a count under an operation not listed is still exported."""
    from stratameter.metrics.exposition import REDIS_OPERATIONS
    from stratameter.metrics.redis_errors import REDIS_ERROR_CAUSES, redis_errors_family

    family = redis_errors_family("stratameter_redis_errors", "process", REDIS_OPERATIONS,
                                 {("ingest", "out_of_memory"): 2, ("other", "unavailable"): 1})
    got = {(s.labels["operation"], s.labels["cause"]): s.value for s in family.samples}
    assert got == {**{(op, c): 0 for op in REDIS_OPERATIONS for c in REDIS_ERROR_CAUSES},
                   ("ingest", "out_of_memory"): 2, ("other", "unavailable"): 1}
    assert family.name == "stratameter_redis_errors" and family.type == "counter"
    assert "in this process, by operation (ingest, request_loop, leases, probe)" in family.documentation
