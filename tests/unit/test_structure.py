"""The product's structure, held so it does not grow back (as `test_product_imports` holds its imports):

* module size: no product module (service/**, schemas/**) over `MAX_MODULE_LINES` lines (issue 48 left
  none over, so there is no list of exceptions to shrink);
* function size: no function or method over `MAX_FUNCTION_LINES` lines (``def`` to the end of its
  body) unless its docstring gives the reason in a sentence starting "Long because";
* layering: `service/stats/` imports no other stratameter package and no I/O library; every import of
  one stratameter package by another is an edge of `ALLOWED` (the structure of today, every edge
  used), which only goes down `LAYERS`; no cycle between packages;
* duplicate code: pylint's duplicate-code (R0801) over service/ and schemas/, at most
  `MAX_DUPLICATE_PAIRS` pairs of at least `MIN_SIMILARITY_LINES` similar lines.

Pure `ast` and `pathlib` (pylint for the last check, in-process); no broker, no Redis.
"""

from __future__ import annotations

import ast
import functools
import io
import re
from collections.abc import Iterator
from pathlib import Path


from tests.product_modules import ROOT, imports, product_modules, relative

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MIN_SIMILARITY_LINES = 6
MAX_DUPLICATE_PAIRS = 5

#: A docstring sentence that gives a long function's reason.
LONG_BECAUSE = re.compile(r"(?:^|[.!?:;]\s+|\n\s*)Long because\b")

#: The product's packages, bottom first: a package may import only packages of lower layers.
#: `stats` and `schemas` (the pure statistics and the wire format) are the bottom, the data path
#: (docs/development/architecture.md) runs up from Redis (`state`) through ingest, labels and the request loop to
#: the views and the gauges, `app` wires the service, and the tools (`stratameter simulate`,
#: `bench`, `soak`, `demo`, `cli`) sit on top.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"stats", "schemas"}),
    frozenset({"state"}),
    frozenset({"chunks"}),
    frozenset({"ingest", "labels", "config"}),
    frozenset({"errors"}),
    frozenset({"requests", "api"}),
    frozenset({"metrics"}),
    frozenset({"app"}),
    frozenset({"bridge", "embedded"}),
    frozenset({"simulate", "bench", "soak", "demo", "cli", "stratameter"}),
)

#: Which stratameter packages each package imports (anywhere in its modules: lazily, for type
#: checking): exactly today's edges.  A new edge fails the test; a new edge down the layers is
#: added here with the change that makes it, an edge up the layers is a design change.
ALLOWED: dict[str, frozenset[str]] = {
    "stats": frozenset(),
    "schemas": frozenset(),
    "state": frozenset({"stats"}),
    "chunks": frozenset({"state", "stats"}),  # state: the `ChunkState` record a side holds
    "ingest": frozenset({"state", "stats"}),
    "labels": frozenset({"schemas", "state", "stats"}),
    "config": frozenset({"chunks", "schemas", "state", "stats"}),
    "errors": frozenset({"config"}),  # for annotations only
    "requests": frozenset({"chunks", "labels", "schemas", "state", "stats"}),
    "api": frozenset({"chunks", "labels", "schemas", "state", "stats"}),
    "metrics": frozenset({"api", "chunks", "schemas"}),
    "app": frozenset({"api", "config", "errors", "ingest", "labels", "metrics", "requests", "schemas", "state"}),
    "bridge": frozenset({"api", "app", "config", "errors", "metrics", "schemas", "state"}),
    "embedded": frozenset({"app", "schemas"}),
    "simulate": frozenset({"chunks", "ingest", "stats"}),
    "bench": frozenset({"api", "app", "config", "embedded", "ingest", "requests", "schemas", "state", "stats"}),
    "soak": frozenset({"api", "config", "embedded", "schemas", "state", "stats"}),
    "demo": frozenset({"api", "config", "embedded", "schemas", "stats"}),
    "cli": frozenset(),  # its subcommands are imported by name (`importlib`)
    "stratameter": frozenset(),  # the root package: empty
}

