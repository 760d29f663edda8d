"""Claims of the language-model pages: lm, lm_gap, outer and streaming (see :mod:`experiments.report.claims`)."""

from __future__ import annotations

from experiments.report.claims.base import (
    BATCH_LRS,
    DILOCO,
    DILOCO_T,
    F0,
    F2,
    F3,
    GAP,
    GAP_PAGE,
    INT8,
    LATE,
    LINK,
    LM,
    LM_PAGE,
    LOCAL_T,
    NUM3,
    OUTER,
    OUTER_PAGE,
    SGD,
    SGD_LRS,
    STREAM,
    STREAM_PAGE,
    W8,
    W32,
    W128,
    W128_LRS,
    Claim,
    V,
    at,
    calibration,
    claim,
    diff,
    gap_mean,
    gap_row,
    gap_sd,
    grid_row,
    link_arm,
    mean,
    one_run,
    ratio,
    rerun_stat,
    sd,
    seed,
    seed_row,
    spread_row,
)

CLAIMS: list[Claim] = [
    # docs/results/lm/README.md
    claim(
        LM_PAGE,
        r"ends at (\d\.\d{3}) with seed 0, against (\d\.\d{3}) with `accum_iter` 1 and (\d\.\d{3}) with 4",
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum8/stage1/0"), F3),
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum/stage1/0"), F3),
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum/stage1/1"), F3),
    ),
    claim(
        LM_PAGE,
        r"It is (\d\.\d\d) nats behind AdamW at 4e-3",
        V(
            diff(
                mean(f"{LM}/one-peer-exp-accum/final"),
                mean(f"{LM}/one-peer-exp-adamw-lr0.004/final"),
            ),
            F2,
        ),
    ),
    claim(
        LM_PAGE,
        r"from seed 0 \((\d\.\d{3}) and (\d\.\d{3}), interior",
        V(lambda s: s.run(f"{LM}/complete-adamw/stage1/3"), F3),
        V(lambda s: s.run(f"{LM}/one-peer-exp-adamw/stage1/3"), F3),
    ),
    # docs/results/lm_gap/README.md
    claim(
        GAP_PAGE,
        r"seed 1 at 4e-3 gave (\d\.\d+), the committed value",
        V(seed(f"{GAP}/local-sgd-H16-lr/final", 1), "{!r}"),
    ),
    seed_row(GAP_PAGE, r"`allreduce` \| \u2013", f"{GAP}/allreduce-adamw/final", sd_too=False),
    seed_row(GAP_PAGE, r"`complete` \| off", f"{GAP}/complete-adamw-lr0.004/final", sd_too=False),
    seed_row(
        GAP_PAGE,
        r"`complete`, v shared \| 16 \(best of seed 0\)",
        f"{GAP}/complete-v/final",
        sd_too=False,
    ),
    seed_row(
        GAP_PAGE, r"`one-peer-exp` \| off", f"{GAP}/one-peer-exp-adamw-lr0.004/final", sd_too=False
    ),
    seed_row(GAP_PAGE, r"2e-3", LOCAL_T),
    seed_row(GAP_PAGE, r"2e-3 \(best of seed 0\)", DILOCO_T),
    seed_row(GAP_PAGE, r"`allreduce`", f"{GAP}/allreduce-sgd/final"),
    seed_row(GAP_PAGE, r"`complete`", f"{GAP}/complete-sgd/final"),
    gap_row(GAP_PAGE, r"gap, paired by seed", *SGD),
    gap_row(GAP_PAGE, r"8 windows, 2048 steps", *W8),
    gap_row(GAP_PAGE, r"32 windows, 512 steps", *W32),
    gap_row(GAP_PAGE, r"128 windows, 128 steps", *W128),
    *(
        claim(
            GAP_PAGE,
            rf"^\| {w} \| {gb} \| {st} \| {wu} \| 4\.19M \| {NUM3} ± {NUM3} \({lr}\) \| {NUM3} ± {NUM3} \({lr}\) \|",
            V(mean(a), F3),
            V(sd(a), F3),
            V(mean(c), F3),
            V(sd(c), F3),
        )
        for w, gb, st, wu, lr, (a, c) in (
            ("8", "32", "2048", "128", "8e-3", W8),
            (r"32 \(`lm_small`\)", "128", "512", "32", "4e-3", W32),
            ("128", "512", "128", "8", "2e-3", W128),
        )
    ),
    claim(
        GAP_PAGE,
        rf"3 seeds: {NUM3}, {NUM3}, {NUM3}, \*\*{NUM3} ± {NUM3}\*\*, a gap of\s+\*\*\+{NUM3} ± {NUM3}\*\*",
        *(V(seed(LATE[1], i), F3) for i in range(3)),
        V(mean(LATE[1]), F3),
        V(sd(LATE[1]), F3),
        V(gap_mean(*LATE), F3),
        V(gap_sd(*LATE), F3),
    ),
    # docs/results/streaming/README.md
    *(
        spread_row(STREAM_PAGE, prefix, f"{STREAM}/{name}/final")
        for prefix, name in (
            ("`allreduce`", "allreduce-adamw"),
            ("DiLoCo, F=1", "diloco-H16"),
            ("streaming DiLoCo, F=4, float32", "streaming-f4"),
            ("streaming DiLoCo, F=4, int8", "streaming-f4-int8"),
            ("streaming SlowMo over `one-peer-exp`, F=4", "slowmo-ope-f4"),
            (
                r"the same, SlowMo's own update scaled by the inner lr \(`outer.scale_by_inner_lr=true`\)",
                "slowmo-ope-f4-scaled",
            ),
        )
    ),
    claim(
        STREAM_PAGE,
        r"ahead of this page's DiLoCo \(inner lr 4e-3, (\d\.\d{3})\) on each seed, by (\d\.\d\d) nats on "
        r"average\. It\s+is \*\*not\*\* ahead of DiLoCo with its inner lr tuned: at 2e-3 DiLoCo ends at "
        r"(\d\.\d{3}) ± (\d\.\d{3})\s+\(\[[^\]]*\]\([^)]*\)\), (\d\.\d\d) below",
        V(mean(DILOCO), F3),
        V(diff(mean(DILOCO), mean(INT8)), F2),
        V(mean(DILOCO_T), F3),
        V(sd(DILOCO_T), F3),
        V(diff(mean(INT8), mean(DILOCO_T)), F2),
    ),
    claim(
        STREAM_PAGE,
        r"Over 3 seeds it ends at (\d\.\d{3}) ± (\d\.\d{3}), behind",
        V(mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
        V(sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
    ),
    # docs/results/outer/lm_small/README.md
    *(
        spread_row(OUTER_PAGE, prefix, f"{OUTER}/{name}/final", inline=True)
        for prefix, name in (
            ("`local-sgd` H=16", "local-sgd-H16"),
            ("DiLoCo H=16, outer lr 0.5", "diloco-H16"),
            ("`local-sgd` H=64", "local-sgd-H64"),
            ("DiLoCo H=64, outer lr 0.5", "diloco-H64"),
        )
    ),
    claim(
        OUTER_PAGE,
        r"`local-sgd` ends at (\d\.\d{3}) ± (\d\.\d{3}) and DiLoCo at (\d\.\d{3}) ± (\d\.\d{3})",
        V(mean(LOCAL_T), F3),
        V(sd(LOCAL_T), F3),
        V(mean(DILOCO_T), F3),
        V(sd(DILOCO_T), F3),
    ),
    # docs/results/lm_gap/README.md: the bytes of the state-sharing arms (one seed each)
    *(
        claim(
            GAP_PAGE,
            rf"^\| {prefix} \| \d\.\d{{3}} \|{cells} (\d+\.?\d*) MB \|",
            V(lambda s, r=run: s.run(f"{GAP}/{r}", "comm/bytes_per_step") / 1e6, "{:.3g}"),
        )
        for cells, rows in (
            (
                r" [^|\n]* \|",
                (
                    (r"`complete` \| none", "complete-adamw-lr0.004/final/seed0"),
                    (r"`complete` \| `exp_avg_sq`", "complete-v/stage1/0"),
                    (r"`complete` \| `exp_avg`", "complete-m/stage1/0"),
                    (r"`complete` \| `exp_avg` and `exp_avg_sq`", "complete-mv/stage1/0"),
                ),
            ),
            (
                "",
                (
                    (r"AdamW \(the baseline\) \| 4e-3", "complete-adamw-lr0.004/final/seed0"),
                    (
                        r"LaggedVAdamW, nothing shared \(the lag and clip alone\) \| 4e-3",
                        "complete-lagged-v0/stage1/0",
                    ),
                    (
                        r"LaggedVAdamW, `v` from the mean gradient \| 4e-3",
                        "complete-lagged-v1/stage1/0",
                    ),
                    (
                        r"LaggedVAdamW, `v` from the mean gradient \| 2e-3",
                        "complete-lagged-v1/stage1/lr2e-3",
                    ),
                    (
                        r"LaggedVAdamW, `v` from the mean gradient \| 1e-3",
                        "complete-lagged-v1/stage1/lr0.001",
                    ),
                    (
                        r"LaggedVAdamW, `v` from the mean gradient, `m` shared \| 4e-3",
                        "complete-lagged-m1/stage1/0",
                    ),
                    (
                        r"LaggedVAdamW, `v` from the mean gradient, `m` shared \| 2e-3",
                        "complete-lagged-m1/stage1/lr2e-3",
                    ),
                ),
            ),
        )
        for prefix, run in rows
    ),
    # docs/results/lm_gap/README.md: one-seed arms
    *(
        one_run(GAP_PAGE, prefix, f"{GAP}/{run}")
        for prefix, run in (
            (r"`complete`, v shared \| 1", "complete-v/stage1/0"),
            (r"`complete`, v shared \| 4", "complete-v/stage1/1"),
            (r"`one-peer-exp`, v shared \| 1", "one-peer-exp-v/stage1/0"),
            (r"`one-peer-exp`, v shared \| 4", "one-peer-exp-v/stage1/1"),
            (r"`one-peer-exp`, v shared \| 16", "one-peer-exp-v/stage1/2"),
            (r"`complete` \| none", "complete-adamw-lr0.004/final/seed0"),
            (r"`complete` \| `exp_avg_sq`", "complete-v/stage1/0"),
            (r"`complete` \| `exp_avg`", "complete-m/stage1/0"),
            (r"`complete` \| `exp_avg` and `exp_avg_sq`", "complete-mv/stage1/0"),
            (r"`allreduce` \| \u2013", "allreduce-adamw/final/seed0"),
            (r"AdamW \(the baseline\) \| 4e-3", "complete-adamw-lr0.004/final/seed0"),
            (
                r"LaggedVAdamW, nothing shared \(the lag and clip alone\) \| 4e-3",
                "complete-lagged-v0/stage1/0",
            ),
            (r"LaggedVAdamW, `v` from the mean gradient \| 4e-3", "complete-lagged-v1/stage1/0"),
            (
                r"LaggedVAdamW, `v` from the mean gradient \| 2e-3",
                "complete-lagged-v1/stage1/lr2e-3",
            ),
            (
                r"LaggedVAdamW, `v` from the mean gradient \| 1e-3",
                "complete-lagged-v1/stage1/lr0.001",
            ),
            (
                r"LaggedVAdamW, `v` from the mean gradient, `m` shared \| 4e-3",
                "complete-lagged-m1/stage1/0",
            ),
            (
                r"LaggedVAdamW, `v` from the mean gradient, `m` shared \| 2e-3",
                "complete-lagged-m1/stage1/lr2e-3",
            ),
        )
    ),
    claim(
        "docs/cluster.md",
        r"gossip (\+\d+\.\d)% on 25 GbE, (-\d+\.\d)% on\s+InfiniBand",
        V(
            lambda s: 100 * calibration("a40_ethernet_25g", "alternating-exp-ring", "error")(s),
            "{:+.1f}",
        ),
        V(
            lambda s: 100 * calibration("a100_infiniband_hdr", "alternating-exp-ring", "error")(s),
            "{:+.1f}",
        ),
    ),
    # docs/results/streaming/README.md: the slow link
    claim(
        STREAM_PAGE,
        r"\| time to (\d\.\d{3}) \(DiLoCo's final mean\) \|",
        V(lambda s: float(s.key(LINK, "target")), F3),
    ),
    *(
        claim(
            STREAM_PAGE,
            rf"^\| {label} \| (\d\.\d{{3}}) \| ([\d,]+) \| (\d+) s \(step (\d+)\) \| (\d\.\d\d)× \|",
            V(link_arm(arm, "step_s"), F3),
            V(link_arm(arm, "tokens_per_s"), F0),
            V(link_arm(arm, "time_to_target", 1), "{:.0f}"),
            V(link_arm(arm, "time_to_target", 0), "{:.0f}"),
            V(
                ratio(
                    link_arm("allreduce-adamw", "time_to_target", 1),
                    link_arm(arm, "time_to_target", 1),
                ),
                F2,
            ),
        )
        for label, arm in (
            ("`allreduce`", "allreduce-adamw"),
            ("DiLoCo, F=1", "diloco-H16"),
            ("streaming, F=4, float32", "streaming-f4"),
            ("streaming, F=4, int8", "streaming-f4-int8"),
            ("SlowMo over `one-peer-exp`, F=4", "slowmo-ope-f4"),
        )
    ),
    # docs/results/lm_gap/README.md: the learning-rate grids (seed 0)
    grid_row(GAP_PAGE, "`allreduce`, 8 windows", f"{GAP}/allreduce-w8/stage1", BATCH_LRS),
    grid_row(GAP_PAGE, "`complete`, 8 windows", f"{GAP}/complete-w8/stage1", BATCH_LRS),
    grid_row(GAP_PAGE, "`allreduce`, 128 windows", f"{GAP}/allreduce-w128/stage1", W128_LRS),
    grid_row(GAP_PAGE, "`complete`, 128 windows", f"{GAP}/complete-w128/stage1", W128_LRS),
    grid_row(
        GAP_PAGE,
        "`allreduce`, AdamW one step late",
        f"{GAP}/allreduce-delayed/stage1",
        BATCH_LRS[:5],
    ),
    grid_row(
        GAP_PAGE,
        r"`allreduce` \(\[\.\./lm\]\(\.\./lm/README\.md\)\)",
        f"{LM}/allreduce-adamw/stage1",
        (None, 1e-3, 2e-3, 4e-3, 8e-3),
    ),
    grid_row(GAP_PAGE, "`allreduce`", f"{GAP}/allreduce-sgd/stage1", SGD_LRS),
    grid_row(GAP_PAGE, "`complete`", f"{GAP}/complete-sgd/stage1", SGD_LRS),
    claim(
        GAP_PAGE,
        rf"^\| 5e-4 \| {NUM3} \| \| \| \|\n\| 1e-3 \| {NUM3} \| \| \| \|\n(?:.*\n){{2}}\| 8e-3 \| {NUM3} \|",
        *(V(at(f"{GAP}/local-sgd-H16-lr/stage1", lr), F3) for lr in (5e-4, 1e-3, 8e-3)),
    ),
    seed_row(GAP_PAGE, r"4e-3 \(allreduce's, committed\)", f"{OUTER}/local-sgd-H16/final"),
    claim(
        GAP_PAGE,
        rf"^\| 1e-3 \| {NUM3} \| \| \| \|\n.*\n\| 4e-3 \(allreduce's, committed\) \| {NUM3} \| \| \| \|\n"
        rf"\| 8e-3 \| {NUM3} \|",
        *(V(at(f"{GAP}/diloco-H16-lr/stage1", lr), F3) for lr in (1e-3, 4e-3, 8e-3)),
    ),
    claim(
        GAP_PAGE,
        rf"0\.3 → {NUM3}, \*\*0\.5 → {NUM3}\*\*,\s+0\.7 → {NUM3}, 1\.0 → {NUM3}\.",
        *(
            V(at(f"{GAP}/diloco-H16-outer/stage1", lr, "outer.lr"), F3)
            for lr in (0.3, 0.5, 0.7, 1.0)
        ),
    ),
    # docs/results/outer/lm_small/README.md: the outer lr grids
    claim(
        OUTER_PAGE,
        rf"At H=16 it gave {NUM3}, \*\*{NUM3}\*\*, {NUM3}\s+and {NUM3}; at H=64 \(8 outer rounds\), {NUM3}, \*\*{NUM3}\*\*, "
        rf"{NUM3} and {NUM3}\.",
        *(
            V(at(f"{OUTER}/diloco-H{h}/stage1", lr, "outer.lr"), F3)
            for h in (16, 64)
            for lr in (0.3, 0.5, 0.7, 1.0)
        ),
    ),
    # the reruns, on the lm_gap page and the results page
    claim(
        GAP_PAGE,
        r"All (\d+) land within 0\.01 nats of the committed value; the\s+largest difference is (\d+e-\d+) "
        r"\(`local-sgd`\), (\w+) are exact to the printed digit",
        V(rerun_stat("n"), "{}"),
        V(rerun_stat("largest"), "{}"),
        V(rerun_stat("same"), "{}"),
    ),
]
