"""Where the settings come from: ``STRATAMETER_<FIELD>`` variables and ``*_FILE`` secret files.

Names are upper case only; an empty value counts as unset.  A field marked `Mark.FROM_FILE` may instead
come from the file named by ``STRATAMETER_<FIELD>_FILE`` (one trailing newline is dropped); setting
both is an error.  Any other ``STRATAMETER_*`` variable is an error too (a typo such as
``STRATAMETER_DELTAA`` would otherwise leave the default in force unnoticed), except those of the tools
around the service (`TOOL_VARIABLES`, `TOOL_PREFIXES`).  `load_settings` hands its mapping to the
source through `ENVIRON`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from .checks import ENV_PREFIX, ConfigError, Mark, env_var

#: ``STRATAMETER_*`` variables that are not settings: the embedded backends' binaries (the demo, bench
#: and tests; Label Studio's for the bridge's demo and tests) and the tests' external backends and markers
TOOL_VARIABLES = frozenset({"STRATAMETER_TANSU_BIN", "STRATAMETER_REDIS_SERVER", "STRATAMETER_LABEL_STUDIO_BIN"})
TOOL_PREFIXES = ("STRATAMETER_TEST_", "STRATAMETER_DEMO_")

#: the mapping `load_settings` reads instead of ``os.environ`` (None: ``os.environ``)
ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("stratameter_environ", default=None)


def read_secret_file(var: str, path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([(var, f"cannot read {path!r}: {exc.__class__.__name__}: "
                                 f"{getattr(exc, 'strerror', None) or exc}")]) from None
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    if not text:
        raise ConfigError([(var, f"the file {path!r} is empty")])
    return text


class EnvSource(PydanticBaseSettingsSource):
    """``STRATAMETER_<FIELD>`` (upper case; empty = unset) and ``<FIELD>_FILE`` for fields marked `Mark.FROM_FILE`."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = self.environ.get(env_var(field_name)) or None
        return value, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        errors: list[tuple[str, str]] = []
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            file_var = env_var(name) + "_FILE"
            path = (self.environ.get(file_var) or None) if Mark.FROM_FILE in field.metadata else None
            if path is not None:
                if value is not None:
                    errors.append((file_var, f"set either {env_var(name)} or {file_var}, not both"))
                    continue
                try:
                    value = read_secret_file(file_var, path)
                except ConfigError as exc:
                    errors.extend(exc.errors)
                    continue
            if value is not None:
                values[name] = value
        errors += self._unknown_variables()
        if errors:
            raise ConfigError(errors)
        return values

    def _unknown_variables(self) -> list[tuple[str, str]]:
        fields = self.settings_cls.model_fields
        known = {env_var(n) for n in fields} | {env_var(n) + "_FILE" for n, f in fields.items()
                                                if Mark.FROM_FILE in f.metadata}
        errors = []
        for var in sorted(v for v in self.environ if v.startswith(ENV_PREFIX)):
            if var in known or var in TOOL_VARIABLES or var.startswith(TOOL_PREFIXES):
                continue
            close = difflib.get_close_matches(var, sorted(known), n=1)
            errors.append((var, "not a setting of stratameter (docs/reference/configuration.md)"
                                + (f"; did you mean {close[0]}?" if close else "")))
        return errors
