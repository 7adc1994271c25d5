"""Properties of the batch plan (hypothesis): coverage, budget, determinism, resume, shards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wtnmt.data.batching import plan_batches

lengths = st.integers(min_value=1, max_value=60).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(1, 80), min_size=n, max_size=n),
        st.lists(st.integers(1, 80), min_size=n, max_size=n),
    )
)
budgets = st.integers(min_value=20, max_value=600)
seeds = st.integers(min_value=0, max_value=2**31 - 1)


def cost(batch, src, tgt):
    return len(batch) * (src[batch].max() + tgt[batch].max())


@given(lengths, budgets, seeds, st.integers(0, 50))
def test_every_example_once_and_the_budget_kept(lens, budget, seed, epoch):
    src, tgt = np.array(lens[0]), np.array(lens[1])
    plan = plan_batches(src, tgt, max_tokens=budget, seed=seed, epoch=epoch)
    seen = np.concatenate(plan.batches)
    assert sorted(seen.tolist()) == list(range(len(src)))
    for batch in plan.batches:
        if len(batch) > 1:
            assert cost(batch, src, tgt) <= budget
    alone = [b for b in plan.batches if cost(b, src, tgt) > budget]
    assert all(len(b) == 1 for b in alone)
    assert plan.oversize == int(((src + tgt) > budget).sum())


@given(lengths, budgets, seeds, st.integers(0, 50))
def test_same_seed_and_epoch_same_plan(lens, budget, seed, epoch):
    a = plan_batches(lens[0], lens[1], max_tokens=budget, seed=seed, epoch=epoch)
    b = plan_batches(lens[0], lens[1], max_tokens=budget, seed=seed, epoch=epoch)
    assert [x.tolist() for x in a.batches] == [x.tolist() for x in b.batches]


def test_another_epoch_gives_another_order():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(5, 40, 2000), rng.integers(5, 40, 2000)
    plans = [plan_batches(src, tgt, max_tokens=500, seed=1, epoch=e) for e in range(3)]
    orders = [[b.tolist() for b in p.batches] for p in plans]
    assert orders[0] != orders[1] != orders[2]
    assert len({tuple(map(tuple, o)) for o in orders}) == 3


def test_batches_group_similar_lengths():
    rng = np.random.default_rng(0)
    src = rng.integers(5, 100, 5000)
    tgt = src + rng.integers(-3, 4, 5000)
    plan = plan_batches(src, tgt, max_tokens=2000, seed=1, epoch=0)
    padded = sum(cost(b, src, tgt) for b in plan.batches)
    real = int((src + tgt).sum())
    assert real / padded > 0.9  # similar lengths: little padding


@given(lengths, budgets, seeds, st.data())
def test_resuming_at_k_yields_exactly_the_rest(lens, budget, seed, data):
    plan = plan_batches(lens[0], lens[1], max_tokens=budget, seed=seed, epoch=2)
    k = data.draw(st.integers(0, len(plan)))
    again = plan_batches(lens[0], lens[1], max_tokens=budget, seed=seed, epoch=2)
    rest = again.resume(k)
    assert [b.tolist() for b in plan.batches[:k] + rest] == [b.tolist() for b in plan.batches]


@given(lengths, budgets, seeds, st.integers(1, 5))
def test_ddp_shards_are_disjoint_and_equal_in_count(lens, budget, seed, world):
    plan = plan_batches(lens[0], lens[1], max_tokens=budget, seed=seed, epoch=1)
    shards = [plan.shard(rank, world) for rank in range(world)]
    assert len({len(s) for s in shards}) == 1
    assert len(shards[0]) == len(plan) // world
    used = [i for s in shards for b in s.batches for i in b.tolist()]
    assert len(used) == len(set(used))  # no example twice in an epoch


def test_bad_arguments():
    with pytest.raises(ValueError, match="length arrays differ"):
        plan_batches([1, 2], [1], max_tokens=10, seed=0, epoch=0)
    with pytest.raises(ValueError, match="max_tokens=0"):
        plan_batches([1], [1], max_tokens=0, seed=0, epoch=0)
    plan = plan_batches([1, 2, 3], [1, 2, 3], max_tokens=10, seed=0, epoch=0)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        plan.shard(2, 2)
