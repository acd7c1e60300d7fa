"""Leaving a Kafka consumer group promptly when a consumer stops.

On SIGTERM the service hands its partitions over at once (docs/how-to/operating.md, "Failover and
outages"): the consumer must send LeaveGroup when it stops, so the group rebalances
without waiting a session timeout for the departed member.  aiokafka skips LeaveGroup
in generation 0, which is the first generation on tansu (the bundled broker,
`stratameter.embedded`); :func:`leave_group_on_stop` sends it there too.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any


def leave_group_on_stop(consumer: Any) -> Any:
    """Make ``consumer.stop()`` send LeaveGroup even in generation 0 (tansu quirk).

    aiokafka skips LeaveGroup when ``generation == 0`` (Kafka itself starts at 1), but
    tansu's first generation *is* 0, so without this the next consumer of the group waits
    a whole session timeout for the departed member. Harmless on a real Kafka broker.
    Relies on aiokafka internals; does nothing if they are not as expected.
    Returns *consumer*.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "_maybe_leave_group"):
        return consumer
    try:
        from aiokafka.protocol.group import LeaveGroupRequest
    except ImportError:  # pragma: no cover - other aiokafka layout
        return consumer

    async def _maybe_leave_group(self: Any) -> None:
        if self.member_id and getattr(self, "_group_instance_id", None) is None:
            with contextlib.suppress(Exception):
                await self._send_req(LeaveGroupRequest(self.group_id, self.member_id))
        self.reset_generation()

    coordinator._maybe_leave_group = types.MethodType(_maybe_leave_group, coordinator)
    return consumer
