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
* ``--measure`` replaces ``compute_s`` and ``model_bytes`` with the forward+backward time
  and parameter bytes of the config's model, timed on this machine's CPU.
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

from decent_dp.topo import TopologyReg, period_contraction
from experiments.network.netem import PROFILES
from experiments.network.sim_model import (
    Cluster,
    Jitter,
    Link,
    Workload,
    fit_efficiency,
    simulate_allreduce,
    simulate_gossip,
)

__all__ = [
    "ASSUMPTIONS",
    "DEFAULT_CONFIG",
    "PRESET_DIR",
    "load_config",
    "consensus_rate",
    "measure_compute",
    "Profile",
    "profiles",
    "calibrate",
    "simulate",
    "sensitivity",
    "format_calibration",
    "format_markdown",
    "write_outputs",
    "main",
]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "conf" / "simulate.yaml"
PRESET_DIR = ROOT / "conf" / "simulate"
ALLREDUCE = "allreduce"
FIT = "fit"
EXACT_CONTRACTION = 1e-12

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


# --- configuration -------------------------------------------------------------------------


def _known_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Read the simulator's YAML, merge a ``preset=NAME`` if given, then ``key=value`` overrides.

    Args:
        path: The base YAML file; :data:`DEFAULT_CONFIG` when ``None``.
        overrides: OmegaConf dotlist entries, e.g. ``["compute_s=0.05"]``; an entry
            ``preset=NAME`` merges ``conf/simulate/NAME.yaml`` before the others.

    Returns:
        The merged config.

    Raises:
        ValueError: Missing file, unknown preset, malformed override, or a key the files
            do not have.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ValueError(f"simulation config {str(path)!r} does not exist")
    base = OmegaConf.load(path)
    if not isinstance(base, DictConfig):
        raise ValueError(f"simulation config {str(path)!r} must be a mapping")
    rest = []
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is invalid; write key=value")
        key, value = item.split("=", 1)
        if key == "preset":
            preset = PRESET_DIR / f"{value}.yaml"
            if not preset.is_file():
                raise ValueError(
                    f"preset={value!r} is unknown; known presets: {', '.join(_known_presets())}"
                )
            base = OmegaConf.merge(base, OmegaConf.load(preset))
            base.preset = value
        else:
            rest.append(item)
    OmegaConf.set_struct(base, True)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(rest))
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0]
        raise ValueError(f"bad override in {list(rest)}: {first}") from None
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


def _get(entry: Any, cfg: Any, key: str) -> Any:
    """``entry[key]`` if the profile sets it, else the global ``cfg[key]``."""
    if hasattr(entry, "get") and entry.get(key) is not None:
        return entry.get(key)
    return cfg.get(key)


def _link(entry: Any, name: str, defaults: Any) -> Link:
    """A link from a mapping ``{name?, latency_ms, bandwidth_gbps, efficiency?, collective_ms?}``."""
    if entry is None:
        raise ValueError(f"{name} is missing; give {{latency_ms, bandwidth_gbps}}")
    label = str(entry.get("label") or entry.get("name") or name)
    eff = entry.get("efficiency", defaults.get("efficiency", 1.0))
    call = entry.get("collective_ms", defaults.get("collective_ms", 0.0))
    return Link(label, entry.get("bandwidth_gbps"), entry.get("latency_ms"), eff, call)


