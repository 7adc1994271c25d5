import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

# tests import the reference implementations in this folder as plain modules
sys.path.insert(0, str(Path(__file__).resolve().parent))

# two cores on CI: keep intra-op threads from oversubscribing them; under pytest-xdist each
# worker has a core of its own (`make test` starts one a core)
torch.set_num_threads(
    1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads())
)

from hypothesis import settings  # noqa: E402

# torch's first calls are slow to warm up; time limits per example would only add flakiness
settings.register_profile("wtnmt", deadline=None, max_examples=100)
settings.load_profile("wtnmt")

# `make test` hands each worker a whole file at a time (`--dist loadfile`), in the order
# collected (`--no-loadscope-reorder`). The files that take longest go first, so that none
# starts last and keeps one worker busy while the other has finished: longest first, from
# `--durations=0` of both suites on a 2-core CPU (seconds, quick / slow).
LONGEST_FIRST = (
    "test_onnx.py",  # 202 / -
    "test_train_compile.py",  # 35 / 178
    "test_soak.py",  # - / 147
    "test_experiment.py",  # 48 / 107
    "test_experiment_work_dir.py",  # 84 / -
    "test_interrupt.py",  # 19 / 65
    "test_demo.py",  # 23 / 63
    "test_analyze.py",  # 58 / -
    "test_workers.py",  # - / 57
    "test_experiment_scoring.py",  # 45 / -
)


def pytest_runtest_setup(item) -> None:  # type: ignore[no-untyped-def]
    """Each test's own wtnmt cache (``$WTNMT_CACHE_DIR``): what one test's run keeps there
    (train.precision=auto's choice) never decides another's, nor a user's. (A hook, not a
    fixture: hypothesis refuses function-scoped fixtures around its examples.)"""
    os.environ["WTNMT_CACHE_DIR"] = tempfile.mkdtemp(prefix="wtnmt-test-cache-")


def pytest_runtest_teardown(item) -> None:  # type: ignore[no-untyped-def]
    """The test's own cache goes with it (a thousand folders a run were left in the system's
    temporary directory otherwise)."""
    cache = os.environ.pop("WTNMT_CACHE_DIR", None)
    if cache and Path(cache).name.startswith("wtnmt-test-cache-"):
        shutil.rmtree(cache, ignore_errors=True)


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
