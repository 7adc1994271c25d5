"""train.compile: the training forward through torch.compile makes the eager run's updates.

Oracle: the same seeded run, eager. Without dropout the two compute the same function with the
same weights, so each update's loss and the weights after it agree to float32 rounding (fused
kernels sum in another order). The default run checks Dynamo's capture alone; the slow ones
AOTAutograd's joint forward-backward graph too (with eager kernels), and inductor's generated
kernels in float32, as training on a GPU runs them (inductor compiles the joint graph
AOTAutograd traces, so where it runs its test checks float32's joint graph).
"""

from __future__ import annotations

import functools
import shutil

import pytest
import torch

from helpers import tiny_run_config
from wtnmt.data import plan_batches
from wtnmt.special import PAD
from wtnmt.train import Trainer


def _updates(tmp_path, *, compile: bool, precision: str = "fp32"):  # type: ignore[no-untyped-def]
    tmp_path.mkdir()
    config = tiny_run_config(tmp_path, train={"compile": compile, "precision": precision})
    trainer = Trainer(config, tmp_path / f"run-{compile}", log_to_stderr=False)
    data = trainer.train_data
    plan = plan_batches(data.src_lengths, data.tgt_lengths, max_tokens=300, seed=1, epoch=0)
    batches = [data.collate(i) for i in plan.batches[:4]]  # four shapes: dynamic, not one each
    assert len({(b.src.shape, b.tgt_in.shape) for b in batches}) == 4
    # the last asks for r_t, whose gradients at inner states only the eager forward keeps
    results = [trainer.update([b], want_ratio=i == 3) for i, b in enumerate(batches)]
    assert results[-1].ratio is not None and results[-1].ratio > 0
    figures = [r.loss for r in results] + [results[-1].ratio]
    return figures, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _check(tmp_path, precision: str, tolerance: float) -> None:  # type: ignore[no-untyped-def]
    from torch._dynamo.utils import counters

    eager = _updates(tmp_path / "eager", compile=False, precision=precision)
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = _updates(tmp_path / "compiled", compile=True, precision=precision)
    finally:
        torch._dynamo.reset()  # no compiled code kept for the tests after this one
    # it went through the compiler whole, with nothing read back from the device to break it
    # (whether a source is padded and where the real targets are come from the host), in a
    # graph for each path a batch can take (padded or not; queries short or long, attention's
    # two kernels), not one for each batch shape
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert 0 < counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])
    for i, (a, b) in enumerate(zip(eager[0], compiled[0], strict=True)):  # losses, then r_t
        assert abs(a - b) <= tolerance * abs(a), (i, a, b)
    for name, weight in eager[1].items():
        torch.testing.assert_close(compiled[1][name], weight, rtol=tolerance, atol=tolerance)


def _backend(monkeypatch, backend: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))


def test_a_compiled_forward_makes_the_eager_updates(tmp_path, monkeypatch):
    # Dynamo's capture alone (backend "eager": the captured graphs run as traced), in bf16
    # autocast as the GPU grids train: the parts that can get the model wrong, in seconds
    _backend(monkeypatch, "eager")
    _check(tmp_path, "bf16", tolerance=1e-5)


# inductor compiles the joint graph AOTAutograd traces: where it runs, its float32 test checks
# that graph, and the eager-kernel check of it in float32 would be the same trace again
NO_INDUCTOR = shutil.which("g++") is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "precision",
    [
        pytest.param(
            "fp32",
            marks=pytest.mark.skipif(
                not NO_INDUCTOR, reason="the inductor test checks float32's joint graph"
            ),
        ),
        "bf16",
    ],
)
def test_the_joint_forward_backward_graph_makes_the_eager_updates(tmp_path, monkeypatch, precision):
    # AOTAutograd's joint graph too (the custom autograd functions traced), eager kernels
    _backend(monkeypatch, "aot_eager")
    _check(tmp_path, precision, tolerance=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(NO_INDUCTOR, reason="inductor needs a C++ compiler on CPU")
def test_inductor_kernels_make_the_eager_updates(tmp_path):
    _check(tmp_path, "fp32", tolerance=1e-5)


def test_with_dropout_a_compiled_forward_is_a_graph_for_padded_batches_and_one_for_others(
    tmp_path, monkeypatch
):
    # as the grids train: attention dropout takes the query length out of the attention's
    # choice of kernel, so that short and long targets share a graph (each graph is a compile,
    # paid out of a GPU session's few minutes)
    from torch._dynamo.utils import counters

    from wtnmt.model.attention_math import _SHORT_QUERIES

    _backend(monkeypatch, "eager")
    dropout = {"dropout": 0.1, "attention_dropout": 0.1}
    config = tiny_run_config(tmp_path, model=dropout, train={"compile": True})
    torch._dynamo.reset()
    counters.clear()
    try:
        trainer = Trainer(config, tmp_path / "run", log_to_stderr=False)
        data = trainer.train_data
        plan = plan_batches(data.src_lengths, data.tgt_lengths, max_tokens=300, seed=1, epoch=0)
        batches = [data.collate(i) for i in plan.batches]
        padded = {bool(b.src.eq(PAD).any()) for b in batches}
        short = {b.tgt_in.size(1) <= _SHORT_QUERIES for b in batches}
        assert padded == short == {True, False}  # every path a batch could take, taken
        for b in batches:
            trainer.update([b])
        graphs = counters["stats"]["unique_graphs"]
        breaks = dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert not breaks, breaks
    assert graphs == 2, graphs
