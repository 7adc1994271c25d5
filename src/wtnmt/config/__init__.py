"""Typed, validated run configuration.

A run config has four sections, each a frozen dataclass: ``data``, ``model``
(:mod:`wtnmt.config.model`), ``train`` and ``decode`` (:mod:`wtnmt.config.sections`), and a
pruned model's record of how it was made, ``prune`` (:mod:`wtnmt.config.pruning`). YAML files
and presets are loaded with :func:`load_config` (:mod:`wtnmt.config.loading`); a bad key or
value raises :class:`ConfigError` naming the dotted key, the value and what is allowed. Only
the builders read these objects; modules receive explicit keyword arguments. Importing it
imports no torch.
"""

from wtnmt.config.loading import (
    PRESET_DIR,
    config_from_dict,
    config_to_dict,
    load_config,
    own_files_filters,
    parse_override,
    resolve_preset,
)
from wtnmt.config.model import ModelConfig
from wtnmt.config.pruning import KeptBranches, PruneRecord
from wtnmt.config.sections import (
    ConfigError,
    DataConfig,
    DecodeConfig,
    DisagreementConfig,
    RunConfig,
    TrainConfig,
)

__all__ = [
    "PRESET_DIR",
    "ConfigError",
    "DataConfig",
    "DecodeConfig",
    "DisagreementConfig",
    "KeptBranches",
    "ModelConfig",
    "PruneRecord",
    "RunConfig",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "own_files_filters",
    "parse_override",
    "resolve_preset",
]
