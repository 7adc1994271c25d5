"""`wtnmt import hf DIR --out RUN`: a Marian folder (OPUS-MT's models, or `wtnmt export hf`'s)
as a wtnmt run that translates on every engine, evaluates, serves and fine-tunes
(``train.init_from: RUN``).

Marian's Transformer is wtnmt's with three options on (``model.activation: swish`` where the
folder says so, ``model.attention_bias``, ``model.output_bias``: Marian's
``final_logits_bias``), and every remaining difference mapped exactly, the inverse of
huggingface.py's export:
- Marian's sinusoidal positions are all the sines, then all the cosines; wtnmt interleaves
  them. The hidden dimensions are permuted back (``sines_first``'s inverse) in every matrix
  reading or writing the residual stream, the embeddings and the layer norms.
- The ids are wtnmt's (marian_vocab.py): the embedding rows and output biases are reordered
  with the pieces. wtnmt's ``<s>`` starts the decoder with the row of Marian's start token
  (``<pad>`` in OPUS-MT's models); as Marian has no ``<s>``, and reads a piece its vocabulary
  lacks as ``<unk>``, those rows are never generated: their logit is 100 below that of the row
  they copy, so their share of the softmax (e^-100) vanishes in float32 beside that row's,
  and the softmax over the rest is Marian's to the bit (the label-smoothed loss of a fine-tune
  spreads ε over them too: about 100·ε/V a row more).
- A shared vocabulary segmented by two SentencePiece models (OPUS-MT's ``source.spm`` and
  ``target.spm``) becomes wtnmt's separate vocabularies (``data.joint_vocab: false``) over the
  same ids, the source embedding a copy of the shared one (a fine-tune trains the two apart);
  one model for both sides stays joint.
- Where Marian's start row is zero (OPUS-MT's conversion from Marian leaves it so: Marian
  starts its decoder from a zero vector), the run says ``model.decoder_start: zero``, so that a
  fine-tune keeps that row at zero as Marian would.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from wtnmt.errors import CheckpointError
from wtnmt.export.huggingface import sines_first
from wtnmt.export.marian_vocab import (
    MarianVocabulary,
    id_space,
    read_json_vocab,
    rewritten_spm,
    spm_pieces,
)
from wtnmt.export.plain import check_new_or_empty, written_whole
from wtnmt.special import BOS

RECORD = "imported.json"
# what Marian cannot generate: the logit of the row it copies minus BELOW, whose exp (e^-100)
# vanishes beside that row's own term in float32's sum; FLOOR where that row's bias is -inf
BELOW, FLOOR = 100.0, -1e4
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}


def _refusals(hf: Any) -> list[str]:
    """What a Marian config sets that wtnmt's Transformer cannot express."""
    c = hf
    found = []
    for key in ("attention_heads", "ffn_dim"):
        if getattr(c, f"encoder_{key}") != getattr(c, f"decoder_{key}"):
            found.append(f"encoder_{key} ≠ decoder_{key}")
    if c.activation_function not in ACTIVATIONS:
        found.append(f"activation_function {c.activation_function!r} (wtnmt: relu, swish)")
    if not c.scale_embedding:
        found.append("scale_embedding false (wtnmt scales embeddings by √D)")
    if getattr(c, "normalize_before", False):
        found.append("normalize_before")
    if c.d_model % 2 or c.d_model % c.encoder_attention_heads:
        found.append(f"d_model {c.d_model} with {c.encoder_attention_heads} heads")
    return found


def _check_kind(folder: Path) -> Path:
    """The folder's config.json, of a Marian model: a CheckpointError otherwise."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder}: no config.json there; is it a Hugging Face model folder?")
    try:
        kind = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{config_file}: not readable JSON ({e})") from None
    if kind != "marian":
        raise CheckpointError(
            f"{config_file}: model_type {kind!r}; wtnmt imports Marian models (model_type "
            f"'marian', MarianMTModel: OPUS-MT's and `wtnmt export hf`'s)"
        )
    return config_file


def _load_marian(folder: Path):  # type: ignore[no-untyped-def]
    """The folder's ``MarianMTModel`` (its weights in whichever file transformers reads)."""
    config_file = folder / "config.json"
    try:
        from transformers import MarianMTModel
    except ImportError:
        raise CheckpointError("import hf needs transformers: pip install 'wtnmt[hf]'") from None
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # (its bar of the weights loaded: one line is ours)
    try:
        model = MarianMTModel.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{folder}: transformers cannot load its model ({first})") from None
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    refused = _refusals(model.config)
    if refused:
        raise CheckpointError(f"{config_file}: {'; '.join(refused)}: wtnmt cannot express it")
    return model.eval()


