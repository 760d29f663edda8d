"""Tuning an override key: the best value per group, ties, edges, errors, the CLI and report."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import report
from experiments.report import tune
from experiments.report.runs import Run, load_all
from experiments.train.logger import json_safe
from tests.experiments.report.common import section, write_lm_run, write_vision_run

LRS = ("1e-3", "2e-3", "4e-3", "8e-3")
# the best learning rate of each topology, by construction
VISION_BEST = {"allreduce": "2e-3", "ring": "4e-3"}
LM_BEST = {"allreduce": "4e-3", "ring": "1e-3"}


def _acc(topology: str, lr: str, seed: int) -> float:
    """0.9 at the group's best rate, 0.05 less per factor of 2 away; seed 1 adds 0.02."""
    steps = abs(LRS.index(lr) - LRS.index(VISION_BEST[topology]))
    return 0.9 - 0.05 * steps + 0.02 * seed


def _vision(root: Path, topologies: tuple[str, ...] = ("allreduce", "ring")) -> Path:
    """Two topologies x 4 rates x 2 seeds, one epoch each, job numbers as Hydra gives them."""
    jobs = itertools.product(topologies, LRS, (0, 1))
    for job, (topology, lr, seed) in enumerate(jobs):
        write_vision_run(
            root / str(job), topology, [100.0], [_acc(topology, lr, seed)], seed=seed,
            overrides=[f"topology={topology}", f"optim.lr={lr}", f"train.seed={seed}"],
        )  # fmt: skip
    return root


def _lm(root: Path) -> Path:
    """The same grid of language-model runs; the loss grows 0.1 per factor of 2 off the best."""
    jobs = itertools.product(("allreduce", "ring"), LRS, (0, 1))
    for job, (topology, lr, seed) in enumerate(jobs):
        steps = abs(LRS.index(lr) - LRS.index(LM_BEST[topology]))
        write_lm_run(
            root / str(job), topology, "adamw", seed, final_loss=3.0 + 0.1 * steps + 0.01 * seed,
            tokens_per_s=1000.0,
            overrides=[f"topology={topology}", f"optim.lr={lr}", f"train.seed={seed}"],
        )  # fmt: skip
    return root


def _runs(*dirs: Path) -> list[Run]:
    runs, skipped = load_all(dirs)
    assert not skipped
    return runs


def _by_topology(groups: list[tune.TunedGroup]) -> dict[str, tune.TunedGroup]:
    return {g.fields["topology"]: g for g in groups}


def test_accuracy_picks_the_largest_mean_of_each_group(tmp_path: Path) -> None:
    groups = _by_topology(tune.tune_runs(_runs(_vision(tmp_path)), "optim.lr"))
    assert list(groups) == ["allreduce", "ring"]
    for topology, group in groups.items():
        assert (group.metric, group.lower_is_better) == ("eval/acc", False)
        assert [v.text for v in group.grid] == list(LRS)
        assert [v.value for v in group.grid] == [1e-3, 2e-3, 4e-3, 8e-3]
        assert "optim.lr" not in group.fields and "seed" not in group.fields
        best = group.best
        assert best.text == VISION_BEST[topology]
        assert best.n == 2 and best.mean == pytest.approx(0.91)
        assert best.std == pytest.approx(0.02 / 2**0.5)  # the sample std of 0.90 and 0.92
        assert (best.lo, best.hi) == pytest.approx((0.90, 0.92))
        assert not group.edge and group.flag == ""


def test_loss_picks_the_smallest_mean_and_flags_a_best_at_the_edge(tmp_path: Path) -> None:
    groups = _by_topology(tune.tune_runs(_runs(_lm(tmp_path)), "optim.lr"))
    assert {g.metric for g in groups.values()} == {"eval/loss"}
    assert all(g.lower_is_better for g in groups.values())
    assert groups["allreduce"].best.text == "4e-3" and groups["allreduce"].flag == ""
    ring = groups["ring"]
    assert ring.best.text == "1e-3" and ring.best.mean == pytest.approx(3.005)
    assert ring.edge and ring.flag == tune.EDGE == "edge: widen the grid"
    # a named metric: perplexity is lower-is-better, the same choice as the loss
    ppl = _by_topology(tune.tune_runs(_runs(tmp_path), "optim.lr", metric="eval/ppl"))
    assert ppl["ring"].lower_is_better and ppl["ring"].best.text == "1e-3"


