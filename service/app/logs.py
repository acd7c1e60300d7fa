"""Structured (one JSON object per line) logs on stderr.

Known secrets (`redact`) are replaced by asterisks in every line, whatever logged them
(a library's debug output, an exception message, a traceback): the last line of defence
behind `Settings.safe_dict()` and the libraries' own log levels.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from urllib.parse import quote

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_MASK = "**********"
#: shorter secrets are not redacted: replacing every occurrence would garble the logs
MIN_REDACTED_LENGTH = 4


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.secrets: tuple[str, ...] = ()

    def add_secrets(self, secrets: Iterable[str]) -> None:
        """Mask these values, also as they appear JSON-escaped or percent-encoded, in every line."""
        forms = set(self.secrets)
        for secret in secrets:
            if secret and len(secret) >= MIN_REDACTED_LENGTH:
                forms |= {secret, orjson.dumps(secret).decode()[1:-1], quote(secret, safe=""), repr(secret)[1:-1]}
        self.secrets = tuple(sorted(forms, key=len, reverse=True))

    def format(self, record: logging.LogRecord) -> str:
        line = self._format(record)
        for secret in self.secrets:
            line = line.replace(secret, _MASK)
        return line

    def _format(self, record: logging.LogRecord) -> str:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        doc.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))


def redact(secrets: Iterable[str]) -> None:
    """Mask `secrets` in the lines of every `JsonFormatter` installed on the root logger."""
    secrets = list(secrets)
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.add_secrets(secrets)