class Profile:
    """One network profile of the tables: the network, the node and the workload on it.

    Built by :func:`profiles` from a ``profiles`` entry: a preset network name
    (``ethernet_25g``, ``infiniband_100g``) or a mapping with ``name`` (a preset or
    ``custom``), optional ``label``, ``latency_ms``, ``bandwidth_gbps``, ``efficiency``
    (a number or ``fit``), ``collective_ms``, and per-profile ``compute_s``,
    ``backward_frac``, ``local_world_size``, ``intra``, ``jitter``. Missing values come
    from the ``links`` defaults of the network name and from the top-level config.

    Attributes:
        label: Name in tables.
        kind: The network name whose ``links`` defaults apply (its link type).
        network: The inter-node :class:`Link` (efficiency 1.0 while it awaits a fit).
        fit: True when the efficiency is to be fitted.
    """

    def __init__(self, entry: Any, cfg: Any) -> None:
        mapping = OmegaConf.create({"name": entry}) if isinstance(entry, str) else entry
        kind = mapping.get("name")
        known = [*PROFILES, "custom"]
        if kind == "none":
            raise ValueError("profile 'none' cannot be simulated; give a network profile")
        if kind not in known:
            raise ValueError(
                f"unknown network profile {kind!r}; known profiles: {', '.join(known)}"
            )
        self.kind = str(kind)
        spec = dict(mapping)
        if self.kind in PROFILES:
            preset = PROFILES[self.kind]
            for key in ("latency_ms", "bandwidth_gbps"):
                given = spec.get(key)
                if given is not None and float(given) != getattr(preset, key):
                    raise ValueError(
                        f"network '{self.kind}' has {key}={getattr(preset, key)}, not {given}; "
                        "use name=custom to choose your own values"
                    )
                spec[key] = getattr(preset, key)
        self.label = str(spec.get("label") or self.kind)
        links = cfg.get("links") or {}
        defaults = links.get(self.kind) or {}
        self.fit = spec.get("efficiency", defaults.get("efficiency")) == FIT
        if self.fit:
            spec["efficiency"] = 1.0
        spec["label"] = self.label
        self.network = _link(spec, "profile", defaults)
        intra_entry = _get(mapping, cfg, "intra")
        self.intra = _link(intra_entry, "intra", {"efficiency": 1.0, "collective_ms": 0.0})
        self.compute_s = _number({"compute_s": _get(mapping, cfg, "compute_s")}, "compute_s", 0)
        if self.compute_s <= 0:
            raise ValueError(f"compute_s={self.compute_s} is invalid; it must be > 0")
        self.backward_frac = _number(
            {"backward_frac": _get(mapping, cfg, "backward_frac")}, "backward_frac", 0, 1
        )
        self.local_world_size = _number(
            {"local_world_size": _get(mapping, cfg, "local_world_size")},
            "local_world_size",
            1,
            integer=True,
        )
        jit = _get(mapping, cfg, "jitter") or {}
        self.jitter = Jitter(str(jit.get("kind", "none")), jit.get("cv", 0.0))
        model_bytes = _number(cfg, "model_bytes", 1)
        bucket = _number(cfg, "bucket_mb", 0) if cfg.get("bucket_mb") is not None else 25.0
        first = cfg.get("ddp_first_bucket_mb", 1.0)
        self.workload = Workload(model_bytes, self.compute_s, self.backward_frac, bucket, first)

    def cluster(self, n: int, collective_start: str = "all") -> Cluster:
        """The :class:`Cluster` of ``n`` workers on this profile."""
        return Cluster(n, self.local_world_size, self.network, self.intra, collective_start)


def profiles(cfg: Any) -> list[Profile]:
    """The config's profiles, with fitted efficiencies still at 1.0 (see :func:`calibrate`).

    Raises:
        ValueError: An empty list, a bad entry, or two fits for one link type.
    """
    entries = cfg.get("profiles")
    if entries is None or isinstance(entries, str) or len(entries) == 0:
        raise ValueError(f"profiles={entries!r} is invalid; give a non-empty list of profiles")
    out = [Profile(e, cfg) for e in entries]
    fitted = [p.kind for p in out if p.fit]
    for kind in set(fitted):
        if fitted.count(kind) > 1:
            raise ValueError(f"efficiency=fit appears twice for link type {kind!r}; fit it once")
    labels = [p.label for p in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"profile labels {labels} repeat; give each profile its own label")
    return out


