"""Settings from keyword arguments, as the tests of `stratameter.config` write them:
``env(max_labels_per_hour="10")`` is ``{"STRATAMETER_MAX_LABELS_PER_HOUR": "10"}``."""

from __future__ import annotations

import pytest

from stratameter.config import ENV_PREFIX as P
from stratameter.config import ConfigError, load_settings

__all__ = ["P", "env", "error_of"]


def env(**values: str) -> dict[str, str]:
    return {P + k.upper(): v for k, v in values.items()}


def error_of(environ: dict[str, str]) -> ConfigError:
    """The `ConfigError` loading `environ` raises."""
    with pytest.raises(ConfigError) as info:
        load_settings(environ)
    return info.value
