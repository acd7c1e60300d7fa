"""The Redis client the service talks through: a single Redis (``redis.asyncio.Redis``) or,
with ``STRATAMETER_REDIS_CLUSTER=true``, a Redis Cluster (``redis.asyncio.RedisCluster``)
discovered from the node ``STRATAMETER_REDIS_URL`` names.  Both take the same URL forms
(``redis://``, ``rediss://`` with the same TLS files, ACL credentials); a cluster has only
database 0 and no ``unix://`` (the settings refuse both at start)."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from ..config import Settings

#: Connection options of the service's client (seconds).
TIMEOUTS = {"socket_timeout": 5, "socket_connect_timeout": 5, "health_check_interval": 10}


def connect(settings: Settings, **options) -> Redis | RedisCluster:
    """A client for the Redis (or Redis Cluster) the settings name; connects on first use.
    `options` override `TIMEOUTS`."""
    kwargs = {**TIMEOUTS, **settings.redis_client_kwargs(), **options}
    url = settings.redis_url_with_credentials()
    if settings.redis_cluster:
        return RedisCluster.from_url(url, **kwargs)
    return Redis.from_url(url, **kwargs)
