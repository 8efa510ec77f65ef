"""The on-disk format of a run directory: one folder per checkpointed generation, committed atomically.

Layout::

    RUN_DIR/config.json                      written by the caller, with ``write_file_atomically``
    RUN_DIR/metrics.jsonl                    see ``persistence.jsonl``
    RUN_DIR/gen-000012/<name>.safetensors    one file per tensor group
    RUN_DIR/gen-000012/<name>.json           one file per JSON document
    RUN_DIR/gen-000012/manifest.json         written last: format_version, generation, size and sha256 of every file
    RUN_DIR/LATEST                           "gen-000012\\n", replaced atomically once the folder is in place

A generation folder exists only if its manifest is valid and every file it names is present with the recorded
size. Files are written and fsynced into a hidden temporary sibling (``.gen-000012.tmp-<pid>``) renamed into place,
so a crash leaves the previous state or the new one (and a stale folder ``prune_generations`` removes). Given the
retention about to be applied, a file whose bytes are those of the same file in a generation that retention then
deletes is a hard link to it, not a second copy (``_files_to_link``): kept generations never share a file. Loading
never unpickles, and checks every file's size and SHA-256 before its bytes reach a parser. A generation found damaged is
never deleted by a resume: ``set_aside`` renames it ``gen-NNNNNN.damaged-STAMP``, a name nothing here reads or prunes.

JSON documents hold JSON-native values only, with finite floats and ``str`` keys (``json`` would turn ``{1: x}``
into ``{"1": x}``), so they round-trip exactly; what may be NaN or infinite (fitness, losses) belongs in a tensor.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from utils.errors import CheckpointError

FORMAT_VERSION: int = 1

MANIFEST_NAME = "manifest.json"
LATEST_NAME = "LATEST"
TENSORS_SUFFIX = ".safetensors"
DOCUMENT_SUFFIX = ".json"

_GEN_DIR_RE = re.compile(r"gen-(\d{6,})")
LEFTOVER_RE = re.compile(
    r"\.(?:gen-\d{6,}|LATEST|config\.json|metrics\.jsonl)\.(?:tmp|old|download)-(\d+)(?:-[0-9a-f]+)?"
)
FILE_STEM_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 16 * 1024 * 1024
_HASH_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class GenerationFiles:
    """A generation folder, its number and its parsed manifest (``files``: name → ``size``, ``sha256``)."""

    path: Path
    generation: int
    manifest: dict


def generation_dirname(generation: int) -> str:
    """The folder name of a generation: ``generation_dirname(12) == "gen-000012"``."""
    if type(generation) is not int or generation < 0:
        raise ValueError(f"generation must be a non-negative int, got {generation!r}")
    return f"gen-{generation:06d}"


def parse_dirname(name: str) -> int | None:
    """The generation a canonical folder name stands for, else None."""
    match = _GEN_DIR_RE.fullmatch(name)
    if match is None:
        return None
    generation = int(match.group(1))
    return generation if generation_dirname(generation) == name else None


# ---------------------------------------------------------------------------------------------------------------------
# The LATEST pointer and leftovers


def latest_bytes(generation: int) -> bytes:
    """What a ``LATEST`` pointer holds, on disk or in a bucket: the generation's folder name and a newline (the one
    writer of the pointer's format)."""
    return (generation_dirname(generation) + "\n").encode()


def parse_latest(data: bytes) -> int | None:
    """The generation a ``LATEST`` pointer's bytes name, or None if they name none (the one reader of its format)."""
    return parse_dirname(data.decode("utf-8", "replace").strip())


def read_latest(run_dir: Path) -> int | None:
    """The generation ``RUN_DIR/LATEST`` names, complete or not (None: no readable file, or not a generation)."""
    try:
        return parse_latest((Path(run_dir) / LATEST_NAME).read_bytes())
    except OSError:
        return None


def is_leftover(name: str) -> bool:
    """Whether ``name``, in a run folder, is a temporary a writer here uses (one a killed process may leave behind)."""
    return LEFTOVER_RE.fullmatch(name) is not None


# ---------------------------------------------------------------------------------------------------------------------
# Finding complete generations


