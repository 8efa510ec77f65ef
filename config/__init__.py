"""Typed, frozen configuration, by what it holds:

* ``config.sections``: one dataclass per concern and ``Config`` holding them; every field carries a one-line
  docstring (the string literal under it), which ``field_docs`` reads so the command line lists every key with its
  meaning;
* ``config.presets``: ``smoke``, ``default`` and ``paper``, and the dates any default was chosen on;
* ``config.parsing``: text and JSON values to a field's type, and the field docstrings;
* ``config.conventions``: how a run trades, in the words its reports use;
* ``config.upgrades``: config documents of earlier versions (renamed sections, retired keys, keys added since);
* ``config.assignments``: ``--set key=value``, the flags that set a key, and ``override``.
"""

from config.assignments import (
    RUN_FLAGS,
    add_run_flags,
    coerce_setting,
    dotted,
    flag_settings,
    override,
    parse_assignments,
)
from config.conventions import conventions, describe_conventions
from config.presets import DEFAULTS_CHOSEN_ON, PRESETS, preset
from config.sections import (
    ActorObjective,
    Algorithm,
    BacktestConfig,
    CheckpointConfig,
    ChooseBy,
    Config,
    DataConfig,
    Deploy,
    DeviceName,
    EnvConfig,
    EvolutionConfig,
    FitnessName,
    LearnerConfig,
    MatmulPrecision,
    ModelConfig,
    RolloutConfig,
    RuntimeConfig,
    SelectionConfig,
    SelectionMethod,
    Universe,
    field_docs,
)
from config.upgrades import (
    EARLIER_DEFAULTS,
    RENAMED_KEYS,
    RENAMED_SECTIONS,
    RETIRED_KEYS,
    with_current_names,
    with_earlier_defaults,
)

__all__ = [
    "DEFAULTS_CHOSEN_ON",
    "EARLIER_DEFAULTS",
    "PRESETS",
    "RENAMED_KEYS",
    "RENAMED_SECTIONS",
    "RETIRED_KEYS",
    "RUN_FLAGS",
    "ActorObjective",
    "Algorithm",
    "BacktestConfig",
    "CheckpointConfig",
    "ChooseBy",
    "Config",
    "DataConfig",
    "Deploy",
    "DeviceName",
    "EnvConfig",
    "EvolutionConfig",
    "FitnessName",
    "LearnerConfig",
    "MatmulPrecision",
    "ModelConfig",
    "RolloutConfig",
    "RuntimeConfig",
    "SelectionConfig",
    "SelectionMethod",
    "Universe",
    "add_run_flags",
    "coerce_setting",
    "conventions",
    "describe_conventions",
    "dotted",
    "field_docs",
    "flag_settings",
    "override",
    "parse_assignments",
    "preset",
    "with_current_names",
    "with_earlier_defaults",
]
