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

log = logging.getLogger("stratameter")


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
