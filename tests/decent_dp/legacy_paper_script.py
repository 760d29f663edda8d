# the device is chosen before torch is imported, and typing.List is spelled as in the originals
# ruff: noqa: E402, UP006, UP035
"""A GPT training script in the style of the decent-dp paper's experiment scripts.

It uses the wrapper the way those scripts do: a model whose ``forward(x, y)``
returns ``(logits, loss)``, AccumAdamW built by an ``optim_fn`` with
decay / no-decay groups, a warm-up + cosine ``lr_scheduler_fn``, a GradScaler
and clipping, ``global_avg()`` after each window of steps, the learning rate
read through ``model._lr_schedulers`` / ``model._optims`` on every step, and
checkpoints saved through those lists. It trains on each topology in turn,
checks what must hold, and fails loudly when something does not.

Run it on two "nodes" of two processes each::

    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --master_addr=127.0.0.1 \\
        --master_port=29511 tests/decent_dp/legacy_paper_script.py &
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --master_addr=127.0.0.1 \\
        --master_port=29511 tests/decent_dp/legacy_paper_script.py

Rank 0 prints one ``RESULT {...}`` JSON line that tests/decent_dp/test_paper_scripts.py reads.
"""

import os

local_rank = int(os.environ.get("LOCAL_RANK", 0))
local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
# one device per process, chosen before torch is imported, as the paper's scripts do
if len(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")) >= max(2, local_world_size):
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[local_rank]

import io
import json
import math
import sys
from functools import partial
from typing import List, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from decent_dp.ddp import LR_SCHEDULER_FN_TYPE, OPTIM_FN_TYPE
from decent_dp.ddp import DecentralizedDataParallel as DecentDP
from decent_dp.optim import AccumAdam, AccumAdamW

VOCAB, CONTEXT, WIDTH, HEADS = 32, 8, 32, 2
LR, WARMUP, N_STEPS, ETA_MIN = 1e-2, 3, 16, 1e-4
WARMUP_DECAY = 0.01
WINDOW = 4  # steps between global averages, like the gpt2 script's eval_interval
CHECKS: List[str] = []


def check(ok: bool, what: str, detail: str = "") -> None:
    if not ok:
        print(
            f"CHECK FAILED on rank {dist.get_rank()}: {what} {detail}", file=sys.stderr, flush=True
        )
        raise SystemExit(3)
    CHECKS.append(what)


# ------------------------------------------------------------------ the model
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, n_layer: int = 2):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss


# --------------------------------------------------- optimizer and schedule
def construct_optimizer_fn(lr, betas, eps, weight_decay, accum_steps) -> OPTIM_FN_TYPE:
    def accumadamw_fn(
        params: List[Tuple[str, torch.Tensor]], lr, betas, eps, weight_decay, accum_steps
    ) -> torch.optim.Optimizer:
        decay_params = [p for _, p in params if p.dim() >= 2]
        no_decay_params = [p for _, p in params if p.dim() < 2]
        groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": no_decay_params, "weight_decay": 0.0},
        ]
        return AccumAdamW(
            groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, accum_iter=accum_steps
        )

    return partial(
        accumadamw_fn,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        accum_steps=accum_steps,
    )


def construct_scheduler_fn(warmup_steps, n_steps, eta_min) -> LR_SCHEDULER_FN_TYPE:
    def cosine_fn(optimizer, warmup_steps, n_steps, eta_min):
        warmup = torch.optim.lr_scheduler.LinearLR(
            optimizer, 1.0 / warmup_steps, total_iters=warmup_steps
        )
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, n_steps - warmup_steps, eta_min=eta_min
        )
        return torch.optim.lr_scheduler.SequentialLR(
            optimizer, schedulers=[warmup, cosine], milestones=[warmup_steps]
        )

    return partial(cosine_fn, warmup_steps=warmup_steps, n_steps=n_steps, eta_min=eta_min)


def split_by_name(params: List[Tuple[str, torch.Tensor]], weight_decay: float) -> list:
    """The cnn script's groups: no decay for norm layers and biases, found by name."""
    plain = [v for n, v in params if "ln" in n or "bias" in n]
    decayed = [v for n, v in params if not ("ln" in n or "bias" in n)]
    return [{"params": plain, "weight_decay": 0}, {"params": decayed, "weight_decay": weight_decay}]


def get_accumadam_fn(lr, betas, eps, weight_decay, accum_iter) -> OPTIM_FN_TYPE:
    def accumadam_fn(
        params: List[Tuple[str, torch.Tensor]], lr, betas, eps, weight_decay, accum_iter
    ):
        return AccumAdam(
            split_by_name(params, weight_decay), lr=lr, betas=betas, eps=eps, accum_iter=accum_iter
        )

    return partial(
        accumadam_fn, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, accum_iter=accum_iter
    )


