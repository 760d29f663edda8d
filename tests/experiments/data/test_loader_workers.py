"""Image-folder loaders keep their worker processes; loaders yield the model's memory format;
workers ignore the configured stop signals under every start method."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from experiments.data import build_data
from experiments.data.loaders import Shard, set_memory_format, worker_init
from experiments.data.seeded import SeededEvalLoader, SeededShardLoader

CPU = torch.device("cpu")


class _PidImages(torch.utils.data.Dataset):
    """Images keyed like ``SeededImages``; the label is the pid of the process that read it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, _ = key
        return torch.full((3, 4, 4), float(index)), os.getpid()


def _pids(batches) -> set[int]:
    return {int(p) for _, y in batches for p in y}


def test_folder_workers_survive_epochs_and_evaluations() -> None:
    shard = Shard(torch.arange(8), batch_size=2, num_batches=4, seed=0, rank=0)
    train = SeededShardLoader(shard, _PidImages(), num_workers=1, device=CPU)
    test = SeededEvalLoader(_PidImages(), 0, 8, batch_size=4, num_workers=1, device=CPU)
    set_memory_format(_Data(train, test), torch.channels_last)

    first = list(train.iterate(0))
    evaluated = list(test)
    second = list(train.iterate(1, start=1))  # a resumed epoch, after an evaluation
    again = list(test)
    (train_pid,) = _pids(first)
    (test_pid,) = _pids(evaluated)
    assert train_pid != os.getpid() and test_pid != os.getpid()
    assert _pids(second) == {train_pid} and _pids(again) == {test_pid}
    assert len(first) == 4 and len(second) == 3 and len(evaluated) == 2
    # the worker stacked the batch in channels_last
    for x, _ in first + evaluated:
        assert x.shape[1] == 3 and x.is_contiguous(memory_format=torch.channels_last)
    # the samples are the ones of the epoch's order, as without persistent workers
    order = train.epoch_order(1)
    assert torch.equal(second[0][0][:, 0, 0, 0], order[2:4].float())


class _Data:
    def __init__(self, train, test) -> None:
        self.train, self.test = train, test


def test_in_memory_batches_come_in_channels_last() -> None:
    data = build_data(
        {"name": "synthetic"}, rank=0, world_size=1, batch_size=16, seed=0, device=CPU
    )
    plain = next(iter(data.train.iterate(0)))[0]
    assert plain.shape[1] == 3 and not plain.is_contiguous(memory_format=torch.channels_last)
    set_memory_format(data, torch.channels_last)
    x, _ = next(iter(data.train.iterate(0)))
    t, _ = next(iter(data.test))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert t.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x, plain)  # the same values, in another layout


# ------------------------------------------------------------ the stop signals in workers


class _Squares(torch.utils.data.Dataset):
    """Sixteen samples, ``i`` and ``i * i``; picklable for the spawn start methods."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(index), float(index * index)]), os.getpid()


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_workers_ignore_the_configured_preemption_signal(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SUBMITIT_PREEMPT_SIGNAL names USR1: the workers must ignore it as well as SIGTERM,
    # also when they do not inherit the training process's handlers (forkserver, spawn)
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    loader = torch.utils.data.DataLoader(
        _Squares(),
        batch_size=2,
        num_workers=2,
        multiprocessing_context=method,
        worker_init_fn=worker_init(),
    )
    batches = iter(loader)
    got = [next(batches), next(batches)]  # one batch from each worker: both have started
    workers = {int(p) for _, pids in got for p in pids}
    assert len(workers) == 2 and os.getpid() not in workers
    for pid in workers:  # as SLURM signals every process of the step
        os.kill(pid, signal.SIGUSR1)
        os.kill(pid, signal.SIGTERM)
    got += list(batches)  # the workers are still there to make the rest
    values = torch.cat([x for x, _ in got])
    expected = torch.stack([torch.arange(16.0), torch.arange(16.0) ** 2], dim=1)
    assert torch.equal(values, expected)
    assert {int(p) for _, pids in got for p in pids} == workers
