"""The figures of the lm_gap page, where the decentralized optimizer's gap comes from (see
:mod:`experiments.report.figures`).

Ids: ``gap.ARM.STAT`` for the study's arms at 32 windows (``gap.complete.seed1``), ``gap.wN.*``
for N windows per worker, ``gap.ARM.lrLR`` for one run of an lr grid, ``gap.X.gap.*`` for a gap
paired by seed, ``gap.stall.*`` for the stall's logged steps, ``gap.reruns.*`` for the reruns.
"""

from __future__ import annotations

import statistics

from experiments.report.doc_data import Source
from experiments.report.figures.families import (
    L3,
    each,
    extremes,
    gaps,
    grid,
    mean_sd,
    slot_cells,
    stats,
    table,
)
from experiments.report.figures.sources import (
    DILOCO_T,
    GAP,
    LOCAL_T,
    Figure,
    Fn,
    diff,
    logged,
    mean,
    rerun_stat,
    run,
)

MB = "comm/bytes_per_step"
ARMS = ("allreduce", "complete")
W8_LRS = "5e-4 1e-3 2e-3 4e-3 8e-3 1.6e-2"
W128_LRS = "1e-3 2e-3 4e-3 8e-3"
SGD_LRS = "0.125 0.25 0.5 1.0 2.0"
STALL = "docs/results/lm_gap/stall"


def _mb(rel_dir: str, key: str = MB) -> Fn:
    """One run's bytes per step, in MB."""
    return lambda s: s.run(rel_dir, key) / 1e6


def _seed0(prefix: str, rel_dir: str) -> dict[str, Figure]:
    """Seed 0's final loss (``prefix.seed0``) and bytes (``prefix.mb``) of one run."""
    return {
        f"{prefix}.seed0": Figure(run(rel_dir), L3),
        f"{prefix}.mb": Figure(_mb(rel_dir), "{:.3g}"),
    }


def _lagged(prefix: str, arm: str, lrs: str) -> dict[str, Figure]:
    """A LaggedVAdamW arm's seed-0 runs, one per lr (``prefix.lr4e-3`` and ``.lr4e-3.mb``)."""
    out: dict[str, Figure] = {}
    for lr, folder in zip(lrs.split(), ("0", "lr2e-3", "lr0.001"), strict=False):
        out.update(_seed0(f"{prefix}.lr{lr}", f"{GAP}/{arm}/stage1/{folder}"))
    return out


def _k_moves(s: Source) -> float:
    """The largest move, at seed 0, that sharing ``exp_avg_sq`` (any K) gives either topology."""
    pairs = [("complete-adamw-lr0.004/final/seed0", f"complete-v/stage1/{i}") for i in (0, 1)]
    pairs.append(("complete-adamw-lr0.004/final/seed0", "complete-v/final/seed0"))
    pairs += [
        ("one-peer-exp-adamw-lr0.004/final/seed0", f"one-peer-exp-v/stage1/{i}") for i in (0, 1, 2)
    ]
    return max(abs(s.run(f"{GAP}/{b}") - s.run(f"{GAP}/{a}")) for a, b in pairs)


def _train_loss(run_name: str, step: int) -> Fn:
    return logged(f"{STALL}/{run_name}/metrics.jsonl", step, "train/loss")


def _peaks(s: Source) -> list[float]:
    """The consensus distance just before each average after warm-up (steps 30, 46, 62), of
    ``local-sgd`` seeds 0 and 1."""
    return [
        logged(f"{STALL}/local-seed{i}/metrics.jsonl", step, "consensus/distance_sketch")(s)
        for i in (0, 1)
        for step in (30, 46, 62)
    ]


def _norms(s: Source, averaging: bool) -> list[float]:
    """``train/update_norm`` of ``local-sgd`` seeds 0 and 1 from step 18 to 64: at the averaging
    steps (every 16th), or at the local ones."""
    return [
        logged(f"{STALL}/local-seed{i}/metrics.jsonl", step, "train/update_norm")(s)
        for i in (0, 1)
        for step in range(18, 65, 2)
        if (step % 16 == 0) == averaging
    ]


