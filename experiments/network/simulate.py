"""Scale simulation: all-reduce versus gossip topologies at 8 to 1024 workers.

``python -m experiments.network.simulate [preset=NAME] [--config FILE] [--measure] [--sensitivity]
[--out DIR] [key=value ...]`` (or ``make simulate``) predicts the step time of torch DDP's
all-reduce and of the wrapper on every registered topology, on every network profile,
and prints a markdown table per profile plus a consensus table. It also writes
``simulate.md``, ``simulate.csv``, ``simulate.json`` and PNG plots to ``--out``
(default ``outputs/simulate/``).

* Inputs live in ``conf/simulate.yaml``; ``preset=NAME`` merges ``conf/simulate/NAME.yaml``
  on top (``preset=paper_transformer_fig6``: the reference paper's Transformer setting),
  and ``key=value`` overrides come last.
* The timing model is :mod:`experiments.network.sim_model`: a Monte Carlo over steps with
  per-worker compute jitter, bucketed collectives with per-call latency, a reachable
  fraction of line rate per link type (``efficiency``) and one NIC per node.
* ``calibration`` (in a preset) lists measured step times. A profile whose ``efficiency``
  is ``fit`` gets the efficiency at which its one measured all-reduce point is matched
  exactly; every other point is predicted, and the output starts with the table of
  predicted against measured values.
* ``--sensitivity`` repeats the calibration under each entry of ``sensitivity``.
* The inputs are read by :mod:`experiments.network.sim_config`; the tables, CSV, JSON and
  plots are written by :mod:`experiments.network.sim_report`.
* ``--measure`` replaces ``compute_s`` and ``model_bytes`` with the forward+backward time
  and parameter bytes of the config's model, timed on this machine's CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

from decent_dp.topo import TopologyReg, period_contraction
from decent_dp.topo.hosts import hierarchical_keys, host_size
from experiments.network.sim_config import (
    ALLREDUCE,
    DEFAULT_CONFIG,
    Profile,
    load_config,
    monte_carlo,
    outer_rounds,
    profiles,
    read_number,
)
from experiments.network.sim_model import (
    SimResult,
    fit_efficiency,
    simulate_allreduce,
    simulate_gossip,
)
from experiments.network.sim_report import format_markdown, write_outputs

__all__ = [
    "consensus_rate",
    "measure_compute",
    "calibrate",
    "simulate",
    "sensitivity",
    "main",
]

EXACT_CONTRACTION = 1e-12
HIERARCHICAL = "hierarchical"  # the topology that takes ``hierarchical_inter``


# --- consensus and measurement -------------------------------------------------------------


def consensus_rate(contraction: float, period: int) -> float:
    """Per-step rate ``1 - contraction^(1/period)``; 1 when the period reaches exact consensus."""
    if contraction < EXACT_CONTRACTION:
        return 1.0
    return 1.0 - contraction ** (1.0 / period)


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
    size = read_number(m, "image_size", 1, integer=True)
    channels = read_number(m, "in_channels", 1, integer=True)
    classes = read_number(m, "num_classes", 1, integer=True)
    warmup = read_number(m, "warmup", 0, integer=True)
    steps = read_number(m, "steps", 1, integer=True)
    batch = read_number(cfg, "batch_size", 1, integer=True)
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


# --- calibration ---------------------------------------------------------------------------


def _topology(name: str, n: int, local: int, cfg: Any) -> Any:
    """The registered topology ``name`` on ``n`` workers, ``local`` per node.

    ``hierarchical`` takes ``hierarchical_inter`` (default ``one-peer-exp``) between nodes,
    and its hosts are the simulator's nodes.

    Raises:
        ValueError: The topology does not fit, or it has edges of more than two nodes
            while ``compression_ratio`` is below 1 (the wrapper refuses compression there).
    """
    if name != HIERARCHICAL:
        return TopologyReg.create(name, n, local)
    inter = str(cfg.get("hierarchical_inter") or "one-peer-exp")
    topo = TopologyReg.create(name, n, local, inter=inter)
    ratio = cfg.get("compression_ratio", 1.0)
    wide = [key for key in hierarchical_keys(topo) if len(key) != 2 * local]
    if ratio is not None and float(ratio) != 1.0 and wide:
        # the wrapper compresses the exchange between two nodes only
        raise ValueError(
            f"compression_ratio={ratio} is not supported by {name} with edges of "
            f"{len(wide[0]) // local} nodes; only edges of 2 nodes are compressed"
        )
    return topo


def _gossip(topo: Any, profile: Profile, n: int, cfg: Any) -> SimResult:
    """The wrapper on ``topo``, with the config's outer rounds (over whole schedules)."""
    outer = outer_rounds(cfg)
    span = topo.period if outer is None else math.lcm(topo.period, outer.every)
    mc = monte_carlo(cfg, profile.jitter, span)
    three = host_size(topo) > 1  # hierarchical: edges of several nodes run in three phases
    return simulate_gossip(topo.rounds, profile.workload, profile.cluster(n), mc, outer, three)


