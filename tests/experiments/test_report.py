"""Report over a small sweep written in the training loop's format, plus broken runs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from experiments import report
from experiments.train.logger import MetricsLogger

PLOTS = ("consensus_vs_step.png", "loss_vs_time.png", "acc_vs_epoch.png", "throughput.png")


def _write_run(
    run_dir: Path,
    topology: str,
    speeds: list[float],
    accs: list[float],
    consensus: list[float] | None = None,
    network: str = "none",
    dataset: str = "digits",
    synthetic: bool = False,
    world_size: int = 4,
) -> None:
    """Lines as the loop logs them (train lines, then an eval line per epoch) and its summary."""
    logger = MetricsLogger(run_dir)
    step = 0
    for epoch, acc in enumerate(accs, 1):
        for speed in speeds:
            step += 5
            line: dict[str, Any] = {
                "step": step,
                "epoch": epoch - 0.5,
                "time_s": 10.0 * epoch - 5.0,
                "train/loss": 2.0 / (step + 1),
                "train/lr": 0.1,
                "perf/samples_per_s": speed,
                "perf/step_s": 0.01,
                "comm/wait_s": 0.001,
            }
            if consensus is not None:  # the sketch estimate, on every metrics line
                line["consensus/distance_sketch"] = 1.1 * consensus[epoch - 1]
            logger.log(line)
        eval_line = {"step": step, "epoch": float(epoch), "time_s": 10.0 * epoch,
                     "eval/acc": acc, "eval/acc_local": acc - 0.01, "eval/loss": 1 - acc}  # fmt: skip
        if consensus is not None:
            eval_line["consensus/distance"] = consensus[epoch - 1]
        logger.log(eval_line)
    logger.close()
    summary = {
        "topology": topology,
        "world_size": world_size,
        "train/steps": step,
        "eval/acc": accs[-1],
        "eval/acc_local": accs[-1] - 0.01,
        "perf/samples_per_s": sum(speeds) / len(speeds),  # every epoch logs the same speeds
        "consensus/distance": sum(consensus) / len(consensus) if consensus else None,
        "wall_time_s": 10.0 * len(accs) + 1,
        "dataset": dataset,
        "model": "small_cnn",
        "optim": "sgd",
        "network": network,
        "emulated": network != "none",
        "synthetic": synthetic,
        "restarts": 0,
        "resumed_from_step": None,
        "seed": 0,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun" / "2024-01-01" / "12-00-00"
    _write_run(root / "0", "allreduce", [1000, 1200], [0.80, 0.91, 0.95])
    _write_run(root / "1", "complete", [1200, 1220], [0.85, 0.93, 0.96], [1e-3, 5e-4, 2.5e-4])
    _write_run(root / "2", "ring", [1600, 1700], [0.50, 0.70, 0.85], [4e-3, 2e-3, 1e-3])
    _write_run(root / "3", "one-peer-exp", [1375, 1375], [0.92, 0.93, 0.94], [2e-3, 1e-3, 6e-4])
    # Emulated Ethernet: compared only with the allreduce run on the same network.
    _write_run(root / "4", "allreduce", [500, 500], [0.8, 0.9, 0.95], network="ethernet_25g")
    _write_run(root / "5", "ring", [800, 800], [0.8, 0.9, 0.91], [1e-3, 1e-3, 1e-3],
               network="ethernet_25g")  # fmt: skip
    # Synthetic data, no allreduce to compare with.
    _write_run(root / "6", "one-peer-exp", [900, 900], [0.3, 0.4, 0.5], [1e-2, 1e-2, 1e-2],
               dataset="synthetic", synthetic=True)  # fmt: skip
    # A malformed line in an otherwise good run: the line is skipped, the run kept.
    with (root / "2" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 99, "train/loss": \n')
    # Broken runs: skipped with a warning.
    (root / "7").mkdir()
    (root / "7" / "metrics.jsonl").write_text("not json\n{]\n")
    _write_run(root / "8", "ring", [1.0], [0.1])
    (root / "8" / "metrics.jsonl").write_text("")
    return root


def _table(text: str) -> dict[tuple[str, str, str], list[str]]:
    """Rows of the report's table keyed by (run name, world size, dataset)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| run ") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], cells[1], cells[2])] = cells
    return rows


