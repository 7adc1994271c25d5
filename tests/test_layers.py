"""The package's import structure: no module imports one of a higher layer (the order written
in docs/ARCHITECTURE.md), and no modules import each other in a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "wtnmt"


def layers() -> list[list[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/ARCHITECTURE.md has no ```layers block"
    return [[m.strip() for m in line.split(",")] for line in block.group(1).splitlines() if line]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Every module of the package → the package's modules it imports, anywhere in it."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    found.add(whole if whole in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def layer_of(module: str, order: list[list[str]]) -> int | None:
    for i, line in enumerate(order):
        if any(module == m or module.startswith(m + ".") for m in line):
            return i
    return None


def test_every_module_has_a_layer():
    order = layers()
    missing = [m for m in imports() if m != "wtnmt" and layer_of(m, order) is None]
    assert not missing, f"modules in no layer of docs/ARCHITECTURE.md: {missing}"


def test_no_module_imports_from_a_higher_layer():
    order, wrong = layers(), []
    for module, deps in imports().items():
        if module == "wtnmt":  # the package's __init__: the lazy public API
            continue
        here = layer_of(module, order)
        for dep in deps:
            if dep == "wtnmt":  # the version
                continue
            there = layer_of(dep, order)
            same_package = dep.split(".")[:2] == module.split(".")[:2]
            if there is not None and here is not None and there >= here and not same_package:
                wrong.append(f"{module} imports {dep}")
    assert not wrong, "imports of the same or a higher layer:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    graph = imports()
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(" → ".join([*path[path.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