def _method_result(profile: Profile, method: str, n: int, cfg: Any) -> SimResult:
    """The simulation of one method on ``n`` workers of ``profile``."""
    if method == ALLREDUCE:
        mc = monte_carlo(cfg, profile.jitter)
        return simulate_allreduce(profile.workload, profile.cluster(n), mc)
    return _gossip(_topology(method, n, profile.local_world_size, cfg), profile, n, cfg)


def _method_time(profile: Profile, method: str, n: int, cfg: Any) -> tuple[float, float]:
    """``(t_iter_s, comm_s)`` of one method on ``n`` workers of ``profile``."""
    res = _method_result(profile, method, n, cfg)
    return res.t_iter_s, res.comm_s


def _points(cfg: Any) -> list[dict[str, Any]]:
    points = cfg.get("calibration") or []
    out = []
    for p in points:
        ms = read_number(p, "measured_ms", 0)
        n = read_number(p, "n", 1, integer=True)
        method = str(p.get("method"))
        if method != ALLREDUCE:
            TopologyReg.get(method)  # unknown names fail here, listing the known ones
        out.append({"profile": str(p.get("profile")), "n": n, "method": method, "measured_ms": ms})
    return out


def calibrate(cfg: Any, profs: list[Profile]) -> list[dict[str, Any]]:
    """Fit each ``efficiency: fit`` profile on its all-reduce point, then predict every point.

    Args:
        cfg: The config, with a ``calibration`` list of ``{profile, n, method, measured_ms}``.
        profs: :func:`profiles` of ``cfg``; fitted profiles get their efficiency set here.

    Returns:
        One row per calibration point: ``profile, n, method, measured_ms, predicted_ms,
        error`` (relative) and ``role`` (``fitted`` or ``predicted``); empty without points.

    Raises:
        ValueError: A point names an unknown profile, a fitted profile has no (or more than
            one) all-reduce point, or the fit is impossible.
    """
    points = _points(cfg)
    by_label = {p.label: p for p in profs}
    for p in points:
        if p["profile"] not in by_label:
            raise ValueError(
                f"calibration point profile={p['profile']!r} is unknown; profiles: "
                f"{', '.join(by_label)}"
            )
    for prof in profs:
        if not prof.fit:
            continue
        own = [p for p in points if p["profile"] == prof.label and p["method"] == ALLREDUCE]
        if len(own) != 1:
            raise ValueError(
                f"profile {prof.label!r} has efficiency=fit but {len(own)} all-reduce calibration "
                "points; give exactly one"
            )
        point = own[0]
        cluster = prof.cluster(point["n"])
        eff, _ = fit_efficiency(
            point["measured_ms"] / 1e3, prof.workload, cluster, monte_carlo(cfg, prof.jitter)
        )
        prof.network = prof.network.with_efficiency(eff)
        point["fitted"] = True
    rows = []
    for p in points:
        prof = by_label[p["profile"]]
        t, _ = _method_time(prof, p["method"], p["n"], cfg)
        pred = t * 1e3
        rows.append(
            {
                **{k: p[k] for k in ("profile", "n", "method", "measured_ms")},
                "predicted_ms": pred,
                "error": pred / p["measured_ms"] - 1.0,
                "role": "fitted" if p.get("fitted") else "predicted",
                "efficiency": prof.network.efficiency,
            }
        )
    return rows


