"""`stratameter config`: check the ``STRATAMETER_*`` environment as `stratameter run` would and print
the effective settings, each with where it came from; exit 2 naming every wrong variable."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping

from pydantic import SecretStr

from .checks import ConfigError, env_var
from .settings import FILE_SECRETS, Settings, load_settings

#: where a setting's value came from
SOURCES = ("environment", "file", "default", "derived")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check the STRATAMETER_* settings and print the effective ones with their "
                                      "sources (what `stratameter run` would start with)")
    p.add_argument("--json", action="store_true", help="one JSON object: {setting: {variable, value, source}}")
    p.set_defaults(handler=main)


def main(args) -> int:
    try:
        settings = load_settings()
    except ConfigError as exc:
        for var, message in exc.errors:
            print(f"stratameter config: {var}: {message}" if var else f"stratameter config: {message}",
                  file=sys.stderr)
        return 2
    rows = effective(settings, os.environ)
    if args.json:
        print(json.dumps(rows))
        return 0
    width = max(len(r["variable"]) for r in rows.values())
    for row in rows.values():
        print(f"{row['variable']:<{width}}  {row['value']:<40}  {row['source']}")
    if settings.overridden_classifiers:
        print(f"per-classifier overrides ({settings.classifiers_config_file}): "
              f"{', '.join(settings.overridden_classifiers)}")
    if settings.review_budgets:
        print("review groups with a shared budget (labels per hour): "
              + ", ".join(f"{group} {budget}" for group, budget in settings.review_budgets.items()))
    return 0


def effective(settings: Settings, environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per setting its variable, its value as a variable would write it (secrets masked) and its source:
    ``environment`` (its variable), ``file`` (its ``_FILE`` variable), ``default``, or ``derived`` (left
    unset, and worked out from other settings, as `ALLOWED_LATENESS_SECONDS` and `WINDOWS` are)."""
    rows = {}
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        if name in FILE_SECRETS and environ.get(f"{env_var(name)}_FILE"):
            source = "file"
        elif environ.get(env_var(name)):
            source = "environment"
        elif field.default_factory is None and value != field.default:
            source = "derived"
        else:
            source = "default"
        rows[name] = {"variable": env_var(name), "value": _written(value), "source": source}
    return rows


def _written(value) -> str:
    if isinstance(value, SecretStr):
        return "**********"
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
