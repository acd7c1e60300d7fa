"""Redis losing the state: a Redis without persistence restarted, or the keys flushed.

Kafka's committed offsets outlive such a loss, so the service goes on from where it was: the
chunks under way then hold only the records that came after it, and their estimates would
describe part of a chunk as if it were all of it.  The loss is seen two ways:

* at start, a state with nothing noted (no ``settings``, no classifier) while the consumer group
  has committed offsets on the scores topic (a first start reads the topic from its beginning);
* while running, the ``settings`` a start notes gone, or noted afresh by another replica's start
  (their ``started_ms`` changed; checked with each readiness probe).

Either notes ``lost_through_ms`` (`Registry.note_state_lost`): the latest event time a record
counted before the loss can have (now, plus the accepted clock skew).  A chunk starting at or before
it is not counted whole (`chunks.lifecycle.counted_whole`): never sampled, its estimates null, and
the API says ``complete: false``; later chunks are whole again.  This process keeps the mark in its
`ProcessState` (``lost_through_ms``) for the request loop and the views, refreshed from Redis with
every probe, so every replica follows the one that saw the loss.  Each loss this process sees is
logged as an error and counted (``stratameter_redis_state_lost_total``).

Redis can also lose only its last writes (restarted from an older snapshot or from an append-only
file not yet synced, a replica promoted before it had them): the state went back, and the offsets
Kafka committed after it outlive it (`state.offsets.StateRolledBack`).  Nothing is lost then: every
partition assigned to this process is read again from the mark Redis kept of what its state
applied (``Keys.applied``, `app.checkpoint`) when the committed offset lies above it, or from the
offset a classifier's state holds when that lies below the one its guard acknowledged (kept
service-wide, ``Keys.acknowledged``: in a Redis Cluster a classifier's node can go back while the
marks' node did not), and the offset guards skip what survived (`replay_rolled_back`; logged as an
error, counted in ``stratameter_redis_state_rolled_back_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import TopicPartition

from ..config import Settings
from ..errors import describe
from ..state.keys import negatives_of
from ..state.offsets import Acknowledged, acknowledged_field, applied_field
from ..state.process import ProcessState
from ..state.store import Store
from .batch import BatchHandler
from .consumer import KafkaClients

log = logging.getLogger(__name__)


class StateWatch:
    """Sees Redis losing the state, or going back (see the module's doc).  Of `store` it uses the
    registry (the noted settings, the classifiers) and the offsets (the applied marks, the
    acknowledged offsets, the states' offsets); it writes `process`'s ``lost_through_ms`` and
    reads its ``first_topics``."""

    def __init__(self, store: Store, process: ProcessState, settings: Settings, kafka: KafkaClients,
                 batches: BatchHandler | None = None) -> None:
        self.registry, self.offsets, self.process = store.registry, store.offsets, process
        self.settings, self.kafka = settings, kafka
        self.batches = batches  # the states' acknowledged offsets (`_states_gone_back`); None: not checked
        self.losses = 0  # losses this process saw
        self.rollbacks = 0  # partitions this process read again (from their applied marks or a state's offset)
        self._watching = False  # the start's check ran: from now on the settings must stay noted
        self._started: int | None = None  # the ``started_ms`` of the state this process writes to

    async def check_at_start(self) -> None:
        """Whether the state began just now although the consumer group consumed before."""
        try:
            if await self.registry.begin_state(_now_ms()) and await self._consumed_before():
                await self._lost("there was no state at start, but the consumer group "
                                 f"{self.settings.kafka_consumer_group!r} has committed offsets on "
                                 f"{self.settings.topic_scores!r}")
            else:
                _, self.process.lost_through_ms, self._started = await self.registry.state_marks()
        except Exception as exc:  # noqa: BLE001 - never keeps the service from starting
            log.warning("could not check whether Redis lost the state: %s", describe(exc))
        self._watching = True

    async def check(self) -> None:
        """With each readiness probe: the settings still noted as they were (else the state was
        lost), and the service-wide mark copied to the process state."""
        noted, lost, started = await self.registry.state_marks()
        if not self._watching:
            self.process.lost_through_ms = lost
        elif not noted or (lost is None and self.process.lost_through_ms is not None):
            await self._lost("the settings noted at start are gone")
        elif lost != self.process.lost_through_ms:  # another replica saw a loss: follow it
            self.registry.forget_registrations()
            self.process.lost_through_ms, self._started = lost, started
        elif self._started is not None and started != self._started:
            # a replica started on the emptied Redis before this one's probe, and could not tell
            # (a classifier was listed again meanwhile): its start noted the settings afresh
            await self._lost("the settings were noted afresh by another start")

    async def replay_rolled_back(self, partitions) -> None:
        """At assignment: read each partition again from where Redis went back on it, if it did:
        its applied mark where Kafka's committed offset lies above it (`_marks_gone_back`), or the
        offset a state holds below the one its guard acknowledged (`_states_gone_back`), whichever
        is lower.  Never keeps the partitions from being consumed.

        The partitions are paused meanwhile: aiokafka hands out the new assignment's records while
        this listener still runs, and a record applied from the committed offset before the seek
        moves its state's offset past the gap, whose records then read as replays and are never
        counted (measured: with this check a second long, the restart after a state gone back counted
        400 of 600 scores and committed all 600, tests/system/test_redis_rolled_back.py)."""
        tps = sorted(partitions)
        consumer = self.kafka.consumer
        consumer.pause(*tps)
        try:
            await self._replay(tps)
        finally:
            owned = consumer.assignment()
            consumer.resume(*(tp for tp in tps if tp in owned))

    async def _replay(self, tps: list[TopicPartition]) -> None:
        """`replay_rolled_back` on the paused partitions."""
        try:
            replay = await self._marks_gone_back(tps)
            for tp, (offset, why) in (await self._states_gone_back(tps)).items():
                if tp not in replay or offset < replay[tp][0]:
                    replay[tp] = (offset, why)
            for tp, (offset, why) in sorted(replay.items()):
                self.kafka.consumer.seek(tp, offset)
                self.rollbacks += 1
                log.error(f"Redis lost acknowledged writes (restarted from an older snapshot or an append-only "
                          f"file not yet synced, or a replica promoted before it had them): {tp.topic} partition "
                          f"{tp.partition} is read again from offset {offset} ({why}); the records that survived "
                          "are skipped.  Run Redis with appendfsync always to keep acknowledged writes through a "
                          "crash.")
        except Exception as exc:  # noqa: BLE001 - Redis down: the partitions are consumed from the committed offsets
            log.warning("could not check the applied marks of the assigned partitions: %s", describe(exc))

    async def _marks_gone_back(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]]:
        """partition -> (its applied mark, why) where the offset Kafka committed lies above the mark."""
        marks = await self.offsets.applied_marks([applied_field(tp.topic, tp.partition) for tp in tps])
        marked = [(tp, mark) for tp, mark in zip(tps, marks) if mark is not None]
        offsets = await asyncio.gather(*(self.kafka.consumer.committed(tp) for tp, _ in marked))
        return {tp: (mark, f"the mark Redis kept of what its state applied, instead of the committed {committed}")
                for (tp, mark), committed in zip(marked, offsets) if committed is not None and mark < committed}

    async def _states_gone_back(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]]:
        """partition -> (the lowest offset after one a state holds below what its guard acknowledged,
        why), from the service-wide copy of the acknowledged offsets (``Keys.acknowledged``): in a
        Redis Cluster a state's node can go back while the node of the marks did not.  The states
        that hold what they acknowledged have it noted for this process (`Acknowledged.seed`), so a
        state going back while this process runs stops it before it writes the state again.  A
        state holding no offset on the partition (forgotten, or lost whole) is not replayed."""
        if self.batches is None or not tps:
            return {}
        cids = await self.registry.classifiers()
        sids = [sid for cid in cids for sid in (cid, negatives_of(cid))]
        sides = {tp: self._side(tp) for tp in tps}
        noted = await self.offsets.acknowledged_offsets(sids, sorted({field for _, _, field in sides.values()}))
        states: dict[str, list[str]] = {}  # field -> the states with an acknowledged offset there
        for sid, fields in noted.items():
            for field in fields:
                states.setdefault(field, []).append(sid)
        checked = [(tp, side, partition, field) for tp, (side, partition, field) in sides.items() if field in states]
        stored_offsets = {"scores": self.offsets.scores_offsets, "labels": self.offsets.labels_offsets}
        held = await asyncio.gather(*(stored_offsets[side.kind](states[field], partition)
                                      for _, side, partition, field in checked))
        out: dict[TopicPartition, tuple[int, str]] = {}
        for (tp, side, partition, field), stored_by_state in zip(checked, held):
            for sid in states[field]:
                acknowledged, stored = noted[sid][field], stored_by_state[sid]
                if 0 <= stored < acknowledged:
                    if tp not in out or stored + 1 < out[tp][0]:
                        out[tp] = (stored + 1, f"the state {sid!r} holds offset {stored}, below the "
                                               f"{acknowledged} Redis acknowledged")
                elif stored >= acknowledged:
                    side.seed(sid, partition, acknowledged)
        return out

    def _side(self, tp: TopicPartition) -> tuple[Acknowledged, int | str, str]:
        """`BatchHandler.acknowledged` of `tp`, and its field in the service-wide copy."""
        side, partition = self.batches.acknowledged(tp)
        return side, partition, acknowledged_field(side.kind, partition)

    async def _consumed_before(self) -> bool:
        topic = self.settings.topic_scores
        for partition in sorted(await self.kafka.producer.partitions_for(topic) or ()):
            if await self.kafka.consumer.committed(TopicPartition(topic, partition)) is not None:
                return True
        return False

    async def _lost(self, how: str) -> None:
        now = _now_ms()
        through = now + 1000 * self.settings.max_event_time_skew_seconds
        self._started = await self.registry.note_state_lost(through, self.settings.chunk_seconds, now,
                                                            self.process.first_topics)
        self.process.lost_through_ms = through
        self.registry.forget_registrations()
        self.losses += 1
        log.error(f"Redis lost the state under STRATAMETER_REDIS_KEY_PREFIX {self.settings.redis_key_prefix!r} "
                  f"({how}): a Redis without persistence restarted, or the keys were deleted.  The chunks "
                  f"under way hold only what came after, so every chunk starting at or before "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(through / 1000))} is reported incomplete "
                  "(no estimate, no label requests); later chunks are whole.  Earlier chunks, their labels and "
                  "the requests awaiting an answer are gone.  Run Redis with persistence (AOF).")


def _now_ms() -> int:
    return int(time.time() * 1000)
