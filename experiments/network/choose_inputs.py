"""The chooser's inputs: the cluster's values checked, the model's bytes, the link's terms.

:func:`model_bytes` counts a framework model's parameters (or takes a size in MB),
:func:`link_terms` gives the simulator a link's efficiency, cost per collective and latency
from the calibration that applies to its rate, and :func:`model_error` states that
calibration's error against measured step times, from the committed validation. Every bad
value raises a one-line ``ValueError`` naming it and what is allowed
(:func:`bad`, :func:`integer`, :func:`positive`, :func:`bits_per_s`). The ranking is
:mod:`experiments.network.choose`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from experiments.models import build_model
from experiments.network import calibrate
from experiments.network.netem import PROFILES
from experiments.network.sim_config import load_config
from experiments.network.testbed import TestbedError, parse_rate
from experiments.network.wire_table import TOLERANCE, within

__all__ = [
    "FABRICS",
    "FABRICS_OF",
    "MB",
    "bad",
    "integer",
    "link_terms",
    "model_bytes",
    "model_error",
    "model_names",
    "positive",
    "bits_per_s",
]

ROOT = Path(__file__).resolve().parents[2]
WIRE_TABLE = ROOT / "docs" / "results" / "network" / "table.json"
PAPER_FIT = ROOT / "docs" / "results" / "simulate" / "paper_transformer_fig6" / "simulate.json"
MODEL_DIR = ROOT / "conf" / "model"
FABRICS = {"ethernet": "ethernet_25g", "infiniband": "infiniband_100g"}  # -> the link type
FABRICS_OF = {kind: fabric for fabric, kind in FABRICS.items()}
MB = 1e6  # --model sizes are decimal megabytes
# the images each vision model is built for (classes, channels, side), as in its experiments
VISION_SHAPES = {
    "small_cnn": (10, 1, 8),
    "resnet18_cifar": (10, 3, 32),
    "vit_small": (10, 3, 32),
    "resnet50": (1000, 3, 224),
}
GPT_VOCAB = 50304  # GPT-2's vocabulary padded to a multiple of 64, where the data decides


def bad(flag: str, value: Any, allowed: str) -> ValueError:
    """The one-line error of a bad value: ``--flag='value' is invalid; allowed``."""
    return ValueError(f"{flag}={value!r} is invalid; {allowed}")


def integer(flag: str, text: Any, low: int) -> int:
    """``text`` as an integer >= ``low``, else a one-line error naming ``flag``."""
    try:
        value = int(str(text))
    except ValueError:
        value = None
    if value is None or value < low:
        raise bad(flag, text, f"it must be an integer >= {low}")
    return value


def positive(flag: str, text: Any) -> float:
    """``text`` as a finite number > 0, else a one-line error naming ``flag``."""
    try:
        value = float(str(text))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise bad(flag, text, "it must be a number > 0")
    return value


def bits_per_s(flag: str, text: str) -> int:
    """``text`` as bits per second (``100mbit``, ``25gbit``), else a one-line error."""
    try:
        bps = parse_rate(text)
    except TestbedError:
        bps = 0
    if bps <= 0:
        raise bad(flag, text, "give a rate such as 100mbit, 1gbit or 25gbit")
    return bps


# --- the workload ---------------------------------------------------------------------------


def model_names() -> list[str]:
    """The model options of the framework's ``model`` group (``conf/model/*.yaml``)."""
    return sorted(p.stem for p in MODEL_DIR.glob("*.yaml"))


