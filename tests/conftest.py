"""Shared pytest configuration: skip ``gpu`` tests where CUDA is not visible; shared fixtures.

On a machine with a GPU the CPU suite stays on the CPU: every test not marked
``gpu`` runs with ``CUDA_VISIBLE_DEVICES`` empty, so the ranks it spawns pick
gloo on ``cpu`` as on a machine without one, and its bit-exact comparisons
keep their meaning. CUDA availability is read through NVML so that checking it
does not initialise CUDA in this process, and ``gpu`` tests run last, after
which nothing here hides the GPU any more.

The tests run torch on one thread, as the ranks they fork and launch do
(``dist_harness``, ``launch.clean_env``): their models are tiny, so more threads gain
nothing, and on a busy machine OpenMP threads waiting for each other make every tiny
kernel take milliseconds (an in-process resume test took 3 to 27 s on two threads
against 4 to 5 s on one, on the same shared 2 cores).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

# before torch: is_available() through NVML, which leaves CUDA uninitialised here
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import pytest
import torch
import torch.distributed as dist

from tests.support.launch import DIST_ENV

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _clear_hydra() -> Iterator[None]:
    """No test leaves a global Hydra instance behind for the next one."""
    from hydra.core.global_hydra import GlobalHydra

    yield
    GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def _restore_topology_registry() -> Iterator[None]:
    """A topology a test's own code registers (a user's package, say) is gone for the next test."""
    from decent_dp.topo import TopologyReg

    saved = dict(TopologyReg.registry)
    yield
    TopologyReg.registry.clear()
    TopologyReg.registry.update(saved)


@pytest.fixture
def world_of_one() -> Iterator[None]:
    """Let ``run()`` create its one-process group; restore the environment and destroy it after."""
    from hydra.core.global_hydra import GlobalHydra

    saved = dict(os.environ)
    had_group = dist.is_available() and dist.is_initialized()
    if not had_group:
        for key in DIST_ENV:
            os.environ.pop(key, None)
    yield
    if not had_group and dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)
    GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def _cpu_unless_gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the GPU from every test not marked ``gpu`` (and from the processes it starts)."""
    if "gpu" not in request.keywords:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run ``gpu`` tests last; mark them skipped when ``torch.cuda.is_available()`` is False.

    Under pytest-xdist (``make test``) they are skipped on a GPU machine too: it hands
    whole files to its processes, so a file's ``gpu`` tests would run before another
    file's CPU tests, whose forked ranks must not inherit an initialised CUDA. One
    process runs them last: ``make test-gpu``, or ``make test TEST_WORKERS=0``.
    """
    items.sort(key=lambda item: "gpu" in item.keywords)  # stable: the rest keep their order
    if not torch.cuda.is_available():
        reason = "needs CUDA; torch.cuda.is_available() is False"
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        reason = "not under pytest-xdist, where it could run before CPU tests: make test-gpu"
    else:
        return
    skip_gpu = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
