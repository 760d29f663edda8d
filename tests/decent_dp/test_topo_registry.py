"""Pure-data tests of :mod:`decent_dp.topo`: the registry and the validation of custom rounds."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import torch

from decent_dp.topo import (
    CompleteTopology,
    Edge,
    Topology,
    TopologyReg,
    mixing_matrices,
)
from tests.support.topo_reference import (
    ATOL,
    BUILTINS,
    assert_rounds,
    fixed,
)

__all__: list[str] = []


@pytest.fixture
def fresh_name() -> Iterator[Callable[[str], str]]:
    """Hands out unique registry names and removes them from the registry afterwards."""
    added: list[str] = []

    def make(stem: str) -> str:
        name = f"test-{stem}-{uuid.uuid4().hex[:8]}"
        added.append(name)
        return name

    yield make
    for name in added:
        TopologyReg.registry.pop(name, None)


# ---------------------------------------------------------------------------
# Validation of custom rounds
# ---------------------------------------------------------------------------

GOOD_ROUND = [Edge([0, 1], 0.5), Edge([2, 3], 0.5)]


@pytest.mark.parametrize(
    ("bad_round", "fragments"),
    [
        pytest.param(
            [Edge([0, 1], 0.5), Edge([1, 2], 0.5), Edge([3], 1.0)],
            ["round 1", "rank 1", "exactly one edge"],
            id="rank-in-two-edges",
        ),
        pytest.param(
            [Edge([0, 1, 1], 0.5), Edge([2, 3], 0.5)],
            ["round 1", "rank 1", "exactly one edge"],
            id="rank-twice-in-one-edge",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2], 1.0)],
            ["round 1", "rank 3", "every rank must take part"],
            id="rank-missing",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2, 3], 0.5), Edge([4], 1.0)],
            ["round 1", "rank 4", "out of range", "0..3"],
            id="rank-too-large",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2, 3, -1], 0.5)],
            ["round 1", "rank -1", "out of range", "0..3"],
            id="rank-negative",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2, 3], -0.1)],
            ["round 1", "[2, 3]", "-0.1", "[0, 1]"],
            id="weight-negative",
        ),
        pytest.param(
            [Edge([0, 1], 1.5), Edge([2, 3], 0.5)],
            ["round 1", "[0, 1]", "1.5", "must lie in [0, 1]"],
            id="weight-above-one",
        ),
        pytest.param(
            [Edge([0, 1], float("nan")), Edge([2, 3], 0.5)],
            ["round 1", "nan", "[0, 1]"],
            id="weight-nan",
        ),
        pytest.param([], ["round 1", "non-empty"], id="empty-round"),
        pytest.param(
            [Edge([], 0.5), Edge([0, 1], 0.5), Edge([2, 3], 0.5)],
            ["round 1", "no ranks"],
            id="empty-edge",
        ),
        pytest.param(
            [(0, 1), Edge([2, 3], 0.5)], ["round 1", "tuple", "not Edge"], id="not-an-edge"
        ),
    ],
)
def test_validation_errors(bad_round: list, fragments: list[str]) -> None:
    klass = fixed([list(GOOD_ROUND), bad_round])
    with pytest.raises(ValueError) as info:
        klass(4, 1)
    msg = str(info.value)
    assert "topology 'custom'" in msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


def test_validation_rejects_no_rounds() -> None:
    with pytest.raises(ValueError, match="non-empty list of rounds"):
        fixed([])(4, 1)


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_boundary_weights_are_valid(weight: float) -> None:
    topo = fixed([[Edge([0, 1], weight), Edge([2, 3], weight)]])(4, 1)
    w = topo.mixing_matrix(0)
    assert w[0, 0].item() == weight and w[0, 1].item() == 1.0 - weight


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"world_size": 0, "local_world_size": 1}, "world_size=0"),
        ({"world_size": -3, "local_world_size": 1}, "world_size=-3"),
        ({"world_size": 4, "local_world_size": 0}, "local_world_size=0"),
    ],
)
def test_bad_sizes_rejected(kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        CompleteTopology(**kwargs)


def test_missing_world_size_without_process_group() -> None:
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="world_size"):
        CompleteTopology()


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


def test_builtins_registered() -> None:
    names = TopologyReg.names()
    assert set(BUILTINS) <= set(names)
    for name in BUILTINS:
        assert TopologyReg.get(name).name == name


def test_register_and_create_custom(fresh_name: Callable[[str], str]) -> None:
    name = fresh_name("pairs")

    @TopologyReg.register(name)
    class Pairs(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            n = self.world_size
            return [[Edge([i, i + 1], 0.25) for i in range(0, n, 2)]]

    assert Pairs.name == name
    assert name in TopologyReg.names()
    assert TopologyReg.get(name) is Pairs

    by_name = TopologyReg.create(name, 6)
    by_class = TopologyReg.create(Pairs, 6, 1)
    assert isinstance(by_name, Pairs) and isinstance(by_class, Pairs)
    assert TopologyReg.create(by_name) is by_name
    expected = [[([0, 1], 0.25), ([2, 3], 0.25), ([4, 5], 0.25)]]
    assert_rounds(by_name, expected)
    assert_rounds(by_class, expected)

    want = torch.zeros(6, 6, dtype=torch.float64)
    for i in range(0, 6, 2):
        want[i, i] = want[i + 1, i + 1] = 0.25
        want[i, i + 1] = want[i + 1, i] = 0.75
    for mats in (mixing_matrices(name, 6), mixing_matrices(Pairs, 6), mixing_matrices(by_name, 6)):
        assert len(mats) == 1
        torch.testing.assert_close(mats[0], want, atol=ATOL, rtol=0)


def test_registered_custom_topology_validates_with_its_name(
    fresh_name: Callable[[str], str],
) -> None:
    name = fresh_name("broken")

    @TopologyReg.register(name)
    class Broken(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            return [[Edge([0, 1], 0.5)]]

    with pytest.raises(ValueError, match=rf"topology '{name}' round 0: rank 2"):
        TopologyReg.create(name, 3)


@pytest.mark.parametrize("name", BUILTINS)
def test_register_rejects_duplicate_builtin(name: str) -> None:
    before = TopologyReg.get(name)
    with pytest.raises(ValueError, match=rf"'{name}'.*already registered"):

        @TopologyReg.register(name)
        class Again(Topology):
            def _get_topo_edges(self) -> list[list[Edge]]:
                return [[Edge([0], 1.0)]]

    assert TopologyReg.get(name) is before


def test_register_rejects_duplicate_custom(fresh_name: Callable[[str], str]) -> None:
    name = fresh_name("dup")

    @TopologyReg.register(name)
    class First(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            return [[Edge([0], 1.0)]]

    with pytest.raises(ValueError, match="already registered"):
        TopologyReg.register(name)(First)
    assert TopologyReg.get(name) is First


@pytest.mark.parametrize(
    "thing", [object, dict, lambda n: n, 3], ids=["object", "dict", "function", "int"]
)
def test_register_rejects_non_topology(thing: object, fresh_name: Callable[[str], str]) -> None:
    name = fresh_name("bad")
    with pytest.raises(TypeError, match=rf"'{name}'.*Topology subclass"):
        TopologyReg.register(name)(thing)  # type: ignore[arg-type]
    assert name not in TopologyReg.registry


@pytest.mark.parametrize(
    "call",
    [
        lambda: TopologyReg.get("no-such-topology"),
        lambda: TopologyReg.create("no-such-topology", 4),
        lambda: mixing_matrices("no-such-topology", 4),
    ],
    ids=["get", "create", "mixing_matrices"],
)
def test_unknown_name_lists_known(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="no-such-topology") as info:
        call()
    for name in BUILTINS:
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [42, None, CompleteTopology(2, 1).rounds, dict])
def test_create_rejects_other_objects(bad: object) -> None:
    with pytest.raises(ValueError, match="topology="):
        TopologyReg.create(bad, 4)  # type: ignore[arg-type]


def test_create_passes_keyword_arguments() -> None:
    topo = TopologyReg.create("random-matching", 6, 1, period=3, seed=11)
    assert topo.period == 3
    assert len(mixing_matrices("random-matching", 6, period=2)) == 2
