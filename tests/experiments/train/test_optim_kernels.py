"""The ``allreduce`` baseline steps with the wrapper's optimizer kernels, and says so."""

from __future__ import annotations

import copy
import json

import torch

from experiments.train.metrics import TrainWindow
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from experiments.train.run import run
from experiments.train.step import TrainStep
from tests.experiments.train.conftest import batches, small_model
from tests.support.launch import QUIET, ROOT, compose_config

OPTIMS = sorted(p.stem for p in (ROOT / "conf" / "optim").glob("*.yaml"))
# on the CPU: torch's fused kernels for its classes, a loop for the others
EXPECTED = {
    "sgd": ("SGD", True, False),
    "adam": ("Adam", True, False),
    "adamw": ("AdamW", True, False),
    "accum_adam": ("AccumAdam", False, False),
    "accum_adamw": ("AccumAdamW", False, False),
    "qgm_sgd": ("QGMSGD", False, False),
    "lagged_v_adamw": ("LaggedVAdamW", False, False),
}


def _flags(kernels: dict) -> tuple:
    return kernels["optimizer"], kernels["fused"], kernels["foreach"]


def _step(cfg, topology) -> TrainStep:
    return TrainStep(
        small_model(),
        cfg.train,
        topology,
        build_optim_fn(cfg.optim),
        build_scheduler_fn(cfg.scheduler, 5, 10),
        TrainWindow(torch.device("cpu")),
        rank=0,
        world_size=1,
    )


def test_baseline_flags_equal_the_wrappers_for_every_optim_config(group_of_one) -> None:
    assert sorted(EXPECTED) == OPTIMS
    allreduce = compose_config("topology=allreduce").topology
    for optim in OPTIMS:
        cfg = compose_config("topology=complete", "scheduler=constant", f"optim={optim}")
        baseline, wrapper = _step(cfg, allreduce), _step(cfg, cfg.topology)
        try:
            for step in (baseline, wrapper):
                step(*batches(1)[0], 1)  # the wrapper builds its buckets in the first backward
            assert _flags(baseline.optimizer_kernels()) == _flags(wrapper.optimizer_kernels())
            assert _flags(baseline.optimizer_kernels()) == EXPECTED[optim], optim
        finally:
            baseline.close()
            wrapper.close()


def test_baseline_keeps_fused_after_loading_an_unfused_checkpoint(make_step) -> None:
    a = make_step("topology=allreduce", "optim=adamw")
    a(*batches(1)[0], 1)
    state = copy.deepcopy(a.training_state())
    for group in state["optimizer"]["param_groups"]:  # as written before the baseline fused
        group["fused"] = None
    b = make_step("topology=allreduce", "optim=adamw")
    b.load_training_state(state)
    assert b.optimizer_kernels()["fused"] is True
    b(*batches(1, seed=4)[0], 2)


def test_summary_reports_the_kernels(tmp_path, world_of_one) -> None:
    cfg = compose_config(*QUIET, "topology=allreduce", "optim=adamw", "train.max_steps=2")
    summary = run(cfg, run_dir=tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["optim_kernels"] == summary["optim_kernels"]
    assert written["optim_kernels"] == {"optimizer": "AdamW", "fused": True, "foreach": False}
