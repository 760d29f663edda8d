"""bench-upstream's ``gpt`` model: the paper's GPT-2 workload, the driver's options and tables."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from experiments.bench import gpt_workload as gw
from experiments.bench import upstream
from experiments.bench.upstream_env import UPSTREAM
from experiments.bench.upstream_worker import _setup
from tests.support.cli import bad_command_lines, refusal
from tests.support.dist_harness import free_port


def test_the_model_ties_its_head_and_returns_logits_and_loss() -> None:
    model = gw.build()
    assert model.head.weight is model.wte.weight
    x, y = gw.token_batches(2, seed=3)[0]
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x one token on
    logits, loss = model(x, y)
    assert logits.shape == (2, gw.GPT_BENCH.block_size, gw.GPT_BENCH.vocab_size)
    # at GPT-2's initialisation every token is about equally likely
    assert abs(loss.item() - torch.log(torch.tensor(float(gw.GPT_BENCH.vocab_size)))) < 0.1
    # the same weights in every job, the data differs by rank
    assert torch.equal(gw.build().wte.weight, model.wte.weight)
    assert not torch.equal(gw.token_batches(2, seed=4)[0][0], x)


def test_accum_adamw_has_the_scripts_two_groups_in_either_pair_order() -> None:
    model = gw.build()
    named = list(model.named_parameters())
    for pairs in (named, [(p, n) for n, p in named]):
        opt = gw.accum_adamw_fn()(pairs)
        assert type(opt).__name__ == "AccumAdamW"
        decay, plain = opt.param_groups
        assert decay["weight_decay"] == gw.WEIGHT_DECAY and plain["weight_decay"] == 0.0
        assert all(p.dim() >= 2 for p in decay["params"])
        assert all(p.dim() < 2 for p in plain["params"]) and plain["params"]
        assert len(decay["params"]) + len(plain["params"]) == len(named)
        assert decay["accum_iter"] == gw.ACCUM_ITER and decay["betas"] == gw.BETAS


def test_the_schedule_warms_up_linearly() -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=gw.LR)
    sched = gw.cosine_fn(opt)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    start = 1.0 / gw.WARMUP  # the script's LinearLR starts at lr / warmup and reaches lr
    assert lrs == pytest.approx([gw.LR * (start + (1 - start) * k / gw.WARMUP) for k in range(3)])


def _args(impl: str) -> argparse.Namespace:
    return argparse.Namespace(
        impl=impl, impl_file="", model="gpt", batch=2, topology="complete", profile=False,
        bucket_mb=None,
    )  # fmt: skip


def test_ours_and_torch_ddp_rows_train_the_same_workload_alone() -> None:
    """One process: the wrapper (clipping, schedule, AccumAdamW in its hooks) is local training."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        finals, rows = [], []
        for impl in ("ours", "torch-ddp"):
            step, wrapper, row = _setup(_args(impl))
            for i in range(3):
                step(i)
            params = torch.cat([p.detach().flatten() for p in _model_of(step).parameters()])
            finals.append(params)
            rows.append(row)
            if wrapper is not None:
                wrapper.close()
        assert rows[0]["bucket_mb"] == gw.BUCKET_MB and rows[0]["model"] == "gpt"
        assert rows[1]["topology"] == "allreduce"
        # the gradients clip (their norm exceeds 1 at the start) and the steps move the weights
        assert not torch.equal(finals[0], torch.cat([p.flatten() for p in gw.build().parameters()]))
        torch.testing.assert_close(finals[0], finals[1], rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


def _model_of(step: object) -> torch.nn.Module:
    cells = {
        c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, torch.nn.Module)
    }  # type: ignore[attr-defined]
    for net in cells:
        return getattr(net, "module", net)
    raise AssertionError("no model in the step's closure")


def test_tables_check_the_gpt_targets() -> None:
    def row(impl: str, ms: float) -> dict:
        return {"impl": impl, "median_step_s": ms / 1e3, "cpu_step_s": ms / 1e3,
                "faults_per_step": 1.0, "rounds_ms": [ms]}  # fmt: skip

    configs = [
        {"model": "gpt", "procs": 2, "topology": "ring",
         "rows": [row("ours", 80.0), row(UPSTREAM, 100.0), row("torch-ddp", 90.0)]},
        {"model": "gpt", "procs": 4, "topology": "one-peer-exp",
         "rows": [row("ours", 90.0), row(UPSTREAM, 100.0)]},
        {"procs": 2, "topology": "ring", "rows": [row("ours", 90.0), row(UPSTREAM, 100.0)]},
    ]  # fmt: skip
    text = upstream.tables({"configs": configs})
    assert f"| gpt | 2 | ring | ours / {UPSTREAM} | 0.80 | <= 0.85 | yes |" in text
    assert f"| gpt | 4 | one-peer-exp | ours / {UPSTREAM} | 0.90 | <= 0.85 | no |" in text
    # results written before the model column timed the mlp, whose target here is 1.0
    assert f"| mlp | 2 | ring | ours / {UPSTREAM} | 0.90 | <= 1.00 | yes |" in text
    assert "| gpt | 2 | ring | ours | 80.0 | 80 |" in text


def test_the_command_passes_the_model_its_batch_and_the_bucket_size(tmp_path: Path) -> None:
    args = argparse.Namespace(
        steps=3, rounds=1, warmup=2, turn_warmup=0, profile_steps=1, batch=32, gpt_batch=5,
        threads=1, bucket_mb=None,
    )  # fmt: skip
    cmd, env = upstream._command("ours", "", 2, "ring", tmp_path, args, "gpt")
    assert cmd[cmd.index("--model") + 1] == "gpt" and cmd[cmd.index("--batch") + 1] == "5"
    assert "--bucket-mb" not in cmd and env["PYTHONSAFEPATH"] == "1"
    args.bucket_mb = 25.0
    cmd, _ = upstream._command("ours", "", 2, "ring", tmp_path, args, "mlp")
    assert cmd[cmd.index("--batch") + 1] == "32" and cmd[cmd.index("--bucket-mb") + 1] == "25.0"


@bad_command_lines(
    (["--bucket-mb", "0"], "--bucket-mb 0.0 is invalid; it must be > 0"),
    (["--gpt-batch", "0"], "--gpt-batch 0 is invalid; it must be >= 1"),
    (["--models", "resnet"], "invalid choice: 'resnet'"),
)
def test_bad_options_are_refused_before_any_job(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in refusal(upstream.main, [*argv, "--impls", "ours"], capsys, status=2)
