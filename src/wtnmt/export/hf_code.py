"""The modelling code `wtnmt export hf` ships inside a folder for ``trust_remote_code=True``:
hf_modeling.py as ``modeling_wtnmt.py`` and every wtnmt module it needs, found by following
its imports, each written flat beside it (``wtnmt.model.branched`` → ``wtnmt_model_branched.py``)
with its imports of wtnmt made relative (``from .wtnmt_model_branched import …``), the form
`transformers`' dynamic-module loader copies and imports. The shipped code is the installed
wtnmt's own source, so an export's network is the one wtnmt trained."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ENTRY = "wtnmt.export.hf_modeling"
MODELING = "modeling_wtnmt"  # the entry's name in the folder (config.json's auto_map)


class BundleError(RuntimeError):
    """An import the bundler cannot make relative (a form it does not rewrite)."""


def _source(module: str) -> tuple[str, bool]:
    """The module's source text and whether it is a package's ``__init__``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise BundleError(f"{module}: not found")
    path = Path(spec.origin)
    return path.read_text(encoding="utf-8"), path.name == "__init__.py"


def flat(module: str) -> str:
    """A wtnmt module's name in the folder."""
    return MODELING if module == ENTRY else module.replace(".", "_")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # (a name inside a module that is not a package)
        return False


def _wtnmt_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name == "wtnmt" or a.name.startswith("wtnmt.") for a in node.names
        ):
            raise BundleError(f"line {node.lineno}: `import wtnmt…` is not rewritten")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "wtnmt" or node.module.startswith("wtnmt."):
                found.append(node)
    return found


def _targets(node: ast.ImportFrom) -> list[str]:
    """The wtnmt modules an import reads (``from wtnmt.model import cache`` reads a module)."""
    module = node.module or ""
    out = [module]
    for alias in node.names:
        if _is_module(f"{module}.{alias.name}"):
            out.append(f"{module}.{alias.name}")
    return out


def _rewritten(source: str, nodes: list[ast.ImportFrom]) -> str:
    lines = source.splitlines(keepends=True)
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        indent = lines[node.lineno - 1][: node.col_offset]
        module = node.module or ""
        parts = []
        names = []
        for alias in node.names:
            if _is_module(f"{module}.{alias.name}"):  # a submodule, imported by name
                parts.append(
                    f"{indent}from . import {flat(f'{module}.{alias.name}')} as "
                    f"{alias.asname or alias.name}\n"
                )
            else:
                names.append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
        if names:
            if module == "wtnmt":
                raise BundleError(f"line {node.lineno}: `from wtnmt import {names[0]}`")
            parts.insert(0, f"{indent}from .{flat(module)} import {', '.join(names)}\n")
        lines[node.lineno - 1 : node.end_lineno] = ["".join(parts)]
    return "".join(lines)


def bundle(out: Path) -> list[str]:
    """Write the entry and every wtnmt module it reaches into ``out``; their file names."""
    seen: dict[str, str] = {}
    queue = [ENTRY]
    while queue:
        module = queue.pop()
        if module in seen:
            continue
        source, _ = _source(module)
        try:
            nodes = _wtnmt_imports(ast.parse(source))
        except BundleError as e:
            raise BundleError(f"{module}: {e}") from None
        seen[module] = _rewritten(source, nodes)
        for node in nodes:
            queue += [m for m in _targets(node) if m not in seen]
            parent = (node.module or "").rsplit(".", 1)[0]
            while parent.startswith("wtnmt.") and parent not in seen:  # packages' __init__
                queue.append(parent)
                parent = parent.rsplit(".", 1)[0]
    # transformers copies a local folder's code into its module cache by the entry's relative
    # imports (`from .NAME import`; one level deep in transformers 4): every module, named
    every = sorted(flat(m) for m in seen if m not in (ENTRY, "wtnmt"))
    seen[ENTRY] += (
        "\n\n# every wtnmt module this code reaches, for transformers' loader to copy beside it\n"
        + "".join(f"from .{name} import __name__ as _  # noqa: E402, F401\n" for name in every)
    )
    names = []
    for module, text in sorted(seen.items()):
        if module == "wtnmt":
            continue  # (the package's own __init__: nothing of the model)
        name = flat(module) + ".py"
        (out / name).write_text(text, encoding="utf-8")
        names.append(name)
    return names


__all__ = ["ENTRY", "MODELING", "BundleError", "bundle", "flat"]
