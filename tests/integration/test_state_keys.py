"""One owner of the Redis keys: every Lua script gets every key it touches in KEYS, all in
the classifier's hash slot (Redis Cluster requires it), and builds no key name itself.

* Statically: every script is parsed; no ``..`` concatenation anywhere in its code, and the
  key argument of every ``redis.call`` is ``KEYS[...]`` or a local bound to ``KEYS[...]``.
* Against a real redis-server: every script runs through the store (the keys the service
  really passes), with MONITOR recording the commands each script issues; the keys of each
  command (``COMMAND GETKEYS``) must be among the KEYS of its EVALSHA, and those KEYS must
  share one hash slot.
* The re-checks of LABEL and EXPIRE (their chunk keys come from a read before the call):
  a changed request or due list is refused without a change, and retried in offset order.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from stratameter.config import load_settings
from stratameter.ingest.aggregate import build_payload, group_by_classifier
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state import scripts
from stratameter.state.calls import IngestCall, LabelCall, LabelReply
from stratameter.state.group_store import ItemClaim
from stratameter.state.keys import ingest_chunks, negatives_of
from stratameter.state.records import ChunkCuts
from stratameter.state.scripts import encode_ingest
from stratameter.state.store import Store

LUA_DIR = Path(scripts.__file__).parent / "lua"


# ------------------------------------------------------------------------------- static


def _code(source: str) -> str:
    """The script with comments removed and every string literal replaced by ``"S"``."""
    out, i = [], 0
    while i < len(source):
        if source.startswith("--", i):
            if source.startswith("--[[", i):
                i = source.index("]]", i) + 2
            else:
                j = source.find("\n", i)
                i = len(source) if j < 0 else j
        elif source.startswith("[[", i):
            i = source.index("]]", i) + 2
            out.append('"S"')
        elif source[i] in "'\"":
            q, j = source[i], i + 1
            while source[j] != q:
                j += 2 if source[j] == "\\" else 1
            i = j + 1
            out.append('"S"')
        else:
            out.append(source[i])
            i += 1
    return "".join(out)


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _is_keys_ref(expr: str) -> bool:
    """``KEYS[<index expression>]``, the index's brackets balanced."""
    if not expr.startswith("KEYS[") or not expr.endswith("]"):
        return False
    depth = 0
    for j, ch in enumerate(expr[4:], start=4):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth == 0:
            return j == len(expr) - 1
    return False


_ASSIGNMENT = re.compile(r"(?<![\w.\[])((?:[A-Za-z_]\w*\s*,\s*)*[A-Za-z_]\w*)\s*=(?!=)\s*([^\n;]+)")


def _key_locals(code: str) -> set[str]:
    """Names every assignment of which is ``KEYS[...]`` (``local a, b = KEYS[1], KEYS[2]``,
    or ``for _, a in ipairs(KEYS)``)."""
    assigned: dict[str, list[bool]] = {}
    for names, exprs in _ASSIGNMENT.findall(code):
        values = _split_top(exprs)
        for n, name in enumerate(_split_top(names)):
            name = name.removeprefix("local").strip()
            assigned.setdefault(name, []).append(n < len(values) and _is_keys_ref(values[n]))
    for names, source in re.findall(r"\bfor\s+([\w\s,]+?)\s+in\s+([^\n]+?)\s+do\b", code):
        for name in _split_top(names):
            assigned.setdefault(name, []).append(source.strip() == "ipairs(KEYS)" and name != _split_top(names)[0])
    return {name for name, ok in assigned.items() if ok and all(ok)}


def _key_arguments(code: str) -> list[str]:
    """The key argument (the one after the command) of every ``redis.call``/``redis.pcall``."""
    out = []
    for m in re.finditer(r"redis\.p?call\(", code):
        depth, j = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(code[j], 0)
            j += 1
        args = _split_top(code[m.end(): j - 1])
        assert args[0] == '"S"', f"command name not a literal: {code[m.start(): j]}"
        out.append(args[1] if len(args) > 1 else "")
    return out


def test_every_script_file_is_known_and_loaded_by_name():
    assert sorted(p.stem for p in LUA_DIR.glob("*.lua")) == sorted(n.lower() for n in scripts.NAMES)
    for name in scripts.NAMES:
        assert "redis.call" in scripts.source(name)
    with pytest.raises(KeyError):
        scripts.source("NOPE")


