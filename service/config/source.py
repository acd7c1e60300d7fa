"""Where the settings come from: ``STRATAMETER_<FIELD>`` variables and ``*_FILE`` secret files.

Names are upper case only; an empty value counts as unset.  A field marked `Mark.FROM_FILE` may instead
come from the file named by ``STRATAMETER_<FIELD>_FILE`` (one trailing newline is dropped); setting
both is an error.  `load_settings` hands its mapping to the source through `ENVIRON`.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from .checks import ConfigError, Mark, env_var

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
        if errors:
            raise ConfigError(errors)
        return values