# --- the scale simulation ------------------------------------------------------------------


def _spectral(name: str, n: int, local: int, max_n: int, cfg: Any) -> dict[str, Any]:
    try:
        topo = _topology(name, n, local, cfg)
    except ValueError as exc:
        return {"error": str(exc)}
    out: dict[str, Any] = {"topo": topo, "period": topo.period}
    if n <= max_n:
        contraction = period_contraction(topo.mixing_matrices())
        out["contraction"] = contraction
        out["rate_per_step"] = consensus_rate(contraction, topo.period)
    return out


def _sizes(cfg: Any) -> list[int]:
    sizes = cfg.get("world_sizes")
    if not sizes or isinstance(sizes, str):
        raise ValueError(f"world_sizes={sizes!r} is invalid; give a non-empty list of integers")
    return [read_number({"world_sizes": n}, "world_sizes", 1, integer=True) for n in sizes]


def _topology_names(cfg: Any) -> list[str]:
    names = cfg.get("topologies")
    names = list(TopologyReg.names()) if names is None else [str(x) for x in names]
    for name in names:
        TopologyReg.get(name)  # unknown names fail here, listing the known ones
    inter = cfg.get("hierarchical_inter")
    if HIERARCHICAL in names and inter is not None and inter not in TopologyReg.names():
        known = [x for x in TopologyReg.names() if x != HIERARCHICAL]
        raise ValueError(f"hierarchical_inter={inter!r} is unknown; known: {', '.join(known)}")
    return names


