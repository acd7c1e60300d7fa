"""The review groups' gauges (`metrics.exposition`): ``stratameter_review_budget_labels_per_hour``,
``..._granted`` and ``..._remaining``, a series per group with a shared budget (label ``group``),
every family there without one, and exported, as the service-wide series, by the designated
replica alone; with a stand-in service (settings and group store as `test_review_groups`'s)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stratameter.api.review_groups import GroupBudget
from stratameter.metrics import exposition
from stratameter.metrics.exposition import SnapshotCollector

from .test_review_groups import NOW_MS, SETTINGS, StandInGroups

NAMES = ("stratameter_review_budget_labels_per_hour", "stratameter_review_budget_granted",
         "stratameter_review_budget_remaining")


def _scrape(collector: SnapshotCollector) -> tuple[str, dict[tuple[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = {(s.name, s.labels["group"]): s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name in NAMES}
    return text, samples


def test_a_series_per_group_with_what_its_document_says():
    budgets = [GroupBudget("night", 100, 55, 10), GroupBudget("team", 3600, 1980, 2000)]
    text, samples = _scrape(SnapshotCollector([], {}, 0, {}, 0, {}, {}, review_budgets=budgets))
    assert samples == {
        ("stratameter_review_budget_labels_per_hour", "night"): 100, ("stratameter_review_budget_granted", "night"): 10,
        ("stratameter_review_budget_remaining", "night"): 45,
        ("stratameter_review_budget_labels_per_hour", "team"): 3600, ("stratameter_review_budget_granted", "team"): 2000,
        ("stratameter_review_budget_remaining", "team"): 0,  # never below 0
    }
    for name in NAMES:
        assert f"# TYPE {name} gauge" in text


def test_every_family_is_exported_without_a_group():
    """The dashboard's panel names them: a scrape without a review group still declares them."""
    text, samples = _scrape(SnapshotCollector([], {}, 0, {}, 0, {}, {}))
    assert samples == {}
    for name in NAMES:
        assert f"# TYPE {name} gauge" in text


def _service(exports_global: bool):
    offsets = SimpleNamespace(invalid_counts=_async({}), unknown_labels=_async(0))
    store = SimpleNamespace(groups=StandInGroups({"team": 500}), offsets=offsets)
    return SimpleNamespace(settings=SETTINGS, store=store, owned=set(), exports_global=exports_global, lag={},
                           dead_letters_dropped=0, failures=SimpleNamespace(of=lambda owned: {}),
                           health=SimpleNamespace(redis_errors={}),
                           state_watch=SimpleNamespace(losses=0, rollbacks=0))


def _async(value):
    async def read():
        return value
    return read


async def test_the_designated_replica_alone_exports_the_groups(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW_MS / 1000)
    _, samples = _scrape(await exposition._snapshot(_service(exports_global=True)))
    assert samples[("stratameter_review_budget_remaining", "team")] == 1980 - 500
    assert samples[("stratameter_review_budget_remaining", "night")] == 55
    assert samples[("stratameter_review_budget_granted", "team")] == 500
    _, samples = _scrape(await exposition._snapshot(_service(exports_global=False)))
    assert samples == {}
