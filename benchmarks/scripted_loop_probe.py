#!/usr/bin/env python3
"""Does the search run faster outside Python? A probe for the native engine.

    python benchmarks/scripted_loop_probe.py [--limit 256] [--rounds 3] [--threads 2]

decode_profile.py finds about 1.5 ms of a greedy int8 step's 3.9 ms outside the operators:
Python and its dispatch around ~230 calls into PyTorch a step. This probe runs the same
operators, in the same order and on the same packed weights (oneDNN's float32 packing, FBGEMM's
int8 one), from TorchScript's interpreter, which runs in C++: the whole greedy search and beam
search of the `weighted-small` Weighted Transformer (post-norm, multi-head decoder
self-attention, branched cross-attention with split FFNs, κ and α folded into the weights as
the engine folds them), the encoder and the cross-attention keys and values being the
engine's own. So its time against the engine's is what leaving Python is worth, with the
kernels unchanged. The scripted beam search is decode/search.py's for a forced length (every
hypothesis ends at the last step): the bookkeeping of hypotheses that end early is not there.

The protocol of decode_speed.py: the synthetic test sentences sorted by length, batches of 32,
exactly 24 output tokens, random seeded weights; float32 and int8, greedy and beam 5, the
scripted search and the engine's alternating over ``--rounds`` rounds. Prints the tokens
identical to the engine's, the largest difference of summed log-probabilities, each time and
the ratio: `scripted/eager SEARCH PRECISION R (lowest–highest)`. Where CTranslate2 is installed,
its search of the same batches on a Transformer of the same shape is timed first (not
interleaved: a rough ratio), and both wtnmt searches are given as ratios to it."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

try:  # before torch, as decode_vs_ctranslate2.py loads it
    import ctranslate2
except ImportError:  # pragma: no cover - optional
    ctranslate2 = None

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_profile import STEPS, ct2_step_ms
from decode_speed import LENGTH, protocol_arguments, protocol_setup
from wtnmt.config import load_config
from wtnmt.decode.search import beam_search, greedy_search
from wtnmt.model import build_model, quantize_decoding
from wtnmt.model.packed import int8_reduce_range
from wtnmt.special import BOS, EOS, PAD

Int8Params = torch.classes.quantized.LinearPackedParamsBase  # type: ignore[attr-defined]


def linear(
    x: Tensor,
    i: int,
    float32: list[Tensor],
    biases: list[Tensor | None],
    int8: list[Int8Params],
    reduce_range: bool,
) -> Tensor:
    """The i-th product as PackedLinear computes it: FBGEMM's int8 (bias packed in) where
    ``int8`` holds the packed weights, else oneDNN's packed float32 product."""
    if len(int8) > 0:
        return torch.ops.quantized.linear_dynamic(x, int8[i], reduce_range)
    scalars: list[float | int | complex | None] = []  # the schema's Scalar?[]
    return torch.ops.mkldnn._linear_pointwise(x, float32[i], biases[i], "none", scalars, "")


def branched_cross(
    x: Tensor,
    i: int,
    group: int,
    heads: int,
    norms: list[Tensor],
    ffn: list[Tensor],
    cross: list[Tensor],
    float32: list[Tensor],
    biases: list[Tensor | None],
    int8: list[Int8Params],
    reduce_range: bool,
) -> Tensor:
    """Layer i's branched cross-attention sublayer and its norm for x [N, D], ``group``
    hypotheses a sentence (the weights as ``greedy`` takes them)."""
    n, d = x.shape
    b, dk = n // group, d // heads
    q = linear(x, 4 * i + 2, float32, biases, int8, reduce_range)
    q = q.view(n, heads, dk).transpose(0, 1).reshape(heads * b, group, dk)
    k, v, bias = cross[3 * i], cross[3 * i + 1], cross[3 * i + 2]
    s = k.size(2)
    scored = torch.baddbmm(bias, q, k.view(heads * b, s, dk).transpose(1, 2))
    h = torch.bmm(scored.softmax(dim=-1), v.view(heads * b, s, dk))  # [H·B, G, Dk]
    hid = torch.baddbmm(ffn[2 * i + 1][:, None, :], h.view(heads, n, dk), ffn[2 * i])
    concat = hid.relu_().permute(1, 0, 2).reshape(n, -1)
    out = linear(concat, 4 * i + 3, float32, biases, int8, reduce_range)
    return torch.layer_norm(x + out, [d], norms[4 * i + 2], norms[4 * i + 3])


