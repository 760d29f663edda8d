"""Run directories as training writes them: ``summary.json``, ``metrics.jsonl``, Hydra overrides."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.train.logger import MetricsLogger

VISION_PLOTS = ("consensus_vs_step.png", "loss_vs_time.png", "acc_vs_epoch.png", "throughput.png")
LM_PLOTS = ("loss_vs_tokens.png", "loss_vs_time.png")


def write_overrides(run_dir: Path, overrides: Sequence[str]) -> None:
    """``.hydra/overrides.yaml`` as Hydra writes it: a YAML list of ``key=value``."""
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    text = "".join(f"- {o}\n" for o in overrides) if overrides else "[]\n"
    (run_dir / ".hydra" / "overrides.yaml").write_text(text)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def write_vision_run(
    run_dir: Path,
    topology: str,
    speeds: Sequence[float],
    accs: Sequence[float],
    consensus: Sequence[float] | None = None,
    network: str = "none",
    dataset: str = "digits",
    synthetic: bool = False,
    world_size: int = 4,
    optim: str = "sgd",
    seed: int = 0,
    seconds_per_epoch: float = 10.0,
    overrides: Sequence[str] | None = None,
    **extra: Any,
) -> None:
    """Lines as the loop logs them (train lines, then an eval line per epoch) and its summary.

    With ``overrides``, also ``.hydra/overrides.yaml``; ``extra`` goes into the summary.
    """
    logger = MetricsLogger(run_dir)
    step = 0
    for epoch, acc in enumerate(accs, 1):
        for speed in speeds:
            step += 5
            line: dict[str, Any] = {
                "step": step,
                "epoch": epoch - 0.5,
                "time_s": seconds_per_epoch * (epoch - 0.5),
                "train/loss": 2.0 / (step + 1),
                "train/lr": 0.1,
                "perf/samples_per_s": speed,
                "perf/step_s": 0.01,
                "comm/wait_s": 0.001,
            }
            if consensus is not None:  # the sketch estimate, on every metrics line
                line["consensus/distance_sketch"] = 1.1 * consensus[epoch - 1]
            logger.log(line)
        eval_line = {"step": step, "epoch": float(epoch), "time_s": seconds_per_epoch * epoch,
                     "eval/acc": acc, "eval/acc_local": acc - 0.01,
                     "eval/loss": 1 - acc}  # fmt: skip
        if consensus is not None:
            eval_line["consensus/distance"] = consensus[epoch - 1]
        logger.log(eval_line)
    logger.close()
    write_summary(run_dir, {
        "topology": topology,
        "world_size": world_size,
        "train/steps": step,
        "eval/acc": accs[-1],
        "eval/acc_local": accs[-1] - 0.01,
        "perf/samples_per_s": sum(speeds) / len(speeds),  # every epoch logs the same speeds
        "consensus/distance": sum(consensus) / len(consensus) if consensus else None,
        "wall_time_s": seconds_per_epoch * len(accs) + 1,
        "dataset": dataset,
        "model": "small_cnn",
        "optim": optim,
        "network": network,
        "emulated": network != "none",
        "synthetic": synthetic,
        "restarts": 0,
        "resumed_from_step": None,
        "seed": seed,
        "batch_size": 32,
        "config_hash": f"{topology}-{optim}-{seed}-{network}",  # differs with the seed
        **extra,
    })  # fmt: skip
    if overrides is not None:
        write_overrides(run_dir, overrides)


def write_lm_run(
    run_dir: Path,
    topology: str,
    optim: str,
    seed: int,
    *,
    final_loss: float,
    tokens_per_s: float,
    overrides: Sequence[str] | None = None,
) -> None:
    """A language-model run: train lines with ``tokens``, eval lines with loss and perplexity.

    Eval loss falls linearly from ``final_loss + evals - 1`` to ``final_loss``; wall time is
    tokens over ``tokens_per_s``.
    """
    import math

    evals, tokens_per_eval, world_size = 4, 65536, 4
    logger = MetricsLogger(run_dir)
    step = 0
    for k in range(1, evals + 1):
        for half in (0.5, 1.0):
            step += 10
            tokens = int((k - 1 + half) * tokens_per_eval)
            row: dict[str, Any] = {"step": step, "tokens": tokens, "time_s": tokens / tokens_per_s}
            loss = final_loss + (evals - k) + (1.0 - half)
            logger.log({**row, "train/loss": loss + 0.05, "perf/tokens_per_s": tokens_per_s})
        logger.log({**row, "eval/loss": loss, "eval/loss_local": loss + 0.02,
                    "eval/ppl": math.exp(loss)})  # fmt: skip
    logger.close()
    write_summary(run_dir, {
        "topology": topology, "world_size": world_size, "train/steps": step,
        "eval/loss": final_loss, "eval/ppl": math.exp(final_loss),
        "eval/loss_local": final_loss + 0.02, "perf/tokens_per_s": tokens_per_s,
        "tokens": evals * tokens_per_eval, "unigram_entropy": 7.25,
        "wall_time_s": evals * tokens_per_eval / tokens_per_s + 1,
        "dataset": "tokens", "model": "gpt", "optim": optim, "network": "none",
        "emulated": False, "synthetic": False, "restarts": 0, "resumed_from_step": None,
        "seed": seed, "config_hash": f"{seed:06x}",
    })  # fmt: skip
    if overrides is not None:
        write_overrides(run_dir, overrides)


# 2 topologies x 2 optimizers x 3 seeds, as a Hydra multirun numbers its jobs
GRID = [(t, o, s) for t in ("allreduce", "ring") for o in ("sgd", "qgm_sgd") for s in (0, 1, 2)]
# final accuracy of each (topology, optimizer) at seed 0; each seed adds 0.01
VISION_ACC = {("allreduce", "sgd"): 0.95, ("allreduce", "qgm_sgd"): 0.94,
              ("ring", "sgd"): 0.90, ("ring", "qgm_sgd"): 0.92}  # fmt: skip
VISION_SPEED = {"allreduce": 1000.0, "ring": 1500.0}  # seed s adds 10 * s


def vision_grid(root: Path, hydra: bool = True) -> Path:
    """The vision sweep: accuracy ``a - 0.2, a - 0.1, a`` over 3 epochs, seed s adding 0.01 s.

    Seeds take ``10 + s`` seconds per epoch, so their time axes differ.
    """
    for job, (topology, optim, seed) in enumerate(GRID):
        final = VISION_ACC[(topology, optim)] + 0.01 * seed
        speed = VISION_SPEED[topology] + 10.0 * seed
        consensus = None if topology == "allreduce" else [4e-3, 2e-3, 1e-3 * (1 + seed)]
        write_vision_run(
            root / str(job), topology, [speed, speed], [final - 0.2, final - 0.1, final],
            consensus, optim=optim, seed=seed, seconds_per_epoch=10.0 + seed,
            overrides=[f"optim={optim}", f"topology={topology}", f"train.seed={seed}"]
            if hydra else None,
        )  # fmt: skip
    return root


LM_OPTIMS = ("adamw", "accum_adamw")
# final eval/loss of each (topology, optimizer) at seed 0; each seed adds 0.01
LM_LOSS = {("allreduce", "adamw"): 3.00, ("allreduce", "accum_adamw"): 3.05,
           ("ring", "adamw"): 3.10, ("ring", "accum_adamw"): 3.20}  # fmt: skip
LM_SPEED = {"allreduce": 1000.0, "ring": 1200.0}  # seed s adds 10 * s


def lm_grid(root: Path) -> Path:
    """The language-model sweep, same grid as :func:`vision_grid` with the LM optimizers."""
    for job, (topology, optim, seed) in enumerate(GRID):
        optim = LM_OPTIMS[("sgd", "qgm_sgd").index(optim)]
        write_lm_run(
            root / str(job), topology, optim, seed,
            final_loss=LM_LOSS[(topology, optim)] + 0.01 * seed,
            tokens_per_s=LM_SPEED[topology] + 10.0 * seed,
            overrides=[f"topology={topology}", f"optim={optim}", "model=gpt", "dataset=tokens",
                       f"train.seed={seed}"],
        )  # fmt: skip
    return root


def table(text: str, heading: str = "configuration") -> list[dict[str, str]]:
    """Rows of every markdown table in ``text`` whose first column is ``heading``, as dicts."""
    rows: list[dict[str, str]] = []
    head: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("| "):
            head = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if head is None:
            head = cells
        elif set(cells[0]) != {"-"} and head[0] == heading:
            rows.append(dict(zip(head, cells)))
    return rows


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next ``## `` heading."""
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]