def test_report_rows_skipped_runs_and_plots(sweep: Path) -> None:
    with pytest.warns(UserWarning) as record:
        path = report.build_report([sweep], target_acc=0.9)
    assert path == sweep / "report.md"
    messages = [str(w.message) for w in record]
    assert any("skipping run" in m and m.split(": ")[0].endswith("7") for m in messages)
    assert any("skipping run" in m and "8:" in m and "no valid line" in m for m in messages)
    assert any("skipped 1 malformed line(s)" in m for m in messages)

    text = path.read_text()
    rows = _table(text)
    assert len(rows) == 7
    # columns: run, n, dataset, acc, acc_local, time to target, samples/s, speedup, cons mean, final
    ar = rows[("allreduce", "4", "digits")]
    assert ar[3:9] == ["0.9500", "0.9400", "20.0 s", "1100.0", "1.00x", "n/a"]
    complete = rows[("complete", "4", "digits")]
    # 1210 / 1100 = 1.10; consensus mean (1e-3 + 5e-4 + 2.5e-4) / 3, final 2.5e-4.
    assert complete[5:11] == ["20.0 s", "1210.0", "1.10x", "5.833e-04", "2.500e-04", "`1`"]
    ring = rows[("ring", "4", "digits")]
    assert ring[5:8] == ["not reached", "1650.0", "1.50x"]  # 1650 / 1100
    ope = rows[("one-peer-exp", "4", "digits")]
    assert ope[5:8] == ["10.0 s", "1375.0", "1.25x"]  # 1375 / 1100
    # The emulated ring is compared with the emulated allreduce: 800 / 500.
    assert rows[("allreduce (emulated ethernet_25g)", "4", "digits")][7] == "1.00x"
    assert rows[("ring (emulated ethernet_25g)", "4", "digits")][7] == "1.60x"
    synthetic = rows[("one-peer-exp (synthetic)", "4", "synthetic")]
    assert synthetic[7] == "n/a" and synthetic[5] == "not reached"
    assert "2 skipped" in text and "`" + str(sweep / "7") + "`" in text

    for name in PLOTS:
        data = (sweep / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 5000, name
        assert f"]({name})" in text


def test_consensus_plot_draws_exact_points_and_the_sketch_thin(
    sweep: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plotted: dict[str, list[tuple[str, str, int]]] = {}
    line_plot = report._line_plot

    def recording(runs: Any, x: str, y: str, *args: Any, **kwargs: Any) -> Any:
        plotted[y] = line_plot(runs, x, y, *args, **kwargs)
        return plotted[y]

    monkeypatch.setattr(report, "_line_plot", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report.build_report([sweep])
    drawn = plotted["consensus/distance"]
    # every run with consensus values: its 3 exact points (one per evaluation) and its
    # 6 sketch points (one per metrics line); the allreduce runs logged neither here
    exact = sorted(label for label, key, n in drawn if key == "consensus/distance" and n == 3)
    sketch = sorted(
        label for label, key, n in drawn if key == "consensus/distance_sketch" and n == 6
    )
    assert len(exact) == 5 and exact == sketch
    assert len(drawn) == 10


def test_report_into_another_dir_with_another_target(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = report.build_report([sweep / "0", sweep / "1"], target_acc=0.95, out=out)
    assert path == out / "report.md"
    rows = _table(path.read_text())
    assert set(rows) == {("allreduce", "4", "digits"), ("complete", "4", "digits")}
    assert rows[("allreduce", "4", "digits")][5] == "30.0 s"
    assert rows[("complete", "4", "digits")][5] == "30.0 s"
    assert all((out / name).stat().st_size > 0 for name in PLOTS)
    assert not (sweep / "0" / "report.md").exists()


def test_plot_labels_are_unique_and_name_the_network(sweep: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [r for r in map(report.load_run, report.find_run_dirs([sweep])) if r is not None]
    report._plot_labels(runs)
    labels = [r.label for r in runs]
    assert len(set(labels)) == len(labels)
    assert "ring [ethernet_25g]" in labels and "allreduce [ethernet_25g]" in labels
    assert "one-peer-exp digits" in labels and "one-peer-exp synthetic" in labels


def test_cli_writes_the_report_and_exits_2_without_runs(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert report.main([str(sweep), "--target-acc", "0.5", "--out", str(tmp_path / "r")]) == 0
    assert "report.md" in capsys.readouterr().out
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main([str(empty)]) == 2
    assert "no usable run" in capsys.readouterr().err


@pytest.mark.parametrize("target", [0.0, 1.5, float("nan")])
def test_target_acc_outside_0_1_is_rejected(sweep: Path, target: float) -> None:
    with pytest.raises(ValueError, match="target_acc="):
        report.build_report([sweep], target_acc=target)
