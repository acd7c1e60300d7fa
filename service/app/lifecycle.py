"""How a process of the service's kind runs: its HTTP endpoints, then its loops until SIGTERM or
SIGINT, then closing; one log line naming the settings when it cannot start (`stratameter run`,
`app.runner`; `stratameter bridge label-studio`, `bridge.bridge`)."""

from __future__ import annotations

import asyncio
import logging
import signal

from ..config import Settings
from .consumer import StartupError
from .logs import redact

log = logging.getLogger("stratameter")


async def run_until_stopped(process, settings: Settings, serve, http_setting: str, host: str, port: int,
                            started, logger: logging.Logger = log) -> int:
    """A process of the service's kind (`start`, `spawn` its loops, `stopping`, `stop`: the service
    and the Label Studio bridge) with its HTTP endpoints (`serve(process, host, port)`) until
    SIGTERM/SIGINT: exit 0 once its loops have finished and it is closed; 1, with one log line
    naming the settings, when it cannot listen (`http_setting` + ``_HOST``/``_PORT``) or start.
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
    message, extra = started()
    logger.info(message, extra={**extra, "settings": settings.safe_dict()})
    tasks = process.spawn()
    await process.stopping.wait()
    logger.info("stopping")
    await asyncio.gather(*tasks, return_exceptions=True)
    server.close()
    await process.stop()
    logger.info("stopped")
    return 0
