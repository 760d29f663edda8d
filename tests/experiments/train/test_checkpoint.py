"""Tests of experiments.train.checkpoint and .reshard on real files, real gloo groups and a real SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from experiments.train.checkpoint import (
    CheckpointInfo,
    latest_checkpoint,
    list_checkpoints,
    load_shard,
    save_checkpoint,
)
from experiments.train.reshard import check_compatible, global_average_from_checkpoint
from tests.support.launch import ROOT


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step)), "n": torch.tensor(step)}, "step": step}


def _save_steps(root: Path, steps: list[int], keep: int = 10) -> None:
    for step in steps:
        save_checkpoint(root, step, _state(step), {"topology": "ring"}, keep=keep)


def _steps(root: Path) -> list[int]:
    return [info.step for info in list_checkpoints(root)]


def _dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# ----------------------------------------------------------------- single process (rank 0)


def test_round_trip_layout_and_index(tmp_path: Path) -> None:
    weights = torch.arange(6.0).reshape(2, 3)
    shard = {"model": {"w": weights}, "epoch": 4, "names": ["a", "b"]}
    path = save_checkpoint(tmp_path, 12, shard, {"topology": "ring", "lr": 0.1})

    assert path == tmp_path / "step_000000012"
    assert sorted(p.name for p in path.iterdir()) == ["index.json", "rank_00000.pt"]
    info = latest_checkpoint(tmp_path)
    assert isinstance(info, CheckpointInfo)
    assert (info.root, info.step, info.path) == (tmp_path, 12, path)
    shard_file = path / "rank_00000.pt"
    record = {
        "size": shard_file.stat().st_size,
        "sha256": hashlib.sha256(shard_file.read_bytes()).hexdigest(),
    }
    assert info.meta == {
        "topology": "ring",
        "lr": 0.1,
        "world_size": 1,
        "files": {"rank_00000.pt": record},
    }
    index = json.loads((path / "index.json").read_text())
    assert (index["step"], index["world_size"], index["meta"]) == (
        12,
        1,
        {"topology": "ring", "lr": 0.1},
    )

    loaded = load_shard(info, 0)
    torch.testing.assert_close(loaded["model"]["w"], weights, rtol=0, atol=0)
    assert (loaded["epoch"], loaded["names"]) == (4, ["a", "b"])


def test_missing_root_has_no_checkpoint(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "nope") is None
    assert list_checkpoints(tmp_path / "nope") == []


def test_latest_picks_newest_complete_and_list_is_oldest_first(tmp_path: Path) -> None:
    _save_steps(tmp_path, [3, 10, 100])
    info = latest_checkpoint(tmp_path)
    assert info is not None and info.step == 100
    assert _steps(tmp_path) == [3, 10, 100]
    assert load_shard(info, 0)["step"] == 100


def test_keep_prunes_oldest(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1, 2, 3, 4, 5], keep=2)
    assert _steps(tmp_path) == [4, 5]
    assert _dirs(tmp_path) == ["step_000000004", "step_000000005"]
    _save_steps(tmp_path, [6], keep=1)
    assert _dirs(tmp_path) == ["step_000000006"]


def test_prune_keeps_new_checkpoint_and_warns_about_newer_dirs(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1, 10, 20])
    (tmp_path / "step_000000030").mkdir()  # incomplete: no warning about it
    with pytest.warns(UserWarning, match="newer than step 5") as record:
        save_checkpoint(tmp_path, 5, _state(5), {"topology": "ring"}, keep=1)
    assert "step_000000010, step_000000020)" in str(record[0].message)
    # keep=1 counts back from the new step: 1 goes, 5 stays, newer dirs are left alone.
    assert _steps(tmp_path) == [5, 10, 20]
    assert (tmp_path / "step_000000030").is_dir()


@pytest.mark.parametrize("keep", [0, -1, True, 1.5, "3"])
def test_bad_keep_raises(tmp_path: Path, keep: object) -> None:
    with pytest.raises(ValueError, match="keep must be an integer >= 1"):
        save_checkpoint(tmp_path, 1, _state(1), {}, keep=keep)  # type: ignore[arg-type]
    assert not tmp_path.joinpath("step_000000001").exists()


@pytest.mark.parametrize("step", [-1, 1.0, None])
def test_bad_step_raises(tmp_path: Path, step: object) -> None:
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        save_checkpoint(tmp_path, step, _state(1), {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"f": object()}, "JSON-serializable"),
        ({"files": []}, "reserved"),
        ({"world_size": 8}, "world_size"),
    ],
)
def test_bad_meta_raises(tmp_path: Path, meta: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        save_checkpoint(tmp_path, 1, _state(1), meta)


def _damage(path: Path, how: str) -> None:
    shard = path / "rank_00000.pt"
    if how == "no_index":
        (path / "index.json").unlink()
    elif how == "bad_index":
        (path / "index.json").write_text('{"step": 2, "world_')
    elif how == "truncated_shard":
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])
    elif how == "grown_shard":
        with open(shard, "ab") as f:
            f.write(b"\0")
    elif how == "missing_shard":
        shard.unlink()
    elif how == "tmp_left":
        (path / "rank_00000.pt.1234.tmp").write_bytes(b"partial")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    ["no_index", "bad_index", "truncated_shard", "grown_shard", "missing_shard", "tmp_left"],
)
def test_half_written_checkpoint_is_ignored(tmp_path: Path, how: str) -> None:
    _save_steps(tmp_path, [1, 2])
    _damage(tmp_path / "step_000000002", how)
    info = latest_checkpoint(tmp_path)
    assert info is not None and info.step == 1
    assert _steps(tmp_path) == [1]
    assert load_shard(info, 0)["step"] == 1


def test_next_save_removes_older_incomplete_dirs(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1, 2])
    _damage(tmp_path / "step_000000002", "no_index")
    (tmp_path / "step_000000003").mkdir()  # crashed before any shard was written
    _save_steps(tmp_path, [4])
    assert _dirs(tmp_path) == ["step_000000001", "step_000000004"]


def test_resave_after_crash_at_same_step_completes(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1, 2])
    _damage(tmp_path / "step_000000002", "no_index")
    _damage(tmp_path / "step_000000002", "tmp_left")
    save_checkpoint(tmp_path, 2, _state(22), {"topology": "ring"})
    info = latest_checkpoint(tmp_path)
    assert info is not None and info.step == 2
    assert load_shard(info, 0)["step"] == 22
    assert not list((tmp_path / "step_000000002").glob("*.tmp"))


def test_corrupt_shard_of_same_size_raises_naming_file(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1])
    shard = tmp_path / "step_000000001" / "rank_00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    info = latest_checkpoint(tmp_path)
    assert info is not None  # same size: only the contents can tell
    with pytest.raises(ValueError, match="corrupt") as err:
        load_shard(info, 0)
    assert str(shard) in str(err.value) and "delete" in str(err.value)
    assert "\n" not in str(err.value)


def test_garbage_shard_without_checksum_raises_naming_file(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1])
    path = tmp_path / "step_000000001"
    shard = path / "rank_00000.pt"
    # An index without checksums (they are optional) leaves torch.load to notice.
    index = json.loads((path / "index.json").read_text())
    del index["files"]["rank_00000.pt"]["sha256"]
    (path / "index.json").write_text(json.dumps(index))
    shard.write_bytes(b"x" * shard.stat().st_size)
    info = latest_checkpoint(tmp_path)
    assert info is not None
    with pytest.raises(ValueError, match="corrupt") as err:
        load_shard(info, 0)
    assert str(shard) in str(err.value)
    assert "\n" not in str(err.value)


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: proof that code would execute."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def test_weights_only_refuses_pickled_objects(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    path = save_checkpoint(tmp_path / "ck", 1, {"obj": _Payload(str(marker))}, {})
    info = latest_checkpoint(tmp_path / "ck")
    assert info is not None
    with pytest.raises(ValueError, match="weights_only") as err:
        load_shard(info, 0)
    assert str(path / "rank_00000.pt") in str(err.value)
    assert not marker.exists()
    # The same file does run code when loaded without weights_only.
    torch.load(path / "rank_00000.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("rank", [1, -1, 5])
def test_missing_rank_raises(tmp_path: Path, rank: int) -> None:
    _save_steps(tmp_path, [1])
    info = latest_checkpoint(tmp_path)
    assert info is not None
    with pytest.raises(ValueError, match=f"rank {rank} is not in the checkpoint"):
        load_shard(info, rank)


def test_check_compatible(tmp_path: Path) -> None:
    _save_steps(tmp_path, [7])
    info = latest_checkpoint(tmp_path)
    assert info is not None
    assert check_compatible(info, world_size=1, topology="ring", allow_reshard=False) is False
    assert check_compatible(info, world_size=1, topology="ring", allow_reshard=True) is False

    expected = (
        f"checkpoint at {info.path} was written by world_size=1 topology=ring; "
        "this run has world_size=4 topology=ring; "
        "set checkpoint.allow_reshard=true to restart the workers from the global average"
    )
    with pytest.raises(ValueError) as err:
        check_compatible(info, world_size=4, topology="ring", allow_reshard=False)
    assert str(err.value) == expected
    with pytest.raises(ValueError, match="this run has world_size=1 topology=complete"):
        check_compatible(info, world_size=1, topology="complete", allow_reshard=False)
    assert check_compatible(info, world_size=4, topology="ring", allow_reshard=True) is True
    assert check_compatible(info, world_size=1, topology="complete", allow_reshard=True) is True


def test_global_average_missing_key_raises(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1])
    info = latest_checkpoint(tmp_path)
    assert info is not None
    with pytest.raises(ValueError, match="no 'ema' entry"):
        global_average_from_checkpoint(info, key="ema")


# ------------------------------------------------------------------- two gloo processes


def _rank_state(rank: int, step: int) -> dict:
    return {
        "w": torch.tensor([1.0, 2.0, 3.0]) * (rank + 1) * step,
        "h": (torch.tensor([1.0, 2.0]) + rank).to(torch.bfloat16),
        "n": torch.tensor(rank + 7),
    }


def _two_rank_worker(rank: int, world_size: int, store: str, root: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        for step in (1, 2, 3):
            shard = {"model": _rank_state(rank, step), "rank": rank}
            path = save_checkpoint(root, step, shard, {"topology": "ring"}, keep=2)
            # Every rank returns only after rank 0 has written the index.
            assert (path / "index.json").is_file()
            info = latest_checkpoint(root)
            assert info is not None and (info.step, info.world_size) == (step, world_size)

        # A failure on rank 1 must reach rank 0 too, not leave it waiting.
        bad: dict[str, object] = {"model": _rank_state(rank, 4)}
        if rank == 1:
            bad["fn"] = lambda: None
        try:
            save_checkpoint(root, 4, bad, {"topology": "ring"}, keep=2)
        except RuntimeError as exc:
            assert "rank 1" in str(exc), str(exc)
        else:
            raise AssertionError(f"rank {rank}: save with an unpicklable shard did not fail")
        dist.barrier()
        info = latest_checkpoint(root)
        assert info is not None and info.step == 3
    finally:
        dist.destroy_process_group()


def test_two_ranks_save_load_prune_and_average(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    # forked: spawned ranks would import torch and the framework again (seconds)
    mp.start_processes(
        _two_rank_worker,
        args=(2, str(tmp_path / "store"), str(root)),
        nprocs=2,
        start_method="fork",
    )

    assert _steps(root) == [2, 3]
    assert not (root / "step_000000001").exists()
    info = latest_checkpoint(root)
    assert info is not None and info.step == 3
    assert info.meta["world_size"] == 2 and info.meta["topology"] == "ring"
    assert sorted(info.meta["files"]) == ["rank_00000.pt", "rank_00001.pt"]
    for rank in (0, 1):
        shard = load_shard(info, rank)
        assert shard["rank"] == rank
        for name, value in _rank_state(rank, 3).items():
            torch.testing.assert_close(shard["model"][name], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="rank 2 is not in the checkpoint"):
        load_shard(info, 2)

    # Hand mean of step 3: w = [3, 6, 9] and [6, 12, 18]; h = [1, 2] and [2, 3].
    avg = global_average_from_checkpoint(info)
    assert list(avg) == ["w", "h", "n"]
    torch.testing.assert_close(avg["w"], torch.tensor([4.5, 9.0, 13.5]), rtol=0, atol=0)
    assert avg["h"].dtype == torch.bfloat16
    torch.testing.assert_close(avg["h"].float(), torch.tensor([1.5, 2.5]), rtol=0, atol=0)
    assert avg["n"].dtype == torch.int64 and avg["n"].item() == 7  # from rank 0

    # The failed save at step 4 left an incomplete dir; losing a rank file of step 3
    # makes step 2 the newest complete one.
    assert (root / "step_000000004").is_dir()
    (info.path / "rank_00001.pt").unlink()
    fallback = latest_checkpoint(root)
    assert fallback is not None and fallback.step == 2


# ------------------------------------------------------------------- crash during a write

_CRASH_CHILD = """
import sys, torch
from experiments.train.checkpoint import save_checkpoint
root, step = sys.argv[1], 2
while True:
    shard = {"model": {f"t{i}": torch.full((1 << 20,), float(step)) for i in range(64)}}
    save_checkpoint(root, step, shard, {"topology": "ring"}, keep=10)
    step += 1
