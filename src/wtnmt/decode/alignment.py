"""Alignments from the cross-attention: for each output token, the source token its decoder
attended to most (fairseq's ``--print-alignment``, Marian's ``--alignment``), what carries
markup and tags across a translation.

The maps are decode/attention.py's (one teacher-forced pass over the source and the output the
search found). By default the penultimate decoder layer is read (Garg et al., 2019, found it
the best aligned of a Transformer's layers; a one-layer decoder: its only layer), every head
averaged — every branch, in a Weighted Transformer, weighted by its κ, the weight the model
itself gives the branch's output. Links are ``i-j``: source position i, output position j,
from 0, by subword piece or by whitespace word (a word's links are its pieces' links, merged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from wtnmt.decode.attention import LayerAttention

LEVELS = ("words", "pieces")


@dataclass(frozen=True)
class AlignmentSource:
    """What an alignment is read from: a decoder ``layer`` (None: the penultimate), its
    ``heads`` (numbered from 1 as the maps hold them; None: all), the ``level``."""

    layer: int | None = None
    heads: tuple[int, ...] | None = None
    level: str = "words"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"alignment level {self.level!r}: one of {', '.join(LEVELS)}")

    def layer_of(self, layers: int) -> int:
        """The decoder layer read, of ``layers``; a ValueError naming the range otherwise."""
        chosen = max(0, layers - 2) if self.layer is None else self.layer
        if not 0 <= chosen < layers:
            raise ValueError(
                f"alignment layer {chosen}: the decoder's layers are 0 to {layers - 1}"
            )
        return chosen

    def weights(self, attention: LayerAttention) -> torch.Tensor:
        """[M] the weight of each head or branch of ``attention`` in the average."""
        m = attention.maps.size(0)
        chosen = list(range(1, m + 1)) if self.heads is None else list(self.heads)
        for head in chosen:
            if not 1 <= head <= m:
                raise ValueError(f"alignment head {head}: this layer's are 1 to {m}")
        weights = torch.zeros(m)
        for head in chosen:
            weights[head - 1] = 1.0 if attention.kappa is None else attention.kappa[head - 1]
        return weights / weights.sum()


def piece_links(attention: LayerAttention, weights: torch.Tensor) -> list[tuple[int, int]]:
    """(source piece, output piece) for each output piece: the source piece its averaged
    attention weighs most (the source's EOS never; none where the source is empty)."""
    maps = attention.maps  # [M, T+1, S+1]
    averaged = torch.einsum("m,mts->ts", weights, maps.float())[:-1, :-1]  # no EOS row, column
    if averaged.numel() == 0:
        return []
    return [(int(s), t) for t, s in enumerate(averaged.argmax(dim=1).tolist())]


def word_starts(pieces: Sequence[str]) -> list[int]:
    """The word index of each SentencePiece piece (a new word at each '▁')."""
    index, out = -1, []
    for i, piece in enumerate(pieces):
        if piece.startswith("▁") or i == 0:
            index += 1
        out.append(index)
    return out


def word_links(
    links: list[tuple[int, int]], source: Sequence[str], output: Sequence[str]
) -> list[tuple[int, int]]:
    """Piece links → word links: each pair of words with a link between their pieces."""
    src_word, out_word = word_starts(source), word_starts(output)
    return sorted({(src_word[s], out_word[t]) for s, t in links}, key=lambda st: (st[1], st[0]))


def format_links(links: list[tuple[int, int]]) -> str:
    """``i-j`` pairs, space-separated (Moses' and fast_align's format)."""
    return " ".join(f"{s}-{t}" for s, t in links)


__all__ = [
    "LEVELS",
    "AlignmentSource",
    "format_links",
    "piece_links",
    "word_links",
    "word_starts",
]


def align(  # type: ignore[no-untyped-def]
    model,
    vocab,
    sources: list[list[int]],
    outputs: list[list[int]],
    how: AlignmentSource,
    *,
    device: torch.device,
) -> list[list[tuple[int, int]]]:
    """The links of each (source ids, output ids) pair, read as ``how`` says from ``model``'s
    cross-attention; ``vocab`` (Vocabularies) names the pieces words are made of."""
    from wtnmt.decode.attention import cross_attention

    found: list[list[tuple[int, int]]] = [[] for _ in sources]
    kept = [i for i, (s, o) in enumerate(zip(sources, outputs, strict=True)) if s and o]
    maps = cross_attention(model, [sources[i] for i in kept], [outputs[i] for i in kept],
                           device=device)  # fmt: skip
    for i, layers in zip(kept, maps, strict=True):
        attention = layers[how.layer_of(len(layers))]
        links = piece_links(attention, how.weights(attention))
        if how.level == "words":
            src = [vocab.source.sp.id_to_piece(t) for t in sources[i]]
            out = [vocab.target.sp.id_to_piece(t) for t in outputs[i]]
            links = word_links(links, src, out)
        found[i] = links
    return found


def describe(model, how: AlignmentSource) -> str:  # type: ignore[no-untyped-def]
    """Where ``how`` reads alignments in ``model``, with the branch weights it averages by."""
    from wtnmt.model import BranchWeights

    layers = len(model.decoder_layers)
    layer = how.layer_of(layers)
    cross = model.decoder_layers[layer].cross_attn
    weights = [m for m in cross.modules() if isinstance(m, BranchWeights)]
    heads = "every head" if how.heads is None else f"heads {','.join(map(str, how.heads))}"
    text = f"alignments ({how.level}) from the cross-attention of decoder layer {layer}"
    text += f" (of 0–{layers - 1})"
    if not weights:
        return f"{text}, {heads} averaged"
    kappa = weights[0]()[0].detach().float().tolist()
    shown = " ".join(f"{k:.3f}" for k in kappa)
    branches = "every branch" if how.heads is None else f"branches {','.join(map(str, how.heads))}"
    return f"{text}, {branches} weighted by their κ ({shown})"
