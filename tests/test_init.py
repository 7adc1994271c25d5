"""How a model's weights start: W^Q, W^K, W^V Xavier-uniform times ``model.qkv_init_gain``
(fairseq's 1/√2 beside tensor2tensor's 1), nothing else touched."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from wtnmt.config import ConfigError, load_config
from wtnmt.model import build_model


@pytest.mark.parametrize("preset", ["transformer-tiny", "weighted-tiny"])
def test_the_qkv_gain_scales_the_query_key_value_weights_and_nothing_else(preset):
    config = load_config(preset).model
    gain = 1 / math.sqrt(2)
    torch.manual_seed(0)
    plain = dict(build_model(config, vocab_size=50).named_parameters())
    torch.manual_seed(0)
    scaled = build_model(dataclasses.replace(config, qkv_init_gain=gain), vocab_size=50)
    projections = 0
    for name, p in scaled.named_parameters():
        if name.endswith("proj.weight"):  # every HeadProjection: [3·H·Dk, D]
            projections += 1
            torch.testing.assert_close(p, plain[name] * gain, rtol=0, atol=0)
            bound = math.sqrt(6 / (2 * config.d_model)) * gain  # Xavier of one [D, D] block
            assert p.abs().max() <= bound
        else:
            assert torch.equal(p, plain[name]), name
    assert projections == config.encoder_layers + 2 * config.decoder_layers


def test_a_gain_that_is_not_positive_is_refused():
    with pytest.raises(ConfigError, match=r"model\.qkv_init_gain=0\.0 must be a finite number"):
        load_config("transformer-tiny", ["model.qkv_init_gain=0"])
