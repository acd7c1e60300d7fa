"""The `stratameter` command: run, config, simulate, peers, bench, soak, demo, backends, bridge."""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommands live in their own packages; each module exposes add_parser(sub).
SUBCOMMANDS = (
    "stratameter.app.command",
    "stratameter.config.command",
    "stratameter.simulate.command",
    "stratameter.simulate.peers_command",
    "stratameter.bench.command",
    "stratameter.soak.command",
    "stratameter.demo.command",
    "stratameter.demo.backends",
    "stratameter.bridge.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stratameter",
        description="Continuous, label-efficient precision monitoring of deployed classifiers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not name.startswith(exc.name or "\0"):  # a missing dependency, not an absent subcommand
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
