"""The topology chooser: its mixing and bytes against hand counts, its pick at two extremes, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from decent_dp.mixing import consensus_rate, period_contraction
from decent_dp.topo import Edge, TopologyReg
from experiments.network import choose as ch
from experiments.network.sim_config import load_config

S = 100e6
ROOT = Path(__file__).resolve().parents[3]


def _rate(name: str, n: int, local: int = 1, **kwargs: object) -> float:
    mats = TopologyReg.create(name, n, local, **kwargs).mixing_matrices()
    return ch.rate_per_step(period_contraction(mats), len(mats))


def test_a_period_is_spread_over_its_steps_so_local_sgd_is_not_complete() -> None:
    assert _rate("complete", 16) == 1.0
    assert _rate("local-sgd", 16) == pytest.approx(1 / 8)  # one exact average in 8 steps
    assert _rate("local-sgd", 16, period=4) == pytest.approx(1 / 4)
    assert _rate("one-peer-exp", 16) == pytest.approx(1 / 4)  # exact after log2(16) rounds
    # the geometric rate of decent_dp.mixing reads 1 for every exact period, local-sgd too
    local_sgd = TopologyReg.create("local-sgd", 16, 1).mixing_matrices()
    assert consensus_rate(local_sgd) == 1.0
    ring = TopologyReg.create("ring", 8, 1).mixing_matrices()
    assert _rate("ring", 8) == pytest.approx((1 - period_contraction(ring)) / 2)
    assert 0 < _rate("ring", 8) < _rate("one-peer-exp", 8)


def test_bytes_per_host_link_match_the_hand_counts() -> None:
    """4 hosts of 2 (docs/results/hierarchical/README.md): hierarchical 1 S, one-peer-exp 4/3 S,
    the ring all-reduce 7/4 S; local-sgd one all-reduce in 8 steps."""

    def sent(name: str, **kwargs: object) -> float:
        topo = TopologyReg.create(name, 8, 2, **kwargs)
        return ch.host_link_bytes(topo.rounds, 2, S, three_phase=name == "hierarchical")

    assert sent("hierarchical") == pytest.approx(S)
    assert sent("one-peer-exp") == pytest.approx(4 / 3 * S)
    assert ch.host_link_bytes([[Edge(range(8), 1 / 8)]], 2, S) == pytest.approx(7 / 4 * S)
    assert sent("local-sgd") == pytest.approx(7 / 4 * S / 8)
    # a group inside one node sends nothing between nodes
    assert ch.host_link_bytes([[Edge([0, 1], 0.5), Edge([2, 3], 0.5)]], 2, S) == 0.0


@pytest.mark.parametrize("nodes", [2, 4])
def test_eight_per_node_on_a_slow_link_keeps_traffic_inside_nodes(nodes: int) -> None:
    out = ch.choose(nodes, 8, "100mbit", "100")
    rows = {r["topology"]: r for r in out["rows"]}
    assert out["pick"] == "hierarchical", out["why"]
    pick = rows["hierarchical"]
    assert pick["host_link_bytes"] == pytest.approx(100e6)  # one model per host link
    assert pick["host_link_bytes"] < rows["allreduce"]["host_link_bytes"] / 1.5
    assert pick["step_s"] < rows["allreduce"]["step_s"] / 1.5
    assert pick["step_s"] <= min(r["step_s"] for r in out["rows"] if r["candidate"]) * 1.1
    assert out["rows"][0] is pick and pick["rank"] == 1
    assert out["link"]["calibrated_on"] == "testbed"
    assert "table.json" in out["model_error"]


def test_a_fast_link_where_compute_dominates_picks_the_best_mixing() -> None:
    resnet50 = load_config().model_bytes / 1e6  # 25,557,032 fp32 parameters, in MB
    out = ch.choose(4, 8, "infiniband_100g", str(resnet50), compute_ms=200)
    rows = {r["topology"]: r for r in out["rows"]}
    fastest = min(r["step_s"] for r in out["rows"] if r["candidate"])
    assert out["pick"] in ("complete", "allreduce"), out["why"]
    assert rows[out["pick"]]["rate_per_step"] == 1.0
    assert rows[out["pick"]]["step_s"] <= fastest * 1.1
    # hierarchical is as fast but mixes half as much at 4 hosts (exact after 2 rounds)
    assert rows["hierarchical"]["rate_per_step"] == pytest.approx(0.5)
    assert out["link"]["calibrated_on"] == "paper"
    # local-sgd is listed, with its own rate, but no candidate
    assert not rows["local-sgd"]["candidate"]
    assert rows["local-sgd"]["rate_per_step"] == pytest.approx(1 / 8)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--nodes", "0"], ["--nodes='0'", "integer >= 1"]),
        (["--nodes", "two"], ["--nodes='two'", "integer >= 1"]),
        (["--procs-per-node", "-8"], ["--procs-per-node='-8'", ">= 1"]),
        (["--nodes", "200"], ["1600", "2 to 1024"]),
        (["--link", "fast"], ["--link='fast'", "1gbit"]),
        (["--link", "0mbit"], ["--link='0mbit'", "1gbit"]),
        (["--model", "bert"], ["--model='bert'", "resnet50", "MB"]),
        (["--model", "-3"], ["--model='-3'", "MB"]),
        (["--compute-ms", "0"], ["--compute-ms='0'", "> 0"]),
        (["--tolerance", "1.5"], ["--tolerance=1.5", "[0, 1)"]),
        (["--tolerance", "x"], ["--tolerance='x'", "[0, 1)"]),
        (["--fabric", "wifi"], ["--fabric='wifi'", "ethernet, infiniband"]),
        (
            ["--link", "infiniband_100g", "--fabric", "ethernet"],
            ["--fabric='ethernet'", "infiniband"],
        ),
        (["--inter", "hierarchical"], ["--inter='hierarchical'", "one-peer-exp"]),
        (["--topologies", "ring,mesh"], ["--topologies='ring,mesh'", "allreduce", "ring"]),
        (["--intra", "nvlink"], ["--intra='nvlink'", "1gbit"]),
    ],
)
def test_a_bad_value_is_one_line_naming_it(
    argv: list[str], names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--nodes": "2", "--procs-per-node": "8", "--link": "1gbit", "--model": "10"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert ch.main([x for kv in base.items() for x in kv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith("choose: error: ")
    for name in names:
        assert name in lines[0]


def test_the_command_line_prints_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--nodes", "3", "--procs-per-node", "4", "--link", "10gbit", "--model", "small_cnn"]
    assert ch.main(argv) == 0
    text = capsys.readouterr().out
    assert "53,098 parameters" in text and "\npick: " in text
    assert "| one-peer-exp | does not fit" in text  # 12 workers: not a power of two
    assert ch.main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["topology"] == out["pick"]
    assert len(out["rows"]) == len(TopologyReg.names()) + 1  # and allreduce
    assert out["inputs"]["world_size"] == 12 and out["inputs"]["rate_bps"] == 10e9


EXAMPLES = sorted((ROOT / "docs" / "results" / "cluster").glob("choose_*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_committed_examples_are_what_the_chooser_says(path: Path) -> None:
    saved = json.loads(path.read_text())
    inp = saved["inputs"]
    mb = str(saved["model"]["bytes"] / 1e6)  # the same bytes, without building the model
    fresh = ch.choose(inp["nodes"], inp["procs_per_node"], inp["link"], mb)
    assert fresh["pick"] == saved["pick"]
    assert [r["topology"] for r in fresh["rows"]] == [r["topology"] for r in saved["rows"]]
    for new, old in zip(fresh["rows"], saved["rows"]):
        for key in ("step_s", "rate_per_step", "host_link_bytes"):
            assert new[key] == pytest.approx(old[key], rel=1e-9), (new["topology"], key)
    assert fresh["model_error"] == saved["model_error"]


def test_the_cluster_guide_shows_the_committed_example() -> None:
    saved = json.loads(EXAMPLES[0].read_text())
    assert EXAMPLES[0].name == "choose_2x8_10gbit_gpt2_124m.json"
    # the page's figures are generated spans (<!-- v:ID -->16<!-- /v -->): compare their text
    guide = re.sub(r"<!-- /?v(?::\S*)? -->", "", (ROOT / "docs" / "cluster.md").read_text())
    rows = [line for line in ch.table(saved).splitlines() if line.startswith("| ")]
    assert len(rows) == len(saved["rows"]) + 1  # and the header
    for line in rows:
        assert line in guide
    assert f"pick: {saved['why']}" in guide
    # the errors it quotes are the validation's (the wire table, the paper's points)
    for kind, quoted in (("testbed", ["16 of 25", "0.68 to 1.33"]), ("paper", ["+29.0%", "-6.1%"])):
        for text in quoted:
            assert text in ch.model_error(kind) and text in guide
