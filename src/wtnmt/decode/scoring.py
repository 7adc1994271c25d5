"""The log-probability a model gives whole outputs (teacher-forced): ``Translator.score``."""

from __future__ import annotations

import torch

from wtnmt.decode.batches import padded
from wtnmt.special import PAD


@torch.no_grad()
def log_probabilities(  # type: ignore[no-untyped-def]
    model, src_ids: list[list[int]], hyp_ids: list[list[int]], device: torch.device
) -> list[float]:
    """log P(hyp | src) of each pair of piece-id lists (EOS included), 64 pairs a batch."""
    scores: list[float] = []
    for start in range(0, len(src_ids), 64):
        s = padded(src_ids[start : start + 64], device)
        tgt_in = padded(hyp_ids[start : start + 64], device, bos=True)
        tgt_out = padded(hyp_ids[start : start + 64], device)
        lprobs = torch.log_softmax(model(s, tgt_in).logits.float(), dim=-1)
        picked = lprobs.gather(-1, tgt_out[..., None])[..., 0]
        scores += picked.masked_fill(tgt_out.eq(PAD), 0.0).sum(-1).tolist()
    return scores
