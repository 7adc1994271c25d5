"""wtnmt's model behind `transformers`' interfaces: the modelling code `wtnmt export hf` ships
inside the folder of a model Marian cannot express (a Weighted Transformer, pre-norm, learned
positions, transparent attention), loaded with ``trust_remote_code=True``.

This module is not copied as it is: hf_code.py writes it into the folder as
``modeling_wtnmt.py`` with wtnmt's own model modules beside it (``wtnmt_model_*.py``, the
package's sources with their imports made relative), so the shipped network is wtnmt's, and the
two cannot drift. Needs only torch and transformers where it is loaded.

``generate`` runs it without a key/value cache: each step recomputes the decoder over the
prefix (wtnmt's teacher-forced ``decode``), which is what wtnmt's cached search is tested
against; slower than wtnmt's own engines, the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from wtnmt.config.loading import config_from_dict
from wtnmt.model.build import build_model
from wtnmt.model.embedding import Positions, sinusoid_table
from wtnmt.model.outputs import EncoderOutput
from wtnmt.special import BOS, EOS, PAD


class WtnmtConfig(PretrainedConfig):
    """``wtnmt_model``: the run's ``model`` section as wtnmt's config has it; the vocabulary
    sizes (``source_vocab_size`` None: one vocabulary for both languages)."""

    model_type = "wtnmt"

    def __init__(
        self,
        wtnmt_model: dict[str, Any] | None = None,
        vocab_size: int = 8000,
        source_vocab_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.wtnmt_model = wtnmt_model or {}
        self.vocab_size = vocab_size
        self.source_vocab_size = source_vocab_size
        for key, value in (
            ("pad_token_id", PAD),
            ("bos_token_id", BOS),
            ("eos_token_id", EOS),
            ("decoder_start_token_id", BOS),
            ("is_encoder_decoder", True),
            ("tie_word_embeddings", False),  # (wtnmt's model ties its own)
        ):
            kwargs.setdefault(key, value)
        super().__init__(**kwargs)


class _Encoder(torch.nn.Module):
    """``generate``'s encoder: the memory the decoder layers attend to, [B, S, D]; where a
    transparent encoder gives each layer its own, all of them side by side on the last axis
    [B, S, N_dec·D] (one tensor, which ``generate`` repeats a beam)."""

    def __init__(self, outer: WtnmtForTranslation) -> None:
        super().__init__()
        self.outer = [outer]  # (a list: not a submodule, whose weights would be counted twice)

    def forward(self, input_ids: torch.Tensor, attention_mask=None, **kwargs: Any):  # type: ignore[no-untyped-def]
        model = self.outer[0].model
        enc = model.encode(input_ids)
        memories = enc.memories if model.transparent is not None else enc.memories[:1]
        return BaseModelOutput(last_hidden_state=torch.cat(memories, dim=-1))


class WtnmtForTranslation(PreTrainedModel, GenerationMixin):
    """wtnmt's Seq2Seq (``self.model``) as a ``transformers`` sequence-to-sequence model."""

    config_class = WtnmtConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: WtnmtConfig) -> None:
        super().__init__(config)
        model_config = config_from_dict({"model": dict(config.wtnmt_model)}).model
        self.model = build_model(
            model_config,
            vocab_size=config.vocab_size,
            source_vocab_size=config.source_vocab_size,
        )
        self._encoder = _Encoder(self)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """What loading does not fill: the sinusoidal positions, a buffer computed, not stored
        (`transformers` makes the model's tensors empty, then loads). Every weight is loaded;
        a new model's are wtnmt's own initialisation."""
        table = getattr(module, "table", None)
        if isinstance(module, Positions) and isinstance(table, torch.Tensor):
            with torch.no_grad():
                table.copy_(sinusoid_table(*table.shape))

    def get_encoder(self) -> torch.nn.Module:
        return self._encoder

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embedding

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_outputs: Any = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput:
        """The next-token logits [B, T, V] after every prefix of ``decoder_input_ids``."""
        if encoder_outputs is None:
            encoder_outputs = self._encoder(input_ids, attention_mask)
        packed = encoder_outputs[0]  # [B, S, D], or [B, S, N_dec·D] (transparent)
        if attention_mask is None:
            src_pad = torch.zeros(packed.shape[:2], dtype=torch.bool, device=packed.device)
        else:
            src_pad = attention_mask.eq(0)
        d, layers = self.model.embedding.weight.size(1), len(self.model.decoder_layers)
        memories = list(packed.split(d, dim=-1)) if packed.size(-1) > d else [packed] * layers
        enc = EncoderOutput(memories=memories, src_pad=src_pad, states=[])
        states, _, _ = self.model.decode(decoder_input_ids, enc)
        logits = self.model.embedding.logits(states)
        return Seq2SeqLMOutput(logits=logits, encoder_last_hidden_state=packed)

    def prepare_inputs_for_generation(  # type: ignore[override]
        self,
        decoder_input_ids: torch.Tensor,
        encoder_outputs: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The whole prefix every step (no cache: the decoder recomputes it)."""
        return {
            "decoder_input_ids": decoder_input_ids,
            "encoder_outputs": encoder_outputs,
            "attention_mask": attention_mask,
        }


__all__ = ["WtnmtConfig", "WtnmtForTranslation"]
