"""The parsers of `wtnmt translate` and `wtnmt evaluate` (decoding with a run's weights; the
commands themselves are in ``wtnmt.commands.decoding``)."""

from __future__ import annotations

import argparse

from wtnmt.cli_args import (
    add_engine,
    add_ensemble,
    add_length_penalty,
    add_quantize,
    at_least_one,
)
from wtnmt.commands.decoding import cmd_translate
from wtnmt.commands.evaluating import cmd_evaluate


def add_weights(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weights",
        default="model.safetensors",
        metavar="FILE",
        help="the weights in RUN to decode with (default model.safetensors, the best on dev; "
        "e.g. average-last10.safetensors, or a checkpoint: checkpoints/step_0000400.safetensors)",
    )


def add_translate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "translate",
        help="translate text with a trained run",
        description="Read raw text, one sentence per line (stdin or -i), write detokenised "
        "translations in the same order, one per line (stdout or -o).",
    )
    p.add_argument("run_dir", metavar="RUN", help="a trained run directory")
    p.add_argument("-i", "--input", help="input file (default: stdin)")
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.add_argument("--beam", type=int, help="beam size (default: the run's decode.beam)")
    p.add_argument(
        "--nbest",
        type=int,
        help="write the N best of each sentence as N lines 'i ||| translation ||| score' "
        "(i counts sentences from 0; default: the run's decode.nbest)",
    )
    add_length_penalty(p)
    p.add_argument(
        "--chunk", type=int, default=2000, help="most lines translated together (default 2000)"
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    p.add_argument("--threads", type=int, help="CPU threads in all (default: one a core)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="decode on N processes, each searching whole batches on its share of --threads "
        "(CPU; faster on many sentences, seconds to start; default 1: in this process)",
    )
    add_weights(p)
    add_quantize(p)
    add_engine(p, default="auto")
    add_sampling(p)
    p.add_argument(
        "--prefix",
        metavar="FILE",
        help="a target prefix a line, line for line with the input (an empty line: none): each "
        "translation begins with it and the search goes on from there (fairseq's --prefix-size, "
        "CTranslate2's target_prefix)",
    )
    add_ensemble(p)
    p.add_argument(
        "--alignment",
        nargs="?",
        const="words",
        choices=["words", "pieces"],
        help="also write each translation's alignment to its source, 'i-j' pairs (source word "
        "i, output word j, from 0) after ' ||| ' (by SentencePiece piece with 'pieces'), from "
        "the cross-attention",
    )
    p.add_argument(
        "--alignment-layer",
        type=int,
        metavar="N",
        help="the decoder layer read (from 0; default: the penultimate, Garg et al. 2019)",
    )
    p.add_argument(
        "--alignment-heads",
        metavar="I,J",
        help="the heads (branches) averaged, numbered from 1 (default: all; a Weighted "
        "Transformer's branches weighted by their κ)",
    )
    p.set_defaults(func=cmd_translate)


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sampling",
        action="store_true",
        help="draw each translation from the model instead of searching (back-translation); "
        "--nbest N draws N a sentence, in the order drawn, each scored by its log-probability",
    )
    p.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="with --sampling: probabilities ∝ p^(1/T) (default 1: the model's; above 0 to 100)",
    )
    p.add_argument(
        "--top-k",
        dest="top_k",
        type=int,
        metavar="K",
        help="with --sampling: draw among the K most probable tokens (default 0: all)",
    )
    p.add_argument(
        "--top-p",
        dest="top_p",
        type=float,
        metavar="P",
        help="with --sampling: among the most probable tokens that hold P of the probability "
        "(nucleus sampling; default 1: all)",
    )
    p.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="with --sampling: the seed (default 0); a sentence's samples depend only on it, "
        "the sentence, its prefix and the options, not on its batch or the --workers",
    )


def add_evaluate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "evaluate",
        help="translate a test set and score it with sacreBLEU",
        description="Translate the run's own split (--split SPLIT, as its config names its "
        "files or holds them out), a named corpus's (--corpus NAME --split SPLIT) or --src/--ref "
        "files, and score with sacreBLEU's BLEU, chrF and TER (--hyp: a translation made "
        "elsewhere, scored without decoding).",
    )
    p.add_argument("run_dir", metavar="RUN", help="a trained run directory")
    p.add_argument("--corpus", help="a named corpus, split as the run's data config splits it")
    p.add_argument(
        "--split",
        default="test",
        choices=["train", "valid", "test"],
        help="the run's own split, with --corpus or its config's files (default test)",
    )
    p.add_argument("--src", help="source file to translate (with --ref)")
    p.add_argument("--ref", help="its reference translations, line-aligned")
    p.add_argument(
        "--hyp",
        metavar="FILE",
        help="score this translation (made elsewhere) against --ref or the run's --split "
        "instead of decoding; prints the scores, writes nothing",
    )
    p.add_argument("--beam", type=at_least_one, help="beam size (default: the run's decode.beam)")
    add_length_penalty(p)
    add_weights(p)
    p.add_argument(
        "--compare",
        metavar="OTHER_RUN",
        help="also translate with OTHER_RUN and test the difference (bootstrap)",
    )
    p.add_argument("--samples", type=at_least_one, default=1000, help="bootstrap samples")
    p.add_argument(
        "--branch-weights",
        dest="branch_weights",
        default="learned",
        choices=["learned", "uniform", "random"],
        help="evaluate with the learned κ, α or replaced ones (paper Table 3)",
    )
    p.add_argument(
        "--branch-weights-in",
        dest="branch_weights_in",
        action="append",
        metavar="SUBLAYER",
        help="replace κ, α in this branched sublayer only (e.g. encoder_layers.3.self_attn, "
        "as the run logs them; again for more): which layer's weights the model leans on",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --branch-weights random")
    p.add_argument(
        "--tokenize",
        default="13a",
        metavar="TOK",
        help="sacreBLEU's tokenization of BLEU: 13a (default), intl, zh, ja-mecab, ko-mecab, "
        "char, flores101, flores200 (zh, ja-mecab, ko-mecab for Chinese, Japanese, Korean "
        "targets); recorded in scores.json and the signature",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    add_quantize(p)
    add_engine(p)
    add_ensemble(p)
    p.set_defaults(func=cmd_evaluate)
