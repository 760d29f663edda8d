"""Elastic gossip: hosts leave and join a running job, on torchft's lighthouse.

:class:`ElasticDataParallel` is the wrapper
(:class:`~decent_dp.ddp.DecentralizedDataParallel`) over the live members of a
torchft quorum: each replica group (one host: one ``torchrun
--nproc_per_node=L``, or one process) is a member, and between quorums each
bucket steps and gossips inside the backward pass as the wrapper does::

    x_i(t) = x_i(t-1) + d_i(t) + sum_{j in E_i(t), j alive} W_ij(t) (x_j(t-1) - x_i(t-1))

``d_i(t)`` is the local optimizer's update from the gradient at ``x_i(t-1)``
and ``W(t)`` is the mixing matrix of the topology's round ``(t-1) mod period``
built over the members of step ``t``.

Membership comes from torchft (:mod:`decent_dp.elastic._quorum`): every
``quorum_every`` steps each member asks the lighthouse for a quorum. A quorum
every step would be a rendezvous of all members every step, the global barrier
gossip exists to avoid; between quorums the membership is fixed and only
neighbours wait for each other. At a quorum whose members changed, the
process group, the topology and the wrapper are rebuilt for the new count
(ranks follow the members' order in torchft's quorum, replica ids sorted as
strings) and the training goes on without a restart
(:mod:`decent_dp.elastic.wrapper`).

* **A member lost between quorums** fails the exchanges of the groups it is
  in, and its weight goes to the survivors of each of its edges: in an edge of
  two the survivor keeps it (it mixes nothing), and a larger edge keeps its
  live members, who exchange again among themselves (on the edge's group less
  the lost member, made at the rebuild) with the lost weight shared among them
  (``s + p / (k - 1)`` each, ``s`` and ``p`` the edge's weights over ``k``
  members: a uniform edge's survivors average) until the next quorum. ``W``
  stays symmetric and doubly stochastic over the survivors, and no survivor
  waits beyond ``timeout_s`` for the lost one. (Compressed gossip, a
  ``hierarchical`` edge between hosts and gossiped optimizer states mix
  nothing in a broken edge instead.)
* **A member that joins** asks for a quorum at once and enters at the others'
  next one. Every member behind the quorum's highest step heals from a live
  neighbour (:func:`heal_sources`): the model, the optimizer and scheduler
  states, the step, the outer optimizer's state and the caller's extra state
  (the data position), staged on torchft's ``HTTPTransport`` and withdrawn
  once the joiners have it.
* **A topology for any number of members** (:func:`elastic_topology`):
  ``one-peer-exp`` over a count that is no power of two runs as ``base-k``
  with ``k=1``; a topology with no such stand-in is refused in one line.
* **An outer optimizer** (DiLoCo, SlowMo) takes its rounds at quorum steps,
  when every member is known alive; a change of membership restarts the
  round in progress from the new members' mean (:mod:`decent_dp.elastic._outer`).

Example::

    edp = ElasticDataParallel(model, optim_fn, topology="ring",
                              lighthouse="http://10.0.0.1:29510", min_replicas=3)
    for x, y in loader:
        loss_fn(edp(x), y).backward()  # the quorum, when due, runs in the forward
    edp.close()
"""

from __future__ import annotations

from .common import (
    check_elastic_topology,
    default_replica_id,
    elastic_topology,
    heal_sources,
)
from .wrapper import ElasticDataParallel

__all__ = [
    "ElasticDataParallel",
    "check_elastic_topology",
    "default_replica_id",
    "elastic_topology",
    "heal_sources",
]
