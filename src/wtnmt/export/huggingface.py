"""`wtnmt export hf RUN --out DIR`: a run as a folder `transformers` loads. A Transformer, with
its own classes (``AutoTokenizer``, ``AutoModelForSeq2SeqLM``, ``pipeline("translation")``),
no remote code: Marian's architecture (``MarianMTModel``), the nearest to wtnmt's Transformer.

Every difference is mapped exactly:
- Marian lays its sinusoidal positions out as all the sines, then all the cosines; wtnmt
  interleaves them (Vaswani et al.). The frequencies are the same, so the export permutes the
  model's D hidden dimensions (sines first): every matrix reading or writing the residual
  stream, the embeddings and the layer norms, by the same permutation. A layer norm's mean and
  variance do not depend on the order, nor does a product over the hidden dimension, so the
  network computes the same function up to the order of float32 sums.
- wtnmt's attention projections have no biases (unless ``model.attention_bias``): Marian's are
  zero. ``final_logits_bias`` is ``model.output_bias`` where the model has one, else zero.
- The decoder starts from ``<s>`` (Marian's own models start from ``<pad>``):
  ``decoder_start_token_id`` says so; the source ends with ``</s>`` as Marian's tokenizer
  makes it; ``<pad>`` and ``<s>`` are never generated (``bad_words_ids``), as in wtnmt's search.
- A model trained with ``model.decoder_start: zero`` (``<s>``'s row zero, Marian's convention)
  and one vocabulary gets OPUS-MT's layout as CTranslate2's converter reads it: wtnmt's ids,
  wtnmt's ``<pad>`` named ``<unused-pad>``, then one more id, ``<pad>``, last: a zero row, the
  decoder's start and the batches' padding, its logit biased by −10⁴ (its share of the
  softmax is 0 in float32, so the softmax is wtnmt's; the converter drops that row).
- Joint vocabulary: one embedding shared by encoder, decoder and output
  (``share_encoder_decoder_embeddings``); separate: the source's its own, the decoder's tied
  to the output.

What ``generate`` cannot express (docs/EXPORT.md): wtnmt's length limit a·|x| + b a sentence
(``generation_config.json`` carries the model's own limit, ``max_length``), and the GNMT
length penalty ((5 + |y|) / 6)^α (``generate`` divides by |y|^α: wtnmt's ``fairseq`` form).
The model card is model_card.py's.

Every other model (the Weighted Transformer's branched layers, pre-norm, learned positions,
transparent attention) has no Marian counterpart: its folder ships wtnmt's own modelling code
(hf_modeling.py and the model's modules, written by hf_code.py), loaded with
``trust_remote_code=True`` by the same Auto classes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import Tensor

from wtnmt.data.vocab import vocabulary_files
from wtnmt.errors import CheckpointError
from wtnmt.export.plain import check_new_or_empty, departures, pieces, written_whole
from wtnmt.rundir import load_run
from wtnmt.special import BOS, EOS, PAD


def marian_unsupported(model_config) -> str | None:  # type: ignore[no-untyped-def]
    """Why a run's model has no Marian counterpart (None: it has one; learned positions
    have none as Marian's are computed, not stored)."""
    found = departures(model_config)
    if found and found[0] == "model.attention: branched":
        return "a Weighted Transformer's branched layers have no Marian counterpart"
    return f"{found[0]} has no Marian counterpart" if found else None


def sines_first(d_model: int) -> Tensor:
    """The permutation of the hidden dimensions from wtnmt's interleaved sin/cos positions to
    Marian's halves: Marian's dimension k is wtnmt's ``perm[k]``."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


ZERO_START_PAD = "<unused-pad>"  # wtnmt's <pad> in the zero-start layout (its name is taken)
OUT_OF_SOFTMAX = -1e4  # a logit whose exp is 0 beside any real one, in float32


def zero_start_pad(model, config, vocab) -> int | None:  # type: ignore[no-untyped-def]
    """The id of the extra ``<pad>`` row of the zero-start layout (the module docstring), or
    None where the export keeps wtnmt's ids alone."""
    if config.model.decoder_start != "zero" or not vocab.joint:
        return None
    return int(model.embedding.weight.size(0))


def marian_config(model, config, vocab):  # type: ignore[no-untyped-def]
    """The ``MarianConfig`` of wtnmt's Transformer ``model`` (its run's ``config``)."""
    from transformers import MarianConfig

    m, enc, dec = config.model, model.encoder_layers, model.decoder_layers
    source = getattr(model, "source_embedding", model.embedding).weight.size(0)
    extra = zero_start_pad(model, config, vocab)
    grow = 0 if extra is None else 1
    return MarianConfig(
        vocab_size=source + grow,
        decoder_vocab_size=model.embedding.weight.size(0) + grow,
        share_encoder_decoder_embeddings=vocab.joint,
        tie_word_embeddings=True,
        d_model=model.embedding.weight.size(1),
        encoder_layers=len(enc),
        decoder_layers=len(dec),
        encoder_attention_heads=enc[0].self_attn.attn.heads,
        decoder_attention_heads=dec[0].self_attn.attn.heads,
        encoder_ffn_dim=enc[0].ffn.fc1.weight.size(0),
        decoder_ffn_dim=dec[0].ffn.fc1.weight.size(0),
        activation_function=m.activation,  # relu or swish
        max_position_embeddings=model.max_positions,
        scale_embedding=True,  # √D
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout,
        pad_token_id=PAD if extra is None else extra,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS if extra is None else extra,
        forced_eos_token_id=None,  # (generation_config.json's: a search setting)
        architectures=["MarianMTModel"],
    )


