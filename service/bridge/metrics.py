"""The bridge's Prometheus metrics (one registry per bridge; label values from fixed sets only).

  stratameter_bridge_requests_total{outcome}        label requests consumed: task_created, task_exists
                                                    (a replay or a second copy: no second task),
                                                    expired (arrived after expires_at: no task),
                                                    invalid (not a LabelRequest), rejected (Label
                                                    Studio refused the task)
  stratameter_bridge_answers_total{outcome,via}     annotations seen, via webhook / poll / expiry:
                                                    label_true, label_false, label_null (forwarded
                                                    to the labels topic), already_forwarded,
                                                    updated (ANNOTATION_UPDATED: counted, never
                                                    forwarded), unknown_choice, not_ours
  stratameter_bridge_answer_delay_seconds{via}      annotation created -> answer produced
  stratameter_bridge_webhook_errors_total{reason}   webhook bodies refused with 400
  stratameter_bridge_webhook_dropped_total          webhook events dropped on a full queue (polling
                                                    forwards them)
  stratameter_bridge_tasks_removed_total{reason}    tasks deleted: expired (the request's deadline
                                                    passed unanswered)
  stratameter_bridge_label_studio_errors_total{operation}   failed calls to Label Studio
  stratameter_bridge_redis_errors_total{operation,cause}    Redis's failures in this bridge, by
                                                    operation (requests: claiming and recording
                                                    tasks; webhook and poll: forwarding answers;
                                                    gauges; probe) and cause (out_of_memory,
                                                    read_only, unavailable), as the service's
                                                    stratameter_redis_errors_total
  stratameter_bridge_open_tasks                     tasks awaiting an answer (all replicas)
  stratameter_bridge_poll_lag_seconds               since a replica last completed a poll of Label
                                                    Studio (answers a lost webhook missed wait at
                                                    most this plus the poll interval)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from ..metrics.redis_errors import redis_errors_family
from .mapping import WEBHOOK_ERRORS

REQUEST_OUTCOMES = ("task_created", "task_exists", "expired", "invalid", "rejected")
ANSWER_OUTCOMES = ("label_true", "label_false", "label_null", "already_forwarded", "updated", "unknown_choice",
                   "not_ours")
VIAS = ("webhook", "poll", "expiry")
OPERATIONS = ("create_task", "read_task", "list_tasks", "delete_task", "user", "probe")
#: What the bridge was doing when Redis failed (`stratameter_bridge_redis_errors_total`).
REDIS_OPERATIONS = ("requests", "webhook", "poll", "gauges", "probe")


class RedisErrors:
    """``stratameter_bridge_redis_errors_total`` from the bridge's `Health` counts (`Health.redis_errors`,
    which its readiness probe adds to as well), every operation and cause from the start."""

    def __init__(self, counts: dict[tuple[str, str], int]) -> None:
        self.counts = counts

    def collect(self):
        yield redis_errors_family("stratameter_bridge_redis_errors", "bridge", REDIS_OPERATIONS, self.counts)


class BridgeMetrics:
    def __init__(self, redis_errors: dict[tuple[str, str], int]) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        r.register(RedisErrors(redis_errors))
        self.requests = Counter("stratameter_bridge_requests", "Label requests consumed, by outcome",
                                ["outcome"], registry=r)
        self.answers = Counter("stratameter_bridge_answers", "Annotations seen, by outcome and by the path that "
                               "found them", ["outcome", "via"], registry=r)
        self.delay = Histogram("stratameter_bridge_answer_delay_seconds", "From the annotation's creation to the "
                               "answer produced to the labels topic", ["via"], registry=r,
                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600))
        self.webhook_errors = Counter("stratameter_bridge_webhook_errors", "Webhook bodies refused with 400, by "
                                      "reason", ["reason"], registry=r)
        self.webhook_dropped = Counter("stratameter_bridge_webhook_dropped", "Webhook events dropped on a full "
                                       "queue (polling forwards their answers)", registry=r)
        self.removed = Counter("stratameter_bridge_tasks_removed", "Tasks deleted from Label Studio, by reason",
                               ["reason"], registry=r)
        self.ls_errors = Counter("stratameter_bridge_label_studio_errors", "Failed calls to Label Studio, by "
                                 "operation", ["operation"], registry=r)
        self.open_tasks = Gauge("stratameter_bridge_open_tasks", "Tasks awaiting an answer", registry=r)
        self.poll_lag = Gauge("stratameter_bridge_poll_lag_seconds", "Seconds since a replica last completed a "
                              "poll of Label Studio (-1: never)", registry=r)
        # every series exists from the start (a rate over a counter that appears late misses its first step)
        for o in REQUEST_OUTCOMES:
            self.requests.labels(o)
        for o in ANSWER_OUTCOMES:
            for v in VIAS:
                self.answers.labels(o, v)
        for v in VIAS:
            self.delay.labels(v)
        for reason in WEBHOOK_ERRORS:
            self.webhook_errors.labels(reason)
        self.removed.labels("expired")
        for op in OPERATIONS:
            self.ls_errors.labels(op)
        self.poll_lag.set(-1)
