"""Scale simulation: all-reduce versus gossip topologies at 8 to 1024 workers.

``python -m experiments.simulate [--config conf/simulate.yaml] [--measure] [--out DIR]
[key=value ...]`` (or ``make simulate``) combines a compute time per step with the
network cost model of :mod:`experiments.netem` and the spectral analysis of
:mod:`decent_dp.topo`, and prints a markdown table per network profile. It also
writes ``simulate.md``, ``simulate.csv``, ``simulate.json`` and PNG plots to
``--out`` (default ``outputs/simulate/``). ``--measure`` replaces ``compute_s`` and
``model_bytes`` with the forward+backward time and parameter bytes of the config's
model, timed on this machine's CPU.

Model (printed with every result, see :data:`ASSUMPTIONS`):

* ``n`` workers, ``L`` per node; ranks ``r`` and ``s`` share a node when
  ``r // L == s // L``. Every collective is a ring over its members:
  ``2 (k-1)/k * S/B + 2 (k-1) a`` for ``k`` members, ``S`` bytes, bandwidth ``B``
  and latency ``a``. A group inside one node uses the intra-node profile; a
  group spanning nodes uses the network profile, its ring crosses each node's
  NIC once, and a NIC carrying ``f`` such groups at once gives each ``B / f``.
* all-reduce (torch DDP): one group of all ``n`` ranks. DDP overlaps the
  all-reduce with the backward pass only:
  ``t = compute + max(0, T_ar - backward_frac * compute)``.
* gossip (the wrapper): a round's gossip overlaps the whole next forward and
  backward, so round ``r`` costs ``max(compute, T_r)`` with ``T_r`` the slowest
  group of the round; ``t`` is the mean over the topology's period. ``complete``
  is one group of all ``n`` (an all-reduce, overlapped); pairs cost ``S/B + 2a``.
* throughput = ``n * batch_size / t`` samples/s; the speedup is the all-reduce's
  ``t`` over the topology's ``t``.
* consensus: ``contraction`` is ``||W(P-1)...W(0) - 11^T/n||_2`` over one period
  of ``P`` rounds and the per-step rate is ``1 - contraction^(1/P)`` (1 when a
  period reaches exact consensus; contractions below 1e-12 count as exact).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from decent_dp.topo import Edge, TopologyReg, period_contraction
from experiments.netem import NetworkProfile, profile_from_cfg, ring_allreduce_time

__all__ = [
    "ASSUMPTIONS",
    "DEFAULT_CONFIG",
    "load_config",
    "round_time",
    "allreduce_iteration_time",
    "gossip_iteration_time",
    "consensus_rate",
    "measure_compute",
    "simulate",
    "format_markdown",
    "write_outputs",
    "main",
]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "conf" / "simulate.yaml"
ALLREDUCE = "allreduce"
EXACT_CONTRACTION = 1e-12

ASSUMPTIONS = (
    "every collective is a ring over its k members: 2(k-1)/k * S/B + 2(k-1) * latency",
    "groups inside one node (rank // L equal) use the intra-node profile; groups spanning "
    "nodes use the network profile, and f such groups on one node share its NIC (B/f each)",
    "allreduce (torch DDP): t = compute + max(0, T_allreduce - backward_frac * compute), "
    "the all-reduce overlapping only the backward pass",
    "gossip: t = mean over the period's rounds of max(compute, T_round), each round's "
    "gossip overlapping the whole next forward+backward; T_round is its slowest group",
    "throughput = n * batch_size / t; speedup = t_allreduce / t_topology",
    "per-step consensus rate = 1 - contraction^(1/period), contraction = "
    "||W(P-1)...W(0) - 11^T/n||_2 (1 when a period reaches exact consensus)",
)


# --- configuration -------------------------------------------------------------------------


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Read the simulator's YAML and apply ``key=value`` overrides.

    Args:
        path: The YAML file; :data:`DEFAULT_CONFIG` when ``None``.
        overrides: OmegaConf dotlist entries, e.g. ``["compute_s=0.05"]``.

    Returns:
        The merged config.

    Raises:
        ValueError: Missing file, malformed override, or a key the file does not have.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ValueError(f"simulation config {str(path)!r} does not exist")
    base = OmegaConf.load(path)
    if not isinstance(base, DictConfig):
        raise ValueError(f"simulation config {str(path)!r} must be a mapping")
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is invalid; write key=value")
    OmegaConf.set_struct(base, True)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0]
        raise ValueError(f"bad override in {list(overrides)}: {first}") from None
    OmegaConf.set_struct(merged, False)
    assert isinstance(merged, DictConfig)
    return merged


def _number(cfg: Any, key: str, low: float, high: float = math.inf, integer: bool = False) -> Any:
    value: Any = cfg.get(key) if hasattr(cfg, "get") else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        bound = f"in [{low}, {high}]" if math.isfinite(high) else f">= {low}"
        raise ValueError(f"{key}={value!r} is invalid; it must be {kind} {bound}")
    return int(value) if integer else float(value)


def _intra_profile(cfg: Any) -> NetworkProfile:
    if cfg is None:
        raise ValueError("intra is missing; give {name, latency_ms, bandwidth_gbps}")
    return NetworkProfile(
        str(cfg.get("name", "intra")), cfg.get("latency_ms"), cfg.get("bandwidth_gbps")
    )


def _profiles(entries: Any) -> list[NetworkProfile]:
    if entries is None or isinstance(entries, str) or len(entries) == 0:
        raise ValueError(f"profiles={entries!r} is invalid; give a non-empty list of profiles")
    out = []
    for entry in entries:
        profile = profile_from_cfg(entry)
        if profile is None:
            raise ValueError("profile 'none' cannot be simulated; give a network profile")
        out.append(profile)
    return out


# --- cost model ----------------------------------------------------------------------------


def round_time(
    edges: Sequence[Edge],
    nbytes: float,
    local_world_size: int,
    network: NetworkProfile,
    intra: NetworkProfile,
) -> float:
    """Seconds for all groups of one round to finish (the slowest group).

    A group inside one node runs a ring over ``intra``; a group spanning nodes
    runs a ring over ``network`` at ``B / f``, where ``f`` is the largest
    number of node-spanning groups that use one of its nodes' NIC this round.

    Args:
        edges: The groups of the round.
        nbytes: Bytes every member averages.
        local_world_size: Workers per node ``L``.
        network: The inter-node profile (bandwidth per node).
        intra: The intra-node profile.

    Returns:
        Seconds.
    """
    nodes_of = [{r // local_world_size for r in e.ranks} for e in edges]
    flows: dict[int, int] = {}
    for nodes in nodes_of:
        if len(nodes) > 1:
            for node in nodes:
                flows[node] = flows.get(node, 0) + 1
    slowest = 0.0
    for edge, nodes in zip(edges, nodes_of):
        k = len(edge.ranks)
        if len(nodes) == 1:
            t = ring_allreduce_time(nbytes, k, intra)
        else:
            share = max(flows[node] for node in nodes)
            shared = NetworkProfile(
                network.name, network.latency_ms, network.bandwidth_gbps / share
            )
            t = ring_allreduce_time(nbytes, k, shared)
        slowest = max(slowest, t)
    return slowest


def allreduce_iteration_time(
    compute_s: float,
    backward_frac: float,
    nbytes: float,
    n: int,
    local_world_size: int,
    network: NetworkProfile,
    intra: NetworkProfile,
) -> tuple[float, float]:
    """Per-iteration seconds of torch DDP: ``compute + max(0, T_ar - backward_frac * compute)``.

    Returns:
        ``(t_iteration, T_allreduce)``.
    """
    t_ar = round_time([Edge(range(n), 1.0 / n)], nbytes, local_world_size, network, intra)
    return compute_s + max(0.0, t_ar - backward_frac * compute_s), t_ar


def gossip_iteration_time(
    rounds: Sequence[Sequence[Edge]],
    compute_s: float,
    nbytes: float,
    local_world_size: int,
    network: NetworkProfile,
    intra: NetworkProfile,
) -> tuple[float, float]:
    """Per-iteration seconds of gossip: the period's mean of ``max(compute, T_round)``.

    Returns:
        ``(t_iteration, mean T_round)``.
    """
    times = [round_time(edges, nbytes, local_world_size, network, intra) for edges in rounds]
    t_iter = sum(max(compute_s, t) for t in times) / len(times)
    return t_iter, sum(times) / len(times)


def consensus_rate(contraction: float, period: int) -> float:
    """Per-step rate ``1 - contraction^(1/period)``; 1 when the period reaches exact consensus."""
    if contraction < EXACT_CONTRACTION:
        return 1.0
    return 1.0 - contraction ** (1.0 / period)


# --- measurement ---------------------------------------------------------------------------


def measure_compute(cfg: Any) -> tuple[float, int]:
    """Time forward+backward of ``cfg.model`` on this machine's CPU.

    Args:
        cfg: The simulation config (``model``, ``batch_size`` and the ``measure`` section).

    Returns:
        ``(median seconds per step, parameter bytes)``.
    """
    import torch

    from experiments.models import build_model

    m = cfg.get("measure") or {}
    size = _number(m, "image_size", 1, integer=True)
    channels = _number(m, "in_channels", 1, integer=True)
    classes = _number(m, "num_classes", 1, integer=True)
    warmup = _number(m, "warmup", 0, integer=True)
    steps = _number(m, "steps", 1, integer=True)
    batch = _number(cfg, "batch_size", 1, integer=True)
    model = build_model(
        {"name": cfg.get("model")}, num_classes=classes, in_channels=channels, image_size=size
    )
    x = torch.randn(batch, channels, size, size)
    y = torch.randint(0, classes, (batch,))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return sorted(times)[len(times) // 2], nbytes


# --- the simulation ------------------------------------------------------------------------


def _spectral(name: str, n: int, local: int, max_n: int) -> dict[str, Any]:
    try:
        topo = TopologyReg.create(name, n, local)
    except ValueError as exc:
        return {"error": str(exc)}
    out: dict[str, Any] = {"topo": topo, "period": topo.period}
    if n <= max_n:
        contraction = period_contraction(topo.mixing_matrices())
        out["contraction"] = contraction
        out["rate_per_step"] = consensus_rate(contraction, topo.period)
    return out


def simulate(cfg: Any) -> list[dict[str, Any]]:
    """Per-iteration time and throughput of all-reduce and every topology.

    Args:
        cfg: A mapping with ``model_bytes``, ``compute_s``, ``backward_frac``,
            ``batch_size``, ``local_world_size``, ``world_sizes``, ``profiles``,
            ``intra``, optional ``topologies`` (``None`` = all registered) and
            ``spectral_max_n`` (see ``conf/simulate.yaml``).

    Returns:
        One row per (profile, n, method); ``method`` is ``allreduce`` or a
        topology name. Rows carry ``fits`` (False with ``reason`` where the
        topology does not fit ``n``), ``t_iter_s``, ``comm_s``,
        ``samples_per_s``, ``speedup_vs_allreduce``, and for topologies
        ``period``, ``contraction`` and ``rate_per_step``.

    Raises:
        ValueError: A missing or out-of-range input.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    nbytes = _number(cfg, "model_bytes", 1)
    compute = _number(cfg, "compute_s", 0)
    if compute <= 0:
        raise ValueError(f"compute_s={compute} is invalid; it must be > 0")
    backward_frac = _number(cfg, "backward_frac", 0, 1)
    batch = _number(cfg, "batch_size", 1, integer=True)
    local = _number(cfg, "local_world_size", 1, integer=True)
    max_n = _number(cfg, "spectral_max_n", 0, integer=True) if "spectral_max_n" in cfg else 1024
    sizes = cfg.get("world_sizes")
    if not sizes or isinstance(sizes, str):
        raise ValueError(f"world_sizes={sizes!r} is invalid; give a non-empty list of integers")
    sizes = [_number({"world_sizes": n}, "world_sizes", 1, integer=True) for n in sizes]
    profiles = _profiles(cfg.get("profiles"))
    intra = _intra_profile(cfg.get("intra"))
    names = cfg.get("topologies")
    names = list(TopologyReg.names()) if names is None else [str(x) for x in names]
    for name in names:
        TopologyReg.get(name)  # unknown names fail here, listing the known ones

    spectra = {(name, n): _spectral(name, n, local, max_n) for n in sizes for name in names}
    rows: list[dict[str, Any]] = []
    for profile in profiles:
        for n in sizes:
            base = {
                "profile": profile.name,
                "latency_ms": profile.latency_ms,
                "bandwidth_gbps": profile.bandwidth_gbps,
                "n": n,
                "nodes": math.ceil(n / local),
            }
            t_ar, comm_ar = allreduce_iteration_time(
                compute, backward_frac, nbytes, n, local, profile, intra
            )
            rows.append(
                {
                    **base,
                    "method": ALLREDUCE,
                    "fits": True,
                    "reason": "",
                    "t_iter_s": t_ar,
                    "comm_s": comm_ar,
                    "samples_per_s": n * batch / t_ar,
                    "speedup_vs_allreduce": 1.0,
                    "period": None,
                    "contraction": None,
                    "rate_per_step": None,
                }
            )
            for name in names:
                spec = spectra[(name, n)]
                row: dict[str, Any] = {**base, "method": name}
                if "error" in spec:
                    row.update(fits=False, reason=spec["error"], t_iter_s=None, comm_s=None)
                    row.update(samples_per_s=None, speedup_vs_allreduce=None, period=None)
                    row.update(contraction=None, rate_per_step=None)
                else:
                    t, comm = gossip_iteration_time(
                        spec["topo"].rounds, compute, nbytes, local, profile, intra
                    )
                    row.update(fits=True, reason="", t_iter_s=t, comm_s=comm)
                    row.update(samples_per_s=n * batch / t, speedup_vs_allreduce=t_ar / t)
                    row.update(period=spec["period"], contraction=spec.get("contraction"))
                    row.update(rate_per_step=spec.get("rate_per_step"))
                rows.append(row)
    return rows


