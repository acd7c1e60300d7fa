"""One label request for every member of a review group that shares items (`requests.shared_items`,
issue 52) against a real Redis and a Redis Cluster: a model and its shadow score the same 3,000
items; the shadow joins the model's requests instead of publishing its own, and each joined request
takes the model's answer (or skip) exactly once.  The request loop is the service's; the Kafka
producer is a list."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from stratameter.app.ownership import Leases
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.labels.folder import LabelFolder
from stratameter.requests.loop import RequestLoop
from stratameter.requests.shared_items import FEW_JOINS, RESOLVE_EVERY_MS
from stratameter.state.keys import negatives_of
from stratameter.state.process import ProcessState
from stratameter.state.store import Store
from tests.harness import stored_requests

pytestmark = pytest.mark.integration

N_ITEMS = 3000
PAIR = ("model", "shadow")


def truth(item_id: str) -> bool:
    """The reviewers' answer for an item: the same whichever classifier asked."""
    return int(item_id[1:]) % 3 == 0


def settings_for(backend, tmp_path: Path, share: bool = True, metrics: str = "precision"):
    groups = {"$review_groups": {"team": {"budget_per_hour": 100_000, "share_items": share}},
              "model": {"review_group": "team"}, "shadow": {"review_group": "team"}}
    path = tmp_path / "classifiers.json"
    path.write_bytes(orjson.dumps(groups))
    return load_settings({**{f"STRATAMETER_{k}": v for k, v in backend.settings.items()},
                          "STRATAMETER_INSTANCE_ID": "me", "STRATAMETER_MAX_LABELS_PER_HOUR": "100000",
                          "STRATAMETER_CLASSIFIERS_CONFIG_FILE": str(path), "STRATAMETER_METRICS": metrics})


class Published(list):
    """The label-requests topic: (key, value) records in the order published."""

    async def __call__(self, records) -> None:
        self.extend(records)

    def requests(self, cid: str) -> list[dict]:
        return [orjson.loads(v) for k, v in self if k == cid]


@pytest.fixture
async def fleet(redis_backend, unique_name, tmp_path):
    """A model and its shadow (its scores plus noise) over the same items, ingested, leases held."""

    async def make(share: bool = True, metrics: str = "precision"):
        settings = settings_for(redis_backend, tmp_path, share, metrics)
        negatives = metrics != "precision"  # recall: each side sampled, the threshold 0.5
        redis = redis_backend.client()
        clients.append(redis)
        store = Store(redis, unique_name("shared"))
        ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
        rng = np.random.default_rng(1)
        items = [f"i{j}" for j in range(N_ITEMS)]
        scores = rng.random(N_ITEMS)
        event_ms = int(time.time() * 1000) - 2 * 3_600_000  # a closed chunk: its rounds are not paced
        for offset, (cid, s) in enumerate((("model", scores),
                                           ("shadow", np.clip(scores + rng.normal(0, 0.05, N_ITEMS), 0, 1)))):
            positive = s >= 0.5 if negatives else np.ones(N_ITEMS, bool)
            await ingest.apply(offset, np.arange(N_ITEMS), [cid] * N_ITEMS, items, s, positive,
                               np.full(N_ITEMS, event_ms), [None] * N_ITEMS)
        leases = Leases(store.registry, settings.instance_id)
        await leases.renew()
        assert leases.owned == {"model", "shadow"}
        topic = Published()
        return store, RequestLoop(store, ProcessState(), settings, topic), topic

    clients: list = []
    yield make
    for redis in clients:
        await redis.aclose()


async def answer(store: Store, requests: list[dict], skip: set[str] = frozenset(), offset: int = 0) -> None:
    """Reviewers answer every request of `requests` (skipping the items of `skip`), as label records
    of partition 0 from `offset` on."""
    labels = [None if r["item_id"] in skip else truth(r["item_id"]) for r in requests]
    await LabelFolder(store.requests).apply(0, list(range(offset, offset + len(requests))),
                                            [r["request_id"] for r in requests], labels, ["rev"] * len(requests))


async def resolved(loop: RequestLoop, *sids: str) -> None:
    """What the loop's next step does once `RESOLVE_EVERY_MS` has passed: resolve the joined requests."""
    for sid in sids:
        await loop.shared_items.resolve(sid, int(time.time() * 1000))


async def requests_of(store: Store, sid: str) -> dict[str, dict]:
    """Every request of state `sid` still pending or just resolved, by item id."""
    return {orjson.loads(h["item"])["i"]: h for h in (await stored_requests(store.redis, store.keys, sid)).values()}


async def counters(store: Store, sid: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await store.redis.hgetall(store.keys.counters(sid))).items()
            if k != b"last_label_ms"}


