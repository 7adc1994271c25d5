"""Experiments: grid files of runs × seeds (``grid``), trained side by side and resumed across
sessions (``runner``; what is left to do with each run: ``plan``), each run trained and scored
in a process of its own (``job``).

The highest layer with the command line: it drives training, decoding and analysis and is
imported by none of them.
"""

from wtnmt.experiment.grid import Grid, RunSpec, in_work_dir, load_grid, only_runs
from wtnmt.experiment.plan import plan_task
from wtnmt.experiment.runner import run_grid

__all__ = ["Grid", "RunSpec", "in_work_dir", "load_grid", "only_runs", "plan_task", "run_grid"]