def _mc(cfg: Any, period: int = 1) -> dict[str, int]:
    """Steps (a whole number of periods), warm-up (at least two periods) and seed."""
    mc = cfg.get("mc") or {}
    steps = _number({"mc.steps": mc.get("steps", 60)}, "mc.steps", 1, integer=True)
    warmup = _number({"mc.warmup": mc.get("warmup", 10)}, "mc.warmup", 1, integer=True)
    seed = _number({"mc.seed": mc.get("seed", 0)}, "mc.seed", 0, integer=True)
    steps = period * max(2, math.ceil(steps / period))
    return {"steps": steps, "warmup": max(warmup, 2 * period), "seed": seed}


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

    from experiments.models.vision import build_model

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


# --- calibration ---------------------------------------------------------------------------


def _method_time(profile: Profile, method: str, n: int, cfg: Any) -> tuple[float, float]:
    """``(t_iter_s, comm_s)`` of one method on ``n`` workers of ``profile``."""
    if method == ALLREDUCE:
        res = simulate_allreduce(profile.workload, profile.cluster(n), profile.jitter, **_mc(cfg))
    else:
        topo = TopologyReg.create(method, n, profile.local_world_size)
        res = simulate_gossip(
            topo.rounds,
            profile.workload,
            profile.cluster(n),
            profile.jitter,
            **_mc(cfg, topo.period),
        )
    return res.t_iter_s, res.comm_s


def _points(cfg: Any) -> list[dict[str, Any]]:
    points = cfg.get("calibration") or []
    out = []
    for p in points:
        ms = _number(p, "measured_ms", 0)
        n = _number(p, "n", 1, integer=True)
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
            point["measured_ms"] / 1e3, prof.workload, cluster, prof.jitter, **_mc(cfg)
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


def _sizes(cfg: Any) -> list[int]:
    sizes = cfg.get("world_sizes")
    if not sizes or isinstance(sizes, str):
        raise ValueError(f"world_sizes={sizes!r} is invalid; give a non-empty list of integers")
    return [_number({"world_sizes": n}, "world_sizes", 1, integer=True) for n in sizes]


def _topology_names(cfg: Any) -> list[str]:
    names = cfg.get("topologies")
    names = list(TopologyReg.names()) if names is None else [str(x) for x in names]
    for name in names:
        TopologyReg.get(name)  # unknown names fail here, listing the known ones
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
        ``samples_per_s``, ``speedup_vs_allreduce``, and for topologies
        ``period``, ``contraction`` and ``rate_per_step``.

    Raises:
        ValueError: A missing or out-of-range input.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    batch = _number(cfg, "batch_size", 1, integer=True)
    max_n = _number(cfg, "spectral_max_n", 0, integer=True) if "spectral_max_n" in cfg else 1024
    sizes = _sizes(cfg)
    names = _topology_names(cfg)
    if profs is None:
        profs = profiles(cfg)
        if any(p.fit for p in profs):
            calibrate(cfg, profs)
    spectra: dict[tuple[str, int, int], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
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
            }
            t_ar, comm_ar = _method_time(prof, ALLREDUCE, n, cfg)
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
                key = (name, n, local)
                if key not in spectra:
                    spectra[key] = _spectral(name, n, local, max_n)
                spec = spectra[key]
                row: dict[str, Any] = {**base, "method": name}
                if "error" in spec:
                    row.update(fits=False, reason=spec["error"], t_iter_s=None, comm_s=None)
                    row.update(samples_per_s=None, speedup_vs_allreduce=None, period=None)
                    row.update(contraction=None, rate_per_step=None)
                else:
                    res = simulate_gossip(
                        spec["topo"].rounds,
                        prof.workload,
                        prof.cluster(n),
                        prof.jitter,
                        **_mc(cfg, spec["period"]),
                    )
                    t = res.t_iter_s
                    row.update(fits=True, reason="", t_iter_s=t, comm_s=res.comm_s)
                    row.update(samples_per_s=n * batch / t, speedup_vs_allreduce=t_ar / t)
                    row.update(period=spec["period"], contraction=spec.get("contraction"))
                    row.update(rate_per_step=spec.get("rate_per_step"))
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


# --- output --------------------------------------------------------------------------------