def get_inverse_sqrt_fn(warmup_steps, warmup_decay) -> LR_SCHEDULER_FN_TYPE:
    def inverse_sqrt_fn(optimizer, warmup_steps, warmup_decay):
        def factor(step: int) -> float:
            if step < warmup_steps:
                return (1 - warmup_decay) * (step + 1) / warmup_steps + warmup_decay
            return warmup_steps**0.5 * (step + 1) ** -0.5

        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)

    return partial(inverse_sqrt_fn, warmup_steps=warmup_steps, warmup_decay=warmup_decay)


def expected_lr(style: str, step: int) -> float:
    """The style's schedule in closed form after ``step`` scheduler steps."""
    if style == "transformer":
        if step < WARMUP:
            return LR * ((1 - WARMUP_DECAY) * (step + 1) / WARMUP + WARMUP_DECAY)
        return LR * math.sqrt(WARMUP / (step + 1))
    if step < WARMUP:
        start = 1.0 / WARMUP
        return LR * (start + (1.0 - start) * step / WARMUP)
    t = step - WARMUP
    return ETA_MIN + (LR - ETA_MIN) * (1 + math.cos(math.pi * t / (N_STEPS - WARMUP))) / 2


# --------------------------------------------------------------------- data
def get_batch(rank: int, step: int, split: str = "train"):
    """Sequences that count up with a stride of 1 or 3 (mod VOCAB): learnable in a few steps."""
    g = torch.Generator().manual_seed(1000 * rank + step + (500 if split == "val" else 0))
    start = torch.randint(0, VOCAB, (16, 1), generator=g)
    stride = 1 + 2 * torch.randint(0, 2, (16, 1), generator=g)
    seq = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


@torch.no_grad()
def evaluate_loss(model, rank: int) -> float:
    model.eval()
    losses = []
    for i in range(2):
        x, y = get_batch(rank, i, "val")
        _, loss = model(x, y)
        losses.append(loss.item())
    avg = torch.tensor(sum(losses) / len(losses))
    dist.all_reduce(avg)
    model.train()
    return avg.item() / dist.get_world_size()


# ----------------------------------------------------------------- training
def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def wrap(topology: str, style: str, amp: bool, bucket_mb: float, seed: int):
    torch.manual_seed(seed)  # every rank builds the same model, as the scripts do
    net = TinyGPT()
    n_params = sum(
        dict((p.data_ptr(), p.numel()) for p in net.parameters() if p.requires_grad).values()
    )
    scaler = torch.amp.GradScaler("cpu", enabled=amp, init_scale=2.0**10)
    if style == "gpt2":
        optim_fn = construct_optimizer_fn(LR, (0.9, 0.95), 1e-8, 0.1, 2)
        scheduler_fn = construct_scheduler_fn(WARMUP, N_STEPS, ETA_MIN)
    else:  # the cnn helpers' AccumAdam groups with the transformer script's schedule
        optim_fn = get_accumadam_fn(LR, (0.9, 0.999), 1e-9, 1e-4, 2)
        scheduler_fn = get_inverse_sqrt_fn(WARMUP, WARMUP_DECAY)
    model = DecentDP(
        net,
        optim_fn=optim_fn,
        lr_scheduler_fn=scheduler_fn,
        topology=topology,
        scaler=scaler,
        grad_clip_norm=1.0,
        sync_buffer_in_global_avg=True,
        bucket_size_in_mb=bucket_mb,
    )
    return model, scaler, n_params


def train_window(model, scaler, style: str, rank: int, start: int, log: List[dict]) -> List[float]:
    """``WINDOW`` steps, reading the LR through the lists on every one, then ``global_avg()``."""
    losses = []
    model.train()
    for step in range(start, start + WINDOW):
        if step == 0:
            check(model._optims == [] and model._lr_schedulers == [], "lists empty before backward")
        x, y = get_batch(rank, step)
        _, loss = model(x, y)
        scaler.scale(loss).backward()
        losses.append(loss.item())
        # the cnn script's read, the transformer script's read, and the gpt2 script's
        lr = model._lr_schedulers[0].get_last_lr()[0] if model._lr_schedulers else 0.0
        lr_opt = model._optims[0].param_groups[0]["lr"] if len(model._optims) > 0 else 0.0
        n_buckets = len(model.buckets_info)
        check(
            len(model._optims) == n_buckets == len(model._lr_schedulers) and n_buckets > 0,
            "one optimizer and one scheduler per bucket after a backward",
        )
        check(lr == lr_opt, "the scheduler's last LR is the optimizer's")
        check(
            all(s.get_last_lr()[0] == lr for s in model._lr_schedulers),
            "every bucket is on the same step of the schedule",
        )
        check(
            math.isclose(lr, expected_lr(style, step + 1), rel_tol=1e-9, abs_tol=1e-15),
            f"LR after step {step + 1} of the {style} schedule",
            f"is {lr}, the formula gives {expected_lr(style, step + 1)}",
        )
        log.append({"step": step + 1, "lr": lr, "loss": loss.item()})
    model.global_avg()
    gathered = [torch.zeros(0)] * dist.get_world_size()
    dist.all_gather_object(gathered, flat(model))
    check(all(torch.equal(g, gathered[0]) for g in gathered), "identical models after global_avg()")
    check(
        len(model._optims) == len(model.buckets_info) and model._lr_schedulers[0] is not None,
        "the lists survive global_avg()",
    )
    return losses


