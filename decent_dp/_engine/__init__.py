"""The engine behind :class:`~decent_dp.ddp.DecentralizedDataParallel`, and the wrapper's mixins.

The per-iteration work (:mod:`~decent_dp._engine.engine`: buckets, gradient
hooks, stepping, :mod:`~decent_dp._engine.gossip` in flight, recovery), what
the wrapper does once (:mod:`~decent_dp._engine.setup`), the outer optimizer
(:mod:`~decent_dp._engine.outer`), gossiped optimizer states
(:mod:`~decent_dp._engine.state_sync`), the CUDA housekeeping, and the mixins
that give the wrapper its other public methods beside the code they call
(averaging, state dicts, the communication report, decent-dp 0.2.x's names).
It may import :mod:`decent_dp.topo`, :mod:`decent_dp.optim`,
:mod:`decent_dp.compression` and :mod:`decent_dp._comm`, never a wrapper.
"""