def greedy(
    embedding: Tensor,
    scale: float,
    table: Tensor,
    norms: list[Tensor],
    ffn: list[Tensor],
    cross: list[Tensor],
    float32: list[Tensor],
    biases: list[Tensor | None],
    int8: list[Int8Params],
    reduce_range: bool,
    heads: int,
    length: int,
    bos: int,
    eos: int,
    pad: int,
) -> tuple[Tensor, Tensor]:
    """Greedy search of exactly ``length`` tokens, then EOS: the tokens [B, length] and the
    summed log-probabilities [B]. Per layer i: products 4i … 4i+3 (self-attention's QKV and
    output, cross-attention's queries, the branches' tail), norms 4i … 4i+3 (each residual's
    weight and bias), ffn[2i], ffn[2i+1] (W_i = κ_i W^{O_i} W1_i and b1), cross[3i … 3i+2]
    (keys ×1/√Dk, values, padding bias); the output projection last."""
    layers = len(ffn) // 2
    b = cross[0].size(1)
    d = embedding.size(1)
    dk = d // heads
    self_k: list[Tensor] = []
    self_v: list[Tensor] = []
    for _ in range(layers):
        self_k.append(torch.zeros(heads * b, length + 1, dk))
        self_v.append(torch.zeros(heads * b, length + 1, dk))
    tokens = torch.full([b], bos, dtype=torch.long)
    chosen: list[Tensor] = []
    best: list[Tensor] = []
    for t in range(length + 1):
        x = torch.embedding(embedding, tokens) * scale + table[t]  # [B, D]
        for i in range(layers):
            # masked self-attention: this step's keys and values appended, each query
            # against its own prefix (greedy: one hypothesis a sentence)
            qkv = linear(x, 4 * i, float32, biases, int8, reduce_range)
            qkv = qkv.view(b, 3, heads, dk).permute(1, 2, 0, 3)  # [3, H, B, Dk]
            q = qkv[0].reshape(heads * b, 1, dk)
            self_k[i][:, t] = qkv[1].reshape(heads * b, dk) * dk**-0.5
            self_v[i][:, t] = qkv[2].reshape(heads * b, dk)
            keys, values = self_k[i][:, : t + 1], self_v[i][:, : t + 1]
            probs = torch.bmm(q, keys.transpose(1, 2)).softmax(dim=-1)
            h = torch.bmm(probs, values).view(heads, b, dk).permute(1, 0, 2).reshape(b, d)
            out = linear(h, 4 * i + 1, float32, biases, int8, reduce_range)
            x = torch.layer_norm(x + out, [d], norms[4 * i], norms[4 * i + 1])
            # branched cross-attention: each branch's head through its own FFN_i
            x = branched_cross(
                x, i, 1, heads, norms, ffn, cross, float32, biases, int8, reduce_range
            )
        logits = linear(x, 4 * layers, float32, biases, int8, reduce_range)
        lprobs = torch.log_softmax(logits, dim=-1)
        lprobs[:, pad] = float("-inf")
        lprobs[:, bos] = float("-inf")
        if t < length:
            lprobs[:, eos] = float("-inf")
        else:
            lprobs.fill_(float("-inf"))
            lprobs[:, eos] = 0.0
        tokens = lprobs.argmax(dim=1)
        chosen.append(tokens)
        best.append(lprobs.gather(1, tokens[:, None])[:, 0])
    return torch.stack(chosen, 1)[:, :-1], torch.stack(best, 1).sum(1)