def test_a_named_metric_without_loss_in_its_name_is_maximised(tmp_path: Path) -> None:
    groups = tune.tune_runs(_runs(_vision(tmp_path)), "optim.lr", metric="eval/acc_local")
    assert [(g.lower_is_better, g.best.text) for g in groups] == [(False, "2e-3"), (False, "4e-3")]


def test_ties_go_to_the_smaller_value_whatever_the_order_of_the_runs(tmp_path: Path) -> None:
    # 4e-3 comes first by directory name; both rates average 0.9 (0.89 + 0.91 vs 0.9 + 0.9)
    for name, lr, acc, seed in [("a", "4e-3", 0.89, 0), ("b", "4e-3", 0.91, 1),
                                ("c", "2e-3", 0.9, 0), ("d", "0.002", 0.9, 1),
                                ("e", "1e-3", 0.5, 0)]:  # fmt: skip
        write_vision_run(tmp_path / name, "ring", [100.0], [acc], seed=seed,
                         overrides=[f"optim.lr={lr}", f"train.seed={seed}"])  # fmt: skip
    runs = _runs(tmp_path)
    answers = set()
    for order in itertools.permutations(runs):
        (group,) = tune.tune_runs(list(order), "optim.lr")
        answers.add((group.best.text, tuple(v.text for v in group.grid)))
    # 2e-3 and 0.002 are one value, named by the smaller text
    assert answers == {("0.002", ("1e-3", "0.002", "4e-3"))}
    assert group.best.n == 2 and group.best.mean == pytest.approx(0.9)


def test_a_text_tie_goes_to_the_first_text_and_its_sub_keys_still_group(tmp_path: Path) -> None:
    # tuning the optimizer itself: optim.lr stays a field of the group, not part of the value
    for job, (optim, lr) in enumerate(itertools.product(("sgd", "adamw"), ("0.1", "0.2"))):
        write_vision_run(tmp_path / str(job), "ring", [100.0], [0.8], optim=optim,
                         overrides=[f"optim={optim}", f"optim.lr={lr}"])  # fmt: skip
    groups = tune.tune_runs(_runs(tmp_path), "optim")
    assert [g.fields["optim.lr"] for g in groups] == ["0.1", "0.2"]
    for group in groups:
        assert [v.text for v in group.grid] == ["adamw", "sgd"] and group.best.text == "adamw"
        assert group.flag == ""  # no edge in a grid of names


def test_a_group_with_one_value_says_so(tmp_path: Path) -> None:
    write_vision_run(tmp_path / "0", "ring", [100.0], [0.8], overrides=["optim.lr=0.1"])
    write_vision_run(tmp_path / "1", "ring", [100.0], [0.9], seed=1,
                     overrides=["optim.lr=0.1", "train.seed=1"])  # fmt: skip
    (group,) = tune.tune_runs(_runs(tmp_path), "optim.lr")
    assert group.flag == tune.SINGLE == "single value" and not group.edge
    assert group.best.n == 2 and group.best.mean == pytest.approx(0.85)


@pytest.mark.parametrize("value", ["0.9", "drop"], ids=["text", "missing"])
def test_a_run_without_the_metric_is_a_one_line_error_naming_it(tmp_path: Path, value: str) -> None:
    _vision(tmp_path)
    summary_path = tmp_path / "5" / "summary.json"
    summary = json.loads(summary_path.read_text())
    if value == "drop":
        del summary["eval/acc"]
    else:
        summary["eval/acc"] = value
    summary_path.write_text(json.dumps(summary))
    with pytest.raises(ValueError) as caught:
        tune.tune_runs(_runs(tmp_path), "optim.lr")
    message = str(caught.value)
    assert "\n" not in message
    assert str(tmp_path / "5") in message and "eval/acc" in message and "optim.lr" in message