# --- output --------------------------------------------------------------------------------


def _fmt_rate(value: float) -> str:
    if value >= 1e5:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def format_markdown(rows: Sequence[dict[str, Any]], cfg: Any) -> str:
    """Markdown: inputs, assumptions, a throughput table per profile and a consensus table."""
    intra = _intra_profile(cfg.get("intra"))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    topologies = [m for m in methods if m != ALLREDUCE]
    lines = [
        "# Scale simulation: all-reduce vs gossip topologies",
        "",
        f"Model `{cfg.get('model')}`: {float(cfg.get('model_bytes')) / 1e6:.1f} MB per exchange, "
        f"compute {float(cfg.get('compute_s')) * 1e3:.1f} ms per step"
        f"{' (measured on this CPU)' if cfg.get('measured') else ''} "
        f"(backward {float(cfg.get('backward_frac')):.0%}), batch {cfg.get('batch_size')} per "
        f"worker, {cfg.get('local_world_size')} workers per node; intra-node links "
        f"`{intra.name}` ({intra.bandwidth_gbps:g} Gb/s, {intra.latency_ms:g} ms).",
        "",
        "Assumptions:",
        "",
        *[f"- {a}" for a in ASSUMPTIONS],
    ]
    for profile in dict.fromkeys(r["profile"] for r in rows):
        sub = [r for r in rows if r["profile"] == profile]
        lat, bw = sub[0]["latency_ms"], sub[0]["bandwidth_gbps"]
        lines += [
            "",
            f"## {profile} ({bw:g} Gb/s per node, {lat:g} ms): samples/s (speedup vs allreduce)",
            "",
            "| n | nodes | " + " | ".join(methods) + " |",
            "|---:|---:|" + "---:|" * len(methods),
        ]
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
            lines.append(f"| {n} | {by_method[ALLREDUCE]['nodes']} | " + " | ".join(cells) + " |")
    first = next(iter(dict.fromkeys(r["profile"] for r in rows)))
    spectral = [r for r in rows if r["profile"] == first and r["method"] != ALLREDUCE]
    lines += [
        "",
        "## Consensus: per-step rate 1 - contraction^(1/period) (period in brackets)",
        "",
        "| n | " + " | ".join(topologies) + " |",
        "|---:|" + "---:|" * len(topologies),
    ]
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
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
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


