"""Settings by dotted key: ``--set key=value``, the flags that set a key, and ``override``, which applies them to a
config, each value converted to its field's type and checked as the config's own values are."""

from __future__ import annotations

import dataclasses
from typing import Any

from config.parsing import coerce, construct, field_types
from config.sections import Config, section_types
from config.upgrades import refuse_renamed, refuse_retired
from utils.errors import ConfigError, InputError


def override(config: Config, values: dict[str, Any]) -> Config:
    """A copy of ``config`` with dotted keys replaced; values may be strings (from ``--set``) or typed."""
    sections = {s.name: {} for s in dataclasses.fields(Config)}
    for key, value in values.items():
        refuse_retired(key)
        refuse_renamed(key)
        section_name, _, name = key.partition(".")
        if section_name not in sections or not name:
            raise ConfigError(f"unknown config key {key!r} (sections: {', '.join(sections)})")
        section_cls = section_types()[section_name]
        types_ = field_types(section_cls)
        if name not in types_:
            raise ConfigError(f"unknown config key {key!r} (keys of {section_name}: {', '.join(types_)})")
        sections[section_name][name] = coerce(key, types_[name], value)
    replaced = {
        name: construct(type(getattr(config, name)), {**dataclasses.asdict(getattr(config, name)), **changes})
        for name, changes in sections.items()
        if changes
    }
    return dataclasses.replace(config, **replaced)


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict (``Config.to_dict``, or a document holding one) as one level of dotted keys."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


RUN_FLAGS = {
    "--data": "data.path",
    "--benchmark": "data.benchmark",
    "--generations": "runtime.generations",
    "--population": "evolution.popsize",
    "--device": "runtime.device",
}
"""The flags of the commands that train runs (train, backtest) that set a config key, beside --preset and --set."""


def add_run_flags(parser: Any) -> None:
    """``--preset``, ``--set`` and ``RUN_FLAGS`` on an ``argparse`` parser of a command that trains runs."""
    parser.add_argument("--preset", default="default", help="smoke | default | paper (default: default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--data", help="price file (CSV or Parquet); default: the bundled 20 stocks")
    parser.add_argument("--benchmark", help="the benchmark: a total-return series (a date and a level per row)")
    parser.add_argument("--generations", type=int, help="generations of a run (with --resume: its new total)")
    parser.add_argument("--population", type=int, help="agents in the population")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="training device")


def flag_settings(args: Any, flags: dict[str, str] = RUN_FLAGS) -> dict[str, Any]:
    """The dotted settings a parsed command line names, ``--set`` and ``flags`` (flag -> key) alike; a flag whose
    value is ``None`` (absent) names nothing.

    Raises:
        InputError: a flag and a ``--set`` of its key that disagree.
    """
    settings: dict[str, Any] = dict(parse_assignments(args.set))
    for flag, key in flags.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is None:
            continue
        if key in settings and coerce_setting(key, settings[key]) != coerce_setting(key, value):
            given = flag if isinstance(value, bool) else f"{flag} {value}"
            raise InputError(f"{given} and --set {key}={settings[key]} disagree; give one of them")
        settings[key] = value
    return settings


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """``["learner.tau=0.01", ...]`` as a dict; a malformed item is a ConfigError."""
    parsed: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects dotted.key=value, got {item!r}")
        parsed[key.strip()] = value.strip()
    return parsed


def coerce_setting(key: str, value: Any) -> Any:
    """A dotted key's value as the config holds it (``"8"`` -> 8), or a ConfigError."""
    refuse_renamed(key)
    refuse_retired(key)
    section_name, _, name = key.partition(".")
    section_cls = section_types().get(section_name)
    types_ = field_types(section_cls) if section_cls is not None else {}
    if name not in types_:
        raise ConfigError(f"unknown config key {key!r}")
    return coerce(key, types_[name], value)