def _diverge(run_dir: Path, metric: str, how: str = "null") -> None:
    """Make a run diverged: its metric null (as the trainer writes a non-finite value), a bare
    NaN (as ``json.dumps`` writes one), or marked ``diverged`` with its metric kept finite."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    if how == "marked":
        summary.update(diverged=True, diverged_step=3)
    else:
        summary[metric] = float("nan")
    if how == "null":
        summary = json_safe(summary)
    summary_path.write_text(json.dumps(summary))


@pytest.mark.parametrize("how", ["null", "nan", "marked"])
def test_a_diverged_run_ranks_its_value_worst(tmp_path: Path, how: str) -> None:
    _lm(tmp_path)
    _diverge(tmp_path / "8", "eval/loss", how)  # ring at its best rate 1e-3, seed 0
    _diverge(tmp_path / "5", "eval/loss", how)  # allreduce at 4e-3 (its best), seed 1
    if how == "null":
        assert '"eval/loss": null' in (tmp_path / "8" / "summary.json").read_text()
    groups = _by_topology(tune.tune_runs(_runs(tmp_path), "optim.lr"))
    ring, allreduce = groups["ring"], groups["allreduce"]
    assert ring.best.text == "2e-3" and ring.best.mean == pytest.approx(3.105)
    assert ring.grid[0].diverged == 1 and ring.grid[0].std is None
    assert allreduce.best.text in ("2e-3", "8e-3") and allreduce.grid[2].diverged == 1
    record = tune.tuned_json(list(groups.values()))
    first = next(g for g in record["groups"] if g["fields"]["topology"] == "ring")["grid"][0]
    assert first["mean"] is None and first["diverged"] == 1
    json.dumps(record, allow_nan=False)  # strict JSON
    assert "| 1e-3 | diverged | n/a | 2 |" in "\n".join(tune.grid_tables(list(groups.values())))
    tune.tune_plot(list(groups.values()))  # the diverged values are left out of the lines
    # higher is better: a diverged accuracy ranks below every finite one
    _vision(tmp_path / "v")
    _diverge(tmp_path / "v" / "4", "eval/acc", how)  # allreduce at 4e-3, seed 0
    (vision,) = [g for g in tune.tune_runs(_runs(tmp_path / "v"), "optim.lr")
                 if g.fields["topology"] == "allreduce"]  # fmt: skip
    assert vision.best.text == "2e-3" and vision.grid[2].mean == float("-inf")


def test_best_refuses_a_grid_where_every_value_diverged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _vision(tmp_path, topologies=("ring",))
    for job in range(8):
        _diverge(tmp_path / str(job), "eval/acc")
    assert tune.main([str(tmp_path), "--key", "optim.lr", "--best"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every value of optim.lr tried diverged" in err[0]


def test_a_metric_null_in_every_run_of_a_group_is_an_error_not_a_diverged_grid(
    tmp_path: Path,
) -> None:
    # language models log no accuracy: their eval/acc is null, never logged, and none diverged
    _lm(tmp_path)
    for summary_path in tmp_path.glob("*/summary.json"):
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps({**summary, "eval/acc": None}))  # as the trainer has it
    with pytest.raises(
        ValueError, match=r"eval/acc is null in every run .* none logged it and none diverged"
    ):
        tune.tune_runs(_runs(tmp_path), "optim.lr", metric="eval/acc")
    # one run marked diverged makes the nulls of its group divergence
    for job in range(8, 16):
        _diverge(tmp_path / str(job), "eval/loss", "marked")
    runs = [r for r in _runs(tmp_path) if r.topology == "ring"]
    (ring,) = tune.tune_runs(runs, "optim.lr", metric="eval/acc")
    assert all(v.diverged == 2 for v in ring.grid)


def _grid(root: Path, accs: dict[str, float]) -> list[Run]:
    """One ring run per learning rate, with the given final accuracy."""
    for lr, acc in accs.items():
        write_vision_run(root / lr, "ring", [100.0], [acc], overrides=[f"optim.lr={lr}"])
    return _runs(root)


@pytest.mark.parametrize(("best", "side"), [("1e-3", "low"), ("8e-3", "high"), ("2e-3", "inside")])
def test_the_edge_flag_at_either_end_of_the_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], best: str, side: str
) -> None:
    accs = {lr: 0.9 if lr == best else 0.5 + 0.01 * i for i, lr in enumerate(LRS)}
    (group,) = tune.tune_runs(_grid(tmp_path, accs), "optim.lr")
    assert group.best.text == best and group.side == side
    assert group.edge == (side != "inside") and group.flag == (tune.EDGE if group.edge else "")
    (record,) = tune.tuned_json([group])["groups"]
    assert record["edge"] == group.edge and record["best"]["text"] == best
    assert tune.main([str(tmp_path), "--key", "optim.lr", "--best", "--edge"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{best} {side}\n"
    assert ("edge: widen the grid" in err) == group.edge
    assert tune.main([str(tmp_path), "--key", "optim.lr", "--best"]) == 0
    assert capsys.readouterr().out == f"{best}\n"  # without --edge, the text alone


def test_edge_needs_best(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _grid(tmp_path, {"1e-3": 0.5, "2e-3": 0.6})
    with pytest.raises(SystemExit) as caught:
        tune.main([str(tmp_path), "--key", "optim.lr", "--edge"])
    assert caught.value.code == 2 and "--edge is only used with --best" in capsys.readouterr().err


def test_means_one_ulp_apart_tie_and_the_tie_goes_to_the_smaller_value(tmp_path: Path) -> None:
    # 4e-3 is better by one ulp: the same mean up to rounding, so the smaller rate wins
    acc = 0.9
    (group,) = tune.tune_runs(
        _grid(tmp_path / "ulp", {"1e-3": 0.5, "2e-3": acc, "4e-3": math.nextafter(acc, 1.0)}),
        "optim.lr",
    )
    assert group.grid[2].mean > group.grid[1].mean and group.best.text == "2e-3"
    # a loss one ulp lower ties the same way (lower is better)
    loss = 3.0
    for lr, value in {"1e-3": 4.0, "2e-3": loss, "4e-3": math.nextafter(loss, 0.0)}.items():
        write_lm_run(tmp_path / "lm" / lr, "ring", "adamw", 0, final_loss=value,
                     tokens_per_s=1000.0, overrides=[f"optim.lr={lr}"])  # fmt: skip
    (lm,) = tune.tune_runs(_runs(tmp_path / "lm"), "optim.lr")
    assert lm.grid[2].mean < lm.grid[1].mean and lm.best.text == "2e-3"
    # far beyond the tolerance (a relative 1e-9) the better mean wins
    (wide,) = tune.tune_runs(
        _grid(tmp_path / "far", {"1e-3": 0.5, "2e-3": acc, "4e-3": acc * (1 + 1e-9)}), "optim.lr"
    )
    assert wide.best.text == "4e-3"


def test_runs_without_the_key_are_a_one_line_error(tmp_path: Path) -> None:
    _vision(tmp_path)
    write_vision_run(tmp_path / "z", "ring", [100.0], [0.8], overrides=["topology=ring"])
    with pytest.raises(ValueError, match=r"no value of outer\.lr") as caught:
        tune.tune_runs(_runs(tmp_path), "outer.lr")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=rf"1 of 17 .* optim\.lr.*{tmp_path / 'z'}$"):
        tune.tune_runs(_runs(tmp_path), "optim.lr")
    with pytest.raises(ValueError, match="no run"):
        tune.tune_runs([], "optim.lr")


def test_cli_best_prints_the_override_text_and_refuses_two_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _vision(tmp_path / "sweep", topologies=("ring",))
    assert tune.main([str(tmp_path / "sweep"), "--key", "optim.lr", "--best"]) == 0
    assert capsys.readouterr() == ("4e-3\n", "")
    # a second topology: two groups, named by the field that differs
    _vision(tmp_path / "more", topologies=("allreduce",))
    assert tune.main([str(tmp_path), "--key", "optim.lr", "--best"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert "2 groups" in err and "topology" in err
    # without --best: a table of each group's grid, the best marked
    assert tune.main([str(tmp_path), "--key", "optim.lr"]) == 0
    out = capsys.readouterr().out
    assert "### allreduce" in out and "### ring" in out and "| 4e-3 | 0.9100 |" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert tune.main([str(empty), "--key", "optim.lr", "--best"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no usable run") and err.count("\n") == 1


def test_cli_best_warns_on_stderr_when_the_best_is_at_the_edge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _lm(tmp_path)
    ring = [str(tmp_path / str(job)) for job in range(8, 16)]
    assert tune.main([*ring, "--key", "optim.lr", "--best"]) == 0
    out, err = capsys.readouterr()
    assert out == "1e-3\n" and "edge: widen the grid" in err


def test_report_tune_writes_the_section_the_json_and_the_plot(tmp_path: Path) -> None:
    out = tmp_path / "report"
    path = report.build_report([_vision(tmp_path / "sweep")], out=out, tune="optim.lr")
    text = path.read_text()
    assert text.index("## Tuned: optim.lr") < text.index("## Vision runs")
    tuned = section(text, "Tuned: optim.lr")
    assert "| allreduce | 2e-3 | 0.9100 ± 0.0141 | 2 |" in tuned
    assert "**4e-3: 0.9100**" in tuned and "](tune_optim_lr.png)" in tuned
    data = json.loads((out / "tuned.json").read_text())
    assert (data["key"], data["metric"]) == ("optim.lr", "eval/acc")
    ring = data["groups"][1]
    assert ring["factors"] == {"topology": "ring"} and ring["edge"] is False
    assert ring["best"]["text"] == "4e-3" and ring["best"]["value"] == 4e-3
    assert ring["best"]["n"] == 2 and ring["best"]["mean"] == pytest.approx(0.91)
    assert [v["text"] for v in ring["grid"]] == list(LRS)
    assert [v["n"] for v in ring["grid"]] == [2] * 4 and ring["grid"][0]["std"] > 0
    png = (out / "tune_optim_lr.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 5000
    assert report.main([str(tmp_path / "sweep"), "--out", str(out), "--metric", "x"]) == 2


def test_log_x_for_geometric_grids_only(tmp_path: Path) -> None:
    assert tune.geometric([1e-3, 2e-3, 4e-3, 8e-3])
    assert tune.geometric([4e-3, 1e-3, 2e-3, 2e-3])  # order and repeats do not matter
    assert tune.geometric([1.0, 1.5, 2.25])  # equal ratios over a narrow range
    assert not tune.geometric([1.0, 1.5, 2.4])  # ratios 1.5 and 1.6: 7 % apart
    assert tune.geometric([1.0, 8.0])  # a factor of 8
    assert not tune.geometric([0.3, 0.5, 0.7, 1.0])
    assert not tune.geometric([1.0, 2.0, 3.0, 4.0])
    assert not tune.geometric([0.0, 1e-3, 1e-2, 1e-1]) and not tune.geometric([1e-3])
    # and the plot follows it
    for name, lrs, scale in [("g", LRS, "log"), ("l", ("0.3", "0.5", "0.7", "1.0"), "linear")]:
        for lr in lrs:
            write_vision_run(tmp_path / name / lr, "ring", [100.0], [0.5],
                             overrides=[f"outer.lr={lr}"])  # fmt: skip
        plot = tune.tune_plot(tune.tune_runs(_runs(tmp_path / name), "outer.lr"))
        try:
            (ax,) = plot.figure.axes
            assert ax.get_xscale() == scale
            assert [t.get_text() for t in ax.get_xticklabels()] == list(lrs)
        finally:
            import matplotlib.pyplot as plt

            plt.close(plot.figure)
    assert tune.plot_name("outer.lr") == "tune_outer_lr.png"


def test_module_runs_as_a_script_with_stderr_clean(tmp_path: Path) -> None:
    # as tune.sh calls it, from the repository root: no warning of runpy may reach stderr
    _vision(tmp_path, topologies=("ring",))
    done = subprocess.run(
        [sys.executable, "-m", "experiments.report.tune", str(tmp_path), "--key", "optim.lr",
         "--best"],
        capture_output=True, text=True, check=False, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "4e-3\n", "")


def test_report_markdown_is_the_tuned_report_without_any_file(tmp_path: Path) -> None:
    sweep, out = _vision(tmp_path / "sweep"), tmp_path / "report"
    text = report.report_markdown([sweep], out=out, tune="optim.lr")
    assert not out.exists()
    assert "![Final eval/acc against optim.lr](tune_optim_lr.png)" in text
    assert report.build_report([sweep], out=out, tune="optim.lr").read_text() == text