def marian_state(model, zero_start: bool = False) -> dict[str, Tensor]:  # type: ignore[no-untyped-def]
    """``MarianMTModel``'s weights from wtnmt's Transformer, hidden dimensions permuted;
    ``zero_start``: with the zero-start layout's extra ``<pad>`` row."""
    d = model.embedding.weight.size(1)
    p = sines_first(d)
    out: dict[str, Tensor] = {}

    def put(name: str, value: Tensor) -> None:
        out[name] = value.detach().float().contiguous().clone()

    def norm(name: str, layer_norm) -> None:  # type: ignore[no-untyped-def]
        put(f"{name}.weight", layer_norm.weight[p])
        put(f"{name}.bias", layer_norm.bias[p])

    def attention(name: str, sublayer, reading: Tensor | None = None) -> None:  # type: ignore[no-untyped-def]
        qkv, bias = sublayer.attn.proj.weight, sublayer.attn.proj.bias  # [3·H·Dk, D]: q; k; v
        inner = qkv.size(0) // 3
        bias = torch.zeros(3 * inner) if bias is None else bias
        for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
            put(f"{name}.{part}.weight", qkv[i * inner : (i + 1) * inner][:, p])
            put(f"{name}.{part}.bias", bias[i * inner : (i + 1) * inner])
        h, dk, _ = sublayer.w_out.shape
        put(f"{name}.out_proj.weight", sublayer.w_out.reshape(h * dk, d).t()[p])
        out_bias = sublayer.out_bias
        put(f"{name}.out_proj.bias", torch.zeros(d) if out_bias is None else out_bias[p])

    def ffn(name: str, block) -> None:  # type: ignore[no-untyped-def]
        put(f"{name}.fc1.weight", block.fc1.weight[:, p])
        put(f"{name}.fc1.bias", block.fc1.bias)
        put(f"{name}.fc2.weight", block.fc2.weight[p])
        put(f"{name}.fc2.bias", block.fc2.bias[p])

    target = model.embedding.weight[:, p]
    source = getattr(model, "source_embedding", model.embedding).weight[:, p]
    logits_bias = model.embedding.bias
    logits_bias = torch.zeros(target.size(0)) if logits_bias is None else logits_bias.detach()
    if zero_start:  # (one vocabulary: source is target)
        target = source = torch.cat([target, target.new_zeros(1, d)])
        logits_bias = torch.cat([logits_bias, logits_bias.new_full((1,), OUT_OF_SOFTMAX)])
    if getattr(model, "source_embedding", None) is None:
        put("model.shared.weight", target)
    put("model.encoder.embed_tokens.weight", source)
    put("model.decoder.embed_tokens.weight", target)
    put("lm_head.weight", target)
    put("final_logits_bias", logits_bias.view(1, -1))
    for i, layer in enumerate(model.encoder_layers):
        name = f"model.encoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attn)
        norm(f"{name}.self_attn_layer_norm", layer.self_attn_res.norm)
        ffn(name, layer.ffn)
        norm(f"{name}.final_layer_norm", layer.ffn_res.norm)
    for i, layer in enumerate(model.decoder_layers):
        name = f"model.decoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attn)
        norm(f"{name}.self_attn_layer_norm", layer.self_attn_res.norm)
        attention(f"{name}.encoder_attn", layer.cross_attn)
        norm(f"{name}.encoder_attn_layer_norm", layer.cross_attn_res.norm)
        ffn(name, layer.ffn)
        norm(f"{name}.final_layer_norm", layer.ffn_res.norm)
    table = model.positions.table[:, p]  # (Marian makes its own at load: the same numbers)
    put("model.encoder.embed_positions.weight", table)
    put("model.decoder.embed_positions.weight", table)
    return out


def marian_model(model, config, vocab):  # type: ignore[no-untyped-def]
    """A ``MarianMTModel`` computing what wtnmt's Transformer ``model`` computes."""
    from transformers import MarianMTModel

    hf = MarianMTModel(marian_config(model, config, vocab)).eval()
    state = marian_state(model, zero_start=zero_start_pad(model, config, vocab) is not None)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in state and "shared" not in k]
    if missing or unexpected:  # (a transformers release that renamed Marian's weights)
        raise CheckpointError(
            f"this transformers' MarianMTModel has other weights (missing {missing[:3]}, "
            f"unknown {unexpected[:3]})"
        )
    return hf


