"""Crash-safe, per-rank checkpoints.

Decentralized workers hold different models, so every rank saves its own shard.
A checkpoint is a directory ``<root>/step_XXXXXXXXX`` holding one file per rank,
``rank_RRRRR.pt``, and an ``index.json`` that rank 0 writes last::

    <root>/
      step_000001000/
        rank_00000.pt
        rank_00001.pt
        index.json        # step, world_size, meta, name/size/sha256 of each shard

Every file is written atomically: ``torch.save`` into a ``*.tmp`` file in the same
directory, flush, ``fsync``, ``os.replace`` onto the final name, ``fsync`` of the
directory. Because the index appears only after every shard is durable, a process
killed at any moment leaves either a complete checkpoint or a directory that
:func:`latest_checkpoint` skips (no index, a shard missing or of the wrong size, a
leftover temp file). The previous complete checkpoint is never touched until a newer
one is complete.

The checkpoint root must be on a filesystem that every rank sees (rank 0 checks the
other ranks' shards before it writes the index).

Resuming with another world size or topology reads the global average of a
checkpoint's shards instead (:mod:`experiments.train.reshard`).

A checkpoint of sharded replicas (``train.shard_size > 1``) also holds a ``dcp/``
directory, written before the shards (:mod:`experiments.train.sharding`); its index's
``meta["sharded"]`` names it, and the checkpoint counts as complete only once every
replica's metadata and extras are there.

A little over 500 lines on purpose: writing, verifying, listing and pruning checkpoints
are one protocol (what makes a checkpoint complete), and splitting them would put the
rules for one crash case in two files.

Example::

    info = latest_checkpoint(root)
    if info is not None:
        model.load_state_dict(load_shard(info, rank)["model"])
    ...
    save_checkpoint(root, step, {"model": model.state_dict()}, {"topology": "ring"})
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

__all__ = [
    "CheckpointInfo",
    "save_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_shard",
    "checkpoint_dir",
    "shard_name",
    "run_on_rank0",
]

INDEX_NAME = "index.json"
TMP_SUFFIX = ".tmp"
FORMAT_VERSION = 1
_STEP_DIR_RE = re.compile(r"^step_(\d{9,})$")
_SHARD_RE = re.compile(r"^rank_(\d{5,})\.pt$")
_RESERVED_META_KEYS = ("files",)
_HASH_CHUNK = 1 << 22


@dataclass
class CheckpointInfo:
    """A complete checkpoint found on disk.

    Args:
        root: The checkpoint root directory.
        step: The training step the checkpoint was saved at.
        path: The checkpoint directory, ``root / f"step_{step:09d}"``.
        meta: The ``meta`` given to :func:`save_checkpoint`, plus ``world_size`` (the
            number of shards) and ``files`` (shard name -> ``{"size": int, "sha256": str}``).

    Example::

        info = latest_checkpoint("outputs/run/checkpoints")
        if info is not None:
            print(info.step, info.world_size, info.meta.get("topology"))
    """

    root: Path
    step: int
    path: Path
    meta: dict

    @property
    def world_size(self) -> int:
        """Number of ranks (and shards) that wrote this checkpoint."""
        return int(self.meta["world_size"])


def checkpoint_dir(root: str | os.PathLike[str], step: int) -> Path:
    """Return the directory of the checkpoint at ``step`` under ``root``.

    Args:
        root: The checkpoint root directory.
        step: A non-negative training step.

    Returns:
        ``Path(root) / f"step_{step:09d}"``.

    Raises:
        ValueError: If ``step`` is not a non-negative integer.
    """
    return Path(root) / f"step_{_check_step(step):09d}"


def shard_name(rank: int) -> str:
    """Return the file name of ``rank``'s shard, ``rank_{rank:05d}.pt``.

    Args:
        rank: A non-negative rank.

    Returns:
        The shard's file name inside a checkpoint directory.
    """
    return f"rank_{rank:05d}.pt"


# ----------------------------------------------------------------------------- saving


def save_checkpoint(
    root: str | os.PathLike[str],
    step: int,
    shard: dict,
    meta: dict,
    keep: int = 3,
) -> Path:
    """Save this rank's shard and, on rank 0, the index; collective when distributed.

    When ``torch.distributed`` is initialized every rank of the default group must call
    this with the same ``root``, ``step`` and ``keep`` (arguments are checked on each rank
    before any communication); otherwise the caller acts as rank 0 of a world of one.
    Each rank writes ``rank_{rank:05d}.pt`` atomically, then the ranks synchronize, then
    rank 0 writes ``index.json`` (atomically, last) and prunes, then the ranks
    synchronize again. An error on any rank is raised on every rank, so a failed save
    (disk full, unpicklable shard) never leaves the others waiting. With NCCL, set the
    CUDA device of each rank first, as for any object collective.

    Saving a step that already has a checkpoint replaces it: its index is removed before
    the new shards are written, so a crash then falls back to the previous step.

    Pruning (rank 0, after the index is durable): of the complete checkpoints at or
    before ``step``, only the newest ``keep`` are kept; incomplete directories older than
    ``step`` are removed. Directories newer than ``step`` are left alone (with a warning
    when complete ones exist, since :func:`latest_checkpoint` would pick them).

    Args:
        root: The checkpoint root directory; created if missing. Must be shared by all ranks.
        step: The training step, a non-negative integer.
        shard: This rank's state, e.g. ``{"model": ..., "optim": ...}``. Keep it to what
            ``torch.load(weights_only=True)`` accepts (tensors, containers, primitives).
        meta: JSON-serializable run facts recorded in the index (rank 0's is used), e.g.
            ``{"topology": "ring", "epoch": 3}``. ``world_size`` and ``files`` are filled in.
        keep: How many complete checkpoints to keep, at least 1.

    Returns:
        The checkpoint directory, ``root / f"step_{step:09d}"``.

    Raises:
        ValueError: If ``step``, ``keep`` or ``meta`` is invalid.
        TypeError: If ``shard`` or ``meta`` is not a dict.
        RuntimeError: If writing failed on any rank (the message names the rank and file).
    """
    step = _check_step(step)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
    if not isinstance(shard, dict):
        raise TypeError(f"shard must be a dict, got {type(shard).__name__}")
    rank, world_size = _rank_and_world_size()
    meta = _check_meta(meta, world_size)
    root = Path(root)
    path = checkpoint_dir(root, step)

    # Phase 1: rank 0 clears leftovers of an earlier attempt at this step before anyone
    # writes, so they can neither be mistaken for this save nor block it.
    _collective(path, rank == 0, lambda: _prepare_dir(root, path, world_size))

    # Phase 2: every rank writes its shard; the exchange of records doubles as the barrier.
    records = _collective(path, True, lambda: _write_shard(path, rank, shard))

    # Phase 3: rank 0 writes the index last, then prunes; everyone waits for it.
    def finish() -> None:
        files = {rec["name"]: {"size": rec["size"], "sha256": rec["sha256"]} for rec in records}
        _check_visible(path, files)
        index = {
            "format": FORMAT_VERSION,
            "step": step,
            "world_size": world_size,
            "meta": meta,
            "files": files,
        }
        data = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
        _atomic_write(path / INDEX_NAME, lambda f: f.write(data))
        _prune(root, step, keep)

    _collective(path, rank == 0, finish)
    return path


def run_on_rank0(path: Path, fn: Callable[[], Any]) -> None:
    """Run ``fn`` on rank 0 while the others wait; an error there is raised on every rank."""
    rank, _ = _rank_and_world_size()
    _collective(path, rank == 0, fn)


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return step


def _check_meta(meta: Any, world_size: int) -> dict:
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    for key in _RESERVED_META_KEYS:
        if key in meta:
            raise ValueError(f"meta key {key!r} is reserved; it is filled in by save_checkpoint")
    if "world_size" in meta and meta["world_size"] != world_size:
        raise ValueError(
            f"meta['world_size']={meta['world_size']!r} differs from the process group's "
            f"world_size={world_size}; drop the key, save_checkpoint fills it in"
        )
    try:
        text = json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta must be JSON-serializable: {exc}") from None
    return json.loads(text)


_ALONE: contextvars.ContextVar[bool] = contextvars.ContextVar("checkpoint_alone", default=False)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Save and load as rank 0 of a world of one, even where a process group exists.

    An elastic host's checkpoint is its own: the process group of its quorum
    changes with the members, and the others save on their own schedule.
    """
    token = _ALONE.set(True)
    try:
        yield
    finally:
        _ALONE.reset(token)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and not _ALONE.get()


def _rank_and_world_size() -> tuple[int, int]:
    if _distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _collective(path: Path, run_here: bool, fn: Callable[[], Any]) -> list[Any]:
    """Run ``fn`` where asked, then gather every rank's result (a barrier carrying data).

    An exception on any rank is re-raised on every rank as one ``RuntimeError``, so no
    rank is left waiting in a later collective.
    """
    result: Any = None
    error: str | None = None
    local_exc: Exception | None = None
    if run_here:
        try:
            result = fn()
        except Exception as exc:  # reported to every rank, then raised there
            local_exc = exc
            rank, _ = _rank_and_world_size()
            lines = str(exc).strip().splitlines()
            error = f"rank {rank}: {type(exc).__name__}: {lines[0] if lines else ''}"
    if _distributed():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (result, error))
    else:
        gathered = [(result, error)]
    errors = [err for _, err in gathered if err is not None]
    if errors:
        raise RuntimeError(f"checkpoint save at {path} failed on {errors[0]}") from local_exc
    return [res for res, _ in gathered]


