"""A review group's shared budget against a real Redis (`api.review_groups`, `state.group_store`):
labels granted in the group's slot (GRANT) read back in ``/v1/review-groups/{group}``, in a member
classifier's document (its ``review_group``, its ``label_budget_remaining`` capped by the group's)
and in the ``stratameter_review_budget_*`` gauges.  The group is configured as an operator does, in
``CLASSIFIERS_CONFIG_FILE`` (``$review_groups``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stratameter.api import http
from stratameter.chunks.lifecycle import allowance_at
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.metrics import exposition
from stratameter.state.process import ProcessState
from stratameter.state.store import Store

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


#: classifiers `a` and `b` in review group ``team`` (1,000 labels an hour); the others in ``default``,
#: which has no shared budget
CLASSIFIERS_FILE = {"$review_groups": {"team": {"budget_per_hour": 1000}}, "a": {"review_group": "team"},
                    "b": {"review_group": "team"}}


class Failures:
    async def confined(self, cid: str, stage: str, read):
        return await read

    def of(self, owned) -> dict:
        return {}


def _service(store: Store, settings) -> SimpleNamespace:
    """What `http.route` and the scrape read of the service: one replica owning `a` and `c`."""
    return SimpleNamespace(store=store, settings=settings, process=ProcessState(), owned={"a", "c"},
                           exports_global=True, failures=Failures(), lag={}, dead_letters_dropped=0,
                           health=SimpleNamespace(redis_errors={}), state_watch=SimpleNamespace(losses=0, rollbacks=0))


async def _get(service, path: str) -> dict | list:
    head, _, body = (await http.route(service, "GET", path)).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return orjson.loads(body)


async def test_granted_labels_show_in_the_group_its_classifiers_and_the_gauges(store: Store, monkeypatch, tmp_path):
    now_ms = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS + 1_800_500  # 1,800.5 s into this clock hour
    monkeypatch.setattr(time, "time", lambda: now_ms / 1000)
    (tmp_path / "classifiers.json").write_bytes(orjson.dumps(CLASSIFIERS_FILE))
    settings = load_settings({"STRATAMETER_REDIS_URL": "redis://unused", "STRATAMETER_INSTANCE_ID": "me",
                              "STRATAMETER_MAX_LABELS_PER_HOUR": "100000",
                              "STRATAMETER_CLASSIFIERS_CONFIG_FILE": str(tmp_path / "classifiers.json")})
    assert settings.review_budgets == {"team": 1000} and settings.group_of("c") is None
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    n = 20
    for offset, cid in enumerate(("a", "c")):  # `b` is in the group but not known: never scored
        await ingest.apply(0, np.arange(offset * n, (offset + 1) * n), [cid] * n, [f"{cid}{i}" for i in range(n)],
                           np.linspace(0.5, 1, n), np.ones(n, bool), np.full(n, now_ms - 60_000), [None] * n)
    allowance = allowance_at(1000, now_ms)
    assert allowance == 550  # 100 at the top of the hour + 900 x 1,800 / 3,600
    assert await store.groups.grant("team", now_ms, allowance, 300) == 300
    service = _service(store, settings)

    team = {"group": "team", "budget_per_hour": 1000, "allowed_now": 550, "granted_this_hour": 300,
            "remaining": 250, "classifiers": ["a"]}
    assert await _get(service, "/v1/review-groups/team") == team
    assert await _get(service, "/v1/review-groups") == [team]
    a, c = await _get(service, "/v1/classifiers/a"), await _get(service, "/v1/classifiers/c")
    assert a["review_group"] == "team" and a["label_budget_remaining"] == 250  # its own: 55,000
    assert c["review_group"] is None and c["label_budget_remaining"] == 55_000

    text = generate_latest(_registry(await exposition._snapshot(service))).decode()
    samples = {(s.name, s.labels.get("group") or s.labels.get("classifier")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("stratameter_review_budget_labels_per_hour", "team")] == 1000
    assert samples[("stratameter_review_budget_granted", "team")] == 300
    assert samples[("stratameter_review_budget_remaining", "team")] == 250
    assert samples[("stratameter_label_budget_remaining", "a")] == 250
    assert samples[("stratameter_label_budget_remaining", "c")] == 55_000

    # the rest of what the pacing allows: the group has nothing left, and its member neither
    assert await store.groups.grant("team", now_ms, allowance, 400) == 250
    assert (await _get(service, "/v1/review-groups/team"))["remaining"] == 0
    assert (await _get(service, "/v1/classifiers/a"))["label_budget_remaining"] == 0


def _registry(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
