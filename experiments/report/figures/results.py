"""The figures of the README, the results page, and the wire and hierarchical pages (see :mod:`experiments.report.figures`)."""

from __future__ import annotations

from experiments.report.figures.sources import (
    BEFORE,
    COMP,
    DIGITS,
    DILOCO,
    DILOCO_T,
    GAP,
    HIER,
    INT8,
    LM,
    LOCAL_T,
    OUTER,
    STREAM,
    Figure,
    calibrated,
    cells,
    diff,
    drops,
    gap_mean,
    gap_sd,
    gpt_tiny_params,
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

FIGURES: dict[str, Figure] = {
    "res.gpt-tiny-params": Figure(gpt_tiny_params, "{:,}"),
    "net.drops-one-peer-exp-4x2": Figure(drops("4x2", "10mbit", "one-peer-exp"), "{:.0f}"),
    "readme.this-is-decent-dp": Figure(version),
    "res.run-network-custom-predicts": Figure(within_20("calibrated_ratio")),
    "res.custom-predicts-of-these": Figure(cells("calibrated_ratio")),
    "res.of-these-cells-within": Figure(within_20("emulated_ratio")),
    "res.allreduce-its-link-carries": Figure(
        diff(
            wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step", HIER),
            wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step", HIER),
        ),
        "{:,.0f}",
    ),
    "res.report.md-all-topologies-reach": Figure(
        lambda s: min(float(r["final eval/acc"]) for r in s.md_rows(DIGITS)), "{:.3f}"
    ),
    "res.report.md-all-topologies-reach-2": Figure(
        lambda s: max(float(r["final eval/acc"]) for r in s.md_rows(DIGITS)), "{:.3f}"
    ),
    "res.reach-decentralized-runs-are": Figure(
        report_range("docs/results/digits/report.md", "", "speedup vs allreduce"), "{:.2f}"
    ),
    "res.reach-decentralized-runs-are-2": Figure(
        report_range("docs/results/digits/report.md", "", "speedup vs allreduce", max), "{:.2f}"
    ),
    "res.throughput-on-loopback-and": Figure(
        report_range("docs/results/digits/report.md", "ethernet_25g", "speedup vs allreduce"),
        "{:.2f}",
    ),
    "res.throughput-on-loopback-and-2": Figure(
        report_range("docs/results/digits/report.md", "ethernet_25g", "speedup vs allreduce", max),
        "{:.2f}",
    ),
    "res.random-data-throughput-only": Figure(
        report_range("docs/results/synthetic/report.md", "", "speedup vs allreduce"), "{:.2f}"
    ),
    "res.random-data-throughput-only-2": Figure(
        report_range("docs/results/synthetic/report.md", "", "speedup vs allreduce", max), "{:.2f}"
    ),
    "res.throughput-only-on-loopback": Figure(
        report_range("docs/results/synthetic/report.md", "ethernet_25g", "speedup vs allreduce"),
        "{:.2f}",
    ),
    "res.throughput-only-on-loopback-2": Figure(
        report_range(
            "docs/results/synthetic/report.md", "ethernet_25g", "speedup vs allreduce", max
        ),
        "{:.2f}",
    ),
    "res.gb-s-ethernet-and": Figure(
        report_range("docs/results/synthetic/report.md", "custom", "speedup vs allreduce"), "{:.2f}"
    ),
    "res.gb-s-ethernet-and-2": Figure(
        report_range("docs/results/synthetic/report.md", "custom", "speedup vs allreduce", max),
        "{:.2f}",
    ),
    "res.accum-iter-ended-at": Figure(
        lambda s: s.run(f"{LM}/one-peer-exp-accum8/stage1/0"), "{:.3f}"
    ),
    "res.is-level-with-allreduce": Figure(
        gap_mean(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final"), "{:+.3f}", minus=True
    ),
    "res.is-level-with-allreduce-2": Figure(
        gap_sd(f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final"), "{:.3f}"
    ),
    "res.optim.lag-m-true-ends": Figure(
        gap_mean(f"{GAP}/allreduce-adamw/final", f"{GAP}/allreduce-delayed/final"), "{:.3f}"
    ),
    "res.optim.lag-m-true-ends-2": Figure(
        gap_sd(f"{GAP}/allreduce-adamw/final", f"{GAP}/allreduce-delayed/final"), "{:.3f}"
    ),
    "res.point-fresh-and-loses": Figure(
        gap_mean(f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final"), "{:.3f}"
    ),
    "res.avg-sq-every-steps": Figure(mean(f"{GAP}/complete-v/final"), "{:.3f}"),
    "res.both-moments-every-step": Figure(seed(f"{GAP}/complete-mv/stage1", 0), "{:.3f}"),
    "res.step-on-seed-against": Figure(seed(f"{GAP}/complete-adamw-lr0.004/final", 0), "{:.3f}"),
    "res.allreduce-s-own-v": Figure(
        lambda s: s.run(f"{GAP}/complete-lagged-v1/stage1/lr2e-3"), "{:.3f}"
    ),
    "res.worker-steps-complete-is": Figure(
        gap_mean(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final"), "{:.3f}"
    ),
    "res.worker-steps-complete-is-2": Figure(
        gap_sd(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final"), "{:.3f}"
    ),
    "res.allreduce-within-and-at": Figure(mean(f"{GAP}/complete-w8/final"), "{:.3f}"),
    "res.allreduce-at-windows-by": Figure(
        diff(mean(f"{GAP}/allreduce-adamw/final"), mean(f"{GAP}/complete-w8/final")), "{:.3f}"
    ),
    "res.windows-the-gap-stays": Figure(
        gap_mean(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final"), "{:.3f}"
    ),
    "res.windows-the-gap-stays-2": Figure(
        gap_sd(f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final"), "{:.3f}"
    ),
    "res.s-unigram-entropy-is": Figure(
        lambda s: s.run("docs/results/lm_quick/runs/0", "unigram_entropy"), "{:.3f}"
    ),
    "res.gossip-measured-compression-sends": Figure(
        ratio(
            mean(f"{COMP}/ring_int8_seed*", "comm/bytes_per_step"),
            mean(f"{COMP}/ring_none_seed*", "comm/bytes_per_step"),
        ),
        "{:.3f}",
    ),
    "res.accuracy-on-digits-ring": Figure(mean(f"{COMP}/ring_int8_seed*", "eval/acc"), "{:.4f}"),
    "res.both-one-peer-exp": Figure(mean(f"{COMP}/one-peer-exp_int8_seed*", "eval/acc"), "{:.4f}"),
    "res.one-peer-exp-against": Figure(
        mean(f"{COMP}/one-peer-exp_none_seed*", "eval/acc"), "{:.4f}"
    ),
    "res.runs-compression-runs-at": Figure(
        ratio(
            mean(f"{COMP}/ring_int8_seed*", "perf/samples_per_s"),
            mean(f"{COMP}/ring_none_seed*", "perf/samples_per_s"),
        ),
        "{:.2f}",
    ),
    "res.runs-at-ring-and": Figure(
        ratio(
            mean(f"{COMP}/one-peer-exp_int8_seed*", "perf/samples_per_s"),
            mean(f"{COMP}/one-peer-exp_none_seed*", "perf/samples_per_s"),
        ),
        "{:.2f}",
    ),
    "res.network-table.json-network-table.json": Figure(
        ratio(sps("4x1", "10mbit", "ring-int8"), sps("4x1", "10mbit", "ring")), "{:.2f}"
    ),
    "res.at-mb-s-and": Figure(
        ratio(sps("4x1", "5mbit", "ring-int8"), sps("4x1", "5mbit", "ring")), "{:.2f}"
    ),
    "res.bytes-allreduce-ends-at": Figure(mean(f"{OUTER}/allreduce-adamw/final"), "{:.2f}"),
    "res.at-both-h-by": Figure(
        diff(mean(f"{OUTER}/diloco-H16/final"), mean(f"{OUTER}/local-sgd-H16/final")), "{:.2f}"
    ),
    "res.average-at-h-and": Figure(
        diff(mean(f"{OUTER}/diloco-H64/final"), mean(f"{OUTER}/local-sgd-H64/final")), "{:.2f}"
    ),
    "res.local-sgd-ends-at": Figure(mean(LOCAL_T), "{:.3f}"),
    "res.local-sgd-ends-at-2": Figure(sd(LOCAL_T), "{:.3f}"),
    "res.gone-and-diloco-at": Figure(mean(DILOCO_T), "{:.3f}"),
    "res.gone-and-diloco-at-2": Figure(sd(DILOCO_T), "{:.3f}"),
    "res.at-its-seed-still": Figure(
        lambda s: s.seeds(DILOCO_T)[1] - (s.seeds(DILOCO_T)[0] + s.seeds(DILOCO_T)[2]) / 2, "{:.2f}"
    ),
    "res.on-each-seed-by": Figure(diff(mean(DILOCO_T), mean(LOCAL_T)), "{:.2f}"),
    "res.lr-and-ends-at": Figure(mean(INT8), "{:.2f}"),
    "res.lr-and-ends-at-2": Figure(sd(INT8), "{:.2f}"),
    "res.the-same-inner-lr": Figure(mean(DILOCO), "{:.2f}"),
    "res.on-each-seed-by-2": Figure(diff(mean(DILOCO), mean(INT8)), "{:.2f}"),
    "res.by-on-average-at": Figure(
        ratio(mean(INT8, "comm/peak_bytes_per_step"), mean(DILOCO, "comm/peak_bytes_per_step")),
        "{:.3f}",
    ),
    "res.of-its-peak-and": Figure(
        ratio(mean(INT8, "comm/bytes_per_step"), mean(DILOCO, "comm/bytes_per_step")), "{:.3f}"
    ),
    "res.its-inner-lr-tuned": Figure(mean(DILOCO_T), "{:.3f}"),
    "res.its-inner-lr-tuned-2": Figure(sd(DILOCO_T), "{:.3f}"),
    "res.inner-lr-tuned-by": Figure(diff(mean(INT8), mean(DILOCO_T)), "{:.2f}"),
    "res.in-it-ends-at": Figure(mean(f"{STREAM}/streaming-f4/final"), "{:.2f}"),
    "res.diloco-s-final-loss": Figure(link_speedup("streaming-f4-int8"), "{:.2f}"),
    "res.inner-rate-ends-at": Figure(mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), "{:.3f}"),
    "res.inner-rate-ends-at-2": Figure(sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), "{:.3f}"),
    "res.at-behind-the-unscaled": Figure(mean(f"{STREAM}/slowmo-ope-f4/final"), "{:.3f}"),
    "res.at-behind-the-unscaled-2": Figure(sd(f"{STREAM}/slowmo-ope-f4/final"), "{:.3f}"),
    "net.table1.emulator-line-rate.within-20-of-the-wire": Figure(within_20("emulated_ratio")),
    "net.table1.emulator-line-rate.within-20-of-the-wire-2": Figure(cells("emulated_ratio")),
    "net.table1.emulator-calibrated.within-20-of-the-wire": Figure(within_20("calibrated_ratio")),
    "net.table1.emulator-calibrated.within-20-of-the-wire-2": Figure(cells("calibrated_ratio")),
    "net.table1.simulator-line-rate.within-20-of-the-wire": Figure(within_20("simulated_ratio")),
    "net.table1.simulator-line-rate.within-20-of-the-wire-2": Figure(cells("simulated_ratio")),
    "net.table1.simulator-calibrated.within-20-of-the-wire": Figure(
        within_20("simulated_cal_ratio")
    ),
    "net.table1.simulator-calibrated.within-20-of-the-wire-2": Figure(cells("simulated_cal_ratio")),
    "net.wire-at-every-rate": Figure(
        ratio(sps("4x1", "5mbit", "ring"), sps("4x1", "5mbit", "allreduce")), "{:.2f}"
    ),
    "net.rate-at-mb-s": Figure(sps("4x1", "5mbit", "ring"), "{:,.0f}"),
    "net.at-mb-s-against": Figure(sps("4x1", "5mbit", "allreduce"), "{:,.0f}"),
    "net.s-against-samples-s": Figure(
        ratio(sps("4x1", "10mbit", "ring"), sps("4x1", "10mbit", "allreduce")), "{:.2f}"
    ),
    "net.s-at-mb-s": Figure(
        ratio(sps("4x1", "100mbit", "ring"), sps("4x1", "100mbit", "allreduce")), "{:.2f}"
    ),
    "net.at-mb-s-and": Figure(
        ratio(sps("4x1", "1gbit", "ring"), sps("4x1", "1gbit", "allreduce")), "{:.2f}"
    ),
    "net.compression-on-ring-is": Figure(
        ratio(sps("4x1", "5mbit", "ring-int8"), sps("4x1", "5mbit", "ring")), "{:.1f}"
    ),
    "net.at-mb-s-and-2": Figure(
        ratio(sps("4x1", "10mbit", "ring-int8"), sps("4x1", "10mbit", "ring")), "{:.1f}"
    ),
    "net.mb-s-ring-is": Figure(
        ratio(sps("8x1", "10mbit", "ring"), sps("8x1", "10mbit", "allreduce")), "{:.2f}"
    ),
    "net.s-ring-is-allreduce": Figure(sps("8x1", "10mbit", "ring"), "{:,.0f}"),
    "net.ring-is-allreduce-against": Figure(sps("8x1", "10mbit", "allreduce"), "{:,.0f}"),
    "net.x-mb-s-hierarchical": Figure(
        kb(wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step")), "{:,.0f}"
    ),
    "net.flat-one-peer-exp": Figure(
        kb(wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step")), "{:,.0f}"
    ),
    "net.peer-exp-kb-allreduce": Figure(
        kb(wire_field("4x2", "10mbit", "allreduce", "wire_bytes_per_step")), "{:,.0f}"
    ),
    "net.one-peer-exp-carries": Figure(
        kb(
            diff(
                wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step"),
                wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step"),
            )
        ),
        "{:,.0f}",
    ),
    "net.flat-one-peer-exp-2": Figure(
        ratio(sps("4x2", "10mbit", "hierarchical"), sps("4x2", "10mbit", "one-peer-exp")), "{:.2f}"
    ),
    "net.m-experiments.network.calibrate-run-effi": Figure(
        calibrated("10mbit", "efficiency"), "{:.2f}"
    ),
    "net.m-experiments.network.calibrate-run-effi-2": Figure(
        calibrated("100mbit", "efficiency"), "{:.2f}"
    ),
    "net.m-experiments.network.calibrate-run-effi-3": Figure(
        calibrated("1gbit", "efficiency"), "{:.1f}"
    ),
    "net.cost-per-collective-of": Figure(calibrated("10mbit", "collective_ms"), "{:.0f}"),
    "net.cost-per-collective-of-2": Figure(calibrated("100mbit", "collective_ms"), "{:.1f}"),
    "net.cost-per-collective-of-3": Figure(calibrated("1gbit", "collective_ms"), "{:.1f}"),
    "net.network-stack-s-cpu": Figure(calibrated("10mbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
    "net.network-stack-s-cpu-2": Figure(calibrated("100mbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
    "net.and-mb-s-and": Figure(calibrated("1gbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
    "net.runs-one-peer-exp": Figure(
        wire_field("4x1", "100mbit", "one-peer-exp", "step_min_s"), "{:.3f}"
    ),
    "net.runs-one-peer-exp-2": Figure(
        wire_field("4x1", "100mbit", "one-peer-exp", "step_max_s"), "{:.3f}"
    ),
    "hier.table1.hierarchical.wire-bytes-per-step": Figure(
        wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step", HIER), "{:,.0f}"
    ),
    "hier.table1.one-peer-exp.wire-bytes-per-step": Figure(
        wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step", HIER), "{:,.0f}"
    ),
    "hier.table1.allreduce-torch-ddp.wire-bytes-per-step": Figure(
        wire_field("4x2", "10mbit", "allreduce", "wire_bytes_per_step", HIER), "{:,.0f}"
    ),
    "hier.table2.4-x-2.before-samples-s": Figure(
        lambda s: s.run(f"{BEFORE}/{4}x{2}/{'10mbit'}/hierarchical/wire", "perf/samples_per_s"),
        "{:,.0f}",
    ),
    "hier.table2.4-x-2.after": Figure(sps("4x2", "10mbit", "hierarchical", HIER), "{:,.0f}"),
    "hier.table2.4-x-2.before-samples-s-2": Figure(
        lambda s: s.run(f"{BEFORE}/{4}x{2}/{'100mbit'}/hierarchical/wire", "perf/samples_per_s"),
        "{:,.0f}",
    ),
    "hier.table2.4-x-2.after-2": Figure(sps("4x2", "100mbit", "hierarchical", HIER), "{:,.0f}"),
    "hier.table2.2-x-4.before-samples-s": Figure(
        lambda s: s.run(f"{BEFORE}/{2}x{4}/{'10mbit'}/hierarchical/wire", "perf/samples_per_s"),
        "{:,.0f}",
    ),
    "hier.table2.2-x-4.after": Figure(sps("2x4", "10mbit", "hierarchical", HIER), "{:,.0f}"),
    "hier.table2.2-x-4.before-samples-s-2": Figure(
        lambda s: s.run(f"{BEFORE}/{2}x{4}/{'100mbit'}/hierarchical/wire", "perf/samples_per_s"),
        "{:,.0f}",
    ),
    "hier.table2.2-x-4.after-2": Figure(sps("2x4", "100mbit", "hierarchical", HIER), "{:,.0f}"),
    "hier.mb-s-hierarchical-is": Figure(
        ratio(sps("2x4", "10mbit", "hierarchical", HIER), sps("2x4", "10mbit", "allreduce", HIER)),
        "{:.2f}",
    ),
    "hier.hierarchical-is-x-to": Figure(
        ratio(sps("4x2", "10mbit", "hierarchical", HIER), sps("4x2", "10mbit", "allreduce", HIER)),
        "{:.2f}",
    ),
    "hier.flat-one-peer-exp": Figure(
        ratio(
            sps("4x2", "10mbit", "hierarchical", HIER), sps("4x2", "10mbit", "one-peer-exp", HIER)
        ),
        "{:.2f}",
    ),
    "hier.decentralized-arms-differ-by": Figure(
        diff(
            wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step", HIER),
            wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step", HIER),
        ),
        "{:,.0f}",
    ),
}

TABLES: dict[str, str] = {
    "net.table1": """\
| model | within 20% of the wire |
|---|---:|
| emulator, line rate | {{net.table1.emulator-line-rate.within-20-of-the-wire}} of {{net.table1.emulator-line-rate.within-20-of-the-wire-2}} cells |
| emulator, calibrated | **{{net.table1.emulator-calibrated.within-20-of-the-wire}} of {{net.table1.emulator-calibrated.within-20-of-the-wire-2}}** |
| simulator, line rate | {{net.table1.simulator-line-rate.within-20-of-the-wire}} of {{net.table1.simulator-line-rate.within-20-of-the-wire-2}} |
| simulator, calibrated | {{net.table1.simulator-calibrated.within-20-of-the-wire}} of {{net.table1.simulator-calibrated.within-20-of-the-wire-2}} |""",
    "hier.table1": """\
| arm | wire bytes per step | of which training (prediction x 1.05 for TCP/IP headers) | the rest |
|---|---:|---:|---:|
| `hierarchical` | {{hier.table1.hierarchical.wire-bytes-per-step}} | 223,600 (1 S) | 158,600 |
| `one-peer-exp` | {{hier.table1.one-peer-exp.wire-bytes-per-step}} | 298,200 (4/3 S) | 159,000 |
| `allreduce` (torch DDP) | {{hier.table1.allreduce-torch-ddp.wire-bytes-per-step}} | 391,400 (7/4 S) | 17,400 |""",
    "hier.table2": """\
| shape | link | before: samples/s | after | before: `comm/wait_s` per step | after |
|---|---|---:|---:|---:|---:|
| 4 x 2 | 10 Mb/s | {{hier.table2.4-x-2.before-samples-s}} | {{hier.table2.4-x-2.after}} | 0.191 | 0.147 |
| 4 x 2 | 100 Mb/s | {{hier.table2.4-x-2.before-samples-s-2}} | {{hier.table2.4-x-2.after-2}} | 0.028 | 0.022 |
| 2 x 4 | 10 Mb/s | {{hier.table2.2-x-4.before-samples-s}} | {{hier.table2.2-x-4.after}} | 0.196 | 0.161 |
| 2 x 4 | 100 Mb/s | {{hier.table2.2-x-4.before-samples-s-2}} | {{hier.table2.2-x-4.after-2}} | 0.032 | 0.028 |""",
}