@pytest.mark.parametrize("name", scripts.NAMES)
def test_script_builds_no_key(name):
    code = _code(scripts.source(name))
    assert ".." not in code, f"{name}: string concatenation (a key built inside the script)"
    key_locals = _key_locals(code)
    args = _key_arguments(code)
    assert args, name
    for arg in args:
        assert _is_keys_ref(arg) or arg in key_locals, f"{name}: key argument {arg!r} is not from KEYS"


def test_the_static_check_catches_a_key_built_inside():
    built = _code("local stem = KEYS[1]\nredis.call('HGET', stem .. ':meta', 'x')")
    assert ".." in built
    reassigned = _code("local k = KEYS[1]\nk = 'P:{c}:x'\nredis.call('GET', k)")
    assert "k" not in _key_locals(reassigned)
    assert _key_arguments(_code("redis.call('HSET', KEYS[2 + i], 'a', 1)")) == ["KEYS[2 + i]"]
    assert _is_keys_ref("KEYS[base[i] + 2]") and not _is_keys_ref("KEYS[1] .. KEYS[2]")


# ------------------------------------------------------------------------------- dynamic

_MONITOR_LINE = re.compile(rb'^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$', re.S)
_TOKEN = re.compile(rb'"((?:\\.|[^"\\])*)"', re.S)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b", b'"': b'"', b"\\": b"\\"}


def _unescape(raw: bytes) -> bytes:
    """Undo Redis' sdscatrepr quoting of a MONITOR argument."""
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i:i + 1] == b"\\":
            nxt = raw[i + 1:i + 2]
            if nxt == b"x":
                out += bytes([int(raw[i + 2:i + 4], 16)])
                i += 4
                continue
            out += _ESCAPES[nxt]
            i += 2
        else:
            out += raw[i:i + 1]
            i += 1
    return bytes(out)


class Monitor:
    """MONITOR on its own connection: (client, [args]) of every command, in order."""

    def __init__(self, url: str) -> None:
        self.client = Redis.from_url(url)
        self.lines: list[tuple[bytes, list[bytes]]] = []

    async def __aenter__(self) -> "Monitor":
        self.conn = await self.client.connection_pool.get_connection()
        await self.conn.send_command("MONITOR")
        assert await self.conn.read_response() in (b"OK", "OK")
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            line = await self.conn.read_response()
            m = _MONITOR_LINE.match(line)
            if m:
                self.lines.append((m.group(1), [_unescape(t) for t in _TOKEN.findall(m.group(2))]))

    async def until(self, marker: bytes) -> None:
        for _ in range(200):
            if any(args[-1:] == [marker] for _, args in self.lines):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("MONITOR never saw the marker")

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.conn.disconnect()
        await self.client.aclose()


def _script_calls(lines, names_by_sha):
    """(script name, declared KEYS, [commands the script issued]) per EVALSHA that ran."""
    calls = []
    for client, args in lines:
        if client == b"lua":
            if calls:
                calls[-1][2].append(args)
        elif args and args[0].upper() == b"EVALSHA":
            numkeys = int(args[2])
            calls.append((names_by_sha[args[1].decode()], args[3:3 + numkeys], []))
    return [c for c in calls if c[2]]  # an EVALSHA refused with NOSCRIPT ran nothing


