"""Prometheus exposition computed at scrape time (client_python's custom
collector pattern): the async scrape handler reads the shared state for the
classifiers this instance owns, then a collector turns that snapshot into
metric families.  Names follow Prometheus conventions: `_ratio` for 0-1
values, `_total` for counters, base units (seconds)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from stratameter.schemas.messages import LABEL_OUTCOMES
from stratameter.schemas.times import rfc3339_to_ms

from ..api.review_groups import GroupBudget, group_budgets, member_budget
from ..api.views import classifier_view, finish_windows
from ..chunks.lifecycle import STATUSES
from .redis_errors import redis_errors_family

#: What the service was doing when Redis failed (`app.probes.Health.redis_failed`; the label of
#: ``stratameter_redis_errors_total``): the ingest's checkpoint, the request loop, its leases, the
#: readiness probe.
REDIS_OPERATIONS = ("ingest", "request_loop", "leases", "probe")

#: classifiers read at once per scrape
READ_CONCURRENCY = 32
#: per-classifier gauges: (name, help)
_GAUGES = (
    ("stratameter_precision_ratio", "Stratified precision estimate of the reported chunk"),
    ("stratameter_precision_ci_lower_ratio", "Lower bound of the precision confidence interval"),
    ("stratameter_precision_ci_upper_ratio", "Upper bound of the precision confidence interval"),
    ("stratameter_precision_stderr_ratio", "Standard error of the precision estimate"),
    ("stratameter_labels_pending", "Label requests awaiting an answer"),
    ("stratameter_last_label_timestamp_seconds", "Time the last label was folded"),
    ("stratameter_label_budget_remaining", "Label requests the paced hourly budget allows now "
                                           "(0: labelling waits for the budget)"),
)
#: the other metrics' gauges (`METRICS`), named as precision's; a classifier exports those it enables
_METRIC_GAUGES = tuple(
    (m, key, f"stratameter_{m}{suffix}_ratio", f"{what} of the reported chunk's {m} (`STRATAMETER_METRICS`)")
    for m in ("recall", "f1", "accuracy")
    for key, suffix, what in (("estimate", "", "Stratified estimate"), ("ci_lower", "_ci_lower", "Lower bound"),
                              ("ci_upper", "_ci_upper", "Upper bound"), ("stderr", "_stderr", "Standard error")))
#: the windows' and the last closed chunk's gauges, per metric: (view key, name suffix, what)
_WINDOW_FIELDS = (("estimate", "", "Stratified estimate"), ("ci_lower", "_ci_lower", "Lower bound"),
                  ("ci_upper", "_ci_upper", "Upper bound"), ("stderr", "_stderr", "Standard error"))
#: the window label of the last closed chunk's series
LAST_CLOSED = "last_closed"
#: the estimate's gauges: (view key, name); absent while there is no estimate
_ESTIMATE = (("estimate", "stratameter_precision_ratio"),
             ("ci_lower", "stratameter_precision_ci_lower_ratio"),
             ("ci_upper", "stratameter_precision_ci_upper_ratio"),
             ("stderr", "stratameter_precision_stderr_ratio"))
#: per-classifier counters: (view key, name, help)
_COUNTERS = (
    ("scores", "stratameter_scores", "Score records counted"),
    ("label_requests", "stratameter_label_requests", "Label requests issued"),
    ("label_requests_joined", "stratameter_label_requests_joined",
     "Label requests that joined another classifier's request for the same item (a review group that "
     "shares items): never published, answered by that request's answer"),
    ("requests_expired", "stratameter_label_requests_expired",
     "Label requests that reached their deadline unanswered (then replaced)"),
)
#: per review group gauges (label `group`, the groups with a shared budget): (`GroupBudget` field, name, help)
_REVIEW_GAUGES = (
    ("budget_per_hour", "stratameter_review_budget_labels_per_hour",
     "Labels an hour the review group's shared budget allows (configured)"),
    ("granted_this_hour", "stratameter_review_budget_granted",
     "Labels granted to the review group's classifiers in the current clock hour"),
    ("remaining", "stratameter_review_budget_remaining",
     "Labels the review group's paced budget allows now beyond those granted this hour "
     "(0: its classifiers wait for the budget)"),
)
#: per-stratum gauges: (name, help)
_STRATUM_GAUGES = (
    ("stratameter_stratum_items", "Items in the stratum (reported chunk; predicted negatives from stratum K)"),
    ("stratameter_stratum_labels", "Labels folded in the stratum (reported chunk)"),
    ("stratameter_stratum_precision_ratio", "Share of truly positive items among the stratum's labels"),
    ("stratameter_stratum_upper_score", "Upper score boundary of the stratum"),
)


class SnapshotCollector:
    def __init__(self, views: list[dict], invalid: dict[tuple[str, str], int], unknown_global: int,
                 lag: dict[tuple[str, int], int], dropped: int, failures: dict[tuple[str, str], int],
                 redis_errors: dict[tuple[str, str], int], state_losses: int = 0, rollbacks: int = 0,
                 review_budgets: list[GroupBudget] | tuple = ()) -> None:
        self.views, self.invalid, self.unknown_global, self.lag, self.dropped = views, invalid, unknown_global, lag, dropped
        self.failures, self.redis_errors, self.state_losses = failures, redis_errors, state_losses
        self.rollbacks, self.review_budgets = rollbacks, review_budgets

    def collect(self):
        gauges = {name: GaugeMetricFamily(name, doc, labels=["classifier"]) for name, doc in _GAUGES}
        gauges.update({name: GaugeMetricFamily(name, doc, labels=["classifier"])
                       for _, _, name, doc in _METRIC_GAUGES})
        counters = {key: CounterMetricFamily(name, doc, labels=["classifier"]) for key, name, doc in _COUNTERS}
        labels = CounterMetricFamily("stratameter_labels", "Label records by outcome", labels=["classifier", "outcome"])
        per_stratum = {name: GaugeMetricFamily(name, doc, labels=["classifier", "stratum"])
                       for name, doc in _STRATUM_GAUGES}
        status = GaugeMetricFamily("stratameter_chunk_status",
                                   "The reported chunk's status, a state set: 1 for the status it has, 0 for "
                                   f"the others ({', '.join(STATUSES)})", labels=["classifier", "status"])
        windows = {(m, key): GaugeMetricFamily(f"stratameter_{m}_window{suffix}_ratio",
                                               f"{what} of {m} pooled over a window of chunks (`STRATAMETER_WINDOWS`), "
                                               f"or of the last closed chunk (window=\"{LAST_CLOSED}\")",
                                               labels=["classifier", "window"])
                   for m in ("precision", "recall", "f1", "accuracy") for key, suffix, what in _WINDOW_FIELDS}
        unknown = self.unknown_global
        for v in self.views:
            _add_classifier(v, gauges, counters)
            _add_windows(v, windows)
            for name in STATUSES:
                status.add_metric([v["classifier_id"], name], float(v["status"] == name))
            unknown += _add_labels(v, labels)
            _add_strata(v["classifier_id"], v["strata"], per_stratum)
        labels.add_metric(["", "unknown"], unknown)
        yield from gauges.values()
        yield from counters.values()
        yield labels
        yield from per_stratum.values()
        yield from windows.values()
        yield status
        failures = CounterMetricFamily("stratameter_classifier_failures",
                                       "Failures confined to the classifier in this process, by stage: request_loop "
                                       "(it gets no new label requests while they last), metrics (its series are "
                                       "left out of this scrape); the log names the error",
                                       labels=["classifier", "stage"])
        for (cid, stage), n in self.failures.items():
            failures.add_metric([cid, stage], n)
        yield failures
        yield redis_errors_family("stratameter_redis_errors", "process", REDIS_OPERATIONS, self.redis_errors)
        yield from self._service_wide()
        yield from _review_budget_families(self.review_budgets)

    def _service_wide(self):
        """Rejected records by topic and reason, consumer lag, dead letters dropped, state losses and rollbacks seen."""
        invalid = CounterMetricFamily("stratameter_invalid_messages", "Rejected input records (dead-lettered)",
                                      labels=["topic", "reason"])
        for (topic, reason), c in sorted(self.invalid.items()):
            invalid.add_metric([topic, reason], c)
        lag = GaugeMetricFamily("stratameter_consumer_lag_records", "Records behind the partition end",
                                labels=["topic", "partition"])
        for (topic, part), n in sorted(self.lag.items()):
            lag.add_metric([topic, str(part)], n)
        dropped = CounterMetricFamily("stratameter_dead_letters_dropped", "Dead letters not produced (rate limit)")
        dropped.add_metric([], self.dropped)
        lost = CounterMetricFamily("stratameter_redis_state_lost",
                                   "Times this process found that Redis had lost the state (restarted without "
                                   "persistence, or flushed): the chunks under way are reported incomplete")
        lost.add_metric([], self.state_losses)
        rolled_back = CounterMetricFamily("stratameter_redis_state_rolled_back",
                                          "Partitions this process read again from the offset Redis kept as applied, "
                                          "Redis having lost acknowledged writes (restarted from an older snapshot)")
        rolled_back.add_metric([], self.rollbacks)
        return invalid, lag, dropped, lost, rolled_back


def _review_budget_families(budgets: list[GroupBudget] | tuple) -> list[GaugeMetricFamily]:
    """The review groups' gauges, a series a group with a shared budget (`GroupBudget`s); each
    family is exported even without a group."""
    families = []
    for field, name, doc in _REVIEW_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=["group"])
        for b in budgets:
            family.add_metric([b.group], getattr(b, field))
        families.append(family)
    return families


def _add_classifier(v: dict, gauges: dict, counters: dict) -> None:
    """One classifier's view into the per-classifier gauges and counters."""
    cid = v["classifier_id"]
    for key, name in _ESTIMATE:
        if v[key] is not None:
            gauges[name].add_metric([cid], v[key])
    for metric, key, name, _ in _METRIC_GAUGES:
        value = v["metrics"].get(metric, {}).get(key)
        if value is not None:
            gauges[name].add_metric([cid], value)
    gauges["stratameter_labels_pending"].add_metric([cid], v["pending"])
    gauges["stratameter_label_budget_remaining"].add_metric([cid], v["label_budget_remaining"])
    if v["last_label_at"] is not None:
        gauges["stratameter_last_label_timestamp_seconds"].add_metric([cid], rfc3339_to_ms(v["last_label_at"]) / 1000)
    for key, counter in counters.items():
        counter.add_metric([cid], v[key])


