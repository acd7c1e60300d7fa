"""What this process knows of the service-wide state between reads of it: one small object the
runner creates and hands to those who write or read it (`ProcessState`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProcessState:
    """This process's copy of two service-wide notes (``settings``, `keys`).

    `lost_through_ms`: the latest event time a record counted in a state Redis lost can have
    (`registry.Registry.note_state_lost`); a chunk starting at or before it is not counted whole
    (`chunks.lifecycle.counted_whole`).  Written by `app.state_watch.StateWatch` (at start and
    with every readiness probe, so every replica follows the one that saw a loss); read by the
    request loop and the API views and gauges.  None: no loss seen.

    `first_topics`: the scores and labels topics the state's offsets were first written from
    (`registry.Registry.noted_topics`), noted by the runner's start checks; read by
    `app.batch.BatchHandler.offset_field` and by the state watch when it notes a loss.  None: not
    read yet (the configured topics)."""

    lost_through_ms: int | None = None
    first_topics: tuple[str, str] | None = None
