"""Models larger than one worker: FSDP2 shards inside a replica, gossip between replicas.

The ranks form a 2-D ``DeviceMesh`` with dimensions ``("replicate", "shard")``:
``R`` replicas of ``S`` shard ranks each. Inside a replica the model is
sharded with ``torch.distributed.fsdp.fully_shard`` over ``mesh["shard"]``,
so FSDP all-gathers the parameters for forward and backward and
reduce-scatters the gradients, which averages them over the replica's shard
ranks. Between replicas the topology, built over the ``R`` replicas, acts
shard by shard: rank ``(r, s)`` gossips its local shard with rank ``(r', s)``
of each neighbouring replica ``r'``. With ``d_r`` the update computed from the
replica's mean gradient at ``x_r(t-1)``::

    x_r(t) = x_r(t-1) + a (sum_r' W_rr'(t) x_r'(t-1) - x_r(t-1)) + d_r(t)

How it is built. The replica topology is lifted to the ranks
(:class:`ReplicaLift`: edge ``{r1, .., rk}`` becomes, for every shard ``s``,
the edge of ranks ``(r1, s), .., (rk, s)``), whose mixing matrix is
``W ⊗ I_S``. The wrapper's usual engine (:class:`decent_dp._engine.engine.Engine`)
then runs on the local shards: each trained ``DTensor`` parameter gets a
plain leaf tensor sharing its local shard's storage, which the buckets,
optimizers and gossip read and update in place (the parameters' storage
never moves, as FSDP's all-gather reads it). FSDP2 calls a sharded
parameter's post-accumulate-grad hooks once its reduce-scattered gradient is
set; the hook here hands that gradient to the leaf and tells the engine, so
a bucket steps and launches its gossip during the backward pass as
without sharding.

What composes: buckets and the in-backward step, gradient accumulation,
``comm_bytes_per_step`` (per shard rank: a rank sends its shard, about
``1/S`` of the model), global-norm clipping (the norm over the whole
replica, from the shard ranks' squared norms), ``global_avg``, ``averaged``
and ``consensus_distance`` (over the replicas), compressed gossip, outer
optimizers (DiLoCo, SlowMo; their outer round averages the replicas) and
the state dicts (the model's is FSDP's, of ``DTensor``s, for
``torch.distributed.checkpoint``). What is refused, in one line before any
collective: :data:`REFUSED`.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._engine.averaging import GlobalAverager
from .._engine.device import device_guard
from .._engine.engine import Engine
from .._engine.outer import OuterOptimizer, check_outer_args
from .._engine.setup import check_ranks_agree, trained_parameters
from ..compression import parse_compression
from ..optim._factories import check_scheduler, resolve_optim_fn
from ..topo import Edge, Topology, TopologyReg
from ..topo.builtin import HierarchicalTopology
from ..utils import unwrap_compiled

__all__ = [
    "MESH_DIMS",
    "REFUSED",
    "ReplicaLift",
    "ShardLayout",
    "build_sharded",
    "check_mesh",
    "check_sharded_model",
]

MESH_DIMS = ("replicate", "shard")

# option -> why it does not compose with a device mesh (each refused in one line)
REFUSED = {
    "scaler": "loss scaling is not supported over a device mesh",
    "state_sync": "optimizer-state gossip is not supported over a device mesh",
    "outer_compression": "compressed outer rounds are not supported over a device mesh",
    "outer_fragments": "streaming outer rounds are not supported over a device mesh (use 1)",
    "topology=hierarchical": (
        "a replica's shard ranks may span hosts, so hosts are no unit of the replicate "
        "dimension; use a flat topology over the replicas"
    ),
}


class ShardLayout:
    """Where this rank sits in the mesh: replica, shard index and the ranks of every cell.

    Args:
        ranks: ``ranks[r][s]``, the global rank of shard ``s`` of replica ``r``.
        rank: This process's global rank.
    """

    def __init__(self, ranks: list[list[int]], rank: int):
        self.ranks = ranks
        self.replicas = len(ranks)
        self.shards = len(ranks[0])
        where = [(r, s) for r, row in enumerate(ranks) for s, g in enumerate(row) if g == rank]
        self.replica, self.shard = where[0]

    def column(self, shard: int) -> list[int]:
        """The global ranks of shard ``shard`` in every replica, in replica order."""
        return [row[shard] for row in self.ranks]


def check_mesh(device_mesh: Any, world_size: int, rank: int) -> ShardLayout:
    """The mesh's layout, or one line naming what is wrong with it (no collective).

    Raises:
        ValueError: Not a 2-D ``DeviceMesh`` with dimensions ``("replicate", "shard")``
            (in either order) covering every rank once.
    """
    from torch.distributed.device_mesh import DeviceMesh

    names = getattr(device_mesh, "mesh_dim_names", None)
    if not isinstance(device_mesh, DeviceMesh) or device_mesh.ndim != 2 or names is None:
        raise ValueError(
            f"device_mesh={device_mesh!r} is invalid; it must be a 2-D DeviceMesh with "
            f"mesh_dim_names {MESH_DIMS}"
        )
    if sorted(names) != sorted(MESH_DIMS):
        raise ValueError(
            f"device_mesh has dimensions {tuple(names)}; it must have exactly {MESH_DIMS}"
        )
    grid = device_mesh.mesh
    if tuple(names) != MESH_DIMS:
        grid = grid.t()
    ranks = [[int(g) for g in row] for row in grid.tolist()]
    flat = sorted(g for row in ranks for g in row)
    if flat != list(range(world_size)):
        raise ValueError(
            f"device_mesh covers ranks {flat}; it must hold each of the {world_size} ranks once"
        )
    return ShardLayout(ranks, rank)


def check_sharded_model(named: list[tuple[str, nn.Parameter]], layout: ShardLayout) -> None:
    """Every trained parameter is a ``DTensor`` sharded over this rank's ``mesh["shard"]`` only.

    Raises:
        ValueError: One that is not, named, with what it is instead.
    """
    from torch.distributed.tensor import DTensor, Shard

    want = layout.ranks[layout.replica]
    for n, p in named:
        if not isinstance(p, DTensor):
            raise ValueError(
                f"parameter '{n}' is a plain {type(p).__name__}, not sharded over "
                "device_mesh['shard']; apply fully_shard(module, mesh=device_mesh['shard']) "
                "to the model before wrapping it"
            )
        mesh = p.device_mesh
        if mesh.ndim != 1 or [int(g) for g in mesh.mesh.tolist()] != want:
            raise ValueError(
                f"parameter '{n}' is sharded over ranks {mesh.mesh.tolist()}, not over "
                f"device_mesh['shard'] (ranks {want}); apply fully_shard(module, "
                "mesh=device_mesh['shard'])"
            )
        if not all(isinstance(pl, Shard) for pl in p.placements):
            raise ValueError(
                f"parameter '{n}' has placements {p.placements}; it must be sharded "
                "(Shard(dim)) over device_mesh['shard'], as fully_shard does"
            )


class ReplicaLift(Topology):
    """A topology over the replicas, acting on every shard index apart.

    Edge ``{r1, .., rk}`` of the replica topology becomes, for each shard ``s``,
    the edge of ranks ``ranks[r1][s], .., ranks[rk][s]`` with the same weight;
    its mixing matrix over the ranks is the replicas' one times ``I_S``.

    Args:
        inner: The topology over the ``R`` replicas.
        layout: The mesh's layout.
    """

    def __init__(self, inner: Topology, layout: ShardLayout):
        self.inner = inner
        self.layout = layout
        self.name = inner.name  # checkpoints and reports name the user's topology
        super().__init__(layout.replicas * layout.shards, inner.local_world_size * layout.shards)

    def _get_topo_edges(self) -> list[list[Edge]]:
        lay = self.layout
        return [
            [
                Edge([lay.ranks[r][s] for r in e.ranks], e.weight)
                for e in edges
                for s in range(lay.shards)
            ]
            for edges in self.inner.rounds
        ]


def _local_leaves(named: list[tuple[str, nn.Parameter]]) -> list[nn.Parameter]:
    """For each sharded parameter, a leaf on its local shard's storage (updated in place)."""
    with torch.no_grad():
        # a Parameter made from a tensor shares that tensor's storage
        return [nn.Parameter(p.to_local().detach()) for _, p in named]  # type: ignore[attr-defined]