#: Top-level modules `service/stats/` must not import: it is pure numpy/scipy, run alike by the
#: service and by `stratameter simulate`.
IO_LIBRARIES = frozenset({"redis", "aiokafka", "prometheus_client", "httpx", "asyncio", "socket", "subprocess",
                          "urllib", "http", "selectors", "ssl"})


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _package(path: Path) -> str:
    """The product package a module belongs to: ``schemas``, the folder under service/, ``cli``
    (service/cli.py) or ``stratameter`` (service/__init__.py, the root package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] == "schemas":
        return "schemas"
    return "stratameter" if parts[1] == "__init__" else parts[1]


def _imported_package(module: str) -> str | None:
    """The product package an imported module name belongs to (None: not stratameter's)."""
    parts = module.split(".")
    if parts[0] != "stratameter" or len(parts) < 2:
        return None
    return parts[1]


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name (``Class.method``, ``outer.<locals>.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


@functools.cache
def _long_functions() -> dict[str, tuple[int, bool]]:
    """"path:qualname" -> (lines, has a "Long because" reason) of every function over the bar."""
    out = {}
    for path in product_modules():
        for name, node in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                reason = bool(LONG_BECAUSE.search(ast.get_docstring(node) or ""))
                out[f"{relative(path)}:{name}"] = (length, reason)
    return out


@functools.cache
def _package_imports() -> dict[tuple[str, str], list[str]]:
    """(package, imported package) -> ["module imports name", ...] for every import across packages."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in product_modules():
        source = _package(path)
        for module in sorted(imports(path)):
            target = _imported_package(module)
            if target is not None and target != source:
                edges.setdefault((source, target), []).append(f"{relative(path)} imports {module}")
    return edges


# ----------------------------------------------------------------------------- module size


def test_no_module_over_400_lines():
    sizes = {relative(p): _lines(p) for p in product_modules()}
    over = {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"over {MAX_MODULE_LINES} lines (split it by responsibility): {over}"


# ----------------------------------------------------------------------------- function size


def test_no_long_function_without_its_reason():
    unexplained = {name: lines for name, (lines, reason) in _long_functions().items() if not reason}
    assert not unexplained, (f"functions over {MAX_FUNCTION_LINES} lines (shorten them, or give the reason in "
                             f"their docstring in a sentence starting 'Long because'): {unexplained}")


def test_the_reason_sentence_is_recognised():
    assert LONG_BECAUSE.search("One run.\n\nLong because a step reads forty arrays.")
    assert LONG_BECAUSE.search("Long because it is.")
    assert LONG_BECAUSE.search("It runs.  Long because it is.")
    assert not LONG_BECAUSE.search("Not long because it is short.")


# ----------------------------------------------------------------------------- layering


def test_stats_imports_no_other_package_and_no_io():
    bad = []
    for path in product_modules():
        if _package(path) != "stats":
            continue
        for module in sorted(imports(path)):
            target = _imported_package(module)
            if (target is not None and target != "stats") or module.split(".")[0] in IO_LIBRARIES:
                bad.append(f"{relative(path)} imports {module}")
    assert not bad, "service/stats/ is pure numpy/scipy, without I/O or the service's packages: " + "; ".join(bad)


def test_every_package_has_a_layer_and_an_entry():
    packages = {_package(p) for p in product_modules()}
    layered = set().union(*LAYERS)
    assert packages == layered == set(ALLOWED), (packages ^ layered, packages ^ set(ALLOWED))
    assert sum(len(layer) for layer in LAYERS) == len(layered)  # each package in one layer


def test_the_allowed_edges_go_down_the_layers():
    layer = {package: i for i, members in enumerate(LAYERS) for package in members}
    up = sorted(f"{a} -> {b}" for a, targets in ALLOWED.items() for b in targets if layer[b] >= layer[a])
    assert not up, f"ALLOWED has edges that do not go down LAYERS: {up}"


def test_no_import_outside_the_allowed_edges():
    layer = {package: i for i, members in enumerate(LAYERS) for package in members}
    bad = []
    for (a, b), lines in sorted(_package_imports().items()):
        if b in ALLOWED.get(a, ()):
            continue
        why = (f"{a} -> {b} goes up the layers (a design change)" if layer.get(b, 0) >= layer.get(a, 0) else
               f"{a} -> {b} is a new edge down the layers (add it to ALLOWED with the change that needs it)")
        bad.append(f"{why}: " + "; ".join(lines))
    assert not bad, "imports the layering does not allow:\n" + "\n".join(bad)


def test_every_allowed_edge_is_used():
    used = set(_package_imports())
    unused = sorted(f"{a} -> {b}" for a, targets in ALLOWED.items() for b in targets if (a, b) not in used)
    assert not unused, f"ALLOWED lists edges no module uses any more (remove them): {unused}"


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for a, b in _package_imports():
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles between packages: {[' -> '.join(c) for c in cycles]}"


# ----------------------------------------------------------------------------- duplicate code


def duplicate_pairs() -> list[str]:
    """pylint's duplicate-code (R0801) over the product: its `Symilar` with the options of
    ``pylint --disable=all --enable=duplicate-code --min-similarity-lines=6`` (imports, docstrings,
    comments and signatures ignored: pylint's defaults), one line per pair of similar blocks.

    The modules are parsed by astroid without its inference transforms: the checker reads only
    where the imports and signatures are, and the transforms (which import numpy, scipy, ...) are
    what makes a `pylint` run over the product take some 12 CPU seconds; this takes about 4."""
    import astroid
    from astroid.builder import AstroidBuilder
    from pylint.checkers.symilar import Symilar

    builder = AstroidBuilder(astroid.MANAGER, apply_transforms=False)
    sim = Symilar(min_lines=MIN_SIMILARITY_LINES, ignore_comments=True, ignore_docstrings=True,
                  ignore_imports=True, ignore_signatures=True)
    for path in product_modules():
        text = path.read_text(encoding="utf-8")
        sim.append_stream(relative(path), io.StringIO(text), tree=builder.string_build(text, path=str(path)))
    out = []
    for lines, couples in sim._compute_sims():  # what pylint's own checker reports from (`close`)
        where = ", ".join(f"{lineset.name}:[{start}:{end}]" for lineset, start, end in sorted(couples))
        out.append(f"{lines} similar lines: {where}")
    return out


def test_duplicate_code_stays_within_the_bar():
    pairs = duplicate_pairs()
    assert len(pairs) <= MAX_DUPLICATE_PAIRS, (f"{len(pairs)} pairs of {MIN_SIMILARITY_LINES}+ similar lines "
                                               f"(at most {MAX_DUPLICATE_PAIRS}; share the code):\n" + "\n".join(pairs))


def test_the_duplicate_check_finds_a_copy(tmp_path, monkeypatch):
    """The check is live: a copied function is one pair."""
    import tests.unit.test_structure as me

    body = "".join(f"    x{i} = {i} * value + {i}\n" for i in range(8))
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(f"def f(value):\n{body}    return x0\n", encoding="utf-8")
    monkeypatch.setattr(me, "product_modules", lambda: sorted(tmp_path.glob("*.py")))
    monkeypatch.setattr(me, "relative", lambda p: p.name)
    pairs = me.duplicate_pairs()
    assert len(pairs) == 1 and "a.py" in pairs[0] and "b.py" in pairs[0], pairs