def _prepare_dir(root: Path, path: Path, world_size: int) -> None:
    new_root = not root.exists()
    path.mkdir(parents=True, exist_ok=True)
    if new_root:
        _fsync_dir(root.parent)
    _fsync_dir(root)
    # Re-saving a step: invalidate the old index first so a mix of old and new shards
    # is never taken for a complete checkpoint.
    index = path / INDEX_NAME
    if index.exists():
        index.unlink()
    for entry in path.iterdir():
        match = _SHARD_RE.match(entry.name)
        stale_shard = match is not None and int(match.group(1)) >= world_size
        if entry.name.endswith(TMP_SUFFIX) or stale_shard:
            _remove(entry)
    _fsync_dir(path)


def _write_shard(path: Path, rank: int, shard: dict) -> dict[str, Any]:
    # Other ranks may reach here before rank 0's mkdir is visible on a shared filesystem.
    path.mkdir(parents=True, exist_ok=True)
    final = path / shard_name(rank)
    size = _atomic_write(final, lambda f: torch.save(shard, f))
    return {"name": final.name, "size": size, "sha256": _sha256(final)}


def _atomic_write(final: Path, write: Callable[[IO[bytes]], Any]) -> int:
    """Write ``final`` via a temp file, fsync, rename and directory fsync; return its size."""
    tmp = final.with_name(f"{final.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)
    return size


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_visible(path: Path, files: dict[str, dict[str, Any]]) -> None:
    for name, rec in files.items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(
                f"shard {file} is not visible from rank 0; the checkpoint root must be on a "
                "filesystem shared by all ranks"
            )
        if file.stat().st_size != rec["size"]:
            raise OSError(
                f"shard {file} has {file.stat().st_size} bytes on rank 0 but its writer "
                f"reported {rec['size']}; is the checkpoint root shared by all ranks?"
            )


def _prune(root: Path, step: int, keep: int) -> None:
    complete = {info.step for info in list_checkpoints(root)}
    older_complete = sorted(s for s in complete if s <= step)
    doomed = set(older_complete[:-keep])
    # Newer dirs belong to a run that was resumed from an older step; they are not ours to
    # delete. Incomplete ones are harmless (skipped, and pruned once this run passes them).
    newer = [f"step_{s:09d}" for s in sorted(complete) if s > step]
    for s, path in _step_dirs(root):
        if s in doomed or (s < step and s not in complete):
            _remove_checkpoint_dir(path)
    if newer:
        warnings.warn(
            f"checkpoint root {root} holds complete checkpoints newer than step {step} "
            f"({', '.join(newer)}); latest_checkpoint will prefer them",
            stacklevel=3,
        )


def _remove_checkpoint_dir(path: Path) -> None:
    # Drop the index first: a crash mid-removal then leaves an incomplete dir, never a
    # "complete" one with shards missing.
    try:
        (path / INDEX_NAME).unlink(missing_ok=True)
        _fsync_dir(path)
        shutil.rmtree(path)
    except OSError as exc:
        warnings.warn(f"could not remove old checkpoint {path}: {exc}", stacklevel=4)


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- finding


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_*`` directory under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, key=lambda item: item[0])


