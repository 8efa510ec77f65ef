"""What the offline commands read: a run's generations, located and verified (a local or ``gs://`` run folder, or
one generation's folder), their state document, config and rebuilt market; and the format of an exported bundle.

``inspect``, ``evaluate``, ``export`` and the backtest read runs through here; the files themselves are
``persistence.checkpoint``'s and ``persistence.run_folder``'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from config import Config, override
from environment.book import Book
from environment.loading import load_market
from environment.market import Market
from models.networks import Actor
from persistence import checkpoint, run_folder
from persistence.generation_contents import POPULATION, history_problem, holds_the_buffer, read_state, state_problem
from persistence.provenance import market_fingerprint
from persistence.run_folder import bucket
from utils.errors import CheckpointError, ConfigError, InputError


@dataclass(frozen=True)
class Located:
    """The generation a target resolves to, and what was found on the way.

    Attributes:
        gen: The generation to report (its manifest is valid; its files may not be).
        run_dir: The run folder, or None for a generation folder outside one.
        file_problems: every file → None if it verifies, else the problem (``checkpoint.file_problems``, and for
            the JSON documents, what is wrong with their contents).
        complete_generations: Generations found complete, ascending: for a run folder, the reported one if intact and
            the older complete ones (sizes checked, not hashed); for a generation folder, itself if intact.
        broken: Generation folders of the run that are incomplete or damaged: ``{generation, folder, problems}``.
        is_run: Whether the target was a run folder (else one generation's folder).
        in_bucket: Files of a gs:// target left in the bucket (their size checked there, not downloaded).
    """

    gen: checkpoint.GenerationFiles
    run_dir: Path | None
    file_problems: dict[str, str | None]
    complete_generations: list[int]
    broken: list[dict[str, Any]]
    is_run: bool
    in_bucket: tuple[str, ...] = ()

    @property
    def problems(self) -> list[str]:
        return [problem for problem in self.file_problems.values() if problem is not None]


def resolve_target(target: str | Path) -> Path:
    """The local folder a target names; InputError for locations this version cannot read."""
    text = str(target)
    if "://" in text:
        raise InputError(f"{text}: expected a local run or generation folder")
    path = Path(text).expanduser()
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: no such file or folder")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file, not a run folder or a generation folder")
    return path


def _is_generation_folder(path: Path) -> bool:
    return checkpoint.parse_dirname(path.name) is not None or (path / checkpoint.MANIFEST_NAME).exists()


def _run_of(gen_dir: Path) -> Path | None:
    parent = gen_dir.parent
    return parent if run_folder.is_run_folder(parent) else None


TARGET_HELP = "a run folder (its newest intact generation) or a gen-NNNNNN folder"
"""The help of the TARGET of ``inspect`` and ``export``."""


def left_in_bucket(name: str) -> bool:
    """What a gs:// target never downloads: the replay buffer's files (nothing inspect or export reports needs them)."""
    return holds_the_buffer(name)


def champion_tensors(gen: checkpoint.GenerationFiles, names: list[str]) -> dict[str, torch.Tensor]:
    """The champion actor's tensors ``names`` (``Actor`` parameter names), read from the population group."""
    tensors = checkpoint.read_tensors(gen, POPULATION, keys=[f"champion.{name}" for name in names])
    return {name: tensors[f"champion.{name}"] for name in names}


def population_actor(gen: checkpoint.GenerationFiles, config: Config, window_size: int) -> Actor:
    """The generation's whole population as one actor (float32, without gradients), each tensor checked against the
    shape its config implies and for NaN or infinite values."""
    config = in_float32(config)
    population = Actor(config.evolution.popsize, window_size, config.model, book=Book.from_env(config.env))
    names = [name for name, _ in population.named_parameters()]
    tensors = checkpoint.read_tensors(gen, POPULATION, keys=[f"actor.{name}" for name in names])
    with torch.no_grad():
        for name, param in population.named_parameters():
            value = tensors[f"actor.{name}"]
            if tuple(value.shape) != tuple(param.shape):
                raise CheckpointError(
                    f"{gen.path}: actor.{name} has shape {tuple(value.shape)}, its config implies {tuple(param.shape)}"
                )
            if not torch.isfinite(value).all():
                raise CheckpointError(f"{gen.path}: actor.{name} holds NaN or infinite values")
            param.copy_(value)
    return population.requires_grad_(False)


def locate(target: str | Path, scratch: Path | None = None) -> Located:
    """Resolve a run or generation folder to the generation to report (see the module docstring).

    A ``gs://`` target (a run or a generation in a bucket) is first mirrored into ``scratch``, without
    the files ``left_in_bucket`` names.

    Raises:
        InputError: A location this version cannot read.
        CheckpointError: Nothing to report: no such folder, not a checkpoint, no valid manifest, or a run folder
            without a complete generation.
    """
    if str(target).startswith("gs://"):
        if scratch is None:
            raise ValueError("a gs:// target needs a scratch folder")
        gen_dir, in_bucket = bucket.fetch_generation(str(target), scratch, skip=left_in_bucket)
        located = locate(gen_dir)
        problems = {name: None if name in in_bucket else p for name, p in located.file_problems.items()}
        is_run = checkpoint.parse_dirname(str(target).rstrip("/").rsplit("/", 1)[-1]) is None
        intact = [located.gen.generation] if not any(problems.values()) else []
        return dataclasses.replace(
            located, file_problems=problems, in_bucket=in_bucket, is_run=is_run, complete_generations=intact
        )
    path = resolve_target(target)
    if _is_generation_folder(path):
        gen = checkpoint.read_manifest(path)
        problems = _problems(gen)
        intact = all(problem is None for problem in problems.values())
        return Located(gen, _run_of(path), problems, [gen.generation] if intact else [], [], is_run=False)

    folders = checkpoint.generation_folders(path)
    if not folders and not run_folder.is_run_folder(path):
        raise CheckpointError(
            f"{path} is neither a run folder (config.json, gen-NNNNNN folders) nor a generation folder (manifest.json)"
        )
    chosen: tuple[checkpoint.GenerationFiles, dict[str, str | None]] | None = None
    damaged: list[tuple[checkpoint.GenerationFiles, dict[str, str | None]]] = []
    complete: list[int] = []
    broken: list[dict[str, Any]] = []
    for generation, folder in folders:  # newest first
        try:
            gen = checkpoint.open_generation(folder)  # manifest and sizes: cheap
        except CheckpointError as error:
            broken.append({"generation": generation, "folder": folder.name, "problems": [str(error)]})
            continue
        if chosen is not None:
            complete.append(generation)  # older than the reported one: not hashed
            continue
        problems = _problems(gen)
        if any(problem is not None for problem in problems.values()):
            damaged.append((gen, problems))
            broken.append(
                {"generation": generation, "folder": folder.name, "problems": [p for p in problems.values() if p]}
            )
        else:
            chosen = (gen, problems)
            complete.append(generation)
    if chosen is None and damaged:
        chosen = damaged[0]  # every complete generation is damaged: report the newest, as incomplete
        broken = [b for b in broken if b["generation"] != chosen[0].generation]
    if chosen is None:
        reason = f": newest folder {broken[0]['folder']}: {broken[0]['problems'][0]}" if broken else ""
        raise CheckpointError(f"no complete checkpoint generation in {path}{reason}")
    broken.sort(key=lambda b: b["generation"])
    return Located(chosen[0], path, chosen[1], sorted(complete), broken, is_run=True)


def _problems(gen: checkpoint.GenerationFiles) -> dict[str, str | None]:
    """``checkpoint.file_problems``, and for JSON documents that verify, what is wrong with their contents."""
    problems = checkpoint.file_problems(gen)
    checks = {"state": lambda document: state_problem(document, gen.generation), "history": history_problem}
    for name, check in checks.items():
        file_name = f"{name}.json"
        if file_name not in problems or problems[file_name] is not None:
            continue
        try:
            problem = check(checkpoint.read_document(gen, name))
        except CheckpointError as error:
            problems[file_name] = str(error)
            continue
        if problem is not None:
            problems[file_name] = f"{gen.path / file_name} {problem}"
    return problems


def in_float32(config: Config) -> Config:
    """``config`` with its per-asset encoders in float32 (``model.bf16_encoder`` off).

    ``evaluate`` and ``export`` run and ship a champion in float32 on the CPU, whatever it trained with: the
    parameters are float32 either way, bfloat16 autocast is slow on most CPUs and rounds unlike a GPU's, and a user of
    the export runs plain float32 PyTorch, so the report's figures are the ones the export gives.
    """
    return dataclasses.replace(config, model=dataclasses.replace(config.model, bf16_encoder=False))


def training_precision(config: Config, device: Any) -> dict[str, Any]:
    """What a run's arithmetic was while it trained (``actor.json["training_precision"]``); ``device`` is what the
    state document records of the device that wrote the generation."""
    return {
        "bf16_encoder": config.model.bf16_encoder,
        "matmul_precision": config.runtime.matmul_precision,
        "device": device,
        "meaning": "bf16_encoder: the per-asset encoders ran under bfloat16 autocast; matmul_precision 'high': float32 "
        "matmuls on CUDA used TF32 (a CPU computes exact float32); device: the one that wrote this generation. The "
        "actor runs in float32 all the same (precision)",
    }


def rebuild_market(config: Config, *, fingerprint: object, where: str) -> Market:
    """The run's market, rebuilt on the CPU from the data its config names, and checked against the
    ``fingerprint`` the run recorded (else the data changed: statistics and splits would not be the run's).

    Raises:
        CheckpointError: The rebuilt market's fingerprint differs; ``where`` names the checkpoint in the message.
    """
    market = load_market(config, torch.device("cpu"))
    if market_fingerprint(market) != fingerprint:
        raise CheckpointError(
            f"the data changed: {config.data.path or 'the bundled data set'} no longer gives the market {where} "
            "was trained on (its fingerprint differs)"
        )
    return market


def run_config(document: Any, where: str) -> Config:
    """The config a checkpoint or an export records; CheckpointError naming ``where`` if it is missing or invalid."""
    if not isinstance(document, dict):
        raise CheckpointError(f"{where} holds no config")
    try:
        return Config.from_dict(document)
    except (ConfigError, TypeError, ValueError) as error:
        raise CheckpointError(f"{where}: its config is not valid: {error}") from None


def read_generation(
    located: Located, *, refusal: str, benchmark: str | None = None
) -> tuple[dict[str, Any], Config, Market]:
    """The state document, config and rebuilt market of a located generation; a damaged one is refused with
    ``refusal`` (``"cannot export from"``) and its first problem. ``benchmark``: a total-return file to report against
    instead of the run's benchmark (``data.benchmark``), which the market's fingerprint does not hold."""
    gen = located.gen
    if located.problems:
        raise CheckpointError(f"{refusal} a damaged generation: {located.problems[0]}")
    state = read_state(gen)  # checked (``locate`` found it sound), as this version names its keys
    config = run_config(state.get("config"), str(gen.path / "state.json"))
    if benchmark:
        config = override(config, {"data.benchmark": benchmark})
    return state, config, rebuild_market(config, fingerprint=state.get("market_fingerprint"), where=str(gen.path))
