"""How the ports run the scripts (`ScriptRunner`): one call (`call`), or a batch of calls
(`each`): one pipeline of bare EVALSHA on a single Redis; on a Redis Cluster, whose client
refuses scripts in a pipeline, one pipeline per node, and what a node refused again one by one
through the cluster client.  A classifier's calls always stay in order (the scripts' offset
guards expect them so)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import AskError, ConnectionError, MovedError, NoScriptError, RedisError

from . import scripts

#: Classifiers whose script calls are sent one by one at once on a cluster (its client allows 100
#: connections per node).
CLUSTER_CONCURRENCY = 32


def _hash_tag(key: str) -> str:
    """The hash tag of `key` (``{cid}``): the classifier whose slot holds it."""
    return key[key.index("{") + 1: key.index("}")]


class ScriptRunner:
    """The scripts (`scripts.NAMES`) registered on `redis` (`registered`: name -> redis-py's
    script object), and calls of them, one at a time or in batches."""

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self.redis = redis
        self.cluster = isinstance(redis, RedisCluster)
        self.registered = {name: redis.register_script(scripts.source(name)) for name in scripts.NAMES}
        self._concurrent = asyncio.Semaphore(CLUSTER_CONCURRENCY)

    async def call(self, name: str, keys: list, args: list | tuple = ()):
        """Script `name` once, with `keys` and `args` (the client loads it on NOSCRIPT)."""
        return await self.registered[name](keys=keys, args=list(args))

    async def each(self, name: str, calls: list[tuple[list, list]], then=None) -> list:
        """Script `name` per (keys, args), in order per classifier, with `then(pipe)` (plain
        commands) after them: one pipeline on a single Redis (`_pipelined`); on a cluster, which
        refuses scripts in a pipeline, each classifier's calls one after the other (the scripts'
        guards expect a classifier's calls in order), classifiers concurrently.  The client
        reloads a script after NOSCRIPT (a restarted or failed-over node)."""
        if not self.cluster:
            return (await self._pipelined(name, calls, then))[: len(calls)]
        out: list = [None] * len(calls)
        failed = await self._per_node(name, calls, out)
        by_classifier: dict[str, list[int]] = defaultdict(list)
        for i in failed:
            by_classifier[_hash_tag(calls[i][0][0])].append(i)

        async def run(indices: list[int]) -> None:
            async with self._concurrent:
                for i in indices:
                    out[i] = await self.registered[name](keys=calls[i][0], args=calls[i][1])

        await asyncio.gather(*(run(ix) for ix in by_classifier.values()))
        if then is not None:
            pipe = self.redis.pipeline(transaction=False)
            then(pipe)
            await pipe.execute()
        return out

    async def _per_node(self, name: str, calls: list[tuple[list, list]], out: list) -> list[int]:
        """The fast path of `each` on a cluster: the calls grouped by the node that serves their
        slot, each group sent as one pipeline of bare EVALSHA on one of that node's connections
        (what the cluster client's own pipeline does for plain commands; a classifier's calls stay
        in order).  Fills `out`; returns the calls to send again one by one through the cluster
        client, in order: those refused without running (MOVED or ASK while slots move, NOSCRIPT
        on a restarted node) and every call of a node that could not be reached."""
        from redis.asyncio.cluster import PipelineCommand

        await self.redis.initialize()
        sha = self.registered[name].sha
        by_node: dict = defaultdict(list)
        for i, (keys, _) in enumerate(calls):
            by_node[self.redis.get_node_from_key(keys[0])].append(i)
        failed: list[int] = []

        async def send(node, indices: list[int]) -> None:
            commands = [PipelineCommand(i, "EVALSHA", sha, len(calls[i][0]), *calls[i][0], *calls[i][1])
                        for i in indices]
            try:
                await node.execute_pipeline(commands)
            except (RedisError, OSError):
                failed.extend(indices)
                return
            for i, command in zip(indices, commands):
                if isinstance(command.result, (MovedError, AskError, NoScriptError, ConnectionError)):
                    failed.append(i)
                elif isinstance(command.result, Exception):
                    raise command.result
                else:
                    out[i] = command.result

        await asyncio.gather(*(send(node, ix) for node, ix in by_node.items()))
        return sorted(failed)

    async def _pipelined(self, name: str, calls: list[tuple[list, list]], then=None) -> list:
        """Script `name` per (keys, args) in one pipeline, as bare EVALSHA (with ``client=pipe``
        redis-py sends SCRIPT EXISTS first, one more round trip); `then(pipe)` adds commands.  On
        NOSCRIPT the scripts are loaded and it is sent again (what NOSCRIPT refused ran nothing)."""
        for retry in (False, True):
            pipe = self.redis.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(self.registered[name].sha, len(keys), *keys, *args)
            if then is not None:
                then(pipe)
            try:
                return await pipe.execute()
            except NoScriptError:
                if retry:
                    raise
                for script in self.registered.values():
                    script.sha = await self.redis.script_load(script.script)
