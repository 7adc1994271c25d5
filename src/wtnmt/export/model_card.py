"""The model card of an export for the Hugging Face Hub (``README.md``): the Hub's metadata
block (languages, pipeline, the test scores as a ``model-index``), then what the model is, the
data it learnt from, the recipe, the scores with their sacreBLEU signatures, the learned κ, α
where the model has them, how to use it and what differs from wtnmt's own decoding. Read
from the run's own files (config.yaml, scores.json, finished.json, the weights), nothing
made up: what a run does not record is not said."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from wtnmt.config import RunConfig


def _scores(run: Path) -> dict:  # type: ignore[type-arg]
    path = run / "scores.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def _finished(run: Path) -> dict:  # type: ignore[type-arg]
    path = run / "finished.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def _test(scores: dict) -> dict:  # type: ignore[type-arg]
    """The test scores: an experiment's ``test`` block, or `wtnmt evaluate`'s own (flat)."""
    if isinstance(scores.get("test"), dict):
        return scores["test"]  # type: ignore[no-any-return]
    if "bleu" in scores:
        return scores | {"split": scores.get("run_split") or "given"}
    return {}


def _cell(text: str) -> str:
    """``text`` inside a Markdown table's cell: its ``|`` escaped (a signature's)."""
    return text.replace("|", "\\|")


def _data(config: RunConfig) -> str:
    d = config.data
    if d.corpus:
        return f"the `{d.corpus}` corpus ({d.src_lang}→{d.tgt_lang}), as `wtnmt prepare` splits it"
    return f"the user's own {d.src_lang}→{d.tgt_lang} files (`data.train_*` in the run's config)"


def _metadata(name: str, config: RunConfig, test: dict, marian: bool) -> str:  # type: ignore[type-arg]
    d = config.data
    tags = ["translation", "wtnmt"]
    tags.insert(1, "marian" if marian else "custom_code")
    if config.model.attention == "branched":
        tags.append("weighted-transformer")
    meta: dict = {  # type: ignore[type-arg]
        "language": [d.src_lang, d.tgt_lang],
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": tags,
    }
    if d.corpus:
        meta["datasets"] = [d.corpus]
    if "bleu" in test:
        metrics = [{"type": "bleu", "value": test["bleu"], "name": "BLEU"}]
        if "chrf" in test:
            metrics.append({"type": "chrf", "value": test["chrf"], "name": "chrF"})
        meta["model-index"] = [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "translation", "name": f"{d.src_lang}-{d.tgt_lang}"},
                        "dataset": {"name": d.corpus or "custom", "type": d.corpus or "custom"},
                        "metrics": metrics,
                    }
                ],
            }
        ]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _what(config: RunConfig, marian: bool) -> tuple[str, str]:
    """The model's name in the title, and the paragraph that says what it is."""
    m = config.model
    if marian:
        return "a Transformer", (
            "A Transformer (Vaswani et al., 2017; post-norm, sinusoidal positions, tied "
            "embeddings) trained with wtnmt and exported by `wtnmt export hf` as a Marian model "
            "that `transformers` loads with its own classes. The export permutes the hidden "
            "dimensions to Marian's layout of the positions; the network computes what wtnmt's "
            "does."
        )
    kind = "a Weighted Transformer" if m.attention == "branched" else "a Transformer"
    paper = (
        " (Ahmed, Keskar & Socher, 2017: each attention head a branch with its own FFN, their "
        "contributions κ and α learned on the probability simplex)"
        if m.attention == "branched"
        else ""
    )
    return kind, (
        f"{kind[0].upper()}{kind[1:]}{paper}, {m.norm}-norm, {m.positions} positions, "
        f"encoder output: {m.encoder_combination}; trained with wtnmt and exported by `wtnmt "
        "export hf` with wtnmt's own modelling code beside it (`modeling_wtnmt.py` and the "
        "`wtnmt_*.py` modules it imports: the installed wtnmt's source): load it with "
        "`trust_remote_code=True`. `generate` recomputes the decoder over the prefix at every "
        "step (no key/value cache): wtnmt's own engines are faster."
    )


