"""The typed INGEST and LABEL replies (`state.calls`): parsed from the scripts' raw replies as
redis-py hands them over, and the refusal codes named alike in Python and in ``lua/ingest.lua``."""

from __future__ import annotations

import re

from stratameter.state import scripts
from stratameter.state.calls import (ChunkRefusal, IngestRefusal, IngestReply, LabelReply, ReservoirCutoff,
                                     ingest_reply, label_reply)


def test_an_applied_ingest_reply_lists_the_full_reservoirs_cutoffs():
    reply = ingest_reply([1, b"42", b"7", b"0", b"0.25", b"7", b"3", b"1e-05"])
    assert reply == IngestReply(True, 42, [ReservoirCutoff(7, 0, 0.25), ReservoirCutoff(7, 3, 1e-05)], [])
    assert ingest_reply([1, b"5"]) == IngestReply(True, 5, [], [])


def test_a_refused_ingest_reply_names_each_chunks_reason():
    reply = ingest_reply([0, b"-1", 7, 1, 8, 2, 9, 3])
    assert not reply.applied and reply.stored_offset == -1 and reply.cutoffs == []
    assert reply.refused == [ChunkRefusal(7, IngestRefusal.STALE_CUTS), ChunkRefusal(8, IngestRefusal.RESTRATIFY_FIRST),
                             ChunkRefusal(9, IngestRefusal.BINS_CHANGED)]
    assert all(isinstance(r.reason, IngestRefusal) for r in reply.refused)
    assert ingest_reply([0, b"12"]) == IngestReply(False, 12, [], [])  # the offset guard: another writer


def test_label_replies_carry_an_offset_or_a_chunk_and_stratum():
    assert label_reply([b"replay", b"4"]) == LabelReply("replay", stored_offset=4)
    assert label_reply([b"rolled_back", b"3"]) == LabelReply("rolled_back", stored_offset=3)
    assert label_reply([b"accepted", b"7", b"0"]) == LabelReply("accepted", chunk=7, stratum=0)
    assert label_reply([b"expired"]) == LabelReply("expired")
    assert label_reply([b"no_state"]).chunk is None


def test_the_ingest_script_names_every_refusal_by_its_member():
    """The header lists each code with its `IngestRefusal` member, and each place the script
    returns one says which."""
    source = scripts.source("INGEST")
    header = "".join(line for line in source.splitlines(keepends=True) if line.startswith("--"))
    for member in IngestRefusal:
        assert re.search(rf"--\s+{member.value} IngestRefusal\.{member.name}\b", header), member
    returned = re.findall(r"refused\[#refused \+ 1\] = (\d)\s+--\s+IngestRefusal\.(\w+)", source)
    assert sorted(returned) == sorted((str(m.value), m.name) for m in IngestRefusal)
