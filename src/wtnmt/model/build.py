"""The one place that reads a ModelConfig: it picks each variant once and assembles the parts."""

from __future__ import annotations

import torch
from torch import nn

from wtnmt.config import ModelConfig
from wtnmt.model.attention import HeadProjection, MultiHeadAttention
from wtnmt.model.branched import BranchedAttention, WeightedAttention
from wtnmt.model.embedding import Positions, TokenEmbedding
from wtnmt.model.layers import DecoderLayer, EncoderLayer, FeedForward
from wtnmt.model.transformer import Seq2Seq
from wtnmt.model.transparent import TransparentCombination
from wtnmt.special import BOS, PAD


def build_model(
    config: ModelConfig,
    *,
    vocab_size: int,
    pad_id: int = PAD,
    source_vocab_size: int | None = None,
) -> Seq2Seq:
    """A Transformer (``attention: multihead``) or Weighted Transformer (``branched``).
    ``vocab_size``: the target's pieces, and the source's unless ``source_vocab_size`` gives
    the source a vocabulary and embedding of its own (``data.joint_vocab: false``)."""
    for size in (vocab_size, source_vocab_size or vocab_size):
        if size <= pad_id:
            raise ValueError(f"vocab_size={size} must exceed the padding id {pad_id}")
    c = config
    branched = c.attention == "branched"

    def multihead(*, causal: bool = False, cross: bool = False) -> nn.Module:
        return MultiHeadAttention(
            d_model=c.d_model,
            heads=c.heads,
            dropout=c.attention_dropout,
            causal=causal,
            cross=cross,
            bias=c.attention_bias,
        )

    def ffn() -> nn.Module:
        return FeedForward(
            d_model=c.d_model,
            d_ff=c.d_ff,
            activation_dropout=c.activation_dropout,
            activation=c.activation,
        )

    def branched_sublayer(*, layer: int, cross: bool = False) -> nn.Module:
        return BranchedAttention(
            d_model=c.d_model,
            branches=c.branches,
            d_ff=c.d_ff,
            ffn=c.branch_ffn,
            weights=c.branch_weights,
            topk=c.branch_topk,
            init=c.branch_init,
            attention_dropout=c.attention_dropout,
            activation_dropout=c.activation_dropout,
            cross=cross,
            kept=c.kept("decoder" if cross else "encoder", layer),
        )

    def decoder_self() -> nn.Module:
        if branched and c.decoder_self_attention == "weighted":
            return WeightedAttention(
                d_model=c.d_model,
                branches=c.branches,
                weights=c.branch_weights,
                topk=c.branch_topk,
                init=c.branch_init,
                attention_dropout=c.attention_dropout,
                causal=True,
            )
        return multihead(causal=True)

    common = {"d_model": c.d_model, "dropout": c.dropout, "norm": c.norm}
    encoder = [
        EncoderLayer(self_attn=branched_sublayer(layer=i), ffn=None, **common)
        if branched
        else EncoderLayer(self_attn=multihead(causal=False), ffn=ffn(), **common)
        for i in range(c.encoder_layers)
    ]
    decoder = [
        DecoderLayer(
            self_attn=decoder_self(),
            cross_attn=branched_sublayer(layer=i, cross=True),
            ffn=None,
            **common,
        )
        if branched
        else DecoderLayer(
            self_attn=multihead(causal=True),
            cross_attn=multihead(cross=True),
            ffn=ffn(),
            **common,
        )
        for i in range(c.decoder_layers)
    ]
    transparent = None
    if c.encoder_combination == "transparent":
        transparent = TransparentCombination(
            encoder_layers=c.encoder_layers,
            decoder_layers=c.decoder_layers,
            dropout=c.transparent_dropout,
        )
    model = Seq2Seq(
        embedding=TokenEmbedding(
            vocab_size=vocab_size,
            d_model=c.d_model,
            pad_id=pad_id,
            output_bias=c.output_bias,
            zero_row=BOS if c.decoder_start == "zero" else None,
        ),
        source_embedding=None
        if source_vocab_size is None
        else TokenEmbedding(vocab_size=source_vocab_size, d_model=c.d_model, pad_id=pad_id),
        positions=Positions(
            max_positions=c.max_positions, d_model=c.d_model, learned=c.positions == "learned"
        ),
        encoder_layers=encoder,
        decoder_layers=decoder,
        pre_norm=c.norm == "pre",
        transparent=transparent,
        dropout=c.dropout,
    )
    if c.qkv_init_gain != 1.0:  # Xavier with a gain draws the same numbers times the gain
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, HeadProjection):
                    module.weight.mul_(c.qkv_init_gain)
    return model


def build_like(config: ModelConfig, model: Seq2Seq) -> Seq2Seq:
    """A new model of ``config`` with the vocabularies (and embeddings' shapes) of ``model``."""
    return build_model(
        config,
        vocab_size=model.embedding.weight.size(0),
        source_vocab_size=model.source_vocab_size,
    )
