"""What runs recorded, read and drawn: the series of ``metrics.jsonl`` (``metrics``), the
papers' figures (``figures``), the scores that need the weights (``scoring``), and the report
of `wtnmt analyze` (``report``). Above decoding; below the command line and experiments."""

from wtnmt.analysis.figures import branch_weight_rows, plot_branch_weights
from wtnmt.analysis.metrics import RunMetrics, read_metrics, steps_to_bleu

__all__ = [
    "RunMetrics",
    "branch_weight_rows",
    "plot_branch_weights",
    "read_metrics",
    "steps_to_bleu",
]
