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
    size,
)
from wtnmt.commands import (
    cmd_analyze,
    cmd_average,
    cmd_demo,
    cmd_experiment,
    cmd_export,
    cmd_prepare,
    cmd_presets,
    cmd_serve,
    cmd_train,
    cmd_unpack,
)
from wtnmt.commands.decoding_args import add_evaluate, add_translate
from wtnmt.guard import run_guarded
from wtnmt.prune.arguments import add_prune


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (the usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_export(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "export",
        help="a trained run as ONNX graphs, a CTranslate2 model or a Hugging Face folder",
        description="onnx: the encoder and one decoder step as ONNX graphs, for "
        "--engine onnxruntime or any ONNX Runtime (needs onnx and onnxscript: pip install "
        "'wtnmt[onnx]'). ctranslate2: a CTranslate2 model of a Transformer run (the branched "
        "layers of a Weighted Transformer have no CTranslate2 spec). hf: a folder transformers "
        "loads with its Auto classes (a Transformer as a Marian model; other models with "
        "wtnmt's modelling code, trust_remote_code=True), its tokenizer, generation config "
        "and model card (pip install 'wtnmt[hf]').",
    )
    p.add_argument("format", choices=["onnx", "ctranslate2", "hf"], help="onnx, ctranslate2 or hf")
    p.add_argument("run_dir", metavar="RUN", help="a trained run directory")
    p.add_argument("--out", help="the export's directory (default RUN/onnx for onnx)")
    p.add_argument("--weights", default="model.safetensors", help="weights file in RUN")
    p.add_argument(
        "--quantize",
        default="none",
        choices=["none", "int8"],
        help="int8: also int8 graphs (onnx), or an int8 model (ctranslate2)",
    )
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    p.set_defaults(func=cmd_export)


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


def _add_average(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "average",
        help="average a run's last checkpoints into a new run directory",
        description="Write the element-wise mean of the weights of RUN's last N checkpoints "
        "(as fairseq's average_checkpoints) to a new run directory OUT, which translate, "
        "evaluate and serve read as any run.",
    )
    p.add_argument("run_dir", metavar="RUN", help="a trained run directory")
    p.add_argument(
        "--last",
        type=int,
        default=None,
        help="how many checkpoints (default: as many as the run keeps, its "
        "train.keep_checkpoints, 3 by default; fewer where fewer were saved)",
    )
    p.add_argument("--out", required=True, help="the new run directory (must not exist)")
    p.set_defaults(func=cmd_average)


def _add_analyze(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "analyze",
        help="the papers' figures and tables from trained runs (PNG, Markdown, HTML)",
        description="Draw κ/α over training (Fig. 3), validation against training loss "
        "(Fig. 2), dev BLEU and loss against steps and seconds, the steps each run took to a "
        "dev BLEU; with the weights: branch weights replaced at test time (Table 3), "
        "per-branch attention of one sentence, test scores at equal steps and the paired "
        "bootstrap. Reads what the runs recorded; nothing is retrained.",
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN", help="run directories; the first is the reference"
    )
    p.add_argument(
        "--out",
        help="output directory (default: analysis/ in the run, or in the directory the runs "
        "share, e.g. runs/analysis for runs/a runs/b)",
    )
    p.add_argument(
        "--target-bleu",
        type=float,
        help="dev BLEU to count steps to (default: the first run's best dev BLEU)",
    )
    p.add_argument("--smooth", type=int, default=1, help="mean filter of κ/α curves, in points")
    p.add_argument(
        "--tokenize",
        default="13a",
        metavar="TOK",
        help="sacreBLEU's tokenization of every test BLEU (as evaluate --tokenize; default 13a)",
    )
    p.add_argument("--random-seeds", type=int, default=3, help="draws of random κ, α (Table 3)")
    p.add_argument("--sentence", type=int, default=0, help="test sentence of the attention maps")
    p.add_argument(
        "--no-decode",
        action="store_true",
        help="only what metrics and scores hold: no Table 3, attention, equal-step scores",
    )
    p.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="MODEL:BASELINE",
        help="also test MODEL against BASELINE across seeds (a model: its runs' name without "
        "-sN, e.g. weighted-fixed:weighted; repeatable)",
    )
    p.set_defaults(func=cmd_analyze)


def _add_experiment(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "experiment",
        help="train, score and analyze a grid of runs (experiments/*.yaml)",
        description="Run the grid of FILE: runs × seeds, a few at once, each in its own "
        "process. Finished runs are skipped and interrupted ones resumed, so running it again "
        "continues where it stopped; each run is scored on the test split, then analyzed.",
    )
    p.add_argument("grid", metavar="FILE", help="a grid file, e.g. experiments/multi30k-en-de.yaml")
    p.add_argument("--dry-run", action="store_true", help="say what is left to do, do nothing")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only the runs whose name (e.g. weighted-s2) matches PATTERN (shell-style, "
        "e.g. 'transformer-*'; repeatable); the report is written once all runs are done",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        metavar="SECONDS",
        help="after SECONDS, pause the runs still training at a checkpoint and start no "
        "other (a job with a time limit); runs scoring the weights they trained are left to "
        "finish; the next call goes on",
    )
    p.add_argument(
        "--work-dir",
        metavar="DIR",
        help="train the runs under DIR (checkpoints and weights on a disk that outlives the "
        "work tree) and copy each finished run's small results (config, metrics, scores, "
        "eval/) to where the grid file puts it; the next call with the same DIR goes on",
    )
    p.add_argument(
        "--pack",
        metavar="DIR",
        help="then write the runs' small results (config, metrics, scores, eval/; no weights) "
        "into DIR/results-NN.tar.gz, to carry off the machine; `wtnmt unpack DIR` puts them "
        "back",
    )
    p.add_argument(
        "--pack-size", type=size, default="16M", metavar="BYTES", help="per archive (16M)"
    )
    p.add_argument("--pack-files", type=int, default=8, metavar="N", help="archives at most (8)")
    p.set_defaults(func=cmd_experiment)


def _add_unpack(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "unpack",
        help="put a pack's results (experiment --pack DIR) back where the grid puts them",
        description="Extract the archives of `wtnmt experiment --pack DIR` into the working "
        "directory. Every archive is read through and checked first (one cut short, holding "
        "a member twice, or a file where another member needs a directory refuses them all, "
        "nothing written); "
        "a file already there is never replaced by a shorter copy that does not continue it.",
    )
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="a --pack directory, or results-NN.tar.gz files"
    )
    p.add_argument(
        "--into", default=".", metavar="DIR", help="where the paths start (the working directory)"
    )
    p.add_argument(
        "--replace-longer",
        action="store_true",
        help="take the archive's file even where a longer one it does not continue is there",
    )
    p.add_argument(
        "--max-expanded",
        type=size,
        default="2G",
        metavar="BYTES",
        help="refuse archives that would expand to more than this in all (2G; a pack of "
        "results is far less)",
    )
    p.set_defaults(func=cmd_unpack)


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
        _add_average,
        add_prune,
        _add_export,
        _add_analyze,
        _add_experiment,
        _add_unpack,
        _add_presets,
    ):
        add(commands)
    return parser


# the commands whose work begins with torch's import, which can lose a Ctrl-C that comes while
# it runs (the command then went on as if none had come): held there, raised once it is done;
# `analyze` where it decodes; `serve` once it has its extras (serve/main.py)
_IMPORT_TORCH = frozenset(
    ("train", "translate", "evaluate", "export", "demo", "average", "experiment", "prune")
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
