"""What a generation's checkpoint holds, and the reading of it: the state document (``state.json``, built from
one list of keys and checked against it before anything reads a value), the history (``history.json``), and the
tensor groups (``NAME.safetensors``: the population, the host random streams, the selection gate's state and the
replay buffer in segments).

The manifest's hashes prove the files are the ones written, not that whoever wrote them wrote the right types:
a hand-edited or foreign checkpoint with ``"generation": "7"`` or ``"champion_score": [1]`` must be one line
naming the key, not a traceback in the middle of a restore.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from models.replay import ReplayState
from persistence import checkpoint
from utils.errors import CheckpointError

# ------------------------------------------------------------------------------------------------- the tensor groups

POPULATION = "population"
"""Every agent tensor and the champion's (``champion.*``), by ``Population.state_tensors`` key."""
STREAMS = "rng"
"""The host random streams' states (``run.streams.HOST_STREAMS``)."""
GATE = "selection"
"""The selection gate's state; absent for a run without one, and in checkpoints of earlier versions."""
SEGMENTS = 16
"""A checkpoint holds the buffer as this many files of consecutive rows: a generation writes into a few of them only,
and the files of the others are the same bytes as at the checkpoints before (``persistence.checkpoint`` may link
them)."""


def holds_the_buffer(name: str) -> bool:
    """Whether a checkpoint's tensor group, or its file, is part of the buffer: ``replay`` (position and size) and
    its segments ``replay-000``, ``replay-001``, ... (``buffer_groups``)."""
    return name.startswith("replay")


def buffer_groups(state: ReplayState, *, capacity: int) -> dict[str, dict[str, torch.Tensor]]:
    """The filled part of a buffer of ``capacity`` as checkpoint tensor groups: ``replay`` (position and size) and
    ``replay-000``, ``replay-001``, ... (``SEGMENTS`` stretches of consecutive rows, as far as it is filled)."""
    rows = math.ceil(capacity / SEGMENTS)
    groups = {
        "replay": {
            "pos": torch.tensor(state.pos, dtype=torch.int64),
            "size": torch.tensor(state.size, dtype=torch.int64),
        }
    }
    for index, start in enumerate(range(0, state.size, rows)):
        stop = min(start + rows, state.size)
        groups[f"replay-{index:03d}"] = {key: tensor[start:stop] for key, tensor in state.storage.items()}
    return groups


def buffer_from_groups(groups: dict[str, dict[str, torch.Tensor]]) -> ReplayState:
    """The buffer's contents from ``buffer_groups`` (or from a single ``replay`` group holding the whole filled
    part, as checkpoints written before the buffer was split into segments do).

    Raises:
        KeyError: a group lacks a tensor.
    """
    replay = groups["replay"]
    pos, size = int(replay["pos"]), int(replay["size"])
    if "days" in replay:
        return ReplayState({key: value for key, value in replay.items() if key not in ("pos", "size")}, pos, size)
    segments = [groups[name] for name in sorted(groups) if name.startswith("replay-")]
    storage = {key: torch.cat([segment[key] for segment in segments]) for key in segments[0]} if segments else {}
    return ReplayState(storage, pos, size)


# ----------------------------------------------------------------------------------------------- the state document

_INT = (int,)
_NUMBER = (int, float)
STATE_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    # key: (accepted JSON types, may be null)
    "format_version": (_INT, False),
    "generation": (_INT, False),
    "champion_score": (_NUMBER, True),
    "champion_generation": (_INT, False),
    "champion_bound": (_NUMBER, False),
    "optimiser_steps": ((dict,), False),
    "market_fingerprint": ((str,), False),
    "tickers": ((list,), False),
    "splits": ((dict,), False),
    "config": ((dict,), False),
}
"""Every key the trainer writes and a resume reads, with its type."""
OPTIONAL_TYPES: dict[str, type] = {"device": dict}
"""Keys that checkpoints of earlier versions lack; when present, they must have this type."""
# Keys no reader asks for are passed over: earlier versions wrote replay_pos and replay_size, which the buffer's own
# checkpoint group holds now, and such a document still loads.
RENAMED_KEYS = {"champion_edge": "champion_bound"}
"""Keys renamed since earlier versions, old name to new (the champion's bound was called its edge)."""
OPTIMISER_STEP_KEYS = {"actor_optim_steps": "actor", "critic_optim_steps": "critic"}
"""Earlier versions wrote each optimiser's step count as a key of its own; ``optimiser_steps`` holds them by the
names the learner gives its optimisers (``models.learner.Learner.optimisers``)."""


