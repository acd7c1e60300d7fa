"""The Lua scripts (``lua/<name>.lua``): every state change is one atomic script on one
classifier's slot.

Exactly-once without Kafka transactions: each script that applies records from a topic
partition (INGEST, LABEL, GLOBAL_COUNT) first compares the partition's last applied
offset, stored with the state it guards, and applies and advances it in the same atomic
call.  A batch replayed after a crash is recognised and skipped (or, for the scores
topic, re-aggregated from the stored offset), so consumer offsets may be committed after
the fact with at-least-once delivery and the state still changes exactly once.

Every key a script touches is passed in KEYS (named by `keys.Keys`, all in one hash
slot); a script builds no key name.  GRANT and CLAIM run on a review group's slot (its shared
budget, its shared items), not a classifier's.  Where the keys depend on what a script would read
(LABEL: the request's chunk; EXPIRE: the due requests' chunks), the store reads first,
passes the keys, and the script re-checks what was read and refuses if it changed.
Each file starts with a comment giving its KEYS, ARGV and reply.
"""

from __future__ import annotations

from importlib import resources
from typing import NamedTuple

import msgspec

#: Every script, by the name the store calls it (the file is ``lua/<name lower-cased>.lua``).
NAMES = ("INGEST", "OPEN_CHUNK", "RESTRATIFY", "FREEZE", "LABEL", "EXPIRE", "ISSUE", "MARK_PUBLISHED",
         "EVALUATE_ROUND", "SET_STATUS", "LEASE", "RELEASE", "GLOBAL_COUNT", "FORGET", "NOTE_APPLIED",
         "LOWER_APPLIED", "NOTE_ACKNOWLEDGED", "GRANT", "CLAIM")


def source(name: str) -> str:
    """The Lua source of script `name` (one of `NAMES`), read from the package data."""
    if name not in NAMES:
        raise KeyError(f"no Lua script {name!r}; known: {', '.join(NAMES)}")
    return resources.files(__package__).joinpath("lua", f"{name.lower()}.lua").read_text(encoding="utf-8")


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class EncodedIngest(NamedTuple):
    """INGEST's last two arguments: the payload as msgpack, and the bytes of its histogram runs
    (`ingest.bins`), which the payload's ``runs`` locate: Redis's cmsgpack has no binary type."""

    payload: bytes
    blob: bytes


def encode_ingest(payload: dict) -> EncodedIngest:
    """INGEST's payload argument (`ingest.aggregate.build_payload`) as msgpack, which the script
    unpacks with cmsgpack: measured on a chunk's payloads of predicted negatives (~150 reservoir
    members each), half the encoding time of JSON in the service and 67 us instead of 135 us of
    decoding in Redis a call (a member's text is not escaped a second time).  A chunk's histogram
    runs ``[[byte offset, old, new], ...]`` go as flat ``[byte offset, at, length, ...]``: its old
    bytes at `at` (1-based, as Lua's string.sub counts) of the blob, its new bytes right after."""
    chunks, parts, at = [], [], 1
    for c in payload["chunks"]:
        if c.get("runs"):
            flat: list = []
            for offset, old, new in c["runs"]:
                flat += [offset, at, len(old)]
                parts += [old, new]
                at += 2 * len(old)
            c = {**c, "runs": flat}
        chunks.append(c)
    return EncodedIngest(_encoder.encode({**payload, "chunks": chunks}), b"".join(parts))


def decode_ingest(encoded: EncodedIngest) -> dict:
    """The payload `encode_ingest` encoded (the store reads a call's chunks from it when not given)."""
    doc = _decoder.decode(encoded.payload)
    blob = encoded.blob
    for c in doc["chunks"]:
        if c.get("runs"):
            flat = c["runs"]
            c["runs"] = [[offset, blob[at - 1:at - 1 + n], blob[at - 1 + n:at - 1 + 2 * n]]
                         for offset, at, n in zip(flat[0::3], flat[1::3], flat[2::3])]
    return doc


def __getattr__(name: str) -> str:
    """``scripts.INGEST`` and the like: the source of that script (as before the .lua files)."""
    if name in NAMES:
        return source(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
