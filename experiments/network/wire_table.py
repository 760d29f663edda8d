"""The measured table of :mod:`experiments.network.wire_study`: the wire beside both models of it.

For every (model, hosts x processes, link rate, arm) it shows what the testbed
measured (median step time after the first window, samples or tokens per
second, the link's bytes per step and host, time to a target loss) and the
step time that the emulator (``network=custom`` on loopback at the same rate)
and the scale simulator (:func:`experiments.network.sim_validate.predict`, fed
the compute-only run's step time and jitter) predict, each with its ratio to
the wire. A ratio outside [0.8, 1.2] is flagged: the model misses the wire by
more than 20% of the measured step time there. Each model appears twice: at the line rate alone, and
calibrated with the terms :mod:`experiments.network.calibrate` measured on the
testbed's pair exchanges (``calibration.json``); the calibrated emulator's runs
are kept as ``calibrated/`` beside ``emulated/``.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from experiments.network import calibrate
from experiments.network.testbed import parse_rate
from experiments.report.doc_data import md_table

__all__ = ["read_run", "rows", "write_table"]

SIMULATED = ("allreduce", "complete", "ring", "one-peer-exp", "alternating-exp-ring", "local-sgd")
TOLERANCE = 0.2
LOCAL_SGD_PERIOD = 8  # the wire study's local-sgd arm


def read_run(path: Path) -> dict[str, Any] | None:
    """A kept run's summary, metrics lines and median step time; ``None`` if it did not finish."""
    try:
        summary = json.loads((path / "summary.json").read_text())
        raw = (path / "metrics.jsonl").read_text().splitlines()
    except (OSError, ValueError):
        return None
    lines = [json.loads(x) for x in raw if x]
    steps = [x["perf/step_s"] for x in lines if "perf/step_s" in x][1:]  # the first warms up
    return {
        "summary": summary,
        "lines": lines,
        "step_s": statistics.median(steps) if steps else None,
        "step_cv": statistics.pstdev(steps) / statistics.mean(steps) if len(steps) > 1 else 0.0,
    }