def _hand_over(
    ref: weakref.ReferenceType[Engine], leaf: nn.Parameter, index: int
) -> Callable[[torch.Tensor], None]:
    """FSDP's post-accumulate-grad hook of a sharded parameter: its gradient goes to the leaf.

    The parameter's own gradient is dropped, so that FSDP's next reduce-scatter
    assigns a fresh one instead of accumulating (accumulation happens on the
    leaf, under ``no_sync``).
    """

    def hook(param: torch.Tensor) -> None:
        grad = param.grad
        if grad is None:
            return
        local = grad.to_local()  # type: ignore[attr-defined]
        param.grad = None
        if leaf.grad is None:
            leaf.grad = local
        else:
            leaf.grad.add_(local)
        engine = ref()
        if engine is not None:
            engine.on_grad(index)

    return hook


@torch.no_grad()
def _broadcast_from_replica0(module: nn.Module, layout: ShardLayout, group: Any) -> None:
    """Start every replica from replica 0: local shards and buffers, shard by shard."""
    if layout.replicas == 1:
        return
    src = layout.ranks[0][layout.shard]
    for p in module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p.data
        dist.broadcast(local, src=src, group=group)
    for b in module.buffers():
        dist.broadcast(b.data, src=src, group=group)


def _refuse(opts: Mapping[str, Any], topology: Topology) -> None:
    scaler = opts.get("scaler")
    if scaler is not None and scaler.is_enabled():
        raise ValueError(f"scaler={scaler!r} with device_mesh: {REFUSED['scaler']}")
    if opts.get("state_sync"):
        raise ValueError(
            f"state_sync={dict(opts['state_sync'])} with device_mesh: {REFUSED['state_sync']}"
        )
    if opts.get("outer_compression") not in (None, "none"):
        raise ValueError(
            f"outer_compression={opts['outer_compression']!r} with device_mesh: "
            f"{REFUSED['outer_compression']}"
        )
    if opts.get("outer_fragments", 1) != 1:
        raise ValueError(
            f"outer_fragments={opts['outer_fragments']!r} with device_mesh: "
            f"{REFUSED['outer_fragments']}"
        )
    if isinstance(topology, HierarchicalTopology):
        raise ValueError(
            f"topology='hierarchical' with device_mesh: {REFUSED['topology=hierarchical']}"
        )


