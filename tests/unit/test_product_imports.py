"""No product module imports test infrastructure: nothing under service/ or schemas/ imports
`tests`, and `stratameter run` (service/app, service/state and what they use) does not import
the local backend launcher (`stratameter.embedded`, for the demo, bench, soak and tests); the
start-up errors' module (`stratameter.errors`) loads no client."""

from __future__ import annotations

import subprocess
import sys

from tests.product_modules import ROOT, imports, product_modules

#: Product modules that may start the bundled broker and Redis (`stratameter.embedded`).
LAUNCHER_USERS = ("service/demo/", "service/bench/", "service/soak/", "service/embedded/")


def test_no_product_module_imports_tests():
    bad = {str(p.relative_to(ROOT)): sorted(m for m in imports(p) if m == "tests" or m.startswith("tests."))
           for p in product_modules()}
    assert not {p: m for p, m in bad.items() if m}


def test_only_the_tools_import_the_local_backend_launcher():
    users = {str(p.relative_to(ROOT)) for p in product_modules()
             if any(m == "stratameter.embedded" or m.startswith("stratameter.embedded.") for m in imports(p))}
    assert users and all(u.startswith(LAUNCHER_USERS) for u in users), users


def test_tls_test_peers_live_under_tests():
    assert not (ROOT / "service" / "embedded_tls.py").exists()
    assert (ROOT / "tests" / "embedded_tls.py").exists()


def test_the_errors_module_imports_no_client():
    """`stratameter.errors` (`StartupError` and its messages) is importable anywhere: imported alone,
    it loads no Kafka, Redis, HTTP or settings module (their types are named for annotations only)."""
    code = ("import sys, stratameter.errors; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('aiokafka', 'redis', 'httpx', 'pydantic', 'stratameter')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "['stratameter', 'stratameter.errors']"