def _add_windows(v: dict, windows: dict) -> None:
    """Each window's and the last closed chunk's intervals, per enabled metric, while they exist."""
    series = {name: w["metrics"] for name, w in v.get("windows", {}).items()}
    if v.get("last_closed") is not None:
        series[LAST_CLOSED] = v["last_closed"]["metrics"]
    for window, metrics in series.items():
        for m, doc in metrics.items():
            for key, _, _ in _WINDOW_FIELDS:
                if doc.get(key) is not None:
                    windows[m, key].add_metric([v["classifier_id"], window], doc[key])


def _add_labels(v: dict, labels: CounterMetricFamily) -> int:
    """The classifier's labels by outcome but `unknown`; returns its `unknown` ones (exported
    summed, under classifier "")."""
    unknown = 0
    for o in LABEL_OUTCOMES:
        if o == "unknown":
            unknown += v["labels_by_outcome"][o]
            continue
        labels.add_metric([v["classifier_id"], o], v["labels_by_outcome"][o])
    return unknown


def _add_strata(cid: str, strata: list[dict], per_stratum: dict) -> None:
    for s in strata:
        k = str(s["stratum"])
        per_stratum["stratameter_stratum_items"].add_metric([cid, k], s["items"])
        per_stratum["stratameter_stratum_labels"].add_metric([cid, k], s["labels"])
        if s["precision"] is not None:
            per_stratum["stratameter_stratum_precision_ratio"].add_metric([cid, k], s["precision"])
        if s["upper_score"] is not None:
            per_stratum["stratameter_stratum_upper_score"].add_metric([cid, k], s["upper_score"])


