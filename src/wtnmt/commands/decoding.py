"""`wtnmt translate` and `wtnmt evaluate`: decoding with a run's weights, given parsed
arguments (the parser is in ``wtnmt.cli``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import sys
import time
from pathlib import Path

from wtnmt.config import ConfigError

NAME_MAX = 255  # bytes of a file name on the usual filesystems
SUFFIX_ROOM = 64  # what may follow the sublayers in a name: .int8, .lenpen…, .beamN, .scores.json


def _read_input(path: str | None):  # type: ignore[no-untyped-def]
    """Lines of a file or of stdin, split on \\n only, strict UTF-8."""
    from wtnmt.data.io import decode_lines, read_bytes

    if path in (None, "-"):
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return decode_lines(read_bytes(path), path)


def sublayers_tag(names: list[str], room: int) -> str:
    """The sublayers of ``--branch-weights-in`` in a file name: their names joined by "+", or,
    where that takes more than ``room`` bytes, their count and a digest of them (the scores
    name them all)."""
    joined = "+".join(names)
    if len(joined.encode()) <= room:
        return joined
    return f"{len(names)}-sublayers-{hashlib.sha256(joined.encode()).hexdigest()[:12]}"


def _check_output_file(path: str, source: str | None) -> None:
    from wtnmt.safe_files import is_same_file

    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"-o {path}: is a directory; -o names the file to write")
    if not out.parent.is_dir():
        raise ConfigError(f"-o {path}: the directory {out.parent} does not exist")
    if source not in (None, "-") and is_same_file(path, source):
        raise ConfigError(
            f"-o {path}: is the input file -i {source}; write the translations elsewhere"
        )


def nbest_lines(index: int, options, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """``i ||| translation ||| score`` lines (Moses' n-best format, sentences counted from 0),
    exactly ``n`` of them: places the search found no hypothesis for score -inf."""
    lines = [f"{index} ||| {t.text} ||| {t.score:.4f}" for t in options[:n]]
    return lines + [f"{index} |||  ||| -inf"] * (n - len(lines))


def check_float32_kernels(device: str) -> None:
    """``WTNMT_FLOAT32_KERNELS`` checked on every CPU decoding, whatever the precision: an
    int8 model's float32 products (its embeddings' output, attention) read it too, and a
    misspelt name must not pass unseen under one option and fail under another."""
    if device == "cpu":
        from wtnmt.model.float32_kernels import float32_kernels

        float32_kernels()  # EngineUnavailable (one line) for a name it does not know


def check_weights_name(weights: str) -> None:
    """--weights names a file inside the run directory (a checkpoint under it will do)."""
    path = Path(weights)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ConfigError(
            f"--weights {weights}: a file in the run directory, by its path there (e.g. "
            f"average-last10.safetensors or checkpoints/step_0000400.safetensors)"
        )


_OPTIONS = {"length_penalty": "--lenpen", "length_penalty_form": "--lenpen-form", "beam": "--beam"}


def _length_penalty(translator, args: argparse.Namespace) -> bool:  # type: ignore[no-untyped-def]
    """--lenpen and --lenpen-form in place of the run's decode settings, and --beam checked
    with them, as a config is (a ConfigError naming the option); whether --lenpen or
    --lenpen-form was given."""
    given = {"length_penalty": args.lenpen, "length_penalty_form": args.lenpen_form}
    changes = {key: value for key, value in given.items() if value is not None}
    try:
        decode = dataclasses.replace(translator.config.decode, **changes)
        if args.beam is not None:
            dataclasses.replace(decode, beam=args.beam, nbest=1)
    except ConfigError as e:
        text = str(e)
        for key, option in _OPTIONS.items():
            text = text.replace(f"decode.{key}=", f"{option} ")
        raise ConfigError(text) from None
    if changes:
        translator.config = dataclasses.replace(translator.config, decode=decode)
    return bool(changes)


def cmd_translate(args: argparse.Namespace) -> int:
    from wtnmt.data.io import stream_lines
    from wtnmt.runtime import (
        check_device,
        check_engine,
        check_quantize,
        threads_warning,
        tune_cpu_allocator,
    )

    for option in ("beam", "nbest", "chunk", "threads", "workers"):  # before the model loads
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ConfigError(f"--{option} {value}: must be at least 1")
    if (said := threads_warning(args.threads)) is not None:
        print(f"wtnmt translate: warning: {said}", file=sys.stderr)
    check_quantize(args.quantize, args.device)
    if args.engine == "auto" and args.device != "cpu":
        args.engine = "pytorch"  # (what decodes on GPUs)
    check_engine(args.engine, args.device)
    check_device(args.device)
    if args.workers > 1 and args.engine == "onnxruntime":
        raise ConfigError(
            f"--workers {args.workers} runs the PyTorch or native engine; --engine "
            "onnxruntime decodes on --threads in this process"
        )
    if args.workers > 1 and args.device != "cpu":
        raise ConfigError(
            f"--workers {args.workers} decodes on the CPU only, not --device {args.device}"
        )
    if args.output:
        _check_output_file(args.output, args.input)
    check_weights_name(args.weights)

    import torch

    from wtnmt.decode.translator import Translator

    tune_cpu_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    check_float32_kernels(args.device)
    translator = Translator.load(
        args.run_dir,
        device=args.device,
        quantize=args.quantize,
        engine=args.engine,
        weights=args.weights,
    )
    _length_penalty(translator, args)
    beam = args.beam or translator.config.decode.beam
    nbest = args.nbest or translator.config.decode.nbest
    if nbest > beam:
        given = f"--nbest {nbest}" if args.nbest else f"decode.nbest={nbest} (the run's config)"
        raise ConfigError(f"{given} is more than the beam size {beam}: raise --beam")
    from wtnmt.commands.progress import Progress, count_lines

    progress = Progress("translated", count_lines(args.input), "line")
    try:
        with _output(args.output) as out:
            if args.workers > 1:  # the threads shared among them
                threads = max(1, torch.get_num_threads() // args.workers)
                translator.start_workers(args.workers, threads=threads)
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
                        [options[0].text]
                        if nbest == 1
                        else nbest_lines(first - 1 + i, options, nbest)
                    )
                    out.write("".join(line + "\n" for line in lines))
                out.flush()
                progress.done(len(chunk))
    finally:
        translator.close()
    progress.close()
    return 0


@contextlib.contextmanager
def _output(path: str | None):  # type: ignore[no-untyped-def]
    """Standard output, or the file ``-o`` names, which appears whole when the command
    succeeds (a temporary file beside it until then: a failure leaves the old file)."""
    if not path or path == "-":
        yield sys.stdout
        return
    from wtnmt.safe_files import output_file

    with output_file(path) as out:
        yield out


def _analyzed_split(translator, args, src, refs, lenpen: bool) -> str | None:  # type: ignore[no-untyped-def]
    """The split of the run's own data that `wtnmt evaluate` has just decoded as `wtnmt
    analyze` decodes it (the same pairs; the PyTorch engine in float32, with the run's length
    penalty), or None."""
    from wtnmt.analysis.scoring import split_pairs
    from wtnmt.data import DataError
    from wtnmt.safe_files import is_same_file

    if args.engine != "pytorch" or args.quantize != "none" or lenpen:
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
        src, refs = _read_input(args.src), _read_input(args.ref)
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
    if args.quantize != "none":  # its own files: never the float32 evaluation's
        name += f".{args.quantize}"
    if translator.int8_kernels == "onednn":  # and never the FBGEMM one's
        name += ".onednn"
    if args.engine != "pytorch":
        name += f".{args.engine}"
    lenpen = _length_penalty(translator, args)
    if lenpen:
        d = translator.config.decode
        name += f".lenpen{d.length_penalty:g}-{d.length_penalty_form}"
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
    print(
        f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['n_sentences']} "
        f"sentences)\n{scores['signature']}\n{scores['chrf_signature']}\n"
        f"lowercased BLEU {scores['bleu_lc']:.2f}; on lowercased Moses tokens "
        f"{scores['bleu_moses']:.2f} (the Multi30k literature's BLEU)"
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
