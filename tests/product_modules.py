"""The product's modules as files and what each imports, read with `ast` (nothing is imported):
shared by the tests that hold the product's imports and structure (`tests/unit/test_product_imports.py`,
`tests/unit/test_structure.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The folders of the product (pyproject.toml `package-dir`: service/ is `stratameter`, schemas/ `stratameter.schemas`).
PRODUCT_FOLDERS = ("service", "schemas")


def product_modules() -> list[Path]:
    """Every product module (service/**/*.py, schemas/**/*.py), sorted."""
    return sorted(p for d in PRODUCT_FOLDERS for p in (ROOT / d).rglob("*.py"))


def relative(path: Path) -> str:
    """`path` relative to the repository, with forward slashes (``service/stats/estimator.py``)."""
    return path.relative_to(ROOT).as_posix()


def imports(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved), wherever the
    import statement is (module level, inside a function, under ``if TYPE_CHECKING``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts[:-1]
    # the folders install under one import name: service/ is `stratameter`, schemas/ `stratameter.schemas`
    package = ".".join(("stratameter",) + parts[1:] if parts[0] == "service" else ("stratameter",) + parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out