def _ids(vocab, extra: int | None = None) -> dict[str, int]:  # type: ignore[no-untyped-def]
    names = pieces(vocab)
    if extra is not None:  # the zero-start layout: <pad> last, wtnmt's renamed
        names[PAD] = ZERO_START_PAD
        names.append("<pad>")
    return {piece: i for i, piece in enumerate(names)}


def write_tokenizer(vocab, config, out: Path, extra: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """Marian's tokenizer files: the run's SentencePiece model(s) and the piece → id maps
    (``extra``: the zero-start layout's ``<pad>`` id)."""
    from transformers import MarianTokenizer

    work = out / ".tokenizer"
    work.mkdir()
    shutil.copyfile(vocab.source.path, work / "source.spm")
    shutil.copyfile(vocab.target.path, work / "target.spm")
    (work / "vocab.json").write_text(json.dumps(_ids(vocab.source, extra), ensure_ascii=False))
    target_vocab = None
    if not vocab.joint:
        target_vocab = work / "target_vocab.json"
        target_vocab.write_text(json.dumps(_ids(vocab.target), ensure_ascii=False))
    tokenizer = MarianTokenizer(
        source_spm=str(work / "source.spm"),
        target_spm=str(work / "target.spm"),
        vocab=str(work / "vocab.json"),
        target_vocab_file=None if target_vocab is None else str(target_vocab),
        separate_vocabs=not vocab.joint,
        source_lang=config.data.src_lang,
        target_lang=config.data.tgt_lang,
        model_max_length=config.model.max_positions - 1,  # room for </s>
    )
    tokenizer.save_pretrained(str(out))
    shutil.rmtree(work)


def generation_config(config, *, cache: bool = True, extra: int | None = None):  # type: ignore[no-untyped-def]
    """The run's search as ``generate`` takes it (what it cannot take: the module docstring);
    ``cache``: whether the model keeps keys and values (the shipped code recomputes);
    ``extra``: the zero-start layout's ``<pad>`` id."""
    from transformers import GenerationConfig

    d = config.decode
    return GenerationConfig(
        use_cache=cache,
        decoder_start_token_id=BOS if extra is None else extra,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD if extra is None else extra,
        forced_eos_token_id=EOS,
        bad_words_ids=[[PAD], [BOS]] + ([] if extra is None else [[extra]]),
        num_beams=d.beam,
        length_penalty=d.length_penalty,
        early_stopping=True,  # a sentence's search ends with its beam's first hypotheses
        max_length=config.model.max_positions,
    )


def remote_model(model, config):  # type: ignore[no-untyped-def]
    """wtnmt's ``model`` behind `transformers`' interfaces (hf_modeling.py), for a folder
    that ships its code (``auto_map``; hf_code.py writes the code)."""
    from wtnmt.config import config_to_dict
    from wtnmt.export.hf_code import MODELING
    from wtnmt.export.hf_modeling import WtnmtConfig, WtnmtForTranslation

    hf_config = WtnmtConfig(
        wtnmt_model=config_to_dict(config)["model"],
        vocab_size=model.embedding.weight.size(0),
        source_vocab_size=model.source_vocab_size,
        architectures=["WtnmtForTranslation"],
        auto_map={
            "AutoConfig": f"{MODELING}.WtnmtConfig",
            "AutoModelForSeq2SeqLM": f"{MODELING}.WtnmtForTranslation",
        },
    )
    hf = WtnmtForTranslation(hf_config).eval()
    hf.model.load_state_dict(model.state_dict())
    return hf


def export_hf(run: str | Path, out: str | Path, *, weights: str = "model.safetensors") -> Path:
    """`wtnmt export hf`'s body: the folder ``out`` (new, or empty), written whole or not at
    all (made beside it, then renamed). A Transformer Marian expresses becomes a Marian model;
    every other model ships wtnmt's modelling code (``trust_remote_code=True``)."""
    out = Path(out)
    check_new_or_empty(out)
    config, vocab, model = load_run(run, weights=weights)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise CheckpointError("export hf needs transformers: pip install 'wtnmt[hf]'") from None
    from wtnmt.export.hf_code import bundle
    from wtnmt.export.model_card import model_card

    marian = marian_unsupported(config.model) is None
    extra = zero_start_pad(model, config, vocab) if marian else None
    with written_whole(out) as work:
        if marian:
            marian_model(model, config, vocab).save_pretrained(str(work))
        else:
            remote_model(model, config).save_pretrained(str(work))
            bundle(work)
        generation_config(config, cache=marian, extra=extra).save_pretrained(str(work))
        write_tokenizer(vocab, config, work, extra)
        for name in vocabulary_files(vocab.joint):  # wtnmt's own names too (wtnmt import)
            shutil.copyfile(Path(run) / name, work / name)
        card = model_card(Path(run), config, weights, model=model, marian=marian)
        (work / "README.md").write_text(card, encoding="utf-8")
    return out


__all__ = [
    "export_hf",
    "generation_config",
    "marian_config",
    "marian_model",
    "marian_state",
    "marian_unsupported",
    "remote_model",
    "sines_first",
]
