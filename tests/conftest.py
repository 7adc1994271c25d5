import os
import sys
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
