"""The elastic merge plot: quorums and changes read from hosts' metrics lines, drawn from the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench import elastic_merge_plot as mp


def _host(root: Path, name: str, lines: list[dict]) -> None:
    (root / name).mkdir(parents=True)
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"step": 9, "cut'  # a line cut by a kill
    (root / name / "metrics.jsonl").write_text(text)


def test_quorums_and_changes_per_host_then_a_plot_from_the_json_alone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    q = lambda s, m, c: {"step": s, "elastic/members": m, "consensus/distance": c}  # noqa: E731
    _host(run, "h0", [q(1, 2, 0.0), {"step": 2, "train/loss": 1.0}, q(11, 2, 0.5), q(21, 1, 0.0)])
    change = {"step": 40, "left": [], "joined": ["h0"], "healed_from": "h0"}
    _host(
        run,
        "h1",
        [q(1, 2, 0.0), q(11, 2, 0.5), {"step": 40, "elastic/change": change}, q(41, 2, 0.1)],
    )
    (run / "train.log").write_text("not a host\n")
    data = mp.extract(run)
    assert sorted(data["hosts"]) == ["h0", "h1"]
    assert [x["step"] for x in data["hosts"]["h0"]["quorums"]] == [1, 11, 21]
    assert [x["members"] for x in data["hosts"]["h0"]["quorums"]] == [2, 2, 1]
    assert data["hosts"]["h1"]["changes"] == [change]
    # the gap of h1's missed quorums (11 -> 41) is a break in its line
    steps, _, _ = mp._with_gaps(data["hosts"]["h1"]["quorums"])
    assert steps[:2] == [1, 11] and steps[2] != steps[2] and steps[3] == 41
    mp.main([str(run), "--out", str(tmp_path / "m")])
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(data))
    (tmp_path / "m.png").unlink()
    mp.main(["--from-json", str(tmp_path / "m.json")])
    assert (tmp_path / "m.png").stat().st_size > 1000


def test_a_folder_without_hosts_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^run_dir=.* holds no host folder with a metrics.jsonl$"):
        mp.extract(tmp_path)
