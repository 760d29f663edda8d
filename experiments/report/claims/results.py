"""Claims of the README, the results page, and the network and hierarchical pages (see :mod:`experiments.report.claims`)."""

from __future__ import annotations

from experiments.report.claims.base import (
    BEFORE,
    DILOCO,
    DILOCO_T,
    F0,
    F2,
    F3,
    GAP,
    H_ARMS,
    HIER,
    HIER_PAGE,
    INT8,
    LATE,
    LM,
    LOCAL_T,
    NET,
    OUTER,
    RES,
    SGD,
    STREAM,
    W8,
    W32,
    W128,
    Claim,
    V,
    calibrated,
    cells,
    claim,
    comp,
    diff,
    gap_mean,
    gap_sd,
    kb,
    link_speedup,
    mean,
    ratio,
    report_range,
    sd,
    seed,
    sps,
    version,
    wire_field,
    within_20,
)

DIGITS = "docs/results/digits/report.md"
SYNTHETIC = "docs/results/synthetic/report.md"
SPEEDUP = "speedup vs allreduce"
# hierarchical's saving on the host link at 4 x 2, 10 Mb/s, quoted on two pages
HIER_BYTES_SAVED = V(
    diff(
        wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step", HIER),
        wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step", HIER),
    ),
    F0,
)

