"""The Redis adapter: every Redis call of the service, as five ports over one connection.

* `chunks` (`chunk_store.ChunkStore`): chunks, strata, histograms, reservoirs, INGEST;
* `requests` (`request_store.RequestStore`): label requests (ISSUE, EXPIRE, LABEL, the outbox),
  the request loop's verdicts, retention (purge, FORGET);
* `offsets` (`offset_store.OffsetStore`): the states' stored offsets, the guarded service-wide
  counts, the partitions' applied and acknowledged marks;
* `registry` (`registry.Registry`): the service-wide classifiers, leases, heartbeats, the noted
  settings;
* `groups` (`group_store.GroupStore`): review groups' shared label budgets and forecasts, and the
  first request of each item in a group that shares items (CLAIM).

`Store` is the one object the app wires; each component is handed the port it uses (the ingestor,
the request loop and the state watch, which use several, the `Store`, and keep their ports).  The
ports share one `connection.StateConnection`: the client, the key names (`keys.Keys`), the scripts
(``lua/*.lua``, `scripts`) and their batch sender (`dispatch.ScriptRunner`).  On a Redis Cluster
(``redis.asyncio.RedisCluster``) every script call keeps its keys in one classifier's slot; the
cluster client refuses scripts in a pipeline, so a batch's script calls go as one pipeline per
node, and what a node refused again classifier by classifier through the cluster client.  Plain
reads and writes still go in (cluster) pipelines, which the client splits by node.

Holds no state another instance would need, and none of this process's beyond the script SHAs
and when it last listed each classifier (`registry.Registrations`): what this process knows of
the service-wide state is `process.ProcessState`, handed to those who read it."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from .chunk_store import ChunkStore
from .connection import StateConnection
from .group_store import GroupStore
from .offset_store import OffsetStore
from .registry import Registrations, Registry
from .request_store import RequestStore


class Store:
    """The five ports over one Redis client and key prefix."""

    def __init__(self, redis: Redis | RedisCluster, prefix: str) -> None:
        self.connection = StateConnection(redis, prefix)
        self.redis, self.keys = redis, self.connection.keys
        registrations = Registrations()  # INGEST lists classifiers, the registry forgets them
        self.chunks = ChunkStore(self.connection, registrations)
        self.requests = RequestStore(self.connection)
        self.offsets = OffsetStore(self.connection)
        self.registry = Registry(self.connection, registrations)
        self.groups = GroupStore(self.connection)
