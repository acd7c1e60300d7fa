"""`stratameter bridge label-studio`: settings from the environment, then the bridge until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bridge", help="connect the label-request and labels topics to a review tool")
    tools = p.add_subparsers(dest="tool", required=True, metavar="TOOL")
    ls = tools.add_parser(
        "label-studio", help="label requests become Label Studio tasks, annotations come back as labels",
        description="Consumes the label-request topic (its own consumer group, STRATAMETER_BRIDGE_CONSUMER_GROUP), "
                    "creates one Label Studio task per request, and produces each task's first annotation to the "
                    "labels topic (webhook at POST /webhook, polling as a safety net). Settings: STRATAMETER_* "
                    "(docs/how-to/label-studio.md); metrics, /healthz and /readyz on "
                    "STRATAMETER_BRIDGE_HTTP_PORT.")
    ls.set_defaults(handler=main)


def main(args) -> int:
    from ..app.logs import configure_logging
    from ..config import ConfigError, load_settings
    from .bridge import run
    from .startup import require_token

    try:
        settings = load_settings()
        require_token(settings)
    except ConfigError as exc:
        print(f"stratameter bridge label-studio: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    return asyncio.run(run(settings))
