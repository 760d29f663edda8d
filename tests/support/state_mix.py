"""The replay's side of ``state_sync``: named optimizer states mixed with a round's edges.

Independent of :mod:`decent_dp._engine.state_sync`: the mix is written from its
definition, ``s_i <- sum_j W_ij s_j``, with W the round's weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["mix_states"]


@torch.no_grad()
def mix_states(
    models: list[nn.Module], optims: list[Any], edges: list[Any], t: int, sync: dict[str, int]
) -> None:
    """Before step ``t``'s optimizer step: each due state becomes its row of W times the states.

    A state is due when ``t % K == 0``; ranks alone in their edge keep theirs, and
    a parameter's state is mixed in an edge only when every member of the edge has
    one (after step 1, or later for a parameter that some member has not stepped yet).
    """
    due = [n for n, k in sync.items() if t % k == 0]
    params = [list(m.parameters()) for m in models]
    if not due:
        return
    for edge in edges:
        if len(edge.ranks) == 1:
            continue
        w, p = edge.self_weight, edge.peer_weight
        for name in due:
            for q in range(len(params[0])):
                if not all(optims[j].state.get(params[j][q]) for j in edge.ranks):
                    continue
                old = {j: optims[j].state[params[j][q]][name].clone() for j in edge.ranks}
                for j in edge.ranks:
                    others = sum(old[i] for i in edge.ranks if i != j)
                    optims[j].state[params[j][q]][name].copy_(w * old[j] + p * others)
