"""Float64 replay of compressed gossip, its compressors taken from :mod:`tests.support.codecs`.

Every worker runs in one process and the same compressor is applied to the
same deviation ``x_i - ref`` where the real run applies it (after each
launch): one payload per member for pairs; for larger groups (``bf16`` and
``int8``) the two phases, each member's chunks to their owners and the
owners' compressed sums back to all. See :mod:`decent_dp._comm.compressed`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from decent_dp._engine.bucket import aligned_offsets
from decent_dp.topo import TopologyReg
from tests.support.codecs import compressed
from tests.support.ddp_cases import (
    LOCAL_TOPOLOGIES,
    flat,
    loss_of,
    make_model,
    make_optim,
    set_flat,
)
from tests.support.state_mix import mix_states

__all__ = ["buckets_of", "compressed_replay", "set_buckets", "split_round"]


def buckets_of(model: torch.nn.Module, layout: list[list[str]]) -> list[torch.Tensor]:
    """The model as the wrapper's bucket blocks (float64, 256-byte aligned, padding zero)."""
    params = dict(model.named_parameters())
    blocks = []
    for names in layout:
        ps = [params[n] for n in names]
        offsets, total = aligned_offsets(ps, 8)
        block = torch.zeros(total, dtype=torch.float64)
        for p, o in zip(ps, offsets):
            block[o : o + p.numel()] = p.detach().reshape(-1)
        blocks.append(block)
    return blocks


def set_buckets(
    model: torch.nn.Module, layout: list[list[str]], blocks: list[torch.Tensor]
) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for names, block in zip(layout, blocks):
            ps = [params[n] for n in names]
            offsets, _ = aligned_offsets(ps, 8)
            for p, o in zip(ps, offsets):
                p.copy_(block[o : o + p.numel()].view_as(p))


def split_round(
    name: str, devs: list[torch.Tensor], w: float, p: float
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One two-phase exchange of a group (members in rank order): the decoded sum and each correction.

    Member ``c`` owns the ``c``-th of ``k`` chunks of ``ceil(n / k)`` elements
    (rounded up to 4, zero-padded); every member's chunk ``c`` is compressed and
    sent to it; it sums them in member order, and its compressed sum goes to
    everyone. It alone adds back ``k p`` times the rounding of its own sum.
    """
    k, n = len(devs), devs[0].numel()
    m = math.ceil(math.ceil(n / k) / 4) * 4
    padded = [torch.cat([v, v.new_zeros(k * m - n)]) for v in devs]
    own = [torch.cat([compressed(name, v[c * m : (c + 1) * m]) for c in range(k)]) for v in padded]
    sums = [sum(o[c * m : (c + 1) * m] for o in own) for c in range(k)]
    shat = torch.cat([compressed(name, sc) for sc in sums])
    corr = []
    for i in range(k):
        c = p * shat + (w - p - 1.0) * own[i]
        c[i * m : (i + 1) * m] += k * p * (sums[i] - shat[i * m : (i + 1) * m])
        corr.append(c[:n])
    return shat[:n], corr


def compressed_replay(
    cfg: dict[str, Any], world: int, layout: list[list[str]]
) -> list[torch.Tensor]:
    """The workers' models after ``cfg["steps"]`` steps of compressed gossip on ``layout``.

    ``cfg``: ``topology`` (a registered or test-only name), ``compression``,
    ``steps``, optionally ``alpha`` (the mixing step), ``clip`` (a global-norm
    bound), ``outer_every`` with ``outer_fn`` (exact outer rounds), ``global_avg_at``
    (a step after which every model is replaced by the mean), and the optimizer
    keys of :func:`tests.support.ddp_cases.make_optim`, and ``state_sync`` (named
    optimizer states mixed exactly with the round's weights, every ``K`` steps).
    """
    name = cfg["compression"]
    local = LOCAL_TOPOLOGIES.get(cfg["topology"])
    topo = local(world, 1) if local else TopologyReg.create(cfg["topology"], world, 1)
    start = make_model("mlp", seed=0)
    models = [make_model("mlp", seed=0) for _ in range(world)]
    for m in models:
        set_flat(m, flat(start))
    optims = [make_optim(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    refs: dict[tuple[int, int, int], torch.Tensor] = {}  # (rank, round, bucket)
    a = cfg.get("alpha", 1.0)
    every = cfg.get("outer_every")
    x_outer = flat(start)
    outer_opt = cfg["outer_fn"]([x_outer]) if every else None
    for t in range(1, cfg["steps"] + 1):
        old_flat = [flat(m) for m in models]
        old = [buckets_of(m, layout) for m in models]
        if cfg.get("state_sync") and t > 1:
            mix_states(models, optims, topo.rounds[(t - 1) % topo.period], t, cfg["state_sync"])
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            loss_of(m, i, t).backward()
            if cfg.get("clip"):
                torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["clip"])
            opt.step()
        if every and t % every == 0:  # an outer round: exact, no reference moves
            assert outer_opt is not None
            x_outer.grad = x_outer - torch.stack(old_flat).mean(0)
            outer_opt.step()
            for m, o in zip(models, old_flat):
                set_flat(m, flat(m) + a * (x_outer.detach() - o))
            continue
        new = [buckets_of(m, layout) for m in models]
        r = (t - 1) % topo.period
        mixed = [[nb.clone() for nb in new[i]] for i in range(world)]
        # step 1 mixes nothing: the first gossip is launched after it (and the models are
        # equal); nor does the step after a global average, which drops the exchange in flight
        # on every rank (and so moves no reference)
        mixes = t > 1 and cfg.get("global_avg_at") != t - 1
        for edge in topo.rounds[r] if mixes else []:
            k = len(edge.ranks)
            if k == 1:
                continue
            w, p = edge.self_weight, edge.peer_weight
            members = sorted(edge.ranks)
            for b in range(len(layout)):
                ref = refs.setdefault((edge.ranks[0], r, b), torch.zeros_like(old[0][b]))
                if k > 2 and name in ("bf16", "int8"):
                    s, corr = split_round(name, [old[j][b] - ref for j in members], w, p)
                    for j, c in zip(members, corr):
                        mixed[j][b] = new[j][b] + a * c
                    ref_new = ref + s / k
                    for j in edge.ranks:
                        refs[(j, r, b)] = ref_new
                    continue
                q = {j: compressed(name, old[j][b] - ref, t, b) for j in edge.ranks}
                s = sum(q[j] for j in members)
                for j in edge.ranks:
                    mixed[j][b] = new[j][b] + a * (p * s + (w - p - 1.0) * q[j])
                ref_new = ref + s / k
                for j in edge.ranks:
                    refs[(j, r, b)] = ref_new
        for i, m in enumerate(models):
            set_buckets(m, layout, mixed[i])
        if cfg.get("global_avg_at") == t:
            mean = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                set_flat(m, mean)
    return [flat(m) for m in models]