def parse_manifest(data: bytes, path: Path | str, *, expected_generation: int | None = None) -> dict:
    """A manifest's bytes, validated (the one parser, for a folder and for a bucket); CheckpointError naming
    ``path`` if bad."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"cannot read checkpoint manifest {path}: {err}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint manifest {path} is not a JSON object")
    version, generation, files = (manifest.get(key) for key in ("format_version", "generation", "files"))
    if version != FORMAT_VERSION or type(version) is not int:
        raise CheckpointError(
            f"checkpoint manifest {path} has format_version {version!r}; this program reads version {FORMAT_VERSION}"
        )
    if type(generation) is not int or generation < 0:
        raise CheckpointError(f"checkpoint manifest {path} has a bad generation {generation!r}")
    if not isinstance(files, dict):
        raise CheckpointError(f"checkpoint manifest {path} has no 'files' object")
    for name, entry in files.items():
        if (
            not isinstance(name, str)
            or FILE_STEM_RE.fullmatch(name) is None
            or name == MANIFEST_NAME
            or not name.endswith((TENSORS_SUFFIX, DOCUMENT_SUFFIX))
        ):
            raise CheckpointError(
                f"unsafe or unknown file name {name!r} in {path}: the manifest may only name plain "
                f"'*{TENSORS_SUFFIX}' or '*{DOCUMENT_SUFFIX}' files inside the generation folder"
            )
        if (
            not isinstance(entry, dict)
            or type(entry.get("size")) is not int
            or entry["size"] < 0
            or not isinstance(entry.get("sha256"), str)
            or _SHA256_RE.fullmatch(entry["sha256"]) is None
        ):
            raise CheckpointError(f"checkpoint manifest {path} has a bad entry for {name!r}: {entry!r}")
    if expected_generation is not None and generation != expected_generation:
        raise CheckpointError(
            f"checkpoint manifest {path} says generation {generation}, the folder says {expected_generation}"
        )
    return manifest


def _file_problem(gen_dir: Path, name: str, size: int) -> str | None:
    """Why ``gen_dir/name`` is not a regular file of ``size`` bytes, else None (cheap: no hashing)."""
    path = gen_dir / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} is missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_size != size:
        return f"{path} has {st.st_size} bytes, the manifest says {size} (truncated or overwritten)"
    return None


def read_manifest(gen_dir: Path) -> GenerationFiles:
    """A generation folder with a valid manifest, whatever the state of its files (for inspecting damage:
    ``file_problems`` lists it, and ``read_tensors`` and ``read_document`` still verify what they read).

    Raises:
        CheckpointError: The folder is missing or a link, or its manifest is missing, unreadable, of another
            format version or names another generation.
    """
    gen_dir = Path(gen_dir)
    path = gen_dir / MANIFEST_NAME
    if gen_dir.is_symlink():  # retention and rewrites act on real folders; a link would reach outside the run
        raise CheckpointError(f"{gen_dir} is a symbolic link, not a generation folder; replace it with a copy")
    if not gen_dir.is_dir():
        raise CheckpointError(f"no checkpoint at {gen_dir}: not a directory")
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path} is not a regular file")
        if st.st_size > _MAX_MANIFEST_BYTES:
            raise CheckpointError(f"{path} is implausibly large ({st.st_size} bytes)")
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{gen_dir} has no {MANIFEST_NAME} (lost since, or never completely written)") from None
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint manifest {path}: {err}") from None
    manifest = parse_manifest(data, path, expected_generation=parse_dirname(gen_dir.name))
    return GenerationFiles(path=gen_dir, generation=manifest["generation"], manifest=manifest)


def _open_complete(gen_dir: Path) -> GenerationFiles:
    gen = read_manifest(gen_dir)
    for name, entry in gen.manifest["files"].items():
        problem = _file_problem(gen_dir, name, entry["size"])
        if problem is not None:
            raise CheckpointError(f"checkpoint {gen_dir} is incomplete: {problem}")
    return gen


def generation_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """Every canonical ``gen-NNNNNN`` folder of ``run_dir``, complete or not, newest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = ((parse_dirname(entry.name), entry) for entry in run_dir.iterdir() if entry.is_dir())
    return sorted(((g, entry) for g, entry in found if g is not None), reverse=True)


def complete_generations(run_dir: Path) -> list[int]:
    """Generations in ``run_dir`` whose folder is complete, ascending: its manifest is valid (see ``read_manifest``)
    and names only files that exist with the recorded sizes. Hashes are not checked here."""
    found = []
    for generation, folder in reversed(generation_folders(run_dir)):
        with contextlib.suppress(CheckpointError):
            _open_complete(folder)
            found.append(generation)
    return found


def newest_intact(run_dir: Path, *, before: int | None = None) -> int | None:
    """The newest complete generation (older than ``before``, if given) whose every file matches its hash."""
    for generation in reversed(complete_generations(run_dir)):
        if (before is None or generation < before) and not verify_generation(
            Path(run_dir) / generation_dirname(generation)
        ):
            return generation
    return None


def latest_generation(run_dir: Path) -> int | None:
    """The generation to resume from: the one ``LATEST`` names if complete, else the newest complete, else None."""
    complete = complete_generations(run_dir)
    pointer = read_latest(run_dir)
    if pointer is not None and pointer in complete:
        return pointer
    return complete[-1] if complete else None


