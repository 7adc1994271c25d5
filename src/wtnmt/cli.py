"""The `wtnmt` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from wtnmt.config import ConfigError, DataConfig, load_config, parse_override


def _data_config(args: argparse.Namespace) -> DataConfig:
    """The data section of CONFIG (or the defaults), with the command line's choices on top."""
    base = load_config(args.config, args.set).data if args.config else DataConfig()
    changes: dict[str, object] = {}
    if args.corpus:
        changes.update(corpus=args.corpus, train_src=None, train_tgt=None, train_tsv=None)
    if args.src or args.tgt:
        changes.update(corpus=None, train_src=args.src, train_tgt=args.tgt, train_tsv=None)
    if args.tsv:
        changes.update(corpus=None, train_src=None, train_tgt=None, train_tsv=args.tsv)
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
            changes[key] = value
    if not args.config:
        for text in args.set:
            keys, value = parse_override(text)
            if keys[0] != "data" or len(keys) != 2:
                raise ConfigError(f"--set {text!r}: without CONFIG only data.* keys apply")
            changes[keys[1]] = value
    return dataclasses.replace(base, **changes)  # validated again by __post_init__


def cmd_prepare(args: argparse.Namespace) -> int:
    from wtnmt.data import format_summary, prepare

    config = _data_config(args)
    out = args.out or config.prepared_dir.format(
        corpus=config.corpus or "custom", src_lang=config.src_lang, tgt_lang=config.tgt_lang
    )
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wtnmt", description="Weighted Transformer neural machine translation."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    return parser


def main(argv: list[str] | None = None) -> int:
    from wtnmt.data import DataError
    from wtnmt.errors import CheckpointError, TrainingError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "prepare" and (args.src is None) != (args.tgt is None):
        parser.error("--src and --tgt go together")
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
