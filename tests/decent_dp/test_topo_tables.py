"""Pure-data tests of :mod:`decent_dp.topo` and :mod:`decent_dp.mixing`: spectral gaps,
contraction, the consensus rate and exact consensus on hand cases, ``describe()`` and the
command-line table."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from decent_dp.mixing import consensus_rate, reaches_exact_consensus
from decent_dp.topo import (
    TopologyReg,
    describe,
    main,
    mixing_matrices,
    period_contraction,
    spectral_gap,
)
from tests.support.topo_reference import (
    ATOL,
    BUILTINS,
    REPO_ROOT,
    uniform,
)

__all__: list[str] = []


# ---------------------------------------------------------------------------
# spectral_gap and period_contraction on hand cases
# ---------------------------------------------------------------------------


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


PAIRS4 = t(
    [
        [0.5, 0.5, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.0, 0.0, 0.5, 0.5],
        [0.0, 0.0, 0.5, 0.5],
    ]
)


@pytest.mark.parametrize(
    ("w", "gap"),
    [
        pytest.param(uniform(3), 1.0, id="uniform-3"),
        pytest.param(uniform(8), 1.0, id="uniform-8"),
        pytest.param(torch.ones(1, 1, dtype=torch.float64), 1.0, id="one-worker"),
        # two disjoint pairs: eigenvalues 1, 1, 0, 0
        pytest.param(PAIRS4, 0.0, id="disjoint-pairs"),
        # swap: eigenvalues 1, -1
        pytest.param(t([[0.0, 1.0], [1.0, 0.0]]), 0.0, id="swap"),
        pytest.param(torch.eye(3, dtype=torch.float64), 0.0, id="identity"),
        # eigenvalues 1, 0.5
        pytest.param(t([[0.75, 0.25], [0.25, 0.75]]), 0.5, id="lazy-pair"),
        # eigenvalues 1, -0.8: the most negative one sets the gap
        pytest.param(t([[0.1, 0.9], [0.9, 0.1]]), 0.2, id="negative-eigenvalue"),
        # eigenvalues 1, 0.1 on (1,-1,0) and -0.3 on (1,1,-2): |λn| sets the gap
        pytest.param(
            t([[10, 7, 13], [7, 10, 13], [13, 13, 4]]) / 30, 0.7, id="negative-smallest-3"
        ),
        # circulant (1/2, 1/4, 1/4): eigenvalues 1, 1/4, 1/4
        pytest.param(
            t([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]]), 0.75, id="circulant-3"
        ),
    ],
)
def test_spectral_gap_hand_cases(w: torch.Tensor, gap: float) -> None:
    assert spectral_gap(w) == pytest.approx(gap, abs=1e-12)


def test_spectral_gap_of_ring_rounds_is_zero_but_period_mixes() -> None:
    mats = mixing_matrices("ring", 8)
    assert [spectral_gap(w) for w in mats] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert period_contraction(mats) < 1.0


@pytest.mark.parametrize(
    ("mats", "value"),
    [
        pytest.param([uniform(4)], 0.0, id="uniform"),
        pytest.param([torch.eye(3, dtype=torch.float64)], 1.0, id="identity"),
        pytest.param([t([[0.75, 0.25], [0.25, 0.75]])], 0.5, id="lazy-pair"),
        pytest.param([t([[0.75, 0.25], [0.25, 0.75]])] * 2, 0.25, id="lazy-pair-twice"),
        # averaging pairs (0,1),(2,3) and then (0,3),(1,2) reaches consensus
        pytest.param([PAIRS4, PAIRS4[[0, 2, 3, 1]][:, [0, 2, 3, 1]]], 0.0, id="ring-4"),
        pytest.param([PAIRS4, PAIRS4], 1.0, id="same-pairs-twice"),
    ],
)
def test_period_contraction_hand_cases(mats: list[torch.Tensor], value: float) -> None:
    assert period_contraction(mats) == pytest.approx(value, abs=1e-12)


def test_ring4_hand_matrix_matches_topology() -> None:
    mats = mixing_matrices("ring", 4)
    torch.testing.assert_close(mats[0], PAIRS4, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        mats[1],
        t(
            [
                [0.5, 0.0, 0.0, 0.5],
                [0.0, 0.5, 0.5, 0.0],
                [0.0, 0.5, 0.5, 0.0],
                [0.5, 0.0, 0.0, 0.5],
            ]
        ),
        atol=ATOL,
        rtol=0,
    )


# ---------------------------------------------------------------------------
# describe() and the command-line table
# ---------------------------------------------------------------------------


def test_describe() -> None:
    row = describe("complete", 4)
    assert (row["name"], row["period"], row["peers_per_round"]) == ("complete", 1, 3)
    assert row["worst_gap"] == pytest.approx(1.0, abs=ATOL)
    assert row["contraction"] == pytest.approx(0.0, abs=ATOL)
    assert "error" in describe("one-peer-exp", 6)
    aer = describe("alternating-exp-ring", 16, 4)
    assert (aer["period"], aer["peers_per_round"]) == (4, 7)


def run_table(*args: str) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "decent_dp.topo", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("topology", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_cli_table_world_size_64() -> None:
    rows = run_table("--world-size", "64")
    module_names = [
        name
        for name, klass in TopologyReg.registry.items()
        if klass.__module__ == "decent_dp.topo.builtin"
    ]
    assert set(BUILTINS) <= set(module_names) <= set(rows)
    # default local world size is 8, so alternating-exp-ring has 8 nodes
    periods = {
        "complete": 1,
        "ring": 2,
        "one-peer-exp": 6,
        "alternating-exp-ring": 6,
        "random-matching": 8,
    }
    for name in BUILTINS:
        assert not rows[name][0].startswith("n/a"), rows[name]
        assert int(rows[name][0]) == periods[name]
    for name in ("complete", "one-peer-exp", "alternating-exp-ring"):
        assert float(rows[name][3]) < 1e-9
    assert int(rows["complete"][1]) == 63
    assert int(rows["alternating-exp-ring"][1]) == 15


@pytest.mark.slow  # the CLI's start-up is paid once in the fast suite, by the world-size-64 table
def test_cli_table_world_size_6_marks_sizes_that_do_not_fit() -> None:
    rows = run_table("--world-size", "6", "--local-world-size", "2")
    assert set(BUILTINS) <= set(rows)
    assert rows["one-peer-exp"][0].startswith("n/a:")
    assert "n=6" in rows["one-peer-exp"][0]
    assert rows["alternating-exp-ring"][0].startswith("n/a:")
    for name in ("complete", "ring", "random-matching"):
        assert not rows[name][0].startswith("n/a")


def test_cli_rejects_bad_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--world-size", "0"])
    assert info.value.code == 2
    assert "--world-size=0" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# consensus_rate and reaches_exact_consensus on hand cases
# ---------------------------------------------------------------------------


def lazy_pair(eps: float) -> torch.Tensor:
    """``[[1/2 + eps, 1/2 - eps], [1/2 - eps, 1/2 + eps]]``: its second eigenvalue is ``2 eps``."""
    return t([[0.5 + eps, 0.5 - eps], [0.5 - eps, 0.5 + eps]])


@pytest.mark.parametrize(
    ("mats", "rate"),
    [
        # contraction 1/2 in one round, then 1/4 over a period of two: 1/2 per step both times
        pytest.param([lazy_pair(0.25)], 0.5, id="one-round"),
        pytest.param([lazy_pair(0.25)] * 2, 0.5, id="period-of-two"),
        # contraction 1/8 over three rounds: 1 - (1/8)^(1/3)
        pytest.param([lazy_pair(0.25)] * 3, 0.5, id="period-of-three"),
        pytest.param([lazy_pair(0.0)], 1.0, id="exact"),
        # a contraction of 1e-13, under atol: rounding noise of an exact period, so exactly 1
        pytest.param([lazy_pair(5e-14)], 1.0, id="noise-under-atol"),
    ],
)
def test_consensus_rate_hand_cases(mats: list[torch.Tensor], rate: float) -> None:
    got = consensus_rate(mats)
    if rate == 1.0:
        assert got == 1.0
    else:
        assert got == pytest.approx(rate, abs=1e-12)


def test_consensus_rate_reads_a_contraction_above_atol() -> None:
    # 1e-6 is no rounding noise: the rate is 1 - 1e-6, not 1
    assert consensus_rate([lazy_pair(5e-7)]) == pytest.approx(1.0 - 1e-6, abs=1e-12)
    assert consensus_rate([lazy_pair(5e-7)], atol=1e-5) == 1.0


def test_reaches_exact_consensus_hand_cases() -> None:
    assert reaches_exact_consensus([lazy_pair(0.0)])
    assert reaches_exact_consensus([lazy_pair(5e-14)])  # within the default atol
    assert not reaches_exact_consensus([lazy_pair(0.25)] * 4)  # 1/16 left
    assert not reaches_exact_consensus([lazy_pair(5e-14)], atol=1e-14)
    assert reaches_exact_consensus(mixing_matrices("one-peer-exp", 8))
    assert not reaches_exact_consensus(mixing_matrices("ring", 8))


def test_a_contraction_equal_to_atol_counts_as_exact() -> None:
    mats = [lazy_pair(0.25)] * 2
    c = period_contraction(mats)
    assert reaches_exact_consensus(mats, atol=c)
    assert consensus_rate(mats, atol=c) == 1.0
    assert not reaches_exact_consensus(mats, atol=c * (1 - 1e-9))


def test_the_spectral_gap_is_never_negative() -> None:
    # an eigenvalue beyond 1 in magnitude (not a mixing matrix, or rounding): 0, not below
    assert spectral_gap(t([[1.0, 0.0], [0.0, -1.5]])) == 0.0
