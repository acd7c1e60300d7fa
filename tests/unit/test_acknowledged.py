"""`state.offsets.Acknowledged`: the offsets Redis acknowledged per state and partition, what of
them is copied service-wide at a commit (`take`), and what an outage gives back."""

from __future__ import annotations

from stratameter.state.offsets import Acknowledged, acknowledged_field


def test_note_raises_and_take_returns_what_was_raised_since_the_last_take():
    acked = Acknowledged("scores")
    acked.note("c0", 0, 10)
    acked.note("c0", 0, 7)  # below: kept at 10, nothing new
    acked.note("c1", "other-topic:1", 3)
    assert acked.get(("c0", 0)) == 10 and acked[("c1", "other-topic:1")] == 3
    assert acked.get(("c9", 0)) == -1 and acked.get(("c9", 0), "") == ""
    taken = acked.take()
    assert taken == {("c0", 0): 10, ("c1", "other-topic:1"): 3}
    assert acked.fields(taken) == {"c0": {"scores:0": 10}, "c1": {"scores:other-topic:1": 3}}
    assert acked.take() == {}  # nothing raised since
    acked.note("c0", 0, 10)  # the same offset again: nothing new
    assert acked.take() == {}
    acked.note("c0", 0, 12)
    assert acked.take() == {("c0", 0): 12}


def test_what_an_outage_kept_from_redis_goes_with_the_next_take():
    acked = Acknowledged("labels")
    acked.note("c0", 2, 5)
    taken = acked.take()
    acked.note("c0", 2, 8)  # raised meanwhile: the next take has the newer offset
    acked.give_back(taken)
    assert acked.take() == {("c0", 2): 8}
    assert acked.fields({("c0", 2): 8}) == {"c0": {acknowledged_field("labels", 2): 8}} == {"c0": {"labels:2": 8}}


def test_seeded_offsets_are_checked_against_but_not_copied_back():
    acked = Acknowledged("scores")
    acked.seed("c0", 1, 40)
    acked.seed("c0", 1, 30)  # never lowered
    assert acked.get(("c0", 1)) == 40
    assert acked.take() == {}  # another process's, already in the copy
    acked.note("c0", 1, 35)  # below the seed: nothing new
    assert acked.take() == {}


def test_a_partition_given_away_is_forgotten_with_what_was_not_copied_yet():
    acked = Acknowledged("scores")
    acked.note("c0", 0, 5)
    acked.note("c0", 1, 6)
    taken_before = {("c0", 0): 5}
    acked.forget_partition(0)
    assert acked.get(("c0", 0)) == -1
    assert acked.take() == {("c0", 1): 6}
    acked.give_back(taken_before)  # an outage's give-back of a partition given away meanwhile: dropped
    assert acked.take() == {}
