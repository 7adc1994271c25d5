"""Oracles for the whole model: counts, causality, padding, input limits, transparency,
internals (branch weights at test time: test_branch_weights.py; the decoding cache:
test_model_cache.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from wtnmt.config import ModelConfig, load_config
from wtnmt.model import (
    build_model,
    count_parameters,
    real_positions,
)
from wtnmt.special import BOS, PAD

V = 40

VARIANTS = {
    "transformer-post": dict(attention="multihead", norm="post"),
    "transformer-pre": dict(attention="multihead", norm="pre"),
    "weighted": dict(attention="branched"),
    "weighted-pre-shared": dict(attention="branched", norm="pre", branch_ffn="shared"),
    "weighted-self-weighted": dict(attention="branched", decoder_self_attention="weighted"),
    "weighted-softmax-learned": dict(
        attention="branched", branch_weights="softmax", positions="learned"
    ),
    "weighted-topk": dict(attention="branched", branch_weights="topk", branch_topk=3),
    "transparent-post": dict(
        attention="branched", encoder_combination="transparent", encoder_layers=3
    ),
    "transparent-pre": dict(
        attention="multihead", encoder_combination="transparent", norm="pre", encoder_layers=3
    ),
}


def tiny(**overrides) -> ModelConfig:
    base = dict(encoder_layers=2, decoder_layers=2, d_model=16, heads=4, d_ff=32, max_positions=64)
    return ModelConfig(**{**base, **overrides})


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(tiny(**VARIANTS[name]), vocab_size=V).double().eval()


def batch(seed: int = 0):
    """A padded batch: src [3, 7], tgt_in [3, 6] starting with BOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 5:] = PAD
    src[2, 3:] = PAD
    tgt = torch.randint(4, V, (3, 6), generator=g)
    tgt[:, 0] = BOS
    tgt[2, 4:] = PAD
    return src, tgt


# --------------------------------------------------------------------------------------------
# Parameter counts


def test_weighted_and_transformer_counts_differ_by_the_branch_terms():
    """Per branched sublayer the Weighted Transformer adds 2·M branch weights and (M−1)·D
    output biases (one b2 per split FFN instead of one), and has one layer norm (2·D) less:
    the branched sublayer replaces two sublayers, attention and FFN, with one residual block."""
    for preset in ("A", "B", "C", "small"):
        t = load_config(f"transformer-{preset}").model
        w = load_config(f"weighted-{preset}").model
        assert dataclasses.replace(w, attention="multihead") == dataclasses.replace(
            t, attention="multihead", dropout=w.dropout, attention_dropout=w.attention_dropout
        )
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            n_t = count_parameters(build_model(t, vocab_size=1000))
            n_w = count_parameters(build_model(w, vocab_size=1000))
        m, d = w.heads, w.d_model
        sublayers = w.encoder_layers + w.decoder_layers
        assert n_w - n_t == sublayers * (2 * m + (m - 1) * d - 2 * d), preset


@pytest.mark.parametrize("preset, paper", [("A", 65e6), ("B", 213e6)])
def test_paper_presets_match_the_paper_parameter_counts(preset, paper):
    for flavour in ("transformer", "weighted"):
        with torch.device("meta"):
            model = build_model(load_config(f"{flavour}-{preset}").model, vocab_size=37000)
        assert abs(count_parameters(model) / paper - 1) < 0.05, (flavour, count_parameters(model))


def test_tied_embeddings_share_one_matrix():
    model = make("weighted")
    names = [n for n, _ in model.named_parameters()]
    assert sum("embedding" in n for n in names) == 1
    src, tgt = batch()
    model.zero_grad()
    model(src, tgt).logits.sum().backward()
    assert model.embedding.weight.grad is not None


def test_a_zero_start_model_starts_from_a_zero_vector_and_never_trains_that_row():
    """``decoder_start: zero`` (Marian's convention): ``<s>``'s row is zero when made, gets no
    gradient in training (an optimizer step leaves it zero), and is zeroed again when weights
    that started from ``<s>``'s learned row are loaded (train.init_from)."""
    torch.manual_seed(0)
    model = build_model(tiny(attention="multihead", decoder_start="zero"), vocab_size=V).train()
    assert torch.count_nonzero(model.embedding.weight[BOS]) == 0
    src, tgt = batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    model(src, tgt).logits.logsumexp(-1).sum().backward()  # (every logit gets a gradient)
    assert torch.count_nonzero(model.embedding.weight.grad[BOS]) == 0
    assert torch.count_nonzero(model.embedding.weight.grad[BOS + 2 :], dim=1).min() > 0
    optimizer.step()
    assert torch.count_nonzero(model.embedding.weight[BOS]) == 0
    learned = build_model(tiny(attention="multihead"), vocab_size=V)
    assert torch.count_nonzero(learned.embedding.weight[BOS]) > 0
    model.load_state_dict(learned.state_dict())
    assert torch.count_nonzero(model.embedding.weight[BOS]) == 0
    assert torch.equal(model.embedding.weight[BOS + 1 :], learned.embedding.weight[BOS + 1 :])
    # the first input is the zero vector plus the first position, in training and decoding
    model.eval()
    start = model.embed(torch.tensor([[BOS]]))[0, 0]
    assert torch.equal(start, model.positions(1)[0])