async def _exercise(store: Store, settings) -> None:
    """Every script through the store, along the paths that touch the most keys."""
    cid, now = "clf-1", int(time.time() * 1000)
    t0 = now - now % 3_600_000 + 1
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    rng = np.random.default_rng(1)

    async def batch(offsets, n, event_ms):
        await ingest.apply(0, np.arange(offsets, offsets + n), [cid] * n, [f"i{offsets + j}" for j in range(n)],
                           np.round(rng.random(n), 3), np.ones(n, bool), np.full(n, event_ms), [None] * n)

    await batch(0, 300, t0)  # chunk A opens with its strata (OPEN_CHUNK, INGEST)
    await batch(300, 10, t0 - 3_600_000)  # an older chunk opens provisional (exact scores kept)
    await batch(310, 80, t0 - 3_600_000)  # ... and is re-stratified first (INGEST refuses, RESTRATIFY)
    await batch(390, 10, t0 - 7_200_000)  # another opens provisional and is kept in its one stratum (FREEZE)
    assert await store.chunks.freeze(cid, (t0 - 7_200_000) // 3_600_000)
    (chunk_a,) = [t for t in await store.chunks.chunk_ids(cid) if t * 3_600_000 <= t0 < (t + 1) * 3_600_000]
    members = [entries[0][0] for entries in await store.chunks.reservoirs(cid, chunk_a, 4)]
    assert await store.registry.acquire_lease(cid, "me", 10_000)  # LEASE
    requests = [[f"{cid}/tok{k}", k, orjson.loads(m)["i"], orjson.loads(m)["s"], m] for k, m in enumerate(members)]
    await store.redis.hset(store.keys.chunk_replace(cid, chunk_a), "0", 2)
    issued = await store.requests.issue(cid, chunk_a, now, now + 60_000, 1, "me", requests[:2], {0: 1}, 60_000,
                               np.array([0.1, 0.2, 0.3, 0.4]))  # ISSUE
    assert issued == [f"{cid}/tok0", f"{cid}/tok1"]
    await store.requests.mark_published(cid, issued)  # MARK_PUBLISHED
    out = await store.requests.apply_labels([LabelCall(cid, 0, 0, f"{cid}/tok0", "1", now, "ann"),  # LABEL: accepted
                                             LabelCall(cid, 0, 1, f"{cid}/tok1", "null", now, "ann"),  # skipped
                                             LabelCall(cid, 0, 2, f"{cid}/tok0", "0", now, "ann"),  # duplicate
                                             LabelCall(cid, 0, 3, f"{cid}/unknown", "1", now, "ann")])  # unknown
    assert [r.outcome for r in out] == ["accepted", "skipped", "duplicate", "unknown"]
    late = await store.requests.issue(cid, chunk_a, now, now - 1, 2, "me", requests[2:], {}, 60_000)
    assert await store.requests.expire(cid, now) == 2  # EXPIRE
    out = await store.requests.apply_labels([LabelCall(cid, 0, 4, late[0], "1", now, "ann")])
    assert out[0].outcome == "expired"
    assert await store.chunks.evaluate_round(cid, chunk_a, 1, 1, "open")  # EVALUATE_ROUND
    await store.chunks.set_status(cid, chunk_a, "converged", True)  # SET_STATUS
    assert await store.registry.release_lease(cid, "me")  # RELEASE
    assert await store.offsets.count_invalid("scores", 0, -1, 5, {"bad_json": 2}) == (True, 5)  # GLOBAL_COUNT
    assert await store.offsets.count_unknown_labels(0, -1, 3, 1) == (True, 3)
    assert await store.offsets.unknown_labels() == 1
    assert await store.offsets.note_applied({"scores:0": (-1, 400)}) == [None]  # NOTE_APPLIED
    assert await store.offsets.note_applied({"scores:0": (400, 300)}) == [400]  # never lowered
    assert await store.offsets.note_applied({"scores:0": (500, 600)}) == [400]  # below the caller's last: went back
    assert await store.offsets.applied_marks(["scores:0", "labels:0"]) == [400, None]  # left for the replay
    assert not await store.offsets.lower_applied("scores:0", 450)  # LOWER_APPLIED: only lowers
    assert await store.offsets.lower_applied("scores:0", 350)
    assert await store.offsets.applied_marks(["scores:0"]) == [350]
    negatives = negatives_of(cid)
    # NOTE_ACKNOWLEDGED
    await store.offsets.note_acknowledged({cid: {"scores:0": 400, "labels:0": 3}, negatives: {"scores:0": 390}})
    await store.offsets.note_acknowledged({cid: {"scores:0": 300, "labels:0": 5}})  # raised, never lowered
    assert await store.offsets.acknowledged_offsets([cid, negatives, "clf-none"], ["scores:0", "labels:0"]) == {
        cid: {"scores:0": 400, "labels:0": 5}, negatives: {"scores:0": 390}}
    assert await store.groups.grant("team", now, 5, 3) == 3  # GRANT: in the group's own slot
    assert await store.groups.grant("team", now, 5, 3) == 2  # the paced allowance's rest
    assert await store.groups.granted_this_hour("team", now) == 5
    mine = [ItemClaim("it-1", f"{cid}/r1"), ItemClaim("it-2", f"{cid}/r2", join_only=True)]
    assert await store.groups.claim("team", cid, now + 60_000, mine) == ["", "-"]  # CLAIM: the group's slot
    assert await store.groups.claim("team", "clf-b", now + 60_000, [ItemClaim("it-1", "clf-b/r3")]) == [f"{cid}/r1"]
    assert await store.requests.forget(cid, await store.chunks.chunk_ids(cid))  # FORGET
    assert not await store.redis.exists(store.keys.meta(cid), store.keys.chunk_meta(cid, chunk_a),
                                        store.keys.acknowledged(cid))  # its acknowledged offsets with it
    assert await store.offsets.acknowledged_offsets([negatives], ["scores:0"]) == {negatives: {"scores:0": 390}}


@pytest.mark.integration
async def test_every_script_touches_only_its_declared_keys_in_one_slot(embedded_redis, unique_name):
    settings = load_settings({"STRATAMETER_REDIS_URL": embedded_redis.url, "STRATAMETER_STRATA": "4",
                              "STRATAMETER_CHUNK_SECONDS": "3600", "STRATAMETER_RESERVOIR_SIZE": "64"})
    redis = Redis.from_url(embedded_redis.url)
    store = Store(redis, unique_name("keys"))
    names_by_sha = {s.sha: name for name, s in store.connection.scripts.registered.items()}
    try:
        async with Monitor(embedded_redis.url) as monitor:
            await _exercise(store, settings)
            marker = b"end-" + unique_name("m").encode()
            await redis.echo(marker)
            await monitor.until(marker)
        calls = _script_calls(monitor.lines, names_by_sha)
        assert {name for name, _, _ in calls} == set(scripts.NAMES)
        getkeys: dict[tuple, list[bytes]] = {}
        for name, declared, commands in calls:
            slots = {key_slot(k) for k in declared}
            assert len(slots) == 1, f"{name}: KEYS in {len(slots)} slots: {declared}"
            tag = re.match(rb"[^{]*(\{[^}]+\})", declared[0]).group(1)
            assert tag in (b"{clf-1}", b"{_global}", b"{team~group}"), (name, declared)
            for cmd in commands:
                if tuple(cmd) not in getkeys:
                    getkeys[tuple(cmd)] = [k if isinstance(k, bytes) else k.encode()
                                           for k in await redis.command_getkeys(*cmd)]
                touched = set(getkeys[tuple(cmd)])
                assert touched <= set(declared), f"{name}: {cmd[0]!r} touches {touched - set(declared)} not in KEYS"
    finally:
        await redis.aclose()


@pytest.mark.integration
async def test_ingest_keys_given_by_the_caller_or_read_from_the_payload(store):
    (recs,) = group_by_classifier(np.arange(6), ["c"] * 6, [f"i{i}" for i in range(6)],
                                  np.array([0.1, 0.6, 0.7, 0.2, 0.9, 0.3]), np.ones(6, bool),
                                  np.array([0, 0, 0, 3_600_000, 3_600_000, 3_600_000]), [None] * 6)
    payload = build_payload(recs, 3600, lambda t: ChunkCuts(np.array([0.5]), 0, False), 64, 0,
                            np.random.default_rng(0))
    assert ingest_chunks(payload) == [("0", [0, 1]), ("1", [0, 1])]
    redis = store.redis
    raw = encode_ingest(payload)
    for t in (0, 1):  # INGEST refuses a chunk never opened (or lost with Redis)
        await store.chunks.open_chunk("c", t, np.array([0.5]), 0, 64)
    out = await store.chunks.apply_ingest([IngestCall("c", 0, -1, 5, raw, ingest_chunks(payload)),
                                           IngestCall("c", 1, -1, 5, raw)])
    assert [(r.applied, r.stored_offset) for r in out] == [(True, 5), (True, 5)]
    assert await redis.hget(store.keys.meta("c"), "scores_total") == b"12"
    assert await redis.zcard(store.keys.reservoir("c", 1, 1)) == 1  # the same item twice


@pytest.mark.integration
async def test_hot_pipelines_send_bare_evalsha_and_load_the_scripts_on_noscript(store, redis_url):
    """INGEST and LABEL go out as EVALSHA with no SCRIPT EXISTS round trip before the
    pipeline; after SCRIPT FLUSH (a restarted Redis) the store loads the scripts and the
    batch is applied once, its offset guard advanced once."""
    (recs,) = group_by_classifier(np.arange(3), ["c"] * 3, ["i0", "i1", "i2"], np.array([0.1, 0.6, 0.7]),
                                  np.ones(3, bool), np.zeros(3, np.int64), [None] * 3)
    payload = encode_ingest(build_payload(recs, 3600, lambda t: ChunkCuts(np.array([0.5]), 0, False), 64, 0,
                                         np.random.default_rng(0)))
    redis = store.redis
    await store.chunks.open_chunk("c", 0, np.array([0.5]), 0, 64)
    async with Monitor(redis_url) as monitor:
        await redis.script_flush()
        out = await store.chunks.apply_ingest([IngestCall("c", 0, -1, 2, payload)])
        out += await store.chunks.apply_ingest([IngestCall("c", 0, 2, 5, payload)])
        (reply,) = await store.requests.apply_labels([LabelCall("c", 0, 0, "c/none", "1", 0, "x")])
        assert reply.outcome == "unknown"
        marker = b"end-noscript"
        await redis.echo(marker)
        await monitor.until(marker)
    assert [(r.applied, r.stored_offset) for r in out] == [(True, 2), (True, 5)]
    assert await redis.hget(store.keys.meta("c"), "scores_total") == b"6"
    commands = [args[0].upper() for client, args in monitor.lines if client != b"lua"]
    assert b"SCRIPT" in commands  # loaded once, after the NOSCRIPT
    assert [args[1].upper() for client, args in monitor.lines
            if client != b"lua" and args[0].upper() == b"SCRIPT"].count(b"EXISTS") == 0


# ------------------------------------------------------------------------------- re-checks


async def _pending_request(store: Store, cid: str, rid: str, chunk: int = 7) -> None:
    assert await store.registry.acquire_lease(cid, "me", 10_000)
    now = int(time.time() * 1000)
    assert await store.requests.issue(cid, chunk, now, now + 60_000, 1, "me", [[rid, 0, rid, 0.5, "{}"]], {},
                                      60_000) == [rid]


@pytest.mark.integration
async def test_label_refuses_when_the_request_is_not_what_was_read(store):
    redis, cid = store.redis, "c"
    await _pending_request(store, cid, "c/a")
    label = store.connection.scripts.registered["LABEL"]
    now = int(time.time() * 1000)
    # read as absent (no chunk keys), pending in fact: refused, nothing changed
    res = await label(keys=store.keys.label_keys(cid, "c/a", ""), args=[0, 5, "c/a", "1", now, "x", "", ""])
    assert res == [b"retry"]
    # read with another chunk: refused
    res = await label(keys=store.keys.label_keys(cid, "c/a", "8"), args=[0, 5, "c/a", "1", now, "x", "8", ""])
    assert res == [b"retry"]
    # its predecessor in the pipeline (offset 4) was refused: refused too, to keep the order
    res = await label(keys=store.keys.label_keys(cid, "c/a", "7"), args=[0, 5, "c/a", "1", now, "x", "7", 4])
    assert res == [b"retry"]
    assert await redis.hget(store.keys.labels_offsets(cid), "0") is None
    assert await redis.hget(store.keys.request(cid, "c/a"), "state") == b"new"
    assert await redis.exists(store.keys.chunk_labels(cid, 7)) == 0
    res = await label(keys=store.keys.label_keys(cid, "c/a", "7"), args=[0, 5, "c/a", "1", now, "x", "7", ""])
    assert res == [b"accepted", b"7", b"0"]


@pytest.mark.integration
async def test_labels_refused_after_the_read_are_retried_in_offset_order(store, monkeypatch):
    """A request that appears between the store's read and LABEL (read as unknown) is
    refused; the later label of the same partition is refused with it, and both are
    applied on the retry (exactly once, offsets in order)."""
    redis, cid = store.redis, "c"
    await _pending_request(store, cid, "c/b")
    pipeline, made = redis.pipeline, []

    def spying_pipeline(*args, **kwargs):
        pipe = pipeline(*args, **kwargs)
        made.append(pipe)
        if len(made) == 1:  # the first read: the request "c/a" appears right after it
            execute = pipe.execute

            async def execute_then_issue(*a, **k):
                out = await execute(*a, **k)
                await _pending_request(store, cid, "c/a")
                return out

            pipe.execute = execute_then_issue
        return pipe

    monkeypatch.setattr(redis, "pipeline", spying_pipeline)
    now = int(time.time() * 1000)
    out = await store.requests.apply_labels([LabelCall(cid, 3, 10, "c/a", "1", now, "x"),
                                             LabelCall(cid, 3, 11, "c/b", "0", now, "x")])
    assert out == [LabelReply("accepted", chunk=7, stratum=0), LabelReply("accepted", chunk=7, stratum=0)]
    assert len(made) == 4  # read, LABEL (both refused), read, LABEL
    assert await redis.hget(store.keys.labels_offsets(cid), "3") == b"11"
    assert await redis.hget(store.keys.chunk_labels(cid, 7), "0") == b"2"
    assert await redis.hget(store.keys.chunk_positives(cid, 7), "0") == b"1"


@pytest.mark.integration
async def test_pending_by_chunk_reads_each_requests_chunk_once(store, monkeypatch):
    """With the caller's memo, a request's chunk is read the first time it is seen pending only,
    and the memo forgets the requests no longer pending."""
    redis, cid = store.redis, "c"
    await _pending_request(store, cid, "c/a", chunk=7)
    await _pending_request(store, cid, "c/b", chunk=8)
    assert await store.requests.pending_by_chunk(cid) == {7: 1, 8: 1}  # without a memo: as before
    read: list[list[str]] = []
    hgets = store.connection.hgets

    async def counting(keys, field):
        read.append(keys)
        return await hgets(keys, field)

    monkeypatch.setattr(store.connection, "hgets", counting)
    memo: dict[str, int] = {}
    assert await store.requests.pending_by_chunk(cid, memo) == {7: 1, 8: 1}
    assert memo == {"c/a": 7, "c/b": 8} and len(read) == 1 and len(read[0]) == 2
    await _pending_request(store, cid, "c/c", chunk=8)
    assert await store.requests.pending_by_chunk(cid, memo) == {7: 1, 8: 2}
    assert read[1] == [store.keys.request(cid, "c/c")]  # only the new request was read
    now = int(time.time() * 1000)
    assert (await store.requests.apply_labels([LabelCall(cid, 0, 0, "c/a", "1", now, "x")]))[0].outcome == "accepted"
    before = len(read)  # LABEL's own read of the request
    assert await store.requests.pending_by_chunk(cid, memo) == {8: 2}
    assert memo == {"c/b": 8, "c/c": 8} and len(read) == before


@pytest.mark.integration
async def test_an_answer_after_the_deadline_is_expired_before_the_sweep(store):
    """LABEL judges the deadline itself: an answer that arrives after it, before EXPIRE swept
    the request, is not folded; the request is expired and replaced as EXPIRE would (once)."""
    redis, cid, k = store.redis, "c", store.keys
    await _pending_request(store, cid, "c/a")  # deadline: a minute from now
    await _pending_request(store, cid, "c/b")
    deadline = int(await redis.hget(k.request(cid, "c/b"), "deadline_ms"))
    assert int(await redis.hget(k.request(cid, "c/a"), "deadline_ms")) <= deadline
    out = await store.requests.apply_labels([LabelCall(cid, 0, 0, "c/a", "1", deadline - 60_000, "x"),  # in time
                                             LabelCall(cid, 0, 1, "c/b", "0", deadline, "x")])  # at the deadline: late
    assert out == [LabelReply("accepted", chunk=7, stratum=0), LabelReply("expired", chunk=7, stratum=0)]
    assert await redis.hget(k.request(cid, "c/b"), "state") == b"expired"
    counters = {a.decode(): int(b) for a, b in (await redis.hgetall(k.counters(cid))).items()
                if a != b"last_label_ms"}
    assert counters == {"requests_total": 2, "labels_accepted": 1, "labels_expired": 1, "requests_expired": 1}
    assert await redis.hget(k.chunk_replace(cid, 7), "0") == b"1"  # replaced in its stratum
    assert await redis.hget(k.chunk_labels(cid, 7), "0") == b"1"  # only the answer in time was folded
    assert await redis.zcard(k.pending(cid)) == 0
    assert await store.requests.expire(cid, deadline + 1) == 0  # the sweep finds nothing left to expire
    out = await store.requests.apply_labels([LabelCall(cid, 0, 2, "c/b", "1", deadline + 2, "x")])
    assert out == [LabelReply("expired")]  # a second late answer: counted, nothing else changes
    assert await redis.hget(k.counters(cid), "requests_expired") == b"1"
    assert await redis.hget(k.chunk_replace(cid, 7), "0") == b"1"


@pytest.mark.integration
async def test_expire_refuses_when_the_due_requests_are_not_what_was_read(store):
    redis, cid = store.redis, "c"
    await _pending_request(store, cid, "c/a")
    k, expire = store.keys, store.connection.scripts.registered["EXPIRE"]
    later = int(time.time() * 1000) + 120_000
    assert await expire(keys=[k.pending(cid), k.counters(cid)], args=[later]) == -1  # read: none due
    keys = [k.pending(cid), k.counters(cid), k.request(cid, "c/a"), k.chunk_replace(cid, 8)]
    assert await expire(keys=keys, args=[later, "c/a", "8", 4]) == -1  # read: another chunk
    assert await redis.hget(k.request(cid, "c/a"), "state") == b"new"
    assert await redis.zcard(k.pending(cid)) == 1
    assert await store.requests.expire(cid, later) == 1
    assert await redis.hget(k.request(cid, "c/a"), "state") == b"expired"
    assert await redis.hget(k.chunk_replace(cid, 7), "0") == b"1"


@pytest.mark.integration
async def test_every_script_runs_on_a_redis_cluster(redis_cluster_url, unique_name):
    """The same paths on a three-master Redis Cluster, through `RedisCluster` (which refuses
    EVALSHA in a pipeline, and whose nodes refuse a script touching a key of another slot)."""
    from redis.asyncio import RedisCluster

    settings = load_settings({"STRATAMETER_REDIS_URL": redis_cluster_url, "STRATAMETER_REDIS_CLUSTER": "true",
                              "STRATAMETER_STRATA": "4", "STRATAMETER_CHUNK_SECONDS": "3600",
                              "STRATAMETER_RESERVOIR_SIZE": "64"})
    redis = RedisCluster.from_url(redis_cluster_url)
    try:
        store = Store(redis, unique_name("keys"))
        assert store.connection.scripts.cluster
        await _exercise(store, settings)
    finally:
        await redis.aclose()


@pytest.mark.integration
async def test_cluster_batches_run_per_classifier_in_order_and_reload_scripts(redis_cluster_url, unique_name):
    """One batch of labels for classifiers on different nodes: each classifier's calls in
    offset order (none refused as out of order), after SCRIPT FLUSH on every node (a
    restarted node) the scripts are loaded again and everything is applied once."""
    from redis.asyncio import RedisCluster

    redis = RedisCluster.from_url(redis_cluster_url)
    try:
        await redis.initialize()
        store = Store(redis, unique_name("order"))
        cids = [f"c{i}" for i in range(12)]
        nodes = {redis.get_node_from_key(store.keys.meta(c)).name for c in cids}
        assert len(nodes) == 3  # the classifiers are spread over the three masters
        for cid in cids:
            await redis.hset(store.keys.meta(cid), "first_seen_ms", 1)
        await redis.script_flush()  # on every primary (the cluster routing of SCRIPT FLUSH)
        calls = [LabelCall(cid, 0, off, f"{cid}/none{off}", "1", 0, "x") for off in range(5) for cid in cids]
        out = await store.requests.apply_labels(calls)
        assert [r.outcome for r in out] == ["unknown"] * len(calls)
        for cid in cids:
            assert await redis.hget(store.keys.labels_offsets(cid), "0") == b"4"
            assert await redis.hget(store.keys.counters(cid), "labels_unknown") == b"5"
        # with the offset applied
        assert await store.requests.apply_labels(calls[:3]) == [LabelReply("replay", stored_offset=4)] * 3
    finally:
        await redis.aclose()
