"""The sharded wrapper's test pieces: FSDP2 over a 2-D gloo mesh, and its flat float64 replay.

Rank ``(r, s)`` of an ``R x S`` mesh is global rank ``r * S + s``. A replica's
gradient is the mean over its shard ranks' batches (FSDP's reduce-scatter), so
the replay trains ``R`` whole models, worker ``r`` on the mean loss of the
batches of ranks ``r * S .. r * S + S - 1``, and mixes them with the
topology's matrices over the ``R`` replicas.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.bucket import aligned_offsets
from decent_dp.topo import TopologyReg, mixing_matrices
from tests.support.codecs import compressed
from tests.support.ddp_cases import batch, flat, set_flat

D_IN = 4


class Tower(nn.Module):
    """Three layers; the head's weight (1 x 6) leaves shard rank 1 of 2 an empty shard."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(D_IN, 6)
        self.l2 = nn.Linear(6, 6)
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.l2(torch.tanh(self.l1(x)))))


def make_tower(seed: int = 0) -> Tower:
    torch.manual_seed(seed)
    return Tower().double()


def optim_of(cfg: dict[str, Any]) -> Any:
    """The optimizer factory of ``cfg["optim"]``: ``sgd`` (momentum) or ``adamw``."""

    def build(pairs: Any) -> torch.optim.Optimizer:
        params = [p for p, _ in pairs]
        if cfg.get("optim", "sgd") == "adamw":
            return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)

    return build


def mesh_2d(replicas: int, shards: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))


def shard_tower(model: nn.Module, mesh: Any) -> nn.Module:
    """``fully_shard`` on each layer and on the root, over ``mesh["shard"]``."""
    from torch.distributed.fsdp import fully_shard

    for layer in (model.l1, model.l2, model.head):
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    return model


def wrap_sharded(model: nn.Module, mesh: Any, cfg: dict[str, Any]) -> DecentralizedDataParallel:
    return DecentralizedDataParallel(
        model,
        optim_fn=optim_of(cfg),
        topology=cfg["topology"],
        device_mesh=mesh,
        bucket_size_in_mb=cfg.get("bucket_mb", 0),
        grad_clip_norm=cfg.get("clip", 0.0),
        compression=cfg.get("compression"),
        outer_optim_fn=partial(torch.optim.SGD, lr=0.7, momentum=0.9) if cfg.get("outer") else None,
        outer_every=cfg.get("outer"),
    )


def full_flat(model: nn.Module) -> torch.Tensor:
    """The replica's whole parameters (an all-gather over the shard ranks), flattened."""
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])


def loss_at(model: nn.Module, rank: int, step: int, micro: int = 0) -> torch.Tensor:
    a, b = batch(rank, step, micro)
    return ((model(a) - b) ** 2).mean()


def sharded_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train ``cfg["steps"]`` steps on a ``world / S x S`` mesh.

    Replica ``r`` starts from seed ``r`` (its shard ranks agree, as FSDP needs), so
    that the replicas start apart and only the wrapper's broadcast makes them agree.
    """
    shards = cfg["shards"]
    mesh = mesh_2d(world // shards, shards)
    model = shard_tower(make_tower(seed=rank // shards), mesh)
    ddp = wrap_sharded(model, mesh, cfg)
    for t in range(1, cfg["steps"] + 1):
        for micro in range(1, cfg.get("accum", 1)):  # gradient accumulation
            with ddp.no_sync():
                loss_at(ddp, rank, t, micro).backward()
        loss_at(ddp, rank, t).backward()
    out: dict[str, Any] = {
        "flat": full_flat(model),
        "bytes": ddp.comm_bytes_per_step(),
        "layout": [info["names"] for info in ddp.buckets_info],
    }
    if cfg.get("consensus"):
        out["consensus"] = ddp.consensus_distance()
        with ddp.averaged():
            out["averaged"] = full_flat(model)
        out["after"] = full_flat(model)
    ddp.close()
    # closed, the wrapper's hooks are gone: FSDP trains on as a plain module, nothing steps
    loss_at(model, rank, 99).backward()
    out["closed_unchanged"] = bool(torch.equal(full_flat(model), out["flat"]))
    out["closed_grads"] = all(p.grad is not None for p in model.parameters())
    return out


def replay_sharded(cfg: dict[str, Any], world: int) -> list[torch.Tensor]:
    """The flat replay: ``R`` whole models, each a replica, one step per iteration."""
    shards = cfg["shards"]
    replicas = world // shards
    mats = mixing_matrices(cfg["topology"], replicas, 1)
    start = make_tower(seed=0)
    models = [make_tower(seed=0) for _ in range(replicas)]
    for m in models:
        set_flat(m, flat(start))
    optims = [optim_of(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    every = cfg.get("outer")
    x_outer = flat(start)
    outer_opt = torch.optim.SGD([x_outer], lr=0.7, momentum=0.9) if every else None
    for t in range(1, cfg["steps"] + 1):
        old = [flat(m) for m in models]
        for r, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            for micro in range(cfg.get("accum", 1)):
                loss = sum(loss_at(m, r * shards + s, t, micro) for s in range(shards)) / shards
                loss.backward()
            if cfg.get("clip"):
                torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["clip"])
            opt.step()
        new = [flat(m) for m in models]
        w = mats[(t - 1) % len(mats)]
        stacked = torch.stack(old)
        if every and t % every == 0:  # DiLoCo: the outer step on the replicas' mean
            assert outer_opt is not None
            x_outer.grad = x_outer - stacked.mean(0)
            outer_opt.step()
        for r, m in enumerate(models):
            mixed = x_outer if every and t % every == 0 else (w[r].unsqueeze(1) * stacked).sum(0)
            set_flat(m, mixed + (new[r] - old[r]))
    return [flat(m) for m in models]


def shard_blocks(
    model: nn.Module, layout: list[list[str]], shards: int
) -> list[list[torch.Tensor]]:
    """``blocks[s][b]``: shard ``s``'s bucket ``b`` as the wrapper lays it out (rows as FSDP2 cuts them)."""
    params = dict(model.named_parameters())
    blocks: list[list[torch.Tensor]] = []
    for s in range(shards):
        mine = []
        for names in layout:
            parts = [_rows(params[n].detach(), s, shards) for n in names]
            offsets, total = aligned_offsets(parts, 8)
            block = torch.zeros(total, dtype=torch.float64)
            for part, off in zip(parts, offsets):
                block[off : off + part.numel()] = part.reshape(-1)
            mine.append(block)
        blocks.append(mine)
    return blocks


