"""Why a process cannot start, said in one line without secrets: `StartupError`, raised by the
service's (`app.runner`, `app.probes`, `app.consumer`) and the Label Studio bridge's start-up checks
(`bridge.startup`) and turned into one log line and exit 1 by `app.lifecycle.run_until_stopped`;
`kafka_startup_error`, the one message of a Kafka client that could not start; and `describe`, an
exception as ``Type: message`` for those messages and the logs.

No I/O here (Kafka's and the settings' types are named for the annotations only), so any module
may import it.  A wrong setting is a `config.ConfigError` (exit 2), raised before any connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiokafka.errors import KafkaError

    from .config import Settings


class StartupError(RuntimeError):
    """The service cannot start (wrong credentials, unreachable Kafka); the message holds no secret."""


def describe(exc: BaseException) -> str:
    """``Type: message`` (redis-py's repr, e.g. ``auth:AuthenticationError``, omits the message)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def kafka_startup_reason(settings: Settings, exc: KafkaError) -> str:
    """Why a Kafka client could not start: where it connected, how (security protocol, SASL
    mechanism and user; never the password) and aiokafka's reason."""
    s = settings
    how = s.kafka_security_protocol + (f" with SASL {s.kafka_sasl_mechanism} as user {s.kafka_sasl_username!r}"
                                       if s.kafka_security_protocol.startswith("SASL_") else "")
    return (f"cannot connect to Kafka at {s.kafka_bootstrap_servers} ({how}): {describe(exc)}; "
            "the aiokafka log line above has the broker's answer")


def kafka_startup_error(settings: Settings, exc: KafkaError) -> StartupError:
    """The `StartupError` of a Kafka client that could not start (`kafka_startup_reason`)."""
    return StartupError(kafka_startup_reason(settings, exc))
