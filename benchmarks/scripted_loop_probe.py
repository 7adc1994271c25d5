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

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

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
from wtnmt.decode.selection import top_extensions
from wtnmt.model import build_model, quantize_decoding
from wtnmt.special import BOS, EOS, PAD

Int8Params = torch.classes.quantized.LinearPackedParamsBase  # type: ignore[attr-defined]


class Weights(NamedTuple):
    """The decoder's weights as the scripted searches take them. Per layer i: products
    4i … 4i+3 (self-attention's QKV and output, cross-attention's queries, the branches'
    tail; ``float32`` packed for oneDNN, or for MKL where ``mkl`` (model/float32_kernels.py),
    with their ``biases``, or FBGEMM-packed ``int8`` with the bias inside), norms 4i … 4i+3
    (each residual's weight and bias), ffn 2i, 2i+1
    (W_i = κ_i W^{O_i} W1_i and b1); the output projection last among the products."""

    embedding: Tensor
    scale: float
    table: Tensor
    norms: list[Tensor]
    ffn: list[Tensor]
    float32: list[Tensor]
    biases: list[Tensor | None]
    int8: list[Int8Params]
    heads: int
    mkl: bool


def linear(w: Weights, x: Tensor, i: int) -> Tensor:
    """The i-th product as PackedLinear computes it: FBGEMM's int8 (bias packed in) where
    the weights are int8, else the packed float32 product (MKL's or oneDNN's)."""
    if len(w.int8) > 0:
        return torch.ops.quantized.linear_dynamic(x, w.int8[i], False)  # 8-bit activations
    bias = w.biases[i]
    if w.mkl:  # (multiply_float32's MKL product)
        return x.mm(w.float32[i]) if bias is None else torch.addmm(bias, x, w.float32[i])
    scalars: list[float | int | complex | None] = []  # the schema's Scalar?[]
    return torch.ops.mkldnn._linear_pointwise(x, w.float32[i], bias, "none", scalars, "")


def decoder_step(
    w: Weights,
    tokens: Tensor,
    t: int,
    cross: list[Tensor],
    self_k: list[Tensor],
    self_v: list[Tensor],
    own: Tensor | None,
) -> Tensor:
    """One step of ``group`` hypotheses a sentence, tokens [N] → logits [N, V], as the model's
    decode_step computes it: per layer, this step's keys and values written once into the
    sentence's slots of self_k/self_v [H, B, steps, W, Dk] (×1/√Dk), each hypothesis scoring
    every slot with ``own`` [B, G, (t+1)·W] (0 on its own path, −inf elsewhere; None with one
    slot a step, greedy search); then the branched cross-attention over cross[3i … 3i+2]
    (keys ×1/√Dk, values, padding bias), each branch's head through its own FFN_i."""
    heads, b = w.heads, cross[0].size(1)
    n, d = tokens.size(0), w.embedding.size(1)
    group, dk, width = n // b, d // heads, self_k[0].size(3)
    x = torch.embedding(w.embedding, tokens) * w.scale + w.table[t]  # [N, D]
    for i in range(len(self_k)):
        qkv = linear(w, x, 4 * i).view(n, 3, heads, dk).permute(1, 2, 0, 3)  # [3, H, N, Dk]
        torch.mul(qkv[1].view(heads, b, group, dk), dk**-0.5, out=self_k[i][:, :, t, :group])
        self_v[i][:, :, t, :group] = qkv[2].view(heads, b, group, dk)
        keys = self_k[i][:, :, : t + 1].reshape(heads * b, (t + 1) * width, dk)
        values = self_v[i][:, :, : t + 1].reshape(heads * b, (t + 1) * width, dk)
        scored = torch.bmm(qkv[0].reshape(heads * b, group, dk), keys.transpose(1, 2))
        if own is not None:
            scored.view(heads, b, group, (t + 1) * width).add_(own)
        h = torch.bmm(scored.softmax(dim=-1), values)  # [H·B, G, Dk]
        h = h.view(heads, n, dk).permute(1, 0, 2).reshape(n, d)
        x = torch.layer_norm(x + linear(w, h, 4 * i + 1), [d], w.norms[4 * i], w.norms[4 * i + 1])
        q = linear(w, x, 4 * i + 2).view(n, heads, dk).transpose(0, 1)
        k, v, bias = cross[3 * i], cross[3 * i + 1], cross[3 * i + 2]
        s = k.size(2)
        scored = torch.baddbmm(
            bias, q.reshape(heads * b, group, dk), k.view(heads * b, s, dk).transpose(1, 2)
        )
        h = torch.bmm(scored.softmax(dim=-1), v.view(heads * b, s, dk))  # [H·B, G, Dk]
        hid = torch.baddbmm(w.ffn[2 * i + 1][:, None, :], h.view(heads, n, dk), w.ffn[2 * i])
        out = linear(w, hid.relu_().permute(1, 0, 2).reshape(n, -1), 4 * i + 3)
        x = torch.layer_norm(x + out, [d], w.norms[4 * i + 2], w.norms[4 * i + 3])
    return linear(w, x, 4 * len(self_k))


def constrained(logits: Tensor, t: int, length: int, bos: int, eos: int, pad: int) -> Tensor:
    """Log-probabilities [N, V] with decode/search.py's rules for a forced length: PAD and BOS
    never, EOS not before ``length``, only EOS at it."""
    lprobs = torch.log_softmax(logits, dim=-1)
    for token in [pad, bos, eos] if t < length else [pad, bos]:
        lprobs.narrow(-1, token, 1).fill_(float("-inf"))
    if t >= length:
        lprobs.fill_(float("-inf"))
        lprobs[:, eos] = 0.0
    return lprobs


