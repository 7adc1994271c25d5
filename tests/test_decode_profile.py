"""benchmarks/decode_profile.py's attribution: every operator of a search charged to one part,
the output projection told from the other products, and the model left as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from test_model import batch, make
from wtnmt.decode.search import search_batch
from wtnmt.model import attention_math, cache, packed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
decode_profile = pytest.importorskip("decode_profile")


@pytest.mark.parametrize("beam", [1, 3])
def test_each_operator_goes_to_one_part_and_the_model_is_left_as_it_was(beam):
    model = make("weighted").float()  # float32: the packed products of decoding
    src, _ = batch()
    before = (packed.PackedLinear.__call__, torch.nn.LayerNorm.forward, cache.attention_core)
    with decode_profile.labelled(model), profile(activities=[ProfilerActivity.CPU]) as prof:
        search_batch(model, src, beam=beam, min_len=4, max_len=4)
    events = prof.events()
    parts, count = decode_profile.attribute(events)
    assert set(parts) <= set(decode_profile.PARTS)
    for part in ("output projection", "other linear products", "attention (QKᵀ, softmax, ·V)"):
        assert parts[part] > 0, part
    assert parts["encoder"] > 0 and parts["search's own operators"] > 0
    ops = [e for e in events if not e.name.startswith(decode_profile._LABEL)]
    assert sum(parts.values()) == pytest.approx(sum(e.self_cpu_time_total for e in ops))
    assert 0 < count < len(ops)  # the encoder's operators are not counted
    # the output projection is one product a step: its label appears once per step
    projections = [e for e in events if e.name.endswith("output projection")]
    assert len(projections) == 5  # steps 0-3 and the step that ends at max_len
    assert (
        packed.PackedLinear.__call__,
        torch.nn.LayerNorm.forward,
        cache.attention_core,
    ) == before
    assert attention_math.attention_core is cache.attention_core
    assert "decode_step" not in vars(model) and "encode" not in vars(model)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("precision", ["none", "int8"])
def test_the_scripted_loop_probe_computes_the_engines_translations_bit_for_bit(precision, beams):
    """benchmarks/scripted_loop_probe.py's TorchScript searches over the engine's own packed
    weights: the same best hypotheses and summed log-probabilities as the engine's, to the bit
    (the probe's timing is only worth reading while this holds), compared as the probe does."""
    probe = pytest.importorskip("scripted_loop_probe")
    from wtnmt.model import quantize_decoding

    model = make("weighted").float()  # post-norm, multi-head self-attention, split FFNs
    quantize_decoding(model, precision)
    src, _ = batch()
    want = probe.eager_search(model, src, beams)  # (it packs the weights)
    search = torch.jit.script(probe.greedy if beams == 1 else probe.beam)
    options = {} if beams == 1 else {"width": beams}
    tokens, scores = probe.scripted_search(model, search, probe.weights(model), src, **options)
    assert tokens.tolist() == [toks for toks, _ in want]
    assert scores.tolist() == [lp for _, lp in want]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_engines_top_extensions_compile_under_torchscript_to_the_same_ranking():
    """The scripted beam search calls decode/selection.py's top_extensions itself; over a
    vocabulary in blocks (V > 512, as the benchmark's 8,000, which the tiny model above does
    not reach) the compiled function ranks as the eager one: same values, hypotheses, tokens."""
    from wtnmt.decode.selection import top_extensions

    g = torch.Generator().manual_seed(0)
    lprobs = torch.randn(4, 3, 1000, generator=g).log_softmax(-1)
    scores = torch.randn(4, 3, generator=g)
    scripted = torch.jit.script(top_extensions)
    for want, got in zip(
        top_extensions(lprobs, scores, 6), scripted(lprobs, scores, 6), strict=True
    ):
        assert torch.equal(want, got)