def _ahead(base: str, other: str) -> Fn:
    """On how many seeds ``other`` ends below ``base``."""
    return lambda s: sum(g < 0 for g in s.paired_gap(base, other))


FIGURES: dict[str, Figure] = {
    # lm_gap: the reruns
    "gap.reruns.n": Figure(rerun_stat("n")),
    "gap.reruns.differ": Figure(rerun_stat("differ")),
    "gap.reruns.largest": Figure(rerun_stat("largest")),
    "gap.reruns.exact": Figure(rerun_stat("same")),
    "gap.local-h16.lr4e-3.seed1-all-digits": Figure(
        run(f"{GAP}/local-sgd-H16-lr/final/seed1"), "{!r}"
    ),
    # lm_gap: the arms at 32 windows, Adam's state shared
    **stats("gap.allreduce", f"{GAP}/allreduce-adamw/final"),
    **stats("gap.complete", f"{GAP}/complete-adamw-lr0.004/final"),
    **stats("gap.complete-v16", f"{GAP}/complete-v/final", names="seed0 seed1 seed2 mean"),
    **stats(
        "gap.one-peer-exp",
        f"{GAP}/one-peer-exp-adamw-lr0.004/final",
        names="seed0 seed1 seed2 mean",
    ),
    "gap.complete-v1.seed0": Figure(run(f"{GAP}/complete-v/stage1/0"), L3),
    "gap.complete-v4.seed0": Figure(run(f"{GAP}/complete-v/stage1/1"), L3),
    **{
        f"gap.one-peer-exp-v{k}.seed0": Figure(run(f"{GAP}/one-peer-exp-v/stage1/{i}"), L3)
        for i, k in enumerate((1, 4, 16))
    },
    "gap.k.largest-move": Figure(_k_moves, "{:.3f}"),
    "gap.complete.mb": Figure(_mb(f"{GAP}/complete-adamw-lr0.004/final/seed0"), "{:.3g}"),
    "gap.complete-v1.mb": Figure(_mb(f"{GAP}/complete-v/stage1/0"), "{:.3g}"),
    **_seed0("gap.complete-m1", f"{GAP}/complete-m/stage1/0"),
    **_seed0("gap.complete-mv1", f"{GAP}/complete-mv/stage1/0"),
    **{
        f"gap.{arm}.vs-complete": Figure(
            lambda s, rel=rel: (
                s.run(f"{GAP}/{rel}") - s.run(f"{GAP}/complete-adamw-lr0.004/final/seed0")
            ),
            "{:+.3f}",
            minus=True,
        )
        for arm, rel in (
            ("allreduce", "allreduce-adamw/final/seed0"),
            ("complete-v1", "complete-v/stage1/0"),
            ("complete-m1", "complete-m/stage1/0"),
            ("complete-mv1", "complete-mv/stage1/0"),
        )
    },
    **_seed0("gap.lagged-v0", f"{GAP}/complete-lagged-v0/stage1/0"),
    **_lagged("gap.lagged-v1", "complete-lagged-v1", "4e-3 2e-3 1e-3"),
    **_lagged("gap.lagged-m1", "complete-lagged-m1", "4e-3 2e-3"),
    # lm_gap: the batch per worker
    **stats("gap.w8.allreduce", f"{GAP}/allreduce-w8/final", names="mean sd"),
    **stats("gap.w8.complete", f"{GAP}/complete-w8/final", names="mean sd"),
    **stats("gap.w128.allreduce", f"{GAP}/allreduce-w128/final", names="mean sd"),
    **stats("gap.w128.complete", f"{GAP}/complete-w128/final", names="mean sd"),
    **{
        k: v
        for a in ARMS
        for k, v in grid(f"gap.w8.{a}.lr", f"{GAP}/{a}-w8/stage1", W8_LRS).items()
    },
    **{
        k: v
        for a in ARMS
        for k, v in grid(f"gap.w128.{a}.lr", f"{GAP}/{a}-w128/stage1", W128_LRS).items()
    },
    **gaps("gap.w8.gap", f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final"),
    **gaps("gap.w32.gap", f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final"),
    **gaps("gap.w128.gap", f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final"),
    "gap.w8.complete.below-w32-allreduce": Figure(
        diff(mean(f"{GAP}/allreduce-adamw/final"), mean(f"{GAP}/complete-w8/final")), L3
    ),
    # lm_gap: AdamW one step late
    **grid("gap.delayed.lr", f"{GAP}/allreduce-delayed/stage1", "5e-4 1e-3 2e-3 4e-3 8e-3"),
    **stats("gap.delayed", f"{GAP}/allreduce-delayed/final"),
    **gaps(
        "gap.delayed.gap",
        f"{GAP}/allreduce-adamw/final",
        f"{GAP}/allreduce-delayed/final",
        names="mean sd",
    ),
    # lm_gap: the local arms' inner lr (H=16)
    **grid("gap.local-h16.lr", f"{GAP}/local-sgd-H16-lr/stage1", "5e-4 1e-3 8e-3"),
    **stats("gap.local-h16-lr2e-3", LOCAL_T),
    **grid("gap.diloco-h16.lr", f"{GAP}/diloco-H16-lr/stage1", "1e-3 4e-3 8e-3"),
    **stats("gap.diloco-h16-lr2e-3", DILOCO_T),
    **grid(
        "gap.diloco-h16-lr2e-3.outer-lr",
        f"{GAP}/diloco-H16-outer/stage1",
        "0.3 0.5 0.7 1.0",
        "outer.lr",
    ),
    "gap.diloco-h16-lr2e-3.seed1-above-others": Figure(
        lambda s: s.seeds(DILOCO_T)[1] - (s.seeds(DILOCO_T)[0] + s.seeds(DILOCO_T)[2]) / 2, "{:.2f}"
    ),
    **gaps("gap.diloco-vs-local-h16-lr2e-3", LOCAL_T, DILOCO_T, names="seed0 seed1 seed2 mean"),
    # lm_gap: SGD
    **{
        k: v
        for a in ARMS
        for k, v in grid(f"gap.sgd.{a}.lr", f"{GAP}/{a}-sgd/stage1", SGD_LRS).items()
    },
    **stats("gap.sgd.allreduce", f"{GAP}/allreduce-sgd/final"),
    **stats("gap.sgd.complete", f"{GAP}/complete-sgd/final"),
    **gaps("gap.sgd.gap", f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final", minus=True),
    "gap.sgd.complete.seeds-ahead": Figure(
        _ahead(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final"), "{}"
    ),
    # lm_gap: seed 1's stall (train/loss logged every 2 steps)
    **{
        f"gap.stall.{name}.step{step}": Figure(_train_loss(name, step), "{:.2f}")
        for name, step in (
            ("local-seed1", 22),
            ("local-seed1", 26),
            ("local-seed0", 22),
            ("local-seed0", 26),
            ("complete-seed1", 24),
            ("allreduce-seed1", 22),
        )
    },
    **each(
        "gap.stall.lr-e-3",
        "{:.1f}",
        step22=lambda s: 1e3 * logged(f"{STALL}/local-seed1/metrics.jsonl", 22, "train/lr")(s),
        step26=lambda s: 1e3 * logged(f"{STALL}/local-seed1/metrics.jsonl", 26, "train/lr")(s),
    ),
    **extremes(
        "gap.stall.consensus-before-average",
        "{:.0f}",
        lambda s: _peaks(s),
    ),
    "gap.stall.update-norm.local-mean": Figure(
        lambda s: statistics.mean(_norms(s, False)), "{:.1f}"
    ),
    **extremes(
        "gap.stall.update-norm.averaging",
        "{:.1f}",
        lambda s: _norms(s, True),
    ),
    "gap.unigram-entropy": Figure(
        lambda s: s.run(f"{GAP}/allreduce-adamw/final/seed0", "unigram_entropy"), "{:.2f}"
    ),
}


def _row(labels: str, prefix: str, names: str, *rest: str) -> list[str]:
    """A table row: the cells of ``labels`` (``|``-separated), then ``prefix``'s figures
    ``names``, then the cells ``rest``."""
    return [*labels.split(" | "), *slot_cells(prefix, names), *rest]


def _lrs(
    label: str, prefix: str, lrs: str, best: str, before: int = 0, after: int = 0
) -> list[str]:
    """A row of an lr grid: ``prefix.lrLR`` for each of ``lrs``, ``best`` in bold, with empty
    cells for the grid's values the row did not run."""
    cells = [
        f"**{{{{{prefix}.lr{lr}}}}}**" if lr == best else f"{{{{{prefix}.lr{lr}}}}}"
        for lr in lrs.split()
    ]
    return [label, *[""] * before, *cells, *[""] * after]


def _seeds(label: str, prefix: str, bold: bool = False) -> list[str]:
    """A row of an arm's seeds 0 to 2 and their mean ± sd."""
    return [label, *slot_cells(prefix), mean_sd(prefix, bold)]


def _one(label: str, figure: str) -> list[str]:
    """A row of one seed-0 figure, the other seeds and the mean left empty."""
    return [label, "{{" + figure + "}}", "", "", ""]


def _batch(labels: str, prefix: str, lr: str) -> list[str]:
    """A row of the batch table: both arms' mean ± sd at their best lr."""
    cells = (f"{mean_sd(f'{prefix}.{arm}')} ({lr})" for arm in ("allreduce", "complete"))
    return [*labels.split(" | "), "4.19M", *cells]


SEEDS = "seed 0 | seed 1 | seed 2"
LR_ROW = "---|---:|---:|---:|---:|---:"

TABLES: dict[str, str] = {
    "gap.state-sync-k": table(
        f"arm | K | {SEEDS} | mean",
        LR_ROW,
        [
            _row("`allreduce` | –", "gap.allreduce", "seed0 seed1 seed2 mean"),
            _row("`complete` | off", "gap.complete", "seed0 seed1 seed2 mean"),
            _row("`complete`, v shared | 1", "gap.complete-v1", "seed0", "", "", ""),
            _row("`complete`, v shared | 4", "gap.complete-v4", "seed0", "", "", ""),
            _row(
                "`complete`, v shared | 16 (best of seed 0)",
                "gap.complete-v16",
                "seed0 seed1 seed2 mean",
            ),
            _row("`one-peer-exp` | off", "gap.one-peer-exp", "seed0 seed1 seed2 mean"),
            *(
                _row(
                    f"`one-peer-exp`, v shared | {k}", f"gap.one-peer-exp-v{k}", "seed0", "", "", ""
                )
                for k in (1, 4, 16)
            ),
        ],
    ),
    "gap.moments": table(
        "arm | state averaged every step | seed 0 | vs `complete` | `comm/bytes_per_step`",
        "---|---|---:|---:|---:",
        [
            _row("`allreduce` | –", "gap.allreduce", "seed0 vs-complete", ""),
            _row("`complete` | none", "gap.complete", "seed0", "0", "{{gap.complete.mb}} MB"),
            *(
                _row(f"`complete` | {state}", arm, "seed0 vs-complete", "{{" + arm + ".mb}} MB")
                for state, arm in (
                    ("`exp_avg_sq`", "gap.complete-v1"),
                    ("`exp_avg`", "gap.complete-m1"),
                    ("`exp_avg` and `exp_avg_sq`", "gap.complete-mv1"),
                )
            ),
        ],
    ),
    "gap.lagged-v": table(
        "arm (`complete`) | lr | seed 0 | `comm/bytes_per_step`",
        "---|---:|---:|---:",
        [
            ["AdamW (the baseline)", "4e-3", "{{gap.complete.seed0}}", "{{gap.complete.mb}} MB"],
            [
                "LaggedVAdamW, nothing shared (the lag and clip alone)",
                "4e-3",
                "{{gap.lagged-v0.seed0}}",
                "{{gap.lagged-v0.mb}} MB",
            ],
            *(
                [
                    f"LaggedVAdamW, `v` from the mean gradient{extra}",
                    lr,
                    "{{" + f"{arm}.lr{lr}.seed0" + "}}",
                    "{{" + f"{arm}.lr{lr}.mb" + "}} MB",
                ]
                for extra, arm, lr in (
                    ("", "gap.lagged-v1", "4e-3"),
                    ("", "gap.lagged-v1", "2e-3"),
                    ("", "gap.lagged-v1", "1e-3"),
                    (", `m` shared", "gap.lagged-m1", "4e-3"),
                    (", `m` shared", "gap.lagged-m1", "2e-3"),
                )
            ),
        ],
    ),
    "gap.batch": table(
        "windows per worker | global batch | steps | warm-up | tokens | `allreduce` (best lr)"
        " | `complete` (best lr)",
        "---:|---:|---:|---:|---:|---:|---:",
        [
            _batch("8 | 32 | 2048 | 128", "gap.w8", "8e-3"),
            _batch("32 (`lm_small`) | 128 | 512 | 32", "gap", "4e-3"),
            _batch("128 | 512 | 128 | 8", "gap.w128", "2e-3"),
        ],
    ),
    "gap.batch-lr": table(
        "`optim.lr` (seed 0) | 5e-4 | 1e-3 | 2e-3 | 4e-3 | 8e-3 | 1.6e-2",
        LR_ROW + "|---:",
        [
            *(_lrs(f"`{arm}`, 8 windows", f"gap.w8.{arm}", W8_LRS, "8e-3") for arm in ARMS),
            *(
                _lrs(f"`{arm}`, 128 windows", f"gap.w128.{arm}", W128_LRS, "2e-3", 1, 1)
                for arm in ARMS
            ),
        ],
    ),
    "gap.batch-gap": table(
        f"gap, paired by seed ([gap/](gap/gap.md)) | {SEEDS} | mean ± sd",
        "---|---:|---:|---:|---:",
        [
            _seeds("8 windows, 2048 steps", "gap.w8.gap", bold=True),
            _seeds("32 windows, 512 steps", "gap.w32.gap"),
            _seeds("128 windows, 128 steps", "gap.w128.gap"),
        ],
    ),
    "gap.delayed-lr": table(
        "`optim.lr` (seed 0) | 5e-4 | 1e-3 | 2e-3 | 4e-3 | 8e-3",
        LR_ROW,
        [
            _lrs(
                "`allreduce`, AdamW one step late",
                "gap.delayed",
                "5e-4 1e-3 2e-3 4e-3 8e-3",
                "1e-3",
            ),
            _lrs("`allreduce` ([../lm](../lm/README.md))", "lm.allreduce", W128_LRS, "4e-3", 1),
        ],
    ),
    "gap.local-h16-lr": table(
        f"`local-sgd` H=16, `optim.lr` | {SEEDS} | mean ± sd",
        "---|---:|---:|---:|---:",
        [
            _one("5e-4", "gap.local-h16.lr5e-4"),
            _one("1e-3", "gap.local-h16.lr1e-3"),
            _seeds("2e-3", "gap.local-h16-lr2e-3", bold=True),
            _seeds("4e-3 (allreduce's, committed)", "outer.local-sgd-h16"),
            _one("8e-3", "gap.local-h16.lr8e-3"),
        ],
    ),
    "gap.diloco-h16-lr": table(
        f"DiLoCo H=16 (outer lr 0.5), `optim.lr` | {SEEDS} | mean ± sd",
        "---|---:|---:|---:|---:",
        [
            _one("1e-3", "gap.diloco-h16.lr1e-3"),
            _seeds("2e-3 (best of seed 0)", "gap.diloco-h16-lr2e-3", bold=True),
            _one("4e-3 (allreduce's, committed)", "gap.diloco-h16.lr4e-3"),
            _one("8e-3", "gap.diloco-h16.lr8e-3"),
        ],
    ),
    "gap.sgd-lr": table(
        "`optim.lr` (seed 0) | 0.125 | 0.25 | 0.5 | 1.0 | 2.0",
        LR_ROW,
        [_lrs(f"`{arm}`", f"gap.sgd.{arm}", SGD_LRS, "0.25") for arm in ARMS],
    ),
    "gap.sgd": table(
        f"at the best lr (0.25 for both) | {SEEDS} | mean ± sd",
        "---|---:|---:|---:|---:",
        [
            _seeds("`allreduce`", "gap.sgd.allreduce"),
            _seeds("`complete`", "gap.sgd.complete"),
            _seeds("gap, paired by seed", "gap.sgd.gap", bold=True),
        ],
    ),
}
