"""`wtnmt export ctranslate2 RUN --out DIR`: a Transformer run as a CTranslate2 model that
computes what wtnmt computes (post-norm, tied embeddings, sinusoidal positions; the
greedy outputs of the two engines are checked identical by
benchmarks/decode_vs_ctranslate2.py). CTranslate2's layer specs are fixed: the branched
layers of a Weighted Transformer have none, and are refused with that reason, as are the
options these specs are not mapped for. Needs ``pip install ctranslate2``.

Used as CTranslate2's users use it: the source's SentencePiece pieces (the run's model, copied
into the export: ``spm.model``, or ``spm.src.model`` and ``spm.tgt.model``) to
``Translator.translate_batch``; the config adds the ``</s>`` wtnmt trains with
(``add_source_eos``). wtnmt's search never emits ``<pad>`` or ``<s>`` and stops at
``decode.max_len_a``·|x| + ``max_len_b`` tokens: ``suppress_sequences=[["<pad>"], ["<s>"]]``
and ``max_decoding_length`` do the same there.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import torch

from wtnmt.data.vocab import vocabulary_files
from wtnmt.errors import CheckpointError
from wtnmt.export.plain import check_new_or_empty, departures, pieces
from wtnmt.rundir import load_run


def _np(t: torch.Tensor):  # type: ignore[no-untyped-def]
    # a copy: CTranslate2's optimize() rewrites some arrays in place, and .numpy() shares
    # the model's memory
    return t.detach().float().numpy().copy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:  # type: ignore[no-untyped-def]
    spec.weight = _np(weight)  # [out, in]
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec, norm: torch.nn.LayerNorm) -> None:  # type: ignore[no-untyped-def]
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _out_projection(attention) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """W^O as an [out, in] matrix: heads are concatenated, then multiplied by [H·Dk, D]."""
    h, dk, d = attention.w_out.shape
    return attention.w_out.reshape(h * dk, d).t()


def ctranslate2_spec(model, tokens: list[str], source_tokens: list[str] | None = None):  # type: ignore[no-untyped-def]
    """A ctranslate2 TransformerSpec computing what the wtnmt Transformer ``model`` computes;
    ``source_tokens`` where the source has a vocabulary of its own (``tokens``: the target's)."""
    from ctranslate2.specs import common_spec, transformer_spec

    enc, dec = model.encoder_layers, model.decoder_layers
    heads = enc[0].self_attn.attn.heads
    swish = enc[0].ffn.swish  # model.activation
    activation = common_spec.Activation.SWISH if swish else common_spec.Activation.RELU
    spec = transformer_spec.TransformerSpec.from_config(
        (len(enc), len(dec)), heads, pre_norm=False, activation=activation
    )
    d = model.embedding.weight.size(1)
    table = model.positions.table  # sinusoidal, interleaved sin/cos (not fairseq's halves)
    source_table = getattr(model, "source_embedding", model.embedding).weight
    for side, words in ((spec.encoder, source_table), (spec.decoder, model.embedding.weight)):
        embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        embeddings.weight = _np(words)
        side.scale_embeddings = True  # √D
        side.position_encodings.encodings = _np(table)
    _linear(spec.decoder.projection, model.embedding.weight, model.embedding.bias)  # tied
    for layer_spec, layer in zip(spec.encoder.layer, enc, strict=True):
        proj = layer.self_attn.attn.proj  # q; k; v
        _linear(layer_spec.self_attention.linear[0], proj.weight, proj.bias)
        _linear(
            layer_spec.self_attention.linear[1],
            _out_projection(layer.self_attn),
            layer.self_attn.out_bias,
        )
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_res.norm)
        _linear(layer_spec.ffn.linear_0, layer.ffn.fc1.weight, layer.ffn.fc1.bias)
        _linear(layer_spec.ffn.linear_1, layer.ffn.fc2.weight, layer.ffn.fc2.bias)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_res.norm)
    for layer_spec, layer in zip(spec.decoder.layer, dec, strict=True):
        proj = layer.self_attn.attn.proj
        _linear(layer_spec.self_attention.linear[0], proj.weight, proj.bias)
        _linear(
            layer_spec.self_attention.linear[1],
            _out_projection(layer.self_attn),
            layer.self_attn.out_bias,
        )
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_res.norm)
        cross, bias = layer.cross_attn.attn.proj.weight, layer.cross_attn.attn.proj.bias
        _linear(layer_spec.attention.linear[0], cross[:d], None if bias is None else bias[:d])
        # k; v fused, CTranslate2's order
        _linear(layer_spec.attention.linear[1], cross[d:], None if bias is None else bias[d:])
        _linear(
            layer_spec.attention.linear[2],
            _out_projection(layer.cross_attn),
            layer.cross_attn.out_bias,
        )
        _norm(layer_spec.attention.layer_norm, layer.cross_attn_res.norm)
        _linear(layer_spec.ffn.linear_0, layer.ffn.fc1.weight, layer.ffn.fc1.bias)
        _linear(layer_spec.ffn.linear_1, layer.ffn.fc2.weight, layer.ffn.fc2.bias)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_res.norm)
    spec.config.layer_norm_epsilon = enc[0].self_attn_res.norm.eps
    spec.config.decoder_start_token = "<s>"
    spec.config.add_source_eos = True  # wtnmt trains with </s> after every source
    spec.register_source_vocabulary(tokens if source_tokens is None else source_tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def convert(  # type: ignore[no-untyped-def]
    model, tokens: list[str], out: Path, quantization: str, source_tokens: list[str] | None = None
) -> Path:
    """Save the model for CTranslate2 (in a helper thread: see the module docstring)."""

    def work() -> None:
        spec = ctranslate2_spec(model, tokens, source_tokens)
        spec.validate()
        spec.optimize(quantization=quantization)
        out.mkdir(parents=True, exist_ok=True)
        spec.save(str(out))

    _in_helper_thread(work)
    return out


def _in_helper_thread(work) -> object:  # type: ignore[no-untyped-def]
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as error:  # re-raised in the caller
            box["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def unsupported(model_config) -> str | None:  # type: ignore[no-untyped-def]
    """Why a run's model has no CTranslate2 spec here (None: it has one)."""
    found = departures(model_config)
    if found and found[0] == "model.attention: branched":
        return (
            "a Weighted Transformer's branched layers have no CTranslate2 layer spec (its "
            "layers are fixed; use wtnmt export onnx and --engine onnxruntime)"
        )
    return f"{found[0]} is not mapped to CTranslate2's spec" if found else None


def export_ctranslate2(
    run: str | Path, out: str | Path, *, weights: str = "model.safetensors", quantize: str = "none"
) -> Path:
    """Convert a Transformer run; ``quantize="int8"``: CTranslate2's int8 weights."""
    out = Path(out)
    check_new_or_empty(out)
    config, vocab, model = load_run(run, weights=weights)
    reason = unsupported(config.model)
    if reason:
        raise CheckpointError(f"{run}: {reason}")
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise CheckpointError("exporting to CTranslate2 needs: pip install ctranslate2") from None
    source, target = (pieces(v) for v in (vocab.source, vocab.target))
    quantization = "int8" if quantize == "int8" else "float32"
    convert(model, target, out, quantization, None if vocab.joint else source)
    for name in vocabulary_files(vocab.joint):  # the pieces a user feeds it, made as ours
        shutil.copyfile(Path(run) / name, out / name)
    return out


__all__ = ["convert", "ctranslate2_spec", "export_ctranslate2", "unsupported"]
