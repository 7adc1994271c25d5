"""Every key of a run config, with its type, default and meaning, read from the config
dataclasses themselves: docs/CONFIGURATION.md's tables are this module's output, and a test
fails when they differ or when a key has no meaning written beside it.

A key's meaning is the comment on its line in the dataclass, after the comment block directly
above it, if any (a group's heading is not taken: a blank line or another field between).

    python -m wtnmt.config.reference            # the tables, to stdout
    python -m wtnmt.config.reference --write docs/CONFIGURATION.md
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

from wtnmt.config.model import ModelConfig
from wtnmt.config.sections import DataConfig, DecodeConfig, DisagreementConfig, TrainConfig

SECTIONS: tuple[tuple[str, type], ...] = (
    ("data", DataConfig),
    ("model", ModelConfig),
    ("train", TrainConfig),
    ("train.disagreement", DisagreementConfig),
    ("decode", DecodeConfig),
)
BEGIN = (
    "<!-- the keys: made by `python -m wtnmt.config.reference --write`; edit the dataclasses -->"
)
END = "<!-- end of the keys -->"
# keys a config holds that a person does not set (written by `wtnmt prune`)
NOT_SET = {"model.kept_branches"}


def field_comments(cls: type) -> dict[str, str]:
    """Each field's meaning: its own comment, after the comment block directly above it."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    names = {f.name for f in dataclasses.fields(cls)}
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        head = line.strip().split(":", 1)[0]
        if head not in names or not line.startswith("    ") or line.startswith("     "):
            continue
        above: list[str] = []
        row = number - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments.get(row, ""))
            row -= 1
        text = " ".join([*above, comments.get(number, "")]).strip()
        found[head] = text
    return found


def _type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [_type(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| null" if type(None) in args else "")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type(args[0])}"
        return "[" + ", ".join(_type(a) for a in args) + "]"
    if dataclasses.is_dataclass(annotation):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(_default(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}".replace(",", "_") if value >= 10_000 else str(value)
    return str(value)


def rows(section: str, cls: type) -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of each field of ``cls``; a nested section is its own."""
    hints = typing.get_type_hints(cls)
    meanings = field_comments(cls)
    out = []
    instance = cls() if section != "model" else ModelConfig()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            continue  # listed as its own section
        key = f"{section}.{f.name}"
        if key in NOT_SET:
            continue
        default = _default(getattr(instance, f.name))
        out.append((key, _type(hints[f.name]), default, meanings.get(f.name, "")))
    return out


def missing_meanings() -> list[str]:
    return [
        key for section, cls in SECTIONS for key, _, _, meaning in rows(section, cls) if not meaning
    ]


def tables() -> str:
    parts = [BEGIN]
    for section, cls in SECTIONS:
        doc = (inspect.getdoc(cls) or "").splitlines()[0]
        parts += ["", f"### `{section}`", "", doc, "", "| key | type | default | meaning |"]
        parts.append("|---|---|---|---|")
        for key, kind, default, meaning in rows(section, cls):
            cell = meaning.replace("|", "\\|")
            parts.append(f"| `{key}` | {kind} | `{default}` | {cell} |")
    parts += ["", END]
    return "\n".join(parts) + "\n"


def written_tables(document: str) -> str | None:
    """The tables part of a document (its markers included), or None where it has none."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        return None
    return document[start : end + len(END)] + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        document = path.read_text(encoding="utf-8")
        old = written_tables(document)
        if old is None:
            print(f"{path}: has no {BEGIN!r} … {END!r} part to replace", file=sys.stderr)
            return 2
        path.write_text(document.replace(old, tables()), encoding="utf-8")
        return 0
    if argv:
        print("usage: python -m wtnmt.config.reference [--write FILE]", file=sys.stderr)
        return 2
    sys.stdout.write(tables())
    return 0


if __name__ == "__main__":
    sys.exit(main())
