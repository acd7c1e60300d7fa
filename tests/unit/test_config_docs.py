"""The configuration page's table (docs/reference/configuration.md) and the Helm chart, held to the
settings as service/config declares them.

Each setting is declared once (service/config/settings.py); these tests fail when the page's
table or the chart (templates, values.yaml, its README) names a variable that does not exist,
leaves one out, or shows another default, choice list, ``*`` (per classifier) or ``_FILE`` variant.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from stratameter.config import FILE_SECRETS, OVERRIDABLE, Settings, env_var
from stratameter.config.checks import shown

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
CONFIG_PAGE = ROOT / "docs" / "reference" / "configuration.md"
CHART = ROOT / "helm" / "stratameter"
FIELDS = Settings.model_fields
P = "STRATAMETER_"

#: chart defaults that differ from the service's on purpose: in-cluster Service names, not localhost
CHART_DEFAULTS = {"kafka_bootstrap_servers": "kafka:9092", "redis_url": "redis://redis:6379/0"}
#: settings the chart does not render; set them through `extraEnv` (and `extraVolumes` for the files)
NOT_IN_CHART = {"chunk_retention", "history_chunks", "request_retention_seconds",
                "redis_ssl_cafile", "redis_ssl_certfile", "redis_ssl_keyfile"}


def _default_shown(name: str) -> str | None:
    """A field's default as the configuration table writes it (``-`` for none)."""
    field = FIELDS[name]
    if field.default_factory is not None:
        return "hostname-pid"
    d = field.default
    return None if d is None else d if isinstance(d, str) else shown(d)


def _expand(cell: str, sep_of_stem: str, known: Any = ()) -> list[str]:
    """``A_B / C`` -> ``[A_B, A_C]`` and ``x.y / .z`` -> ``[x.y, x.z]``: later parts complete the first's stem."""
    first, *rest = cell.split(" / ")
    stem = first.rsplit(sep_of_stem, 1)[0]
    out = [first]
    for part in rest:
        if part.lower() in known or (sep_of_stem == "." and not part.startswith(".")):
            out.append(part)
        else:
            out.append(stem + ("" if part.startswith(sep_of_stem) else sep_of_stem) + part)
    return out


def _config_table() -> dict[str, tuple[str | None, str]]:
    """``{field: (default as shown, description)}`` from the configuration page's table."""
    section = CONFIG_PAGE.read_text().split("# Configuration\n", 1)[1].split("\n#", 1)[0]
    rows: dict[str, tuple[str | None, str]] = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| `([A-Z_ /]+)` \| (.+?) \| (.*?) \|", line.strip())
        if m is None:
            continue
        names = [n.lower() for n in _expand(m.group(1), "_", FIELDS)]
        cell = m.group(2)
        defaults = [None] * len(names) if cell == "-" else _expand(cell.strip("`"), ".")
        assert len(defaults) == len(names), line
        for name, default in zip(names, defaults):
            assert name in FIELDS and name not in rows, f"the configuration page lists {env_var(name)}: unknown or twice"
            rows[name] = (default, m.group(3))
    return rows


def test_config_table_lists_every_setting_once():
    rows = _config_table()
    assert sorted(rows) == sorted(FIELDS), "the configuration table and service/config disagree on the variables"


def test_config_table_defaults_are_the_declared_ones():
    rows = _config_table()
    wrong = {env_var(n): (row[0], _default_shown(n)) for n, row in rows.items() if row[0] != _default_shown(n)}
    assert not wrong, f"configuration table default vs declared: {wrong}"
    instance_id = FIELDS["instance_id"].default_factory()  # type: ignore[call-arg,misc]
    assert instance_id.endswith(f"-{os.getpid()}")