def simulate(cfg: Any, profs: list[Profile] | None = None) -> list[dict[str, Any]]:
    """Per-iteration time and throughput of all-reduce and every topology.

    Args:
        cfg: A mapping with ``model_bytes``, ``compute_s``, ``backward_frac``,
            ``batch_size``, ``local_world_size``, ``world_sizes``, ``profiles``,
            ``intra``, ``links``, ``jitter``, ``mc``, optional ``topologies``
            (``None`` = all registered) and ``spectral_max_n`` (see ``conf/simulate.yaml``).
        profs: Profiles already calibrated by :func:`calibrate`; built from ``cfg`` if
            ``None`` (a fitted efficiency is then fitted here first).

    Returns:
        One row per (profile, n, method); ``method`` is ``allreduce`` or a
        topology name. Rows carry ``fits`` (False with ``reason`` where the
        topology does not fit ``n``), ``t_iter_s``, ``comm_s``,
        ``samples_per_s``, ``speedup_vs_allreduce``, ``peak_step_s`` (the
        longest step), ``peak_comm_s`` (the busiest step's transfers),
        ``outer_every`` and ``outer_fragments`` (``None`` without outer rounds),
        and for topologies ``period``, ``contraction`` and ``rate_per_step``.
        The outer rounds (``outer_every``, ``outer_fragments``,
        ``outer_compression_ratio``) apply to every topology, not to ``allreduce``.

    Raises:
        ValueError: A missing or out-of-range input.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    batch = read_number(cfg, "batch_size", 1, integer=True)
    max_n = read_number(cfg, "spectral_max_n", 0, integer=True) if "spectral_max_n" in cfg else 1024
    sizes = _sizes(cfg)
    names = _topology_names(cfg)
    if profs is None:
        profs = profiles(cfg)
        if any(p.fit for p in profs):
            calibrate(cfg, profs)
    spectra: dict[tuple[str, int, int], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    outer = outer_rounds(cfg)  # checked here, before any simulation
    for prof in profs:
        local = prof.local_world_size
        for n in sizes:
            base = {
                "profile": prof.label,
                "latency_ms": prof.network.latency_ms,
                "bandwidth_gbps": prof.network.bandwidth_gbps,
                "efficiency": prof.network.efficiency,
                "compute_s": prof.compute_s,
                "n": n,
                "nodes": math.ceil(n / local),
                "outer_every": outer.every if outer is not None else None,
                "outer_fragments": outer.fragments if outer is not None else None,
            }
            ar = _method_result(prof, ALLREDUCE, n, cfg)
            t_ar = ar.t_iter_s
            rows.append(
                {
                    **base,
                    "method": ALLREDUCE,
                    "fits": True,
                    "reason": "",
                    "t_iter_s": t_ar,
                    "comm_s": ar.comm_s,
                    "samples_per_s": n * batch / t_ar,
                    "speedup_vs_allreduce": 1.0,
                    "period": None,
                    "contraction": None,
                    "rate_per_step": None,
                    "peak_step_s": ar.peak_step_s,
                    "peak_comm_s": ar.peak_comm_s,
                }
            )
            for name in names:
                key = (name, n, local)
                if key not in spectra:
                    spectra[key] = _spectral(name, n, local, max_n, cfg)
                spec = spectra[key]
                row: dict[str, Any] = {**base, "method": name}
                if "error" in spec:
                    row.update(fits=False, reason=spec["error"], t_iter_s=None, comm_s=None)
                    row.update(samples_per_s=None, speedup_vs_allreduce=None, period=None)
                    row.update(contraction=None, rate_per_step=None)
                    row.update(peak_step_s=None, peak_comm_s=None)
                else:
                    res = _gossip(spec["topo"], prof, n, cfg)
                    t = res.t_iter_s
                    row.update(fits=True, reason="", t_iter_s=t, comm_s=res.comm_s)
                    row.update(samples_per_s=n * batch / t, speedup_vs_allreduce=t_ar / t)
                    row.update(period=spec["period"], contraction=spec.get("contraction"))
                    row.update(rate_per_step=spec.get("rate_per_step"))
                    row.update(peak_step_s=res.peak_step_s, peak_comm_s=res.peak_comm_s)
                rows.append(row)
    return rows


def sensitivity(cfg: Any) -> list[dict[str, Any]]:
    """The calibration repeated under each ``sensitivity`` entry ``{label, set: {key: value}}``.

    Keys are dotted paths (``profiles.1.bandwidth_gbps``); each variant refits.

    Returns:
        One row per variant: ``label`` and, per calibration point, its error.
    """
    out = []
    for entry in cfg.get("sensitivity") or []:
        variant = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        for key, value in (entry.get("set") or {}).items():
            OmegaConf.update(variant, str(key), value, force_add=False)
        try:
            rows = calibrate(variant, profiles(variant))
            out.append({"label": str(entry.get("label")), "rows": rows, "error": None})
        except ValueError as exc:
            out.append({"label": str(entry.get("label")), "rows": [], "error": str(exc)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.network.simulate",
        description="Simulated per-iteration time and throughput: allreduce vs topologies.",
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="simulation YAML")
    parser.add_argument("--out", default="outputs/simulate", help="output directory")
    parser.add_argument(
        "--measure", action="store_true", help="time the config's model on this CPU"
    )
    parser.add_argument(
        "--sensitivity", action="store_true", help="repeat the calibration under each variant"
    )
    parser.add_argument(
        "overrides", nargs="*", help="preset=NAME and key=value overrides of the config"
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.measure:
            compute, nbytes = measure_compute(cfg)
            cfg.compute_s, cfg.model_bytes, cfg.measured = compute, nbytes, True
            print(f"measured {cfg.model} on CPU: {compute:.4f} s per step, {nbytes} bytes")
        profs = profiles(cfg)
        calibration = calibrate(cfg, profs)
        variants = sensitivity(cfg) if args.sensitivity else []
        rows = simulate(cfg, profs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    markdown = format_markdown(rows, cfg, profs, calibration, variants)
    print(markdown)
    for path in write_outputs(rows, cfg, args.out, markdown, calibration):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
