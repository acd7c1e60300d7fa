"""The records the service's consumer hands on: aiokafka's own record objects, not
`ConsumerRecord` copies of them.

aiokafka unpacks a fetched record batch into record objects (C, with ``offset``, ``timestamp``,
``key``, ``value``), then wraps each in a `ConsumerRecord` dataclass of eleven fields
(`aiokafka.consumer.fetcher.PartitionRecords._consumer_record`).  The service reads four of them,
and the wrapping took a fifth of the service's process time (`stratameter bench`, its CPU
2.50-2.54 -> 1.96-2.02 us a record, 366,000 -> 447,000-459,000 records/s, 2026-11-27).

A consumer created with ``value_deserializer=own_records`` is given the record objects as they
are; every other consumer in the process is left as aiokafka made it.  The switch is a subclass of
aiokafka's `PartitionRecords` put in its place once (`install`), and it changes nothing else of
the fetch: offsets, aborted transactions, control batches and CRC checks are aiokafka's own code.
Should a later aiokafka not have that class or method, nothing is installed and `own_records`
is what aiokafka then calls it as: an identity deserializer, so the consumer gets
`ConsumerRecord` objects with the same values (`installed` says which; a test checks that it is
installed with the aiokafka we pin).
"""

from __future__ import annotations

from typing import Protocol


class KafkaRecord(Protocol):
    """What the service reads of a fetched record (aiokafka's record objects and `ConsumerRecord` alike)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def own_records(value: bytes | None) -> bytes | None:
    """The marker of a consumer that takes aiokafka's record objects; as a deserializer, the identity."""
    return value


_installed = False


def _unwrapped(tp, record):
    return record


def install() -> bool:
    """Put the `PartitionRecords` subclass in aiokafka's fetcher (once); True if it is in place."""
    global _installed
    if _installed:
        return True
    try:
        from aiokafka.consumer import fetcher
    except ImportError:  # pragma: no cover - aiokafka is a dependency
        return False
    base = getattr(fetcher, "PartitionRecords", None)
    if base is None or not callable(getattr(base, "_consumer_record", None)):
        return False

    class PartitionRecords(base):
        """aiokafka's, but a consumer marked `own_records` gets the record objects unwrapped.  Set
        per fetched batch, so other consumers call aiokafka's own method, at no cost a record."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            if getattr(self, "_value_deserializer", None) is own_records:
                self._consumer_record = _unwrapped

    fetcher.PartitionRecords = PartitionRecords
    _installed = True
    return True


def installed() -> bool:
    return _installed
