"""What the scale simulation writes: markdown tables, CSV, JSON and log-log plots.

:func:`format_markdown` renders the rows of :func:`experiments.network.simulate.simulate`
(and the calibration and sensitivity tables, when there are any);
:func:`write_outputs` saves them with the CSV, the JSON (inputs, :data:`ASSUMPTIONS`,
calibration, rows) and one throughput plot per profile plus a consensus plot.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from experiments.network.sim_config import ALLREDUCE, Profile, monte_carlo, profiles
from experiments.report.doc_data import md_table

__all__ = ["ASSUMPTIONS", "format_calibration", "format_markdown", "write_outputs"]

ASSUMPTIONS = (
    "a step is compute_s long on average: (1 - backward_frac) of it forward, optimizer and "
    "data, then the backward, during which buckets (bucket_mb MiB; torch DDP's first is "
    "ddp_first_bucket_mb) become ready in proportion to their bytes",
    "every worker's step is scaled each step by a random factor of mean 1 (jitter): the "
    "Monte Carlo runs mc.steps steps after mc.warmup, with seed mc.seed",
    "a collective over k ranks is a ring (NCCL's choice for large buckets): collective_ms "
    "per call, 2(k-1) hops of latency (network hops where the ring leaves a node, intra-node "
    "hops otherwise), and 2(k-1)/k * bytes through each NIC at efficiency * line rate",
    "one NIC per node (local_world_size workers share it): f node-spanning groups on one NIC "
    "in a round get B/f each, and a NIC serves transfers first come, first served",
    "allreduce (torch DDP): a bucket's all-reduce starts when the slowest worker has it ready; "
    "the step ends when the last one is done, so only the backward overlaps communication",
    "gossip (the wrapper): at bucket j's hook a worker waits for bucket j's gossip of the "
    "previous step, then launches this step's; a gossip starts when its whole group has "
    "launched it, so it overlaps the rest of this step and the next forward",
    "throughput = n * batch_size / t; speedup = t_allreduce / t_topology",
    "per-step consensus rate = 1 - contraction^(1/period), contraction = "
    "||W(P-1)...W(0) - 11^T/n||_2 (1 when a period reaches exact consensus)",
)


def _fmt_rate(value: float) -> str:
    if value >= 1e5:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _pct(err: float) -> str:
    """A signed percentage; rounding noise of a fitted point prints as +0.0%."""
    return f"{(err if abs(err) >= 5e-5 else 0.0):+.1%}"


def _ratios(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Measured and predicted all-reduce/topology ratios per (profile, n)."""
    out = []
    for prof in dict.fromkeys(r["profile"] for r in rows):
        for n in dict.fromkeys(r["n"] for r in rows if r["profile"] == prof):
            sub = [r for r in rows if r["profile"] == prof and r["n"] == n]
            ar = [r for r in sub if r["method"] == ALLREDUCE]
            for r in sub:
                if r["method"] == ALLREDUCE or not ar:
                    continue
                meas = ar[0]["measured_ms"] / r["measured_ms"]
                pred = ar[0]["predicted_ms"] / r["predicted_ms"]
                ratios = [f"{meas:.2f}x", f"{pred:.2f}x", _pct(pred / meas - 1)]
                out.append([prof, str(n), f"allreduce / {r['method']}", *ratios, "ratio"])
    return out


def format_calibration(rows: Sequence[dict[str, Any]], cfg: Any) -> str:
    """The table of predicted against measured step times (the output's first section)."""
    title = cfg.get("title") or "Calibration"
    cells = []
    for r in rows:
        role = r["role"]
        if role == "fitted":
            role = f"fitted: efficiency {r['efficiency']:.3f}"
        times = [f"{r['measured_ms']:.1f}", f"{r['predicted_ms']:.1f}", _pct(r["error"])]
        cells.append([r["profile"], str(r["n"]), r["method"], *times, role])
    cells += _ratios(rows)
    header = ["profile", "n", "method", "measured (ms)", "predicted (ms)", "error", "role"]
    lines = [
        f"# {title}",
        "",
        md_table(header, ["---", "---:", "---", "---:", "---:", "---:", "---"], cells),
    ]
    predicted = [r for r in rows if r["role"] == "predicted"]
    if predicted:
        worst = max(predicted, key=lambda r: abs(r["error"]))
        within = sum(abs(r["error"]) <= 0.2 for r in predicted)
        lines += [
            "",
            f"{within} of {len(predicted)} predicted points within 20%; the largest error is "
            f"{worst['error']:+.1%} ({worst['profile']}, {worst['method']}).",
        ]
    return "\n".join(lines) + "\n"


