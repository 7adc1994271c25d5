"""Property-based tests: no input ever produces a traceback, no accepted input misaligns.

Random files for the corpus readers, random YAML and `--set` strings for the config loader,
random command lines for the CLI: each is either accepted (and then right) or refused with
the toolkit's own error, one line, exit code 2.
"""

from __future__ import annotations

import io
import random
from contextlib import redirect_stderr, redirect_stdout

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wtnmt.cli import main as cli
from wtnmt.config import ConfigError, RunConfig, config_from_dict, load_config
from wtnmt.data.io import DataError, read_parallel, read_tsv, stream_lines

# characters that break naive readers: separators other than \n, \r, tabs, a BOM, NUL
TRICKY = st.sampled_from(["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\r", "\t", "\ufeff", "\x00"])
LINE = st.lists(
    st.one_of(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), TRICKY),
    max_size=12,
).map("".join)
FILES = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _expected(line: str, first: bool) -> str:
    """What a line reads as: a trailing \\r removed, a BOM dropped at the start of a file."""
    if first and line.startswith("\ufeff"):
        line = line[1:]
    return line[:-1] if line.endswith("\r") else line


@FILES
@given(pairs=st.lists(st.tuples(LINE, LINE), max_size=15))
def test_parallel_files_read_back_aligned_by_content(tmp_path, pairs):
    src, tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    src.write_bytes("".join(s + "\n" for s, _ in pairs).encode())
    tgt.write_bytes("".join(t + "\n" for _, t in pairs).encode())
    sides = [[i for i, pair in enumerate(pairs) if "\x00" in pair[side]] for side in (0, 1)]
    if sides[0] or sides[1]:  # no sentence holds a NUL byte: refused, naming the first line
        where, nul = (src, sides[0][0]) if sides[0] else (tgt, sides[1][0])
        with pytest.raises(DataError, match=f"{where}: line {nul + 1} holds a NUL byte"):
            read_parallel(src, tgt)
        return
    read = read_parallel(src, tgt)
    assert read == [(_expected(s, i == 0), _expected(t, i == 0)) for i, (s, t) in enumerate(pairs)]


@FILES
@given(data=st.binary(max_size=200), other=st.binary(max_size=200))
def test_any_bytes_are_read_or_refused_with_a_data_error(tmp_path, data, other):
    src, tgt = tmp_path / "b.src", tmp_path / "b.tgt"
    src.write_bytes(data)
    tgt.write_bytes(other)
    for read in (lambda: read_parallel(src, tgt), lambda: read_tsv(src)):
        try:
            result = read()
        except DataError as e:  # names the file, in one line
            assert (str(src) in str(e) or str(tgt) in str(e)) and "\n" not in str(e)
        else:
            assert all(len(pair) == 2 for pair in result)


@FILES
@given(lines=st.lists(LINE, max_size=20), chunk=st.integers(1, 7))
def test_streamed_lines_equal_the_file_in_order(tmp_path, lines, chunk):
    path = tmp_path / "c.txt"
    path.write_bytes("".join(line + "\n" for line in lines).encode())
    nul = next((i for i, line in enumerate(lines) if "\x00" in line), None)
    if nul is not None:  # no sentence holds a NUL byte: refused, naming its line
        with pytest.raises(DataError, match=f"line {nul + 1} holds a NUL byte"):
            list(stream_lines(path, chunk=chunk))
        return
    got, next_line = [], 1
    for first, part in stream_lines(path, chunk=chunk):
        assert first == next_line and 1 <= len(part) <= chunk
        got += part
        next_line += len(part)
    assert got == [_expected(line, i == 0) for i, line in enumerate(lines)]


# --------------------------------------------------------------------------------------------
# The config loader

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=5)
KEYS = {
    section: list(getattr(RunConfig(), section).__dataclass_fields__)
    for section in ("data", "model", "train", "decode")
}
SECTION_VALUES = st.sampled_from(sorted(KEYS)).flatmap(
    lambda section: st.tuples(
        st.just(section),
        st.dictionaries(
            st.one_of(st.sampled_from(KEYS[section]), st.text(max_size=6)), VALUES, max_size=4
        ),
    )
)


@settings(max_examples=300)
@given(sections=st.lists(SECTION_VALUES, max_size=3))
def test_random_config_values_are_accepted_or_refused_by_name(sections):
    values = {section: changes for section, changes in sections}
    try:
        config = config_from_dict(values)
    except ConfigError as e:
        assert "\n" not in str(e)
    else:
        assert isinstance(config, RunConfig)


@settings(max_examples=300)
@given(
    key=st.one_of(
        st.sampled_from([f"{s}.{k}" for s, keys in KEYS.items() for k in keys]),
        st.text(max_size=10),
    ),
    value=st.one_of(VALUES.map(lambda v: yaml.safe_dump(v).strip()), st.text(max_size=12)),
)
def test_random_set_strings_are_accepted_or_refused_by_name(key, value):
    try:
        load_config("weighted-tiny", [f"{key}={value}"])
    except ConfigError as e:
        assert "\n" not in str(e)


# --------------------------------------------------------------------------------------------
# The command line

OPTIONS = {
    "translate": ["-i", "-o", "--beam", "--nbest", "--chunk", "--device", "--threads"],
    "prepare": ["--corpus", "--tsv", "--src", "--tgt", "--vocab-size", "--set", "--out"],
    "serve": ["--port", "--beam", "--max-queue", "--max-sentences", "--timeout", "--device"],
    "train": ["--out", "--set"],
}
ARG = st.one_of(
    st.sampled_from(["0", "-1", "2", "x", "", "cuda", "nope.txt", "data.max_words=2.5", "1e9"]),
    st.text(alphabet="abc=.-01", max_size=6),
)


@pytest.fixture(scope="module")
def nothing_here(tmp_path_factory):
    """An empty folder; named corpora are looked for there only (no real data, no network)."""
    folder = tmp_path_factory.mktemp("cli")
    patch = pytest.MonkeyPatch()
    patch.setenv("WTNMT_DATA", str(folder))
    patch.setenv("XDG_CACHE_HOME", str(folder / "cache"))
    patch.setenv("WTNMT_MIRROR", (folder / "nowhere").as_uri())
    yield folder
    patch.undo()


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    command=st.sampled_from(sorted(OPTIONS)),
    data=st.data(),
)
def test_random_command_lines_never_end_in_a_traceback(nothing_here, command, data):
    options = data.draw(st.lists(st.sampled_from(OPTIONS[command]), max_size=3))
    argv = [command]
    if command != "prepare":  # a run or config that is not there: refused before any work
        argv.append(str(nothing_here / "missing"))
    for option in options:
        argv += [option, data.draw(ARG)]
    if command == "prepare" and "--out" not in options:
        argv += ["--out", str(nothing_here / f"out{random.random()}")]
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = cli(argv)
    except SystemExit as e:  # argparse: --help or a malformed option
        code = e.code
    assert code == 2, (argv, err.getvalue())
    lines = err.getvalue().strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("wtnmt"), (argv, err.getvalue())
