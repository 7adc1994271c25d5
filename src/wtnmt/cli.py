"""The `wtnmt` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import NoReturn

from wtnmt.config import (
    ConfigError,
    DataConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_override,
)


def _data_config(args: argparse.Namespace) -> DataConfig:
    """The data section of CONFIG (or the defaults) with the command line's choices on top,
    typed and validated as a config file is."""
    if (args.src is None) != (args.tgt is None):
        raise ConfigError("--src and --tgt go together: give both")
    if args.src and (args.corpus or args.tsv):
        other = "--corpus" if args.corpus else "--tsv"
        raise ConfigError(f"{other} and --src/--tgt name two sources of training data: give one")
    data = config_to_dict(load_config(args.config, args.set))["data"] if args.config else {}
    if not args.config:
        for text in args.set:
            keys, value = parse_override(text)
            if keys[0] != "data" or len(keys) != 2:
                raise ConfigError(f"--set {text!r}: without CONFIG only data.* keys apply")
            data[keys[1]] = value
    sources = {"corpus": args.corpus, "train_src": args.src, "train_tsv": args.tsv}
    if any(sources.values()):  # the source given here replaces the config's
        data.update(corpus=args.corpus, train_src=args.src, train_tgt=args.tgt, train_tsv=args.tsv)
    for key in (
        "src_lang",
        "tgt_lang",
        "vocab_size",
        "corpus_dir",
        "valid_src",
        "valid_tgt",
        "test_src",
        "test_tgt",
    ):
        value = getattr(args, key)
        if value is not None:
            data[key] = value
    return config_from_dict({"data": data}).data


def cmd_prepare(args: argparse.Namespace) -> int:
    from wtnmt.data import format_summary, prepare

    config = _data_config(args)
    out = args.out or config.prepared_path()
    summary = prepare(config, out, log=lambda m: print(m, file=sys.stderr), force=args.force)
    print(format_summary(summary))
    print(f"prepared data: {Path(out)}  (summary.json there)")
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from wtnmt.runtime import tune_cpu_allocator
    from wtnmt.train import Trainer

    config = load_config(args.config, args.set)
    out = Path(args.out or Path("runs") / Path(args.config).stem)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; --out names the run directory")
    if out.resolve() == config.data.prepared_path().resolve():
        raise ConfigError(
            f"--out {out}: is the prepared-data directory (data.prepared_dir); "
            f"give the run a directory of its own"
        )
    tune_cpu_allocator()
    trainer = Trainer(config, out, resume=args.resume)
    try:
        state = trainer.run()
    except KeyboardInterrupt:
        return 130
    print(
        f"{out}: {state.step} steps, stopped because {state.finished}; weights in "
        f"{out / 'model.safetensors'}"
    )
    return 0


def _read_input(path: str | None):  # type: ignore[no-untyped-def]
    """Lines of a file or of stdin, split on \\n only, strict UTF-8."""
    from wtnmt.data.io import decode_lines, read_bytes

    if path in (None, "-"):
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return decode_lines(read_bytes(path), path)


def _check_output_file(path: str) -> None:
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"-o {path}: is a directory; -o names the file to write")
    if not out.parent.is_dir():
        raise ConfigError(f"-o {path}: the directory {out.parent} does not exist")


def nbest_lines(index: int, options, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """``i ||| translation ||| score`` lines (Moses' n-best format, sentences counted from 0),
    exactly ``n`` of them: places the search found no hypothesis for score -inf."""
    lines = [f"{index} ||| {t.text} ||| {t.score:.4f}" for t in options[:n]]
    return lines + [f"{index} |||  ||| -inf"] * (n - len(lines))


def cmd_translate(args: argparse.Namespace) -> int:
    from wtnmt.data.io import stream_lines
    from wtnmt.runtime import check_device, tune_cpu_allocator

    for option in ("beam", "nbest", "chunk", "threads"):  # all before the model is loaded
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ConfigError(f"--{option} {value}: must be at least 1")
    check_device(args.device)
    if args.output:
        _check_output_file(args.output)

    from wtnmt.decode.translator import Translator

    tune_cpu_allocator()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    translator = Translator.load(args.run_dir, device=args.device)
    beam = args.beam or translator.config.decode.beam
    nbest = args.nbest or translator.config.decode.nbest
    if nbest > beam:
        given = f"--nbest {nbest}" if args.nbest else f"decode.nbest={nbest} (the run's config)"
        raise ConfigError(f"{given} is more than the beam size {beam}: raise --beam")
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        # each chunk is translated as soon as it is read, and its output flushed
        for first, chunk in stream_lines(args.input, chunk=args.chunk):
            results = translator.translate_nbest(
                chunk,
                beam=beam,
                nbest=nbest,
                first_line=first,
                warn=lambda m: print(f"wtnmt translate: warning: {m}", file=sys.stderr),
            )
            for i, options in enumerate(results):
                lines = (
                    [options[0].text] if nbest == 1 else nbest_lines(first - 1 + i, options, nbest)
                )
                out.write("".join(line + "\n" for line in lines))
            out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from wtnmt.decode.evaluate import paired_bootstrap, score_corpus
    from wtnmt.decode.translator import Translator
    from wtnmt.runtime import tune_cpu_allocator

    tune_cpu_allocator()
    translator = Translator.load(args.run_dir, device=args.device)
    if args.corpus:
        from wtnmt.data.prepare import raw_split

        data = dataclasses.replace(
            translator.config.data,
            corpus=args.corpus,
            train_src=None,
            train_tgt=None,
            train_tsv=None,
        )
        pairs = raw_split(data, args.split)
        src, refs = [p[0] for p in pairs], [p[1] for p in pairs]
        name = f"{args.corpus}.{args.split}"
    else:
        src, refs = _read_input(args.src), _read_input(args.ref)
        if len(src) != len(refs):
            raise ConfigError(f"--src has {len(src)} lines but --ref has {len(refs)}")
        name = Path(args.src).stem
    if args.branch_weights != "learned":
        translator.set_branch_weights(args.branch_weights, seed=args.seed)
        name += f".{args.branch_weights}"
    beam = args.beam or translator.config.decode.beam
    print(f"translating {len(src):,} sentences with beam {beam}", file=sys.stderr)
    hyps = translator.translate(src, beam=args.beam)
    scores = score_corpus(hyps, refs)
    scores["branch_weights"] = args.branch_weights
    out = Path(args.run_dir) / "eval"
    out.mkdir(exist_ok=True)
    (out / f"{name}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    if args.compare:
        other = Translator.load(args.compare, device=args.device).translate(src, beam=args.beam)
        scores["compare"] = {
            "run": str(args.compare),
            **paired_bootstrap(refs, hyps, other, samples=args.samples),
        }
    (out / f"{name}.scores.json").write_text(json.dumps(scores, indent=2))
    (Path(args.run_dir) / "scores.json").write_text(json.dumps(scores, indent=2))
    print(
        f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['n_sentences']} "
        f"sentences)\n{scores['signature']}\n{scores['chrf_signature']}"
    )
    if args.compare:
        c = scores["compare"]
        print(
            f"vs {args.compare}: BLEU {c['bleu']:.2f} ± {c['ci95']:.2f} against "
            f"{c['baseline_bleu']:.2f} ± {c['baseline_ci95']:.2f}, p = {c['p_value']:.4f} "
            f"(paired bootstrap)"
        )
    print(f"hypotheses: {out / (name + '.hyp')}   scores: {Path(args.run_dir) / 'scores.json'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from wtnmt.demo import main_demo

    return main_demo(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from wtnmt.serve.main import main_serve

    return main_serve(args)


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