def _format_sensitivity(variants: Sequence[dict[str, Any]]) -> list[str]:
    if not variants:
        return []
    first: list[dict[str, Any]] = next((v["rows"] for v in variants if v["rows"]), [])
    heads = [f"{r['profile']} {r['method']}" for r in first]
    rows: list[list[str | None]] = []
    for v in variants:
        if v["error"]:
            rows.append([v["label"], f"no fit: {v['error']}", *[None] * len(heads)])
            continue
        eff = next((r["efficiency"] for r in v["rows"] if r["role"] == "fitted"), None)
        cells = [_pct(r["error"]) + (" (fit)" if r["role"] == "fitted" else "") for r in v["rows"]]
        rows.append([v["label"], f"{eff:.3f}" if eff is not None else "-", *cells])
    return [
        "",
        "## Sensitivity: errors (predicted/measured - 1) when one input changes",
        "",
        md_table(
            ["variant", "fitted efficiency", *heads], ["---", "---:", *["---:"] * len(heads)], rows
        ),
    ]


def _inputs(cfg: Any, profs: Sequence[Profile]) -> list[str]:
    lines = [
        f"Model `{cfg.get('model')}`: {float(cfg.get('model_bytes')) / 1e6:.1f} MB per exchange, "
        f"batch {cfg.get('batch_size')} per worker"
        f"{' (compute measured on this CPU)' if cfg.get('measured') else ''}; "
        f"buckets of {cfg.get('bucket_mb', 25)} MiB (torch DDP's first: "
        f"{cfg.get('ddp_first_bucket_mb', 1)} MiB); Monte Carlo {monte_carlo(cfg).steps} steps, "
        f"seed {monte_carlo(cfg).seed}."
        + (
            f" Gossip compressed to {float(cfg.get('compression_ratio'))}x of these bytes "
            "(the all-reduce is not)."
            if float(cfg.get("compression_ratio", 1.0)) != 1.0
            else ""
        ),
        "",
    ]
    header = ["profile", "network", "efficiency", "per-call latency", "hop latency", "compute"]
    header += ["backward", "jitter", "per node", "intra-node"]
    rows = []
    for p in profs:
        net, intra = p.network, p.intra
        fit = " (fitted)" if p.fit else ""
        link = [f"{net.bandwidth_gbps:g} Gb/s", f"{net.efficiency:.3f}{fit}"]
        link += [f"{net.collective_ms:g} ms", f"{net.latency_ms:g} ms"]
        step = [f"{p.compute_s * 1e3:.1f} ms", f"{p.backward_frac:.0%}"]
        step += [f"{p.jitter.kind} cv {p.jitter.cv:g}", str(p.local_world_size)]
        node = f"{intra.name} {intra.bandwidth_gbps:g} Gb/s, {intra.latency_ms:g} ms"
        rows.append([p.label, *link, *step, node])
    align = ["---", "---", "---:", "---:", "---:", "---:", "---:", "---", "---:", "---"]
    return [*lines, md_table(header, align, rows)]