def upgraded(state: Any) -> Any:
    """A state document of an earlier version with its keys as this version names them."""
    if not isinstance(state, dict):
        return state
    state = {
        RENAMED_KEYS.get(key, key) if RENAMED_KEYS.get(key) not in state else key: value for key, value in state.items()
    }
    if "optimiser_steps" not in state and set(OPTIMISER_STEP_KEYS) <= state.keys():
        steps = {name: state.pop(key) for key, name in OPTIMISER_STEP_KEYS.items()}
        state["optimiser_steps"] = steps
    return state


def build_state(**values: Any) -> dict[str, Any]:
    """A state document of this format version: every key of ``STATE_TYPES`` (but the version) and of
    ``OPTIONAL_TYPES``, in that order, so the keys a checkpoint holds are listed in one place.

    Raises:
        ValueError: a key is missing or unknown (a writer out of step with the reader).
    """
    order = [*STATE_TYPES, *OPTIONAL_TYPES]
    expected = set(order) - {"format_version"}
    if set(values) != expected:
        missing, unknown = sorted(expected - set(values)), sorted(set(values) - expected)
        raise ValueError(f"state document keys: missing {missing}, unknown {unknown}")
    values = {"format_version": checkpoint.FORMAT_VERSION, **values}
    return {key: values[key] for key in order}


def state_problem(state: Any, generation: int) -> str | None:
    """What is wrong with the state document of generation ``generation`` (its folder's number), or None. A key an
    earlier version named otherwise (``RENAMED_KEYS``) is no problem."""
    if not isinstance(state, dict):
        return f"is a JSON {type(state).__name__}, not an object"
    state = upgraded(state)
    for key, (types, nullable) in STATE_TYPES.items():
        if key not in state:
            return f"has no {key!r}"
        value = state[key]
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, types):  # JSON true is not a count
            expected = " or ".join(t.__name__ for t in types) + (" or null" if nullable else "")
            return f"{key!r} is {value!r:.40}, not {expected}"
        if types is _INT and value < 0:
            return f"{key!r} is {value}, not >= 0"
    for key, kind in OPTIONAL_TYPES.items():
        if key in state and not isinstance(state[key], kind):
            return f"{key!r} is {state[key]!r:.40}, not {kind.__name__}"
    if state["generation"] != generation:
        return f"says generation {state['generation']}, but its folder is generation {generation}"
    if state["champion_generation"] > generation:
        return f"names champion generation {state['champion_generation']}, after generation {generation}"
    if not all(isinstance(ticker, str) for ticker in state["tickers"]):
        return "'tickers' holds a value that is not a string"
    for name, steps in state["optimiser_steps"].items():
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            return f"'optimiser_steps' gives {name!r} {steps!r:.40}, not a count"
    return None


def history_problem(history: Any) -> str | None:
    """What is wrong with a history document (a list of metrics rows, one object per generation), or None."""
    if not isinstance(history, list):
        return f"is a JSON {type(history).__name__}, not a list of rows"
    for index, row in enumerate(history):
        if not isinstance(row, dict):
            return f"row {index} is a JSON {type(row).__name__}, not an object"
        if isinstance(row.get("generation"), bool) or not isinstance(row.get("generation"), int):
            return f"row {index} has no integer 'generation'"
    return None


def read_state(files: checkpoint.GenerationFiles) -> dict[str, Any]:
    """The generation's verified state document, after checking both documents; a CheckpointError names the file."""
    folder = checkpoint.parse_dirname(files.path.name)
    if folder is not None and folder != files.generation:
        raise CheckpointError(f"{files.path / checkpoint.MANIFEST_NAME} says generation {files.generation}")
    state = upgraded(checkpoint.read_document(files, "state"))
    problem = state_problem(state, files.generation)
    if problem is not None:
        raise CheckpointError(f"{files.path / 'state.json'} {problem}")
    problem = history_problem(checkpoint.read_document(files, "history"))
    if problem is not None:
        raise CheckpointError(f"{files.path / 'history.json'} {problem}")
    return state
