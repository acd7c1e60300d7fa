"""Rendezvous ownership: deterministic, balanced, minimal movement."""

from collections import Counter

from stratameter.app.ownership import preferred_owner


def test_preferred_owner_is_deterministic_and_among_the_live():
    assert preferred_owner("c", []) is None
    assert preferred_owner("c", ["a", "b"]) == preferred_owner("c", ["b", "a"]) in {"a", "b"}


def test_classifiers_spread_evenly_over_instances():
    owners = Counter(preferred_owner(f"clf-{i}", ["i1", "i2", "i3"]) for i in range(3000))
    assert set(owners) == {"i1", "i2", "i3"}
    assert all(900 < n < 1100 for n in owners.values()), owners


def test_only_the_leaving_instances_classifiers_move():
    before = {f"c{i}": preferred_owner(f"c{i}", ["i1", "i2", "i3"]) for i in range(1000)}
    after = {c: preferred_owner(c, ["i1", "i2"]) for c in before}
    moved = {c for c in before if before[c] != after[c]}
    assert moved == {c for c in before if before[c] == "i3"}
