"""The Lua scripts (``lua/<name>.lua``): every state change is one atomic script on one
classifier's slot.

Exactly-once without Kafka transactions: each script that applies records from a topic
partition (INGEST, LABEL, GLOBAL_COUNT) first compares the partition's last applied
offset, stored with the state it guards, and applies and advances it in the same atomic
call.  A batch replayed after a crash is recognised and skipped (or, for the scores
topic, re-aggregated from the stored offset), so consumer offsets may be committed after
the fact with at-least-once delivery and the state still changes exactly once.

Every key a script touches is passed in KEYS (named by `keys.Keys`, all in one hash
slot); a script builds no key name.  Where the keys depend on what a script would read
(LABEL: the request's chunk; EXPIRE: the due requests' chunks), the store reads first,
passes the keys, and the script re-checks what was read and refuses if it changed.
Each file starts with a comment giving its KEYS, ARGV and reply.
"""

from __future__ import annotations

from importlib import resources

import msgspec

#: Every script, by the name the store calls it (the file is ``lua/<name lower-cased>.lua``).
NAMES = ("INGEST", "OPEN_CHUNK", "RESTRATIFY", "FREEZE", "LABEL", "EXPIRE", "ISSUE", "MARK_PUBLISHED",
         "EVALUATE_ROUND", "LEASE", "RELEASE", "GLOBAL_COUNT", "FORGET")


def source(name: str) -> str:
    """The Lua source of script `name` (one of `NAMES`), read from the package data."""
    if name not in NAMES:
        raise KeyError(f"no Lua script {name!r}; known: {', '.join(NAMES)}")
    return resources.files(__package__).joinpath("lua", f"{name.lower()}.lua").read_text(encoding="utf-8")


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode_ingest(payload: dict) -> bytes:
    """INGEST's payload argument (`ingest.aggregate.build_payload`) as msgpack, which the script
    unpacks with cmsgpack: measured on a chunk's payloads of predicted negatives (~150 reservoir
    members each), half the encoding time of JSON in the service and 67 us instead of 135 us of
    decoding in Redis a call (a member's text is not escaped a second time)."""
    return _encoder.encode(payload)


def decode_ingest(raw: bytes) -> dict:
    """The payload `encode_ingest` made (the store reads a call's chunks from it when not given)."""
    return _decoder.decode(raw)


def __getattr__(name: str) -> str:
    """``scripts.INGEST`` and the like: the source of that script (as before the .lua files)."""
    if name in NAMES:
        return source(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