def loss_curve(run: dict[str, Any]) -> list[tuple[float, float]]:
    """(training seconds, train loss) at every metrics window: wall time spent in steps."""
    out, t, last = [], 0.0, 0
    for line in run["lines"]:
        if "perf/step_s" in line and "train/loss" in line:
            t += line["perf/step_s"] * (line["step"] - last)
            last = line["step"]
            out.append((t, line["train/loss"]))
    return out


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first time the curve is at or below ``target``."""
    return next((t for t, loss in curve if loss <= target), None)


def _simulate(arm: str, n: int, pph: int, compute: dict[str, Any], model_bytes: float,
              rate_bps: int, terms: dict[str, float] | None = None,
              sent_per_step: float | None = None) -> float | None:  # fmt: skip
    """The simulator's step time; with ``terms``, calibrated (see :mod:`.calibrate`).

    The calibrated compute time grows by the CPU that every rank's bytes cost,
    shared by the machine's cores: ``comm_cpu_ms_per_mb * sent * n / cores``.
    """
    if arm not in SIMULATED or compute["step_s"] is None or pph != 1:
        return None
    from experiments.network import sim_validate

    facts = {"model_bytes": model_bytes, "backward_frac": 0.6}
    kwargs = {"period": LOCAL_SGD_PERIOD} if arm == "local-sgd" else None
    extra: dict[str, float] = {}
    latency_ms = calibrate.VETH_LATENCY_MS
    if terms is not None:  # latency 0: the fitted collective_ms holds it
        latency_ms = terms["latency_ms"]
        cpu = terms["comm_cpu_ms_per_mb"] * 1e-3 * (sent_per_step or 0.0) / 1e6 * n / terms["cores"]
        extra = {"efficiency": terms["efficiency"], "collective_ms": terms["collective_ms"],
                 "comm_cpu_s": cpu}  # fmt: skip
    return sim_validate.predict(arm, n, compute["step_s"], compute["step_cv"], facts,
                                rate_bps / 1e9, latency_ms, 25.0, steps=200,
                                topology_kwargs=kwargs, **extra)  # fmt: skip


def rows(out: Path) -> list[dict[str, Any]]:
    """One row per kept run, with the emulator's and the simulator's predictions beside it."""
    result: list[dict[str, Any]] = []
    calib = calibrate.load(out)
    for shape in sorted((out / "runs").glob("*/*")):
        model, (hosts, pph) = shape.parent.name, map(int, shape.name.split("x"))
        compute = read_run(shape / "compute")
        for rate_dir in sorted(p for p in shape.iterdir() if p.name != "compute"):
            rate_bps = parse_rate(rate_dir.name)
            runs = {a.name: read_run(a / "wire") for a in sorted(rate_dir.iterdir())}
            model_bytes = max((r["summary"]["comm/peak_bytes_per_step"] for a, r in runs.items()
                               if r and a in ("ring", "one-peer-exp")), default=math.nan)  # fmt: skip
            curves = {a: loss_curve(r) for a, r in runs.items() if r}
            target = max((min(loss for _, loss in c) for c in curves.values() if c), default=None)
            for arm, run in runs.items():
                row: dict[str, Any] = {"model": model, "hosts": hosts, "procs_per_host": pph,
                                       "rate": rate_dir.name, "rate_bps": rate_bps, "arm": arm}  # fmt: skip
                if run is None:
                    result.append({**row, "failed": True})
                    continue
                s, wire = run["summary"], run["summary"].get("wire", {})
                # repeats of the cell on the wire (``out/repeats/*/runs/...``): the median of all
                rel = rate_dir.relative_to(out / "runs") / arm / "wire"
                steps = [run["step_s"], *(r["step_s"] for p in sorted((out / "repeats").glob(f"*/runs/{rel}"))
                                          if (r := read_run(p)) and r["step_s"] is not None)]  # fmt: skip
                row.update(
                    step_s=statistics.median(steps) if None not in steps else run["step_s"],
                    wire_runs=len(steps),
                    step_min_s=min(steps) if None not in steps else None,
                    step_max_s=max(steps) if None not in steps else None,
                    samples_per_s=s.get("perf/samples_per_s"),
                    tokens_per_s=s.get("perf/tokens_per_s"),
                    wire_bytes_per_step=wire.get("tx_bytes_per_step"),
                    lib_bytes_per_step=s.get("comm/bytes_per_step"),
                    drops=wire.get("drops"),
                    target_loss=target,
                    time_to_target_s=None if target is None else time_to(curves[arm], target),
                    final_loss=s.get("train/loss"),
                )
                for k in ("emulated", "calibrated"):
                    emu = read_run(rate_dir / arm / k)
                    row[f"{k}_step_s"] = emu["step_s"] if emu else None
                if compute is not None:
                    row["simulated_step_s"] = _simulate(arm, hosts * pph, pph, compute,
                                                        model_bytes, rate_bps)  # fmt: skip
                    if calib is not None:
                        terms = calibrate.simulator_terms(calib, rate_bps)
                        row["simulated_cal_step_s"] = _simulate(
                            arm, hosts * pph, pph, compute, model_bytes, rate_bps, terms,
                            s.get("comm/bytes_per_step"))  # fmt: skip
                for k in MODELS:
                    pred, meas = row.get(f"{k}_step_s"), row["step_s"]
                    row[f"{k}_ratio"] = pred / meas if pred and meas else None
                result.append(row)
    return result


MODELS = ("emulated", "calibrated", "simulated", "simulated_cal")
MODEL_TITLES = ("emulated", "emulated, calibrated", "simulated", "simulated, calibrated")


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def within(ratio: float) -> bool:
    """A prediction within ``TOLERANCE`` of the measured step time: ``|ratio - 1| <= 0.2``."""
    return abs(ratio - 1) <= TOLERANCE + 1e-12


def _ratio(v: float | None) -> str:
    if v is None:
        return "–"
    flag = "" if within(v) else " **miss**"
    return f"{v:.2f}{flag}"


def markdown(table: list[dict[str, Any]]) -> str:
    """The table as markdown, one section per model and shape."""
    # calibration.md sits beside the table only where its runs were calibrated
    calibrated = any(r.get(f"{k}_step_s") is not None for r in table for k in MODELS[1::2])
    lines = ["# Measured on the wire", "",
             "Generated by `python -m experiments.network.wire_study table` from `runs/`.",
             "Step time: median `perf/step_s` after the first window (of every run, where a cell was "
             "measured again under `repeats/`: their count and range beside it; samples/s is the first run's). Wire bytes: what each host's "
             "link sent per training step (kernel counters), beside the library's `comm/bytes_per_step`. "
             "Predictions: emulator (`network=custom` on loopback, same rate) and simulator; "
             f"ratio = predicted / measured step time, **miss** outside ±{TOLERANCE:.0%}. "
             "Calibrated: with the terms measured on the testbed's pair exchanges "
             + ("([calibration.md](calibration.md))." if calibrated else "(none for these runs)."),
             ""]  # fmt: skip
    header = ["rate", "arm", "step s", "samples/s", "wire B/step", "lib B/step", "drops"]
    header += ["time to loss", *(f"{t} s (ratio)" for t in MODEL_TITLES)]
    keys = sorted({(r["model"], r["hosts"], r["procs_per_host"]) for r in table})
    for model, hosts, pph in keys:
        cells: list[list[str | None]] = []
        for r in sorted((r for r in table if (r["model"], r["hosts"], r["procs_per_host"]) == (model, hosts, pph)),
                        key=lambda r: (r["rate_bps"], r["arm"])):  # fmt: skip
            if r.get("failed"):
                cells.append([r["rate"], r["arm"], "failed", *[None] * (5 + len(MODELS))])
                continue
            ttl = (f"{_fmt(r['time_to_target_s'], '.1f')} s to {r['target_loss']:.3f}"
                   if r["target_loss"] is not None else "–")  # fmt: skip
            step = _fmt(r["step_s"])
            if r.get("wire_runs", 1) > 1:
                step += f" ({r['wire_runs']} runs, {r['step_min_s']:.3f}-{r['step_max_s']:.3f})"
            sent = [_fmt(r[f"{k}_bytes_per_step"], ",.0f") for k in ("wire", "lib")]
            measured = [step, _fmt(r["samples_per_s"], ".0f"), *sent, _fmt(r["drops"], "d"), ttl]
            models = [
                f"{_fmt(r.get(f'{k}_step_s'))} ({_ratio(r.get(f'{k}_ratio'))})" for k in MODELS
            ]
            cells.append([r["rate"], r["arm"], *measured, *models])
        lines += [
            f"## {model}, {hosts} hosts x {pph} process{'es' if pph > 1 else ''}",
            "",
            md_table(header, ["---", "---", *["---:"] * (6 + len(MODELS))], cells),
            "",
        ]
    counts = []
    for k, title in zip(MODELS, MODEL_TITLES):
        ratios = [r[f"{k}_ratio"] for r in table if r.get(f"{k}_ratio") is not None]
        counts.append([title, str(sum(within(v) for v in ratios)), str(len(ratios))])
    header = ["model", "cells within", "of"]
    lines += [
        "## Within 20% of the wire",
        "",
        md_table(header, ["---", "---:", "---:"], counts),
        "",
    ]
    return "\n".join(lines)


def plot(table: list[dict[str, Any]], out: Path) -> list[Path]:
    """Step time against link rate per arm (log-log), one figure per model and shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for model, hosts, pph in sorted({(r["model"], r["hosts"], r["procs_per_host"]) for r in table}):
        mine = [r for r in table if (r["model"], r["hosts"], r["procs_per_host"]) == (model, hosts, pph)
                and r.get("step_s")]  # fmt: skip
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for arm in sorted({r["arm"] for r in mine}):
            pts = sorted((r["rate_bps"] / 1e6, r["step_s"]) for r in mine if r["arm"] == arm)
            ax.plot(*zip(*pts), marker="o", label=arm)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link rate (Mb/s)")
        ax.set_ylabel("step time on the wire (s)")
        ax.set_title(f"{model}, {hosts} hosts x {pph}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        path = out / f"step_time_{model}_{hosts}x{pph}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def plot_loss(out: Path) -> list[Path]:
    """Train loss against training seconds on the wire, one panel per rate, a figure per model and shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for shape in sorted((out / "runs").glob("*/*")):
        rate_dirs = sorted((p for p in shape.iterdir() if p.is_dir() and p.name != "compute"),
                           key=lambda p: parse_rate(p.name))  # fmt: skip
        if not rate_dirs:
            continue
        arms = sorted({a.name for r in rate_dirs for a in r.iterdir() if a.is_dir()})
        color = {a: f"C{i % 10}" for i, a in enumerate(arms)}  # one colour per arm in every panel
        fig, axes = plt.subplots(
            1, len(rate_dirs), figsize=(3.6 * len(rate_dirs), 3.4), squeeze=False
        )
        for ax, rate_dir in zip(axes[0], rate_dirs):
            for arm_dir in sorted(p for p in rate_dir.iterdir() if p.is_dir()):
                run = read_run(arm_dir / "wire")
                curve = loss_curve(run) if run else []
                if curve:
                    ax.plot(*zip(*curve), marker=".", color=color[arm_dir.name], label=arm_dir.name)
            ax.set_title(f"{rate_dir.name}")
            ax.set_xlabel("seconds of training on the wire")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel("train loss")
        handles = [plt.Line2D([], [], color=color[a], marker=".", label=a) for a in arms]
        axes[0][-1].legend(handles=handles, fontsize=6)
        fig.suptitle(f"{shape.parent.name}, {shape.name.replace('x', ' hosts x ')}")
        fig.tight_layout()
        path = out / f"loss_vs_time_{shape.parent.name}_{shape.name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        made.append(path)
    return made


def write_table(out: Path) -> list[dict[str, Any]]:
    """``table.md``, ``table.json`` and the plots into ``out`` from ``out/runs``."""
    table = rows(out)
    (out / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    (out / "table.md").write_text(markdown(table) + "\n")
    plot(table, out)
    plot_loss(out)
    return table
