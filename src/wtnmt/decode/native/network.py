"""A PyTorch model's decoder handed to the native engine (engine.cpp), behind the interface
decode/search.py's ``search_batch`` reads of an engine with a search of its own: ``search``.

The weights are the model's own, read at every batch (so a change of κ, α or of precision is
seen at once), and its products are multiplied by the very copies the PyTorch engine packs
(``PackedLinear.prepared``): oneDNN's or MKL's float32 layout or FBGEMM's int8 one (whose int8
values and scales int8.h's kernel takes, laid out its way, where it multiplies:
``own_int8_lanes``).
That is what makes the two engines' translations the same.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from wtnmt.decode.ensemble import Ensemble
from wtnmt.decode.hypotheses import PENALTY_FORMS, Hypothesis, greedy_hypotheses
from wtnmt.decode.native import NativeUnavailable, extension
from wtnmt.decode.sampling import Sampling
from wtnmt.decode.search import _limits
from wtnmt.model.attention import MultiHeadAttention
from wtnmt.model.branched import BranchedAttention
from wtnmt.model.float32_kernels import float32_kernels
from wtnmt.model.packed import (
    PackedLinear,
    decoding_mode,
    int8_multiplier,
    onednn_available,
    onednn_vnni,
)
from wtnmt.model.speed import fast_paths
from wtnmt.special import BOS, EOS

ONEDNN, INT8, MATMUL, OWN_INT8, MKL = 0, 1, 2, 3, 4  # engine.cpp's kinds of product
INT8_PRODUCTS = ("auto", "own", "library")  # WTNMT_NATIVE_INT8: the fused engine's int8


INT8_BUILDS = {16: "avx512-vnni", 8: "avx-vnni", 0: "portable"}  # int8.h's builds, by lanes


def own_int8_lanes(builds: list[int]) -> int | None:
    """The build of int8.h's kernel the fused native engine multiplies its int8 products
    with: 16 (AVX512-VNNI), 8 (AVX-VNNI), 0 (portable C++: slow, for tests) or None
    (PyTorch's quantized::linear_dynamic). ``builds``: those this CPU runs (the extension's
    ``int8_builds()``). ``WTNMT_NATIVE_INT8``: ``auto`` (the default) takes the widest VNNI
    build (in decoding it ran 1.12-1.19x as fast as FBGEMM's product with AVX512-VNNI, and
    as fast as it or faster where FBGEMM has only AVX2 kernels: docs/BENCHMARKS.md), None
    without VNNI; ``own`` the widest build there is, the portable one too; ``library`` None.
    Held, as the tests emulate older CPUs (tests/isa_ladder.py), to the VNNI oneDNN reaches
    (``onednn_vnni``: ``ONEDNN_MAX_CPU_ISA``) and by ``ATEN_CPU_CAPABILITY``, as the float
    kernels are (avx2: 8 lanes at most; default: no VNNI)."""
    chosen = os.environ.get("WTNMT_NATIVE_INT8", "").strip().lower() or "auto"
    if chosen not in INT8_PRODUCTS:
        raise NativeUnavailable(
            f"WTNMT_NATIVE_INT8={chosen!r}: int8 products are {', '.join(INT8_PRODUCTS)}"
        )
    if chosen == "library":
        return None
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    reach = {"avx512": (16, 8), "avx": (8,), None: ()}[onednn_vnni()]
    allowed = () if aten == "default" else reach[1:] if aten == "avx2" and 16 in reach else reach
    widest = next((lanes for lanes in builds if lanes in allowed), 0)
    return widest if chosen == "own" or widest else None


def int8_product_name(lanes: int | None, kernels: str) -> str:
    """What multiplies the int8 products (Translator.int8_product): int8.h's build, or the
    library ``kernels`` names."""
    return kernels if lanes is None else f"int8.h-{INT8_BUILDS[lanes]}"


class NativeEngine:
    """Greedy and beam search of ``model`` (a Seq2Seq on the CPU, in float32, or an
    ``Ensemble`` of them: decode/ensemble.py) in C++."""

    engine = "native"  # (Translator.engine)

    def __init__(
        self,
        model: torch.nn.Module | Ensemble,
        say: Callable[[str], None] | None = None,
        *,
        fused: bool = True,
    ) -> None:
        """``say``: told before the extension is compiled (its first use). ``fused``:
        attention in engine.cpp's own single-query kernels (the default, faster): in float32
        the PyTorch engine's results up to the order of float32 sums; in int8 up to a
        quantisation step where that order puts an activation on a step's other side. Off,
        every operator is the PyTorch engine's and so is every bit."""
        self.is_ensemble = isinstance(model, Ensemble)
        self.members: list[torch.nn.Module] = list(model.models) if self.is_ensemble else [model]  # type: ignore[union-attr]
        if any(next(m.parameters()).device.type != "cpu" for m in self.members):
            raise NativeUnavailable("--engine native decodes on the CPU only")
        self.model = model
        # log w_m of an ensemble's models (its own: the PyTorch engine's very numbers)
        self._log_weights = model.log_weights if isinstance(model, Ensemble) else torch.empty(0)
        self._ext = extension(say)
        self.fused = fused
        self.int8_lanes = own_int8_lanes(self._ext.int8_builds())  # (None: the library's)
        # each PackedLinear's int8 weights laid out for int8.h: (the packed copy, its layout)
        self._own: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def check_usable(self) -> None:
        """Raises NativeUnavailable where this engine cannot decode the model at its present
        precision: it multiplies through the packed fast paths, in float32 through oneDNN or
        MKL (float32_kernels)."""
        if not fast_paths():
            raise NativeUnavailable("--engine native multiplies through the packed fast paths")
        if self.quantize != "int8" and not (onednn_available() or float32_kernels() == "mkl"):
            raise NativeUnavailable("--engine native needs PyTorch's oneDNN or MKL in float32")

    @property
    def weights(self) -> list[float]:
        """An ensemble's weights w_m (Σ w_m = 1); [1.0] for one model."""
        return list(self.model.weights) if isinstance(self.model, Ensemble) else [1.0]

    @property
    def quantize(self) -> str:
        return decoding_mode(self.members[0])  # type: ignore[no-any-return]

    def _product(
        self,
        linear: PackedLinear,
        weight: Tensor,
        bias: Tensor | None,
        rows: int,
        *,
        key: object = None,
    ):  # type: ignore[no-untyped-def]
        packed = linear.prepared(weight, bias, rows=rows, key=key)
        if linear.int8 and self.fused and self.int8_lanes is not None:  # (int8.h's kernel)
            return self._ext.Product(OWN_INT8, torch.empty(0), None, self._laid_out(linear, packed))
        if linear.int8:
            return self._ext.Product(INT8, torch.empty(0), None, packed)
        kind = MKL if linear.kernels == "mkl" else ONEDNN
        return self._ext.Product(kind, packed, None if bias is None else bias.detach(), None)

    def _laid_out(self, linear: PackedLinear, packed: object):  # type: ignore[no-untyped-def]
        """``linear``'s int8 weights (``packed``) laid out for int8.h's kernel, once a copy."""
        kept = self._own.get(linear)
        if kept is None or kept[0] is not packed:
            q, b = torch.ops.quantized.linear_unpack(packed)
            scale = q.q_per_channel_scales().float()
            own = self._ext.Int8Weight(q.int_repr(), scale, b, self.int8_lanes)
            kept = self._own[linear] = (packed, own)
        return kept[1]

    def _source(self, model: torch.nn.Module, src: Tensor):  # type: ignore[no-untyped-def]
        """The encoder's output and the cross-attention's keys and values, through the
        PyTorch ``model``; its int8 products on int8.h's kernel too where the search's are."""
        if not (self.fused and self.int8_lanes is not None and self.quantize == "int8"):
            return model.init_cache(model.encode(src))
        with int8_multiplier(lambda linear, x, packed: self._laid_out(linear, packed)(x)):
            return model.init_cache(model.encode(src))

    def _engine(self, rows: int):  # type: ignore[no-untyped-def]
        """The C++ engine over the models' weights as they are now (``rows``: the first
        step's, the hint oneDNN lays its packed copies out for)."""
        decoders = [self._decoder(model, rows) for model in self.members]
        pad = self.members[0].pad_id
        return self._ext.Engine(decoders, self._log_weights, pad, BOS, EOS, self.fused)

    def _decoder(self, model: torch.nn.Module, rows: int):  # type: ignore[no-untyped-def]
        """engine.cpp's Decoder of ``model`` (decoder.h)."""
        ext = self._ext
        empty = torch.empty(0)
        layers = []
        for layer in model.decoder_layers:
            self_attn, cross = layer.self_attn, layer.cross_attn
            proj = self_attn.attn.proj
            s_heads = self_attn.attn.heads
            s_dk = proj.weight.size(0) // 3 // s_heads
            w_out = self_attn.w_out.reshape(s_heads * s_dk, -1)
            qkv = self._product(proj._qkv, proj.weight, proj.bias, rows)
            if isinstance(self_attn, MultiHeadAttention):
                self_out = self._product(self_attn._out, w_out.t(), self_attn.out_bias, rows)
            else:  # weighted: Σ α_i κ_i head_i W^{O_i}, a plain matmul as merge_heads makes it
                kappa, alpha = self_attn.branch_weights()
                w = ((alpha * kappa)[:, None, None] * self_attn.w_out).reshape(s_heads * s_dk, -1)
                self_out = ext.Product(MATMUL, w.detach(), None, None)
            c_proj = cross.attn.proj
            c_heads = cross.attn.heads
            c_dk = c_proj.weight.size(0) // 3 // c_heads
            q_bias = None if c_proj.bias is None else c_proj.bias[: c_heads * c_dk]
            cross_q = self._product(c_proj._q, c_proj.weight[: c_heads * c_dk], q_bias, rows)
            none = ext.Product(MATMUL, empty, None, None)
            norms = [
                p.detach()
                for r in (layer.self_attn_res, layer.cross_attn_res)
                for p in (r.norm.weight, r.norm.bias)
            ]
            if isinstance(cross, BranchedAttention):
                kappa, alpha = cross.branch_weights()
                fused, w2, b2 = cross._fused_weights(kappa, alpha)
                key = None if cross._fused_cache is None else cross._fused_cache[0]
                tail = self._product(cross._tail, w2.t(), b2, rows, key=key)
                kind = 1 if cross.ffn == "split" else 2
                products = [qkv, self_out, cross_q, tail, none, none]
                branched = [
                    fused.detach().contiguous(),
                    cross.b1.detach().contiguous(),
                    alpha.detach(),
                ]
                norms += norms[2:4]  # (no FFN sublayer)
            else:
                c_out = cross.w_out.reshape(c_heads * c_dk, -1)
                ffn = layer.ffn
                products = [
                    qkv,
                    self_out,
                    cross_q,
                    self._product(cross._out, c_out.t(), cross.out_bias, rows),
                    self._product(ffn._fc1, ffn.fc1.weight, ffn.fc1.bias, rows),
                    self._product(ffn._fc2, ffn.fc2.weight, ffn.fc2.bias, rows),
                ]
                kind, branched = 0, [empty, empty, empty]
                norms += [layer.ffn_res.norm.weight.detach(), layer.ffn_res.norm.bias.detach()]
            swish = layer.ffn is not None and layer.ffn.swish
            layers.append(
                ext.Layer(kind, s_heads, s_dk, c_heads, c_dk, products, norms, branched, swish)
            )
        final = model.decoder_norm
        final_norm = [] if final is None else [final.weight.detach(), final.bias.detach()]
        embedding = model.embedding
        output = self._product(embedding._output, embedding.weight, embedding.bias, rows)
        return ext.Decoder(
            embedding.weight.detach(),
            float(embedding.scale),
            model.positions._table().detach(),
            model.pad_id,
            final is not None,
            final_norm,
            output,
            layers,
            self.fused,
        )

    @torch.inference_mode()
    def search(
        self,
        src: Tensor,
        *,
        beam: int,
        nbest: int = 1,
        alpha: float = 0.6,
        penalty_form: str = "gnmt",
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        min_len: int = 0,
        max_len: int | None = None,
        target_prefix: Tensor | None = None,
    ) -> list[list[Hypothesis]]:
        """decode/search.py's ``search_batch``, run by the native engine."""
        if not 1 <= nbest <= beam:
            raise ValueError(f"nbest={nbest} must be between 1 and beam={beam}")
        if penalty_form not in PENALTY_FORMS:
            raise ValueError(
                f"length penalty form {penalty_form!r} is not one of {', '.join(PENALTY_FORMS)}"
            )
        self.check_usable()  # (the precision may have changed)
        model = self.model
        limit = _limits(model, src, max_len_a, max_len_b, max_len, target_prefix)
        forced = _no_prefix(src) if target_prefix is None else target_prefix
        engine, source = self._engine(src.size(0)), self._source_side(src)
        if beam == 1 and nbest == 1:
            tokens, best = engine.greedy(*source, limit, min_len, forced, _NO_KEYS, 1.0, 0, 1.0)
            return [[h] for h in greedy_hypotheses(tokens, best)]
        fairseq = penalty_form == "fairseq"
        finished = engine.beam(*source, limit, min_len, beam, alpha, fairseq, forced)
        return [
            sorted((Hypothesis(list(t), s, lp) for t, s, lp in hyps), key=lambda h: -h.score)[
                :nbest
            ]
            for hyps in finished
        ]

    @torch.inference_mode()
    def sample(
        self,
        src: Tensor,
        *,
        sampling: Sampling,
        keys: Tensor,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        min_len: int = 0,
        max_len: int | None = None,
        target_prefix: Tensor | None = None,
    ) -> list[Hypothesis]:
        """decode/search.py's greedy_search with ``sampling``, run by the native engine: a
        hypothesis a row of ``src`` (rows already repeated a sample, ``keys`` theirs)."""
        self.check_usable()
        limit = _limits(self.model, src, max_len_a, max_len_b, max_len, target_prefix)
        forced = _no_prefix(src) if target_prefix is None else target_prefix
        engine, source = self._engine(src.size(0)), self._source_side(src)
        s = sampling
        tokens, best = engine.greedy(
            *source, limit, min_len, forced, keys, s.temperature, s.top_k, s.top_p
        )
        return greedy_hypotheses(tokens, best)

    def _source_side(self, src: Tensor) -> tuple[list, list, list]:  # type: ignore[type-arg]
        """Each model's cross-attention keys, values and padding bias of each layer, once a
        batch."""
        each = [self._source(model, src).layers for model in self.members]
        return (
            [[c.cross_k for c in layers] for layers in each],
            [[c.cross_v for c in layers] for layers in each],
            [[c.cross_bias for c in layers] for layers in each],
        )


_NO_KEYS = torch.empty(0, dtype=torch.long)  # greedy search's: nothing drawn


def _no_prefix(src: Tensor) -> Tensor:
    """The empty forced prefix [B, 0] of a batch."""
    return torch.empty(src.size(0), 0, dtype=torch.long, device=src.device)


__all__ = ["NativeEngine"]
