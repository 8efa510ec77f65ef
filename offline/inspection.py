"""``python main.py inspect TARGET [--json] [--plot FILE]``: what a checkpoint holds, without training.

TARGET is a run folder or one generation's folder (``RUN/gen-000012``). For a run folder the report is about its
newest *intact* generation: generation folders are checked newest first (manifest, sizes, then every file's
SHA-256, by streaming) until one passes; the newer ones that failed are listed as broken, the older ones only
get the cheap completeness check. Everything runs on the CPU and nothing is trained. The replay buffer is hashed
but never read into memory; of the tensors only ``population.safetensors`` is parsed, after its hash is checked.

Exit status, and what is printed:

* 0: the reported generation is intact. Broken or incomplete newer folders of a run are listed in the report
  (``broken_generations``), but a run whose newest intact generation could be reported is not an error.
* 2, one line on stderr and nothing on stdout (``--json`` included): bad input with nothing to report. The target
  is missing, is neither a run folder nor a generation folder (locally or in a bucket), a
  generation folder's manifest is missing, unreadable or of another format version, or a run folder has no
  complete generation; also bad flags and an unwritable ``--plot`` file.
* 2, with the full report: the reported generation has a valid manifest but is damaged (a file missing,
  truncated, corrupt, or not named in the manifest), either because it was given directly or because every
  complete generation of the run is damaged. The report says ``complete: no`` (``"complete": false``), lists the
  problems, and shows whatever the files that still verify hold (``params_sha256`` is null if the population
  file is damaged).

Reading goes through ``offline.stored.locate`` (a target → a local generation to read) and
``persistence.checkpoint``'s verified readers; a ``gs://`` target is first mirrored into a temporary folder, all but
the replay buffer, whose size is checked in the bucket instead.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from config import Config, conventions, describe_conventions
from models.learner import build_learner
from offline.plots import plot_history
from offline.stored import TARGET_HELP, Located, locate
from persistence import checkpoint, run_folder
from persistence.generation_contents import POPULATION, upgraded
from persistence.jsonl import finite_or_null
from run.records import selection_verdict
from utils.cli import parse_command
from utils.errors import CheckpointError, ConfigError, InputError
from utils.telemetry import format_bytes

EXIT_OK = 0
EXIT_INCOMPLETE = 2

CHAMPION = "champion"
"""The champion's actor's tensors start with this name; the agents' networks with their learner's names."""

HISTORY_ROWS = 20
"""Most rows of the human history table; longer histories are elided in the middle."""

_LABEL = 12  # width of the human report's left column


# ---------------------------------------------------------------------------------------------------------------------
# What the generation holds


def networks_of(config: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """The names of every network of the run's agents and of those the optimisers train, as the run's learner gives
    them (``models.learner.Learner.networks``, built from the run's config on the meta device, where it allocates
    nothing: its parameters' names do not depend on the data). Without a readable config, every name of the
    population's tensors but the optimisers' moments (``<name>_optim.``), the exploration stdevs and the champion."""
    learner = None
    if config is not None:
        try:
            run_config = Config.from_dict(config)
        except (ConfigError, TypeError, ValueError):
            run_config = None
        if run_config is not None:
            meta = torch.device("meta")
            learner = build_learner(run_config, 1, agents=1, device=meta, generator=torch.Generator())
    if learner is not None:
        trained = [name for name, module in learner.networks().items() if module in learner.trained_networks]
        return list(learner.networks()), trained
    names = {key.split(".", 1)[0] for key in tensors}
    names = sorted(n for n in names if not n.endswith("_optim") and n not in (CHAMPION, "exploration_stdev"))
    return names, [n for n in names if not n.endswith("_target")]


def params_sha256(tensors: dict[str, torch.Tensor], networks: Sequence[str]) -> str:
    """SHA-256 over every network parameter of a population checkpoint, as a lowercase hex string.

    Exactly: take the keys of ``tensors`` that start with one of the ``networks``' names and a dot (the learner's
    networks, ``networks_of``: for DDPG ``actor``, ``critic``, ``actor_target``, ``critic_target``; TD3 adds
    ``twin_critic`` and ``twin_critic_target``), or with ``champion.`` (so no optimiser moments, ``actor_optim.*`` /
    ``critic_optim.*``, and no ``exploration_stdev``), sort them as Python ``str`` (by code point), and for each key
    feed the SHA-256 first the key's UTF-8 bytes, then the tensor's raw element bytes: the CPU tensor, contiguous, in
    row-major order, each element in little-endian byte order (the bytes safetensors stores). No separators, shapes
    or dtypes are hashed.

    Args:
        tensors: The ``population`` tensor group of a checkpoint (``Population.state_tensors()`` keys).
        networks: the names of the agents' networks.
    """
    prefixes = tuple(f"{name}." for name in (*networks, CHAMPION))
    digest = hashlib.sha256()
    for key in sorted(k for k in tensors if k.startswith(prefixes)):
        digest.update(key.encode("utf-8"))
        digest.update(_little_endian_bytes(tensors[key]))
    return digest.hexdigest()


def _little_endian_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if sys.byteorder == "big" and flat.element_size() > 1:
        flat = flat.view(torch.uint8).reshape(-1, flat.element_size()).flip(1).reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def _read_document(gen: checkpoint.GenerationFiles, name: str, located: Located, notes: list[str]) -> Any:
    """A verified document, or None (with a note unless its file's problem is already listed)."""
    if f"{name}.json" not in gen.manifest["files"]:
        notes.append(f"{gen.path} has no {name}.json")
        return None
    if located.file_problems.get(f"{name}.json") is not None:
        return None
    try:
        return checkpoint.read_document(gen, name)
    except CheckpointError as error:
        notes.append(str(error))
        return None


def _read_population(located: Located, notes: list[str]) -> dict[str, torch.Tensor] | None:
    gen = located.gen
    file_name = POPULATION + checkpoint.TENSORS_SUFFIX
    if file_name not in gen.manifest["files"]:
        notes.append(f"{gen.path} has no {file_name}")
        return None
    if located.file_problems.get(file_name) is not None:
        return None
    try:
        return checkpoint.read_tensors(gen, POPULATION)  # never the buffer: it can be gigabytes
    except CheckpointError as error:
        notes.append(str(error))
        return None


def _run_config(located: Located, state: Any, notes: list[str]) -> dict[str, Any] | None:
    if isinstance(state, dict) and isinstance(state.get("config"), dict):
        return state["config"]
    if located.run_dir is None:
        return None
    path = run_folder.config_path(located.run_dir)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        notes.append(f"cannot read {path}: {error}")
        return None
    return config if isinstance(config, dict) else None


def _population_summary(tensors: dict[str, torch.Tensor], networks: list[str], trained: list[str]) -> dict[str, Any]:
    """The population's size and each agent's parameters: every network's (the learner's names), and the total of
    those the optimisers train."""
    popsize = tensors["exploration_stdev"].shape[0] if "exploration_stdev" in tensors else None
    if popsize is None:
        popsize = next((t.shape[0] for k, t in tensors.items() if k.startswith(f"{networks[0]}.")), 0)

    def per_agent(name: str) -> int:
        total = sum(t.numel() for k, t in tensors.items() if k.startswith(f"{name}."))
        return total // popsize if popsize else 0

    per_network = {name: per_agent(name) for name in networks}
    return {
        "popsize": int(popsize),
        "parameters_per_network": per_network,
        "trained_networks": trained,
        "parameters_per_agent": sum(per_network[name] for name in trained),
    }


def _trained_counts(population: dict[str, Any]) -> str:
    per_network = population["parameters_per_network"]
    return " + ".join(f"{name} {_count(per_network[name])}" for name in population["trained_networks"])


def _section(config: dict[str, Any] | None, name: str) -> dict[str, Any]:
    section = (config or {}).get(name)
    return section if isinstance(section, dict) else {}


def _conventions(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """How the run traded (``config.conventions``): a config of an earlier version as it ran; None if unreadable."""
    try:
        return None if config is None else conventions(Config.from_dict(config))
    except (ConfigError, TypeError, ValueError):
        return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _device(written: dict[str, Any] | None, configured: str | None) -> str | None:
    """The device that wrote the generation (its name on a GPU) and, when it differs, the one the config named."""
    if not written:
        return configured
    used = written.get("name") or written.get("type")
    return used if configured in (None, used, written.get("type")) else f"{used} (configured {configured})"


def _files(located: Located) -> dict[str, dict[str, Any]]:
    """Every file of the generation: its size and SHA-256 as the manifest records them, whether it verified, and what
    is wrong with it (a file in a bucket is checked for its size alone)."""
    gen = located.gen
    files: dict[str, dict[str, Any]] = {}
    for name, problem in located.file_problems.items():
        entry = gen.manifest["files"].get(name)
        if entry is None:
            try:
                size = (gen.path / name).lstat().st_size
            except OSError:
                size = None
            files[name] = {"size": size, "sha256": None, "verified": False, "problem": problem}
        else:
            files[name] = {"size": entry["size"], "sha256": entry["sha256"], "verified": problem is None}
            files[name]["problem"] = problem
            if name in located.in_bucket:  # size checked in the bucket; hashing it would mean downloading it
                files[name].update(verified=None, where="bucket")

    return files


def _history(rows: list[dict[str, Any]], **columns: str | None) -> list[dict[str, Any]]:
    """One entry a generation: each column's figure from the metrics row's key (``None``: the column's own name, a
    value kept as it is rather than read as a number)."""
    return [
        {
            "generation": row.get("generation"),
            **{name: row.get(name) if key is None else _number(row.get(key)) for name, key in columns.items()},
        }
        for row in rows
    ]


def build_report(target: str | Path, scratch: Path | None = None) -> dict[str, Any]:
    """Everything ``inspect`` reports about a target, as a JSON-native dict (the ``--json`` object).

    Raises:
        InputError, CheckpointError: As ``locate``.
    """
    located = locate(target, scratch)
    gen = located.gen
    notes: list[str] = []
    state = upgraded(_read_document(gen, "state", located, notes))  # as this version names its keys
    state = state if isinstance(state, dict) else {}
    history = _read_document(gen, "history", located, notes)
    rows = [row for row in history if isinstance(row, dict)] if isinstance(history, list) else []
    tensors = _read_population(located, notes)
    config = _run_config(located, state, notes)
    networks, trained = networks_of(config, tensors or {})

    last = rows[-1] if rows else {}
    champion_score = state.get("champion_score", last.get("champion_score"))
    champion_generation = state.get("champion_generation", last.get("champion_generation"))
    data, checkpoint_cfg = _section(config, "data"), _section(config, "checkpoint")
    tickers = state.get("tickers") or data.get("tickers") or []
    population = None
    if tensors is not None:
        population = _population_summary(tensors, networks, trained)
        for key in ("best_fitness", "mean_fitness", "worst_fitness", "validation_best", "validation_mean"):
            population[key] = _number(last.get(key))

    files = _files(located)
    run_dir = located.run_dir
    report = {
        "target": str(target),
        "target_kind": "run" if located.is_run else "generation",
        "run_dir": None if run_dir is None else str(run_dir),
        "run_name": checkpoint_cfg.get("run_name") or (run_dir.name if run_dir is not None else None),
        "generation_dir": str(gen.path),
        "generation": gen.generation,
        "format_version": gen.manifest["format_version"],
        "complete": not located.problems,
        "problems": located.problems + notes,
        "complete_generations": located.complete_generations,
        "broken_generations": located.broken,
        "params_sha256": None if tensors is None else params_sha256(tensors, networks),
        "champion_score": _number(champion_score),
        "champion_generation": champion_generation,
        "selection": selection_verdict(last, validation_days=data.get("validation_days")) if last else None,
        "population": population,
        "data": {
            "path": None if config is None else data.get("path") or "bundled",
            "tickers": list(tickers),
            "start": data.get("start") or None,
            "end": data.get("end") or None,
            "splits": state.get("splits"),
            "market_fingerprint": state.get("market_fingerprint"),
        },
        "fitness_history": _history(rows, best="best_fitness", mean="mean_fitness", worst="worst_fitness"),
        "validation_history": _history(
            rows,
            best="validation_best",
            mean="validation_mean",
            champion_score="champion_score",
            champion_generation=None,
        ),
        "files": files,
        "config": config,
        "conventions": _conventions(config),
        "device": state.get("device"),  # the device that wrote this generation (None before it was recorded)
        "plot": None,
    }
    if located.in_bucket or str(target).startswith("gs://"):  # name the bucket, not the temporary mirror
        run_uri = str(target).rstrip("/")
        if not located.is_run:
            run_uri = run_uri.rsplit("/", 1)[0]
        report["run_dir"] = run_uri
        report["generation_dir"] = f"{run_uri}/{gen.path.name}"
    return report


# ---------------------------------------------------------------------------------------------------------------------
# Output


def write_plot(report: dict[str, Any], path: Path) -> None:
    """The fitness and validation history of a report as a PNG (see ``offline.plots.plot_history``)."""
    fitness, validation = report["fitness_history"], report["validation_history"]
    try:
        plot_history(
            path,
            generations=[row["generation"] for row in fitness],
            best_fitness=[row["best"] for row in fitness],
            mean_fitness=[row["mean"] for row in fitness],
            worst_fitness=[row["worst"] for row in fitness],
            validation_best=[row["best"] for row in validation],
            champion_score=[row["champion_score"] for row in validation],
            title=f"run {report['run_name'] or report['generation_dir']}, generation {report['generation']}",
        )
    except OSError as error:
        raise InputError(f"cannot write the plot {path}: {error.strerror or error}") from None


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.4f}"


def format_history(report: dict[str, Any], *, max_rows: int = HISTORY_ROWS) -> list[str]:
    """The history table: a header, then one line per generation; the middle elided beyond ``max_rows`` rows."""
    header = ("gen", "best fitness", "mean fitness", "worst fitness", "validation best", "champion")
    widths = [max(6, len(h)) for h in header]
    rows = [
        (
            str(f["generation"]),
            *(_signed(x) for x in (f["best"], f["mean"], f["worst"], v["best"], v["champion_score"])),
        )
        for f, v in zip(report["fitness_history"], report["validation_history"])
    ]
    if not rows:
        return ["(no history)"]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    if len(rows) > max_rows:
        head = (max_rows - 1) // 2 + (max_rows - 1) % 2
        tail = max_rows - 1 - head
        elided = len(rows) - head - tail
        shown: list[tuple[str, ...] | None] = [*rows[:head], None, *rows[-tail:]] if tail else [*rows[:head], None]
    else:
        shown, elided = list(rows), 0
    for row in shown:
        if row is None:
            lines.append(f"{'…':>{widths[0]}}  ({elided} generations not shown)")
        else:
            lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    return lines


def _line(label: str, text: str) -> str:
    return f"{label:<{_LABEL}}{text}"


def _count(value: int) -> str:
    return f"{value:,}"


def _head_lines(report: dict[str, Any]) -> list[str]:
    """The report's first lines: the run, the generation, its data, its main settings and trading conventions."""
    lines: list[str] = []
    config = report["config"] or {}
    run = report["run_name"] or "(no run folder)"
    lines.append(_line("run", f"{run}  {report['run_dir'] or ''}".rstrip()))
    complete = report["complete_generations"]
    lines.append(
        _line(
            "generation",
            f"{report['generation']}  {report['generation_dir']}"
            + (f"  (complete generations: {', '.join(map(str, complete))})" if report["target_kind"] == "run" else ""),
        )
    )
    data = report["data"]
    tickers = data["tickers"]
    shown = " ".join(tickers[:8]) + (" …" if len(tickers) > 8 else "")
    splits = data.get("splits")
    if splits:  # the dates the run actually trained, validated and held out
        span = ", ".join(f"{name} {first}..{last}" for name, (first, last) in splits.items())
    else:
        span = f"from {data['start'] or 'the first date'} to {data['end'] or 'the last date'}"
    lines.append(_line("data", f"{data['path'] or 'unknown'}, {len(tickers)} tickers ({shown}), {span}"))
    sections = {name: _section(config, name) for name in ("evolution", "rollout", "evaluation", "env", "runtime")}
    settings = [
        ("popsize", sections["evolution"].get("popsize")),
        ("episodes", (sections["rollout"] or sections["evaluation"]).get("episodes")),  # renamed; old runs too
        ("lookback", sections["env"].get("lookback")),
        ("episode_days", sections["env"].get("episode_days")),
        ("fitness", sections["evolution"].get("fitness")),
        ("device", _device(report.get("device"), sections["runtime"].get("device"))),
    ]
    lines.append(_line("config", ", ".join(f"{k} {'n/a' if v is None else v}" for k, v in settings)))
    trading = report["conventions"]
    lines.append(_line("trading", "n/a (no readable config)" if trading is None else describe_conventions(trading)))

    return lines


def _file_lines(report: dict[str, Any]) -> list[str]:
    """The generation's files, each with its size and whether it verified, then the broken generations."""
    lines = [""]
    lines.append(f"files of {Path(report['generation_dir']).name} (size, SHA-256 verified)")
    names = list(report["files"])
    name_width = max((len(n) for n in names), default=4)
    sizes = {n: "?" if f["size"] is None else format_bytes(f["size"]) for n, f in report["files"].items()}
    size_width = max((len(s) for s in sizes.values()), default=1)
    for name, entry in report["files"].items():
        verified = {True: "yes", False: "no", None: "- (left in the bucket, size checked)"}[entry["verified"]]
        lines.append(f"  {name:<{name_width}}  {sizes[name]:>{size_width}}  verified {verified}")
    for broken in report["broken_generations"]:
        lines.append(_line("broken", f"{broken['folder']}: {broken['problems'][0]}"))
        lines.extend(_line("", problem) for problem in broken["problems"][1:])
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The human form of a report: aligned, one fact per line, ending with ``complete: yes`` or ``complete: no``."""
    lines = _head_lines(report)
    lines.append("")
    lines.append("history")
    lines.extend("  " + line for line in format_history(report))
    lines.append("")

    score, found = report["champion_score"], report["champion_generation"]
    if score is None:
        champion = "none yet"
    elif found == 0:
        champion = f"equal weight (no agent's edge passed the selection test), validation score {score:+.4f}"
    else:
        champion = f"validation score {score:+.4f}, found in generation {found}"
    lines.append(_line("champion", champion))
    lines.append(_line("selection", report["selection"] or "n/a (no metrics row of this version)"))
    population = report["population"]
    if population is None:
        lines.append(_line("population", "n/a (population file unreadable)"))
    else:
        lines.append(
            _line(
                "population",
                f"{population['popsize']} agents x {_count(population['parameters_per_agent'])} parameters "
                f"({_trained_counts(population)}; "
                "targets and Adam moments not counted)",
            )
        )
        lines.append(
            _line(
                "",
                f"last generation: fitness best {_signed(population['best_fitness'])} "
                f"mean {_signed(population['mean_fitness'])} worst {_signed(population['worst_fitness'])}, "
                f"validation best {_signed(population['validation_best'])} "
                f"mean {_signed(population['validation_mean'])}",
            )
        )
    lines.append(_line("parameters", f"sha256 {report['params_sha256'] or 'n/a'}"))

    lines += _file_lines(report)
    if report["problems"]:
        lines.append("problems")
        lines.extend(f"  {problem}" for problem in report["problems"])
    if report["plot"]:
        lines.append(_line("plot", report["plot"]))
    lines.append(f"complete: {'yes' if report['complete'] else 'no'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str]) -> int:
    """``inspect``'s command line; returns the exit status (InputError propagates to ``main.py``)."""
    args = parse_command(
        argv,
        "inspect",
        "Report a checkpoint (a run folder or one generation folder) without training. "
        "Exit status 0 when the reported generation is intact, 2 on bad input or a damaged generation.",
        ("target", {"help": TARGET_HELP}),
        ("--json", {"action": "store_true", "help": "print one JSON object instead of the text report"}),
        ("--plot", {"metavar": "FILE", "help": "also write the fitness and validation history as a PNG"}),
    )
    plot = None if args.plot is None else Path(args.plot).expanduser()
    if plot is not None and not plot.parent.is_dir():
        raise InputError(f"cannot write the plot {plot}: no folder {plot.parent}")
    with tempfile.TemporaryDirectory(prefix="erl-inspect-") as scratch:
        report = build_report(args.target, Path(scratch))
    if plot is not None:
        write_plot(report, plot)
        report["plot"] = str(plot)
    if args.json:
        print(json.dumps(finite_or_null(report), indent=2, allow_nan=False))
    else:
        print(format_report(report))
    return EXIT_OK if report["complete"] else EXIT_INCOMPLETE
