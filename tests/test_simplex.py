"""The simplex projection: on the simplex, idempotent, and the closest point (KKT)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import tiny_run_config
from wtnmt.config import ModelConfig
from wtnmt.model import BranchWeights, build_model, project_branch_weights, project_simplex
from wtnmt.train import Trainer

vectors = st.lists(
    st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=16,
).map(lambda xs: torch.tensor(xs, dtype=torch.float64))


@given(vectors)
def test_projection_lies_on_the_simplex(v):
    w = project_simplex(v)
    assert (w >= 0).all()
    assert abs(float(w.sum()) - 1.0) < 1e-9


@given(vectors)
def test_projection_is_idempotent(v):
    w = project_simplex(v)
    torch.testing.assert_close(project_simplex(w), w, rtol=0, atol=1e-12)


@given(vectors)
def test_projection_satisfies_the_kkt_conditions(v):
    """w is the projection iff w = max(v − θ, 0) for one θ: v_i − w_i = θ where w_i > 0 and
    v_i ≤ θ where w_i = 0 (with Σw = 1, checked above)."""
    w = project_simplex(v)
    support = w > 0
    theta = (v - w)[support]
    assert float(theta.max() - theta.min()) < 1e-9
    assert bool((v[~support] <= theta.mean() + 1e-9).all())


@settings(max_examples=50)
@given(vectors, st.integers(min_value=0, max_value=2**31 - 1))
def test_projection_is_closer_than_any_other_simplex_point(v, seed):
    w = project_simplex(v)
    others = torch.distributions.Dirichlet(torch.ones(v.numel(), dtype=torch.float64))
    torch.manual_seed(seed)
    points = others.sample((256,))  # [256, M] random points of the simplex
    corners = torch.eye(v.numel(), dtype=torch.float64)
    candidates = torch.cat([points, corners])
    best = (candidates - v).norm(dim=-1).min()
    assert float((w - v).norm()) <= float(best) + 1e-9


def test_projection_of_known_points():
    torch.testing.assert_close(
        project_simplex(torch.tensor([0.5, 0.5, 0.5])), torch.full((3,), 1 / 3)
    )
    torch.testing.assert_close(project_simplex(torch.tensor([2.0, 0.0])), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(
        project_simplex(torch.tensor([0.6, 0.5, -1.0])), torch.tensor([0.55, 0.45, 0.0])
    )


def test_projection_works_on_batches():
    v = torch.randn(5, 7, dtype=torch.float64)
    w = project_simplex(v)
    for row, projected in zip(v, w, strict=True):
        torch.testing.assert_close(project_simplex(row), projected)


def test_project_branch_weights_projects_every_branched_module():
    config = ModelConfig(
        attention="branched",
        encoder_layers=2,
        decoder_layers=2,
        d_model=16,
        heads=4,
        d_ff=32,
        decoder_self_attention="weighted",
    )
    model = build_model(config, vocab_size=20)
    modules = [m for m in model.modules() if isinstance(m, BranchWeights)]
    assert len(modules) == 2 + 2 * 2  # encoder branched; decoder weighted self + branched cross
    with torch.no_grad():
        for m in modules:
            m.kappa.normal_()
            m.alpha.normal_()
    assert project_branch_weights(model) == 2 * len(modules)
    for m in modules:
        for p in (m.kappa, m.alpha):
            assert (p >= 0).all() and abs(float(p.detach().sum()) - 1) < 1e-6


def test_softmax_weights_are_not_projected():
    config = ModelConfig(
        attention="branched",
        encoder_layers=1,
        decoder_layers=1,
        d_model=16,
        heads=4,
        d_ff=32,
        branch_weights="softmax",
    )
    model = build_model(config, vocab_size=20)
    before = [
        p.clone()
        for m in model.modules()
        if isinstance(m, BranchWeights)
        for p in (m.kappa, m.alpha)
    ]
    assert project_branch_weights(model) == 0
    after = [p for m in model.modules() if isinstance(m, BranchWeights) for p in (m.kappa, m.alpha)]
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)


def test_projection_of_huge_values_does_not_fail():
    # float32 rounds 1e30 − 1 to 1e30: no j passes the test in floating point, yet the answer
    # (a vertex) exists; a learning rate far too high drives κ there, and training must report
    # it as non-finite losses, not crash in the projection
    v = torch.tensor([[1e30, 0.0, -1.0, 2.0], [3e9, 3e9, 0.0, 0.0]])
    w = project_simplex(v)
    assert torch.isfinite(w).all() and (w >= 0).all()
    assert w.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]


def test_project_branch_weights_matches_projecting_each_vector_alone():
    # the vectors are projected as the rows of one stacked matrix (fewer operations an
    # update): the oracle is the projection of each vector alone, to the bit
    config = ModelConfig(attention="branched", encoder_layers=3, decoder_layers=2, d_model=24,
                         heads=4, d_ff=48, decoder_self_attention="weighted")  # fmt: skip
    model = build_model(config, vocab_size=20)
    vectors = [p for m in model.modules() if isinstance(m, BranchWeights) for p in m.parameters()]
    with torch.no_grad():
        for p in vectors:
            p.normal_(0.25, 0.5)
    expected = [project_simplex(p.detach().clone()) for p in vectors]
    assert project_branch_weights(model) == len(vectors) == 2 * (3 + 2 * 2)
    for p, want in zip(vectors, expected, strict=True):
        assert torch.equal(p.detach(), want)


def test_a_trainer_update_projects_unless_told_the_weights_are_frozen(tmp_path):
    # the benchmarks time a training step through Trainer.update: the projection is part of it
    trainer = Trainer(tiny_run_config(tmp_path), tmp_path / "run", log_to_stderr=False)
    batch = trainer.train_data.collate(list(range(8)))
    vectors = [
        p for m in trainer.model.modules() if isinstance(m, BranchWeights) for p in m.parameters()
    ]

    def off_simplex() -> float:
        return max(abs(float(p.detach().sum()) - 1) for p in vectors)

    for group in trainer.optimizer.param_groups:  # (the loop sets it, from 0 in warm-up)
        group["lr"] = 0.01
    trainer.update([batch], project=False)
    assert off_simplex() > 1e-4  # Adam moved them off
    trainer.update([batch])
    assert off_simplex() < 1e-6 and all(bool((p >= 0).all()) for p in vectors)
