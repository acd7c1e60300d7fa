"""`stratameter demo`'s options (`command.py` fills them from its arguments)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DemoOptions:
    duration: float | None = None
    json: bool = False
    kafka: str | None = None
    redis: str | None = None
    port: int | None = None
    chunk_seconds: int = 20
    rate: float = 100.0
    delta: float = 0.05
    confidence: float = 0.95
    strata: int = 4
    round_labels: int = 4
    min_delay: float = 0.05
    max_delay: float = 1.0
    skip: float = 0.05
    settle: float = 10.0
    seed: int | None = None
    reviewers: str = "simulated"  # or "label-studio": people label in a local Label Studio (the bridge)
    label_timeout: float = 30.0
    keep_logs: bool = False  # keep the service's, the bridge's and the backends' logs after the run

    def streaming_end(self, started: float) -> float:
        """When the scores stop, for a run of `duration` seconds from `started` (epoch seconds): `settle`
        seconds before the end (at most a quarter of the run), so the reviewers finish the last chunk;
        but not on less than half a chunk, whose recall interval would rest on a few dozen positives (the
        run then stops at the chunk boundary before it, and the reviewers have longer)."""
        assert self.duration is not None
        cs = self.chunk_seconds
        end = started + self.duration - min(self.settle, self.duration / 4)
        boundary = (end // cs) * cs
        if end - boundary < cs / 2 and boundary > started + cs / 4:
            return boundary
        return end
