"""The parsers of the commands that work on trained runs and grids: `wtnmt export`,
`average`, `analyze`, `experiment` and `unpack` (the commands themselves are in
``wtnmt.commands``)."""

from __future__ import annotations

import argparse

from wtnmt.cli_args import size
from wtnmt.commands import (
    cmd_analyze,
    cmd_average,
    cmd_experiment,
    cmd_export,
    cmd_import,
    cmd_unpack,
)


def add_export(commands: argparse._SubParsersAction) -> None:
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


def add_import(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "import",
        help="a Hugging Face Marian model (OPUS-MT's) as a wtnmt run",
        description="hf: a folder of a Marian model (MarianMTModel: the OPUS-MT models, or "
        "`wtnmt export hf`'s) becomes a run that translates on every engine, evaluates, serves "
        "and fine-tunes (train.init_from: RUN); its SentencePiece models are rewritten to "
        "wtnmt's ids (pip install 'wtnmt[hf]'). Download the folder first, e.g. with "
        "`hf download Helsinki-NLP/opus-mt-en-de --local-dir DIR`.",
    )
    p.add_argument("format", choices=["hf"], help="hf: a Hugging Face Marian folder")
    p.add_argument("folder", metavar="DIR", help="the model's folder (config.json, weights, "
                   "source.spm, target.spm, vocab.json)")  # fmt: skip
    p.add_argument("--out", required=True, help="the run directory to write (new, or empty)")
    p.add_argument("--src-lang", help="the source language's name (default: the tokenizer's, "
                   "else the folder's name: opus-mt-en-de → en)")  # fmt: skip
    p.add_argument("--tgt-lang", help="the target language's name (as --src-lang)")
    p.set_defaults(func=cmd_import)


def add_average(commands: argparse._SubParsersAction) -> None:
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


def add_analyze(commands: argparse._SubParsersAction) -> None:
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


def add_experiment(commands: argparse._SubParsersAction) -> None:
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


def add_unpack(commands: argparse._SubParsersAction) -> None:
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


__all__ = [
    "add_analyze",
    "add_average",
    "add_experiment",
    "add_export",
    "add_import",
    "add_unpack",
]
