"""Dead letters: every rejected input record goes to the dead-letter topic with its
reason, at most `STRATAMETER_DEAD_LETTER_MAX_PER_SECOND` a second (the excess is
counted, never produced), and is acknowledged before its batch's offset is committed
(at least once, see `checkpoint`)."""

from __future__ import annotations

import asyncio
import time

from aiokafka import TopicPartition

from stratameter.schemas.outbound import dead_letter_record
from .consumer import KafkaClients


class DeadLetterLimiter:
    """Token bucket: the dead-letter producer can never amplify bad traffic."""

    def __init__(self, per_second: float) -> None:
        self.rate = float(per_second)
        self.tokens = self.rate
        self.at = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class DeadLetters:
    """Produces the dead letters of a partition batch and waits for the broker's acks."""

    def __init__(self, kafka: KafkaClients, topic: str, per_second: float) -> None:
        self.kafka, self.topic = kafka, topic
        self.limiter = DeadLetterLimiter(per_second)
        self.dropped = 0  # not produced (rate limit): stratameter_dead_letters_dropped_total

    async def send(self, tp: TopicPartition, records, rejects) -> None:
        """`rejects`: (position in `records`, reason, detail) of each rejected record."""
        if not rejects:
            return
        futures = []
        for i, reason, detail in rejects:
            if not self.limiter.allow():
                self.dropped += 1
                continue
            r = records[i]
            value = dead_letter_record(r.value, r.key, tp.topic, tp.partition, r.offset, reason, detail, time.time())
            futures.append(await self.kafka.producer.send(self.topic, value=value, key=r.key))
        if futures:
            await asyncio.gather(*futures)