def set_shard_blocks(
    model: nn.Module, layout: list[list[str]], shards: int, blocks: list[list[torch.Tensor]]
) -> None:
    """The inverse of :func:`shard_blocks`."""
    params = dict(model.named_parameters())
    for b, names in enumerate(layout):
        for n in names:
            p = params[n]
            pieces = []
            for s in range(shards):
                like = _rows(p.detach(), s, shards)
                offsets, _ = aligned_offsets(
                    [_rows(params[m].detach(), s, shards) for m in names], 8
                )
                off = offsets[names.index(n)]
                pieces.append(blocks[s][b][off : off + like.numel()].view(like.shape))
            with torch.no_grad():
                p.copy_(torch.cat(pieces, 0))


def _rows(t: torch.Tensor, s: int, shards: int) -> torch.Tensor:
    """Shard ``s`` of ``t`` along dim 0 as FSDP2 cuts it (``torch.chunk``; missing chunks empty)."""
    chunks = torch.chunk(t, shards, dim=0)
    return chunks[s] if s < len(chunks) else t[:0]


def replay_compressed(
    cfg: dict[str, Any], world: int, layout: list[list[str]]
) -> list[torch.Tensor]:
    """The flat replay with compressed gossip of pairs, shard by shard, on ``layout``'s buckets.

    Each pair of replicas exchanges, for every shard index apart, the compressed
    deviation of each bucket block from the reference the pair shares (one per
    rank, round and bucket), which then moves by the mean of the decoded values.
    """
    shards = cfg["shards"]
    replicas = world // shards
    name = cfg["compression"]
    topo = TopologyReg.create(cfg["topology"], replicas, 1)
    start = make_tower(seed=0)
    models = [make_tower(seed=0) for _ in range(replicas)]
    for m in models:
        set_flat(m, flat(start))
    optims = [optim_of(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    refs: dict[tuple[int, int, int, int], torch.Tensor] = {}  # (replica, shard, round, bucket)
    for t in range(1, cfg["steps"] + 1):
        old = [shard_blocks(m, layout, shards) for m in models]
        for r, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            loss = sum(loss_at(m, r * shards + s, t) for s in range(shards)) / shards
            loss.backward()
            opt.step()
        mixed = [shard_blocks(m, layout, shards) for m in models]
        rnd = (t - 1) % topo.period
        for edge in topo.rounds[rnd] if t > 1 else []:  # the first gossip is mixed at step 2
            assert len(edge.ranks) in (1, 2), "pairs only"
            if len(edge.ranks) == 1:
                continue
            w, p = edge.self_weight, edge.peer_weight
            for s in range(shards):
                for b in range(len(layout)):
                    if old[0][s][b].numel() == 0:  # an empty shard of a bucket: no exchange
                        continue
                    ref = refs.setdefault(
                        (edge.ranks[0], s, rnd, b), torch.zeros_like(old[0][s][b])
                    )
                    q = {j: compressed(name, old[j][s][b] - ref, t, b) for j in edge.ranks}
                    total = sum(q.values())
                    for j in edge.ranks:
                        mixed[j][s][b] = mixed[j][s][b] + p * total + (w - p - 1.0) * q[j]
                        refs[(j, s, rnd, b)] = ref + total / 2
        for m, blocks in zip(models, mixed):
            set_shard_blocks(m, layout, shards, blocks)
    return [flat(m) for m in models]
