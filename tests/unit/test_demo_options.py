"""When `stratameter demo --duration D` stops its scores (`DemoOptions.streaming_end`)."""

from __future__ import annotations

import pytest

from stratameter.demo.options import DemoOptions


@pytest.mark.parametrize(("started", "end"), [
    (1003.0, 1053.0),  # 50 s of scores: the last chunk (1040-1060) gets 13 s, more than half of 20
    (1015.0, 1060.0),  # 1060-1065 would be a 5 s sliver: stop at 1060, 15 s for the reviewers
    (999.0, 1040.0),  # 1040-1049 would be 9 s, under half a chunk: stop at 1040
])
def test_the_scores_stop_settle_seconds_before_the_end_but_not_on_less_than_half_a_chunk(started, end):
    """60 s runs of 20 s chunks with 10 s to settle: the scores stop at 50 s, unless the last chunk
    would get less than 10 s of them; then at the chunk boundary before (by hand, per row)."""
    opts = DemoOptions(duration=60, chunk_seconds=20, settle=10)
    assert opts.streaming_end(started) == end


def test_a_run_shorter_than_a_chunk_streams_until_its_settle_time():
    """No boundary to fall back on (the one before is within a quarter chunk of the start): the
    scores stop `settle` seconds before the end, at most a quarter of the run."""
    opts = DemoOptions(duration=20, chunk_seconds=20, settle=10)
    assert opts.streaming_end(1001.0) == 1001.0 + 20 - 5