def _read_complete(root: Path, step: int, path: Path) -> CheckpointInfo | None:
    """Return the checkpoint in ``path`` if it is complete, else ``None``."""
    try:
        names = {entry.name for entry in path.iterdir()}
        if INDEX_NAME not in names or any(name.endswith(TMP_SUFFIX) for name in names):
            return None
        index = json.loads((path / INDEX_NAME).read_text())
        world_size = index["world_size"]
        files = index["files"]
        meta = index["meta"]
        if index["step"] != step or not isinstance(meta, dict) or not isinstance(files, dict):
            return None
        if not isinstance(world_size, int) or world_size < 1:
            return None
        if set(files) != {shard_name(r) for r in range(world_size)}:
            return None
        for name, rec in files.items():
            if name not in names or (path / name).stat().st_size != rec["size"]:
                return None
        # sharded replicas (train.shard_size > 1) sit beside the shards, in meta["sharded"]["dir"]
        sharded = meta.get("sharded")
        if sharded is not None and not _replicas_complete(
            path / sharded["dir"], int(sharded["replicas"])
        ):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CheckpointInfo(
        root=root, step=step, path=path, meta={**meta, "world_size": world_size, "files": files}
    )


def _replicas_complete(path: Path, replicas: int) -> bool:
    """Each replica's ``torch.distributed.checkpoint`` metadata and extras are there."""
    return all(
        (path / f"replica-{r}" / name).is_file()
        for r in range(replicas)
        for name in (".metadata", "extras.pt")
    )


