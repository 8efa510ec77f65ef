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
import errno
import hashlib
import itertools
import json
import math
import os
import re
import shutil
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
_STALE_RE = re.compile(
    r"\.(?:gen-\d{6,}|LATEST|config\.json|metrics\.jsonl)\.(?:tmp|old|download)-(\d+)(?:-[0-9a-f]+)?"
)
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
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
# Writing


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:  # some filesystems cannot fsync a directory; the rename is still atomic there
        if err.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes | list[bytes]) -> None:
    with open(path, "xb") as f:
        f.writelines([data] if isinstance(data, bytes) else data)
        f.flush()
        os.fsync(f.fileno())


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise ValueError(f"{what} name {name!r} must be a plain file name stem matching {_NAME_RE.pattern}")
    if what == "document" and name + DOCUMENT_SUFFIX == MANIFEST_NAME:
        raise ValueError(f"document name {name!r} is reserved for the manifest")


def _check_json_value(value: Any, where: str) -> None:
    """Refuse what ``json`` would not round-trip: non-finite floats, non-str keys, unknown types."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; JSON documents hold finite floats only (store it in a tensor)")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has key {key!r} of type {type(key).__name__}; JSON keys must be str")
            _check_json_value(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_value(item, f"{where}[{i}]")
        return
    raise ValueError(f"{where} is a {type(value).__name__}, which is not a JSON value (convert it, e.g. with .item())")


_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def encode_tensor_group(name: str, group: dict[str, torch.Tensor]) -> list[bytes]:
    """The safetensors encoding of ``group`` as the header and each tensor's bytes, never joined into one buffer
    (that allocated the whole file again at every checkpoint).

    The format: an 8-byte little-endian header length, a JSON header (dtype, shape and byte range of each tensor,
    space-padded to 8 bytes), then the raw bytes in header order. Not ``safetensors.torch.save``: it leaves two
    objects per tensor for the collector (``benchmarks/safetensors_cycles.py``), which would make a healthy run's
    object count saw-tooth, and it refuses tensors that share memory. Reading goes through the library's parser.
    """
    if not isinstance(group, dict):
        raise ValueError(f"tensor group {name!r} must be a dict of str to torch.Tensor, got {type(group).__name__}")
    header: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for key in sorted(group):
        tensor = group[key]
        if not isinstance(key, str) or not key or key == "__metadata__":
            raise ValueError(f"tensor group {name!r} has key {key!r}; keys must be non-empty str")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensor group {name!r} key {key!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor group {name!r} key {key!r} has unsupported dtype {tensor.dtype}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[key] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return [len(encoded).to_bytes(8, "little"), encoded, *chunks]


def _size_and_sha256(chunks: list[bytes]) -> dict[str, Any]:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return {"size": sum(len(chunk) for chunk in chunks), "sha256": digest.hexdigest()}


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_generation(
    run_dir: Path,
    generation: int,
    *,
    tensors: dict[str, dict[str, torch.Tensor]],
    documents: dict[str, Any],
    keep_last: int | None = None,
    protect: Iterable[int] = (),
) -> Path:
    """Write one generation folder atomically (see the module docstring) and point ``LATEST`` at it.

    Args:
        tensors: Group name → flat dict of tensors (``{"actor": {"encoder.0.weight": t, ...}}``), each group one
            ``<name>.safetensors``; every dtype safetensors knows, generator states included, round-trips exactly.
        documents: Document name → JSON-native value, each one ``<name>.json``.
        keep_last, protect: The retention ``prune_generations`` applies once this generation is committed. Given,
            a file unchanged since the newest generation it then deletes is a hard link to that file instead of a
            second copy (``_files_to_link``); None: every file is written.

    Raises:
        ValueError: A bad name, a value that is not a tensor, or a document that JSON cannot hold exactly; raised
            before anything is written.
    """
    run_dir = Path(run_dir)
    dirname = generation_dirname(generation)

    # Serialise everything first, so a bad value fails before the disk is touched.
    payloads: dict[str, list[bytes]] = {}
    for name, group in tensors.items():
        _check_name(name, "tensor group")
        payloads[name + TENSORS_SUFFIX] = encode_tensor_group(name, group)
    for name, document in documents.items():
        _check_name(name, "document")
        _check_json_value(document, f"documents[{name!r}]")
        payloads[name + DOCUMENT_SUFFIX] = [json.dumps(document, allow_nan=False, separators=(",", ":")).encode()]
    manifest = {
        "format_version": FORMAT_VERSION,
        "generation": generation,
        "files": {file_name: _size_and_sha256(chunks) for file_name, chunks in sorted(payloads.items())},
    }

    run_dir.mkdir(parents=True, exist_ok=True)
    unchanged = {} if keep_last is None else _files_to_link(run_dir, generation, manifest["files"], keep_last, protect)
    pid = os.getpid()
    final_dir = run_dir / dirname
    tmp_dir = run_dir / f".{dirname}.tmp-{pid}"
    old_dir = run_dir / f".{dirname}.old-{pid}"
    _remove_tree(tmp_dir)
    tmp_dir.mkdir()
    try:
        for file_name, data in payloads.items():
            if not _linked(unchanged.get(file_name), tmp_dir / file_name):
                _write_durably(tmp_dir / file_name, data)
        # Compact: the indented encoder is pure Python and leaves reference cycles behind on every call.
        _write_durably(tmp_dir / MANIFEST_NAME, (json.dumps(manifest, separators=(",", ":")) + "\n").encode())
        _fsync_dir(tmp_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise

    replaced = final_dir.exists() or final_dir.is_symlink()
    if replaced:
        _remove_tree(old_dir)
        final_dir.rename(old_dir)
    tmp_dir.rename(final_dir)
    _fsync_dir(run_dir)
    if replaced:
        _remove_tree(old_dir)

    write_latest(run_dir, generation)
    return final_dir


def _files_to_link(
    run_dir: Path, generation: int, files: dict[str, dict], keep_last: int, protect: Iterable[int]
) -> dict[str, Path]:
    """Files about to be written whose bytes an earlier file already holds, each to be a hard link to that file.

    One damaged file must cost one generation: a folder kept to fall back on must not go down with the newest one,
    and a hard link is one file under two names, so flipped bytes (bit rot, an edit in place) damage every folder
    that holds it. So the only source is the newest generation that retention deletes as soon as this one is
    committed (``generations_to_delete`` with this one as ``LATEST``: ``keep_last`` generations back, never a
    ``protect``ed one): the file changes hands, and no two kept generations, the champion's included, share one
    (but for the moment before that deletion, or until the next one if the process dies in between). A source file
    also held elsewhere (``st_nlink`` above 1: a run written when consecutive generations shared files, a folder set
    aside) is written anew, and so is one damaged since it was written (each is hashed again).

    This keeps the guarantee whole at the price of linking only what ``keep_last`` generations left unchanged: at
    the paper shape, about 9 of the replay buffer's 16 segments instead of 13 (``BENCHMARKS.md``, Checkpoints).
    Linking to the generation two before keeps more, but a file damaged in the oldest kept folder then takes the
    newest down too; a full copy every k generations leaves the ones between sharing; a reflink (``FICLONE``)
    shares disk blocks, so bit rot still hits both copies, and ext4 has none.
    """
    complete = [g for g in complete_generations(run_dir) if g < generation]
    leaving = generations_to_delete(
        complete, [*complete, generation], keep_last=keep_last, protect=protect, latest=generation
    )
    if not leaving:
        return {}
    gen_dir = run_dir / generation_dirname(leaving[-1])
    try:
        written = read_manifest(gen_dir).manifest["files"]
    except CheckpointError:
        return {}
    unchanged = {}
    for name, entry in files.items():
        if written.get(name) == entry:
            with contextlib.suppress(OSError):
                st = os.lstat(gen_dir / name)
                alone = stat.S_ISREG(st.st_mode) and st.st_nlink == 1  # a link would be linked, not what it names
                if alone and file_digests(gen_dir / name, "sha256") == (entry["size"], [entry["sha256"]]):
                    unchanged[name] = gen_dir / name
    return unchanged


def _linked(source: Path | None, target: Path) -> bool:
    """Hard-link ``target`` to ``source``; False (write it instead) where there is none or the filesystem refuses."""
    if source is None:
        return False
    try:
        os.link(source, target)
    except OSError:
        return False
    return True


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash at any moment leaves the old file or the new one, never a part:
    the bytes are written and fsynced under a temporary name beside it (``.NAME.tmp-PID``; for ``config.json``,
    ``metrics.jsonl`` and ``LATEST``, ``is_leftover`` knows it and ``prune_generations`` removes it once its process
    is gone), then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove_tree(tmp)
    try:
        _write_durably(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def latest_bytes(generation: int) -> bytes:
    """What a ``LATEST`` pointer holds, on disk or in a bucket: the generation's folder name and a newline (the one
    writer of the pointer's format)."""
    return (generation_dirname(generation) + "\n").encode()


