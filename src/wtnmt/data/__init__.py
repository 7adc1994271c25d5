"""Data: named corpora, reading and cleaning, the shared vocabulary, prepared arrays, batches."""

from wtnmt.data.batching import BatchPlan, plan_batches
from wtnmt.data.dataset import Batch, ParallelData
from wtnmt.data.io import DataError
from wtnmt.data.prepare import prepare
from wtnmt.data.summary import format_summary
from wtnmt.data.vocab import Vocabulary

__all__ = [
    "Batch",
    "BatchPlan",
    "DataError",
    "ParallelData",
    "Vocabulary",
    "format_summary",
    "plan_batches",
    "prepare",
]
