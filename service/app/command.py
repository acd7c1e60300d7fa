"""`stratameter run`: start the service with settings from the environment."""

from __future__ import annotations

import argparse
import asyncio
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the monitoring service (settings from STRATAMETER_* env vars)",
                       description="Run the monitoring service. Every setting is a STRATAMETER_* environment "
                                   "variable (docs/reference/configuration.md); `stratameter config` checks them and "
                                   "prints the effective values with their sources.")
    p.set_defaults(handler=main)


def main(args) -> int:
    from ..config import ConfigError, load_settings
    from .logs import configure_logging
    from .runner import run

    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"stratameter run: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    return asyncio.run(run(settings))
