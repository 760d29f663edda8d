"""Hub: a registered topology in which one worker averages with each of the others in turn."""

from __future__ import annotations

from decent_dp.topo import Edge, Topology, TopologyReg

__all__ = ["Hub"]


@TopologyReg.register("own-hub")
class Hub(Topology):
    """Round ``k`` pairs the hub with the ``k``-th other worker; the rest keep their models.

    The period is ``n - 1`` rounds. Each round's matrix averages one pair, so it is doubly
    stochastic, and over a period every worker meets the hub.

    Args:
        world_size: Number of workers.
        local_world_size: Workers per node (unused).
        hub: The hub's rank.
        weight: The share of its own model each member of a pair keeps.

    Raises:
        ValueError: If ``hub`` is not a rank or ``weight`` is outside ``[0, 1]``.

    Example::

        topology = TopologyReg.create("own-hub", world_size=4)  # or Hub(4, 4, hub=1)
    """

    def __init__(
        self,
        world_size: int | None = None,
        local_world_size: int | None = None,
        hub: int = 0,
        weight: float = 0.5,
    ) -> None:
        self.hub, self.weight = hub, weight  # read by _get_topo_edges in the base's __init__
        super().__init__(world_size, local_world_size)

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if not 0 <= self.hub < n:
            raise ValueError(f"hub={self.hub} is invalid; it must be a rank in 0..{n - 1}")
        others = [r for r in range(n) if r != self.hub]
        if not others:
            return [[Edge([self.hub], 1.0)]]
        return [
            [Edge([self.hub, k], self.weight)] + [Edge([r], 1.0) for r in others if r != k]
            for k in others
        ]
