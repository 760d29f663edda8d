"""Replicas of :class:`decent_dp.elastic.ElasticDataParallel`: the wrapper's in-backward path, elastic.

Each replica is a spawned process (a host) that reports every step as
:func:`tests.support.elastic_cases.replica` does, so that
:func:`tests.support.elastic_cases.replay` recomputes the run in one process:
the same model, data and SGD with momentum, the same schema.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from torch import nn

from tests.support import elastic_cases as ec


def _optim(named: list[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for _, p in named], lr=ec.LR, momentum=ec.MOMENTUM)


def _refs(edp: Any) -> dict[int, list[float]]:
    """Compressed gossip's reference of each round (one bucket), as every member of it holds it."""
    comp = edp.wrapper._engine.gossip.compressor
    if comp is None:
        return {}
    return {r: t.tolist() for (r, b), t in sorted(comp.refs.items()) if b == 0}


def _healed(edp: Any, size: int, g: int) -> str | None:
    """The process this one healed from: the same group rank of its source (rank 0's at the start)."""
    if edp.healed_from is None or size == 1:
        return edp.healed_from
    if edp.step_count == 1 and edp.last_quorum_step == 0:  # the first build: flat rank 0's model
        return f"{edp.members[0]}.0"
    return f"{edp.healed_from}.{g}"


def replica(rid: str, lh: str, plan: dict[str, Any], out: Any, events: dict[str, Any]) -> None:
    """Train with the elastic wrapper; plan keys as :func:`tests.support.elastic_cases.replica`.

    Also ``die_in_quorum_at`` (stop inside the quorum before that step, once
    torchft formed it), ``compression`` (the wrapper's option), ``outer_every`` (outer rounds),
    ``accumulate`` (a second
    micro-batch under ``no_sync()`` each step) and ``device`` (``"cuda"``: the
    model and data there, every replica on the one GPU, gloo moving CUDA tensors). With ``group`` ``(replica id,
    group rank, group size, rendezvous port)`` the process is one of its host's
    processes (``rid`` names the process, ``replica.g``): group rank 0 holds the
    group's rendezvous store, as torchrun's agent does. Reports then name
    processes (``members`` are the quorum's processes, in flat rank order).
    """
    from decent_dp.elastic import ElasticDataParallel

    torch.set_num_threads(1)
    try:
        dev = torch.device(plan.get("device", "cpu"))
        model = ec._model(rid).to(dev)
        data = {"cursor": 0}
        replica_id, g, size, port = plan.get("group") or (rid, 0, 1, 0)
        group: dict[str, Any] = {}
        if size > 1:
            from torch.distributed import TCPStore

            group = {"group_rank": g, "group_world_size": size, "group_store": ("127.0.0.1", port)}
            if g == 0:  # kept alive with the process, as the agent's
                group["_rdzv"] = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        extra: dict[str, Any] = {}
        if plan.get("compression"):
            extra["compression"] = plan["compression"]
        if plan.get("outer_every"):  # DiLoCo's Nesterov SGD, as the replay's
            extra["outer_every"] = plan["outer_every"]
            extra["outer_optim_fn"] = ec.outer_sgd

        def make() -> ElasticDataParallel:
            return ElasticDataParallel(
                model,
                _optim,
                topology=plan["topology"],
                topology_kwargs=plan.get("topology_kwargs"),
                lighthouse=lh,
                replica_id=replica_id,
                min_replicas=plan.get("min_replicas", 1),
                timeout_s=plan.get("timeout_s", 10.0),
                quorum_every=plan["every"],
                host="127.0.0.1",
                state_fn=lambda: dict(data),
                load_state_fn=lambda s: data.update(s),
                log=lambda line: None,
                **extra,
                **{k: v for k, v in group.items() if not k.startswith("_")},
            )

        def procs() -> list[str]:
            if size == 1:
                return list(edp.members)
            return [f"{m}.{r}" for m in edp.members for r in range(size)]

        edp = make()
        if "start" in events and not plan.get("restarted"):
            events["start"].wait(60)
            time.sleep(0.5)  # every first replica's heartbeat reaches the lighthouse
        if plan.get("resume"):
            edp.load_elastic_state(torch.load(plan["resume"], weights_only=False))
            out.put((rid, "resumed", edp.step_count, ec._flat(model), dict(data)))
        while edp.step_count < plan["steps"]:
            s = edp.step_count
            ec.gate(plan, events, s)
            params_before = ec._flat(model)
            if plan.get("die_in_quorum_at") == s:
                ec.die_inside_quorum(edp)
            edp.quorum()  # before the batch is read: healing brings the data position
            cursor = data["cursor"]
            x, y = (t.to(dev) for t in ec.batch(rid, cursor))
            if plan.get("accumulate"):  # a second micro-batch's gradient, summed in
                with edp.no_sync():
                    x2, y2 = (t.to(dev) for t in ec.batch(rid, cursor + ec.MICRO))
                    nn.functional.mse_loss(edp(x2), y2).backward()
            pred = edp(x)
            nn.functional.mse_loss(pred, y).backward()
            t = edp.step_count
            edge = edp.mixed_edge()
            mixed = [] if edge is None else [procs()[r] for r in sorted(edge.ranks)]
            mixed = [m for m in mixed if m != rid]
            out.put(
                (
                    rid,
                    "step",
                    t,
                    {
                        "members": procs(),
                        "quorum_id": edp.view.quorum_id if edp.view else None,
                        "mixed": mixed,
                        "healed_from": _healed(edp, size, g)
                        if edp.last_quorum_step == t - 1
                        else None,
                        "cursor": cursor,
                        "before": params_before,
                        "params": ec._flat(model),
                        "consensus": edp.last_consensus_distance,
                        "refs": _refs(edp),
                        # a heal's source withdraws its staged copy once the heal is over
                        "staged": edp.membership.transport._state_dict is not None,
                    },
                )
            )
            data["cursor"] += 1
            if plan.get("save_at") == t:
                torch.save(edp.elastic_state(), plan["save_to"])
            if plan.get("kill_after") == t:
                out.close()
                out.join_thread()
                os.kill(os.getpid(), signal.SIGKILL)
            if plan.get("leave_after") == t:
                stale = edp.elastic_state()
                edp.close()
                events[plan["rejoin_when"]].wait(60)
                edp = make()
                edp.load_elastic_state(stale)
                out.put((rid, "resumed", edp.step_count, ec._flat(model), dict(data)))
        out.put((rid, "done", edp.step_count))
        edp.close()
    except ec.Died as exc:
        out.put((rid, "died", str(exc)))
    except BaseException as exc:  # every failure goes to the parent, as one line
        import traceback

        out.put((rid, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"))
