"""Configuration: presets load, bad keys and values raise errors that name them."""

from __future__ import annotations

import re

import pytest
import yaml

from wtnmt.config import (
    PRESET_DIR,
    ConfigError,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
)

PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def test_every_preset_is_there():
    expected = {
        f"{flavour}-{tag}"
        for flavour in ("transformer", "weighted")
        for tag in ("A", "B", "C", "N4", "N8", "tiny", "small")
    }
    assert expected <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_a_complete_valid_config(name):
    raw = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())
    assert set(raw) == {"data", "model", "train", "decode"}
    config = load_config(name)
    assert config_from_dict(config_to_dict(config)) == config  # round trip
    assert (config.model.attention == "branched") == name.startswith("weighted")


def test_paper_shapes():
    a, b = load_config("weighted-A").model, load_config("weighted-B").model
    assert (a.encoder_layers, a.d_model, a.d_ff, a.heads, a.dropout) == (6, 512, 2048, 8, 0.1)
    assert (b.encoder_layers, b.d_model, b.d_ff, b.heads, b.dropout) == (6, 1024, 4096, 16, 0.3)
    assert load_config("weighted-C").model.encoder_layers == 2
    assert load_config("transformer-N8").model.decoder_layers == 8


def test_overrides_are_applied_and_validated():
    config = load_config(
        "weighted-tiny",
        ["model.norm=pre", "train.adam_betas=[0.9, 0.99]", "train.disagreement.terms=[output]"],
    )
    assert config.model.norm == "pre"
    assert config.train.adam_betas == (0.9, 0.99)
    assert config.train.disagreement.terms == ("output",)
    with pytest.raises(ConfigError, match=r"model\.norm='sideways'.*'post', 'pre'"):
        load_config("weighted-tiny", ["model.norm=sideways"])
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        load_config("weighted-tiny", ["model.norm"])
    with pytest.raises(ConfigError, match="must name a section"):
        load_config("weighted-tiny", ["norm=pre"])


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"model": {"dmodel": 512}},
            r"unknown config key model\.dmodel \(did you mean model\.d_model\?\): allowed keys",
        ),
        ({"modle": {}}, r"unknown config key modle"),
        (
            {"model": {"attention": "sparse"}},
            r"model\.attention='sparse' is not allowed: expected one of 'multihead', 'branched'",
        ),
        ({"model": {"heads": "eight"}}, r"model\.heads='eight' is not allowed: expected int"),
        ({"model": {"heads": True}}, r"model\.heads=True is not allowed"),
        (
            {"model": {"d_model": 100, "heads": 8}},
            r"model\.d_model=100 is not divisible by model\.heads=8",
        ),
        ({"model": {"d_ff": 100, "heads": 8}}, r"model\.d_ff=100 is not divisible"),
        ({"model": {"branch_weights": "topk", "branch_topk": 9}}, r"model\.branch_topk=9 exceeds"),
        ({"model": {"dropout": 1.5}}, r"model\.dropout=1\.5 must be in \[0, 1\)"),
        ({"model": {"encoder_layers": 0}}, r"model\.encoder_layers=0 must be a positive"),
        (
            {"train": {"disagreement": {"terms": ["outputs"]}}},
            r"train\.disagreement\.terms\[0\]='outputs'",
        ),
        ({"train": {"adam_betas": [0.9]}}, r"train\.adam_betas=\[0\.9\].*a list of 2"),
        ({"train": {"max_steps": None}}, r"set at least one of max_steps"),
        ({"decode": {"beam": 2, "nbest": 3}}, r"decode\.nbest=3 exceeds decode\.beam=2"),
        ({"data": {"character_coverage": 0}}, r"data\.character_coverage=0"),
        ([1, 2], r"a config must be a mapping"),
    ],
)
def test_bad_values_raise_errors_that_name_key_value_and_choices(values, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(values)


def test_sections_validate_on_their_own_too():
    with pytest.raises(ConfigError):
        ModelConfig(heads=3)
    with pytest.raises(ConfigError):
        TrainConfig(warmup=0)
    with pytest.raises(ConfigError):
        DataConfig(vocab_size=0)
    with pytest.raises(ConfigError):
        DecodeConfig(beam=0)


def test_files_and_missing_presets(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  d_model: 64\n  heads: 4\n  d_ff: 128\n")
    assert load_config(path).model.d_model == 64
    with pytest.raises(ConfigError, match=r"no preset of that name: presets are .*weighted-A"):
        load_config("weighted-Z")
    path.write_text("model: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    path.write_text("model:\n  heads: 3\n")
    with pytest.raises(ConfigError, match=rf"{path.name}: model\.d_model=512 is not divisible"):
        load_config(path)


def test_exponent_floats_read_as_numbers_in_files_and_overrides(tmp_path):
    # PyYAML follows YAML 1.1, where 1e-9 (no dot) is a string: `adam_eps: 1e-9` was refused
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  adam_eps: 1e-9\n  lr_scale: 2E0\n")
    config = load_config(path)
    assert config.train.adam_eps == 1e-9 and config.train.lr_scale == 2.0
    config = load_config("weighted-tiny", ["train.adam_eps=5e-8", "model.d_model=64"])
    assert config.train.adam_eps == 5e-8 and config.model.d_model == 64  # ints stay ints


@pytest.mark.parametrize("text", ["model.d_model=[", "model.d_model={a: ", "train.lr_scale=@x"])
def test_a_set_value_that_is_not_yaml_is_named(text):
    with pytest.raises(
        ConfigError, match=re.escape(f"--set {text!r}: the value is not valid YAML")
    ):
        load_config("weighted-tiny", [text])


@pytest.mark.parametrize(
    "override, message",
    [  # each of these trained wrongly or zero steps with exit 0, or ended in a torch traceback
        ("train.clip_norm=-1", "train.clip_norm=-1.0 must be a finite number above 0, or null"),
        ("train.lr_scale=-1", "train.lr_scale=-1.0 must be a finite number above 0"),
        ("train.lr_scale=.nan", "train.lr_scale=nan must be a finite number above 0"),
        ("train.max_steps=-1", "train.max_steps=-1 must be a positive integer"),
        ("train.max_epochs=0", "train.max_epochs=0 must be a positive integer"),
        ("train.max_time=-5", "train.max_time=-5.0 must be a finite number above 0, or null"),
        ("train.patience=0", "train.patience=0 must be a positive integer"),
        ("train.threads=-1", "train.threads=-1 must be a positive integer"),
        ("train.adam_betas=[1.5, 0.98]", "train.adam_betas[0]=1.5 must be in [0, 1)"),
        ("train.adam_eps=-1", "train.adam_eps=-1.0 must be a finite number above 0"),
        ("train.label_smoothing=.nan", "train.label_smoothing=nan must be in [0, 1)"),
        ("decode.max_len_a=-1", "decode.max_len_a=-1.0: allowed 0 to 64"),
        ("decode.max_len_a=1e308", "decode.max_len_a=1e+308: allowed 0 to 64"),
        ("decode.max_len_a=.inf", "decode.max_len_a=inf: allowed 0 to 64"),
        ("decode.max_len_b=-1", "decode.max_len_b=-1: allowed 0 to 65,536"),
        ("decode.max_len_b=1000000000", "decode.max_len_b=1000000000: allowed 0 to 65,536"),
        ("decode.length_penalty=.inf", "decode.length_penalty=inf: allowed -10 to 10"),
    ],
)
def test_every_numeric_key_is_range_checked_on_load(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("weighted-tiny", [override])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("decoder_self_attention", "weighted"),
        ("branch_ffn", "shared"),
        ("branch_weights", "fixed"),
        ("branch_topk", 3),
        ("branch_init", "uniform"),
    ],
)
def test_branched_only_options_are_refused_on_a_transformer(key, value):
    with pytest.raises(ConfigError, match=rf"model\.{key}=.*Weighted Transformer only"):
        load_config("transformer-tiny", [f"model.{key}={value}"])
    assert getattr(load_config("weighted-tiny", [f"model.{key}={value}"]).model, key) == value