def open_generation(run_dir_or_generation_dir: Path, generation: int | None = None) -> GenerationFiles:
    """Open a complete generation for reading: ``generation`` of a run directory (None: ``latest_generation``), or
    one generation's folder (its ``gen-NNNNNN`` name or its ``manifest.json`` tells), whose number must then match
    ``generation`` if given. CheckpointError when there is nothing complete to open."""
    path = Path(run_dir_or_generation_dir)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}: not a directory")
    if parse_dirname(path.name) is not None or (path / MANIFEST_NAME).exists():
        gen_dir = path
    else:
        if generation is None:
            generation = latest_generation(path)
            if generation is None:
                raise CheckpointError(f"no complete checkpoint generation in {path}")
        gen_dir = path / generation_dirname(generation)
        if not gen_dir.is_dir():
            raise CheckpointError(f"no checkpoint for generation {generation} in {path} (no folder {gen_dir.name})")
    gen = _open_complete(gen_dir)
    if generation is not None and gen.generation != generation:
        raise CheckpointError(f"{gen_dir} holds generation {gen.generation}, not {generation}")
    return gen


# ---------------------------------------------------------------------------------------------------------------------
# Reading


def _read_verified(gen: GenerationFiles, file_name: str, what: str) -> bytes:
    """The bytes of one file, after checking its size and SHA-256 against the manifest."""
    entry = gen.manifest["files"].get(file_name)
    if entry is None:
        raise CheckpointError(f"checkpoint {gen.path} has no {what} (no {file_name} in its manifest)")
    path = gen.path / file_name
    problem = _file_problem(gen.path, file_name, entry["size"])
    if problem is not None:
        raise CheckpointError(f"checkpoint file {problem}")
    try:
        with open(path, "rb") as f:
            data = f.read(entry["size"] + 1)  # bounded: a file that grew since the size check is not read whole
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint file {path}: {err}") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:  # also catches a file changed since the size check
        raise CheckpointError(f"checkpoint file {path} is corrupt: its SHA-256 does not match the manifest")
    return data


def read_tensors(
    gen: GenerationFiles,
    name: str,
    *,
    keys: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Read one tensor group (only ``keys``, in that order, if given) after verifying its size and SHA-256;
    CheckpointError if it is missing, truncated, corrupt, not safetensors, or lacks a key."""
    if isinstance(keys, str):
        raise TypeError("keys must be an iterable of str, not a single str")
    path = gen.path / (name + TENSORS_SUFFIX)
    data = _read_verified(gen, path.name, f"tensor group {name!r}")
    try:
        loaded = safetensors.torch.load(data)
    except Exception as err:  # the parser's errors vary by version; any of them means "not a safetensors file"
        raise CheckpointError(f"checkpoint file {path} is not a valid safetensors file: {err}") from None
    if keys is not None:
        wanted = list(keys)
        missing = [k for k in wanted if k not in loaded]
        if missing:
            raise CheckpointError(f"checkpoint file {path} lacks tensors {missing}")
        loaded = {k: loaded[k] for k in wanted}
    if torch.device(device).type != "cpu":
        loaded = {k: t.to(device) for k, t in loaded.items()}
    return loaded


def read_document(gen: GenerationFiles, name: str) -> Any:
    """Read one JSON document, after verifying its size and SHA-256; CheckpointError if it is missing, truncated,
    corrupt or not JSON."""
    path = gen.path / (name + DOCUMENT_SUFFIX)
    data = _read_verified(gen, path.name, f"document {name!r}")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"checkpoint file {path} is not valid JSON: {err}") from None


def file_digests(path: Path, *algorithms: str) -> tuple[int, list[str]]:
    """The size of a file and its hex digests (``"sha256"``, ``"md5"``), reading it once in chunks."""
    hashes = [hashlib.new(algorithm) for algorithm in algorithms]
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            size += len(chunk)
            for digest in hashes:
                digest.update(chunk)
    return size, [digest.hexdigest() for digest in hashes]


def file_problems(gen: GenerationFiles) -> dict[str, str | None]:
    """Each file the manifest names (sorted), then every other entry of the folder: name → None if it matches its
    size and SHA-256 (hashed by streaming, never parsed), else a one-line problem naming the path."""
    problems: dict[str, str | None] = {}
    for name, entry in sorted(gen.manifest["files"].items()):
        problem = _file_problem(gen.path, name, entry["size"])
        if problem is None:
            try:
                if file_digests(gen.path / name, "sha256")[1][0] != entry["sha256"]:
                    problem = f"{gen.path / name} is corrupt: its SHA-256 does not match the manifest"
            except OSError as err:  # removed or unreadable since the size check
                problem = f"cannot read {gen.path / name}: {err.strerror or err}"
        problems[name] = problem
    expected = set(gen.manifest["files"]) | {MANIFEST_NAME}
    try:
        entries = sorted(gen.path.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if entry.name not in expected:
            problems[entry.name] = f"{entry} is not named in the manifest"
    return problems


def verify_generation(gen_dir: Path) -> list[str]:
    """Every problem with one generation folder (its manifest, then ``file_problems``); empty if it is intact."""
    try:
        gen = read_manifest(gen_dir)
    except CheckpointError as err:
        return [str(err)]
    return [problem for problem in file_problems(gen).values() if problem is not None]
