"""No product module imports test infrastructure: nothing under service/ or schemas/ imports
`tests`, and `stratameter run` (service/app, service/state and what they use) does not import
the local backend launcher (`stratameter.embedded`, for the demo, bench, soak and tests)."""

from __future__ import annotations

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
