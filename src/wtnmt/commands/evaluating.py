"""`wtnmt evaluate`: a test set translated with a run's weights and scored with sacreBLEU,
given parsed arguments (the parser is in ``commands/decoding_args.py``)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

from wtnmt.commands.decoding import (
    NAME_MAX,
    SUFFIX_ROOM,
    check_float32_kernels,
    check_weights_name,
    decode_overrides,
    ensemble_options,
    read_input,
    sublayers_tag,
)
from wtnmt.config import ConfigError


def _analyzed_split(translator, args, src, refs, lenpen: bool) -> str | None:  # type: ignore[no-untyped-def]
    """The split of the run's own data that `wtnmt evaluate` has just decoded as `wtnmt
    analyze` decodes it (the same pairs; the PyTorch engine in float32, with the run's length
    penalty), or None."""
    from wtnmt.analysis.scoring import split_pairs
    from wtnmt.data import DataError
    from wtnmt.safe_files import is_same_file

    if args.engine != "pytorch" or args.quantize != "none" or lenpen or args.ensemble:
        return None
    data = translator.config.data
    if args.corpus:
        same = args.corpus == data.corpus and args.split in ("valid", "test")  # what analyze scores
        splits = [args.split] if same else []
    elif args.src is None:  # the run's own split, from its config
        splits = [args.split] if args.split in ("valid", "test") else []
    else:
        splits = [
            split
            for split in ("test", "valid")
            if getattr(data, f"{split}_src") and getattr(data, f"{split}_tgt")
            and is_same_file(args.src, getattr(data, f"{split}_src"))
            and is_same_file(args.ref, getattr(data, f"{split}_tgt"))
        ]  # fmt: skip
    for split in splits:
        try:
            if split_pairs(Path(args.run_dir), split) == (src, refs):
                return split
        except (ConfigError, DataError, OSError):  # the run's data is not here
            continue
    return None


def cmd_evaluate(args: argparse.Namespace) -> int:
    from wtnmt.decode.evaluate import (
        check_tokenizer,
        paired_bootstrap,
        record_scores,
        score_corpus,
        update_scores,
        write_hypotheses,
    )
    from wtnmt.decode.translator import Translator
    from wtnmt.runtime import check_engine, check_quantize, tune_cpu_allocator

    if args.hyp is not None:
        return score_given(args)
    if (args.src is None) != (args.ref is None):
        raise ConfigError(
            "--src and --ref go together (or neither: the run's own --split); see "
            "`wtnmt evaluate --help`"
        )
    if args.corpus and args.src:
        raise ConfigError("give --corpus NAME or --src/--ref, not both")
    check_quantize(args.quantize, args.device)
    check_engine(args.engine, args.device)
    check_tokenizer(args.tokenize)
    if args.engine == "onnxruntime" and args.branch_weights != "learned":
        raise ConfigError(
            f"--branch-weights {args.branch_weights} overrides κ, α in the PyTorch and native "
            "engines (the ONNX export holds the learned ones): leave out --engine onnxruntime"
        )
    if args.branch_weights_in and args.branch_weights == "learned":
        raise ConfigError(
            "--branch-weights-in names where --branch-weights uniform or random replaces κ, α: "
            "give one of those too"
        )
    if args.branch_weights_in:  # a sublayer named twice is the same choice (and file names)
        args.branch_weights_in = list(dict.fromkeys(args.branch_weights_in))
    ensemble_weights = ensemble_options(args)
    tune_cpu_allocator()
    check_weights_name(args.weights)
    check_float32_kernels(args.device)
    translator = Translator.load(
        args.run_dir,
        device=args.device,
        quantize=args.quantize,
        engine=args.engine,
        weights=args.weights,
    )
    args.engine = translator.engine  # (what --engine auto chose: in file names and scores)
    ensemble = None
    if args.ensemble:
        try:
            translator.ensemble(args.ensemble, weights=ensemble_weights, weights_file=args.weights)
        except ValueError as e:
            raise ConfigError(f"--ensemble {e}") from None
        ensemble = {"runs": [str(r) for r in args.ensemble], "weights": translator.network.weights}
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
        source = {"corpus": args.corpus, "split": args.split}
    elif args.src is None:  # the run's own split, as its config names or holds it out
        from wtnmt.data.prepare import raw_split

        pairs = raw_split(translator.config.data, args.split)
        src, refs = [p[0] for p in pairs], [p[1] for p in pairs]
        if not src:
            raise ConfigError(f"--split {args.split}: the run's data has no such sentences")
        name = f"run.{args.split}"
        source = {"run_split": args.split}
    else:
        src, refs = read_input(args.src), read_input(args.ref)
        if len(src) != len(refs):
            raise ConfigError(f"--src has {len(src)} lines but --ref has {len(refs)}")
        if not src:  # sacreBLEU has no score for no sentences
            raise ConfigError(f"--src {args.src}: no lines to evaluate")
        name = Path(args.src).stem
        source = {"src": str(args.src), "ref": str(args.ref)}
    if args.weights != "model.safetensors":
        name += f".{Path(args.weights).name.split('.')[0]}"
    if args.branch_weights != "learned":
        try:
            translator.set_branch_weights(
                args.branch_weights, seed=args.seed, only=args.branch_weights_in
            )
        except ValueError as e:
            raise ConfigError(f"--branch-weights-in {e}") from None
        name += f".{args.branch_weights}"
        if args.branch_weights == "random":  # each draw its own files
            name += f"-seed{args.seed}"
        if args.branch_weights_in:  # each choice of sublayers its own files
            room = NAME_MAX - SUFFIX_ROOM - len(name.encode()) - len("-in-")
            name += "-in-" + sublayers_tag(args.branch_weights_in, room)
    if ensemble is not None:  # each ensemble its own files
        tag = json.dumps([str(Path(r).resolve()) for r in args.ensemble] + ensemble["weights"])
        name += ".ensemble-" + hashlib.sha256(tag.encode()).hexdigest()[:8]
    if args.quantize != "none":  # its own files: never the float32 evaluation's
        name += f".{args.quantize}"
    if translator.int8_kernels == "onednn":  # and never the FBGEMM one's
        name += ".onednn"
    if args.engine != "pytorch":
        name += f".{args.engine}"
    lenpen = decode_overrides(translator, args)
    d = translator.config.decode
    if args.lenpen is not None or args.lenpen_form is not None:
        name += f".lenpen{d.length_penalty:g}-{d.length_penalty_form}"
    if args.max_len_a is not None or args.max_len_b is not None:
        name += f".maxlen{d.max_len_a:g}-{d.max_len_b}"
    beam = args.beam or translator.config.decode.beam
    if beam != translator.config.decode.beam:  # --beam 2, then the run's beam: two files
        name += f".beam{beam}"
    if args.tokenize != "13a":  # scored otherwise: its own scores beside the 13a ones
        name += f".tok-{args.tokenize}"
    print(f"translating {len(src):,} sentences with beam {beam}", file=sys.stderr)
    start = time.perf_counter()
    hyps = translator.translate(src, beam=args.beam)
    seconds = time.perf_counter() - start
    scored = score_corpus(  # and the literature's
        hyps, refs, translator.config.data.tgt_lang, tokenize=args.tokenize
    )
    scores = scored | {  # what was scored (a corpus split, or the two files) and how decoded
        "source": source, "beam": beam, "branch_weights": args.branch_weights,
        "seed": args.seed if args.branch_weights == "random" else None,
        "branch_weights_in": args.branch_weights_in,
        "quantize": args.quantize, "int8_kernels": translator.int8_kernels,
        "int8_product": translator.int8_product, "int8_weight_bits": translator.int8_weight_bits,
        "engine": args.engine, "weights": args.weights,
    }  # fmt: skip
    d = translator.config.decode
    scores["length_penalty"] = {"alpha": d.length_penalty, "form": d.length_penalty_form}
    scores["max_len"] = {"a": d.max_len_a, "b": d.max_len_b}  # at most a·|x| + b tokens
    if ensemble is not None:
        scores["ensemble"] = ensemble
    out = Path(args.run_dir) / "eval"
    out.mkdir(exist_ok=True)
    replaced = write_hypotheses(out, name, hyps)  # an earlier, other decoding kept, not lost
    if replaced is not None:
        print(f"the earlier {name}.hyp differed: kept as {replaced}", file=sys.stderr)
    # the run's own split, decoded as `wtnmt analyze` decodes it: kept for it to read where κ,
    # α are replaced in every sublayer if at all; a sublayer's evaluation says so in its scores
    split = _analyzed_split(translator, args, src, refs, lenpen)
    scores["run_split"] = split
    if split is not None and not args.branch_weights_in and args.tokenize == "13a":
        from wtnmt.analysis.scoring import keep_decoding

        kept = keep_decoding(
            Path(args.run_dir), scored, split=split, beam=beam, weights=args.weights,
            branch_weights=args.branch_weights, hypotheses=f"eval/{name}.hyp", seconds=seconds,
            seed=args.seed if args.branch_weights == "random" else 0,  # its seed names a draw
        )  # fmt: skip
        print(f"the run's {split} split: kept for `wtnmt analyze` as {kept}", file=sys.stderr)
    if args.compare:
        other = Translator.load(args.compare, device=args.device).translate(src, beam=args.beam)
        scores["compare"] = {
            "run": str(args.compare),
            **paired_bootstrap(refs, hyps, other, samples=args.samples, tokenize=args.tokenize),
        }
    record_scores(out, name, scores)  # and a line of eval/history.jsonl
    update_scores(Path(args.run_dir) / "scores.json", scores)
    print(scores_text(scores))
    if args.compare:
        c = scores["compare"]
        print(
            f"vs {args.compare}: BLEU {c['bleu']:.2f} ± {c['ci95']:.2f} against "
            f"{c['baseline_bleu']:.2f} ± {c['baseline_ci95']:.2f}, p = {c['p_value']:.4f} "
            f"(paired bootstrap)"
        )
    print(f"hypotheses: {out / (name + '.hyp')}   scores: {Path(args.run_dir) / 'scores.json'}")
    return 0


def scores_text(scores: dict) -> str:  # type: ignore[type-arg]
    """What evaluate prints: each score with its sacreBLEU signature."""
    return (
        f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  TER {scores['ter']:.2f}  "
        f"({scores['n_sentences']} sentences)\n{scores['signature']}\n"
        f"{scores['chrf_signature']}\n{scores['ter_signature']}\n"
        f"lowercased BLEU {scores['bleu_lc']:.2f}; on lowercased Moses tokens "
        f"{scores['bleu_moses']:.2f} (the Multi30k literature's BLEU)"
    )


# what decodes: meaningless where the translation is given (--hyp)
_DECODING = {
    "beam": "--beam", "lenpen": "--lenpen", "lenpen_form": "--lenpen-form",
    "max_len_a": "--max-len-a", "max_len_b": "--max-len-b", "compare": "--compare",
    "branch_weights_in": "--branch-weights-in", "src": "--src", "ensemble": "--ensemble",
    "ensemble_weights": "--ensemble-weights",
}  # fmt: skip


def score_given(args: argparse.Namespace) -> int:
    """``evaluate --hyp FILE``: a translation made elsewhere scored against the references
    (--ref, or the run's --split / --corpus), as evaluate scores its own; printed, nothing
    decoded and nothing written into the run."""
    from wtnmt.config import load_config
    from wtnmt.decode.evaluate import check_tokenizer, score_corpus
    from wtnmt.errors import CheckpointError

    given = [option for key, option in _DECODING.items() if getattr(args, key, None)]
    if args.branch_weights != "learned":
        given.append("--branch-weights")
    if args.quantize != "none":
        given.append("--quantize")
    if given:
        raise ConfigError(
            f"--hyp scores a translation already made: {', '.join(given)} "
            f"{'decides' if len(given) == 1 else 'decide'} how to make one; leave "
            f"{'it' if len(given) == 1 else 'them'} out"
        )
    if args.corpus and args.ref:
        raise ConfigError("give --corpus NAME or --ref, not both")
    check_tokenizer(args.tokenize)
    try:
        data = load_config(Path(args.run_dir) / "config.yaml").data
    except FileNotFoundError:
        raise CheckpointError(f"{args.run_dir}: no config.yaml there; is it a run?") from None
    if args.ref is not None:
        refs, source = read_input(args.ref), {"hyp": str(args.hyp), "ref": str(args.ref)}
    else:
        from wtnmt.data.prepare import raw_split

        if args.corpus:
            data = dataclasses.replace(
                data, corpus=args.corpus, train_src=None, train_tgt=None, train_tsv=None
            )
        refs = [pair[1] for pair in raw_split(data, args.split)]
        source = {"hyp": str(args.hyp), "split": args.split, "corpus": args.corpus}
    hyps = read_input(args.hyp)
    if len(hyps) != len(refs):
        raise ConfigError(
            f"--hyp {args.hyp} has {len(hyps)} lines but the references have {len(refs)}"
        )
    if not refs:
        raise ConfigError(f"--hyp {args.hyp}: no lines to score")
    scores = score_corpus(hyps, refs, data.tgt_lang, tokenize=args.tokenize)
    print(scores_text(scores))
    print(f"(scored {args.hyp}: {source})", file=sys.stderr)
    return 0