def write_outputs(rows: Sequence[dict[str, Any]], cfg: Any, out: str | Path) -> list[Path]:
    """Write ``simulate.md``, ``simulate.csv``, ``simulate.json`` and the PNG plots to ``out``.

    Returns:
        The paths written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "simulate.md"
    md.write_text(format_markdown(rows, cfg))
    fields = list(rows[0])
    csv_path = out / "simulate.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    plain_cfg = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    js = out / "simulate.json"
    js.write_text(
        json.dumps({"inputs": plain_cfg, "assumptions": ASSUMPTIONS, "rows": rows}, indent=1)
    )
    return [md, csv_path, js, *_plots(rows, out)]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.simulate",
        description="Simulated per-iteration time and throughput: allreduce vs topologies.",
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="simulation YAML")
    parser.add_argument("--out", default="outputs/simulate", help="output directory")
    parser.add_argument(
        "--measure", action="store_true", help="time the config's model on this CPU"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.measure:
            compute, nbytes = measure_compute(cfg)
            cfg.compute_s, cfg.model_bytes, cfg.measured = compute, nbytes, True
            print(f"measured {cfg.model} on CPU: {compute:.4f} s per step, {nbytes} bytes")
        rows = simulate(cfg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_markdown(rows, cfg))
    for path in write_outputs(rows, cfg, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