def parse_latest(data: bytes) -> int | None:
    """The generation a ``LATEST`` pointer's bytes name, or None if they name none (the one reader of its format)."""
    return parse_dirname(data.decode("utf-8", "replace").strip())


def write_latest(run_dir: Path, generation: int) -> None:
    """Point ``RUN_DIR/LATEST`` at ``generation``, atomically and durably."""
    write_file_atomically(Path(run_dir) / LATEST_NAME, latest_bytes(generation))


def read_latest(run_dir: Path) -> int | None:
    """The generation ``RUN_DIR/LATEST`` names, complete or not (None: no readable file, or not a generation)."""
    try:
        return parse_latest((Path(run_dir) / LATEST_NAME).read_bytes())
    except OSError:
        return None


def is_leftover(name: str) -> bool:
    """Whether ``name``, in a run folder, is a temporary a writer here uses (one a killed process may leave behind)."""
    return _STALE_RE.fullmatch(name) is not None


def set_aside(run_dir: Path, generation: int, stamp: str) -> Path:
    """Rename the folder of a damaged ``generation`` to ``gen-NNNNNN.damaged-STAMP`` (``-2``, ``-3``... added if taken):
    kept for inspection and out of the way of the generation written again under its number. No reader, resume or
    retention here looks at that name again; deleting it is left to the user. Returns the new path."""
    run_dir = Path(run_dir)
    folder = run_dir / generation_dirname(generation)
    target = run_dir / f"{folder.name}.damaged-{stamp}"
    for n in itertools.count(2):
        if not (target.exists() or target.is_symlink()):
            break
        target = run_dir / f"{folder.name}.damaged-{stamp}-{n}"
    folder.rename(target)  # a link is renamed itself, never followed
    _fsync_dir(run_dir)
    return target


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
            or _NAME_RE.fullmatch(name) is None
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


