"""docs/API.md is the Python API as the code documents it: made by
`python -m wtnmt.decode.api_reference`, current, and every public member of what `wtnmt`
exports has a docstring there."""

from __future__ import annotations

import inspect
from pathlib import Path

import wtnmt
from wtnmt.decode.api_reference import page, public_members

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_page_is_current():
    written = (ROOT / "docs" / "API.md").read_text(encoding="utf-8")
    assert written == page(), "run: python -m wtnmt.decode.api_reference --write docs/API.md"


def test_every_public_member_of_the_api_has_a_docstring():
    for name in wtnmt.__all__:
        if name == "__version__":
            continue
        exported = getattr(wtnmt, name)
        assert inspect.getdoc(exported), name
        missing = [m for m, member in public_members(exported) if not inspect.getdoc(member)]
        assert not missing, f"{name}: no docstring for {missing}"


def test_the_default_engine_is_said_where_a_user_meets_it():
    load = inspect.getdoc(wtnmt.Translator.load) or ""
    assert '``"pytorch"``' in load and "``auto``" in load
    assert "differs from the command line's" in page()
    assert 'engine="pytorch"' in (ROOT / "README.md").read_text(encoding="utf-8")
