"""What each `wtnmt` command does, given its parsed arguments (the parser is in
``wtnmt.cli``). Heavy imports (torch, the model) happen inside the command that needs them."""

from wtnmt.commands.decoding import cmd_translate
from wtnmt.commands.evaluating import cmd_evaluate
from wtnmt.commands.runs import (
    cmd_analyze,
    cmd_average,
    cmd_demo,
    cmd_experiment,
    cmd_export,
    cmd_import,
    cmd_prepare,
    cmd_presets,
    cmd_serve,
    cmd_train,
    cmd_unpack,
)

__all__ = [
    "cmd_analyze",
    "cmd_average",
    "cmd_demo",
    "cmd_evaluate",
    "cmd_experiment",
    "cmd_export",
    "cmd_import",
    "cmd_prepare",
    "cmd_presets",
    "cmd_serve",
    "cmd_train",
    "cmd_translate",
    "cmd_unpack",
]
