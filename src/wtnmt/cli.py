"""The `wtnmt` command line: the parser and the error handling around every command (the
commands themselves are in ``wtnmt.commands``)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from wtnmt import interrupt
from wtnmt.cli_args import (
    add_engine,
    add_quantize,
    at_least_one,
    positive_number,
)
from wtnmt.commands import (
    cmd_demo,
    cmd_prepare,
    cmd_presets,
    cmd_serve,
    cmd_train,
)
from wtnmt.commands.decoding_args import add_evaluate, add_translate
from wtnmt.commands.runs_args import (
    add_analyze,
    add_average,
    add_experiment,
    add_export,
    add_import,
    add_unpack,
)
from wtnmt.guard import run_guarded
from wtnmt.prune.arguments import add_prune


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (the usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_prepare(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "prepare",
        help="raw parallel text → vocabulary and token arrays",
        description="Read a named corpus or your own parallel files, clean them (every "
        "filter counted), train the sentencepiece vocabulary (one shared by both languages, "
        "or one a language with --no-joint-vocab) and write token arrays.",
    )
    p.add_argument("config", nargs="?", help="a run config or preset name (its data section)")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--corpus", help="a named corpus: tatoeba-deu-eng, multi30k, wmt14-en-de, wmt14-en-fr"
    )
    source.add_argument("--tsv", help="one TSV file of source<TAB>target lines")
    p.add_argument("--src", help="training source file, one sentence per line")
    p.add_argument("--tgt", help="training target file, line-aligned with --src")
    p.add_argument("--valid-src", dest="valid_src", help="dev source file (else held out of train)")
    p.add_argument("--valid-tgt", dest="valid_tgt", help="dev target file, line-aligned")
    p.add_argument("--test-src", dest="test_src", help="test source file (else held out of train)")
    p.add_argument("--test-tgt", dest="test_tgt", help="test target file, line-aligned")
    p.add_argument(
        "--src-lang", dest="src_lang", help="source language: names its files (valid.LANG)"
    )
    p.add_argument("--tgt-lang", dest="tgt_lang", help="target language: names its files")
    p.add_argument(
        "--vocab-size",
        dest="vocab_size",
        type=int,
        help="subword pieces (8000; each, per language)",
    )
    p.add_argument(
        "--joint-vocab",
        dest="joint_vocab",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one vocabulary shared by both languages (data.joint_vocab, the default), or "
        "with --no-joint-vocab one a language, the source's embedding its own",
    )
    p.add_argument(
        "--vocab-sample",
        dest="spm_max_sentences",
        type=int,
        metavar="N",
        help="train the vocabulary on a seeded sample of N sentences of the training pairs "
        "(data.spm_max_sentences, default 2,000,000)",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes encoding the training pairs (default: one a core); any number "
        "gives the same output",
    )
    p.add_argument(
        "--corpus-dir", dest="corpus_dir", help="directory holding the named corpus's files"
    )
    p.add_argument("--out", help="the prepared-data directory (default: data.prepared_dir)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="data.KEY=VALUE",
        help="any data key (docs/CONFIGURATION.md); repeatable",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--json", action="store_true", help="also print summary.json")
    p.set_defaults(func=cmd_prepare)


def _add_train(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "train",
        help="train a model on a config's data",
        description="Train the model of CONFIG (a YAML file or a preset name) on its data "
        "section, preparing the data first if needed.",
    )
    p.add_argument("config", help="a run config file or preset name, e.g. weighted-small")
    p.add_argument("--out", help="run directory (default: runs/<config name>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config key, validated like the file",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last complete checkpoint",
    )
    p.set_defaults(func=cmd_train)


def _add_demo(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "demo",
        help="prepare Tatoeba en→de, train, evaluate: the main job in one command",
        description="Train the weighted-demo Weighted Transformer on Tatoeba English→German "
        "for a wall-clock budget, then evaluate it with beam search and sacreBLEU.",
    )
    p.add_argument(
        "--minutes",
        type=positive_number,
        default=12.0,
        help="minutes of training (default 12: with data and evaluation, under 15 on a 2-core CPU)",
    )
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--threads", type=at_least_one, default=2, help="CPU threads (default 2)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted demo run")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a key of the weighted-demo preset",
    )
    p.set_defaults(func=cmd_demo)


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from wtnmt.serve.main import add_arguments as add_serve_arguments

    p = commands.add_parser(
        "serve",
        help="serve a trained run over HTTP: JSON API, web page, metrics",
        description="Serve RUN_DIR over HTTP: POST /v1/translate (dynamic batching across "
        "requests), GET /v1/model, /health, /ready, /metrics, and a web page at /. Needs the "
        "serve extra: pip install 'wtnmt[serve]'.",
    )
    add_serve_arguments(p)
    add_quantize(p)
    add_engine(p, default="auto")
    p.set_defaults(func=cmd_serve)


def _add_presets(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "presets",
        help="list the configs shipped with wtnmt (train PRESET, prepare PRESET)",
        description="The presets: names that train, prepare and experiment grids take in "
        "place of a config file, each with the first line of its description.",
    )
    p.set_defaults(func=cmd_presets)


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    parser = _Parser(prog="wtnmt", description="Weighted Transformer neural machine translation.")
    parser.add_argument("--version", action="version", version=f"wtnmt {version('wtnmt')}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for add in (
        _add_prepare,
        _add_train,
        add_translate,
        add_evaluate,
        _add_demo,
        _add_serve,
        add_average,
        add_prune,
        add_export,
        add_import,
        add_analyze,
        add_experiment,
        add_unpack,
        _add_presets,
    ):
        add(commands)
    return parser


# the commands whose work begins with torch's import, which can lose a Ctrl-C that comes while
# it runs (the command then went on as if none had come): held there, raised once it is done;
# `analyze` where it decodes; `serve` once it has its extras (serve/main.py)
_IMPORT_TORCH = frozenset(
    ("train", "translate", "evaluate", "export", "import", "demo", "average", "experiment", "prune")
)


def _run(args: argparse.Namespace) -> int:
    if args.command in _IMPORT_TORCH or (args.command == "analyze" and not args.no_decode):
        with interrupt.held():
            import torch  # noqa: F401
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_guarded(args.command, lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
