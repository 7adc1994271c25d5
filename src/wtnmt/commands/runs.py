"""`wtnmt prepare`, `train`, `export`, `demo`, `serve`, `analyze`, `experiment` and
`average`, given parsed arguments (the parser is in ``wtnmt.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wtnmt import stored
from wtnmt.config import (
    ConfigError,
    DataConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    own_files_filters,
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
        if data.get("corpus") and not args.corpus:  # nor its corpus's filters, unless --set
            given = {t.split("=", 1)[0].strip() for t in args.set}
            data.update(own_files_filters(data, given))
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
        "spm_max_sentences",
        "joint_vocab",
    ):
        value = getattr(args, key)
        if value is not None:
            data[key] = value
    return config_from_dict({"data": data}).data


def cmd_prepare(args: argparse.Namespace) -> int:
    from wtnmt.data import format_summary, prepare

    config = _data_config(args)
    out = args.out or config.prepared_path()
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be at least 1")
    summary = prepare(
        config,
        out,
        log=lambda m: print(m, file=sys.stderr),
        force=args.force,
        workers=args.workers,
    )
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
        from wtnmt import interrupt

        return interrupt.exit_status()  # 130 for Ctrl-C, 143 for SIGTERM
    from wtnmt.prune.run import mark_fine_tuned

    if mark_fine_tuned(out):  # the fine-tune of a `wtnmt prune` that was interrupted
        print(f"{out}: the fine-tune of its prune finished: prune.json says so")
    print(
        f"{out}: {state.step} steps, stopped because {state.finished}; weights in "
        f"{out / 'model.safetensors'}"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from wtnmt.export import export

    out = export(
        args.format,
        args.run_dir,
        args.out,
        weights=args.weights,
        quantize=args.quantize,
        force=args.force,
    )
    print(f"{args.format} export: {out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from wtnmt.export.hf_import import import_hf

    import_hf(args.folder, args.out, src_lang=args.src_lang, tgt_lang=args.tgt_lang)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from wtnmt.demo import main_demo

    return main_demo(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from wtnmt.serve.main import main_serve

    return main_serve(args)


def _positive(name: str, value: int, least: int = 1) -> None:
    if value < least:
        raise ConfigError(f"{name} {value}: must be at least {least}")


def _beside(runs: list[str]) -> Path:
    """analyze's default report directory: analysis/ in the one run, or in the directory the
    runs share (never the working directory for runs elsewhere)."""
    import os

    if len(runs) == 1:
        return Path(runs[0]) / "analysis"
    return Path(os.path.commonpath([str(Path(r).resolve().parent) for r in runs])) / "analysis"


def cmd_analyze(args: argparse.Namespace) -> int:
    from wtnmt.analysis.report import analyze
    from wtnmt.analysis.scoring import scored_with
    from wtnmt.decode.evaluate import check_tokenizer

    check_tokenizer(args.tokenize)
    _positive("--smooth", args.smooth)
    _positive("--random-seeds", args.random_seeds)
    _positive("--sentence", args.sentence, least=0)
    for run in args.runs:
        if (
            not stored.exists(Path(run) / "metrics.jsonl")
            or not (Path(run) / "config.yaml").is_file()
        ):
            raise ConfigError(f"{run}: not a run directory (no metrics.jsonl and config.yaml)")
    with scored_with(args.tokenize):  # every test BLEU of the report
        analyze(
            args.runs,
            args.out or _beside(args.runs),
            target_bleu=args.target_bleu,
            window=args.smooth,
            random_seeds=args.random_seeds,
            sentence=args.sentence,
            decode=not args.no_decode,
            pairs=args.pair,
            say=lambda m: print(m, file=sys.stderr),
        )
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from wtnmt.experiment.command import cmd_experiment as run

    return run(args)


def cmd_presets(args: argparse.Namespace) -> int:
    from wtnmt.config.loading import PRESET_DIR

    for path in sorted(PRESET_DIR.glob("*.yaml")):
        print(f"{path.stem:<20} {first_sentence(path.read_text(encoding='utf-8'))}")
    return 0


def first_sentence(text: str) -> str:
    """The first sentence of a config's header comment, whole however many lines it takes
    (a full stop outside parentheses ends it)."""
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    words, depth, sentence = " ".join(header).split(), 0, []
    for word in words:
        sentence.append(word)
        depth += word.count("(") - word.count(")")
        if depth <= 0 and word.endswith("."):
            break
    return " ".join(sentence)


def cmd_unpack(args: argparse.Namespace) -> int:
    from wtnmt.experiment.unpack import unpack

    done = unpack(
        [Path(p) for p in args.paths],
        Path(args.into),
        replace_longer=args.replace_longer,
        max_expanded=args.max_expanded,
        say=lambda m: print(m, file=sys.stderr),
    )
    print(
        f"unpacked into {args.into}: {len(done.written)} written, {len(done.unchanged)} "
        f"unchanged, {len(done.replaced)} replaced, {len(done.kept)} kept as they were"
    )
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from wtnmt.rundir.average import average_run

    record = average_run(args.run_dir, args.out, last=args.last)
    print(
        f"{args.out}: the mean of {len(record['checkpoints'])} checkpoints of {args.run_dir} "
        f"({', '.join(record['checkpoints'])})"
    )
    return 0