def _tokenizer_files(folder: Path) -> tuple[dict[str, Any], dict[str, int], dict[str, int]]:
    """tokenizer_config.json (or {}), and the source's and the target's vocab.json tables
    (the same object where they are shared)."""
    settings: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").is_file():
        try:
            settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except ValueError as e:
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: not JSON ({e})") from None
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (folder / name).is_file():
            raise CheckpointError(
                f"{folder}: no {name} there (a Marian tokenizer is source.spm, target.spm and "
                f"vocab.json)"
            )
    source = read_json_vocab(folder / "vocab.json")
    target = source
    if settings.get("separate_vocabs"):
        if not (folder / "target_vocab.json").is_file():
            raise CheckpointError(f"{folder}: separate_vocabs, but no target_vocab.json there")
        target = read_json_vocab(folder / "target_vocab.json")
    return settings, source, target


def _rows(weight: Tensor, bias: Tensor | None, space: MarianVocabulary, p: Tensor):  # type: ignore[no-untyped-def]
    """The embedding [V_wtnmt, D] (hidden dimensions in wtnmt's order) and output bias of the
    id ``space``, from Marian's ``weight`` [V, D] and ``bias`` [V] (None: zeros). ``<s>`` takes
    the start token's row, an extra ``<unk>``'s, each with that row's bias − ``BELOW``."""
    never = torch.tensor([i == BOS or row is None for i, row in enumerate(space.rows)])
    index = torch.tensor([space.unk if row is None else row for row in space.rows])
    index[BOS] = space.start
    marian = torch.zeros(weight.size(0)) if bias is None else bias.float()
    out_bias = marian[index]
    out_bias[never] = (out_bias[never] - BELOW).clamp_min(FLOOR)  # (Marian cannot generate them)
    return weight.float()[index][:, p], out_bias