# --------------------------------------------------------------------------------------------
# Causality and padding


@pytest.mark.parametrize("name", list(VARIANTS))
def test_outputs_up_to_t_ignore_later_targets(name):
    model = make(name)
    src, tgt = batch()
    out = model(src, tgt).logits
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, V, changed[:, 3:].shape)
    out2 = model(src, changed).logits
    torch.testing.assert_close(out2[:, :3], out[:, :3], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out2[:, 3:], out[:, 3:])  # the test can see a change


@pytest.mark.parametrize("name", list(VARIANTS))
def test_padding_leaves_real_tokens_unchanged(name):
    model = make(name)
    src, tgt = batch()
    out = model(src, tgt).logits
    more_src = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    more_tgt = torch.cat([tgt, torch.full((3, 3), PAD)], dim=1)
    out2 = model(more_src, more_tgt).logits
    real = tgt.ne(PAD)
    torch.testing.assert_close(out2[:, :6][real], out[real], rtol=1e-10, atol=1e-10)


def test_a_batch_row_matches_the_same_sentence_alone():
    model = make("weighted")
    src, tgt = batch()
    out = model(src, tgt).logits
    alone = model(src[2:3, :3], tgt[2:3, :4]).logits
    torch.testing.assert_close(alone[0], out[2, :4], rtol=1e-10, atol=1e-10)


def test_over_long_input_names_the_limit():
    model = make("weighted")
    with pytest.raises(ValueError, match="max_positions=64"):
        model.encode(torch.full((1, 65), 5))


# --------------------------------------------------------------------------------------------
# Transparent attention


@pytest.mark.parametrize(
    "plain_name, transparent_name",
    [("weighted", "transparent-post"), ("transformer-pre", "transparent-pre")],
)
def test_transparent_attention_with_all_weight_on_top_is_the_plain_model(
    plain_name, transparent_name
):
    transparent = make(transparent_name)
    config = tiny(**{**VARIANTS[transparent_name], "encoder_combination": "top"})
    plain = build_model(config, vocab_size=V).double().eval()
    missing, unexpected = plain.load_state_dict(transparent.state_dict(), strict=False)
    assert missing == [] and unexpected == ["transparent.weight"]
    with torch.no_grad():
        transparent.transparent.weight.zero_()
        transparent.transparent.weight[-1] = 1e4  # softmax → exactly one-hot on h_N
    src, tgt = batch()
    torch.testing.assert_close(
        transparent(src, tgt).logits, plain(src, tgt).logits, rtol=1e-12, atol=1e-12
    )


