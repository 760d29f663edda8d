"""Shared pytest configuration: skip ``gpu`` tests where CUDA is not visible; shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from tests.support.launch import DIST_ENV


@pytest.fixture(autouse=True)
def _clear_hydra() -> Iterator[None]:
    """No test leaves a global Hydra instance behind for the next one."""
    from hydra.core.global_hydra import GlobalHydra

    yield
    GlobalHydra.instance().clear()


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every ``gpu`` test as skipped when ``torch.cuda.is_available()`` is False."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
