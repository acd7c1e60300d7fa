"""`app.pipeline.PollSize`: polls sized to about POLL_TARGET_SECONDS of work at the rate measured,
between MIN_POLL_RECORDS and BATCH_MAX_RECORDS (hand-computed cases)."""

from __future__ import annotations

import pytest

from stratameter.app.pipeline import MIN_POLL_RECORDS, POLL_TARGET_SECONDS, PollSize


def test_the_first_poll_takes_the_floor():
    assert PollSize(20_000).records == MIN_POLL_RECORDS == 5000


def test_a_fast_ingest_grows_the_poll_to_the_target_time_then_to_the_cap():
    size = PollSize(20_000)
    size.took(5000, 0.05)  # 10 us a record: 0.1 s is 10,000 records
    assert size.records == 10_000 == int(POLL_TARGET_SECONDS * 5000 / 0.05)
    size.took(10_000, 0.025)  # 2.5 us a record: 40,000, capped
    assert size.records == 20_000


def test_a_slow_ingest_keeps_the_floor_and_a_slower_turn_shrinks_the_poll_back():
    size = PollSize(20_000)
    size.took(5000, 0.3)  # 60 us a record (1,000 classifiers): 1,666 records, below the floor
    assert size.records == 5000
    size.took(5000, 0.02)
    assert size.records == 20_000
    size.took(20_000, 0.16)  # 8 us a record
    assert size.records == 12_500


@pytest.mark.parametrize("records, seconds", [(4999, 0.001), (10, 5.0), (0, 0.0), (6000, 0.0)])
def test_small_or_instant_polls_tell_nothing(records, seconds):
    """A poll under the floor means the service caught up (mostly fixed costs); it leaves the size."""
    size = PollSize(20_000)
    size.took(5000, 0.025)
    size.took(records, seconds)
    assert size.records == 20_000


def test_a_cap_below_the_floor_is_every_poll():
    size = PollSize(150)
    assert size.records == 150
    size.took(150, 10.0)
    assert size.records == 150
    size.took(150, 1e-6)
    assert size.records == 150


def test_a_turn_runs_from_one_polls_arrival_to_the_next():
    size = PollSize(20_000)  # times in binary fractions, so the differences are exact
    size.arrived(5000, 10.0)
    assert size.records == 5000  # nothing measured yet
    size.arrived(6000, 10.0625)  # the first poll's turn: 0.0625 s for 5,000 records
    assert size.records == 8000
    size.arrived(0, 10.09375)  # 0.03125 s for 6,000 records: 19,200
    assert size.records == 19_200


def test_a_failed_poll_does_not_count_its_backoff_in_the_previous_turn():
    size = PollSize(20_000)
    size.arrived(5000, 10.0)
    size.arrived(8000, 10.0625)
    assert size.records == 8000
    size.interrupted()  # the next poll failed; the pipeline backed off for seconds
    size.arrived(8000, 13.0)  # not a turn of 2.9 s for 8,000 records
    assert size.records == 8000
    size.arrived(5000, 13.03125)  # 8,000 records in 0.03125 s: capped
    assert size.records == 20_000
