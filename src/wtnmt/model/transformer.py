"""The encoder–decoder: Transformer or Weighted Transformer, depending on its layers.

The model computes; search, losses and regularizers live outside and use three entry points:

    encode(src)                     → EncoderOutput     (once per source)
    init_cache(enc) / decode_step   → logits of the next token, with a key/value cache
    forward(src, tgt_in)            → ModelOutput       (teacher forcing, all positions)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from wtnmt.model.attention_math import padding_bias
from wtnmt.model.cache import LayerCache, own_slot_bias
from wtnmt.model.dropout import Dropout
from wtnmt.model.embedding import Positions, TokenEmbedding
from wtnmt.model.layers import DecoderLayer, EncoderLayer
from wtnmt.model.outputs import AttentionInternals, EncoderOutput, ModelInternals, ModelOutput
from wtnmt.model.transparent import TransparentCombination
from wtnmt.special import PAD


@dataclass
class DecoderCache:
    """Everything step-wise decoding carries from one step to the next.

    Cross-attention keys and values are held once per source sentence; the decoder's own keys
    and values once per hypothesis. A batch of N = B·G hypotheses (G per sentence, in order)
    decodes against B sentences: beam search never copies the source side per hypothesis.
    """

    layers: list[LayerCache]
    src_pad: Tensor | None  # [B, S] True at padding; None when the batch has none
    step: int = 0  # tokens decoded so far = position of the next input token

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> DecoderCache:
        """Keep hypotheses ``index`` [N'] and, when given, source sentences ``sentences`` [B']
        (beam search: hypotheses are reordered every step, sentences only when some are done).
        Returns the cache to decode on with; this one is not to be used any more."""
        src_pad = self.src_pad
        if sentences is not None and src_pad is not None:
            src_pad = src_pad.index_select(0, sentences)
        path = self.layers[0].path.index_select(0, index)  # the same in every layer
        return DecoderCache(
            layers=[layer.reorder(path, sentences) for layer in self.layers],
            src_pad=src_pad,
            step=self.step,
        )


class Seq2Seq(nn.Module):
    def __init__(
        self,
        *,
        embedding: TokenEmbedding,
        positions: Positions,
        encoder_layers: list[EncoderLayer],
        decoder_layers: list[DecoderLayer],
        pre_norm: bool,
        transparent: TransparentCombination | None,
        dropout: float,
        source_embedding: TokenEmbedding | None = None,
    ) -> None:
        """``embedding``: the target's, tied to the output projection, and the source's too
        unless the source has a vocabulary of its own (``source_embedding``)."""
        super().__init__()
        self.embedding = embedding
        if source_embedding is not None:
            self.source_embedding = source_embedding
        self.positions = positions
        self.encoder_layers = nn.ModuleList(encoder_layers)
        self.decoder_layers = nn.ModuleList(decoder_layers)
        d = embedding.weight.size(1)
        # pre-norm stacks end with a layer norm; post-norm layers already end with one
        self.encoder_norm = nn.LayerNorm(d) if pre_norm else None
        self.decoder_norm = nn.LayerNorm(d) if pre_norm else None
        self.transparent = transparent
        self.dropout = Dropout(dropout)
        self.pad_id = embedding.pad_id

    @property
    def max_positions(self) -> int:
        """Positions the model has: a sequence (with BOS or EOS) is at most this long."""
        return self.positions.max_positions

    # ---------------------------------------------------------------------------------------
    @property
    def source_vocab_size(self) -> int | None:
        """The source's pieces where it has an embedding of its own (None: shared)."""
        own = getattr(self, "source_embedding", None)
        return None if own is None else own.weight.size(0)

    def embed(self, tokens: Tensor, offset: int = 0, *, source: bool = False) -> Tensor:
        """tokens [B, T] → Drop(√D·E[tokens] + PE) [B, T, D]; E the source's own embedding
        where it has one and ``source``."""
        table = getattr(self, "source_embedding", self.embedding) if source else self.embedding
        x = table(tokens) + self.positions(tokens.size(1), offset)
        return self.dropout(x) if self.training else x

    def encode(
        self,
        src: Tensor,
        *,
        need_internals: bool = False,
        always_mask: bool = False,
        src_padded: bool | None = None,
    ) -> EncoderOutput:
        """src: [B, S] token ids, right-padded with pad_id. ``always_mask``: pass the padding
        mask even where a batch has none (a graph exported for every batch, export/onnx).
        ``src_padded``: whether any source is padded, as forward() takes it."""
        src_pad = src.eq(self.pad_id)  # [B, S]
        # no mask where there is no padding: the fused kernel's path
        key_pad = src_pad if always_mask or _padded(src_pad, src_padded) else None
        x = self.embed(src, source=True)
        states, internals = [x], []
        for layer in self.encoder_layers:
            x, layer_internals = layer(x, src_pad=key_pad, need_internals=need_internals)
            states.append(x)
            if layer_internals is not None:
                internals.append(layer_internals)
        n_dec = len(self.decoder_layers)
        weights = None
        if self.transparent is not None:
            memories, weights = self.transparent(states)
        else:
            memories = [states[-1]] * n_dec
        if self.encoder_norm is not None:
            memories = [self.encoder_norm(m) for m in memories]
            if self.transparent is None:  # one top layer: normalise it once
                memories = [memories[0]] * n_dec
        return EncoderOutput(
            memories=memories,
            src_pad=src_pad,
            states=states,
            transparent_weights=weights,
            self_attention=internals,
        )

    def decode(
        self,
        tgt_in: Tensor,
        enc: EncoderOutput,
        *,
        need_internals: bool = False,
        src_padded: bool | None = None,
    ) -> tuple[Tensor, list[AttentionInternals], list[AttentionInternals]]:
        """Teacher-forced decoder: tgt_in [B, T] (starting with BOS) → final states [B, T, D]."""
        key_pad = enc.src_pad if _padded(enc.src_pad, src_padded) else None
        x = self.embed(tgt_in)
        self_ints, cross_ints = [], []
        for layer, memory in zip(self.decoder_layers, enc.memories, strict=True):
            x, s_int, c_int = layer(x, memory, src_pad=key_pad, need_internals=need_internals)
            if need_internals:
                self_ints.append(s_int)
                cross_ints.append(c_int)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x, self_ints, cross_ints

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        *,
        need_internals: bool = False,
        logits_at: Tensor | None = None,
        src_padded: bool | None = None,
    ) -> ModelOutput:
        """src [B, S], tgt_in [B, T] → logits [B, T, V] of the next tokens.

        With ``logits_at`` [N] (positions in the flattened [B·T] target that a loss reads,
        typically its real tokens: ``real_positions(tgt_out)``), logits are [N, V] for those N
        positions only: the output projection is the largest matmul of a small model, and
        padding need not pay for it.

        ``src_padded``: whether any source is padded, where the caller knows it without asking
        the device (a training batch, on the host). Asked here (None), it is one value read
        back from the device, where a GPU's host waits for the queued kernels and a compiled
        graph breaks: ``logits_at`` and ``src_padded`` from the host leave the forward
        nothing that depends on the data, so a compiled forward is one graph.
        """
        if src_padded is None:  # asked once for the encoder and the decoder
            src_padded = bool(src.eq(self.pad_id).any())
        enc = self.encode(src, need_internals=need_internals, src_padded=src_padded)
        states, self_ints, cross_ints = self.decode(
            tgt_in, enc, need_internals=need_internals, src_padded=src_padded
        )
        if logits_at is not None:
            states = states.flatten(0, 1).index_select(0, logits_at)  # [N, D]
        logits = self.embedding.logits(states)
        if not need_internals:
            return ModelOutput(logits=logits)
        internals = ModelInternals(
            encoder_self=enc.self_attention,
            decoder_self=self_ints,
            encoder_decoder=cross_ints,
            src_pad=enc.src_pad,
            tgt_pad=tgt_in.eq(self.pad_id),
            encoder_states=enc.states,
            transparent_weights=enc.transparent_weights,
        )
        return ModelOutput(logits=logits, internals=internals)

    # ---------------------------------------------------------------------------------------
    def init_cache(
        self, enc: EncoderOutput, *, steps: int | None = None, hypotheses: int = 1
    ) -> DecoderCache:
        """Compute every decoder layer's cross-attention keys and values once per source.

        ``steps`` and ``hypotheses`` (per sentence) size the self-attention buffers when the
        search knows them; otherwise they grow as needed.
        """
        layers = []
        src_pad = enc.src_pad if bool(enc.src_pad.any()) else None
        for layer, memory in zip(self.decoder_layers, enc.memories, strict=True):
            k, v = layer.cross_attn.keys_values(memory)  # [H, B, S, Dk] each
            h, dk = k.size(0), k.size(-1)
            bias = None if src_pad is None else padding_bias(src_pad, h, k.dtype)  # every step's
            path = torch.zeros(k.size(1), 0, dtype=torch.long, device=k.device)
            # contiguous, so that every step's QKᵀ and PV are plain batched matmuls: the
            # projection's head-split views would be copied by matmul at every step
            layers.append(
                LayerCache(
                    cross_k=(k * dk**-0.5).contiguous(),  # the 1/√Dk of every step, once
                    cross_v=v.contiguous(),
                    cross_bias=bias,
                    path=path,
                    capacity=steps or 16,
                    width=hypotheses,
                )
            )
        return DecoderCache(layers=layers, src_pad=src_pad)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens [N]: the last token of each prefix → logits [N, V] of the next one.

        N may be a multiple G of the cache's sentences (G hypotheses per sentence, in order).
        Appends this step's keys and values to ``cache`` and advances ``cache.step``.
        """
        x = self.embed(tokens[:, None], offset=cache.step)  # [N, 1, D]
        # this step's keys of a sentence's G hypotheses take slots 0 … G−1
        n = tokens.size(0)
        group = n // cache.layers[0].cross_k.size(1)
        path = cache.layers[0].path
        if cache.step == 0:  # the first step decides how many hypotheses there are
            path = path.new_zeros(n, 0)
        width = cache.layers[0].slots(group)
        own_slots = None
        if width > 1 or path.size(1) > 0:
            # while the buffers hold one slot a step (greedy search) every slot is 0 and
            # the path is left empty: it is only read with several
            if path.size(1) < cache.step:
                path = torch.cat([path.new_zeros(n, cache.step - path.size(1)), path], dim=1)
            slot = torch.arange(n, device=tokens.device) % group
            path = torch.cat([path, slot[:, None]], dim=1)  # [N, t+1]
            own_slots = own_slot_bias(path, group, width)  # once for every layer
        for layer_cache in cache.layers:
            layer_cache.path, layer_cache.own_slots = path, own_slots
        for layer, layer_cache in zip(self.decoder_layers, cache.layers, strict=True):
            x, _, _ = layer(x, None, src_pad=cache.src_pad, cache=layer_cache)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        cache.step += 1
        return self.embedding.logits(x[:, 0])  # [N, V]


def _padded(src_pad: Tensor, known: bool | None) -> bool:
    """Whether any source is padded: ``known``, else read from ``src_pad``."""
    return bool(src_pad.any()) if known is None else known


def real_positions(tgt: Tensor, pad_id: int = PAD) -> Tensor:
    """The positions of ``tgt``'s [B, T] real tokens in its flattened [B·T] form, in order
    (what forward()'s ``logits_at`` takes): found where ``tgt`` is, so a batch's, found on the
    host, leaves the device nothing to wait for."""
    return tgt.flatten().ne(pad_id).nonzero().squeeze(1)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["DecoderCache", "Seq2Seq", "count_parameters", "real_positions"]
