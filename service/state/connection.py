"""What the Redis adapter's ports share (`store.Store` composes them over one of these): the
Redis client, the key names (`keys.Keys`), the registered scripts and their batch sender
(`dispatch.ScriptRunner`, cluster-aware).  Holds no state of the service's."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from .dispatch import ScriptRunner
from .keys import Keys


def text(value) -> str | None:
    """A reply's bytes as a string (None stays None)."""
    return value.decode() if isinstance(value, bytes) else value


class StateConnection:
    """One Redis client under one key prefix, with the scripts registered on it."""

    def __init__(self, redis: Redis | RedisCluster, prefix: str) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self.scripts = ScriptRunner(redis)

    def pipeline(self):
        """A pipeline without MULTI (a cluster client's is split by node)."""
        return self.redis.pipeline(transaction=False)

    async def hgets(self, keys: list[str], field: str) -> list:
        """HGET `field` of each of `keys`, in one pipeline."""
        pipe = self.pipeline()
        for key in keys:
            pipe.hget(key, field)
        return await pipe.execute()
