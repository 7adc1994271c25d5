"""The `wtnmt` command line: the parser and the error handling around every command (the
commands themselves are in ``wtnmt.commands``)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from wtnmt.commands import (
    cmd_demo,
    cmd_evaluate,
    cmd_prepare,
    cmd_serve,
    cmd_train,
    cmd_translate,
)
from wtnmt.config import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (the usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wtnmt", description="Weighted Transformer neural machine translation.")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    p = commands.add_parser(
        "prepare",
        help="raw parallel text → vocabulary and token arrays",
        description="Read a named corpus or your own parallel files, clean them (counted), "
        "train the shared sentencepiece vocabulary and write token arrays.",
    )
    p.add_argument("config", nargs="?", help="a run config or preset name (its data section)")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--corpus", help="a named corpus: tatoeba-deu-eng, multi30k, wmt14-en-de, wmt14-en-fr"
    )
    source.add_argument("--tsv", help="one TSV file of source<TAB>target lines")
    p.add_argument("--src", help="training source file, one sentence per line")
    p.add_argument("--tgt", help="training target file, line-aligned with --src")
    p.add_argument("--valid-src", dest="valid_src")
    p.add_argument("--valid-tgt", dest="valid_tgt")
    p.add_argument("--test-src", dest="test_src")
    p.add_argument("--test-tgt", dest="test_tgt")
    p.add_argument("--src-lang", dest="src_lang")
    p.add_argument("--tgt-lang", dest="tgt_lang")
    p.add_argument("--vocab-size", dest="vocab_size", type=int)
    p.add_argument(
        "--corpus-dir", dest="corpus_dir", help="directory holding the named corpus's files"
    )
    p.add_argument("--out", help="the prepared-data directory (default: data.prepared_dir)")
    p.add_argument("--set", action="append", default=[], metavar="data.KEY=VALUE")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--json", action="store_true", help="also print summary.json")
    p.set_defaults(func=cmd_prepare)

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

    p = commands.add_parser(
        "translate",
        help="translate text with a trained run",
        description="Read raw text, one sentence per line (stdin or -i), write detokenised "
        "translations in the same order, one per line (stdout or -o).",
    )
    p.add_argument("run_dir")
    p.add_argument("-i", "--input", help="input file (default: stdin)")
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.add_argument("--beam", type=int, help="beam size (default: the run's decode.beam)")
    p.add_argument(
        "--nbest",
        type=int,
        help="write the N best of each sentence as N lines 'i ||| translation ||| score' "
        "(i counts sentences from 0; default: the run's decode.nbest)",
    )
    p.add_argument(
        "--chunk", type=int, default=2000, help="most lines translated together (default 2000)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    p.set_defaults(func=cmd_translate)

    p = commands.add_parser(
        "evaluate",
        help="translate a test set and score it with sacreBLEU",
        description="Translate a corpus split (--corpus NAME --split SPLIT) or --src/--ref "
        "files, and score with sacreBLEU BLEU and chrF.",
    )
    p.add_argument("run_dir")
    p.add_argument("--corpus", help="a named corpus, split as the run's data config splits it")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--src")
    p.add_argument("--ref")
    p.add_argument("--beam", type=int)
    p.add_argument(
        "--compare",
        metavar="OTHER_RUN",
        help="also translate with OTHER_RUN and test the difference (bootstrap)",
    )
    p.add_argument("--samples", type=int, default=1000, help="bootstrap samples")
    p.add_argument(
        "--branch-weights",
        dest="branch_weights",
        default="learned",
        choices=["learned", "uniform", "random"],
        help="evaluate with the learned κ, α or replaced ones (paper Table 3)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --branch-weights random")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_evaluate)

    p = commands.add_parser(
        "demo",
        help="prepare Tatoeba en→de, train, evaluate: the main job in one command",
        description="Train the weighted-small Weighted Transformer on Tatoeba English→German "
        "for a wall-clock budget, then evaluate it with beam search and sacreBLEU.",
    )
    p.add_argument("--minutes", type=float, default=10.0, help="training budget (default 10)")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--resume", action="store_true", help="continue an interrupted demo run")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a key of the weighted-small preset",
    )
    p.set_defaults(func=cmd_demo)

    from wtnmt.serve.main import add_arguments as add_serve_arguments

    p = commands.add_parser(
        "serve",
        help="serve a trained run over HTTP: JSON API, web page, metrics",
        description="Serve RUN_DIR over HTTP: POST /v1/translate (dynamic batching across "
        "requests), GET /v1/model, /health, /ready, /metrics, and a web page at /. Needs the "
        "serve extra: pip install 'wtnmt[serve]'.",
    )
    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    from wtnmt.data import DataError
    from wtnmt.errors import CheckpointError, TrainingError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "evaluate" and not args.corpus and not (args.src and args.ref):
        parser.error("give --corpus NAME [--split SPLIT], or --src FILE and --ref FILE")
    try:
        return args.func(args)
    except (ConfigError, DataError, TrainingError, CheckpointError) as e:
        print(f"wtnmt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"wtnmt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
