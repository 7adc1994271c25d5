"""`wtnmt translate`, and what `wtnmt evaluate` (commands/evaluating.py) shares with it:
decoding with a run's weights, given parsed arguments (the parser is in
``commands/decoding_args.py``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import sys
from pathlib import Path

from wtnmt.config import ConfigError

NAME_MAX = 255  # bytes of a file name on the usual filesystems
SUFFIX_ROOM = 64  # what may follow the sublayers in a name: .int8, .lenpen…, .beamN, .scores.json


def read_input(path: str | None):  # type: ignore[no-untyped-def]
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


_OPTIONS = {
    "length_penalty": "--lenpen",
    "length_penalty_form": "--lenpen-form",
    "max_len_a": "--max-len-a",
    "max_len_b": "--max-len-b",
    "beam": "--beam",
}


def decode_overrides(translator, args: argparse.Namespace) -> bool:  # type: ignore[no-untyped-def]
    """--lenpen, --lenpen-form, --max-len-a and --max-len-b in place of the run's decode
    settings, and --beam checked with them, as a config is (a ConfigError naming the
    option); whether any of the four was given."""
    given = {
        "length_penalty": args.lenpen,
        "length_penalty_form": args.lenpen_form,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
    }
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


_SAMPLING = {
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "seed": "--seed",
}


def sampling_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """--sampling and its options as a Sampling (None without --sampling); a ConfigError
    naming the option where one is out of bounds or given without --sampling."""
    from wtnmt.decode.sampling import Sampling

    given = {k: getattr(args, k) for k in _SAMPLING if getattr(args, k) is not None}
    if not args.sampling:
        if given:
            raise ConfigError(f"{_SAMPLING[next(iter(given))]} draws tokens: add --sampling")
        return None
    if args.beam is not None and args.beam > 1:
        raise ConfigError(
            f"--sampling draws each token, --beam {args.beam} searches: give one of the two"
        )
    try:
        return Sampling(samples=args.nbest or 1, **given)
    except ValueError as e:
        text = str(e).replace("samples=", "--nbest ")
        for key, option in _SAMPLING.items():
            text = text.replace(f"{key}=", f"{option} ")
        raise ConfigError(text) from None


def ensemble_options(args: argparse.Namespace) -> list[float] | None:
    """--ensemble-weights as numbers, checked with --ensemble, --engine (which becomes
    pytorch from auto) and --workers; a ConfigError naming the option."""
    from wtnmt.decode.ensemble import ensemble_arguments

    try:
        args.engine, weights = ensemble_arguments(args.ensemble, args.ensemble_weights, args.engine)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.ensemble and getattr(args, "workers", 1) > 1:
        raise ConfigError(f"--ensemble decodes in this process, not on --workers {args.workers}")
    return weights


def alignment_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """--alignment and its layer and heads (None without --alignment); a ConfigError naming
    the option."""
    from wtnmt.decode.alignment import AlignmentSource

    if args.alignment is None:
        for option in ("alignment_layer", "alignment_heads"):
            if getattr(args, option) is not None:
                raise ConfigError(f"--{option.replace('_', '-')} reads alignments: add --alignment")
        return None
    heads = None
    if args.alignment_heads is not None:
        try:
            heads = tuple(int(h) for h in args.alignment_heads.split(","))
        except ValueError:
            raise ConfigError(
                f"--alignment-heads {args.alignment_heads}: head numbers from 1, e.g. 1,3"
            ) from None
    return AlignmentSource(layer=args.alignment_layer, heads=heads, level=args.alignment)


def check_alignment(translator, how) -> None:  # type: ignore[no-untyped-def]
    """The layer and heads ``how`` names exist in the model (a ConfigError naming the
    option), and where alignments are read from said on stderr once."""
    from wtnmt.decode.alignment import describe

    model = translator.model
    try:
        layer = how.layer_of(len(model.decoder_layers))
        branches = translator.config.model.branch_numbers("decoder", layer)
        for head in how.heads or ():
            if not 1 <= head <= len(branches):
                raise ValueError(f"head {head}: layer {layer}'s are 1 to {len(branches)}")
    except ValueError as e:
        option = "--alignment-heads" if "head" in str(e) else "--alignment-layer"
        raise ConfigError(f"{option}: {e}") from None
    print(f"wtnmt translate: {describe(model, how)}", file=sys.stderr)


class PrefixLines:
    """The lines of --prefix FILE, handed out in step with the input's chunks."""

    def __init__(self, path: str) -> None:
        from wtnmt.data.io import stream_lines

        self.path = path
        self._chunks = stream_lines(path, chunk=2000)
        self._buffer: list[str] = []
        self._read = 0

    def take(self, n: int) -> list[str]:
        while len(self._buffer) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                raise ConfigError(
                    f"--prefix {self.path}: {self._read + len(self._buffer)} lines, fewer than "
                    f"the input's; give one prefix a line (an empty line for none)"
                )
            self._buffer += chunk[1]
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        self._read += n
        return out

    def check_used_up(self) -> None:
        if self._buffer or next(self._chunks, None) is not None:
            raise ConfigError(
                f"--prefix {self.path}: more lines than the input's {self._read}; give one "
                f"prefix a line"
            )


def cmd_translate(args: argparse.Namespace) -> int:
    from wtnmt.data.io import stream_lines
    from wtnmt.decode.alignment import format_links
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
    ensemble_weights = ensemble_options(args)
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
    sampling = sampling_options(args)
    aligned = alignment_options(args)
    prefixes = None if args.prefix is None else PrefixLines(args.prefix)

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
    decode_overrides(translator, args)
    if args.ensemble:
        try:
            translator.ensemble(args.ensemble, weights=ensemble_weights, weights_file=args.weights)
        except ValueError as e:
            raise ConfigError(f"--ensemble {e}") from None
    beam = args.beam or translator.config.decode.beam
    nbest = args.nbest or translator.config.decode.nbest
    if sampling is not None:
        nbest = sampling.samples
    elif nbest > beam:
        given = f"--nbest {nbest}" if args.nbest else f"decode.nbest={nbest} (the run's config)"
        raise ConfigError(f"{given} is more than the beam size {beam}: raise --beam")
    if aligned is not None:
        check_alignment(translator, aligned)
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
                    prefixes=None if prefixes is None else prefixes.take(len(chunk)),
                    sampling=sampling,
                )
                links = None
                if aligned is not None:
                    flat = [(chunk[i], t) for i, options in enumerate(results) for t in options]
                    found = translator.alignments(
                        [s for s, _ in flat], [t for _, t in flat], aligned
                    )
                    links = iter(format_links(f) for f in found)
                for i, options in enumerate(results):
                    lines = (
                        [options[0].text]
                        if nbest == 1
                        else nbest_lines(first - 1 + i, options, nbest)
                    )
                    if links is not None:
                        said = [f"{line} ||| {next(links)}" for line in lines[: len(options)]]
                        lines = said + [f"{line} ||| " for line in lines[len(options) :]]
                    out.write("".join(line + "\n" for line in lines))
                out.flush()
                progress.done(len(chunk))
            if prefixes is not None:
                prefixes.check_used_up()
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