"""


def _kill_mid_write(root: Path) -> list[Path]:
    """Run a saver that writes 256 MB shards, SIGKILL it once a temp file appears."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen([sys.executable, "-c", _CRASH_CHILD, str(root)], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not list(root.glob("step_*/*.tmp")):
            assert proc.poll() is None, f"saver exited early with {proc.returncode}"
            assert time.monotonic() < deadline, "saver never started a shard"
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return list(root.glob("step_*/*.tmp"))


def test_sigkill_during_write_keeps_previous_checkpoint(tmp_path: Path) -> None:
    for attempt in range(3):
        root = tmp_path / f"ck{attempt}"
        save_checkpoint(root, 1, {"model": {"t0": torch.full((4,), 1.0)}}, {"topology": "ring"})
        leftovers = _kill_mid_write(root)
        if leftovers:  # the kill landed inside a write, as intended
            break
    else:
        pytest.fail("the saver was never killed while a temp file existed")

    crashed = int(leftovers[0].parent.name.removeprefix("step_"))
    info = latest_checkpoint(root)
    assert info is not None and info.step == crashed - 1
    assert crashed not in _steps(root)
    shard = load_shard(info, 0)
    for value in shard["model"].values():
        assert torch.equal(value, torch.full_like(value, float(info.step)))

    # Resuming and saving the crashed step again cleans up and completes it.
    save_checkpoint(root, crashed, {"model": {"t0": torch.zeros(2)}}, {"topology": "ring"})
    resumed = latest_checkpoint(root)
    assert resumed is not None and resumed.step == crashed
    assert not list(root.glob("step_*/*.tmp"))
