"""Committing a generation to a run folder (the format: ``persistence.checkpoint``): its files written and fsynced
into a hidden temporary sibling renamed into place, files unchanged since a generation retention deletes linked
rather than copied, the ``LATEST`` pointer and ``config.json`` replaced atomically, a damaged generation set aside,
and what retention no longer keeps pruned. The durable writes (``_write_durably``, ``_fsync_dir``) are the points a
crash test stops at.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import math
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from persistence import checkpoint
from utils.errors import CheckpointError

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
    if not isinstance(name, str) or checkpoint.FILE_STEM_RE.fullmatch(name) is None:
        raise ValueError(
            f"{what} name {name!r} must be a plain file name stem matching {checkpoint.FILE_STEM_RE.pattern}"
        )
    if what == "document" and name + checkpoint.DOCUMENT_SUFFIX == checkpoint.MANIFEST_NAME:
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
    dirname = checkpoint.generation_dirname(generation)

    # Serialise everything first, so a bad value fails before the disk is touched.
    payloads: dict[str, list[bytes]] = {}
    for name, group in tensors.items():
        _check_name(name, "tensor group")
        payloads[name + checkpoint.TENSORS_SUFFIX] = encode_tensor_group(name, group)
    for name, document in documents.items():
        _check_name(name, "document")
        _check_json_value(document, f"documents[{name!r}]")
        payloads[name + checkpoint.DOCUMENT_SUFFIX] = [
            json.dumps(document, allow_nan=False, separators=(",", ":")).encode()
        ]
    manifest = {
        "format_version": checkpoint.FORMAT_VERSION,
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
        _write_durably(
            tmp_dir / checkpoint.MANIFEST_NAME, (json.dumps(manifest, separators=(",", ":")) + "\n").encode()
        )
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
    complete = [g for g in checkpoint.complete_generations(run_dir) if g < generation]
    leaving = generations_to_delete(
        complete, [*complete, generation], keep_last=keep_last, protect=protect, latest=generation
    )
    if not leaving:
        return {}
    gen_dir = run_dir / checkpoint.generation_dirname(leaving[-1])
    try:
        written = checkpoint.read_manifest(gen_dir).manifest["files"]
    except CheckpointError:
        return {}
    unchanged = {}
    for name, entry in files.items():
        if written.get(name) == entry:
            with contextlib.suppress(OSError):
                st = os.lstat(gen_dir / name)
                alone = stat.S_ISREG(st.st_mode) and st.st_nlink == 1  # a link would be linked, not what it names
                if alone and checkpoint.file_digests(gen_dir / name, "sha256") == (entry["size"], [entry["sha256"]]):
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


def write_latest(run_dir: Path, generation: int) -> None:
    """Point ``RUN_DIR/LATEST`` at ``generation``, atomically and durably."""
    write_file_atomically(Path(run_dir) / checkpoint.LATEST_NAME, checkpoint.latest_bytes(generation))


def set_aside(run_dir: Path, generation: int, stamp: str) -> Path:
    """Rename the folder of a damaged ``generation`` to ``gen-NNNNNN.damaged-STAMP`` (``-2``, ``-3``... added if taken):
    kept for inspection and out of the way of the generation written again under its number. No reader, resume or
    retention here looks at that name again; deleting it is left to the user. Returns the new path."""
    run_dir = Path(run_dir)
    folder = run_dir / checkpoint.generation_dirname(generation)
    target = run_dir / f"{folder.name}.damaged-{stamp}"
    for n in itertools.count(2):
        if not (target.exists() or target.is_symlink()):
            break
        target = run_dir / f"{folder.name}.damaged-{stamp}-{n}"
    folder.rename(target)  # a link is renamed itself, never followed
    _fsync_dir(run_dir)
    return target


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
    complete = checkpoint.complete_generations(run_dir)
    doomed = generations_to_delete(
        complete, complete, keep_last=keep_last, protect=protect, latest=checkpoint.latest_generation(run_dir)
    )
    for generation in doomed:
        dirname = checkpoint.generation_dirname(generation)
        # Rename first, so an interrupted delete leaves a stale folder rather than a half-deleted generation.
        trash = run_dir / f".{dirname}.old-{os.getpid()}"
        _remove_tree(trash)
        (run_dir / dirname).rename(trash)
        shutil.rmtree(trash)
    for entry in run_dir.iterdir():
        match = checkpoint.LEFTOVER_RE.fullmatch(entry.name)
        if match is not None and not _pid_alive(int(match.group(1))):
            _remove_tree(entry)
    if doomed:
        _fsync_dir(run_dir)
    return doomed
