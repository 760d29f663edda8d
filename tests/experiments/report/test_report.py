"""Report over a small sweep of single-seed vision runs written as training writes them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from experiments import report
from experiments.report import plots
from tests.experiments.report.common import VISION_PLOTS, table, write_vision_run


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Seven single-seed runs without ``.hydra`` (the summary tells them apart), two broken."""
    root = tmp_path / "multirun" / "2024-01-01" / "12-00-00"
    write_vision_run(root / "0", "allreduce", [1000, 1200], [0.80, 0.91, 0.95])
    write_vision_run(root / "1", "complete", [1200, 1220], [0.85, 0.93, 0.96], [1e-3, 5e-4, 2.5e-4])
    write_vision_run(root / "2", "ring", [1600, 1700], [0.50, 0.70, 0.85], [4e-3, 2e-3, 1e-3])
    write_vision_run(
        root / "3", "one-peer-exp", [1375, 1375], [0.92, 0.93, 0.94], [2e-3, 1e-3, 6e-4]
    )
    # Emulated Ethernet: compared only with the allreduce run on the same network.
    write_vision_run(root / "4", "allreduce", [500, 500], [0.8, 0.9, 0.95], network="ethernet_25g")
    write_vision_run(root / "5", "ring", [800, 800], [0.8, 0.9, 0.91], [1e-3, 1e-3, 1e-3],
                     network="ethernet_25g")  # fmt: skip
    # Synthetic data, no allreduce to compare with.
    write_vision_run(root / "6", "one-peer-exp", [900, 900], [0.3, 0.4, 0.5], [1e-2, 1e-2, 1e-2],
                     dataset="synthetic", synthetic=True)  # fmt: skip
    # A malformed line in an otherwise good run: the line is skipped, the run kept.
    with (root / "2" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 99, "train/loss": \n')
    # Broken runs: skipped with a warning.
    (root / "7").mkdir()
    (root / "7" / "metrics.jsonl").write_text("not json\n{]\n")
    write_vision_run(root / "8", "ring", [1.0], [0.1])
    (root / "8" / "metrics.jsonl").write_text("")
    return root


def _rows(text: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """Configuration rows keyed by (name, world size, dataset)."""
    rows = table(text.split("## Runs")[0])
    return {(r["configuration"], r["world size"], r["dataset"]): r for r in rows}


def test_report_rows_skipped_runs_and_plots(sweep: Path) -> None:
    with pytest.warns(UserWarning) as record:
        path = report.build_report([sweep], target_acc=0.9)
    assert path == sweep / "report.md"
    messages = [str(w.message) for w in record]
    assert any("skipping run" in m and m.split(": ")[0].endswith("7") for m in messages)
    assert any("skipping run" in m and "8:" in m and "no valid line" in m for m in messages)
    assert any("skipped 1 malformed line(s)" in m for m in messages)

    text = path.read_text()
    rows = _rows(text)
    assert len(rows) == 7 and all(r["seeds"] == "1" for r in rows.values())
    ar = rows[("allreduce", "4", "digits")]
    assert [ar[k] for k in ("final eval/acc", "eval/acc_local", "time to acc 0.9", "samples/s",
                            "speedup vs allreduce", "consensus distance (mean)")] == [
        "0.9500", "0.9400", "20.0 s", "1100.0", "1.00x", "n/a"]  # fmt: skip
    complete = rows[("complete", "4", "digits")]
    # 1210 / 1100 = 1.10; consensus mean (1e-3 + 5e-4 + 2.5e-4) / 3, final 2.5e-4.
    assert list(complete.values())[6:] == [
        "20.0 s", "1210.0", "1.10x", "5.833e-04", "2.500e-04"]  # fmt: skip
    ring = rows[("ring", "4", "digits")]
    assert list(ring.values())[6:9] == ["not reached", "1650.0", "1.50x"]  # 1650 / 1100
    ope = rows[("one-peer-exp", "4", "digits")]
    assert list(ope.values())[6:9] == ["10.0 s", "1375.0", "1.25x"]  # 1375 / 1100
    # The emulated ring is compared with the emulated allreduce: 800 / 500.
    emulated = " (emulated ethernet_25g)"
    assert rows[("allreduce" + emulated, "4", "digits")]["speedup vs allreduce"] == "1.00x"
    assert rows[("ring" + emulated, "4", "digits")]["speedup vs allreduce"] == "1.60x"
    synthetic = rows[("one-peer-exp (synthetic)", "4", "synthetic")]
    assert synthetic["speedup vs allreduce"] == "n/a"
    assert synthetic["time to acc 0.9"] == "not reached"
    assert "2 skipped" in text and "`" + str(sweep / "7") + "`" in text
    # nothing is lost: every run has its own row below, with its directory
    runs = table(text.split("## Runs")[1])
    assert sorted(r["dir"] for r in runs) == [f"`{i}`" for i in range(7)]
    assert {r["seed"] for r in runs} == {"0"}

    for name in VISION_PLOTS:
        data = (sweep / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 5000, name
        assert f"]({name})" in text
    assert not (sweep / "loss_vs_tokens.png").exists()


def test_consensus_plot_draws_exact_values_and_the_sketch_thin(sweep: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [r for r in map(report.load_run, report.find_run_dirs([sweep])) if r]
    figures = plots.vision_figures(report.make_section("vision", runs))
    drawn = figures["consensus"].drawn
    # every run with consensus values: its 3 exact values (one per evaluation) and its
    # 6 sketch values (one per metrics line); the allreduce runs logged neither here
    exact = sorted(d.label for d in drawn if d.key == "consensus/distance" and d.points == 3)
    sketch = sorted(
        d.label for d in drawn if d.key == "consensus/distance_sketch" and d.points == 6
    )
    assert len(exact) == 5 and exact == sketch
    assert len(drawn) == 10 and all(d.seeds == 1 for d in drawn)
    plots.save(figures, {k: sweep / f"{k}.png" for k in figures})


def test_report_markdown_writes_nothing_and_names_the_plots_as_drawn(
    sweep: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with warnings.catch_warnings():  # the two broken runs and the malformed line
        warnings.simplefilter("ignore")
        text = report.report_markdown([sweep], out=out, root=sweep.parent)
        assert not out.exists()
        assert "`12-00-00`; 2 skipped" in text and "- `12-00-00/7`: " in text
        path = report.build_report([sweep], out=out)
        assert path.read_text() == report.report_markdown([sweep], out=out)
        runs = [r for r in map(report.load_run, report.find_run_dirs([sweep])) if r]
    section = report.make_section("vision", runs)
    drawn = {key: figure.title for key, figure in plots.vision_figures(section).items()}
    assert plots.titles(section) == drawn
    assert drawn["throughput"] == "Mean training throughput"  # one seed each: no error bars


def test_report_into_another_dir_with_another_target(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = report.build_report([sweep / "0", sweep / "1"], target_acc=0.95, out=out)
    assert path == out / "report.md"
    rows = _rows(path.read_text())
    assert set(rows) == {("allreduce", "4", "digits"), ("complete", "4", "digits")}
    assert rows[("allreduce", "4", "digits")]["time to acc 0.95"] == "30.0 s"
    assert rows[("complete", "4", "digits")]["time to acc 0.95"] == "30.0 s"
    assert all((out / name).stat().st_size > 0 for name in VISION_PLOTS)
    assert not (sweep / "0" / "report.md").exists()


def test_configuration_labels_are_unique_and_name_the_network(sweep: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [r for r in map(report.load_run, report.find_run_dirs([sweep])) if r]
    section = report.make_section("vision", runs)
    assert [f.keys for f in section.factors] == [("topology",), ("dataset",), ("network",)]
    labels = [section.label(c) for c in section.configs]
    assert len(set(labels)) == len(labels) == 7
    assert "ring, digits, ethernet_25g" in labels and "allreduce, digits, ethernet_25g" in labels
    assert "one-peer-exp, digits, none" in labels and "one-peer-exp, synthetic, none" in labels


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
