"""`demo.label_studio.data_template`: the migrated Label Studio database the tests and the demo copy
is made once, also when several processes (the test workers) ask for it at the same moment; a fake
`label-studio` stands in (it records each ``init`` and takes a second over it)."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from stratameter.demo.label_studio import TEMPLATE, data_template
from stratameter.embedded.process import BackendError

FAKE = """#!/bin/sh
echo init >> "{calls}"
sleep 1
[ "{fail}" = yes ] && exit 3
touch "$LABEL_STUDIO_BASE_DATA_DIR/label_studio.sqlite3"
"""


def _fake_binary(tmp_path, fail: bool = False) -> str:
    binary = tmp_path / "venv" / "bin" / "label-studio"
    binary.parent.mkdir(parents=True)
    binary.write_text(FAKE.format(calls=tmp_path / "calls", fail="yes" if fail else "no"))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return str(binary)


def test_concurrent_first_uses_make_one_template(tmp_path):
    binary = _fake_binary(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: data_template(binary), range(4)))
    assert made == [tmp_path / "venv" / TEMPLATE] * 4
    assert (tmp_path / "calls").read_text().split() == ["init"]
    assert (made[0] / "label_studio.sqlite3").is_file()
    assert sorted(p.name for p in (tmp_path / "venv").iterdir()) == [f".{TEMPLATE}.lock", "bin", TEMPLATE]


def test_a_failed_init_says_so_and_leaves_nothing(tmp_path):
    binary = _fake_binary(tmp_path, fail=True)
    with pytest.raises(BackendError, match=r"`label-studio init` failed \(exit 3\)"):
        data_template(binary)
    assert not (tmp_path / "venv" / TEMPLATE).exists()
    assert [p.name for p in (tmp_path / "venv").iterdir() if p.name.startswith(".template-")] == []