async def test_each_item_is_requested_once_for_the_pair_and_each_answer_folded_once_into_each(fleet):
    """Six rounds: both loops step, the reviewers answer whatever was published (one item the shadow
    joined is skipped), the joined requests are resolved.  Whichever member asks first for an item
    publishes its request, the other joins it: the pair publishes each item once, and each joined
    request ends with the other's answer, folded once."""
    store, loop, topic = await fleet()
    seen, skipped = 0, None
    for _ in range(6):
        await loop.step("model")
        await loop.step("shadow")
        if skipped is None:
            skipped = min(item for item, h in (await requests_of(store, "shadow")).items() if h["state"] == "joined")
        await answer(store, [orjson.loads(v) for _, v in topic[seen:]], skip={skipped}, offset=seen)
        seen = len(topic)
        await resolved(loop, *PAIR)
    stored = {cid: await requests_of(store, cid) for cid in PAIR}
    published = {cid: {r["item_id"] for r in topic.requests(cid)} for cid in PAIR}
    joined = {cid: {item for item, h in stored[cid].items() if "joins" in h} for cid in PAIR}
    assert len(stored["shadow"]) >= 40 and len(joined["model"] | joined["shadow"]) >= 0.5 * len(stored["shadow"])
    assert not published["model"] & published["shadow"], "an item published twice for the pair"
    for cid, other in zip(PAIR, reversed(PAIR)):
        assert not joined[cid] & published[cid] and joined[cid] | published[cid] == set(stored[cid])
        assert joined[cid] <= published[other], "a joined request is never published"
        count = await counters(store, cid)
        assert count["requests_total"] == len(published[cid]) and count.get("requests_joined", 0) == len(joined[cid])
        assert await store.requests.issued_this_hour(cid, int(time.time() * 1000)) == len(published[cid])
        assert count.get("labels_shared", 0) == len(joined[cid] - {skipped})
        assert await store.requests.joins(cid) == {}
        for item in joined[cid] - {skipped}:
            mine, first = stored[cid][item], stored[other][item]
            assert mine["state"] == "answered" and mine["label"] == first["label"] == str(int(truth(item)))
            assert mine["labeler"] == "rev" and mine["joins"].startswith(f"{other}/")
    assert stored["shadow"][skipped]["state"] == "skipped" and (await counters(store, "shadow"))["labels_skipped"] == 1

    # resolving again, or the answers replayed, folds nothing twice
    before = {cid: await counters(store, cid) for cid in PAIR}
    await resolved(loop, *PAIR)
    await answer(store, [orjson.loads(v) for _, v in topic], offset=0)
    assert {cid: await counters(store, cid) for cid in PAIR} == before


async def test_the_predicted_negatives_join_too(fleet):
    """With recall each classifier samples both sides of its threshold; the shadow's two states join
    the model's requests of either side, and take their answers."""
    store, loop, topic = await fleet(metrics="precision,recall")
    seen = 0
    for _ in range(4):
        await loop.step("model")
        await loop.step("shadow")
        await answer(store, [orjson.loads(v) for _, v in topic[seen:]], offset=seen)
        seen = len(topic)
        await resolved(loop, *PAIR, negatives_of("model"), negatives_of("shadow"))
    for sid in ("shadow", negatives_of("shadow")):
        joined = [h for h in (await requests_of(store, sid)).values() if "joins" in h]
        assert len(joined) >= 20, sid
        for h in joined:
            assert h["state"] == "answered" and h["label"] == str(int(truth(orjson.loads(h["item"])["i"])))
    count = await counters(store, negatives_of("shadow"))
    assert count["labels_shared"] == count["requests_joined"] > 0


async def test_without_share_items_each_classifier_requests_its_own(fleet):
    store, loop, topic = await fleet(share=False)
    await loop.step("model")
    await loop.step("shadow")
    shadow = await requests_of(store, "shadow")
    assert shadow and all(h["state"] == "pending" for h in shadow.values())
    assert len(topic.requests("shadow")) == len(shadow)
    # independent priorities: the two samples share few items
    model = {r["item_id"] for r in topic.requests("model")}
    assert len(model & set(shadow)) < 0.3 * len(shadow)


async def test_many_joins_are_resolved_every_two_seconds_and_a_join_whose_first_is_gone_is_dropped(fleet):
    """150 joins of one answered request and one of a request that does not exist: while more than
    `FEW_JOINS` waited at the last resolve, a step resolves nothing until `RESOLVE_EVERY_MS` has
    passed; then the 150 take the answer, and the join of nothing is dropped (its request waits for
    its deadline)."""
    store, loop, topic = await fleet()
    await loop.step("model")
    first = topic.requests("model")[0]
    chunk = (await store.chunks.chunk_ids("shadow"))[-1]
    now = int(time.time() * 1000)
    rows = [[f"shadow/j{i}", 0, f"x{i}", "0.7", orjson.dumps({"i": f"x{i}", "s": 0.7}).decode(), first["request_id"]]
            for i in range(150)]
    rows.append(["shadow/orphan", 0, "x-orphan", "0.7", orjson.dumps({"i": "x-orphan", "s": 0.7}).decode(),
                 "model/never-issued"])
    assert len(await store.requests.issue("shadow", chunk, now, now + 600_000, 1, "me", rows, {}, 60_000)) == 151
    await answer(store, [first])
    memory = loop._remember("shadow")
    memory.resolved_ms, memory.joins_waiting = now, FEW_JOINS + 51
    await loop.step("shadow")
    assert len(await store.requests.joins("shadow")) == 151  # not resolved yet
    memory.resolved_ms -= RESOLVE_EVERY_MS
    await loop.step("shadow")
    assert await store.requests.joins("shadow") == {} and memory.joins_waiting == 0
    assert (await counters(store, "shadow"))["labels_shared"] == 150
    assert (await requests_of(store, "shadow"))["x-orphan"]["state"] == "joined"