def wtnmt_state(marian, source: MarianVocabulary, target: MarianVocabulary, joint: bool):  # type: ignore[no-untyped-def]
    """wtnmt's state dict of the ``marian`` model, ids in the spaces ``source``/``target``."""
    d = marian.config.d_model
    p = torch.argsort(sines_first(d))  # wtnmt's dimension j is Marian's p[j]
    m = dict(marian.state_dict())
    out: dict[str, Tensor] = {}

    def put(name: str, value: Tensor) -> None:
        out[name] = value.detach().float().contiguous().clone()

    def norm(name: str, hf: str) -> None:
        put(f"{name}.norm.weight", m[f"{hf}.weight"][p])
        put(f"{name}.norm.bias", m[f"{hf}.bias"][p])

    def attention(name: str, hf: str) -> None:
        parts = ("q_proj", "k_proj", "v_proj")
        put(f"{name}.attn.proj.weight", torch.cat([m[f"{hf}.{x}.weight"][:, p] for x in parts]))
        put(f"{name}.attn.proj.bias", torch.cat([m[f"{hf}.{x}.bias"] for x in parts]))
        heads = marian.config.encoder_attention_heads
        w = m[f"{hf}.out_proj.weight"][p].t()  # [H·Dk, D]
        put(f"{name}.w_out", w.reshape(heads, d // heads, d))
        put(f"{name}.out_bias", m[f"{hf}.out_proj.bias"][p])

    def ffn(name: str, hf: str) -> None:
        put(f"{name}.fc1.weight", m[f"{hf}.fc1.weight"][:, p])
        put(f"{name}.fc1.bias", m[f"{hf}.fc1.bias"])
        put(f"{name}.fc2.weight", m[f"{hf}.fc2.weight"][p])
        put(f"{name}.fc2.bias", m[f"{hf}.fc2.bias"][p])

    decoder_embedding = m["model.decoder.embed_tokens.weight"]
    lm_head = marian.get_output_embeddings().weight
    if not torch.equal(lm_head.detach(), decoder_embedding):
        raise CheckpointError(
            "the model's output projection is not its decoder embedding (tie_word_embeddings "
            "false): wtnmt ties them"
        )
    bias = m.get("final_logits_bias")
    weight, out_bias = _rows(decoder_embedding, None if bias is None else bias.view(-1), target, p)
    put("embedding.weight", weight)
    put("embedding.bias", out_bias)
    if not joint:
        src_weight, _ = _rows(m["model.encoder.embed_tokens.weight"], None, source, p)
        put("source_embedding.weight", src_weight)
    for i in range(marian.config.encoder_layers):
        hf, name = f"model.encoder.layers.{i}", f"encoder_layers.{i}"
        attention(f"{name}.self_attn", f"{hf}.self_attn")
        norm(f"{name}.self_attn_res", f"{hf}.self_attn_layer_norm")
        ffn(f"{name}.ffn", hf)
        norm(f"{name}.ffn_res", f"{hf}.final_layer_norm")
    for i in range(marian.config.decoder_layers):
        hf, name = f"model.decoder.layers.{i}", f"decoder_layers.{i}"
        attention(f"{name}.self_attn", f"{hf}.self_attn")
        norm(f"{name}.self_attn_res", f"{hf}.self_attn_layer_norm")
        attention(f"{name}.cross_attn", f"{hf}.encoder_attn")
        norm(f"{name}.cross_attn_res", f"{hf}.encoder_attn_layer_norm")
        ffn(f"{name}.ffn", hf)
        norm(f"{name}.ffn_res", f"{hf}.final_layer_norm")
    return out


def _config(marian, joint: bool, sizes, langs, generation, zero_start: bool):  # type: ignore[no-untyped-def]
    """The run's config.yaml (a dict): the model Marian's, the data section a record of where
    it came from (a fine-tune gives its own), the search the folder's generation config's;
    ``zero_start``: Marian's start row is zero."""
    c = marian.config
    model = {
        "attention": "multihead",
        "encoder_layers": c.encoder_layers,
        "decoder_layers": c.decoder_layers,
        "d_model": c.d_model,
        "heads": c.encoder_attention_heads,
        "d_ff": c.encoder_ffn_dim,
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation_dropout": c.activation_dropout,
        "norm": "post",
        "positions": "sinusoidal",
        "max_positions": c.max_position_embeddings,
        "activation": ACTIVATIONS[c.activation_function],
        "attention_bias": True,
        "output_bias": True,
        "decoder_start": "zero" if zero_start else "bos",
    }
    data = {  # (a fine-tune's config names its own files over these: README, "fine-tune")
        "corpus": None,
        "train_src": "IMPORTED-give-data.train_src",
        "train_tgt": "IMPORTED-give-data.train_tgt",
        "src_lang": langs[0],
        "tgt_lang": langs[1],
        "joint_vocab": joint,
        "vocab_size": sizes[1],
        "max_tokens_per_side": min(250, c.max_position_embeddings - 1),
    }
    decode = {"length_penalty_form": "fairseq"}  # generate's |y|^α
    beams = generation.get("num_beams")
    if isinstance(beams, int) and beams >= 1:
        decode["beam"] = beams
    if isinstance(generation.get("length_penalty"), int | float):
        decode["length_penalty"] = float(generation["length_penalty"])
    return {"data": data, "model": model, "decode": decode}


def _languages(folder: Path, settings: dict[str, Any], given: tuple[str | None, str | None]):  # type: ignore[no-untyped-def]
    """The source and target language names: given, else the tokenizer's, else the folder's
    name (``opus-mt-en-de``); a CheckpointError asking for them otherwise."""
    src, tgt = given
    src = src or settings.get("source_lang")
    tgt = tgt or settings.get("target_lang")
    if not (src and tgt):
        parts = folder.resolve().name.split("-")
        if len(parts) >= 2 and parts[-1] != parts[-2]:
            src, tgt = src or parts[-2], tgt or parts[-1]
    if not (src and tgt) or src == tgt:
        raise CheckpointError(
            f"{folder}: its languages are not recorded; give --src-lang and --tgt-lang"
        )
    return str(src), str(tgt)


def import_hf(
    folder: str | Path,
    out: str | Path,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    say=print,  # type: ignore[no-untyped-def]
) -> Path:
    """`wtnmt import hf`'s body: the run ``out`` (new, or empty), written whole or not at all."""
    import yaml

    from wtnmt.config import ConfigError, config_from_dict, config_to_dict
    from wtnmt.data.vocab import vocabularies_sha256, vocabulary_files
    from wtnmt.model import build_model
    from wtnmt.rundir.files import save_weights
    from wtnmt.rundir.run import MARK, load_run, write_vocabulary
    from wtnmt.safe_files import atomic_write

    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such directory")
    check_new_or_empty(out)
    _check_kind(folder)
    settings, source_table, target_table = _tokenizer_files(folder)
    marian = _load_marian(folder)
    langs = _languages(folder, settings, (src_lang, tgt_lang))
    c = marian.config
    sizes = (c.vocab_size, c.decoder_vocab_size or c.vocab_size)
    shared = source_table is target_table
    target_file = "vocab.json" if shared else "target_vocab.json"
    for name, table, size in (
        ("vocab.json", source_table, sizes[0]),
        (target_file, target_table, sizes[1]),
    ):
        if len(table) != size:
            raise CheckpointError(f"{folder}: {name} has {len(table)} pieces, the model {size}")
    src_spm, tgt_spm = (folder / "source.spm").read_bytes(), (folder / "target.spm").read_bytes()
    found = {}
    for name, data in (("source.spm", src_spm), ("target.spm", tgt_spm)):
        try:
            found[name] = spm_pieces(data)
        except CheckpointError as e:
            raise CheckpointError(f"{folder / name}: {e}") from None
    ids = {"pad": c.pad_token_id, "eos": c.eos_token_id, "start": c.decoder_start_token_id}
    if shared:
        target = source = id_space(source_table, found["source.spm"], where=str(folder), **ids)
    else:  # (the source side never starts a decoder: its <s> row is its padding's)
        source = id_space(
            source_table,
            found["source.spm"],
            where=str(folder / "vocab.json"),
            **{**ids, "start": ids["pad"]},
        )
        target = id_space(target_table, {}, where=str(folder / target_file), **ids)
    spms = []
    for name, model, space in (("source.spm", src_spm, source), ("target.spm", tgt_spm, target)):
        try:
            unused = space.extras if name == "target.spm" else frozenset()
            spms.append(rewritten_spm(model, space.pieces, unused))
        except CheckpointError as e:
            raise CheckpointError(f"{folder / name}: {e}") from None
    joint = shared and spms[0] == spms[1]
    state = wtnmt_state(marian, source, target, joint)
    generation: dict[str, Any] = {}
    if (folder / "generation_config.json").is_file():
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    zero_start = not bool(state["embedding.weight"][BOS].any())
    values = _config(marian, joint, (len(source), len(target)), langs, generation, zero_start)
    try:
        config = config_from_dict(values)
    except ConfigError as e:
        raise CheckpointError(f"{folder}: {e}") from None
    model = build_model(
        config.model, vocab_size=len(target), source_vocab_size=None if joint else len(source)
    )
    model.load_state_dict(state)

    with written_whole(out) as work:
        text = yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)
        atomic_write(work / "config.yaml", MARK + text.encode())
        files = vocabulary_files(joint)
        for name, data in zip(files, spms[:1] if joint else spms, strict=True):
            write_vocabulary(work / name, data)
        save_weights(model, work / "model.safetensors", vocabulary=vocabularies_sha256(work, joint))
        record = {
            "imported_from": str(folder.resolve()),
            "format": "marian",
            "transformers": version("transformers"),
            "pieces": {"source": len(source), "target": len(target)},
            "read_as_unk": sorted(source.extras),  # (pieces of source.spm vocab.json lacks)
            "joint_vocab": joint,
            "shared_embedding_copied": shared and not joint,
        }
        atomic_write(work / RECORD, (json.dumps(record, indent=2) + "\n").encode())
        load_run(work)  # (everything a run's reader checks)
    extra = len(source.extras)
    say(
        f"imported {folder} as {out}: a Transformer of {c.encoder_layers}+{c.decoder_layers} "
        f"layers, D={c.d_model}, {len(target)} pieces"
        + (f" ({extra} of source.spm's that Marian reads as <unk>)" if extra else "")
        + ("" if joint or not shared else "; the shared embedding copied for the source side")
    )
    return out


__all__ = ["import_hf", "wtnmt_state"]