def top_extensions(lprobs: Tensor, scores: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """decode/search.py's top_extensions, operator for operator."""
    block = 128  # its vocabulary block of the two-stage top-k (a local: TorchScript)
    n, g, v = lprobs.shape
    k = min(k, g * v)
    if v <= 4 * block:
        top, flat = (scores[:, :, None] + lprobs).view(n, -1).topk(k, dim=1)
        return top, flat // v, flat % v
    full = v // block * block
    maxima = lprobs[:, :, :full].reshape(n, g, -1, block).amax(-1)
    if full < v:
        maxima = torch.cat([maxima, lprobs[:, :, full:].amax(-1, keepdim=True)], dim=-1)
    per_hyp = maxima.size(-1)
    maxima = (maxima + scores[:, :, None]).view(n, -1)
    best = maxima.topk(min(k, maxima.size(1)), dim=1).indices
    hyp = best // per_hyp
    cols = (best % per_hyp * block)[:, :, None] + torch.arange(block)
    flat = hyp[:, :, None] * v + cols.clamp(max=v - 1)
    values = lprobs.view(n, -1).gather(1, flat.view(n, -1)).view_as(flat)
    values = (values + scores.gather(1, hyp)[:, :, None]).masked_fill(cols >= v, float("-inf"))
    top, pos = values.view(n, -1).topk(k, dim=1)
    flat = flat.view(n, -1).gather(1, pos)
    return top, flat // v, flat % v


def beam(
    embedding: Tensor,
    scale: float,
    table: Tensor,
    norms: list[Tensor],
    ffn: list[Tensor],
    cross: list[Tensor],
    float32: list[Tensor],
    biases: list[Tensor | None],
    int8: list[Int8Params],
    reduce_range: bool,
    heads: int,
    length: int,
    width: int,
    bos: int,
    eos: int,
    pad: int,
) -> tuple[Tensor, Tensor]:
    """Beam search (``width`` beams) of exactly ``length`` tokens, then EOS, as
    decode/search.py's beam_search runs it when the length is forced: each sentence's best
    hypothesis [B, length] and its summed log-probability [B]. The decoder cache as
    model/cache.py keeps it: each step's keys written once into a sentence's slots, each
    hypothesis reading its own prefix through an additive bias on its path; the weights as
    in ``greedy``."""
    layers = len(ffn) // 2
    b = cross[0].size(1)
    d = embedding.size(1)
    dk = d // heads
    self_k: list[Tensor] = []
    self_v: list[Tensor] = []
    for _ in range(layers):
        self_k.append(torch.zeros(heads, b, length + 1, width, dk))
        self_v.append(torch.zeros(heads, b, length + 1, width, dk))
    prefix = torch.full([b, 1], bos, dtype=torch.long)
    scores = torch.zeros(b, 1)
    path = torch.zeros(b, 0, dtype=torch.long)
    for t in range(length + 1):
        group = scores.size(1)
        n = b * group
        path = torch.cat([path, (torch.arange(n) % group)[:, None]], dim=1)  # [N, t+1]
        cols = torch.arange(t + 1) * width + path
        own = torch.full([n, (t + 1) * width], float("-inf")).scatter_(1, cols, 0.0)
        own = own.view(b, group, (t + 1) * width)
        x = torch.embedding(embedding, prefix[:, -1]) * scale + table[t]  # [N, D]
        for i in range(layers):
            qkv = linear(x, 4 * i, float32, biases, int8, reduce_range)
            qkv = qkv.view(n, 3, heads, dk).permute(1, 2, 0, 3)  # [3, H, N, Dk]
            torch.mul(qkv[1].view(heads, b, group, dk), dk**-0.5, out=self_k[i][:, :, t, :group])
            self_v[i][:, :, t, :group] = qkv[2].view(heads, b, group, dk)
            keys = self_k[i][:, :, : t + 1].reshape(heads * b, (t + 1) * width, dk)
            values = self_v[i][:, :, : t + 1].reshape(heads * b, (t + 1) * width, dk)
            q = qkv[0].reshape(heads * b, group, dk)
            scored = torch.bmm(q, keys.transpose(1, 2))
            scored.view(heads, b, group, (t + 1) * width).add_(own)
            h = torch.bmm(scored.softmax(dim=-1), values)  # [H·B, G, Dk]
            h = h.view(heads, n, dk).permute(1, 0, 2).reshape(n, d)
            out = linear(h, 4 * i + 1, float32, biases, int8, reduce_range)
            x = torch.layer_norm(x + out, [d], norms[4 * i], norms[4 * i + 1])
            x = branched_cross(
                x, i, group, heads, norms, ffn, cross, float32, biases, int8, reduce_range
            )
        logits = linear(x, 4 * layers, float32, biases, int8, reduce_range)
        lprobs = torch.log_softmax(logits, dim=-1).view(b, group, -1)
        lprobs.narrow(-1, pad, 1).fill_(float("-inf"))
        lprobs.narrow(-1, bos, 1).fill_(float("-inf"))
        if t < length:
            lprobs.narrow(-1, eos, 1).fill_(float("-inf"))
        else:
            lprobs.fill_(float("-inf"))
            lprobs[:, :, eos] = 0.0
        top, origin, token = top_extensions(lprobs, scores, 2 * width)
        rows = torch.arange(b)
        if t == length:  # every hypothesis ends; the best ranks first
            best = rows * group + origin[:, 0]
            return prefix.index_select(0, best)[:, 1:], top[:, 0]
        top, origin, token = top[:, :width], origin[:, :width], token[:, :width]
        index = (rows[:, None] * group + origin).view(-1)
        prefix = torch.cat([prefix.index_select(0, index), token.reshape(-1, 1)], dim=1)
        scores = top
        path = path.index_select(0, index)
    raise RuntimeError("unreachable: the last step returns")


def weights(model) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The model's weights as the scripted search takes them, after the engine packed them
    (one eager decode first): the same packed copies, so the same products."""
    float32: list[Tensor] = []
    biases: list[Tensor | None] = []
    int8: list[Any] = []
    norms: list[Tensor] = []
    ffn: list[Tensor] = []
    for layer in model.decoder_layers:
        branched = layer.cross_attn
        kappa, alpha = branched.branch_weights()
        w, _, b2 = branched._fused_weights(kappa, alpha)
        proj = layer.self_attn.attn.proj
        products = [
            (proj._qkv, None),
            (layer.self_attn._out, None),
            (branched.attn.proj._q, None),
            (branched._tail, b2),
        ]
        for packed, bias in products:
            (int8 if packed.int8 else float32).append(packed._packed)
            biases.append(bias)
        for res in (layer.self_attn_res, layer.cross_attn_res):
            norms += [res.norm.weight.detach(), res.norm.bias.detach()]
        ffn += [w.detach(), branched.b1.detach()]
    output = model.embedding._output
    (int8 if output.int8 else float32).append(output._packed)
    biases.append(None)
    return {
        "embedding": model.embedding.weight.detach(),
        "scale": model.embedding.scale,
        "table": model.positions.table,
        "norms": norms,
        "ffn": ffn,
        "float32": float32,
        "biases": biases,
        "int8": int8,
        "reduce_range": int8_reduce_range(),
        "heads": model.decoder_layers[0].self_attn.attn.heads,
    }


@torch.inference_mode()
def scripted_search(model, search, packed: dict[str, Any], src: Tensor, **options):  # type: ignore[no-untyped-def]
    cache = model.init_cache(model.encode(src))  # the engine's encoder and cross keys
    cross: list[Tensor] = []
    for c in cache.layers:
        h, b, s, _ = c.cross_k.shape
        bias = c.cross_bias if c.cross_bias is not None else c.cross_k.new_zeros(h * b, 1, s)
        cross += [c.cross_k, c.cross_v, bias]
    return search(cross=cross, length=LENGTH, bos=BOS, eos=EOS, pad=PAD, **packed, **options)


def eager_search(model, src: Tensor, beams: int) -> list[tuple[list[int], float]]:  # type: ignore[no-untyped-def]
    """The engine's best hypothesis of each sentence: tokens and summed log-probability."""
    if beams == 1:
        return [
            (h.tokens, h.log_prob)
            for h in greedy_search(model, src, min_len=LENGTH, max_len=LENGTH)
        ]
    found = beam_search(model, src, beam=beams, min_len=LENGTH, max_len=LENGTH)
    return [(hyps[0].tokens, hyps[0].log_prob) for hyps in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    protocol_arguments(parser, limit=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.model != "weighted-small":
        sys.exit("scripted_loop_probe.py: the scripted search is weighted-small's layers only")
    model, inputs = protocol_setup(args)
    searches = {1: torch.jit.script(greedy), 5: torch.jit.script(beam)}
    ct2 = {}
    if ctranslate2 is not None:
        shape = build_model(
            load_config("transformer-small").model, vocab_size=model.embedding.weight.size(0)
        ).eval()
        ct2 = ct2_step_ms(shape, inputs, args.rounds, args.threads)
    for precision in ("none", "int8"):
        quantize_decoding(model, precision)
        name = "int8" if precision == "int8" else "float32"
        for beams, search in searches.items():
            options = {} if beams == 1 else {"width": beams}
            eager_search(model, inputs[0], beams)  # packs the weights
            packed = weights(model)
            scripted_search(model, search, packed, inputs[0], **options)  # warm-up

            def eager() -> tuple[float, list]:  # type: ignore[type-arg]
                start = time.perf_counter()
                found = [eager_search(model, src, beams) for src in inputs]  # noqa: B023
                return time.perf_counter() - start, found

            def scripted() -> tuple[float, list]:  # type: ignore[type-arg]
                start = time.perf_counter()
                found = [scripted_search(model, search, packed, src, **options) for src in inputs]  # noqa: B023
                return time.perf_counter() - start, found

            times: dict[str, list[float]] = {"eager": [], "scripted": []}
            for _ in range(args.rounds):
                te, want = eager()
                ts, got = scripted()
                times["eager"].append(te)
                times["scripted"].append(ts)
            same = total = 0
            worst = 0.0
            for hyps, (tokens, scores) in zip(want, got, strict=True):
                for (toks, lp), mine, score in zip(
                    hyps, tokens.tolist(), scores.tolist(), strict=True
                ):
                    total += 1
                    same += toks == mine
                    worst = max(worst, abs(lp - score))
            label = "greedy" if beams == 1 else f"beam {beams}"
            eager_s, scripted_s = (statistics.median(times[k]) for k in ("eager", "scripted"))
            print(
                f"{name} {label}: tokens identical to the engine's {same} of {total}, largest "
                f"score difference {worst:.2g}; eager {eager_s:.3f} s, scripted {scripted_s:.3f} s"
            )
            ratios = [e / s for e, s in zip(times["eager"], times["scripted"], strict=True)]
            line = (
                f"scripted/eager {label} {name} {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}–{max(ratios):.2f})"
            )
            if ct2:
                theirs = ct2[f"{name} b{beams}"] * len(inputs) * STEPS / 1e3  # s, all batches
                line += (
                    f"; against CTranslate2 {name} ({theirs:.3f} s): eager "
                    f"{theirs / eager_s:.2f}, scripted {theirs / scripted_s:.2f}"
                )
            print(line, flush=True)
    quantize_decoding(model, "none")


if __name__ == "__main__":
    main()
