"""The Python API: a trained run as a translator.

    from wtnmt import Translator
    t = Translator.load("runs/weighted-small")
    t.translate(["How are you?"], beam=4)      # → ["Wie geht es dir?"]
    t.score(["How are you?"], ["Wie geht es dir?"])   # log-probabilities

Loading reads the run's ``config.yaml``, ``spm.model`` and ``model.safetensors``; it never
unpickles anything.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from wtnmt.config import RunConfig
from wtnmt.config.sections import MAX_BEAM
from wtnmt.data.vocab import Vocabularies
from wtnmt.decode.alignment import AlignmentSource, align
from wtnmt.decode.attention import LayerAttention, cross_attention
from wtnmt.decode.batches import cut_to, length_batches, padded, prefix_tensor
from wtnmt.decode.engines import chosen_engine, ensemble_network, native_network
from wtnmt.decode.sampling import Sampling
from wtnmt.decode.scoring import log_probabilities
from wtnmt.decode.search import search_batch
from wtnmt.decode.workers import ENGINES as WORKER_ENGINES
from wtnmt.decode.workers import SearchWorkers
from wtnmt.model import (
    BranchWeights,
    decoding_mode,
    override_branch_weights,
    quantize_decoding,
)
from wtnmt.model.packed import int8_kernels, int8_narrow_weights
from wtnmt.rundir import load_run


@dataclass(frozen=True)
class Translation:
    text: str
    # length-normalised log-probability (beam) or log-probability (greedy, sampling)
    score: float
    ids: tuple[int, ...] = ()  # the output's piece ids, without BOS/EOS


def _warn(message: str) -> None:
    print(f"wtnmt: warning: {message}", file=sys.stderr)


def _note(message: str) -> None:
    print(f"wtnmt: {message}", file=sys.stderr)


class Translator:
    """A trained run loaded for decoding: its model, vocabularies and decoding settings
    (``config.decode``), searched by the engine ``load`` chose. Made with
    ``Translator.load(RUN)``; every method takes raw sentences (or their ids) and returns
    detokenised text (or hypotheses with their tokens and scores)."""

    def __init__(
        self,
        model,
        vocab: Vocabularies,
        config: RunConfig,  # type: ignore[no-untyped-def]
        device: torch.device,
    ) -> None:
        self.model, self.vocab, self.config, self.device = model.eval(), vocab, config, device
        self._workers: SearchWorkers | None = None  # start_workers
        # what search runs: the model, or its export in ONNX Runtime (use_onnxruntime)
        self.network = self.model
        self.max_source = model.positions.max_positions - 1  # room for EOS
        # whether there are κ, α to show or override (a Weighted Transformer)
        self.has_branch_weights = any(isinstance(m, BranchWeights) for m in model.modules())

    @classmethod
    def load(
        cls,
        run_dir: str | Path,
        *,
        device: str = "cpu",
        weights: str = "model.safetensors",
        quantize: Literal["none", "int8"] = "none",
        engine: Literal["auto", "pytorch", "native", "onnxruntime"] = "pytorch",
        onnx_dir: str | Path | None = None,
        say: Callable[[str], None] = _note,
    ) -> Translator:
        """``quantize="int8"``: decode with int8 linear layers (CPU only; see model/packed.py).
        ``engine="onnxruntime"``: search runs the network exported to ONNX (``onnx_dir``,
        default RUN/onnx, exported there on first use; CPU only; decode/onnx_engine.py).
        ``engine="native"``: the search and the decoder step in C++ over the model's own
        weights and kernels (CPU only; compiled on first use; decode/native).
        ``engine="auto"``: native where it can run (the CPU, a compiler, the kernels it
        multiplies with), PyTorch otherwise (``say`` is told why). The default here is
        ``"pytorch"``, where ``wtnmt translate`` and ``serve`` use ``auto``: a program's
        results do not depend on the machine's tools (the translations are the same)."""
        engine, auto = chosen_engine(engine, device)
        config, vocab, model = load_run(run_dir, weights=weights)
        if engine == "onnxruntime":
            from wtnmt.decode.onnx_engine import load_network

            translator = cls(model, vocab, config, torch.device("cpu"))
            translator.network = load_network(
                run_dir, directory=onnx_dir, weights=weights, quantize=quantize, say=say
            )
            return translator
        if quantize != "none":
            quantize_decoding(model, quantize)
        translator = cls(model.to(device), vocab, config, torch.device(device))
        if engine == "native":
            translator.network = native_network(translator.model, auto=auto, say=say)
        return translator

    @property
    def engine(self) -> Literal["pytorch", "native", "onnxruntime"]:
        """What runs the search."""
        if self.network is self.model:
            return "pytorch"
        return getattr(self.network, "engine", "onnxruntime")  # type: ignore[no-any-return]

    @property
    def quantize(self) -> Literal["none", "int8"]:
        """How the network's linear layers decode (``quantize_decoding``, or the export's
        int8 graphs)."""
        if self.network is not self.model:
            return self.network.quantize  # type: ignore[no-any-return]
        return decoding_mode(self.model)

    @property
    def int8_kernels(self) -> str | None:
        """The library the int8 products multiply through (``fbgemm``, or ``onednn`` under
        ``WTNMT_INT8_KERNELS=onednn``); None in float32, and for ONNX Runtime's own int8."""
        if self.quantize == "none" or self.engine == "onnxruntime":
            return None
        return int8_kernels()

    @property
    def int8_product(self) -> str | None:
        """Who multiplies the int8 products: the library (as ``int8_kernels``), or on the
        native engine its own kernel where it takes it (``int8.h-avx-vnni``,
        ``int8.h-avx512-vnni``, ``int8.h-portable``: ``WTNMT_NATIVE_INT8``, network.py's
        ``own_int8_lanes``, as its workers decide too); None where int8_kernels is None."""
        kernels = self.int8_kernels
        if kernels is None or self.engine != "native":
            return kernels
        from wtnmt.decode.native import extension
        from wtnmt.decode.native.network import int8_product_name, own_int8_lanes

        return int8_product_name(own_int8_lanes(extension().int8_builds()), kernels)

    @property
    def int8_weight_bits(self) -> int | None:
        """The int8 weights' bits: 8, or 7 where those kernels add pairs of products in 16
        bits (no VNNI: int8_narrow_weights); None where int8_kernels is None."""
        kernels = self.int8_kernels
        return None if kernels is None else 7 if int8_narrow_weights(kernels) else 8

    def ensemble(
        self,
        runs: Sequence[str | Path],
        *,
        weights: Sequence[float] | None = None,
        weights_file: str = "model.safetensors",
    ) -> None:
        """Decode with this run's model and those of ``runs`` together, each step's
        probabilities their ``weights``' mean (equal unless given; decode/ensemble.py): the
        runs share this one's vocabularies, on the PyTorch or native engine, in this process."""
        from wtnmt.decode.ensemble import join_runs

        self.close()
        self.network = ensemble_network(join_runs(self, runs, weights, weights_file), self.network)

    def set_branch_weights(
        self, how: str, *, seed: int = 0, only: Sequence[str] | None = None
    ) -> None:
        """Replace κ, α by ``uniform`` or ``random`` ones (paper Table 3), in every branched
        sublayer or in those named in ``only``; reload to undo. The PyTorch and native engines
        decode with them (the native engine reads the model's weights at every batch); not
        ONNX Runtime, whose export holds the learned ones. Stops the decoding workers (they
        hold the learned ones)."""
        if self.engine == "onnxruntime":
            raise ValueError(
                "κ, α are overridden in the PyTorch and native engines (the ONNX export holds "
                "the learned ones)"
            )
        self.close()
        override_branch_weights(self.model, how, seed=seed, only=only)  # type: ignore[arg-type]

    # ---------------------------------------------------------------------------------------
    def encode(
        self,
        sentences: Sequence[str],
        warn: Callable[[str], None] = _warn,
        first_line: int = 1,
        label: str = "line {}",
    ) -> list[list[int]]:
        """Sentences → piece ids, each cut to the model's maximum source length (with a
        warning naming it by ``label``, numbered from ``first_line``)."""
        ids = self.vocab.source.encode(sentences)
        return cut_to(ids, self.max_source, warn, first_line, label)

    def translate_nbest(
        self,
        sentences: Sequence[str],
        *,
        beam: int | None = None,
        nbest: int = 1,
        min_len: int = 0,
        max_len: int | None = None,
        warn: Callable[[str], None] = _warn,
        first_line: int = 1,
        prefixes: Sequence[str] | None = None,
        sampling: Sampling | None = None,
    ) -> list[list[Translation]]:
        """The ``nbest`` best translations of each sentence, best first (an empty sentence
        gives one empty translation). Warnings number lines from ``first_line``.

        ``prefixes``: a target prefix a sentence ("" for none) that every translation of it
        begins with, the search continuing after it (its pieces' log-probabilities counted in
        the score). ``sampling`` (``wtnmt.decode.sampling.Sampling``): ``sampling.samples``
        translations a sentence drawn from the model, in the order drawn, instead of a search
        (``beam`` and ``nbest`` unused); their score is their log-probability."""
        ids = self.encode(sentences, warn, first_line)
        forced = None
        if prefixes is not None:
            forced = self.encode_prefixes(prefixes, len(ids), warn, first_line, "prefix of line {}")
        return self.translate_ids(
            ids,
            beam=beam,
            nbest=nbest,
            min_len=min_len,
            max_len=max_len,
            prefixes=forced,
            sampling=sampling,
        )

    def encode_prefixes(
        self,
        prefixes: Sequence[str],
        count: int,
        warn: Callable[[str], None] = _warn,
        first_line: int = 1,
        label: str = "prefix {}",
    ) -> list[list[int]]:
        """Target prefixes → the target vocabulary's piece ids, one a sentence of ``count``,
        each cut to the longest output the model has positions for (with a warning naming it
        by ``label``, numbered from ``first_line``)."""
        if len(prefixes) != count:
            raise ValueError(f"prefixes: {len(prefixes)} for {count} sentences; give one each")
        ids = self.vocab.target.encode(prefixes)
        return cut_to(ids, self.model.max_positions - 2, warn, first_line, label)

    def translate_ids(
        self,
        ids: list[list[int]],
        *,
        beam: int | None = None,
        nbest: int = 1,
        min_len: int = 0,
        max_len: int | None = None,
        batch_tokens: int | None = None,
        prefixes: list[list[int]] | None = None,
        sampling: Sampling | None = None,
    ) -> list[list[Translation]]:
        """``translate_nbest`` of sentences already encoded (``encode``, ``encode_prefixes``):
        batches sorted by length under ``batch_tokens`` padded source tokens (default:
        decode.batch_tokens)."""
        d = self.config.decode
        if beam is not None and not 1 <= beam <= MAX_BEAM:
            raise ValueError(f"beam={beam}: allowed 1 to {MAX_BEAM}")
        options = {
            "beam": d.beam if beam is None else beam,
            "nbest": nbest,
            "alpha": d.length_penalty,
            "penalty_form": d.length_penalty_form,
            "max_len_a": d.max_len_a,
            "max_len_b": d.max_len_b,
            "min_len": min_len,
            "max_len": max_len,
        }
        if sampling is not None:
            options["sampling"] = sampling
        results: list[list[Translation]] = [[Translation("", 0.0)] for _ in ids]
        batches = length_batches(ids, batch_tokens or d.batch_tokens)
        sources = [padded([ids[i] for i in batch], self.device) for batch in batches]
        forced: list[dict] = [{} for _ in batches]  # type: ignore[type-arg]
        if prefixes is not None:
            forced = [
                {"target_prefix": prefix_tensor([prefixes[i] for i in b], self.device)}
                for b in batches
            ]
        if self._workers is not None:
            found = self._workers.search(sources, forced, **options)
        else:
            found = (
                search_batch(self.network, src, **options, **more)
                for src, more in zip(sources, forced, strict=True)
            )
        for batch, hyps in zip(batches, found, strict=True):
            for i, best in zip(batch, hyps, strict=True):
                results[i] = [
                    Translation(self.vocab.target.decode(h.tokens), h.score, tuple(h.tokens))
                    for h in best
                ]
        return results

    def start_workers(self, workers: int, *, threads: int = 1) -> None:
        """Decode on ``workers`` processes of ``threads`` threads each, every one searching
        whole batches with this translator's engine (PyTorch or native; decode/workers.py),
        until ``close``. CPU only."""
        if self.device.type != "cpu":
            raise ValueError(f"decoding workers run on the CPU, not {self.device}")
        if getattr(self.network, "is_ensemble", False):
            raise ValueError("an ensemble decodes in this process, not on workers")
        if self.engine not in WORKER_ENGINES:
            raise ValueError(
                f"decoding workers run the PyTorch or native engine, not {self.engine}"
            )
        self.close()
        self._workers = SearchWorkers(
            self.model,
            model_config=self.config.model,
            int8=self.quantize == "int8",
            workers=workers,
            threads=threads,
            engine=self.engine,
        )

    def close(self) -> None:
        """Stop the decoding workers, if any (decoding goes on in this process)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def cross_attention(
        self, sources: list[list[int]], outputs: list[list[int]]
    ) -> list[list[LayerAttention]]:
        """Per sentence and decoder layer, where each branch (head) attended while producing
        ``outputs`` from ``sources`` (piece ids, as ``encode`` and ``Translation.ids`` give)."""
        return cross_attention(self.model, sources, outputs, device=self.device)

    def pieces(self, ids: Sequence[int], *, source: bool = False) -> list[str]:
        """Piece ids of the target (or ``source``) → their sentencepiece strings (for
        labelling attention maps)."""
        vocab = self.vocab.source if source else self.vocab.target
        return [vocab.sp.id_to_piece(int(i)) for i in ids]

    def translate(
        self,
        sentences: Sequence[str],
        *,
        beam: int | None = None,
        prefixes: Sequence[str] | None = None,
        sampling: Sampling | None = None,
    ) -> list[str]:
        """The best translation of each sentence (raw text in, detokenised text out, one for
        one, in order), by beam search of ``beam`` (default: the run's ``decode.beam``); each
        beginning with its ``prefixes`` entry where given; with ``sampling``, the first
        translation drawn (``translate_nbest`` for several)."""
        found = self.translate_nbest(sentences, beam=beam, prefixes=prefixes, sampling=sampling)
        return [n[0].text for n in found]

    def alignments(
        self,
        sentences: Sequence[str],
        translations: Sequence[Translation],
        how: AlignmentSource | None = None,
    ) -> list[list[tuple[int, int]]]:
        """For each sentence and its translation (``translate_nbest``'s), the (source, output)
        position pairs that align, by word unless ``how`` says pieces, read from the
        cross-attention (decode/alignment.py: the penultimate decoder layer, every head,
        branches weighted by κ, unless ``how`` names others)."""
        sources = [s[: self.max_source] for s in self.vocab.source.encode(sentences)]
        outputs = [list(t.ids) for t in translations]
        chosen = how or AlignmentSource()
        return align(self.model, self.vocab, sources, outputs, chosen, device=self.device)

    def score(self, src: Sequence[str], hyp: Sequence[str]) -> list[float]:
        """log P(hyp | src) of each pair under the model (EOS included)."""
        if len(src) != len(hyp):
            raise ValueError(f"score: {len(src)} sources but {len(hyp)} hypotheses")
        return log_probabilities(self.model, self.encode(src), self.encode(hyp), self.device)