def format_markdown(
    rows: Sequence[dict[str, Any]],
    cfg: Any,
    profs: Sequence[Profile] | None = None,
    calibration: Sequence[dict[str, Any]] = (),
    variants: Sequence[dict[str, Any]] = (),
) -> str:
    """Markdown: calibration (if any), inputs, assumptions, a table per profile, consensus."""
    profs = profs if profs is not None else profiles(cfg)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    topologies = [m for m in methods if m != ALLREDUCE]
    lines = []
    if calibration:
        lines += [format_calibration(calibration, cfg).rstrip(), *_format_sensitivity(variants), ""]
    lines += [
        "# Scale simulation: all-reduce vs gossip topologies",
        "",
        *_inputs(cfg, profs),
        "",
        "Assumptions:",
        "",
        *[f"- {a}" for a in ASSUMPTIONS],
    ]
    for profile in dict.fromkeys(r["profile"] for r in rows):
        sub = [r for r in rows if r["profile"] == profile]
        lat, bw = sub[0]["latency_ms"], sub[0]["bandwidth_gbps"]
        table = []
        for n in dict.fromkeys(r["n"] for r in sub):
            cells = []
            by_method = {r["method"]: r for r in sub if r["n"] == n}
            for m in methods:
                r = by_method[m]
                if not r["fits"]:
                    cells.append("n/a")
                else:
                    speed = f" ({r['speedup_vs_allreduce']:.2f}x)" if m != ALLREDUCE else ""
                    cells.append(f"{_fmt_rate(r['samples_per_s'])}{speed}")
            table.append([str(n), str(by_method[ALLREDUCE]["nodes"]), *cells])
        lines += [
            "",
            f"## {profile} ({bw:g} Gb/s per node, {lat:g} ms): samples/s (speedup vs allreduce)",
            "",
            md_table(["n", "nodes", *methods], ["---:", "---:", *["---:"] * len(methods)], table),
        ]
    first = next(iter(dict.fromkeys(r["profile"] for r in rows)))
    spectral = [r for r in rows if r["profile"] == first and r["method"] != ALLREDUCE]
    consensus = []
    reasons: dict[str, str] = {}
    for n in dict.fromkeys(r["n"] for r in spectral):
        cells = []
        for m in topologies:
            r = next(x for x in spectral if x["n"] == n and x["method"] == m)
            if not r["fits"]:
                cells.append("n/a")
                reasons.setdefault(m, r["reason"])
            elif r["rate_per_step"] is None:
                cells.append(f"not computed [{r['period']}]")
            else:
                cells.append(f"{r['rate_per_step']:.3g} [{r['period']}]")
        consensus.append([str(n), *cells])
    lines += [
        "",
        "## Consensus: per-step rate 1 - contraction^(1/period) (period in brackets)",
        "",
        md_table(["n", *topologies], ["---:", *["---:"] * len(topologies)], consensus),
    ]
    if reasons:
        lines += ["", "n/a: the topology does not fit that size, e.g.:"]
        lines += [f"- {m}: {why}" for m, why in reasons.items()]
    return "\n".join(lines) + "\n"


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINES = ("-", "--", "-.", ":")


def _style(i: int, method: str) -> dict[str, Any]:
    """Distinct marker, dash and size per line: equal curves stay visible on top of each other."""
    if method == ALLREDUCE:
        return {"color": "black", "linestyle": "--", "marker": "o", "markersize": 4}
    return {
        "linestyle": _LINES[i % len(_LINES)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "markersize": max(3.0, 9.0 - 1.5 * i),
        "fillstyle": "none",
    }


def _loglog(
    rows: Sequence[dict[str, Any]],
    methods: Sequence[str],
    y: str,
    ylabel: str,
    title: str,
    path: Path,
) -> Path:
    """One line per method of ``y`` against ``n`` on log-log axes, saved to ``path``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, m in enumerate(methods):
        pts = [(r["n"], r[y]) for r in rows if r["method"] == m and r[y]]
        if pts:
            ax.plot(*zip(*pts), label=m, **_style(i, m))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers n")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    written = [
        _loglog(
            [r for r in rows if r["profile"] == profile and r["fits"]],
            methods,
            "samples_per_s",
            "throughput (samples/s)",
            f"Simulated throughput, {profile}",
            out / f"throughput_{profile}.png",
        )
        for profile in dict.fromkeys(r["profile"] for r in rows)
    ]
    first = rows[0]["profile"]
    written.append(
        _loglog(
            [r for r in rows if r["profile"] == first],
            methods,
            "rate_per_step",
            "per-step consensus rate 1 - contraction^(1/period)",
            "Mixing speed of each topology (1 = exact consensus once per period)",
            out / "consensus_rate.png",
        )
    )
    return written


def write_outputs(
    rows: Sequence[dict[str, Any]],
    cfg: Any,
    out: str | Path,
    markdown: str | None = None,
    calibration: Sequence[dict[str, Any]] = (),
) -> list[Path]:
    """Write ``simulate.md``, ``simulate.csv``, ``simulate.json`` and the PNG plots to ``out``.

    Returns:
        The paths written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "simulate.md"
    md.write_text(markdown if markdown is not None else format_markdown(rows, cfg))
    fields = list(rows[0])
    csv_path = out / "simulate.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    plain_cfg = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    js = out / "simulate.json"
    payload = {
        "inputs": plain_cfg,
        "assumptions": ASSUMPTIONS,
        "calibration": list(calibration),
        "rows": rows,
    }
    js.write_text(json.dumps(payload, indent=1))
    return [md, csv_path, js, *_plots(rows, out)]