def buffers(w: Weights, cross: list[Tensor], steps: int, width: int) -> list[Tensor]:
    """One zeroed self-attention buffer [H, B, steps, width, Dk] a layer."""
    b, dk = cross[0].size(1), w.embedding.size(1) // w.heads
    return [torch.zeros(w.heads, b, steps, width, dk) for _ in range(len(cross) // 3)]


def greedy(
    w: Weights, cross: list[Tensor], length: int, bos: int, eos: int, pad: int
) -> tuple[Tensor, Tensor]:
    """Greedy search of exactly ``length`` tokens, then EOS: the tokens [B, length] and the
    summed log-probabilities [B]."""
    self_k, self_v = buffers(w, cross, length + 1, 1), buffers(w, cross, length + 1, 1)
    tokens = torch.full([cross[0].size(1)], bos, dtype=torch.long)
    chosen: list[Tensor] = []
    best: list[Tensor] = []
    for t in range(length + 1):
        logits = decoder_step(w, tokens, t, cross, self_k, self_v, None)
        lprobs = constrained(logits, t, length, bos, eos, pad)
        tokens = lprobs.argmax(dim=1)  # (the engine's row_argmax: the same index)
        chosen.append(tokens)
        best.append(lprobs.gather(1, tokens[:, None])[:, 0])
    return torch.stack(chosen, 1)[:, :-1], torch.stack(best, 1).sum(1)


def beam(
    w: Weights, cross: list[Tensor], length: int, width: int, bos: int, eos: int, pad: int
) -> tuple[Tensor, Tensor]:
    """Beam search (``width`` beams) of exactly ``length`` tokens, then EOS, as
    decode/search.py's beam_search runs it when the length is forced (its top_extensions
    itself): each sentence's best hypothesis [B, length] and its summed log-probability [B].
    Each hypothesis reads its own prefix through its path of slots, as model/cache.py's."""
    b = cross[0].size(1)
    self_k, self_v = buffers(w, cross, length + 1, width), buffers(w, cross, length + 1, width)
    prefix = torch.full([b, 1], bos, dtype=torch.long)
    scores = torch.zeros(b, 1)
    path = torch.zeros(b, 0, dtype=torch.long)
    rows = torch.arange(b)
    for t in range(length + 1):
        group = scores.size(1)
        n = b * group
        path = torch.cat([path, (torch.arange(n) % group)[:, None]], dim=1)  # [N, t+1]
        cols = torch.arange(t + 1) * width + path
        own = torch.full([n, (t + 1) * width], float("-inf")).scatter_(1, cols, 0.0)
        logits = decoder_step(
            w, prefix[:, -1], t, cross, self_k, self_v, own.view(b, group, (t + 1) * width)
        )
        lprobs = constrained(logits, t, length, bos, eos, pad).view(b, group, -1)
        top, origin, token = top_extensions(lprobs, scores, 2 * width)
        if t == length:  # every hypothesis ends; the best ranks first
            return prefix.index_select(0, rows * group + origin[:, 0])[:, 1:], top[:, 0]
        top, origin, token = top[:, :width], origin[:, :width], token[:, :width]
        index = (rows[:, None] * group + origin).view(-1)
        prefix = torch.cat([prefix.index_select(0, index), token.reshape(-1, 1)], dim=1)
        scores = top
        path = path.index_select(0, index)
    raise RuntimeError("unreachable: the last step returns")


def weights(model) -> Weights:  # type: ignore[no-untyped-def]
    """The model's weights as the scripted searches take them, after the engine packed them
    (one eager decode first): the same packed copies, so the same products."""
    float32: list[Tensor] = []
    biases: list[Tensor | None] = []
    int8: list[Any] = []
    norms: list[Tensor] = []
    ffn: list[Tensor] = []
    for layer in model.decoder_layers:
        branched = layer.cross_attn
        kappa, alpha = branched.branch_weights()
        fused, _, b2 = branched._fused_weights(kappa, alpha)
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
        ffn += [fused.detach(), branched.b1.detach()]
    output = model.embedding._output
    (int8 if output.int8 else float32).append(output._packed)
    biases.append(None)
    return Weights(
        embedding=model.embedding.weight.detach(),
        scale=model.embedding.scale,
        table=model.positions.table,
        norms=norms,
        ffn=ffn,
        float32=float32,
        biases=biases,
        int8=int8,
        heads=model.decoder_layers[0].self_attn.attn.heads,
        mkl=not output.int8 and output.kernels == "mkl",
    )


@torch.inference_mode()
def scripted_search(model, search, packed: Weights, src: Tensor, **options):  # type: ignore[no-untyped-def]
    cache = model.init_cache(model.encode(src))  # the engine's encoder and cross keys
    cross: list[Tensor] = []
    for c in cache.layers:
        h, b, s, _ = c.cross_k.shape
        bias = c.cross_bias if c.cross_bias is not None else c.cross_k.new_zeros(h * b, 1, s)
        cross += [c.cross_k, c.cross_v, bias]
    return search(packed, cross, length=LENGTH, bos=BOS, eos=EOS, pad=PAD, **options)


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
