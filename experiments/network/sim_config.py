"""Inputs of the scale simulation: the YAML, its presets and overrides, and the network profiles.

:func:`load_config` reads ``conf/simulate.yaml``, merges ``conf/simulate/NAME.yaml`` for
``preset=NAME`` and applies ``key=value`` overrides; :func:`profiles` turns its
``profiles`` list into :class:`Profile` objects (network, node and workload), checking
every value with a one-line error that names it. Numbers are read by :func:`read_number`,
which checks them with the training configs' :func:`experiments.schema.require_number`
(the same ``"<key>=<value> is invalid; it must be <allowed>"``, a :class:`ConfigError`,
which is a ``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.network.netem import PROFILES
from experiments.network.sim_model import (
    Cluster,
    Jitter,
    Link,
    MonteCarlo,
    OuterRounds,
    Workload,
)
from experiments.schema import require_number

__all__ = [
    "load_config",
    "Profile",
    "profiles",
    "monte_carlo",
    "outer_rounds",
    "read_number",
    "ALLREDUCE",
    "DEFAULT_CONFIG",
    "PRESET_DIR",
]

ALLREDUCE = "allreduce"  # the method name of torch DDP in rows and calibration points
FIT = "fit"  # an efficiency to be fitted on the profile's all-reduce calibration point
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "simulate.yaml"
PRESET_DIR = DEFAULT_CONFIG.parent / "simulate"


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


def read_number(
    cfg: Any, key: str, low: float, high: float = math.inf, integer: bool = False
) -> Any:
    """``cfg[key]`` checked to be a finite number (an integer if asked) in ``[low, high]``.

    Raises:
        ValueError: A missing, non-numeric or out-of-range value, named with its key.
    """
    value: Any = cfg.get(key) if hasattr(cfg, "get") else None
    top = None if math.isinf(high) else high
    kind: Literal["integer", "number"] = "integer" if integer else "number"
    require_number(key, value, at_least=low, at_most=top, kind=kind)
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
        compute_s = _get(mapping, cfg, "compute_s")
        require_number("compute_s", compute_s, above=0, kind="number")
        self.compute_s = float(compute_s)
        self.backward_frac = read_number(
            {"backward_frac": _get(mapping, cfg, "backward_frac")}, "backward_frac", 0, 1
        )
        self.local_world_size = read_number(
            {"local_world_size": _get(mapping, cfg, "local_world_size")},
            "local_world_size",
            1,
            integer=True,
        )
        jit = _get(mapping, cfg, "jitter") or {}
        self.jitter = Jitter(str(jit.get("kind", "none")), jit.get("cv", 0.0))
        model_bytes = read_number(cfg, "model_bytes", 1)
        bucket = read_number(cfg, "bucket_mb", 0) if cfg.get("bucket_mb") is not None else 25.0
        first = cfg.get("ddp_first_bucket_mb", 1.0)
        ratio = read_number(cfg, "compression_ratio", 0, 1) if "compression_ratio" in cfg else 1.0
        self.workload = Workload(
            model_bytes, self.compute_s, self.backward_frac, bucket, first, ratio
        )

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


def monte_carlo(cfg: Any, jitter: Jitter | None = None, period: int = 1) -> MonteCarlo:
    """The ``mc`` section: steps (a whole number of periods), warm-up (two periods or more), seed.

    Args:
        cfg: The simulation config.
        jitter: The compute jitter of the profile being simulated (none if ``None``).
        period: The topology's period (1 for all-reduce).
    """
    mc = cfg.get("mc") or {}
    steps = read_number({"mc.steps": mc.get("steps", 60)}, "mc.steps", 1, integer=True)
    warmup = read_number({"mc.warmup": mc.get("warmup", 10)}, "mc.warmup", 1, integer=True)
    seed = read_number({"mc.seed": mc.get("seed", 0)}, "mc.seed", 0, integer=True)
    steps = period * max(2, math.ceil(steps / period))
    return MonteCarlo(jitter or Jitter(), steps, max(warmup, 2 * period), seed)


def outer_rounds(cfg: Any) -> OuterRounds | None:
    """The outer optimizer's rounds of ``outer_every``, ``outer_fragments`` and
    ``outer_compression_ratio``; ``None`` when ``outer_every`` is null.

    Raises:
        ValueError: A value that is not an integer >= 1 (a ratio outside ``(0, 1]``), or
            fragments that do not divide ``outer_every``.
    """
    every = cfg.get("outer_every")
    if every is None:
        return None
    every = read_number(cfg, "outer_every", 1, integer=True)
    frags = cfg.get("outer_fragments")
    frags = 1 if frags is None else read_number(cfg, "outer_fragments", 1, integer=True)
    ratio = cfg.get("outer_compression_ratio")
    ratio = 1.0 if ratio is None else read_number(cfg, "outer_compression_ratio", 0, 1)
    return OuterRounds(every, frags, ratio)
