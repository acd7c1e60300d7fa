"""What the offset guards (INGEST, LABEL, GLOBAL_COUNT) cannot see by themselves.

* A replay, and the records of a partition whose log started again under the same topic name
  (the topic deleted and created again, or another cluster's): both come at or below the offset
  the state applied; only the partition's end offset, as the fetch reports it, says which (a
  log's offsets only grow).  `RestartedLogs`.
* A state that went back: Redis lost writes it had acknowledged (restarted from an older
  snapshot or an append-only file not yet synced, a replica promoted before it had them) while
  Kafka kept the offsets committed after them.  A guard then takes the records after the gap for
  the next ones and the gap is never counted.  `StateRolledBack`."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class RestartedLogs:
    """Logs, once per state and partition, records taken for replays of a partition whose log
    started again.  Not acted on: a reported end can lag for a moment after a leader change,
    and counting a replay twice would break exactly-once."""

    def __init__(self, topic: str) -> None:
        self.topic = topic  # what the records are, for the message: "scores", "labels"
        self._logged: set[tuple[str, object]] = set()

    def check(self, state_id: str, partition, stored: int, log_end: int | None) -> None:
        """Note records at or below `stored` on `partition`, whose end offset is `log_end`."""
        key = (state_id, partition)
        if log_end is None or stored < log_end or key in self._logged:
            return
        self._logged.add(key)
        log.error("%s partition %s: the state applied up to offset %d but the partition ends at %d, so its log "
                  "started again (the topic created again, or another cluster's under the same name) and its records "
                  "up to offset %d are taken for replays and not counted: give the service a new "
                  "STRATAMETER_REDIS_KEY_PREFIX and STRATAMETER_KAFKA_CONSUMER_GROUP (or the topic a new name)",
                  self.topic, partition, stored, log_end, stored, extra={"classifier_id": state_id})


def applied_field(topic: str, partition: int) -> str:
    """A partition's field in the service-wide applied marks (``Keys.applied``)."""
    return f"{topic}:{partition}"


class StateRolledBack(RuntimeError):
    """Redis holds an applied offset below one it acknowledged to this process: it lost writes.
    Going on would count the records after the gap and never the gap, so the process stops
    (exit code 1) before it commits; its next start replays each partition from the mark Redis
    kept (`app.state_watch.StateWatch.replay_rolled_back`), and the guards skip what survived."""

    def __init__(self, where: str, stored: int, acknowledged: int) -> None:
        self.stored = stored
        super().__init__(f"{where}: Redis holds {stored} as the last offset applied, below {acknowledged} which it "
                         "acknowledged to this process: it lost acknowledged writes (restarted from an older snapshot "
                         "or an append-only file not yet synced, or a replica promoted before it had them).  Stopping "
                         "before anything past the gap is committed; the next start reads the partitions again from "
                         "the offsets Redis kept")


def check_not_rolled_back(where: str, stored: int, acknowledged: int) -> None:
    """`StateRolledBack` when an offset guard's `stored` offset lies below the one Redis
    `acknowledged` to this process (-1, no offset at all, is a state forgotten or lost:
    `app.state_watch`)."""
    if 0 <= stored < acknowledged:
        raise StateRolledBack(where, stored, acknowledged)


def acknowledged_field(kind: str, partition) -> str:
    """A partition's field in a state's acknowledged offsets (``Keys.acknowledged``): `kind`
    (``scores`` or ``labels``) and the name the state keeps the partition's offset under
    (`app.batch.BatchHandler.offset_field`)."""
    return f"{kind}:{partition}"


class Acknowledged:
    """The offsets Redis acknowledged as applied, per (state, partition), for one topic kind:
    what a state must still hold.  A state holding less went back (`StateRolledBack`).

    Raised from the offset guards' replies (`note`) and from the copies kept service-wide
    (`seed`, at assignment: in a Redis Cluster a state's node can go back while the node of
    the ``{_global}`` keys did not, and a process that has not written the state yet would not
    know what it acknowledged).  What `note` raised since the last `take` is copied to Redis at
    the next commit (`app.checkpoint`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._offsets: dict[tuple[str, object], int] = {}
        self._new: set[tuple[str, object]] = set()  # raised by `note` since the last `take`

    def get(self, key: tuple[str, object], default: int = -1) -> int:
        return self._offsets.get(key, default)

    def __getitem__(self, key: tuple[str, object]) -> int:
        return self._offsets[key]

    def note(self, state_id: str, partition, offset: int) -> None:
        """Redis acknowledged `offset` applied for the state on `partition`."""
        key = (state_id, partition)
        if offset > self._offsets.get(key, -1):
            self._offsets[key] = offset
            self._new.add(key)

    def seed(self, state_id: str, partition, offset: int) -> None:
        """Another process's acknowledgement, read from the service-wide copy (not copied back)."""
        key = (state_id, partition)
        self._offsets[key] = max(self._offsets.get(key, -1), offset)

    def forget_partition(self, partition) -> None:
        """Drop what was acknowledged on a partition this process no longer owns."""
        for key in [k for k in self._offsets if k[1] == partition]:
            del self._offsets[key]
        self._new = {k for k in self._new if k[1] != partition}

    def take(self) -> dict[tuple[str, object], int]:
        """(state id, partition) -> offset of what `note` raised since the last take."""
        out = {key: self._offsets[key] for key in self._new}
        self._new = set()
        return out

    def give_back(self, taken: dict[tuple[str, object], int]) -> None:
        """`taken` was not copied to Redis (an outage): it goes with the next `take`."""
        self._new.update(key for key in taken if key in self._offsets)

    def fields(self, taken: dict[tuple[str, object], int]) -> dict[str, dict[str, int]]:
        """`taken` as the service-wide copy keeps it: state id -> {`acknowledged_field`: offset}."""
        out: dict[str, dict[str, int]] = {}
        for (sid, partition), offset in taken.items():
            out.setdefault(sid, {})[acknowledged_field(self.kind, partition)] = offset
        return out
