"""The JSON API's request and response bodies (version 1), as FastAPI documents them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float = Field(1.0, gt=0, le=100, description="p^(1/T); 1: the model's")
    top_k: StrictInt = Field(0, ge=0, description="draw among the K most probable (0: all)")
    top_p: float = Field(1.0, gt=0, le=1, description="among those holding P (1: all)")
    seed: StrictInt = Field(0, ge=0, le=0xFFFFFFFF, description="a sentence's samples' seed")
    samples: StrictInt = Field(1, ge=1, description="samples a sentence (at most --max-beam)")


class TranslateRequest(BaseModel):
    # strict types and no unknown fields: "beam": "5" or a misspelt "nbset" is an error, not
    # something silently converted or ignored
    model_config = ConfigDict(extra="forbid", strict=True)

    text: StrictStr | list[StrictStr] = Field(
        description="one sentence, or a list of sentences translated in order"
    )
    beam: StrictInt | None = Field(None, description="beam size (default: the server's)")
    nbest: StrictInt | None = Field(
        None, description="also return the N best translations of each sentence (N ≤ beam)"
    )
    branch_weights: Literal["learned", "uniform", "random"] = Field(
        "learned",
        description="translate with the learned κ/α, or replace them by uniform or random "
        "ones (paper Table 3; Weighted Transformer models only)",
    )
    branch_weights_in: list[StrictStr] | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="replace κ/α in these branched sublayers alone, the rest as learned (names "
        "as GET /v1/model lists them, e.g. encoder_layers.1.self_attn; with branch_weights "
        "uniform or random)",
    )
    seed: StrictInt = Field(0, ge=0, lt=2**63, description="seed of random branch weights")
    attention: StrictBool = Field(
        False, description="also return each sentence's cross-attention maps per branch"
    )
    prefix: StrictStr | list[StrictStr] | None = Field(
        None,
        description="a target prefix each translation begins with, the search going on from "
        'there: one a sentence of text ("" for none), or one string for a single sentence',
    )
    alignment: Literal["words", "pieces"] | None = Field(
        None,
        description="also return each best translation's alignment to its source, [source, "
        "output] position pairs by word or piece, from the cross-attention of the penultimate "
        "decoder layer (branches weighted by κ)",
    )
    sampling: SamplingRequest | None = Field(
        None,
        description="draw the translations from the model instead of searching (without beam "
        "or nbest); nbest then holds its samples in the order drawn",
    )


class Candidate(BaseModel):
    text: str
    # length-normalised log-probability (beam) or log-probability (greedy, sampling); null
    # where the search found no hypothesis for this place (the n-best list has exactly N)
    score: float | None


class LayerMaps(BaseModel):
    layer: int  # decoder layer, from 0
    kappa: list[float] | None  # the branch weights in effect (None: multi-head attention)
    alpha: list[float] | None
    branches: list[int]  # each map's branch (head) number, from 1, in the trained model
    maps: list[list[list[float]]]  # [branch][target token][source token]


class SentenceAttention(BaseModel):
    source: list[str]  # source pieces, then </s>
    target: list[str]  # output pieces, then </s>
    layers: list[LayerMaps]


class TranslateResponse(BaseModel):
    translations: list[str]
    nbest: list[list[Candidate]] | None = None
    attention: list[SentenceAttention | None] | None = None  # None for an empty sentence
    alignments: list[list[list[int]]] | None = None  # [source, output] pairs a sentence
    warnings: list[str] | None = None  # e.g. a sentence cut to the model's maximum length


class ErrorResponse(BaseModel):
    detail: str
    field: str | None = None
    index: int | None = None  # the offending sentence
    limit: float | None = None  # the limit that was exceeded


__all__ = [
    "Candidate",
    "ErrorResponse",
    "LayerMaps",
    "SamplingRequest",
    "SentenceAttention",
    "TranslateRequest",
    "TranslateResponse",
]
