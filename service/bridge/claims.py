"""The claim protocol: one Label Studio task per label request, across replicas, replays and crashes.

A request's Redis key (`Keys.label_studio_request`) holds its `State`, stored as text (`parse` and
`State.format` are the only readers and writers of that text; the format is unchanged since the
bridge's first version, so replicas of any version share the keys):

  claim <instance> <since_ms> <nonce>  `Claim`: replica `instance` is creating the task since
                                       `since_ms` (0: it failed transiently and released it)
  task <task_id>                       `Task`: the task exists and awaits its answer
  answered <task_id> <annotation_id>   `Answered`: its first annotation was dealt with
  anything else                        `Foreign`: no bridge writes it; taken over as a stale claim

Transitions (`Claims`; `next_step` decides the first four from what was read):

  absent                      -> Claim (ours)     SET NX                       CREATE
  Claim live (< CLAIM_STALE_S) -> (read again in 0.25 s: another replica is creating the task)
  Claim stale, released (0),
  or Foreign                  -> Claim (ours)     SET XX GET, GET = what we read: TAKEOVER (the
                                                  task may exist: look it up before creating it)
  Task or Answered            -> unchanged                                     EXISTS
  Claim (ours)                -> Task             created or found             `record_task`
                              -> Claim (since 0)  Label Studio failed transiently   `release`
                              -> absent           Label Studio refused it for good  `drop`
  Task                        -> Answered         forwarded, or an unknown choice   `record_answer`
"""

from __future__ import annotations

import asyncio
import enum
import os
import re
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from .context import Stopped

#: a claim older than this was left by a replica that died while creating the task (a call to Label
#: Studio times out after 30 s, so a live creator is never taken over)
CLAIM_STALE_S = 60.0
#: how long a replica waits before reading a live claim of another again
WAIT_S = 0.25

_CLAIM = re.compile(rb"claim ([^ ]+) ([0-9]+) ([^ ]+)")
_TASK = re.compile(rb"task ([0-9]+)")
_ANSWERED = re.compile(rb"answered ([0-9]+) ([0-9]+)")


@dataclass(frozen=True)
class Claim:
    """Replica `instance` creates the task since `since_ms` (0: released, free to take over);
    `nonce` tells its successive claims apart."""

    instance: str
    since_ms: int
    nonce: str

    def format(self) -> bytes:
        return f"claim {self.instance} {self.since_ms} {self.nonce}".encode()

    def live(self, now_ms: int) -> bool:
        """Its creator may still be at work: not released and younger than `CLAIM_STALE_S`."""
        return self.since_ms != 0 and now_ms - self.since_ms < CLAIM_STALE_S * 1000


@dataclass(frozen=True)
class Task:
    """The request's task exists (id `task_id`) and awaits its answer."""

    task_id: int

    def format(self) -> bytes:
        return f"task {self.task_id}".encode()


@dataclass(frozen=True)
class Answered:
    """Annotation `annotation_id` of task `task_id` was forwarded (or refused: an unknown choice)."""

    task_id: int
    annotation_id: int

    def format(self) -> bytes:
        return f"answered {self.task_id} {self.annotation_id}".encode()


@dataclass(frozen=True)
class Foreign:
    """A value no bridge writes: handled as a stale claim (taken over, the task looked up first)."""

    raw: bytes

    def format(self) -> bytes:
        return self.raw


State = Claim | Task | Answered | Foreign


def parse(raw: bytes) -> State:
    """The state a request key holds (`format`'s inverse; anything else is `Foreign`)."""
    if m := _CLAIM.fullmatch(raw):
        return Claim(m[1].decode(errors="replace"), int(m[2]), m[3].decode(errors="replace"))
    if m := _TASK.fullmatch(raw):
        return Task(int(m[1]))
    if m := _ANSWERED.fullmatch(raw):
        return Answered(int(m[1]), int(m[2]))
    return Foreign(raw)


def has_task(state: State | None) -> bool:
    return isinstance(state, (Task, Answered))


