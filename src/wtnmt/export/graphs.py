"""The two networks an ONNX export holds, as PyTorch modules over the model's own layers:
the encoder (what every decoder layer's cross-attention reads) and one decoder step.

The decoder step runs the model's ``DecoderLayer`` code unchanged; only the cache differs.
``StepCache`` has ``LayerCache``'s interface (``attend_self``, ``attend_cross``) in a form a
graph can hold: functional, fixed-rank tensors in, this step's keys and values out.

The self-attention cache is the toolkit's own layout (model/cache.py), kept by the engine
outside the graph: per sentence, a buffer of C slots (steps × hypotheses a sentence), keys
transposed [H, B, Dk, C] and scaled by 1/√Dk, values [H, B, C, Dk], and a bias [B, G, C]
that is 0 on the slots of each hypothesis' own prefix and −inf elsewhere. The graph scores
the buffer and the step's own key separately and takes one softmax over both, so it never
copies the cache: it only returns this step's keys and values, which the engine writes into
a free slot. Beam search reorders hypotheses by rewriting the bias, never the buffers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StepCache:
    """One decoder layer's view of the cache inside a traced step (see the module's doc).

    cross_k [H, B, Dk, S] (×1/√Dk), cross_v [H, B, S, Dk], cross_bias [B, 1, S];
    self_k [H, B, Dk, C] (×1/√Dk), self_v [H, B, C, Dk], self_bias [B, G, C].
    """

    def __init__(
        self,
        cross_k: Tensor,
        cross_v: Tensor,
        cross_bias: Tensor,
        self_k: Tensor,
        self_v: Tensor,
        self_bias: Tensor,
    ) -> None:
        self.cross_k, self.cross_v, self.cross_bias = cross_k, cross_v, cross_bias
        self.self_k, self.self_v, self.self_bias = self_k, self_v, self_bias
        self.new_k: Tensor | None = None  # [H, B, G, Dk] ×1/√Dk, once attend_self ran
        self.new_v: Tensor | None = None

    def attend_cross(self, q: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        """q [H, B·G, 1, Dk] → heads [H, B·G, 1, Dk] over the source."""
        h, n, _, dk = q.shape
        queries = q.reshape(h, self.cross_k.size(1), -1, dk)  # [H, B, G, Dk]
        scores = torch.matmul(queries, self.cross_k) + self.cross_bias  # [H, B, G, S]
        return torch.matmul(scores.softmax(-1), self.cross_v).reshape(h, n, 1, dk)

    def attend_self(self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        """q, k, v [H, B·G, 1, Dk] of this step → heads [H, B·G, 1, Dk] over each
        hypothesis' prefix and this step; keeps k (×1/√Dk) and v as [H, B, G, Dk]."""
        h, n, _, dk = q.shape
        b = self.self_k.size(1)
        queries = q.reshape(h, b, -1, dk)
        self.new_k = k.reshape(h, b, -1, dk) * dk**-0.5
        self.new_v = v.reshape(h, b, -1, dk)
        past = torch.matmul(queries, self.self_k) + self.self_bias  # [H, B, G, C]
        own = (queries * self.new_k).sum(-1, keepdim=True)  # [H, B, G, 1]
        probs = torch.cat([past, own], dim=-1).softmax(-1)
        heads = torch.matmul(probs[..., :-1], self.self_v) + probs[..., -1:] * self.new_v
        return heads.reshape(h, n, 1, dk)


class EncoderGraph(nn.Module):
    """src [B, S] → cross_bias [B, 1, S] (0, −inf at padding), then per decoder layer its
    cross-attention keys [H, B, Dk, S] (×1/√Dk) and values [H, B, S, Dk]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        enc = self.model.encode(src, always_mask=True)
        bias = torch.zeros(src.shape, dtype=torch.float32).masked_fill(enc.src_pad, -torch.inf)
        out = [bias[:, None, :]]
        for layer, memory in zip(self.model.decoder_layers, enc.memories, strict=True):
            k, v = layer.cross_attn.keys_values(memory)  # [H, B, S, Dk]
            out += [(k * k.size(-1) ** -0.5).transpose(-1, -2), v]
        return tuple(out)


class DecoderStepGraph(nn.Module):
    """One step for G hypotheses of each of B sentences.

    tokens [B, G] (the last token of each prefix), position [1] (the step), self_bias
    [B, G, C], cross_bias [B, 1, S], then per layer cross_k, cross_v, self_k, self_v →
    log-probabilities [B·G, V] of the next token, then per layer this step's keys and
    values [H, B, G, Dk].
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, tokens: Tensor, position: Tensor, self_bias: Tensor, cross_bias: Tensor, *layers
    ) -> tuple[Tensor, ...]:
        model = self.model
        x = model.embedding(tokens.reshape(-1, 1)) + model.positions.at(position)  # [N, 1, D]
        caches = []
        for i in range(len(model.decoder_layers)):
            cross_k, cross_v, self_k, self_v = layers[4 * i : 4 * i + 4]
            caches.append(StepCache(cross_k, cross_v, cross_bias, self_k, self_v, self_bias))
        for layer, cache in zip(model.decoder_layers, caches, strict=True):
            x, _, _ = layer(x, None, src_pad=None, cache=cache)
        if model.decoder_norm is not None:
            x = model.decoder_norm(x)
        lprobs = F.log_softmax(model.embedding.logits(x[:, 0]), dim=-1)
        new = [t for c in caches for t in (c.new_k, c.new_v)]
        return (lprobs, *new)


__all__ = ["DecoderStepGraph", "EncoderGraph", "StepCache"]