def _fmt_rate(value: float) -> str:
    if value >= 1e5:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _pct(err: float) -> str:
    """A signed percentage; rounding noise of a fitted point prints as +0.0%."""
    return f"{(err if abs(err) >= 5e-5 else 0.0):+.1%}"


def _ratios(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Measured and predicted all-reduce/topology ratios per (profile, n)."""
    lines = []
    for prof in dict.fromkeys(r["profile"] for r in rows):
        for n in dict.fromkeys(r["n"] for r in rows if r["profile"] == prof):
            sub = [r for r in rows if r["profile"] == prof and r["n"] == n]
            ar = [r for r in sub if r["method"] == ALLREDUCE]
            for r in sub:
                if r["method"] == ALLREDUCE or not ar:
                    continue
                meas = ar[0]["measured_ms"] / r["measured_ms"]
                pred = ar[0]["predicted_ms"] / r["predicted_ms"]
                lines.append(
                    f"| {prof} | {n} | allreduce / {r['method']} | {meas:.2f}x | {pred:.2f}x | "
                    f"{_pct(pred / meas - 1)} | ratio |"
                )
    return lines


def format_calibration(rows: Sequence[dict[str, Any]], cfg: Any) -> str:
    """The table of predicted against measured step times (the output's first section)."""
    title = cfg.get("title") or "Calibration"
    lines = [
        f"# {title}",
        "",
        "| profile | n | method | measured (ms) | predicted (ms) | error | role |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        role = r["role"]
        if role == "fitted":
            role = f"fitted: efficiency {r['efficiency']:.3f}"
        lines.append(
            f"| {r['profile']} | {r['n']} | {r['method']} | {r['measured_ms']:.1f} | "
            f"{r['predicted_ms']:.1f} | {_pct(r['error'])} | {role} |"
        )
    lines += _ratios(rows)
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
    lines = [
        "",
        "## Sensitivity: errors (predicted/measured - 1) when one input changes",
        "",
        "| variant | fitted efficiency | " + " | ".join(heads) + " |",
        "|---|---:|" + "---:|" * len(heads),
    ]
    for v in variants:
        if v["error"]:
            lines.append(f"| {v['label']} | no fit: {v['error']} |" + " |" * len(heads))
            continue
        eff = next((r["efficiency"] for r in v["rows"] if r["role"] == "fitted"), None)
        cells = [_pct(r["error"]) + (" (fit)" if r["role"] == "fitted" else "") for r in v["rows"]]
        eff_cell = f"{eff:.3f}" if eff is not None else "-"
        lines.append(f"| {v['label']} | {eff_cell} | " + " | ".join(cells) + " |")
    return lines


def _inputs(cfg: Any, profs: Sequence[Profile]) -> list[str]:
    lines = [
        f"Model `{cfg.get('model')}`: {float(cfg.get('model_bytes')) / 1e6:.1f} MB per exchange, "
        f"batch {cfg.get('batch_size')} per worker"
        f"{' (compute measured on this CPU)' if cfg.get('measured') else ''}; "
        f"buckets of {cfg.get('bucket_mb', 25)} MiB (torch DDP's first: "
        f"{cfg.get('ddp_first_bucket_mb', 1)} MiB); Monte Carlo {_mc(cfg)['steps']} steps, "
        f"seed {_mc(cfg)['seed']}.",
        "",
        "| profile | network | efficiency | per-call latency | hop latency | compute | "
        "backward | jitter | per node | intra-node |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for p in profs:
        net, intra = p.network, p.intra
        fit = " (fitted)" if p.fit else ""
        lines.append(
            f"| {p.label} | {net.bandwidth_gbps:g} Gb/s | {net.efficiency:.3f}{fit} | "
            f"{net.collective_ms:g} ms | {net.latency_ms:g} ms | {p.compute_s * 1e3:.1f} ms | "
            f"{p.backward_frac:.0%} | {p.jitter.kind} cv {p.jitter.cv:g} | {p.local_world_size} | "
            f"{intra.name} {intra.bandwidth_gbps:g} Gb/s, {intra.latency_ms:g} ms |"
        )
    return lines


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
