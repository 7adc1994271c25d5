#!/usr/bin/env python3
"""Does a decoder step compiled whole beat the eager engine? A probe for the native engine.

    python benchmarks/compiled_step_probe.py [--model weighted-small] [--limit 256] [--rounds 3]

decode_profile.py finds about 1.5 ms of a greedy step's 4 ms outside the operators (Python and
dispatch around ~550 small ones). This probe removes them the way torch.compile can: the
model's own decoder layers, run over a cache of static shape (each layer's keys and values in
buffers of the whole output length, written at a position given as a tensor, the slots not
yet written masked by an additive bias), so that Inductor compiles the step once into one
graph (fused elementwise kernels, oneDNN products of the weights frozen and packed at compile
time) with no graph break and no recompilation from step to step. The encoder and the search
around the step are the engine's own (decode/search.py's masks and argmax).

Greedy search, float32, the protocol of decode_speed.py (the synthetic test sentences sorted
by length, batches of 32, exactly 24 output tokens, random seeded weights, 2 threads); the
compiled search and ``greedy_search`` alternate over ``--rounds`` rounds after the compiling
one. Prints the tokens identical to the engine's, the largest score difference, the time of
each and their ratio. The last line reads `compiled/eager greedy R (lowest–highest)`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import LENGTH, protocol_arguments, protocol_setup
from wtnmt.decode.search import _constrain, greedy_search
from wtnmt.decode.selection import row_argmax
from wtnmt.model import attention_math, speed
from wtnmt.special import BOS


class StaticLayerCache:
    """The decoder cache's interface (model/cache.py's LayerCache: ``attend_cross``,
    ``attend_self``) over buffers of static shape: every step's tensors have the same shapes,
    so one compiled graph serves all steps of a batch."""

    def __init__(self, cross_k: Tensor, cross_v: Tensor, cross_bias: Tensor | None, cap: int):
        h, b, _, dk = cross_k.shape
        self.cross_k, self.cross_v, self.cross_bias = cross_k, cross_v, cross_bias
        self.self_k = cross_k.new_zeros(h * b, cap, dk)  # ×1/√Dk, as LayerCache keeps them
        self.self_v = cross_k.new_zeros(h * b, cap, dk)
        self.position: Tensor | None = None  # [1] this step's slot
        self.unwritten: Tensor | None = None  # [1, 1, cap]: 0 up to this step, −inf after

    def attend_cross(self, q: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        h, n, t, dk = q.shape
        b, s = self.cross_k.size(1), self.cross_k.size(2)
        heads, _ = attention_math.attention_core(
            q.reshape(h * b, t, dk),
            self.cross_k.view(h * b, s, dk).transpose(1, 2),
            self.cross_v.view(h * b, s, dk),
            bias=self.cross_bias,
        )
        return heads.view(h, n, t, dk)

    def attend_self(self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        h, n, _, dk = q.shape
        self.self_k.index_copy_(1, self.position, k.reshape(h * n, 1, dk) * dk**-0.5)
        self.self_v.index_copy_(1, self.position, v.reshape(h * n, 1, dk))
        heads, _ = attention_math.attention_core(
            q.reshape(h * n, 1, dk), self.self_k.transpose(1, 2), self.self_v, bias=self.unwritten
        )
        return heads.view(h, n, 1, dk)


def step_function(model):  # type: ignore[no-untyped-def]
    """tokens [B], position [1], unwritten [1, 1, cap], caches → log-probabilities [B, V]."""

    def step(tokens, position, unwritten, caches, src_pad):  # type: ignore[no-untyped-def]
        x = model.embedding(tokens[:, None]) + model.positions.table.index_select(0, position)
        for layer, cache in zip(model.decoder_layers, caches, strict=True):
            cache.position, cache.unwritten = position, unwritten
            x, _, _ = layer(x, None, src_pad=src_pad, cache=cache)
        if model.decoder_norm is not None:
            x = model.decoder_norm(x)
        return torch.log_softmax(model.embedding.logits(x[:, 0]), dim=-1)

    return step


@torch.inference_mode()
def static_greedy(model, step, src: Tensor, length: int) -> tuple[list[list[int]], Tensor]:  # type: ignore[no-untyped-def]
    """Greedy search of exactly ``length`` tokens (then EOS), as the benchmark forces it."""
    cache = model.init_cache(model.encode(src), steps=length + 1)  # the engine's encoder
    cap = length + 1
    caches = [StaticLayerCache(c.cross_k, c.cross_v, c.cross_bias, cap) for c in cache.layers]
    slots = torch.arange(cap)
    unwritten = torch.zeros(cap, 1, 1, cap).masked_fill_(
        slots[None, :].gt(slots[:, None])[:, None, None, :], float("-inf")
    )
    tokens = torch.full((src.size(0),), BOS, dtype=torch.long)
    every = torch.ones(src.size(0), dtype=torch.bool)
    chosen, best = [], []
    before, speed._fast = speed._fast, False  # the plain operations: the compiler packs
    try:
        for t in range(cap):
            lprobs = step(tokens, slots[t : t + 1], unwritten[t], caches, cache.src_pad)
            lprobs = _constrain(lprobs, t, length, every if t >= length else None)
            tokens = row_argmax(lprobs)
            chosen.append(tokens)
            best.append(lprobs.gather(1, tokens[:, None])[:, 0])
    finally:
        speed._fast = before
    return torch.stack(chosen, 1)[:, :-1].tolist(), torch.stack(best, 1).sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    protocol_arguments(parser, limit=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model, inputs = protocol_setup(args)
    inductor_config.freezing = True  # weights are constants: folded and packed once
    compiled = torch.compile(step_function(model), dynamic=True)

    def eager() -> tuple[float, list]:  # type: ignore[type-arg]
        start = time.perf_counter()
        found = [greedy_search(model, src, min_len=LENGTH, max_len=LENGTH) for src in inputs]
        return time.perf_counter() - start, found

    def static() -> tuple[float, list]:  # type: ignore[type-arg]
        start = time.perf_counter()
        found = [static_greedy(model, compiled, src, LENGTH) for src in inputs]
        return time.perf_counter() - start, found

    eager()
    first, _ = static()
    print(f"first compiled pass (compiling included): {first:.1f} s", flush=True)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        te, want = eager()
        tc, got = static()
        times["eager"].append(te)
        times["compiled"].append(tc)
    same = worst = total = 0
    for hyps, (tokens, scores) in zip(want, got, strict=True):
        for h, toks, score in zip(hyps, tokens, scores.tolist(), strict=True):
            total += 1
            same += h.tokens == toks
            worst = max(worst, abs(h.score - score))
    print(
        f"tokens identical to the engine's: {same} of {total}; largest score difference {worst:.2g}"
    )
    ratios = [e / c for e, c in zip(times["eager"], times["compiled"], strict=True)]
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.3f} s over {args.rounds} rounds")
    print(
        f"compiled/eager greedy {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}–{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
