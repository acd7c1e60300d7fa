"""The Redis error counter the service's process and the Label Studio bridge both export, in one
place: the bridge reads it from here, without the service's exposition (its views of classifiers)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily
from redis.exceptions import OutOfMemoryError, ReadOnlyError

#: The causes `redis_error_cause` tells apart (the label of the Redis error counters).
REDIS_ERROR_CAUSES = ("out_of_memory", "read_only", "unavailable")


def redis_error_cause(exc: BaseException) -> str:
    """The cause of a Redis failure, as the Redis error counters label it: Redis at its maxmemory,
    a read-only replica (a failover pointed the service at one), or anything else."""
    if isinstance(exc, OutOfMemoryError):
        return "out_of_memory"
    if isinstance(exc, ReadOnlyError):
        return "read_only"
    return "unavailable"


def redis_errors_family(name: str, where: str, operations: tuple[str, ...],
                        counts: dict[tuple[str, str], int]) -> CounterMetricFamily:
    """``<name>_total{operation,cause}``: the Redis calls that failed in this `where` (the
    service's process, the bridge), by operation and cause (`redis_error_cause`), from
    `counts`.  Every series from the start, at 0: a series that appears at its first failure
    shows no ``increase()`` for it, and a short outage would never fire the alert on it."""
    family = CounterMetricFamily(
        name, f"Redis calls that failed in this {where}, by operation ({', '.join(operations)}) and cause: "
        "out_of_memory (Redis at its maxmemory refuses writes), read_only (a replica), unavailable (down, "
        "unreachable, timed out); the work is retried", labels=["operation", "cause"])
    counts = dict(counts)  # a snapshot: the bridge passes its live counts
    every = [(operation, cause) for operation in operations for cause in REDIS_ERROR_CAUSES]
    for key in every + sorted(set(counts) - set(every)):
        family.add_metric(list(key), counts.get(key, 0))
    return family