def model_bytes(spec: str) -> tuple[float, str]:
    """The bytes one worker gossips per step (fp32 parameters) and how they were found.

    Args:
        spec: A model option of the ``model`` group (its parameters are counted on the
            images or the vocabulary it is built for) or a size in MB (10^6 bytes).

    Returns:
        ``(bytes, description)``.

    Raises:
        ValueError: Neither a known name nor a number > 0.
    """
    names = model_names()
    if spec not in names:
        try:
            size = float(spec)
        except ValueError:
            size = math.nan
        if not math.isfinite(size) or size <= 0:
            raise bad("--model", spec, f"give a size in MB (> 0) or one of {', '.join(names)}")
        return size * MB, f"{size:g} MB"
    loaded = OmegaConf.to_container(OmegaConf.load(MODEL_DIR / f"{spec}.yaml"))
    assert isinstance(loaded, dict)
    section = {str(k): v for k, v in loaded.items() if k != "defaults"}
    with torch.device("meta"):  # shapes only, where the builder allows it
        if section["name"] == "gpt":
            vocab = section.get("vocab_size") or GPT_VOCAB
            model = build_model(section, vocab_size=vocab)
            built = f"vocabulary {vocab}"
        else:
            classes, channels, side = VISION_SHAPES[str(section["name"])]
            model = build_model(section, num_classes=classes, in_channels=channels, image_size=side)
            built = f"{classes} classes, {channels}x{side}x{side} images"
    count = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return float(nbytes), f"{spec}: {count:,} parameters ({built}), {nbytes / MB:,.1f} MB"


# --- the link -------------------------------------------------------------------------------


def link_terms(rate_bps: float, fabric: str) -> dict[str, Any]:
    """The simulator's terms for a link between nodes: efficiency, cost per call, latency.

    On Ethernet within a factor of about 3 of a rate the testbed measured, the terms are the
    testbed's (``docs/results/network/calibration.json``, the nearest rate); elsewhere they
    are the link type's in ``conf/simulate.yaml`` (Ethernet's efficiency is fitted on the
    reference paper's 25 GbE all-reduce).

    Args:
        rate_bps: The link's rate, bits per second.
        fabric: ``ethernet`` (TCP sockets) or ``infiniband`` (RDMA).

    Returns:
        ``efficiency``, ``collective_ms``, ``latency_ms``, ``source`` (a sentence) and
        ``calibrated_on`` (``testbed`` or ``paper``).
    """
    kind = FABRICS[fabric]
    latency = PROFILES[kind].latency_ms
    calib = calibrate.load()
    if fabric == "ethernet" and calib is not None:
        at = calibrate.nearest(calib, rate_bps)
        if abs(math.log10(at["rate_bps"] / rate_bps)) <= 0.5:
            name = next(k for k, v in calib["rates"].items() if v is at)
            return {
                "efficiency": at["efficiency"],
                "collective_ms": at["collective_ms"],
                "latency_ms": latency,
                "source": f"measured on the testbed's pair exchanges at {name} "
                "(docs/results/network/calibration.json)",
                "calibrated_on": "testbed",
            }
    link = load_config().links[kind]
    return {
        "efficiency": float(link.efficiency),
        "collective_ms": float(link.collective_ms),
        "latency_ms": latency,
        "source": f"conf/simulate.yaml's links.{kind}",
        "calibrated_on": "paper",
    }


def model_error(calibrated_on: str) -> str:
    """The simulator's error against measured step times, from the committed validation.

    Args:
        calibrated_on: ``testbed``: the calibrated simulator against the testbed's wire
            (``docs/results/network/table.json``); ``paper``: against the reference
            paper's measured Fig. 6 (``.../paper_transformer_fig6/simulate.json``).
    """
    if calibrated_on == "testbed":
        ratios = [
            r["simulated_cal_ratio"] for r in _json(WIRE_TABLE) if r.get("simulated_cal_ratio")
        ]
        hits = sum(within(x) for x in ratios)
        return (
            f"the calibrated simulator against the testbed's wire: {hits} of {len(ratios)} "
            f"cells within {TOLERANCE:.0%}, predicted/measured {min(ratios):.2f} to "
            f"{max(ratios):.2f} (docs/results/network/table.json)"
        )
    rows = [r for r in _json(PAPER_FIT)["calibration"] if r["role"] == "predicted"]
    errors = ", ".join(f"{r['method']} {r['error']:+.1%} ({r['profile']})" for r in rows)
    return (
        f"the simulator against the reference paper's measured steps at 32 workers, "
        f"its all-reduce on 25 GbE fitted: {errors} "
        "(docs/results/simulate/paper_transformer_fig6/simulate.json)"
    )


def _json(path: Path) -> Any:
    return json.loads(path.read_text())
