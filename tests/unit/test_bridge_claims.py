"""The bridge's claim protocol (`stratameter.bridge.claims`) without Redis: the stored text read and
written byte for byte as every bridge version has (hand-written values), the step a replica takes
from each state, and each transition of `Claims` against an in-memory stand-in for the few Redis
commands it sends (GET, SET with NX/XX/GET/EX/KEEPTTL, DEL).  The protocol against a real Redis and
Label Studio, with replicas racing: tests/e2e/test_label_studio.py."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from stratameter.bridge.claims import (CLAIM_STALE_S, Answered, Claim, Claims, Foreign, Outcome, Step, Task,
                                       next_step, parse)
from stratameter.bridge.context import Stopped

KEY = "br:{clf}:ls:4:clf/r1"
NOW_MS = 1_700_000_000_000
STALE_MS = int(CLAIM_STALE_S * 1000)


# --------------------------------------------------------------------------- the stored text


@pytest.mark.parametrize("raw, state", [
    (b"claim bridge-7f9c.example:0 1700000000000 4242.7", Claim("bridge-7f9c.example:0", 1_700_000_000_000, "4242.7")),
    (b"claim dead-replica 1000 1", Claim("dead-replica", 1000, "1")),  # as tests/e2e writes an orphan's claim
    (b"claim b-1 0 17.3", Claim("b-1", 0, "17.3")),  # released after a transient failure
    (b"task 0", Task(0)),
    (b"task 918273", Task(918273)),
    (b"answered 918273 55", Answered(918273, 55)),
])
def test_a_stored_value_parses_and_formats_back_byte_for_byte(raw, state):
    assert parse(raw) == state
    assert state.format() == raw
    assert parse(state.format()) == state


@pytest.mark.parametrize("raw", [
    b"", b"claim", b"claim b-1 1000", b"claim b-1 1000 n extra", b"claim b-1 soon n", b"claim b-1 -5 n",
    b"claim  1000 n", b"claim b-1 1000 n ", b"claim b-1 \xc2\xb2 n", b"task", b"task ", b"task x", b"task 5 6",
    b"answered", b"answered 5", b"answered 5 x", b"TASK 5", b"\xff\xfe", b"task 5\n",
])
def test_a_value_no_bridge_writes_is_foreign_and_kept_as_it_is(raw):
    assert parse(raw) == Foreign(raw)
    assert parse(raw).format() == raw


def test_the_states_are_values():
    assert Claim("a", 1, "n") == Claim("a", 1, "n") and hash(Task(3)) == hash(Task(3))
    with pytest.raises(AttributeError):
        Task(3).task_id = 4  # frozen


# --------------------------------------------------------------------------- the next step


@pytest.mark.parametrize("state, now_ms, step", [
    (None, NOW_MS, Step.CLAIM),
    (Task(5), NOW_MS, Step.EXISTS),
    (Answered(5, 9), NOW_MS, Step.EXISTS),
    (Claim("other", NOW_MS, "1.1"), NOW_MS, Step.WAIT),  # its creator is at work
    (Claim("other", NOW_MS - STALE_MS + 1, "1.1"), NOW_MS, Step.WAIT),
    (Claim("other", NOW_MS + 5_000, "1.1"), NOW_MS, Step.WAIT),  # a clock ahead of ours: still live
    (Claim("other", NOW_MS - STALE_MS, "1.1"), NOW_MS, Step.TAKE_OVER),  # its creator died
    (Claim("other", 0, "1.1"), NOW_MS, Step.TAKE_OVER),  # released: free to take over
    (Claim("other", 0, "1.1"), 1, Step.TAKE_OVER),
    (Foreign(b"junk"), NOW_MS, Step.TAKE_OVER),
    (Foreign(b"task x"), NOW_MS, Step.TAKE_OVER),
])
def test_next_step(state, now_ms, step):
    assert next_step(state, now_ms) is step


# --------------------------------------------------------------------------- the transitions in Redis


class FakeRedis:
    """GET, SET (NX, XX, GET, EX, KEEPTTL) and DEL as Redis answers them, on bytes; `ttl[key]` is the
    last EX given (None: none).  `after_get` runs once after the next GET (another replica's write)."""

    def __init__(self, **values: bytes) -> None:
        self.values: dict[str, bytes] = dict(values)
        self.ttl: dict[str, int | None] = {k: None for k in values}
        self.after_get: list = []
        self.calls: list[str] = []

    async def get(self, key):
        self.calls.append("GET")
        value = self.values.get(key)
        if self.after_get:
            self.after_get.pop(0)(self)
        return value

    async def set(self, key, value, nx=False, xx=False, get=False, ex=None, keepttl=False):
        self.calls.append("SET" + "".join(f" {o}" for o, on in (("NX", nx), ("XX", xx), ("GET", get),
                                                                 ("KEEPTTL", keepttl)) if on))
        old = self.values.get(key)
        ok = not ((nx and old is not None) or (xx and old is None))
        if ok:
            self.values[key] = value if isinstance(value, bytes) else str(value).encode()
            if not keepttl:
                self.ttl[key] = ex
        return old if get else (True if ok else None)

    async def delete(self, key):
        self.calls.append("DEL")
        self.ttl.pop(key, None)
        return int(self.values.pop(key, None) is not None)


def _claims(redis: FakeRedis, stopping: asyncio.Event | None = None) -> Claims:
    return Claims(redis, "me", stopping or asyncio.Event())


def _assert_our_claim(raw: bytes, nonce: str, since_ms: int) -> None:
    state = parse(raw)
    assert isinstance(state, Claim) and state.instance == "me" and state.nonce == nonce
    assert since_ms <= state.since_ms <= int(time.time() * 1000)
    assert raw == f"claim me {state.since_ms} {nonce}".encode()


async def test_a_free_key_is_claimed_with_set_nx():
    redis, before = FakeRedis(), int(time.time() * 1000)
    how, nonce = await _claims(redis).claim(KEY, 3600)
    assert (how, nonce) == (Outcome.CREATE, f"{os.getpid()}.1")
    _assert_our_claim(redis.values[KEY], nonce, before)
    assert redis.ttl[KEY] == 3600 and redis.calls == ["GET", "SET NX"]


@pytest.mark.parametrize("value", [b"task 42", b"answered 42 7"])
async def test_a_request_with_a_task_is_left_as_it_is(value):
    redis = FakeRedis(**{KEY: value})
    assert await _claims(redis).claim(KEY, 3600) == (Outcome.EXISTS, "")
    assert redis.values[KEY] == value and redis.calls == ["GET"]


@pytest.mark.parametrize("value", [
    b"claim dead-replica 1000 1",  # its creator died
    b"claim other 0 9.9",  # released after a transient failure
    b"something no bridge writes",
])
async def test_a_stale_released_or_foreign_value_is_taken_over(value):
    redis, before = FakeRedis(**{KEY: value}), int(time.time() * 1000)
    how, nonce = await _claims(redis).claim(KEY, 3600)
    assert how is Outcome.TAKEOVER and nonce
    _assert_our_claim(redis.values[KEY], nonce, before)
    assert redis.ttl[KEY] == 3600 and redis.calls == ["GET", "SET XX GET"]


async def test_a_live_claim_is_waited_for_until_its_task_is_recorded():
    live = Claim("other", int(time.time() * 1000), "3.1").format()
    redis = FakeRedis(**{KEY: live})
    redis.after_get.append(lambda r: r.values.update({KEY: b"task 42"}))  # the other replica finishes
    assert await _claims(redis).claim(KEY, 3600) == (Outcome.EXISTS, "")
    assert redis.values[KEY] == b"task 42" and redis.calls == ["GET", "GET"]


async def test_a_live_claim_is_not_waited_for_once_the_bridge_stops():
    stopping = asyncio.Event()
    stopping.set()
    redis = FakeRedis(**{KEY: Claim("other", int(time.time() * 1000), "3.1").format()})
    with pytest.raises(Stopped):
        await _claims(redis, stopping).claim(KEY, 3600)
    assert redis.calls == ["GET"]


async def test_a_task_recorded_during_a_takeover_is_put_back():
    redis = FakeRedis(**{KEY: b"claim dead-replica 1000 1"})
    redis.ttl[KEY] = 77
    redis.after_get.append(lambda r: r.values.update({KEY: b"task 42"}))  # its creator was only slow
    assert await _claims(redis).claim(KEY, 3600) == (Outcome.EXISTS, "")
    assert redis.values[KEY] == b"task 42" and redis.calls == ["GET", "SET XX GET", "SET XX KEEPTTL"]


async def test_a_key_that_expired_during_a_takeover_is_claimed_afresh():
    redis = FakeRedis(**{KEY: b"claim dead-replica 1000 1"})
    redis.after_get.append(lambda r: r.values.pop(KEY))
    how, nonce = await _claims(redis).claim(KEY, 3600)
    assert (how, nonce) == (Outcome.CREATE, f"{os.getpid()}.2")  # one nonce per attempt
    assert redis.calls == ["GET", "SET XX GET", "GET", "SET NX"]


async def test_a_claim_lost_to_another_replica_is_read_again():
    redis = FakeRedis()
    redis.after_get.append(lambda r: r.values.update({KEY: b"task 42"}))  # claimed and done meanwhile
    assert await _claims(redis).claim(KEY, 3600) == (Outcome.EXISTS, "")
    assert redis.values[KEY] == b"task 42" and redis.calls == ["GET", "SET NX", "GET"]


async def test_release_leaves_the_claim_free_to_take_over():
    redis = FakeRedis()
    c = _claims(redis)
    _, nonce = await c.claim(KEY, 3600)
    await c.release(KEY, nonce, 1800)
    assert redis.values[KEY] == Claim("me", 0, nonce).format() == f"claim me 0 {nonce}".encode()
    assert redis.ttl[KEY] == 1800 and next_step(parse(redis.values[KEY]), NOW_MS) is Step.TAKE_OVER
    await c.release("gone", nonce, 1800)  # XX: a key that expired stays gone
    assert "gone" not in redis.values


async def test_record_task_then_record_answer():
    redis = FakeRedis()
    c = _claims(redis)
    await c.claim(KEY, 3600)
    await c.record_task(KEY, 42, 3600)
    assert redis.values[KEY] == b"task 42" and redis.ttl[KEY] == 3600
    assert not await c.answered(KEY)
    redis.ttl[KEY] = 99  # as time passes
    await c.record_answer(KEY, 42, 7)
    assert redis.values[KEY] == b"answered 42 7" and redis.ttl[KEY] == 99  # KEEPTTL
    assert await c.answered(KEY)
    await c.record_answer("gone", 42, 7)  # XX: an expired request key is not recreated
    assert "gone" not in redis.values


@pytest.mark.parametrize("value, answered", [
    (None, False), (b"claim me 5 1.1", False), (b"task 42", False), (b"answered 42 7", True),
    (b"answered 42", False),
])
async def test_answered_reads_the_answered_state_only(value, answered):
    redis = FakeRedis(**({} if value is None else {KEY: value}))
    assert await _claims(redis).answered(KEY) is answered


async def test_drop_deletes_the_claim():
    redis = FakeRedis()
    c = _claims(redis)
    await c.claim(KEY, 3600)
    await c.drop(KEY)
    assert KEY not in redis.values
    assert await c.claim(KEY, 3600) == (Outcome.CREATE, f"{os.getpid()}.2")