class Exporter:
    """One registry per service, built once: the process and platform collectors and one
    `SnapshotCollector` whose snapshot each scrape replaces (client_python's custom
    collector pattern).  A lock keeps two concurrent scrapes from mixing snapshots."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.snapshot = SnapshotCollector([], {}, 0, {}, 0, {}, {})
        self.registry.register(_Current(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.lock = asyncio.Lock()

    async def render(self, service) -> bytes:
        async with self.lock:
            self.snapshot = await _snapshot(service)
            return generate_latest(self.registry)


class _Current:
    """Registered once; yields whatever the exporter's current snapshot holds."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def collect(self):
        return self.exporter.snapshot.collect()


async def _snapshot(service) -> SnapshotCollector:
    """Read the classifiers this instance owns, and the service-wide series (the review groups'
    budgets among them) if it is their designated exporter (see runner.GLOBAL_SERIES_OWNER).  The
    classifiers are read `READ_CONCURRENCY` at a time: each read is a few round trips, which overlap
    (on a Redis Cluster, on several nodes at once)."""
    gate = asyncio.Semaphore(READ_CONCURRENCY)
    windows: list = []  # every classifier's windows, pooled together once all are read
    budgets = await group_budgets(service.store.groups, service.settings, int(time.time() * 1000))

    async def view(cid: str) -> dict | None:
        """The classifier's figures; None (its series left out, the others' exported) where it
        fails on its own (`app.failures.ClassifierFailures.confined`)."""
        cfg = service.settings.for_classifier(cid)
        async with gate:
            return await service.failures.confined(cid, "metrics", classifier_view(
                service.store.chunks, service.process, cid, cfg, history=False, later=windows,
                group=member_budget(budgets, service.settings, cid)))

    owned = sorted(service.owned)
    views = [v for v in await asyncio.gather(*(view(c) for c in owned)) if v is not None]
    finish_windows(windows)
    if service.exports_global:
        invalid = await service.store.offsets.invalid_counts()
        unknown = await service.store.offsets.unknown_labels()
    else:
        invalid, unknown = {}, 0
    return SnapshotCollector(views, invalid, unknown, dict(service.lag), service.dead_letters_dropped,
                             service.failures.of(owned), dict(service.health.redis_errors),
                             service.state_watch.losses, service.state_watch.rollbacks,
                             list(budgets.values()) if service.exports_global else [])


async def render(service) -> bytes:
    """The /metrics body for `service` (its `Exporter`, created on the first scrape)."""
    exporter = getattr(service, "metrics_exporter", None)
    if exporter is None:
        exporter = service.metrics_exporter = Exporter()
    return await exporter.render(service)
