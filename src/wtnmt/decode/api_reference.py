"""The Python API in one place: docs/API.md is this module's output, read from the docstrings
and signatures of what ``wtnmt`` exports (``wtnmt.Translator``), so that the page and the code
cannot drift; a test fails where they differ or where a public member has no docstring.

    python -m wtnmt.decode.api_reference              # the page, to stdout
    python -m wtnmt.decode.api_reference --write docs/API.md
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

from wtnmt.decode.sampling import Sampling
from wtnmt.decode.translator import Translator

HEADER = """# The Python API

`from wtnmt import Translator, Sampling` is the API: a trained run (a directory `wtnmt train` wrote)
loaded for decoding. Made from the code's own docstrings by
`python -m wtnmt.decode.api_reference --write docs/API.md` (a test checks it is current).

```python
from wtnmt import Sampling, Translator
t = Translator.load("runs/demo")                   # engine="pytorch" unless asked
t.translate(["How are you?"], beam=4)               # ['Wie geht es dir?']
t.score(["How are you?"], ["Wie geht es dir?"])     # log-probabilities
t.translate(["How are you?"], prefixes=["Wie"])     # each translation begins with its prefix
t.translate_nbest(["How are you?"], sampling=Sampling(samples=3, top_k=10, seed=1))  # drawn
```

**The default engine differs from the command line's.** `wtnmt translate` and `wtnmt serve`
decode with `--engine auto` (the native engine where it can run); `Translator.load` decodes
with `engine="pytorch"` unless asked, so that a program's results do not depend on whether a
compiler or the package's compiled engine is there. Pass `engine="auto"` for the command
line's choice; the two give the same translations (tests/test_native_engine.py).
"""


def public_members(cls: type) -> list[tuple[str, object]]:
    """The members of ``cls`` a user calls: not underscored, in source order."""
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if callable(value) or isinstance(value, property):
            members.append((name, value))
    return members


def _signature(name: str, member: object) -> str:
    if isinstance(member, property):
        return f"{name}  (property)"
    text = str(inspect.signature(member))  # type: ignore[arg-type]
    text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)  # a default's name
    text = re.sub(r"(: |-> )'([^']*)'", r"\1\2", text)  # annotations as written
    text = re.sub(r'(: |-> )"([^"]*)"', r"\1\2", text)
    return f"{name}{text.replace('(self, ', '(').replace('(self)', '()').replace('(cls, ', '(')}"


def page() -> str:
    out = [HEADER, f"## `{Translator.__name__}`\n", inspect.getdoc(Translator) or "", ""]
    for name, member in public_members(Translator):
        doc = inspect.getdoc(member)
        out += [f"### `{_signature(name, member)}`\n", doc or "", ""]
    out += [f"## `{_signature(Sampling.__name__, Sampling)}`\n", inspect.getdoc(Sampling) or ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wtnmt.decode.api_reference")
    parser.add_argument("--write", metavar="FILE", help="write the page to FILE")
    args = parser.parse_args(argv)
    if args.write:
        Path(args.write).write_text(page(), encoding="utf-8")
    else:
        sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
