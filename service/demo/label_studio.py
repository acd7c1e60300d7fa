"""A throw-away Label Studio on this machine, for `stratameter demo --reviewers label-studio` and the tests
(beside the other local backends the tools start, `stratameter.embedded`).

Label Studio is installed in a virtualenv of its own (about 1 GB, Python >= 3.10; its pins clash
with stratameter's): `LABEL_STUDIO_REQUIREMENT` and `LABEL_STUDIO_PINS` into ``.venv-label-studio/`` (``make label-studio``;
CI's ``.ci/run`` does it).  `label_studio_binary` finds it: ``$STRATAMETER_LABEL_STUDIO_BIN``, else
``.venv-label-studio/bin/label-studio`` beside the checkout or in the current directory, else
``label-studio`` on PATH; `LabelStudioMissing` says how to install it.

`EmbeddedLabelStudio` runs it on 127.0.0.1 and a free port with SQLite in its own temp dir, a preset
user and legacy API token (`USER`, `PASSWORD`, `TOKEN`), webhooks to private addresses allowed (the
bridge listens on localhost) and no calls home.  A fresh database costs about 30-50 s of migrations:
the first start makes a migrated template (``label-studio init``) beside the binary's virtualenv
(``stratameter-data-template``; concurrent first starts wait for one to make it) and every start
copies it, so later starts take about 5 s.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from ..embedded.process import BackendError, ManagedProcess

LABEL_STUDIO_REQUIREMENT = "label-studio==1.23.2"
#: Installed with it: Label Studio 1.23.2 requires sentry-sdk without an upper bound and passes it
#: ``send_default_pii``, which sentry-sdk 3 refuses (``label-studio init`` fails at its settings).
LABEL_STUDIO_PINS = "sentry-sdk<3"
VENV = ".venv-label-studio"
BIN_VARIABLE = "STRATAMETER_LABEL_STUDIO_BIN"
USER = "reviewer@example.com"
PASSWORD = "stratameter"
TOKEN = "5f0e1c2d3b4a59687766554433221100aabbccdd"
TEMPLATE = "stratameter-data-template"
INSTALL_HINT = (f"install it in a virtualenv of its own: `python3 -m venv {VENV} && {VENV}/bin/pip install "
                f"'{LABEL_STUDIO_REQUIREMENT}' '{LABEL_STUDIO_PINS}'` (in a checkout: `make label-studio`), or set {BIN_VARIABLE} to "
                "its `label-studio` executable")


class LabelStudioMissing(BackendError):
    """No Label Studio installation was found; the message says how to install one."""


def label_studio_binary() -> str:
    """The `label-studio` executable to run (see the module's docstring); raises `LabelStudioMissing`."""
    given = os.environ.get(BIN_VARIABLE, "").strip()
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise LabelStudioMissing(f"{BIN_VARIABLE}={given!r} is not an executable file; {INSTALL_HINT}")
        return given
    checkout = Path(__file__).resolve().parents[2]  # service/demo/label_studio.py -> the checkout (editable install)
    for root in dict.fromkeys((checkout, Path.cwd())):
        candidate = root / VENV / "bin" / "label-studio"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("label-studio")
    if found:
        return found
    raise LabelStudioMissing(f"Label Studio is not installed (no {VENV}/bin/label-studio, none on PATH); "
                             f"{INSTALL_HINT}")


def _environment(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABEL_STUDIO_", "DJANGO_"))}
    env.update({
        "DJANGO_DB": "sqlite", "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
        "LABEL_STUDIO_USERNAME": USER, "LABEL_STUDIO_PASSWORD": PASSWORD, "LABEL_STUDIO_USER_TOKEN": TOKEN,
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
        # the bridge's webhook listens on 127.0.0.1: Label Studio's SSRF protection would refuse it
        "SSRF_PROTECTION_ENABLED": "false",
        "LATEST_VERSION_CHECK": "false", "COLLECT_ANALYTICS": "false",
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def data_template(binary: str, timeout: float = 300.0) -> Path | None:
    """A migrated data dir with the preset user (``label-studio init``) kept beside the binary's
    virtualenv, made on first use, once: concurrent first uses (the test workers, a demo) wait on a
    lock for the one that makes it, each ``init`` being some 35 s of a busy machine's CPU.  None
    when that place is not writable."""
    venv = Path(binary).resolve().parent.parent
    template = venv / TEMPLATE
    if (template / "label_studio.sqlite3").is_file():
        return template
    if not os.access(venv, os.W_OK):
        return None
    with open(venv / f".{TEMPLATE}.lock", "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (template / "label_studio.sqlite3").is_file():
            _make_template(binary, venv, template, timeout)
    return template


def _make_template(binary: str, venv: Path, template: Path, timeout: float) -> None:
    """``label-studio init`` into a temp dir beside `template`, renamed to it once it succeeded."""
    work = Path(tempfile.mkdtemp(prefix=".template-", dir=venv))
    try:
        data = work / "data"
        data.mkdir()
        with open(work / "init.log", "wb") as log:
            code = subprocess.run([binary, "init", "--no-browser", "--enable-legacy-api-token"],
                                  env=_environment(data), stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout, cwd=work).returncode
        if code != 0 or not (data / "label_studio.sqlite3").is_file():
            raise BackendError(f"`label-studio init` failed (exit {code}):\n"
                               f"{(work / 'init.log').read_text(errors='replace')[-3000:]}")
        data.rename(template)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class EmbeddedLabelStudio(ManagedProcess):
    """Label Studio on 127.0.0.1 with SQLite in its own temp dir (see the module's docstring).

    ``url``, ``token`` (`TOKEN`, a legacy API token), ``user`` / ``password`` for the browser;
    ``startup_seconds`` as measured by the last start.  A context manager, like the other
    embedded backends; the data dir goes with ``close()``."""

    name = "label-studio"
    startup_timeout = 240.0  # migrations without a template, on a busy machine

    def __init__(self, port: int | None = None, *, binary: str | None = None, template: bool = True) -> None:
        super().__init__(port, binary=binary or label_studio_binary())
        self.use_template = template
        self.data_dir = self.workdir / "data"
        self.user, self.password, self.token = USER, PASSWORD, TOKEN

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> "EmbeddedLabelStudio":
        if not self.is_running() and not self.data_dir.exists():
            template = data_template(self._binary) if self.use_template else None
            if template is not None:
                shutil.copytree(template, self.data_dir)
            else:
                self.data_dir.mkdir(parents=True)
        super().start()
        return self

    def _argv(self) -> list[str]:
        return [self._binary, "start", "--no-browser", "--internal-host", self.host, "--port", str(self.port),
                "--enable-legacy-api-token", "--log-level", "WARNING"]

    def _env(self) -> dict[str, str]:
        return _environment(self.data_dir)

    def _probe(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as r:  # noqa: S310 - our own localhost
            return r.status == 200


def bridge_env(service_env: dict[str, str], label_studio: EmbeddedLabelStudio, port: int, run_id: str) -> dict[str, str]:
    """The environment of `stratameter bridge label-studio` beside a service run with `service_env`
    (same Kafka, Redis and topics) against `label_studio`, its webhook on 127.0.0.1:`port`."""
    return {**service_env,
            "STRATAMETER_LABEL_STUDIO_URL": label_studio.url, "STRATAMETER_LABEL_STUDIO_TOKEN": label_studio.token,
            "STRATAMETER_LABEL_STUDIO_PROJECT": "stratameter demo",
            "STRATAMETER_LABEL_STUDIO_WEBHOOK_URL": f"http://127.0.0.1:{port}/webhook",
            "STRATAMETER_LABEL_STUDIO_POLL_SECONDS": "5",
            "STRATAMETER_BRIDGE_CONSUMER_GROUP": f"stratameter-demo-bridge-{run_id}",
            "STRATAMETER_BRIDGE_HTTP_HOST": "127.0.0.1", "STRATAMETER_BRIDGE_HTTP_PORT": str(port),
            "STRATAMETER_INSTANCE_ID": f"bridge-{run_id}"}