class Step(enum.Enum):
    """What a replica that wants to create a request's task does next, given what the key holds."""

    CLAIM = "claim"          # the key is free: claim it (SET NX)
    EXISTS = "exists"        # the request has its task: nothing to do
    WAIT = "wait"            # another replica is creating it right now: read again shortly
    TAKE_OVER = "take_over"  # a stale or released claim, or a foreign value: take it (SET XX GET)


def next_step(state: State | None, now_ms: int) -> Step:
    if state is None:
        return Step.CLAIM
    if has_task(state):
        return Step.EXISTS
    if isinstance(state, Claim) and state.live(now_ms):
        return Step.WAIT
    return Step.TAKE_OVER


class Outcome(enum.Enum):
    """How `Claims.claim` ended."""

    CREATE = "create"      # ours, first: create the task
    TAKEOVER = "takeover"  # a stale claim taken over: look the task up before creating it
    EXISTS = "exists"      # the request has its task


class Claims:
    """The request keys' reads and writes, by replica `instance` (the transitions above)."""

    def __init__(self, redis: Redis, instance: str, stopping: asyncio.Event) -> None:
        self.redis, self.instance, self.stopping = redis, instance, stopping
        self._nonce = 0

    def _mine(self, now_ms: int) -> Claim:
        self._nonce += 1
        return Claim(self.instance, now_ms, f"{os.getpid()}.{self._nonce}")

    async def claim(self, key: str, ttl: int) -> tuple[Outcome, str]:
        """`(EXISTS, "")` when the request has a task; else `(CREATE, nonce)` or `(TAKEOVER, nonce)`,
        the nonce of our claim.  Waits while another replica's claim is live; raises `Stopped`
        when the bridge stops meanwhile."""
        while True:
            raw = await self.redis.get(key)
            mine = self._mine(int(time.time() * 1000))
            step = next_step(None if raw is None else parse(raw), mine.since_ms)
            if step is Step.EXISTS:
                return Outcome.EXISTS, ""
            if step is Step.CLAIM:
                if await self.redis.set(key, mine.format(), nx=True, ex=ttl):
                    return Outcome.CREATE, mine.nonce
            elif step is Step.WAIT:
                if self.stopping.is_set():
                    raise Stopped
                await asyncio.sleep(WAIT_S)
            elif (taken := await self._take_over(key, raw, mine, ttl)) is not None:
                return taken
            # the key changed under us (another replica claimed, took over or finished): look again

    async def _take_over(self, key: str, raw: bytes, mine: Claim, ttl: int) -> tuple[Outcome, str] | None:
        old = await self.redis.set(key, mine.format(), xx=True, get=True, ex=ttl)
        if old == raw:
            return Outcome.TAKEOVER, mine.nonce
        if old is not None and has_task(parse(old)):
            await self.redis.set(key, old, xx=True, keepttl=True)  # put back what a finished replica wrote
            return Outcome.EXISTS, ""
        return None  # another replica took it over first (or it expired)

    async def release(self, key: str, nonce: str, ttl: int) -> None:
        """Label Studio failed transiently (the task may exist all the same): the claim stays ours
        but free to take over, so the retry, ours or another replica's, looks the task up first."""
        await self.redis.set(key, Claim(self.instance, 0, nonce).format(), xx=True, ex=ttl)

    async def record_task(self, key: str, task_id: int, ttl: int) -> None:
        await self.redis.set(key, Task(task_id).format(), ex=ttl)

    async def drop(self, key: str) -> None:
        """Label Studio refused the task for good: no claim is left."""
        await self.redis.delete(key)

    async def answered(self, key: str) -> bool:
        raw = await self.redis.get(key)
        return raw is not None and isinstance(parse(raw), Answered)

    async def record_answer(self, key: str, task_id: int, annotation_id: int) -> None:
        """The request's answer was dealt with (its TTL kept; nothing written once the key expired)."""
        await self.redis.set(key, Answered(task_id, annotation_id).format(), xx=True, keepttl=True)
