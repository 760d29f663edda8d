"""The figures of the language-model pages: lm, lm_gap, streaming and outer (see :mod:`experiments.report.figures`).

A table more than a module: one entry per figure or table of the pages, so its length follows
the pages' figures and it stays one room per group of pages.
"""

from __future__ import annotations

from experiments.report.figures.sources import (
    DILOCO,
    DILOCO_T,
    GAP,
    INT8,
    LINK,
    LM,
    LOCAL_T,
    OUTER,
    STREAM,
    Figure,
    at,
    calibration,
    diff,
    gap_mean,
    gap_sd,
    gpt_tiny_params,
    link_arm,
    mean,
    paired,
    ratio,
    rerun_stat,
    run,
    sd,
    seed,
)

FIGURES: dict[str, Figure] = {
    "lm.gpt-tiny-params": Figure(gpt_tiny_params, "{:,}"),
    "gap.reruns-n": Figure(rerun_stat("n")),
    "gap.reruns-differ": Figure(rerun_stat("differ")),
    "gap.reruns-largest": Figure(rerun_stat("largest")),
    "lm.learning-rate-ends-at": Figure(
        lambda s: s.run(f"{LM}/one-peer-exp-accum8/stage1/0"), "{:.3f}"
    ),
    "lm.at-with-seed-against": Figure(
        lambda s: s.run(f"{LM}/one-peer-exp-accum/stage1/0"), "{:.3f}"
    ),
    "lm.with-accum-iter-and": Figure(
        lambda s: s.run(f"{LM}/one-peer-exp-accum/stage1/1"), "{:.3f}"
    ),
    "lm.learning-rate-it-is": Figure(
        diff(
            mean(f"{LM}/one-peer-exp-accum/final"), mean(f"{LM}/one-peer-exp-adamw-lr0.004/final")
        ),
        "{:.2f}",
    ),
    "lm.peer-exp-from-seed": Figure(lambda s: s.run(f"{LM}/complete-adamw/stage1/3"), "{:.3f}"),
    "lm.exp-from-seed-and": Figure(lambda s: s.run(f"{LM}/one-peer-exp-adamw/stage1/3"), "{:.3f}"),
    "gap.table1.allreduce.seed-0": Figure(seed(f"{GAP}/allreduce-adamw/final", 0), "{:.3f}"),
    "gap.table1.allreduce.seed-1": Figure(seed(f"{GAP}/allreduce-adamw/final", 1), "{:.3f}"),
    "gap.table1.allreduce.seed-2": Figure(seed(f"{GAP}/allreduce-adamw/final", 2), "{:.3f}"),
    "gap.table1.allreduce.mean": Figure(mean(f"{GAP}/allreduce-adamw/final"), "{:.3f}"),
    "gap.table1.complete.seed-0": Figure(seed(f"{GAP}/complete-adamw-lr0.004/final", 0), "{:.3f}"),
    "gap.table1.complete.seed-1": Figure(seed(f"{GAP}/complete-adamw-lr0.004/final", 1), "{:.3f}"),
    "gap.table1.complete.seed-2": Figure(seed(f"{GAP}/complete-adamw-lr0.004/final", 2), "{:.3f}"),
    "gap.table1.complete.mean": Figure(mean(f"{GAP}/complete-adamw-lr0.004/final"), "{:.3f}"),
    "gap.table1.complete-v-shared.seed-0": Figure(run(f"{GAP}/complete-v/stage1/0"), "{:.3f}"),
    "gap.table1.complete-v-shared.seed-0-2": Figure(run(f"{GAP}/complete-v/stage1/1"), "{:.3f}"),
    "gap.table1.complete-v-shared.seed-0-3": Figure(seed(f"{GAP}/complete-v/final", 0), "{:.3f}"),
    "gap.table1.complete-v-shared.seed-1": Figure(seed(f"{GAP}/complete-v/final", 1), "{:.3f}"),
    "gap.table1.complete-v-shared.seed-2": Figure(seed(f"{GAP}/complete-v/final", 2), "{:.3f}"),
    "gap.table1.complete-v-shared.mean": Figure(mean(f"{GAP}/complete-v/final"), "{:.3f}"),
    "gap.table1.one-peer-exp.seed-0": Figure(
        seed(f"{GAP}/one-peer-exp-adamw-lr0.004/final", 0), "{:.3f}"
    ),
    "gap.table1.one-peer-exp.seed-1": Figure(
        seed(f"{GAP}/one-peer-exp-adamw-lr0.004/final", 1), "{:.3f}"
    ),
    "gap.table1.one-peer-exp.seed-2": Figure(
        seed(f"{GAP}/one-peer-exp-adamw-lr0.004/final", 2), "{:.3f}"
    ),
    "gap.table1.one-peer-exp.mean": Figure(
        mean(f"{GAP}/one-peer-exp-adamw-lr0.004/final"), "{:.3f}"
    ),
    "gap.table1.one-peer-exp-v-shared.seed-0": Figure(
        run(f"{GAP}/one-peer-exp-v/stage1/0"), "{:.3f}"
    ),
    "gap.table1.one-peer-exp-v-shared.seed-0-2": Figure(
        run(f"{GAP}/one-peer-exp-v/stage1/1"), "{:.3f}"
    ),
    "gap.table1.one-peer-exp-v-shared.seed-0-3": Figure(
        run(f"{GAP}/one-peer-exp-v/stage1/2"), "{:.3f}"
    ),
    "gap.table2.allreduce.seed-0": Figure(run(f"{GAP}/allreduce-adamw/final/seed0"), "{:.3f}"),
    "gap.table2.complete.seed-0": Figure(
        run(f"{GAP}/complete-adamw-lr0.004/final/seed0"), "{:.3f}"
    ),
    "gap.table2.complete.comm-bytes-per-step": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-adamw-lr0.004/final/seed0'}", "comm/bytes_per_step")
            / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table2.complete.seed-0-2": Figure(run(f"{GAP}/complete-v/stage1/0"), "{:.3f}"),
    "gap.table2.complete.comm-bytes-per-step-2": Figure(
        lambda s: s.run(f"{GAP}/{'complete-v/stage1/0'}", "comm/bytes_per_step") / 1000000.0,
        "{:.3g}",
    ),
    "gap.table2.complete.seed-0-3": Figure(run(f"{GAP}/complete-m/stage1/0"), "{:.3f}"),
    "gap.table2.complete.comm-bytes-per-step-3": Figure(
        lambda s: s.run(f"{GAP}/{'complete-m/stage1/0'}", "comm/bytes_per_step") / 1000000.0,
        "{:.3g}",
    ),
    "gap.table2.complete.seed-0-4": Figure(run(f"{GAP}/complete-mv/stage1/0"), "{:.3f}"),
    "gap.table2.complete.comm-bytes-per-step-4": Figure(
        lambda s: s.run(f"{GAP}/{'complete-mv/stage1/0'}", "comm/bytes_per_step") / 1000000.0,
        "{:.3g}",
    ),
    "gap.table3.adamw-the-baseline.seed-0": Figure(
        run(f"{GAP}/complete-adamw-lr0.004/final/seed0"), "{:.3f}"
    ),
    "gap.table3.adamw-the-baseline.comm-bytes-per-step": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-adamw-lr0.004/final/seed0'}", "comm/bytes_per_step")
            / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table3.laggedvadamw-nothing-shared-the.seed-0": Figure(
        run(f"{GAP}/complete-lagged-v0/stage1/0"), "{:.3f}"
    ),
    "gap.table3.laggedvadamw-nothing-shared-the.comm-bytes-per-step": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-lagged-v0/stage1/0'}", "comm/bytes_per_step") / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0": Figure(
        run(f"{GAP}/complete-lagged-v1/stage1/0"), "{:.3f}"
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-lagged-v1/stage1/0'}", "comm/bytes_per_step") / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-2": Figure(
        run(f"{GAP}/complete-lagged-v1/stage1/lr2e-3"), "{:.3f}"
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-2": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-lagged-v1/stage1/lr2e-3'}", "comm/bytes_per_step") / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-3": Figure(
        run(f"{GAP}/complete-lagged-v1/stage1/lr0.001"), "{:.3f}"
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-3": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-lagged-v1/stage1/lr0.001'}", "comm/bytes_per_step") / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-4": Figure(
        run(f"{GAP}/complete-lagged-m1/stage1/0"), "{:.3f}"
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-4": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-lagged-m1/stage1/0'}", "comm/bytes_per_step") / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-5": Figure(
        run(f"{GAP}/complete-lagged-m1/stage1/lr2e-3"), "{:.3f}"
    ),
    "gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-5": Figure(
        lambda s: (
            s.run(f"{GAP}/{'complete-lagged-m1/stage1/lr2e-3'}", "comm/bytes_per_step") / 1000000.0
        ),
        "{:.3g}",
    ),
    "gap.table4.8.allreduce-best-lr": Figure(mean(f"{GAP}/allreduce-w8/final"), "{:.3f}"),
    "gap.table4.8.allreduce-best-lr-2": Figure(sd(f"{GAP}/allreduce-w8/final"), "{:.3f}"),
    "gap.table4.8.complete-best-lr": Figure(mean(f"{GAP}/complete-w8/final"), "{:.3f}"),
    "gap.table4.8.complete-best-lr-2": Figure(sd(f"{GAP}/complete-w8/final"), "{:.3f}"),
    "gap.table4.32-lm-small.allreduce-best-lr": Figure(
        mean(f"{GAP}/allreduce-adamw/final"), "{:.3f}"
    ),
    "gap.table4.32-lm-small.allreduce-best-lr-2": Figure(
        sd(f"{GAP}/allreduce-adamw/final"), "{:.3f}"
    ),
    "gap.table4.32-lm-small.complete-best-lr": Figure(
        mean(f"{GAP}/complete-adamw-lr0.004/final"), "{:.3f}"
    ),
    "gap.table4.32-lm-small.complete-best-lr-2": Figure(
        sd(f"{GAP}/complete-adamw-lr0.004/final"), "{:.3f}"
    ),
    "gap.table4.128.allreduce-best-lr": Figure(mean(f"{GAP}/allreduce-w128/final"), "{:.3f}"),
    "gap.table4.128.allreduce-best-lr-2": Figure(sd(f"{GAP}/allreduce-w128/final"), "{:.3f}"),
    "gap.table4.128.complete-best-lr": Figure(mean(f"{GAP}/complete-w128/final"), "{:.3f}"),
    "gap.table4.128.complete-best-lr-2": Figure(sd(f"{GAP}/complete-w128/final"), "{:.3f}"),
    "gap.table5.allreduce-8-windows.5e-4": Figure(
        at(f"{GAP}/allreduce-w8/stage1", 0.0005), "{:.3f}"
    ),
    "gap.table5.allreduce-8-windows.1e-3": Figure(
        at(f"{GAP}/allreduce-w8/stage1", 0.001), "{:.3f}"
    ),
    "gap.table5.allreduce-8-windows.2e-3": Figure(
        at(f"{GAP}/allreduce-w8/stage1", 0.002), "{:.3f}"
    ),
    "gap.table5.allreduce-8-windows.4e-3": Figure(
        at(f"{GAP}/allreduce-w8/stage1", 0.004), "{:.3f}"
    ),
    "gap.table5.allreduce-8-windows.8e-3": Figure(
        at(f"{GAP}/allreduce-w8/stage1", 0.008), "{:.3f}"
    ),
    "gap.table5.allreduce-8-windows.1-6e-2": Figure(
        at(f"{GAP}/allreduce-w8/stage1", 0.016), "{:.3f}"
    ),
    "gap.table5.complete-8-windows.5e-4": Figure(at(f"{GAP}/complete-w8/stage1", 0.0005), "{:.3f}"),
    "gap.table5.complete-8-windows.1e-3": Figure(at(f"{GAP}/complete-w8/stage1", 0.001), "{:.3f}"),
    "gap.table5.complete-8-windows.2e-3": Figure(at(f"{GAP}/complete-w8/stage1", 0.002), "{:.3f}"),
    "gap.table5.complete-8-windows.4e-3": Figure(at(f"{GAP}/complete-w8/stage1", 0.004), "{:.3f}"),
    "gap.table5.complete-8-windows.8e-3": Figure(at(f"{GAP}/complete-w8/stage1", 0.008), "{:.3f}"),
    "gap.table5.complete-8-windows.1-6e-2": Figure(
        at(f"{GAP}/complete-w8/stage1", 0.016), "{:.3f}"
    ),
    "gap.table5.allreduce-128-windows.1e-3": Figure(
        at(f"{GAP}/allreduce-w128/stage1", 0.001), "{:.3f}"
    ),
    "gap.table5.allreduce-128-windows.2e-3": Figure(
        at(f"{GAP}/allreduce-w128/stage1", 0.002), "{:.3f}"
    ),
    "gap.table5.allreduce-128-windows.4e-3": Figure(
        at(f"{GAP}/allreduce-w128/stage1", 0.004), "{:.3f}"
    ),
    "gap.table5.allreduce-128-windows.8e-3": Figure(
        at(f"{GAP}/allreduce-w128/stage1", 0.008), "{:.3f}"
    ),
    "gap.table5.complete-128-windows.1e-3": Figure(
        at(f"{GAP}/complete-w128/stage1", 0.001), "{:.3f}"
    ),
    "gap.table5.complete-128-windows.2e-3": Figure(
        at(f"{GAP}/complete-w128/stage1", 0.002), "{:.3f}"
    ),
    "gap.table5.complete-128-windows.4e-3": Figure(
        at(f"{GAP}/complete-w128/stage1", 0.004), "{:.3f}"
    ),
    "gap.table5.complete-128-windows.8e-3": Figure(
        at(f"{GAP}/complete-w128/stage1", 0.008), "{:.3f}"
    ),
    "gap.table6.8-windows-2048-steps.seed-0": Figure(
        paired(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final", 0), "{:+.3f}"
    ),
    "gap.table6.8-windows-2048-steps.seed-1": Figure(
        paired(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final", 1), "{:+.3f}"
    ),
    "gap.table6.8-windows-2048-steps.seed-2": Figure(
        paired(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final", 2), "{:+.3f}"
    ),
    "gap.table6.8-windows-2048-steps.mean-sd": Figure(
        gap_mean(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final"), "{:+.3f}"
    ),
    "gap.table6.8-windows-2048-steps.mean-sd-2": Figure(
        gap_sd(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final"), "{:.3f}"
    ),
    "gap.table6.32-windows-512-steps.seed-0": Figure(
        paired(f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final", 0), "{:+.3f}"
    ),
    "gap.table6.32-windows-512-steps.seed-1": Figure(
        paired(f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final", 1), "{:+.3f}"
    ),
    "gap.table6.32-windows-512-steps.seed-2": Figure(
        paired(f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final", 2), "{:+.3f}"
    ),
    "gap.table6.32-windows-512-steps.mean-sd": Figure(
        gap_mean(f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final"), "{:+.3f}"
    ),
    "gap.table6.32-windows-512-steps.mean-sd-2": Figure(
        gap_sd(f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final"), "{:.3f}"
    ),
    "gap.table6.128-windows-128-steps.seed-0": Figure(
        paired(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final", 0), "{:+.3f}"
    ),
    "gap.table6.128-windows-128-steps.seed-1": Figure(
        paired(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final", 1), "{:+.3f}"
    ),
    "gap.table6.128-windows-128-steps.seed-2": Figure(
        paired(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final", 2), "{:+.3f}"
    ),
    "gap.table6.128-windows-128-steps.mean-sd": Figure(
        gap_mean(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final"), "{:+.3f}"
    ),
    "gap.table6.128-windows-128-steps.mean-sd-2": Figure(
        gap_sd(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final"), "{:.3f}"
    ),
    "gap.table7.allreduce-adamw-one-step-late.5e-4": Figure(
        at(f"{GAP}/allreduce-delayed/stage1", 0.0005), "{:.3f}"
    ),
    "gap.table7.allreduce-adamw-one-step-late.1e-3": Figure(
        at(f"{GAP}/allreduce-delayed/stage1", 0.001), "{:.3f}"
    ),
    "gap.table7.allreduce-adamw-one-step-late.2e-3": Figure(
        at(f"{GAP}/allreduce-delayed/stage1", 0.002), "{:.3f}"
    ),
    "gap.table7.allreduce-adamw-one-step-late.4e-3": Figure(
        at(f"{GAP}/allreduce-delayed/stage1", 0.004), "{:.3f}"
    ),
    "gap.table7.allreduce-adamw-one-step-late.8e-3": Figure(
        at(f"{GAP}/allreduce-delayed/stage1", 0.008), "{:.3f}"
    ),
    "gap.table7.allreduce-lm-lm-readme-md.1e-3": Figure(
        at(f"{LM}/allreduce-adamw/stage1", 0.001), "{:.3f}"
    ),
    "gap.table7.allreduce-lm-lm-readme-md.2e-3": Figure(
        at(f"{LM}/allreduce-adamw/stage1", 0.002), "{:.3f}"
    ),
    "gap.table7.allreduce-lm-lm-readme-md.4e-3": Figure(
        at(f"{LM}/allreduce-adamw/stage1", 0.004), "{:.3f}"
    ),
    "gap.table7.allreduce-lm-lm-readme-md.8e-3": Figure(
        at(f"{LM}/allreduce-adamw/stage1", 0.008), "{:.3f}"
    ),
    "gap.table8.5e-4.seed-0": Figure(at(f"{GAP}/local-sgd-H16-lr/stage1", 0.0005), "{:.3f}"),
    "gap.table8.1e-3.seed-0": Figure(at(f"{GAP}/local-sgd-H16-lr/stage1", 0.001), "{:.3f}"),
    "gap.table8.2e-3.seed-0": Figure(seed(LOCAL_T, 0), "{:.3f}"),
    "gap.table8.2e-3.seed-1": Figure(seed(LOCAL_T, 1), "{:.3f}"),
    "gap.table8.2e-3.seed-2": Figure(seed(LOCAL_T, 2), "{:.3f}"),
    "gap.table8.2e-3.mean-sd": Figure(mean(LOCAL_T), "{:.3f}"),
    "gap.table8.2e-3.mean-sd-2": Figure(sd(LOCAL_T), "{:.3f}"),
    "gap.table8.4e-3-allreduce-s-committed.seed-0": Figure(
        seed(f"{OUTER}/local-sgd-H16/final", 0), "{:.3f}"
    ),
    "gap.table8.4e-3-allreduce-s-committed.seed-1": Figure(
        seed(f"{OUTER}/local-sgd-H16/final", 1), "{:.3f}"
    ),
    "gap.table8.4e-3-allreduce-s-committed.seed-2": Figure(
        seed(f"{OUTER}/local-sgd-H16/final", 2), "{:.3f}"
    ),
    "gap.table8.4e-3-allreduce-s-committed.mean-sd": Figure(
        mean(f"{OUTER}/local-sgd-H16/final"), "{:.3f}"
    ),
    "gap.table8.4e-3-allreduce-s-committed.mean-sd-2": Figure(
        sd(f"{OUTER}/local-sgd-H16/final"), "{:.3f}"
    ),
    "gap.table8.8e-3.seed-0": Figure(at(f"{GAP}/local-sgd-H16-lr/stage1", 0.008), "{:.3f}"),
    "gap.table9.1e-3.seed-0": Figure(at(f"{GAP}/diloco-H16-lr/stage1", 0.001), "{:.3f}"),
    "gap.table9.2e-3-best-of-seed-0.seed-0": Figure(seed(DILOCO_T, 0), "{:.3f}"),
    "gap.table9.2e-3-best-of-seed-0.seed-1": Figure(seed(DILOCO_T, 1), "{:.3f}"),
    "gap.table9.2e-3-best-of-seed-0.seed-2": Figure(seed(DILOCO_T, 2), "{:.3f}"),
    "gap.table9.2e-3-best-of-seed-0.mean-sd": Figure(mean(DILOCO_T), "{:.3f}"),
    "gap.table9.2e-3-best-of-seed-0.mean-sd-2": Figure(sd(DILOCO_T), "{:.3f}"),
    "gap.table9.4e-3-allreduce-s-committed.seed-0": Figure(
        at(f"{GAP}/diloco-H16-lr/stage1", 0.004), "{:.3f}"
    ),
    "gap.table9.8e-3.seed-0": Figure(at(f"{GAP}/diloco-H16-lr/stage1", 0.008), "{:.3f}"),
    "gap.table10.allreduce.0-125": Figure(at(f"{GAP}/allreduce-sgd/stage1", 0.125), "{:.3f}"),
    "gap.table10.allreduce.0-25": Figure(at(f"{GAP}/allreduce-sgd/stage1", 0.25), "{:.3f}"),
    "gap.table10.allreduce.0-5": Figure(at(f"{GAP}/allreduce-sgd/stage1", 0.5), "{:.3f}"),
    "gap.table10.allreduce.1-0": Figure(at(f"{GAP}/allreduce-sgd/stage1", 1.0), "{:.3f}"),
    "gap.table10.allreduce.2-0": Figure(at(f"{GAP}/allreduce-sgd/stage1", 2.0), "{:.3f}"),
    "gap.table10.complete.0-125": Figure(at(f"{GAP}/complete-sgd/stage1", 0.125), "{:.3f}"),
    "gap.table10.complete.0-25": Figure(at(f"{GAP}/complete-sgd/stage1", 0.25), "{:.3f}"),
    "gap.table10.complete.0-5": Figure(at(f"{GAP}/complete-sgd/stage1", 0.5), "{:.3f}"),
    "gap.table10.complete.1-0": Figure(at(f"{GAP}/complete-sgd/stage1", 1.0), "{:.3f}"),
    "gap.table10.complete.2-0": Figure(at(f"{GAP}/complete-sgd/stage1", 2.0), "{:.3f}"),
    "gap.table11.allreduce.seed-0": Figure(seed(f"{GAP}/allreduce-sgd/final", 0), "{:.3f}"),
    "gap.table11.allreduce.seed-1": Figure(seed(f"{GAP}/allreduce-sgd/final", 1), "{:.3f}"),
    "gap.table11.allreduce.seed-2": Figure(seed(f"{GAP}/allreduce-sgd/final", 2), "{:.3f}"),
    "gap.table11.allreduce.mean-sd": Figure(mean(f"{GAP}/allreduce-sgd/final"), "{:.3f}"),
    "gap.table11.allreduce.mean-sd-2": Figure(sd(f"{GAP}/allreduce-sgd/final"), "{:.3f}"),
    "gap.table11.complete.seed-0": Figure(seed(f"{GAP}/complete-sgd/final", 0), "{:.3f}"),
    "gap.table11.complete.seed-1": Figure(seed(f"{GAP}/complete-sgd/final", 1), "{:.3f}"),
    "gap.table11.complete.seed-2": Figure(seed(f"{GAP}/complete-sgd/final", 2), "{:.3f}"),
    "gap.table11.complete.mean-sd": Figure(mean(f"{GAP}/complete-sgd/final"), "{:.3f}"),
    "gap.table11.complete.mean-sd-2": Figure(sd(f"{GAP}/complete-sgd/final"), "{:.3f}"),
    "gap.table11.gap-paired-by-seed.seed-0": Figure(
        paired(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final", 0), "{:+.3f}"
    ),
    "gap.table11.gap-paired-by-seed.seed-1": Figure(
        paired(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final", 1), "{:+.3f}", minus=True
    ),
    "gap.table11.gap-paired-by-seed.seed-2": Figure(
        paired(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final", 2), "{:+.3f}", minus=True
    ),
    "gap.table11.gap-paired-by-seed.mean-sd": Figure(
        gap_mean(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final"), "{:+.3f}", minus=True
    ),
    "gap.table11.gap-paired-by-seed.mean-sd-2": Figure(
        gap_sd(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final"), "{:.3f}"
    ),
    "gap.h-seed-at-gave": Figure(seed(f"{GAP}/local-sgd-H16-lr/final", 1), "{!r}"),
    "gap.its-best-lr-seeds": Figure(seed(f"{GAP}/allreduce-delayed/final", 0), "{:.3f}"),
    "gap.its-best-lr-seeds-2": Figure(seed(f"{GAP}/allreduce-delayed/final", 1), "{:.3f}"),
    "gap.its-best-lr-seeds-3": Figure(seed(f"{GAP}/allreduce-delayed/final", 2), "{:.3f}"),
    "gap.its-best-lr-seeds-4": Figure(mean(f"{GAP}/allreduce-delayed/final"), "{:.3f}"),
    "gap.its-best-lr-seeds-5": Figure(sd(f"{GAP}/allreduce-delayed/final"), "{:.3f}"),
    "gap.seeds-a-gap-of": Figure(
        gap_mean(f"{GAP}/allreduce-adamw/final", f"{GAP}/allreduce-delayed/final"), "{:.3f}"
    ),
    "gap.seeds-a-gap-of-2": Figure(
        gap_sd(f"{GAP}/allreduce-adamw/final", f"{GAP}/allreduce-delayed/final"), "{:.3f}"
    ),
    "gap.inner-part-outer-seed": Figure(
        at(f"{GAP}/diloco-H16-outer/stage1", 0.3, "outer.lr"), "{:.3f}"
    ),
    "gap.inner-part-outer-seed-2": Figure(
        at(f"{GAP}/diloco-H16-outer/stage1", 0.5, "outer.lr"), "{:.3f}"
    ),
    "gap.inner-part-outer-seed-3": Figure(
        at(f"{GAP}/diloco-H16-outer/stage1", 0.7, "outer.lr"), "{:.3f}"
    ),
    "gap.part-outer-seed": Figure(at(f"{GAP}/diloco-H16-outer/stage1", 1.0, "outer.lr"), "{:.3f}"),
    "gap.python-m-experiments.report.rerun-all": Figure(rerun_stat("n")),
    "gap.the-largest-difference-is": Figure(rerun_stat("largest")),
    "gap.difference-is-local-sgd": Figure(rerun_stat("same")),
    "stream.table1.allreduce.final-eval-loss-3-seeds": Figure(
        mean(f"{STREAM}/allreduce-adamw/final"), "{:.3f}"
    ),
    "stream.table1.allreduce.final-eval-loss-3-seeds-2": Figure(
        sd(f"{STREAM}/allreduce-adamw/final"), "{:.3f}"
    ),
    "stream.table1.allreduce.per-seed": Figure(
        seed(f"{STREAM}/allreduce-adamw/final", 0), "{:.3f}"
    ),
    "stream.table1.allreduce.per-seed-2": Figure(
        seed(f"{STREAM}/allreduce-adamw/final", 1), "{:.3f}"
    ),
    "stream.table1.allreduce.per-seed-3": Figure(
        seed(f"{STREAM}/allreduce-adamw/final", 2), "{:.3f}"
    ),
    "stream.table1.diloco-f-1.final-eval-loss-3-seeds": Figure(mean(DILOCO), "{:.3f}"),
    "stream.table1.diloco-f-1.final-eval-loss-3-seeds-2": Figure(sd(DILOCO), "{:.3f}"),
    "stream.table1.diloco-f-1.per-seed": Figure(seed(DILOCO, 0), "{:.3f}"),
    "stream.table1.diloco-f-1.per-seed-2": Figure(seed(DILOCO, 1), "{:.3f}"),
    "stream.table1.diloco-f-1.per-seed-3": Figure(seed(DILOCO, 2), "{:.3f}"),
    "stream.table1.streaming-diloco-f-4-float32.final-eval-loss-3-seeds": Figure(
        mean(f"{STREAM}/streaming-f4/final"), "{:.3f}"
    ),
    "stream.table1.streaming-diloco-f-4-float32.final-eval-loss-3-seeds-2": Figure(
        sd(f"{STREAM}/streaming-f4/final"), "{:.3f}"
    ),
    "stream.table1.streaming-diloco-f-4-float32.per-seed": Figure(
        seed(f"{STREAM}/streaming-f4/final", 0), "{:.3f}"
    ),
    "stream.table1.streaming-diloco-f-4-float32.per-seed-2": Figure(
        seed(f"{STREAM}/streaming-f4/final", 1), "{:.3f}"
    ),
    "stream.table1.streaming-diloco-f-4-float32.per-seed-3": Figure(
        seed(f"{STREAM}/streaming-f4/final", 2), "{:.3f}"
    ),
    "stream.table1.streaming-diloco-f-4-int8.final-eval-loss-3-seeds": Figure(mean(INT8), "{:.3f}"),
    "stream.table1.streaming-diloco-f-4-int8.final-eval-loss-3-seeds-2": Figure(sd(INT8), "{:.3f}"),
    "stream.table1.streaming-diloco-f-4-int8.per-seed": Figure(seed(INT8, 0), "{:.3f}"),
    "stream.table1.streaming-diloco-f-4-int8.per-seed-2": Figure(seed(INT8, 1), "{:.3f}"),
    "stream.table1.streaming-diloco-f-4-int8.per-seed-3": Figure(seed(INT8, 2), "{:.3f}"),
    "stream.table1.streaming-slowmo-over-one-peer-e.final-eval-loss-3-seeds": Figure(
        mean(f"{STREAM}/slowmo-ope-f4/final"), "{:.3f}"
    ),
    "stream.table1.streaming-slowmo-over-one-peer-e.final-eval-loss-3-seeds-2": Figure(
        sd(f"{STREAM}/slowmo-ope-f4/final"), "{:.3f}"
    ),
    "stream.table1.streaming-slowmo-over-one-peer-e.per-seed": Figure(
        seed(f"{STREAM}/slowmo-ope-f4/final", 0), "{:.3f}"
    ),
    "stream.table1.streaming-slowmo-over-one-peer-e.per-seed-2": Figure(
        seed(f"{STREAM}/slowmo-ope-f4/final", 1), "{:.3f}"
    ),
    "stream.table1.streaming-slowmo-over-one-peer-e.per-seed-3": Figure(
        seed(f"{STREAM}/slowmo-ope-f4/final", 2), "{:.3f}"
    ),
    "stream.table1.the-same-slowmo-s-own-update-sca.final-eval-loss-3-seeds": Figure(
        mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), "{:.3f}"
    ),
    "stream.table1.the-same-slowmo-s-own-update-sca.final-eval-loss-3-seeds-2": Figure(
        sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), "{:.3f}"
    ),
    "stream.table1.the-same-slowmo-s-own-update-sca.per-seed": Figure(
        seed(f"{STREAM}/slowmo-ope-f4-scaled/final", 0), "{:.3f}"
    ),
    "stream.table1.the-same-slowmo-s-own-update-sca.per-seed-2": Figure(
        seed(f"{STREAM}/slowmo-ope-f4-scaled/final", 1), "{:.3f}"
    ),
    "stream.table1.the-same-slowmo-s-own-update-sca.per-seed-3": Figure(
        seed(f"{STREAM}/slowmo-ope-f4-scaled/final", 2), "{:.3f}"
    ),
    "stream.table2.head.time-to-diloco-s-final-mean": Figure(
        lambda s: float(s.key(LINK, "target")), "{:.3f}"
    ),
    "stream.table2.allreduce.s-step-on-the-link": Figure(
        link_arm("allreduce-adamw", "step_s"), "{:.3f}"
    ),
    "stream.table2.allreduce.tokens-s-on-the-link": Figure(
        link_arm("allreduce-adamw", "tokens_per_s"), "{:,.0f}"
    ),
    "stream.table2.allreduce.time-to-diloco-s-final-mean": Figure(
        link_arm("allreduce-adamw", "time_to_target", 1), "{:.0f}"
    ),
    "stream.table2.allreduce.time-to-diloco-s-final-mean-2": Figure(
        link_arm("allreduce-adamw", "time_to_target", 0), "{:.0f}"
    ),
    "stream.table2.allreduce.vs-allreduce": Figure(
        ratio(
            link_arm("allreduce-adamw", "time_to_target", 1),
            link_arm("allreduce-adamw", "time_to_target", 1),
        ),
        "{:.2f}",
    ),
    "stream.table2.diloco-f-1.s-step-on-the-link": Figure(
        link_arm("diloco-H16", "step_s"), "{:.3f}"
    ),
    "stream.table2.diloco-f-1.tokens-s-on-the-link": Figure(
        link_arm("diloco-H16", "tokens_per_s"), "{:,.0f}"
    ),
    "stream.table2.diloco-f-1.time-to-diloco-s-final-mean": Figure(
        link_arm("diloco-H16", "time_to_target", 1), "{:.0f}"
    ),
    "stream.table2.diloco-f-1.time-to-diloco-s-final-mean-2": Figure(
        link_arm("diloco-H16", "time_to_target", 0), "{:.0f}"
    ),
    "stream.table2.diloco-f-1.vs-allreduce": Figure(
        ratio(
            link_arm("allreduce-adamw", "time_to_target", 1),
            link_arm("diloco-H16", "time_to_target", 1),
        ),
        "{:.2f}",
    ),
    "stream.table2.streaming-f-4-float32.s-step-on-the-link": Figure(
        link_arm("streaming-f4", "step_s"), "{:.3f}"
    ),
    "stream.table2.streaming-f-4-float32.tokens-s-on-the-link": Figure(
        link_arm("streaming-f4", "tokens_per_s"), "{:,.0f}"
    ),
    "stream.table2.streaming-f-4-float32.time-to-diloco-s-final-mean": Figure(
        link_arm("streaming-f4", "time_to_target", 1), "{:.0f}"
    ),
    "stream.table2.streaming-f-4-float32.time-to-diloco-s-final-mean-2": Figure(
        link_arm("streaming-f4", "time_to_target", 0), "{:.0f}"
    ),
    "stream.table2.streaming-f-4-float32.vs-allreduce": Figure(
        ratio(
            link_arm("allreduce-adamw", "time_to_target", 1),
            link_arm("streaming-f4", "time_to_target", 1),
        ),
        "{:.2f}",
    ),
    "stream.table2.streaming-f-4-int8.s-step-on-the-link": Figure(
        link_arm("streaming-f4-int8", "step_s"), "{:.3f}"
    ),
    "stream.table2.streaming-f-4-int8.tokens-s-on-the-link": Figure(
        link_arm("streaming-f4-int8", "tokens_per_s"), "{:,.0f}"
    ),
    "stream.table2.streaming-f-4-int8.time-to-diloco-s-final-mean": Figure(
        link_arm("streaming-f4-int8", "time_to_target", 1), "{:.0f}"
    ),
    "stream.table2.streaming-f-4-int8.time-to-diloco-s-final-mean-2": Figure(
        link_arm("streaming-f4-int8", "time_to_target", 0), "{:.0f}"
    ),
    "stream.table2.streaming-f-4-int8.vs-allreduce": Figure(
        ratio(
            link_arm("allreduce-adamw", "time_to_target", 1),
            link_arm("streaming-f4-int8", "time_to_target", 1),
        ),
        "{:.2f}",
    ),
    "stream.table2.slowmo-over-one-peer-exp-f-4.s-step-on-the-link": Figure(
        link_arm("slowmo-ope-f4", "step_s"), "{:.3f}"
    ),
    "stream.table2.slowmo-over-one-peer-exp-f-4.tokens-s-on-the-link": Figure(
        link_arm("slowmo-ope-f4", "tokens_per_s"), "{:,.0f}"
    ),
    "stream.table2.slowmo-over-one-peer-exp-f-4.time-to-diloco-s-final-mean": Figure(
        link_arm("slowmo-ope-f4", "time_to_target", 1), "{:.0f}"
    ),
    "stream.table2.slowmo-over-one-peer-exp-f-4.time-to-diloco-s-final-mean-2": Figure(
        link_arm("slowmo-ope-f4", "time_to_target", 0), "{:.0f}"
    ),
    "stream.table2.slowmo-over-one-peer-exp-f-4.vs-allreduce": Figure(
        ratio(
            link_arm("allreduce-adamw", "time_to_target", 1),
            link_arm("slowmo-ope-f4", "time_to_target", 1),
        ),
        "{:.2f}",
    ),
    "stream.s-diloco-inner-lr": Figure(mean(DILOCO), "{:.3f}"),
    "stream.on-each-seed-by": Figure(diff(mean(DILOCO), mean(INT8)), "{:.2f}"),
    "stream.at-diloco-ends-at": Figure(mean(DILOCO_T), "{:.3f}"),
    "stream.at-diloco-ends-at-2": Figure(sd(DILOCO_T), "{:.3f}"),
    "stream.arms-inner-learning-rate": Figure(diff(mean(INT8), mean(DILOCO_T)), "{:.2f}"),
    "stream.seeds-it-ends-at": Figure(mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), "{:.3f}"),
    "stream.seeds-it-ends-at-2": Figure(sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), "{:.3f}"),
    "outer.table1.local-sgd-h-16.final-eval-loss": Figure(
        mean(f"{OUTER}/local-sgd-H16/final"), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-16.final-eval-loss-2": Figure(
        sd(f"{OUTER}/local-sgd-H16/final"), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-16.final-eval-loss-3": Figure(
        seed(f"{OUTER}/local-sgd-H16/final", 0), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-16.final-eval-loss-4": Figure(
        seed(f"{OUTER}/local-sgd-H16/final", 1), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-16.final-eval-loss-5": Figure(
        seed(f"{OUTER}/local-sgd-H16/final", 2), "{:.3f}"
    ),
    "outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss": Figure(
        mean(f"{OUTER}/diloco-H16/final"), "{:.3f}"
    ),
    "outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-2": Figure(
        sd(f"{OUTER}/diloco-H16/final"), "{:.3f}"
    ),
    "outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-3": Figure(
        seed(f"{OUTER}/diloco-H16/final", 0), "{:.3f}"
    ),
    "outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-4": Figure(
        seed(f"{OUTER}/diloco-H16/final", 1), "{:.3f}"
    ),
    "outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-5": Figure(
        seed(f"{OUTER}/diloco-H16/final", 2), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-64.final-eval-loss": Figure(
        mean(f"{OUTER}/local-sgd-H64/final"), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-64.final-eval-loss-2": Figure(
        sd(f"{OUTER}/local-sgd-H64/final"), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-64.final-eval-loss-3": Figure(
        seed(f"{OUTER}/local-sgd-H64/final", 0), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-64.final-eval-loss-4": Figure(
        seed(f"{OUTER}/local-sgd-H64/final", 1), "{:.3f}"
    ),
    "outer.table1.local-sgd-h-64.final-eval-loss-5": Figure(
        seed(f"{OUTER}/local-sgd-H64/final", 2), "{:.3f}"
    ),
    "outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss": Figure(
        mean(f"{OUTER}/diloco-H64/final"), "{:.3f}"
    ),
    "outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-2": Figure(
        sd(f"{OUTER}/diloco-H64/final"), "{:.3f}"
    ),
    "outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-3": Figure(
        seed(f"{OUTER}/diloco-H64/final", 0), "{:.3f}"
    ),
    "outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-4": Figure(
        seed(f"{OUTER}/diloco-H64/final", 1), "{:.3f}"
    ),
    "outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-5": Figure(
        seed(f"{OUTER}/diloco-H64/final", 2), "{:.3f}"
    ),
    "outer.at-h-it-gave": Figure(at(f"{OUTER}/diloco-H16/stage1", 0.3, "outer.lr"), "{:.3f}"),
    "outer.at-h-it-gave-2": Figure(at(f"{OUTER}/diloco-H16/stage1", 0.5, "outer.lr"), "{:.3f}"),
    "outer.at-h-it-gave-3": Figure(at(f"{OUTER}/diloco-H16/stage1", 0.7, "outer.lr"), "{:.3f}"),
    "outer.h-it-gave-and": Figure(at(f"{OUTER}/diloco-H16/stage1", 1.0, "outer.lr"), "{:.3f}"),
    "outer.at-h-outer-rounds": Figure(at(f"{OUTER}/diloco-H64/stage1", 0.3, "outer.lr"), "{:.3f}"),
    "outer.at-h-outer-rounds-2": Figure(
        at(f"{OUTER}/diloco-H64/stage1", 0.5, "outer.lr"), "{:.3f}"
    ),
    "outer.at-h-outer-rounds-3": Figure(
        at(f"{OUTER}/diloco-H64/stage1", 0.7, "outer.lr"), "{:.3f}"
    ),
    "outer.h-outer-rounds-and": Figure(at(f"{OUTER}/diloco-H64/stage1", 1.0, "outer.lr"), "{:.3f}"),
    "outer.local-sgd-ends-at": Figure(mean(LOCAL_T), "{:.3f}"),
    "outer.local-sgd-ends-at-2": Figure(sd(LOCAL_T), "{:.3f}"),
    "outer.at-and-diloco-at": Figure(mean(DILOCO_T), "{:.3f}"),
    "outer.at-and-diloco-at-2": Figure(sd(DILOCO_T), "{:.3f}"),
    "cluster.s-measured-steps-gossip": Figure(
        lambda s: 100 * calibration("a40_ethernet_25g", "alternating-exp-ring", "error")(s),
        "{:+.1f}",
    ),
    "cluster.steps-gossip-on-gbe": Figure(
        lambda s: 100 * calibration("a100_infiniband_hdr", "alternating-exp-ring", "error")(s),
        "{:+.1f}",
    ),
}

TABLES: dict[str, str] = {
    "gap.table1": """\
| arm | K | seed 0 | seed 1 | seed 2 | mean |
|---|---:|---:|---:|---:|---:|
| `allreduce` | – | {{gap.table1.allreduce.seed-0}} | {{gap.table1.allreduce.seed-1}} | {{gap.table1.allreduce.seed-2}} | {{gap.table1.allreduce.mean}} |
| `complete` | off | {{gap.table1.complete.seed-0}} | {{gap.table1.complete.seed-1}} | {{gap.table1.complete.seed-2}} | {{gap.table1.complete.mean}} |
| `complete`, v shared | 1 | {{gap.table1.complete-v-shared.seed-0}} | | | |
| `complete`, v shared | 4 | {{gap.table1.complete-v-shared.seed-0-2}} | | | |
| `complete`, v shared | 16 (best of seed 0) | {{gap.table1.complete-v-shared.seed-0-3}} | {{gap.table1.complete-v-shared.seed-1}} | {{gap.table1.complete-v-shared.seed-2}} | {{gap.table1.complete-v-shared.mean}} |
| `one-peer-exp` | off | {{gap.table1.one-peer-exp.seed-0}} | {{gap.table1.one-peer-exp.seed-1}} | {{gap.table1.one-peer-exp.seed-2}} | {{gap.table1.one-peer-exp.mean}} |
| `one-peer-exp`, v shared | 1 | {{gap.table1.one-peer-exp-v-shared.seed-0}} | | | |
| `one-peer-exp`, v shared | 4 | {{gap.table1.one-peer-exp-v-shared.seed-0-2}} | | | |
| `one-peer-exp`, v shared | 16 | {{gap.table1.one-peer-exp-v-shared.seed-0-3}} | | | |""",
    "gap.table2": """\
| arm | state averaged every step | seed 0 | vs `complete` | `comm/bytes_per_step` |
|---|---|---:|---:|---:|
| `allreduce` | – | {{gap.table2.allreduce.seed-0}} | −0.165 | |
| `complete` | none | {{gap.table2.complete.seed-0}} | 0 | {{gap.table2.complete.comm-bytes-per-step}} MB |
| `complete` | `exp_avg_sq` | {{gap.table2.complete.seed-0-2}} | +0.016 | {{gap.table2.complete.comm-bytes-per-step-2}} MB |
| `complete` | `exp_avg` | {{gap.table2.complete.seed-0-3}} | +0.040 | {{gap.table2.complete.comm-bytes-per-step-3}} MB |
| `complete` | `exp_avg` and `exp_avg_sq` | {{gap.table2.complete.seed-0-4}} | +0.037 | {{gap.table2.complete.comm-bytes-per-step-4}} MB |""",
    "gap.table3": """\
| arm (`complete`) | lr | seed 0 | `comm/bytes_per_step` |
|---|---:|---:|---:|
| AdamW (the baseline) | 4e-3 | {{gap.table3.adamw-the-baseline.seed-0}} | {{gap.table3.adamw-the-baseline.comm-bytes-per-step}} MB |
| LaggedVAdamW, nothing shared (the lag and clip alone) | 4e-3 | {{gap.table3.laggedvadamw-nothing-shared-the.seed-0}} | {{gap.table3.laggedvadamw-nothing-shared-the.comm-bytes-per-step}} MB |
| LaggedVAdamW, `v` from the mean gradient | 4e-3 | {{gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0}} | {{gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step}} MB |
| LaggedVAdamW, `v` from the mean gradient | 2e-3 | {{gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-2}} | {{gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-2}} MB |
| LaggedVAdamW, `v` from the mean gradient | 1e-3 | {{gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-3}} | {{gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-3}} MB |
| LaggedVAdamW, `v` from the mean gradient, `m` shared | 4e-3 | {{gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-4}} | {{gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-4}} MB |
| LaggedVAdamW, `v` from the mean gradient, `m` shared | 2e-3 | {{gap.table3.laggedvadamw-v-from-the-mean-gra.seed-0-5}} | {{gap.table3.laggedvadamw-v-from-the-mean-gra.comm-bytes-per-step-5}} MB |""",
    "gap.table4": """\
| windows per worker | global batch | steps | warm-up | tokens | `allreduce` (best lr) | `complete` (best lr) |
|---:|---:|---:|---:|---:|---:|---:|
| 8 | 32 | 2048 | 128 | 4.19M | {{gap.table4.8.allreduce-best-lr}} ± {{gap.table4.8.allreduce-best-lr-2}} (8e-3) | {{gap.table4.8.complete-best-lr}} ± {{gap.table4.8.complete-best-lr-2}} (8e-3) |
| 32 (`lm_small`) | 128 | 512 | 32 | 4.19M | {{gap.table4.32-lm-small.allreduce-best-lr}} ± {{gap.table4.32-lm-small.allreduce-best-lr-2}} (4e-3) | {{gap.table4.32-lm-small.complete-best-lr}} ± {{gap.table4.32-lm-small.complete-best-lr-2}} (4e-3) |
| 128 | 512 | 128 | 8 | 4.19M | {{gap.table4.128.allreduce-best-lr}} ± {{gap.table4.128.allreduce-best-lr-2}} (2e-3) | {{gap.table4.128.complete-best-lr}} ± {{gap.table4.128.complete-best-lr-2}} (2e-3) |""",
    "gap.table5": """\
| `optim.lr` (seed 0) | 5e-4 | 1e-3 | 2e-3 | 4e-3 | 8e-3 | 1.6e-2 |
|---|---:|---:|---:|---:|---:|---:|
| `allreduce`, 8 windows | {{gap.table5.allreduce-8-windows.5e-4}} | {{gap.table5.allreduce-8-windows.1e-3}} | {{gap.table5.allreduce-8-windows.2e-3}} | {{gap.table5.allreduce-8-windows.4e-3}} | **{{gap.table5.allreduce-8-windows.8e-3}}** | {{gap.table5.allreduce-8-windows.1-6e-2}} |
| `complete`, 8 windows | {{gap.table5.complete-8-windows.5e-4}} | {{gap.table5.complete-8-windows.1e-3}} | {{gap.table5.complete-8-windows.2e-3}} | {{gap.table5.complete-8-windows.4e-3}} | **{{gap.table5.complete-8-windows.8e-3}}** | {{gap.table5.complete-8-windows.1-6e-2}} |
| `allreduce`, 128 windows | | {{gap.table5.allreduce-128-windows.1e-3}} | **{{gap.table5.allreduce-128-windows.2e-3}}** | {{gap.table5.allreduce-128-windows.4e-3}} | {{gap.table5.allreduce-128-windows.8e-3}} | |
| `complete`, 128 windows | | {{gap.table5.complete-128-windows.1e-3}} | **{{gap.table5.complete-128-windows.2e-3}}** | {{gap.table5.complete-128-windows.4e-3}} | {{gap.table5.complete-128-windows.8e-3}} | |""",
    "gap.table6": """\
| gap, paired by seed ([gap/](gap/gap.md)) | seed 0 | seed 1 | seed 2 | mean ± sd |
|---|---:|---:|---:|---:|
| 8 windows, 2048 steps | {{gap.table6.8-windows-2048-steps.seed-0}} | {{gap.table6.8-windows-2048-steps.seed-1}} | {{gap.table6.8-windows-2048-steps.seed-2}} | **{{gap.table6.8-windows-2048-steps.mean-sd}} ± {{gap.table6.8-windows-2048-steps.mean-sd-2}}** |
| 32 windows, 512 steps | {{gap.table6.32-windows-512-steps.seed-0}} | {{gap.table6.32-windows-512-steps.seed-1}} | {{gap.table6.32-windows-512-steps.seed-2}} | {{gap.table6.32-windows-512-steps.mean-sd}} ± {{gap.table6.32-windows-512-steps.mean-sd-2}} |
| 128 windows, 128 steps | {{gap.table6.128-windows-128-steps.seed-0}} | {{gap.table6.128-windows-128-steps.seed-1}} | {{gap.table6.128-windows-128-steps.seed-2}} | {{gap.table6.128-windows-128-steps.mean-sd}} ± {{gap.table6.128-windows-128-steps.mean-sd-2}} |""",
    "gap.table7": """\
| `optim.lr` (seed 0) | 5e-4 | 1e-3 | 2e-3 | 4e-3 | 8e-3 |
|---|---:|---:|---:|---:|---:|
| `allreduce`, AdamW one step late | {{gap.table7.allreduce-adamw-one-step-late.5e-4}} | **{{gap.table7.allreduce-adamw-one-step-late.1e-3}}** | {{gap.table7.allreduce-adamw-one-step-late.2e-3}} | {{gap.table7.allreduce-adamw-one-step-late.4e-3}} | {{gap.table7.allreduce-adamw-one-step-late.8e-3}} |
| `allreduce` ([../lm](../lm/README.md)) | | {{gap.table7.allreduce-lm-lm-readme-md.1e-3}} | {{gap.table7.allreduce-lm-lm-readme-md.2e-3}} | **{{gap.table7.allreduce-lm-lm-readme-md.4e-3}}** | {{gap.table7.allreduce-lm-lm-readme-md.8e-3}} |""",
    "gap.table8": """\
| `local-sgd` H=16, `optim.lr` | seed 0 | seed 1 | seed 2 | mean ± sd |
|---|---:|---:|---:|---:|
| 5e-4 | {{gap.table8.5e-4.seed-0}} | | | |
| 1e-3 | {{gap.table8.1e-3.seed-0}} | | | |
| 2e-3 | {{gap.table8.2e-3.seed-0}} | {{gap.table8.2e-3.seed-1}} | {{gap.table8.2e-3.seed-2}} | **{{gap.table8.2e-3.mean-sd}} ± {{gap.table8.2e-3.mean-sd-2}}** |
| 4e-3 (allreduce's, committed) | {{gap.table8.4e-3-allreduce-s-committed.seed-0}} | {{gap.table8.4e-3-allreduce-s-committed.seed-1}} | {{gap.table8.4e-3-allreduce-s-committed.seed-2}} | {{gap.table8.4e-3-allreduce-s-committed.mean-sd}} ± {{gap.table8.4e-3-allreduce-s-committed.mean-sd-2}} |
| 8e-3 | {{gap.table8.8e-3.seed-0}} | | | |""",
    "gap.table9": """\
| DiLoCo H=16 (outer lr 0.5), `optim.lr` | seed 0 | seed 1 | seed 2 | mean ± sd |
|---|---:|---:|---:|---:|
| 1e-3 | {{gap.table9.1e-3.seed-0}} | | | |
| 2e-3 (best of seed 0) | {{gap.table9.2e-3-best-of-seed-0.seed-0}} | {{gap.table9.2e-3-best-of-seed-0.seed-1}} | {{gap.table9.2e-3-best-of-seed-0.seed-2}} | **{{gap.table9.2e-3-best-of-seed-0.mean-sd}} ± {{gap.table9.2e-3-best-of-seed-0.mean-sd-2}}** |
| 4e-3 (allreduce's, committed) | {{gap.table9.4e-3-allreduce-s-committed.seed-0}} | | | |
| 8e-3 | {{gap.table9.8e-3.seed-0}} | | | |""",
    "gap.table10": """\
| `optim.lr` (seed 0) | 0.125 | 0.25 | 0.5 | 1.0 | 2.0 |
|---|---:|---:|---:|---:|---:|
| `allreduce` | {{gap.table10.allreduce.0-125}} | **{{gap.table10.allreduce.0-25}}** | {{gap.table10.allreduce.0-5}} | {{gap.table10.allreduce.1-0}} | {{gap.table10.allreduce.2-0}} |
| `complete` | {{gap.table10.complete.0-125}} | **{{gap.table10.complete.0-25}}** | {{gap.table10.complete.0-5}} | {{gap.table10.complete.1-0}} | {{gap.table10.complete.2-0}} |""",
    "gap.table11": """\
| at the best lr (0.25 for both) | seed 0 | seed 1 | seed 2 | mean ± sd |
|---|---:|---:|---:|---:|
| `allreduce` | {{gap.table11.allreduce.seed-0}} | {{gap.table11.allreduce.seed-1}} | {{gap.table11.allreduce.seed-2}} | {{gap.table11.allreduce.mean-sd}} ± {{gap.table11.allreduce.mean-sd-2}} |
| `complete` | {{gap.table11.complete.seed-0}} | {{gap.table11.complete.seed-1}} | {{gap.table11.complete.seed-2}} | {{gap.table11.complete.mean-sd}} ± {{gap.table11.complete.mean-sd-2}} |
| gap, paired by seed | {{gap.table11.gap-paired-by-seed.seed-0}} | {{gap.table11.gap-paired-by-seed.seed-1}} | {{gap.table11.gap-paired-by-seed.seed-2}} | **{{gap.table11.gap-paired-by-seed.mean-sd}} ± {{gap.table11.gap-paired-by-seed.mean-sd-2}}** |""",
    "stream.table1": """\
| arm | outer lr (grid) | final eval/loss, 3 seeds | per seed | vs DiLoCo, per seed | mean MB/step | peak MB/step |
|---|---|---:|---|---|---:|---:|
| `allreduce` | – | {{stream.table1.allreduce.final-eval-loss-3-seeds}} ± {{stream.table1.allreduce.final-eval-loss-3-seeds-2}} | {{stream.table1.allreduce.per-seed}}, {{stream.table1.allreduce.per-seed-2}}, {{stream.table1.allreduce.per-seed-3}} | | 5.61 | 5.61 |
| DiLoCo, F=1 | 0.5 (0.3, 0.5, 0.7, 1.0) | {{stream.table1.diloco-f-1.final-eval-loss-3-seeds}} ± {{stream.table1.diloco-f-1.final-eval-loss-3-seeds-2}} | {{stream.table1.diloco-f-1.per-seed}}, {{stream.table1.diloco-f-1.per-seed-2}}, {{stream.table1.diloco-f-1.per-seed-3}} | 0 | 0.351 | 5.61 |
| streaming DiLoCo, F=4, float32 | 0.5 (0.3, 0.5, 0.7) | {{stream.table1.streaming-diloco-f-4-float32.final-eval-loss-3-seeds}} ± {{stream.table1.streaming-diloco-f-4-float32.final-eval-loss-3-seeds-2}} | {{stream.table1.streaming-diloco-f-4-float32.per-seed}}, {{stream.table1.streaming-diloco-f-4-float32.per-seed-2}}, {{stream.table1.streaming-diloco-f-4-float32.per-seed-3}} | −0.045, −0.180, −0.106 | 0.351 | 1.77 |
| streaming DiLoCo, F=4, int8 | 0.5 (0.3, 0.5, 0.7) | {{stream.table1.streaming-diloco-f-4-int8.final-eval-loss-3-seeds}} ± {{stream.table1.streaming-diloco-f-4-int8.final-eval-loss-3-seeds-2}} | {{stream.table1.streaming-diloco-f-4-int8.per-seed}}, {{stream.table1.streaming-diloco-f-4-int8.per-seed-2}}, {{stream.table1.streaming-diloco-f-4-int8.per-seed-3}} | −0.046, −0.167, −0.084 | 0.088 | 0.445 |
| streaming SlowMo over `one-peer-exp`, F=4 | 1.0 (0.5, 1.0, 1.5) | {{stream.table1.streaming-slowmo-over-one-peer-e.final-eval-loss-3-seeds}} ± {{stream.table1.streaming-slowmo-over-one-peer-e.final-eval-loss-3-seeds-2}} | {{stream.table1.streaming-slowmo-over-one-peer-e.per-seed}}, {{stream.table1.streaming-slowmo-over-one-peer-e.per-seed-2}}, {{stream.table1.streaming-slowmo-over-one-peer-e.per-seed-3}} | | 3.86 | 4.33 |
| the same, SlowMo's own update scaled by the inner lr (`outer.scale_by_inner_lr=true`) | 1.0 (0.5, 1.0, 1.5) | {{stream.table1.the-same-slowmo-s-own-update-sca.final-eval-loss-3-seeds}} ± {{stream.table1.the-same-slowmo-s-own-update-sca.final-eval-loss-3-seeds-2}} | {{stream.table1.the-same-slowmo-s-own-update-sca.per-seed}}, {{stream.table1.the-same-slowmo-s-own-update-sca.per-seed-2}}, {{stream.table1.the-same-slowmo-s-own-update-sca.per-seed-3}} | | 3.86 | 4.33 |""",
    "stream.table2": """\
| arm | s/step on the link | tokens/s on the link | time to {{stream.table2.head.time-to-diloco-s-final-mean}} (DiLoCo's final mean) | vs `allreduce` |
|---|---:|---:|---:|---:|
| `allreduce` | {{stream.table2.allreduce.s-step-on-the-link}} | {{stream.table2.allreduce.tokens-s-on-the-link}} | {{stream.table2.allreduce.time-to-diloco-s-final-mean}} s (step {{stream.table2.allreduce.time-to-diloco-s-final-mean-2}}) | {{stream.table2.allreduce.vs-allreduce}}× |
| DiLoCo, F=1 | {{stream.table2.diloco-f-1.s-step-on-the-link}} | {{stream.table2.diloco-f-1.tokens-s-on-the-link}} | {{stream.table2.diloco-f-1.time-to-diloco-s-final-mean}} s (step {{stream.table2.diloco-f-1.time-to-diloco-s-final-mean-2}}) | {{stream.table2.diloco-f-1.vs-allreduce}}× |
| streaming, F=4, float32 | {{stream.table2.streaming-f-4-float32.s-step-on-the-link}} | {{stream.table2.streaming-f-4-float32.tokens-s-on-the-link}} | {{stream.table2.streaming-f-4-float32.time-to-diloco-s-final-mean}} s (step {{stream.table2.streaming-f-4-float32.time-to-diloco-s-final-mean-2}}) | {{stream.table2.streaming-f-4-float32.vs-allreduce}}× |
| streaming, F=4, int8 | {{stream.table2.streaming-f-4-int8.s-step-on-the-link}} | {{stream.table2.streaming-f-4-int8.tokens-s-on-the-link}} | {{stream.table2.streaming-f-4-int8.time-to-diloco-s-final-mean}} s (step {{stream.table2.streaming-f-4-int8.time-to-diloco-s-final-mean-2}}) | {{stream.table2.streaming-f-4-int8.vs-allreduce}}× |
| SlowMo over `one-peer-exp`, F=4 | {{stream.table2.slowmo-over-one-peer-exp-f-4.s-step-on-the-link}} | {{stream.table2.slowmo-over-one-peer-exp-f-4.tokens-s-on-the-link}} | {{stream.table2.slowmo-over-one-peer-exp-f-4.time-to-diloco-s-final-mean}} s (step {{stream.table2.slowmo-over-one-peer-exp-f-4.time-to-diloco-s-final-mean-2}}) | {{stream.table2.slowmo-over-one-peer-exp-f-4.vs-allreduce}}× |""",
    "outer.table1": """\
| arm (4 workers) | seeds | final eval/loss | gap to allreduce | bytes per step and rank (mean / peak) |
|---|---:|---:|---:|---:|
| `allreduce`, AdamW 4e-3 | 3 | 3.366 ± 0.037 | 0 | 5.6 MB / 5.6 MB |
| `local-sgd` H=16 | 3 | {{outer.table1.local-sgd-h-16.final-eval-loss}} ± {{outer.table1.local-sgd-h-16.final-eval-loss-2}} ({{outer.table1.local-sgd-h-16.final-eval-loss-3}}, {{outer.table1.local-sgd-h-16.final-eval-loss-4}}, {{outer.table1.local-sgd-h-16.final-eval-loss-5}}) | +0.529 | 0.35 MB / 5.6 MB |
| DiLoCo H=16, outer lr 0.5 | 3 | {{outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss}} ± {{outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-2}} ({{outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-3}}, {{outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-4}}, {{outer.table1.diloco-h-16-outer-lr-0-5.final-eval-loss-5}}) | +0.836 | 0.35 MB / 5.6 MB |
| `local-sgd` H=64 | 3 | {{outer.table1.local-sgd-h-64.final-eval-loss}} ± {{outer.table1.local-sgd-h-64.final-eval-loss-2}} ({{outer.table1.local-sgd-h-64.final-eval-loss-3}}, {{outer.table1.local-sgd-h-64.final-eval-loss-4}}, {{outer.table1.local-sgd-h-64.final-eval-loss-5}}) | +0.636 | 0.09 MB / 5.6 MB |
| DiLoCo H=64, outer lr 0.5 | 3 | {{outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss}} ± {{outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-2}} ({{outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-3}}, {{outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-4}}, {{outer.table1.diloco-h-64-outer-lr-0-5.final-eval-loss-5}}) | +0.810 | 0.09 MB / 5.6 MB |""",
}
