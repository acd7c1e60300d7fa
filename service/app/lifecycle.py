"""How a process of the service's kind runs: its HTTP endpoints, then its loops until SIGTERM or
SIGINT, then closing; one log line naming the settings when it cannot start (`stratameter run`,
`app.runner`; `stratameter bridge label-studio`, `bridge.bridge`).  A loop that ends before it
is told to (an exception nothing inside it handles) stops the process with exit code 1: left
running, the process would answer its probes and hold its partitions and leases with nothing
consumed (the orchestrator restarts it; every state change is idempotent, so the replay is
harmless)."""

from __future__ import annotations

import asyncio
import logging
import signal

from ..config import Settings
from ..errors import StartupError
from .logs import redact

log = logging.getLogger(__name__)


async def run_until_stopped(process, settings: Settings, serve, http_setting: str, host: str, port: int,
                            started, logger: logging.Logger = log) -> int:
    """A process of the service's kind (`start`, `spawn` its loops, `stopping`, `stop`: the service
    and the Label Studio bridge) with its HTTP endpoints (`serve(process, host, port)`) until
    SIGTERM/SIGINT: exit 0 once its loops have finished and it is closed; 1, with one log line
    naming the settings, when it cannot listen (`http_setting` + ``_HOST``/``_PORT``) or start;
    1 too, after closing, when a loop ended before it was told to stop (`_until_stopped`).
    `started()` gives the start message and its extra log fields, logged to `logger`."""
    redact(settings.secret_values())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, process.stopping.set)
    try:
        server = await serve(process, host, port)
    except OSError as exc:  # a port in use or not ours to bind: one line naming the settings
        logger.error("cannot start: %s_HOST/%s_PORT: cannot listen on %s:%d: %s", http_setting, http_setting,
                     host, port, exc.strerror or exc)
        await process.stop()
        return 1
    try:
        await process.start()
    except StartupError as exc:
        logger.error("cannot start: %s", exc)
        server.close()
        await process.stop()
        return 1
    if process.stopping.is_set():  # told to stop while start-up still waited for a backend
        server.close()
        await process.stop()
        return 0
    message, extra = started()
    logger.info(message, extra={**extra, "settings": settings.safe_dict()})
    tasks = process.spawn()
    failed = await _until_stopped(process.stopping, tasks, logger)
    logger.info("stopping")
    await asyncio.gather(*tasks, return_exceptions=True)
    server.close()
    await process.stop()
    logger.info("stopped")
    return 1 if failed else 0


async def pause(stopping: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds`, or less if `stopping` is set meanwhile; returns whether it is set (the loops'
    sleep between turns: a stop never waits for the rest of a turn's interval)."""
    try:
        await asyncio.wait_for(stopping.wait(), seconds)
    except asyncio.TimeoutError:
        return False
    return True


async def _until_stopped(stopping: asyncio.Event, tasks: list[asyncio.Task], logger: logging.Logger) -> bool:
    """Wait until `stopping` is set, or one of the loops `tasks` ends first: then log how it
    ended, set `stopping` (the other loops finish) and return True."""
    told = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait([told, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        told.cancel()
    if stopping.is_set():
        return False
    for task in (t for t in tasks if t.done()):
        error = None if task.cancelled() else task.exception()
        logger.error("a loop of the process ended before it was told to stop: stopping (exit code 1)",
                     extra={"loop": task.get_coro().__qualname__}, exc_info=error)
    stopping.set()
    return True
