"""The import rules of docs/architecture.md, read from the source with ``ast`` (nothing is
imported): serving and the control plane meet only through exporters; the simulator is the
one part of serving that imports the control plane, and only its pure core; that core
imports no web framework, database or network client; and no module imports itself through
others (no import circle, not even one that only type checking or a function-level import
closes)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The control plane's pure core: what the simulator may import.
PURE_CORE = (
    "controlplane.policies",
    "controlplane.goodput.engine",
    "controlplane.goodput.spec",
    "controlplane.goodput.stats",
)
#: The folders the pure core lives in (the engine's private modules included).
PURE_FOLDERS = ("controlplane/policies", "controlplane/goodput")
#: What the pure core never imports: web frameworks, databases, network clients.
IMPURE = (
    "alembic",
    "fastapi",
    "httpx",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "socket",
    "sqlalchemy",
    "starlette",
    "subprocess",
    "urllib",
    "uvicorn",
)


@dataclass(frozen=True, slots=True)
class Import:
    path: str  # the importing file, relative to the repository
    line: int
    module: str  # absolute dotted name (``from a import b``: ``a.b``)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(folder: str) -> Iterator[Import]:
    for path in sorted((ROOT / folder).rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        relative = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(relative, node.lineno, alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:  # a name, or a submodule, of ``base``
                    yield Import(relative, node.lineno, f"{base}.{alias.name}")


def _graph(folders: tuple[str, ...]) -> dict[str, set[str]]:
    """Module → the modules of ``folders`` it imports (a name imported from a package counts
    as its submodule when there is one)."""
    modules: dict[str, Path] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            modules[_module_name(path)] = path

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for folder in folders:
        for found in _imports(folder):
            module = _module_name(ROOT / found.path)
            target = owner(found.module)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _broken(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    return [
        f"{i.path}:{i.line} imports {i.module}"
        for i in _imports(folder)
        if _within(i.module, forbidden) and not _within(i.module, allowed)
    ]


def test_exporters_import_neither_serving_nor_the_control_plane() -> None:
    assert _broken("exporters", ("controlplane", "serving", "goodput", "dashboards")) == []


def test_the_control_plane_never_imports_serving() -> None:
    assert _broken("controlplane", ("serving", "goodput")) == []


def test_serving_imports_the_control_plane_only_from_the_simulator() -> None:
    outside_sim = [
        f"{i.path}:{i.line} imports {i.module}"
        for i in _imports("serving")
        if _within(i.module, ("controlplane", "goodput", "dashboards"))
        and not i.path.startswith("serving/sim/")
    ]
    assert outside_sim == []


def test_the_simulator_imports_only_the_pure_core() -> None:
    assert _broken("serving/sim", ("controlplane",), allowed=PURE_CORE) == []


@pytest.mark.parametrize("folder", PURE_FOLDERS)
def test_the_pure_core_has_no_web_database_or_network_import(folder: str) -> None:
    assert _broken(folder, IMPURE) == []


@pytest.mark.parametrize("folder", PURE_FOLDERS)
def test_the_pure_core_imports_no_other_part_of_the_control_plane(folder: str) -> None:
    assert _broken(folder, ("controlplane",), allowed=("controlplane.goodput", *PURE_CORE)) == []


def test_no_import_circle() -> None:
    packages = ("exporters", "controlplane", "serving", "goodput", "dashboards")
    assert _cycles(_graph(packages)) == []


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_rules_see_nested_imports() -> None:
    """The reader resolves what the rules are checked against."""
    found = {i.module for i in _imports("serving/sim/cluster")}
    assert "controlplane.goodput.engine.GoodputEngine" in found
    assert "serving.sim.cluster.policy.ClusterSnapshot" in found