# ---------------------------------------------------------------------------------------------------------------------
# Pruning


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers: this process is not writing while it prunes
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        pass
    return True


def generations_to_delete(
    folders: Iterable[int], complete: Iterable[int], *, keep_last: int, protect: Iterable[int], latest: int | None
) -> list[int]:
    """Retention, one rule for a run folder and for its copy in a bucket: of the generation ``folders`` older than
    ``latest`` (the one ``LATEST`` names), delete all but the newest ``keep_last`` complete ones up to ``latest``
    (at least ``latest`` itself) and those in ``protect``. Nothing at or after ``latest`` is ever deleted: a newer
    folder is a write or an upload in progress, or one a crash left before ``LATEST`` moved. Ascending.
    """
    if type(keep_last) is not int or keep_last < 0:  # the one check: the users' value is checked by config.sections
        raise ValueError(f"keep_last must be a non-negative int, got {keep_last!r}")
    if latest is None:
        return []
    newest = sorted((g for g in complete if g <= latest), reverse=True)[: max(keep_last, 1)]
    keep = set(protect) | set(newest) | {latest}
    return sorted(g for g in set(folders) if g < latest and g not in keep)


def prune_generations(run_dir: Path, *, keep_last: int, protect: Iterable[int] = ()) -> list[int]:
    """Delete the generations ``generations_to_delete`` names (``latest_generation`` as the latest; incomplete
    folders are left for inspection) and the temporary files of processes no longer running or of this one (so not
    while this process is in ``write_generation`` on another thread). Returns the generations deleted, ascending."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    complete = complete_generations(run_dir)
    doomed = generations_to_delete(
        complete, complete, keep_last=keep_last, protect=protect, latest=latest_generation(run_dir)
    )
    for generation in doomed:
        dirname = generation_dirname(generation)
        # Rename first, so an interrupted delete leaves a stale folder rather than a half-deleted generation.
        trash = run_dir / f".{dirname}.old-{os.getpid()}"
        _remove_tree(trash)
        (run_dir / dirname).rename(trash)
        shutil.rmtree(trash)
    for entry in run_dir.iterdir():
        match = _STALE_RE.fullmatch(entry.name)
        if match is not None and not _pid_alive(int(match.group(1))):
            _remove_tree(entry)
    if doomed:
        _fsync_dir(run_dir)
    return doomed
