"""Bounded cardinality: a score for a classifier id not seen before is admitted only while
fewer than ``STRATAMETER_MAX_CLASSIFIERS`` classifiers exist.

Every classifier id on the scores topic creates state in Redis, series in ``/metrics`` and a
request loop, so an outsider sending made-up ids could grow all three without bound.  Past the
cap, the records of a new id are dead-lettered (``too_many_classifiers``) and counted like any
invalid record, and create nothing.

The cap is read off the service-wide ``classifiers`` set (SCARD) when a batch brings ids this
process has not seen; ids admitted here but not yet written by INGEST count against it too.
Replicas admitting at the same moment can each fill the last room, so the set can end above
the cap by at most the new ids of one batch per replica.
"""

from __future__ import annotations

from ..state.registry import Registry


class ClassifierAdmission:
    """Which classifier ids of a batch may create or update state (`refused`)."""

    def __init__(self, registry: Registry, cap: int) -> None:
        self.registry, self.cap = registry, cap
        self.known: set[str] = set()  # ids in the set (or admitted here); cleared past twice the cap
        self.fresh: set[str] = set()  # admitted here, not yet seen in the set

    async def refused(self, classifier_ids: list[str]) -> set[str]:
        """The ids (of `classifier_ids`) whose records must not create state: new ids beyond the cap."""
        if len(self.known) > 2 * self.cap:  # ids forgotten since (the request loop forgets silent ones)
            self.known.clear()
        new = set(classifier_ids) - self.known
        if not new:
            return set()
        asked = sorted(new | self.fresh)
        present = {c for c, there in zip(asked, await self.registry.known_classifiers(asked)) if there}
        self.known |= present
        self.fresh -= present
        new -= present
        if not new:
            return set()
        room = max(self.cap - await self.registry.classifier_count() - len(self.fresh), 0)
        admitted = sorted(new)[:room]
        self.known.update(admitted)
        self.fresh.update(admitted)
        return new - set(admitted)