def test_config_table_marks_follow_the_declarations():
    rows = _config_table()
    starred = {n for n, (_, desc) in rows.items() if desc.rstrip().endswith("*")}
    assert starred == set(OVERRIDABLE), "the table's * (overridable per classifier) vs the fields marked OVERRIDE"
    from_file = {n for n, (_, desc) in rows.items() if "`_FILE`" in desc}
    assert from_file == set(FILE_SECRETS), "the table's `_FILE` variants vs the fields marked FROM_FILE"
    for name, field in FIELDS.items():
        if "SecretStr" in str(field.annotation):
            assert "secret" in rows.get(name, ("", ""))[1], f"the configuration table does not say {env_var(name)} is a secret"


def test_config_table_lists_every_choice():
    rows = _config_table()
    for name, field in FIELDS.items():
        for meta in field.metadata:
            options = getattr(getattr(meta, "func", None), "options", None)
            if options is not None:
                assert ", ".join(options) in rows.get(name, ("", ""))[1], f"the configuration table's {env_var(name)} row lacks {options}"


# --------------------------------------------------------------------------- Helm chart


def _chart_texts() -> dict[str, str]:
    files = [*sorted((CHART / "templates").iterdir()), CHART / "values.yaml", CHART / "README.md"]
    return {p.name: p.read_text() for p in files if p.is_file()}


def _field_of(var: str) -> str | None:
    name = var.removeprefix(P).lower()
    if name in FIELDS:
        return name
    if name.endswith("_file") and name.removesuffix("_file") in FILE_SECRETS:
        return name.removesuffix("_file")
    return None


def _values_at(values: dict, path: str) -> Any:
    for key in path.split("."):
        values = values[key]
    return values


def test_chart_names_only_declared_variables():
    unknown = {f"{var} ({where})" for where, text in _chart_texts().items()
               for var in re.findall(r"STRATAMETER_[A-Z][A-Z_]*[A-Z]", text) if _field_of(var) is None}
    assert not unknown, f"the chart names variables service/config does not declare: {sorted(unknown)}"


def test_chart_sets_every_setting_or_says_why_not():
    templates = "".join(t for n, t in _chart_texts().items() if n not in ("values.yaml", "README.md"))
    rendered = {_field_of(v) for v in re.findall(r"STRATAMETER_[A-Z][A-Z_]*[A-Z]", templates)}
    assert set(FIELDS) - rendered == NOT_IN_CHART


def test_chart_defaults_are_the_declared_ones():
    """Each ConfigMap entry's value in values.yaml (and in the chart's README) is the service's default."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    configmap = (CHART / "templates" / "configmap.yaml").read_text()
    checked = set()
    for var, expr in re.findall(r"^\s*(STRATAMETER_\w+): (.+)$", configmap, re.M):
        name = _field_of(var)
        assert name is not None, var
        path = re.match(r"\{\{ \.Values\.([\w.]+)", expr)
        if path is None:  # a literal, a path inside the container, or a value set in a `with` block
            if "{{" not in expr and name != "classifiers_config_file":
                assert yaml.safe_load(expr) == FIELDS[name].default, var
            continue
        chart_default = _values_at(values, path.group(1))
        service_default = CHART_DEFAULTS.get(name, FIELDS[name].default)
        assert (chart_default if chart_default != "" else None) == service_default, f"{var}: values.yaml {path.group(1)}"
        row = re.search(rf"^\| `{re.escape(path.group(1))}` \| `(.*?)` \|", readme, re.M)
        assert row is not None and yaml.safe_load(row.group(1)) == chart_default, f"chart README {path.group(1)}"
        checked.add(name)
    assert len(checked) >= 25


def test_chart_overrides_keys_are_the_overridable_settings():
    readme = (CHART / "README.md").read_text()
    m = re.search(r"^\| `classifiers` \|.*Keys: ([a-z_, ]+)\.", readme, re.M)
    assert m is not None and set(m.group(1).split(", ")) == set(OVERRIDABLE)
    values = (CHART / "values.yaml").read_text()
    m = re.search(r"Keys: ([a-z_,\s#]+)\.", values)
    assert m is not None and set(re.split(r"[,\s#]+", m.group(1).strip())) == set(OVERRIDABLE)