def list_checkpoints(root: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """List the complete checkpoints under ``root``, oldest first.

    A directory counts as complete when its ``index.json`` parses, names one shard per
    rank, every shard exists with the recorded size, and no temp file is left in it.
    Shard contents are not read here; :func:`load_shard` verifies the checksum.

    Args:
        root: The checkpoint root directory; a missing root has no checkpoints.

    Returns:
        The complete checkpoints, in increasing step order.
    """
    root = Path(root)
    found = (_read_complete(root, step, path) for step, path in _step_dirs(root))
    return [info for info in found if info is not None]


def latest_checkpoint(root: str | os.PathLike[str]) -> CheckpointInfo | None:
    """Return the newest complete checkpoint under ``root``, or ``None``.

    Half-written directories (no index, a missing shard, a size mismatch, a leftover
    temp file) are skipped, so a crash during a save falls back to the previous one.

    Args:
        root: The checkpoint root directory; a missing root has no checkpoints.

    Returns:
        The newest complete checkpoint, or ``None`` when there is none.
    """
    root = Path(root)
    for step, path in reversed(_step_dirs(root)):
        info = _read_complete(root, step, path)
        if info is not None:
            return info
    return None


# ---------------------------------------------------------------------------- loading


def load_shard(info: CheckpointInfo, rank: int) -> dict:
    """Load ``rank``'s shard of a checkpoint onto the CPU with ``weights_only=True``.

    Args:
        info: A checkpoint from :func:`latest_checkpoint` or :func:`list_checkpoints`.
        rank: The rank whose shard to load, in ``[0, info.world_size)``.

    Returns:
        The dict that rank passed to :func:`save_checkpoint`.

    Raises:
        ValueError: If the rank is not in the checkpoint, or the file is missing,
            corrupt (checksum, truncation) or holds objects that ``weights_only``
            loading refuses.
    """
    world_size = info.world_size
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(
            f"rank {rank!r} is not in the checkpoint at {info.path}, which holds ranks "
            f"0..{world_size - 1} (world_size={world_size})"
        )
    file = info.path / shard_name(rank)
    advice = f"delete {info.path} so that an older checkpoint is used"
    if not file.is_file():
        raise ValueError(f"shard {file} is missing; {advice}")
    expected = info.meta.get("files", {}).get(file.name, {}).get("sha256")
    if expected is not None and _sha256(file) != expected:
        raise ValueError(f"shard {file} is corrupt (sha256 mismatch); {advice}")
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for bad files
        raise ValueError(
            f"shard {file} is corrupt or holds objects that weights_only loading refuses "
            f"({type(exc).__name__}: {_short_reason(exc)}); {advice}"
        ) from exc
    if not isinstance(obj, dict):
        raise ValueError(f"shard {file} is corrupt: holds a {type(obj).__name__}, not a dict")
    return obj


def _short_reason(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # weights_only errors bury the useful line ("Unsupported global: ...") in advice text
    for line in lines:
        if "Unsupported global" in line:
            return line[:200]
    return lines[0][:200] if lines else "no details"
