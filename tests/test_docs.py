"""The documents' commands run as written: every `wtnmt ...` line of a shell block in the
README and docs/ parses with the real command line, every documented grid plans its runs
(`--dry-run`), every file, script or link a document names exists in the repository, and
every config key it names is one."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from wtnmt.cli import build_parser
from wtnmt.cli import main as cli
from wtnmt.config import config_to_dict, load_config

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def shell_lines(path: Path) -> list[str]:
    """The commands of a document's ```bash blocks, continuation lines joined, comments and
    here-documents dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
        text = re.sub(r"<<'(\w+)'\n.*?\n\1\n", "\n", block, flags=re.S)  # here-documents
        text = text.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def wtnmt_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCUMENTS:
        for line in shell_lines(path):
            for part in re.split(r"\s*(?:\||&&|;)\s*", line):
                if part.startswith("wtnmt "):
                    found.append((path.name, part))
    return found


COMMANDS = wtnmt_commands()


def test_the_documents_have_commands():
    assert len(COMMANDS) > 20
    assert {c.split()[1] for _, c in COMMANDS} >= {
        "prepare", "train", "translate", "evaluate", "average", "serve", "experiment", "analyze",
    }  # fmt: skip


@pytest.mark.parametrize(("document", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_every_documented_command_parses(document, command):
    words = shlex.split(command)[1:]
    try:
        build_parser().parse_args(words)
    except SystemExit as e:  # argparse's refusal: the document names an option that is gone
        raise AssertionError(f"{document}: `{command}` does not parse") from e


GRIDS = sorted(
    {c.removesuffix(" --dry-run") for _, c in COMMANDS if c.startswith("wtnmt experiment")}
)


@pytest.mark.parametrize("command", GRIDS, ids=lambda c: c)
def test_every_documented_grid_plans_its_runs(command, monkeypatch, capsys):
    """`wtnmt experiment FILE --dry-run`: the grid loads and every run directory it names is
    known (done, to train, to resume, to score); nothing is trained."""
    monkeypatch.chdir(ROOT)
    assert cli([*shlex.split(command)[1:], "--dry-run"]) == 0, capsys.readouterr().err


def test_files_the_documents_name_exist():
    missing = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        names = set(re.findall(r"\]\(([^)#\s]+)\)", text))  # Markdown links and images
        names |= set(
            re.findall(r"`((?:benchmarks|experiments|configs|src|tests|docs)/[^`\s]+)`", text)
        )
        for name in sorted(names):
            if re.match(r"^[a-z]+://", name):
                continue
            if "*" in name and (list(ROOT.glob(name)) or list(ROOT.glob(f"src/wtnmt/{name}"))):
                continue
            if not (path.parent / name).exists() and not (ROOT / name).exists():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


def test_every_committed_report_has_the_figures_it_shows():
    """A report `wtnmt analyze` wrote under experiments/ keeps the figures its summary.md
    shows beside it (the documents link these summaries)."""
    reports = sorted((ROOT / "experiments").rglob("summary.md"))
    assert len(reports) > 10
    missing = [
        f"{report.relative_to(ROOT)}: {name}"
        for report in reports
        for name in re.findall(r"!\[[^\]]*\]\(([^)#\s]+)\)", report.read_text(encoding="utf-8"))
        if not (report.parent / name).exists()
    ]
    assert not missing, "shown but not in the repository:\n" + "\n".join(missing)


def test_committed_experiments_stay_lean():
    """What experiments/ commits is small results: no file over 1 MB, no weights or
    checkpoints, no self-contained HTML (`wtnmt analyze` writes report.html again)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "experiments"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which files are committed is not known")
    files = [ROOT / name for name in listed.split("\0") if name]
    assert len(files) > 100
    sizes = {p.relative_to(ROOT): p.stat().st_size for p in files if p.is_file()}
    big = [f"{name}: {size:,} bytes" for name, size in sizes.items() if size > 1_000_000]
    heavy = [
        str(name)
        for name in sizes
        if name.suffix in {".safetensors", ".pt", ".bin", ".onnx"} or name.name == "report.html"
    ]
    assert not big, "over 1 MB:\n" + "\n".join(big)
    assert not heavy, "weights or HTML committed:\n" + "\n".join(heavy)
    # curves and decodings kept compressed (python -m wtnmt.stored): the whole within 25 MB
    total = sum(sizes.values())
    assert total <= 25_000_000, f"experiments/ commits {total / 1e6:.1f} MB (at most 25)"


def test_no_document_points_outside_the_repository():
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        assert "shared/bench/" not in text and "../shared" not in text, path.name
        for link in re.findall(r"\]\(([^)#\s]+)\)", text):
            if re.match(r"^[a-z]+://", link):
                continue
            target = (path.parent / link).resolve()
            assert target.is_relative_to(ROOT), f"{path.name}: {link} is outside"


def test_the_readme_stays_a_users_guide():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the details to docs/"


def test_every_config_key_the_documents_name_exists():
    """A key like `model.qkv_init_gain` in a document is a field of its section, so a renamed
    or removed key cannot live on in the docs (`model.safetensors` is the weights file)."""
    known = config_to_dict(load_config("transformer-tiny"))  # every key of every section
    named = 0
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for section, key in re.findall(r"`(data|model|train|decode)\.(\w+)(?![\w.])", text):
            if f"{section}.{key}" == "model.safetensors":
                continue
            assert key in known[section], f"{path.name}: `{section}.{key}` is not a config key"
            named += 1
    assert named > 20


def test_configuration_md_lists_every_key_as_the_dataclasses_have_it():
    """docs/CONFIGURATION.md's tables are what `python -m wtnmt.config.reference` makes of the
    config dataclasses, and every key has its meaning written beside its field."""
    from wtnmt.config.reference import missing_meanings, tables, written_tables

    assert missing_meanings() == []  # a key added without a comment saying what it does
    document = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    assert written_tables(document) == tables(), (
        "docs/CONFIGURATION.md is out of date: python -m wtnmt.config.reference --write "
        "docs/CONFIGURATION.md"
    )


def test_the_readme_averages_no_more_checkpoints_than_the_demo_keeps():
    from wtnmt.config import load_config

    kept = load_config("weighted-demo").train.keep_checkpoints
    averages = [c for _, c in COMMANDS if c.startswith("wtnmt average runs/demo")]
    asked = [
        int(shlex.split(c)[shlex.split(c).index("--last") + 1]) for c in averages if "--last" in c
    ]
    assert averages and all(n <= kept for n in asked), (asked, kept)  # no --last: the run's own


def test_experiments_readme_indexes_every_grid():
    """Each grid file has its row in experiments/README.md (which question, current or
    superseded), and every grid or folder the index names exists."""
    index = (ROOT / "experiments" / "README.md").read_text(encoding="utf-8")
    grids = {p.stem for p in (ROOT / "experiments").glob("*.yaml")}
    rows = set(re.findall(r"^\| `([^`]+)` \|", index, flags=re.MULTILINE))
    assert grids <= rows, f"not in experiments/README.md: {sorted(grids - rows)}"
    named = rows | set(re.findall(r"`([a-z0-9.-]+)/`", index))
    missing = [n for n in named if not (ROOT / "experiments" / f"{n}.yaml").is_file()
               and not (ROOT / "experiments" / n).is_dir()]  # fmt: skip
    assert not missing, missing


def test_results_tables_are_the_ones_the_committed_results_make(monkeypatch):
    """Every table of docs/RESULTS.md is what `python -m wtnmt.analysis.paper` makes from the
    committed results of the runs docs/results.yaml names; a changed number fails."""
    from wtnmt.analysis.paper import differences, main, make_tables

    monkeypatch.chdir(ROOT)
    assert main(["--check", "docs/RESULTS.md", "docs/RESULTS-RUNS.md", "README.md"]) == 0
    document = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    runs = (ROOT / "docs" / "RESULTS-RUNS.md").read_text(encoding="utf-8")
    tables = make_tables()
    # one test BLEU of Table 1 (its fifth column) moved by 0.01
    row = tables["main"].splitlines()[2]
    cells = row.split("|")
    mean = cells[5].split()[0]
    cells[5] = cells[5].replace(mean, f"{float(mean) + 0.01:.2f}", 1)
    assert row in document and "|".join(cells) != row
    changed = document.replace(row, "|".join(cells), 1)
    assert differences([changed, runs], tables) == [
        "main: differs from what the committed results give"
    ]
    assert differences([document], tables) == [
        "runs: no <!-- table:runs --> block",  # (both in RESULTS-RUNS.md)
        "secondary: no <!-- table:secondary --> block",
    ]
    assert len(document.splitlines()) <= 450, "RESULTS is to be read in fifteen minutes"