def _branch_weights(model) -> list[str]:  # type: ignore[no-untyped-def]
    """The learned κ, α of every branched sublayer, as a table."""
    from wtnmt.model.branch_weights import branch_weight_table

    table = branch_weight_table(model) if model is not None else {}
    if not table:
        return []
    lines = [
        "",
        "## Learned branch weights",
        "",
        "κ weighs each branch's head (concatenation), α its FFN output (addition); each on "
        "the simplex.",
        "",
        "| sublayer | κ | α |",
        "|---|---|---|",
    ]
    for name, weights in table.items():
        kappa = ", ".join(f"{w:.3f}" for w in weights["kappa"])
        alpha = ", ".join(f"{w:.3f}" for w in weights["alpha"])
        lines.append(f"| `{name}` | {kappa} | {alpha} |")
    return lines


def model_card(
    run: Path, config: RunConfig, weights: str, *, model=None, marian: bool = True
) -> str:  # type: ignore[no-untyped-def]
    """The card of ``run``'s export (``weights``: the file exported; ``model``: its network,
    whose κ, α the card shows; ``marian``: exported as a Marian model, else with its code)."""
    scores, finished = _scores(run), _finished(run)
    test = _test(scores)
    m, t, d = config.model, config.train, config.decode
    name = run.resolve().name
    kind, what = _what(config, marian)
    lines = [
        _metadata(name, config, test, marian),
        f"# {name}: {config.data.src_lang}→{config.data.tgt_lang} translation, {kind} "
        "trained with wtnmt",
        "",
        what,
        "",
        "## Data",
        "",
        f"Trained on {_data(config)}; "
        + (
            "one SentencePiece vocabulary for both languages"
            if config.data.joint_vocab
            else "a SentencePiece vocabulary a language"
        )
        + f" of {config.data.vocab_size:,} pieces ({config.data.spm_model_type}).",
        "",
        "## Recipe",
        "",
        f"- {m.encoder_layers} encoder and {m.decoder_layers} decoder layers, d_model "
        f"{m.d_model}, {m.heads} heads, FFN {m.d_ff}, dropout {m.dropout}",
        f"- Adam (β = {tuple(t.adam_betas)}, ε = {t.adam_eps:g}), warm-up {t.warmup:,} "
        f"updates ({t.lr_schedule}), label smoothing {t.label_smoothing}, "
        f"{t.max_tokens:,} tokens a batch × {t.update_freq}, seed {t.seed}",
    ]
    if finished:
        lines.append(
            f"- stopped at update {finished.get('step', '?'):,}: {finished.get('finished', '')}"
        )
    lines.append(f"- exported weights: `{weights}`")
    lines += ["", "## Scores", ""]
    if test:
        lines += [
            f"On the {test.get('split', 'test')} split ({test.get('n_sentences', '?')} "
            f"sentences), beam {test.get('beam', '?')}, weights `{test.get('weights', '?')}`, "
            "decoded by wtnmt:",
            "",
            "| metric | score | sacreBLEU signature |",
            "|---|---|---|",
            f"| BLEU | {test['bleu']} | `{_cell(test.get('signature', ''))}` |",
        ]
        if "chrf" in test:
            lines.append(f"| chrF | {test['chrf']} | `{_cell(test.get('chrf_signature', ''))}` |")
    else:
        lines.append("The run holds no test scores (`wtnmt evaluate RUN` makes them).")
    lines += _branch_weights(model)
    remote = "" if marian else ", trust_remote_code=True"
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        f'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER"{remote})',
        f'model = AutoModelForSeq2SeqLM.from_pretrained("THIS_FOLDER"{remote})',
        'batch = tokenizer(["A sentence to translate."], return_tensors="pt")',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```",
        "",
        "`generation_config.json` holds the run's search: beam "
        f"{d.beam}, length penalty {d.length_penalty}. What `generate` does otherwise than "
        "wtnmt: it stops at the model's "
        f"{m.max_positions} positions where wtnmt stops at {d.max_len_a:g}·|x| + "
        f"{d.max_len_b} tokens a sentence (give `max_new_tokens`)"
        + (
            "; and it divides a hypothesis' log-probability by |y|^α, where this run ranks "
            "by ((5 + |y|) / 6)^α (GNMT's form), so beam search may rank differently."
            if d.length_penalty_form == "gnmt" and d.beam > 1
            else "."
        ),
        "",
    ]
    return "\n".join(lines)


__all__ = ["model_card"]