def test_transparent_weights_start_uniform_and_are_returned():
    model = make("transparent-post")
    src, tgt = batch()
    weights = model(src, tgt, need_internals=True).internals.transparent_weights
    assert weights.shape == (4, 2)  # [N+1, N_dec]
    torch.testing.assert_close(weights, torch.full((4, 2), 0.25, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# Internals


def test_internals_are_returned_for_every_module_and_never_stashed():
    model = make("weighted-self-weighted")
    src, tgt = batch()
    internals = model(src, tgt, need_internals=True).internals
    assert len(internals.encoder_self) == 2
    assert len(internals.decoder_self) == 2
    assert len(internals.encoder_decoder) == 2
    assert internals.encoder_decoder[0].probs.shape == (3, 4, 6, 7)
    assert internals.decoder_self[0].kappa is not None  # weighted reading has κ, α
    assert len(internals.encoder_states) == 3  # h_0, h_1, h_2
    plain = model(src, tgt)
    assert plain.internals is None
    torch.testing.assert_close(plain.logits, model(src, tgt, need_internals=True).logits)
    tensors_on_modules = [
        (name, attr)
        for name, module in model.named_modules()
        for attr, value in vars(module).items()
        if isinstance(value, torch.Tensor) and not attr.startswith("_")
    ]
    assert tensors_on_modules == []


def test_build_model_rejects_a_vocabulary_without_room_for_padding():
    with pytest.raises(ValueError, match="vocab_size=0"):
        build_model(tiny(), vocab_size=0)


def test_logits_at_selects_the_real_positions_of_the_full_logits():
    model = make("weighted")
    src, tgt = batch()
    real = tgt.ne(PAD)
    assert not real.all()  # padding to leave out
    full = model(src, tgt).logits
    selected = model(src, tgt, logits_at=real_positions(tgt)).logits
    assert selected.shape == (int(real.sum()), V)
    torch.testing.assert_close(selected, full[real], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["weighted", "transformer-post"])
def test_src_padded_from_the_caller_is_what_the_model_finds(kind):
    # told whether a source is padded, the model computes what it computes when it looks;
    # told wrongly that a padded batch is not, it attends to the padding (so the value is used)
    model = make(kind)
    src, tgt = batch()
    assert src.eq(PAD).any()
    found = model(src, tgt).logits
    torch.testing.assert_close(model(src, tgt, src_padded=True).logits, found, rtol=0, atol=0)
    assert not torch.allclose(model(src, tgt, src_padded=False).logits, found)
    unpadded = src[:, :3]
    assert not unpadded.eq(PAD).any()
    torch.testing.assert_close(
        model(unpadded, tgt, src_padded=False).logits, model(unpadded, tgt).logits, rtol=0, atol=0
    )


def test_packed_output_projection_is_the_plain_one_and_follows_updates():
    import copy

    from wtnmt.model.float32_kernels import float32_kernels
    from wtnmt.model.packed import PackedLinear, onednn_available

    torch.manual_seed(0)
    weight, bias, x = torch.randn(700, 32), torch.randn(700), torch.randn(2, 5, 32)
    packed = PackedLinear()
    with torch.no_grad():
        torch.testing.assert_close(packed(x, weight, bias), x @ weight.t() + bias)
        weight.mul_(2)  # an in-place update: the packed copy must follow
        torch.testing.assert_close(packed(x, weight), x @ weight.t())
        assert (packed._packed is not None) == (float32_kernels() == "mkl" or onednn_available())
    # with gradients it is differentiable (packed.linear, tested below)
    w = weight.clone().requires_grad_()
    packed(x, w).sum().backward()
    assert w.grad is not None and packed._packed is None  # training holds no packed copy
    assert copy.deepcopy(packed)._packed is None  # copies pack their own


@pytest.mark.parametrize("shape", [(6, 32), (2, 5, 32)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_training_linear_is_f_linear_in_value_and_gradients(shape, with_bias):
    """The oneDNN product of training (packed.linear) against the same product in float64:
    output and the gradients of input, weight (here a transposed view, as merge_heads passes)
    and bias, to float32 rounding of sums over up to 700 terms (oneDNN sums in another order
    than MKL, so not bit for bit F.linear)."""
    from wtnmt.model.packed import linear

    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    w = torch.randn(32, 700, requires_grad=True)  # used as its transpose [700, 32]
    b = torch.randn(700, requires_grad=True) if with_bias else None
    grad = torch.randn(*shape[:-1], 700)
    leaves = [x, w] + ([b] if with_bias else [])
    wide = [t.detach().double().requires_grad_() for t in leaves]
    expected = F.linear(wide[0], wide[1].t(), wide[2] if with_bias else None)
    expected_grads = torch.autograd.grad(expected, wide, grad.double())
    out = linear(x, w.t(), b)
    close = {"rtol": 1e-5, "atol": 1e-4, "check_dtype": False}
    torch.testing.assert_close(out, expected, **close)
    for got, want in zip(torch.autograd.grad(out, leaves, grad), expected_grads, strict=True):
        torch.testing.assert_close(got, want, **close)
    # an input that needs no gradient (the first layer's, say) gets none computed
    (g_w,) = torch.autograd.grad(linear(x.detach(), w.t()), [w], grad)
    torch.testing.assert_close(g_w, expected_grads[1], **close)


@pytest.mark.parametrize("mask", ["padding", "causal", "none"])
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_attention_math_path_is_the_textbook_formula(mask, p):
    """attend's own path (need_probs, or CPU training with dropout): scale folded into q,
    masks as additive biases, dropout's rescaling carried by v. Against eq. 1 written out,
    with the same dropout draws."""
    from wtnmt.model.attention_math import attend
    from wtnmt.model.dropout import keep_mask, keep_scale

    torch.manual_seed(0)
    h, b, t, s, dk = 3, 2, 5, 7, 8
    if mask == "causal":
        s = t
    q, k, v = torch.randn(h, b, t, dk), torch.randn(h, b, s, dk), torch.randn(h, b, s, dk)
    key_pad = torch.zeros(b, s, dtype=torch.bool)
    key_pad[1, -3:] = True
    scores = q @ k.transpose(-1, -2) / dk**0.5
    if mask == "padding":
        scores = scores.masked_fill(key_pad[None, :, None, :], float("-inf"))
    if mask == "causal":
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), float("-inf"))
    probs = scores.softmax(-1)
    torch.manual_seed(1)
    dropped = probs
    if p > 0:
        keep = keep_mask(torch.Size([h * b, t, s]), p).view(h, b, t, s)
        dropped = probs * keep * keep_scale(p)
    expected = dropped @ v
    torch.manual_seed(1)
    heads, got_probs = attend(
        q, k, v,
        key_pad=key_pad if mask == "padding" else None,
        causal=mask == "causal",
        dropout_p=p,
        need_probs=True,
    )  # fmt: skip
    torch.testing.assert_close(got_probs, probs)
    torch.testing.assert_close(heads, expected)
