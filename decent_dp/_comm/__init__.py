"""The wrapper's communication: process groups, exchanges in flight, compressed and three-phase gossip.

Below the engine (:mod:`decent_dp._engine`), above the pure data it reads
(:mod:`decent_dp.topo`, :mod:`decent_dp.compression`); nothing here imports
the engine or the wrappers.

* :mod:`~decent_dp._comm.groups`: the process groups of a topology's edges,
  created once in one order on every rank;
* :mod:`~decent_dp._comm.compressed`: compressed gossip (the algorithm, the
  collectives of an exchange, each bucket's references);
* :mod:`~decent_dp._comm.inflight`: an exchange between its launch and its
  step (two-phase chains, the thread that drives them off NCCL, the decoded sum);
* :mod:`~decent_dp._comm.hierarchical`: a ``hierarchical`` topology's edges
  across hosts in three phases, their groups and their bytes;
* :mod:`~decent_dp._comm.survivors`: a member lost between quorums of elastic
  gossip, and its edges' survivors exchanging again.
"""