CLAIMS: list[Claim] = [
    # README.md
    claim("README.md", r"This is decent-dp (\d+\.\d+\.\d+)\.", V(version, "{}")),
    # docs/results/README.md: the wire
    claim(
        RES,
        r"`network=custom` predicts (\d+) of these (\d+) cells within 20%\s+\((\d+) at the line",
        V(within_20("calibrated_ratio"), "{}"),
        V(cells("calibrated_ratio"), "{}"),
        V(within_20("emulated_ratio"), "{}"),
    ),
    claim(
        RES,
        r"its link carries ([\d,]+) bytes per step less than flat",
        HIER_BYTES_SAVED,
    ),
    # docs/results/README.md: language models
    claim(
        RES,
        r"`accum_iter` 8 ended at (\d\.\d{3}) with seed 0",
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum8/stage1/0"), F3),
    ),
    claim(
        RES,
        r"`complete` is level with\s+`allreduce` \(([−-]\d\.\d{3}) ± (\d\.\d{3})\)",
        V(gap_mean(*SGD), "{:+.3f}"),
        V(gap_sd(*SGD), F3),
    ),
    claim(
        RES,
        r"ends \+(\d\.\d{3}) ± (\d\.\d{3}) behind; `complete` keeps a\s+quarter of each point "
        r"fresh and loses (\d\.\d{3})",
        V(gap_mean(*LATE), F3),
        V(gap_sd(*LATE), F3),
        V(gap_mean(*W32), F3),
    ),
    claim(
        RES,
        r"`exp_avg_sq` every 16 steps\s+(\d\.\d{3}) over 3 seeds; both moments every step "
        r"(\d\.\d{3}) on seed 0, against (\d\.\d{3})\), nor does giving\s+each worker "
        r"`allreduce`'s own `v` \((\d\.\d{3})\)",
        V(mean(f"{GAP}/complete-v/final"), F3),
        V(seed(f"{GAP}/complete-mv/stage1", 0), F3),
        V(seed(f"{GAP}/complete-adamw-lr0.004/final", 0), F3),
        V(lambda s: s.run(f"{GAP}/complete-lagged-v1/stage1/lr2e-3"), F3),
    ),
    claim(
        RES,
        r"`complete` is\s+\+(\d\.\d{3}) ± (\d\.\d{3}) behind `allreduce`, within 0.05, and at "
        r"(\d\.\d{3}) it beats `allreduce` at 32 windows\s+by (\d\.\d{3})\. At 128 windows the "
        r"gap stays \+(\d\.\d{3}) ± (\d\.\d{3})",
        V(gap_mean(*W8), F3),
        V(gap_sd(*W8), F3),
        V(mean(W8[1]), F3),
        V(diff(mean(W32[0]), mean(W8[1])), F3),
        V(gap_mean(*W128), F3),
        V(gap_sd(*W128), F3),
    ),
    # docs/results/README.md: compression
    claim(
        RES,
        r"`compression=int8` sends (\d\.\d{3})x the bytes",
        V(
            ratio(
                comp("ring", "int8", "comm/bytes_per_step"),
                comp("ring", "none", "comm/bytes_per_step"),
            ),
            F3,
        ),
    ),
    claim(
        RES,
        r"\(`ring` (\d\.\d{4}) both, `one-peer-exp` (\d\.\d{4}) against (\d\.\d{4}), 3 seeds",
        V(comp("ring", "int8"), "{:.4f}"),
        V(comp("one-peer-exp", "int8"), "{:.4f}"),
        V(comp("one-peer-exp", "none"), "{:.4f}"),
    ),
    claim(
        RES,
        r"at (\d\.\d\d)x \(`ring`\) and (\d\.\d\d)x \(`one-peer-exp`\) the",
        V(
            ratio(
                comp("ring", "int8", "perf/samples_per_s"),
                comp("ring", "none", "perf/samples_per_s"),
            ),
            F2,
        ),
        V(
            ratio(
                comp("one-peer-exp", "int8", "perf/samples_per_s"),
                comp("one-peer-exp", "none", "perf/samples_per_s"),
            ),
            F2,
        ),
    ),
    claim(
        RES,
        r"(\d\.\d\d)x at 10 Mb/s and (\d\.\d\d)x at 5 Mb/s",
        V(ratio(sps("4x1", "10mbit", "ring-int8"), sps("4x1", "10mbit", "ring")), F2),
        V(ratio(sps("4x1", "5mbit", "ring-int8"), sps("4x1", "5mbit", "ring")), F2),
    ),
    # docs/results/README.md: outer optimizers
    claim(
        RES,
        r"`allreduce` ends at (\d\.\d\d)\. DiLoCo",
        V(mean(f"{OUTER}/allreduce-adamw/final"), F2),
    ),
    claim(
        RES,
        r"by (\d\.\d\d) nats on average at H=16 and (\d\.\d\d) at H=64",
        V(diff(mean(f"{OUTER}/diloco-H16/final"), mean(f"{OUTER}/local-sgd-H16/final")), F2),
        V(diff(mean(f"{OUTER}/diloco-H64/final"), mean(f"{OUTER}/local-sgd-H64/final")), F2),
    ),
    claim(
        RES,
        r"`local-sgd` ends at (\d\.\d{3}) ± (\d\.\d{3}), with seed 1's\s+stall gone, and DiLoCo at "
        r"(\d\.\d{3}) ± (\d\.\d{3}), its seed 1 still (\d\.\d\d) above",
        V(mean(LOCAL_T), F3),
        V(sd(LOCAL_T), F3),
        V(mean(DILOCO_T), F3),
        V(sd(DILOCO_T), F3),
        V(
            lambda s: s.seeds(DILOCO_T)[1] - (s.seeds(DILOCO_T)[0] + s.seeds(DILOCO_T)[2]) / 2,
            F2,
        ),
    ),
    claim(
        RES,
        r"still behind plain averaging on each seed, by (\d\.\d\d) on average",
        V(diff(mean(DILOCO_T), mean(LOCAL_T)), F2),
    ),
    claim(
        RES,
        r"ends at\s+(\d\.\d\d) ± (\d\.\d\d)\. That is ahead of DiLoCo at the same inner lr "
        r"\((\d\.\d\d)\) on each seed, by (\d\.\d\d) on\s+average, at (\d\.\d{3}) of its peak and "
        r"(\d\.\d{3}) of its mean bytes; it is \*\*behind\*\* DiLoCo with its\s+inner lr tuned "
        r"\((\d\.\d{3}) ± (\d\.\d{3})\), by (\d\.\d\d)\. In float32 it ends at (\d\.\d\d)",
        V(mean(INT8), F2),
        V(sd(INT8), F2),
        V(mean(DILOCO), F2),
        V(diff(mean(DILOCO), mean(INT8)), F2),
        V(
            ratio(mean(INT8, "comm/peak_bytes_per_step"), mean(DILOCO, "comm/peak_bytes_per_step")),
            F3,
        ),
        V(ratio(mean(INT8, "comm/bytes_per_step"), mean(DILOCO, "comm/bytes_per_step")), F3),
        V(mean(DILOCO_T), F3),
        V(sd(DILOCO_T), F3),
        V(diff(mean(INT8), mean(DILOCO_T)), F2),
        V(mean(f"{STREAM}/streaming-f4/final"), F2),
    ),
    claim(
        RES,
        r"DiLoCo's final loss\s+(\d\.\d\d) times sooner than `allreduce`",
        V(link_speedup("streaming-f4-int8"), F2),
    ),
    claim(
        RES,
        r"ends at (\d\.\d{3}) ± (\d\.\d{3}), behind the unscaled (\d\.\d{3}) ± (\d\.\d{3})",
        V(mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
        V(sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
        V(mean(f"{STREAM}/slowmo-ope-f4/final"), F3),
        V(sd(f"{STREAM}/slowmo-ope-f4/final"), F3),
    ),
    # docs/results/network/README.md
    claim(
        NET,
        r"at every rate: (\d\.\d\d)x at\s+5 Mb/s \((\d+) against (\d+) samples/s\), (\d\.\d\d)x at "
        r"10 Mb/s, (\d\.\d\d)x at 100 Mb/s and\s+(\d\.\d\d)x at 1 Gb/s",
        V(ratio(sps("4x1", "5mbit", "ring"), sps("4x1", "5mbit", "allreduce")), F2),
        V(sps("4x1", "5mbit", "ring"), F0),
        V(sps("4x1", "5mbit", "allreduce"), F0),
        V(ratio(sps("4x1", "10mbit", "ring"), sps("4x1", "10mbit", "allreduce")), F2),
        V(ratio(sps("4x1", "100mbit", "ring"), sps("4x1", "100mbit", "allreduce")), F2),
        V(ratio(sps("4x1", "1gbit", "ring"), sps("4x1", "1gbit", "allreduce")), F2),
    ),
    claim(
        NET,
        r"is (\d\.\d)x uncompressed `ring` at 5 Mb/s and\s+(\d\.\d)x at 10 Mb/s",
        V(ratio(sps("4x1", "5mbit", "ring-int8"), sps("4x1", "5mbit", "ring")), "{:.1f}"),
        V(ratio(sps("4x1", "10mbit", "ring-int8"), sps("4x1", "10mbit", "ring")), "{:.1f}"),
    ),
    claim(
        NET,
        r"`ring` is (\d\.\d\d)x `allreduce` \(([\d,]+) against (\d+)\)",
        V(ratio(sps("8x1", "10mbit", "ring"), sps("8x1", "10mbit", "allreduce")), F2),
        V(sps("8x1", "10mbit", "ring"), F0),
        V(sps("8x1", "10mbit", "allreduce"), F0),
    ),
    claim(
        NET,
        r"at 4 x 2, 10 Mb/s: `hierarchical`\s+(\d+) KB, flat `one-peer-exp` (\d+) KB, `allreduce` (\d+) KB",
        *(V(kb(wire_field("4x2", "10mbit", a, "wire_bytes_per_step")), F0) for a in H_ARMS),
    ),
    claim(
        NET,
        r"`one-peer-exp` carries (\d+) KB per step more than `hierarchical`",
        V(
            kb(
                diff(
                    wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step"),
                    wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step"),
                )
            ),
            F0,
        ),
    ),
    claim(
        NET,
        r"it beats flat `one-peer-exp` \((\d\.\d\d)x at 4 x 2\)",
        V(ratio(sps("4x2", "10mbit", "hierarchical"), sps("4x2", "10mbit", "one-peer-exp")), F2),
    ),
    claim(
        NET,
        r"\(`one-peer-exp` (\d\.\d{3})-(\d\.\d{3}) s\)",
        V(wire_field("4x1", "100mbit", "one-peer-exp", "step_min_s"), F3),
        V(wire_field("4x1", "100mbit", "one-peer-exp", "step_max_s"), F3),
    ),
    claim(
        NET,
        r"\| emulator, line rate \| (\d+) of (\d+) cells \|\n\| emulator, calibrated \| \*\*(\d+) of (\d+)\*\* \|"
        r"\n\| simulator, line rate \| (\d+) of (\d+) \|\n\| simulator, calibrated \| (\d+) of (\d+) \|",
        V(within_20("emulated_ratio"), "{}"),
        V(cells("emulated_ratio"), "{}"),
        V(within_20("calibrated_ratio"), "{}"),
        V(cells("calibrated_ratio"), "{}"),
        V(within_20("simulated_ratio"), "{}"),
        V(cells("simulated_ratio"), "{}"),
        V(within_20("simulated_cal_ratio"), "{}"),
        V(cells("simulated_cal_ratio"), "{}"),
    ),
    # docs/results/hierarchical/README.md
    claim(
        HIER_PAGE,
        r"`hierarchical` is (\d\.\d\d)x \(2 x 4\) to (\d\.\d\d)x \(4 x 2\) `allreduce` and ahead of "
        r"flat\s+`one-peer-exp` \((\d\.\d\d)x at 4 x 2\)",
        V(
            ratio(
                sps("2x4", "10mbit", "hierarchical", HIER), sps("2x4", "10mbit", "allreduce", HIER)
            ),
            F2,
        ),
        V(
            ratio(
                sps("4x2", "10mbit", "hierarchical", HIER), sps("4x2", "10mbit", "allreduce", HIER)
            ),
            F2,
        ),
        V(
            ratio(
                sps("4x2", "10mbit", "hierarchical", HIER),
                sps("4x2", "10mbit", "one-peer-exp", HIER),
            ),
            F2,
        ),
    ),
    *(
        claim(
            HIER_PAGE,
            rf"\| {label} \| ([\d,]+) \|",
            V(wire_field("4x2", "10mbit", arm, "wire_bytes_per_step", HIER), F0),
        )
        for label, arm in (
            ("`hierarchical`", "hierarchical"),
            ("`one-peer-exp`", "one-peer-exp"),
            (r"`allreduce` \(torch DDP\)", "allreduce"),
        )
    ),
    claim(
        HIER_PAGE,
        r"The two decentralized arms differ by ([\d,]+) bytes per step",
        HIER_BYTES_SAVED,
    ),
    # docs/results/README.md: lm_quick
    claim(
        RES,
        r"unigram entropy is (\d\.\d{3}) nats; every run",
        V(lambda s: s.run("docs/results/lm_quick/runs/0", "unigram_entropy"), F3),
    ),
    # docs/results/network/README.md: the calibration's terms
    claim(
        NET,
        r"efficiency (\d\.\d\d) / (\d\.\d\d) / (\d\.\d) and a cost per\s+collective of (\d) / (\d\.\d) / "
        r"(\d\.\d) ms at 10 / 100 / 1000 Mb/s, and the network stack's CPU, (\d+)-(\d+) ms per\s+MB sent beyond "
        r"loopback's at 10 and 100 Mb/s and (\d+) ms at 1 Gb/s",
        V(calibrated("10mbit", "efficiency"), F2),
        V(calibrated("100mbit", "efficiency"), F2),
        V(calibrated("1gbit", "efficiency"), "{:.1f}"),
        V(calibrated("10mbit", "collective_ms"), "{:.0f}"),
        V(calibrated("100mbit", "collective_ms"), "{:.1f}"),
        V(calibrated("1gbit", "collective_ms"), "{:.1f}"),
        V(calibrated("10mbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
        V(calibrated("100mbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
        V(calibrated("1gbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
    ),
    # docs/results/hierarchical/README.md: before and after the phase driver
    *(
        claim(
            HIER_PAGE,
            rf"^\| {h} x {p} \| {label} \| ([\d,]+) \| ([\d,]+) \|",
            V(
                lambda s, h=h, p=p, r=r: s.run(
                    f"{BEFORE}/{h}x{p}/{r}/hierarchical/wire", "perf/samples_per_s"
                ),
                F0,
            ),
            V(sps(f"{h}x{p}", r, "hierarchical", HIER), F0),
        )
        for h, p in ((4, 2), (2, 4))
        for label, r in (("10 Mb/s", "10mbit"), ("100 Mb/s", "100mbit"))
    ),
    # docs/results/README.md: the CPU sweep's reports (their runs are not committed)
    claim(
        RES,
        r"all topologies reach (\d\.\d{3})-(\d\.\d{3});\s+decentralized runs are (\d\.\d\d)-(\d\.\d\d)x the "
        r"all-reduce throughput on loopback and\s+(\d\.\d\d)-(\d\.\d\d)x with emulated 25 Gb/s Ethernet",
        V(lambda s: min(float(r["final eval/acc"]) for r in s.md_rows(DIGITS)), F3),
        V(lambda s: max(float(r["final eval/acc"]) for r in s.md_rows(DIGITS)), F3),
        V(report_range(DIGITS, "", SPEEDUP), F2),
        V(report_range(DIGITS, "", SPEEDUP, max), F2),
        V(report_range(DIGITS, "ethernet_25g", SPEEDUP), F2),
        V(report_range(DIGITS, "ethernet_25g", SPEEDUP, max), F2),
    ),
    claim(
        RES,
        r"\(random data, throughput only\): (\d\.\d\d)-(\d\.\d\d)x on loopback, (\d\.\d\d)-(\d\.\d\d)x with\s+"
        r"emulated 25 Gb/s Ethernet, and (\d\.\d\d)-(\d\.\d\d)x with an emulated 0\.5 Gb/s link",
        *(
            V(report_range(SYNTHETIC, net, SPEEDUP, pick), F2)
            for net in ("", "ethernet_25g", "custom")
            for pick in (min, max)
        ),
    ),
]