def save(model, scaler, step: int) -> bytes:
    """Every rank saves its own state: the optimizers' moments differ between workers."""
    buf = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizers": [opt.state_dict() for opt in model._optims],
            "lr_schedulers": [s.state_dict() for s in model._lr_schedulers if s is not None],
            "scaler": scaler.state_dict(),
            "step": step,
        },
        buf,
    )
    return buf.getvalue()


def run_topology(topology: str, style: str, amp: bool, bucket_mb: float, rank: int) -> dict:
    model, scaler, n_params = wrap(topology, style, amp, bucket_mb, seed=1234)
    check(isinstance(repr(model), str) and topology in repr(model), "the wrapper prints")
    keys = sorted(model.state_dict().keys())
    check(
        "wte.weight" in keys
        and "lm_head.weight" in keys
        and not any(k.startswith("module.") for k in keys),
        "state_dict keys are the model's own",
    )
    first_eval = evaluate_loss(model, rank)
    log: List[dict] = []
    losses: List[float] = []
    for w in range(2):
        losses += train_window(model, scaler, style, rank, w * WINDOW, log)
    ckpt = save(model, scaler, 2 * WINDOW)
    check(model.step_count == 2 * WINDOW, "one optimizer step per backward")
    for w in range(2, 4):
        losses += train_window(model, scaler, style, rank, w * WINDOW, log)
    final = flat(model)
    last_eval = evaluate_loss(model, rank)
    n_buckets = len(model.buckets_info)
    scale = scaler.get_scale() if amp else None
    model.close()

    # resume in a fresh wrapper from what was saved through the lists
    fresh, fresh_scaler, _ = wrap(topology, style, amp, bucket_mb, seed=99)
    state = torch.load(io.BytesIO(ckpt), weights_only=False)
    fresh.load_state_dict(state["model"])
    fresh.load_bucket_states(state["optimizers"], state["lr_schedulers"], state["step"])
    fresh_scaler.load_state_dict(state["scaler"])
    check(fresh._optims == [], "a fresh wrapper's lists are empty until its first backward")
    resumed_log: List[dict] = []
    for w in range(2, 4):
        train_window(fresh, fresh_scaler, style, rank, w * WINDOW, resumed_log)
    check(
        torch.equal(flat(fresh), final), "the resumed run repeats the uninterrupted one bit for bit"
    )
    check(resumed_log == log[2 * WINDOW :], "the resumed run logs the same LRs and losses")
    if amp:
        check(fresh_scaler.get_scale() == scale, "the resumed scaler has the same scale")
    fresh.close()

    check(sum(losses[-WINDOW:]) < sum(losses[:WINDOW]), "the training loss decreases")
    check(last_eval < first_eval, "the evaluation loss decreases")
    return {
        "topology": topology,
        "style": style,
        "amp": amp,
        "n_params": n_params,
        "buckets": n_buckets,
        "first_loss": sum(losses[:WINDOW]) / WINDOW,
        "last_loss": sum(losses[-WINDOW:]) / WINDOW,
        "first_eval": first_eval,
        "last_eval": last_eval,
        "lrs": [e["lr"] for e in log],
        "scale": scale,
    }


def main():
    dist.init_process_group(backend="gloo")  # CPU tensors: any number of ranks on one machine
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    where = [None] * world_size
    dist.all_gather_object(
        where, (rank, local_rank, local_world_size, int(os.environ["GROUP_RANK"]))
    )
    runs = [
        # the cnn config's topology with the gpt2 script's optimizer, schedule and bucket size
        run_topology("alternating-exp-ring", "gpt2", amp=False, bucket_mb=100, rank=rank),
        # the transformer config's topology, optimizer and schedule, with loss scaling on
        run_topology("complete", "transformer", amp=True, bucket_mb=0.02, rank=rank),
    ]
    if rank == 0:
        result = {
            "world_size": world_size,
            "where": where,
            "runs": runs,
            "checks": sorted(set(CHECKS)),
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