def build_sharded(
    wrapper: Any,
    model: nn.Module,
    device_mesh: Any,
    optim_fn: Callable[..., Any],
    lr_scheduler_fn: Callable[..., Any] | None,
    topology: str | Topology,
    opts: Mapping[str, Any],
) -> None:
    """Set up ``wrapper`` (a :class:`~decent_dp.DecentralizedDataParallel`) over ``device_mesh``.

    Every check runs before the first collective. Sets the attributes the
    wrapper's methods read (``module``, ``_plain``, ``topology``,
    ``compression``, ``_world_size``, ``_initial_lr``, ``_engine``,
    ``_averager``) and ``device_mesh``, ``replicas``, ``shards``.

    Args:
        wrapper: The wrapper under construction (``nn.Module.__init__`` done).
        model: The model, ``fully_shard``-ed over ``device_mesh["shard"]``.
        device_mesh: The 2-D mesh with dimensions ``("replicate", "shard")``.
        optim_fn: The wrapper's ``optim_fn``.
        lr_scheduler_fn: The wrapper's ``lr_scheduler_fn``.
        topology: A topology over the replicas (a name or an instance).
        opts: The wrapper's other keyword arguments, by name.

    Raises:
        ValueError: A mesh without the two dimensions, a model not sharded over
            ``device_mesh["shard"]``, a topology that does not fit the number of
            replicas, or an option in :data:`REFUSED`.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    layout = check_mesh(device_mesh, world, rank)
    local_ws = opts.get("local_world_size") or os.environ.get("LOCAL_WORLD_SIZE")
    # the replicas on one host: a replica's shard ranks are consecutive local ranks
    rep_local = max(1, int(local_ws) // layout.shards) if local_ws else 1
    inner = TopologyReg.create(
        topology, layout.replicas, rep_local, **(opts.get("topology_kwargs") or {})
    )
    if inner.world_size != layout.replicas:
        raise ValueError(
            f"topology {inner!r} is built for world_size={inner.world_size}, but device_mesh "
            f"has {layout.replicas} replicas; build it over the replicas"
        )
    _refuse(opts, inner)
    compression = parse_compression(opts.get("compression"))
    plain = unwrap_compiled(model)
    every, named = trained_parameters(plain, opts.get("scaler"))
    check_sharded_model(named, layout)
    leaves = _local_leaves(named)
    leaf_named = [(n, t) for (n, _), t in zip(named, leaves)]
    build_optim, trial = resolve_optim_fn(optim_fn, leaf_named)
    check_scheduler(lr_scheduler_fn, trial)
    wrapper._initial_lr = float(trial.param_groups[0]["lr"])
    del trial
    outer_fn, outer_every = opts.get("outer_optim_fn"), opts.get("outer_every")
    fragments = opts.get("outer_fragments", 1)
    scale = opts.get("outer_scale_by_inner_lr", False)
    check_outer_args(outer_fn, outer_every, leaves[0], fragments, None, scale)
    lifted = ReplicaLift(inner, layout)
    column = layout.column(layout.shard)
    outer = None
    if outer_fn is not None and outer_every is not None:
        outer = OuterOptimizer(
            outer_fn, outer_every, layout.replicas, fragments=fragments, scale_by_inner_lr=scale
        )
        outer.edge = Edge(column, 1.0 / layout.replicas)  # the outer round averages the replicas

    wrapper.compression = compression
    wrapper.module = model
    wrapper._plain = plain
    wrapper._world_size = world
    wrapper.topology = inner
    wrapper.device_mesh = device_mesh
    wrapper.replicas, wrapper.shards = layout.replicas, layout.shards
    # collectives from here on, in the same order on every rank
    replicate = device_mesh["replicate"].get_group()
    shard_group = device_mesh["shard"].get_group()
    if outer is not None:
        outer.group = replicate
    # object collectives stage on the current device: make it the shards' one
    with device_guard(leaves[0].device):
        check_ranks_agree(every, lifted, world)
        _broadcast_from_replica0(plain, layout, replicate)
        engine = Engine(
            leaves,
            [n for n, _ in named],
            lifted,
            build_optim,
            lr_scheduler_fn,
            None,
            float(opts.get("grad_clip_norm", 0.0)),
            as_view=False,  # FSDP reads the shards' storage: it never moves
            stable_storage=True,
            bucket_bytes=int(float(opts.get("bucket_size_in_mb", 25)) * 1024 * 1024),
            compression=compression,
            outer=outer,
        )
    engine.norm_group = shard_group  # a replica's gradient norm sums its shard ranks'
    me = weakref.ref(engine)
    for i, ((_, p), leaf) in enumerate(zip(named, leaves)):
        engine._res.handles.append(p.register_post_accumulate_grad_hook(_hand_over(me, leaf, i)))
    wrapper._engine = engine
    wrapper._averager = GlobalAverager(
        engine,
        plain,
        bool(opts.get("sync_buffer_in_global_avg", False)),
        group=replicate,
        size=layout.replicas,
        norm_group=shard_group,
    )
