"""The ``model`` section of a run config: the architecture, the Weighted Transformer's own
options and transparent attention, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wtnmt.config.checks import greater, positive, probability
from wtnmt.config.errors import ConfigError
from wtnmt.config.pruning import KeptBranches


@dataclass(frozen=True)
class ModelConfig:
    """Architecture. Defaults are the Weighted Transformer (A) of the paper (Table 2)."""

    # multihead: the Transformer; branched: the Weighted Transformer
    attention: Literal["multihead", "branched"] = "branched"
    encoder_layers: int = 6  # N of the encoder
    decoder_layers: int = 6  # N of the decoder
    d_model: int = 512  # D, the model's width
    heads: int = 8  # = branches M when attention == "branched"
    d_ff: int = 2048  # F, the feed-forward width (split over the branches)
    dropout: float = 0.1  # residual dropout P_drop
    attention_dropout: float = 0.1  # on the softmax output
    activation_dropout: float = 0.0  # after the FFN's ReLU
    # the FFN's activation: relu (the paper's) or swish, x·σ(x) (Marian's OPUS-MT models)
    activation: Literal["relu", "swish"] = "relu"
    # biases on W^Q, W^K, W^V and W^O (Marian's); the paper's code, tensor2tensor, has none
    attention_bias: bool = False
    # a bias added to the output logits (Marian's final_logits_bias)
    output_bias: bool = False
    # the decoder's first input: `<s>`'s learned embedding (bos), or a zero vector (zero:
    # Marian's convention, `<s>`'s row held at zero, which CTranslate2's converter of a
    # Marian folder assumes: docs/EXPORT.md)
    decoder_start: Literal["bos", "zero"] = "bos"
    # layer norm after each sublayer (post, the paper's) or before it (pre)
    norm: Literal["post", "pre"] = "post"
    # sinusoidal or learned position embeddings
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024  # longest sequence the positions cover
    # W^Q, W^K, W^V start Xavier-uniform times this gain: 1 as tensor2tensor; fairseq's
    # MultiheadAttention uses 1/√2 (0.7071…), "convergence much better" by its comment
    qkv_init_gain: float = 1.0
    # Weighted Transformer options (used when attention == "branched")
    decoder_self_attention: Literal["multihead", "weighted"] = "multihead"
    # each branch its own FFN of width F/M (split) or one shared
    branch_ffn: Literal["split", "shared"] = "split"
    # simplex: learned, as in the paper; fixed: κ = α = 1/M, never learned (a control)
    branch_weights: Literal["simplex", "softmax", "topk", "fixed"] = "simplex"
    branch_topk: int = 2  # k for branch_weights == "topk"
    # κ, α initialised at random on the simplex or uniform (1/M)
    branch_init: Literal["random", "uniform"] = "random"
    # a pruned model (`wtnmt prune`): per layer, the branches kept (null: all M)
    kept_branches: KeptBranches | None = None
    # Transparent attention (Bapna et al., 2018)
    encoder_combination: Literal["top", "transparent"] = "top"
    transparent_dropout: float = 0.1  # dropout of the transparent-attention weights (Bapna et al.)

    def __post_init__(self) -> None:
        positive(self, "model", "encoder_layers", "decoder_layers", "d_model", "heads", "d_ff")
        positive(self, "model", "max_positions", "branch_topk")
        probability(self, "model", "dropout", "attention_dropout", "activation_dropout")
        probability(self, "model", "transparent_dropout")
        greater(self, "model", 0, "qkv_init_gain")
        if self.d_model % self.heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.heads={self.heads}"
            )
        if self.d_model % 2:
            raise ConfigError(f"model.d_model={self.d_model} must be even (sinusoidal positions)")
        if self.attention == "branched" and self.branch_ffn == "split" and self.d_ff % self.heads:
            raise ConfigError(
                f"model.d_ff={self.d_ff} is not divisible by model.heads={self.heads}: "
                "branch_ffn: split gives each of the M branches an FFN of width d_ff/M"
            )
        if self.attention == "multihead":  # options a Transformer would silently ignore
            for name, default in _BRANCHED_ONLY.items():
                if getattr(self, name) != default:
                    raise ConfigError(
                        f"model.{name}={getattr(self, name)!r} applies to the Weighted "
                        f"Transformer only (model.attention: branched); this model has "
                        f"model.attention: multihead"
                    )
        if self.attention == "branched":  # options the branched layers have no place for
            for name, default in _TRANSFORMER_ONLY.items():
                if getattr(self, name) != default:
                    raise ConfigError(
                        f"model.{name}={getattr(self, name)!r} applies to the Transformer only "
                        f"(model.attention: multihead); this model has model.attention: branched"
                    )
        if self.branch_weights == "topk" and self.branch_topk > self.heads:
            raise ConfigError(
                f"model.branch_topk={self.branch_topk} exceeds the number of branches "
                f"model.heads={self.heads}"
            )

        if self.kept_branches is not None:
            self.kept_branches.check(
                encoder_layers=self.encoder_layers,
                decoder_layers=self.decoder_layers,
                branches=self.heads,
            )
            if self.branch_weights not in ("simplex", "fixed"):
                raise ConfigError(
                    f"model.kept_branches: a pruned model's branch weights are simplex or "
                    f"fixed, not model.branch_weights={self.branch_weights!r}"
                )

    @property
    def branches(self) -> int:
        return self.heads

    def kept(self, side: Literal["encoder", "decoder"], layer: int) -> int:
        """How many branches the branched sublayer of ``side``'s layer ``layer`` has."""
        return len(self.branch_numbers(side, layer))

    def branch_numbers(self, side: Literal["encoder", "decoder"], layer: int) -> list[int]:
        """The numbers, from 1, that the branches of ``side``'s layer ``layer`` (encoder
        self-attention, decoder cross-attention) had in the model as trained: 1…M unless
        pruning removed some, so that a pruned model's branch 3 is the full model's branch 3."""
        if self.kept_branches is None:
            return list(range(1, self.heads + 1))
        return [i + 1 for i in getattr(self.kept_branches, side)[layer]]


# the Weighted Transformer's own options and their defaults
_BRANCHED_ONLY = {
    "decoder_self_attention": "multihead",
    "branch_ffn": "split",
    "branch_weights": "simplex",
    "branch_topk": 2,
    "branch_init": "random",
    "kept_branches": None,
}

# the Transformer's options that the Weighted Transformer's branched layers do not take
_TRANSFORMER_ONLY = {"activation": "relu", "attention_bias": False}


__all__ = ["ModelConfig"]
