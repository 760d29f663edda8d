"""Claims of compression, non-IID, performance, cluster and network-and-simulation (see :mod:`experiments.report.claims`)."""

from __future__ import annotations

from experiments.report.claims.base import (
    CHOOSE_25G,
    COMP,
    COMP_PAGE,
    COMP_SUMMARY,
    F0,
    F2,
    F3,
    LEVEL,
    NONIID_PAGE,
    NONIID_ROWS,
    RES,
    WIRE,
    Claim,
    V,
    bench_vs_ddp,
    calibration,
    cells,
    chooser_mb,
    claim,
    closed,
    comp,
    diff,
    neg,
    noniid,
    ratio,
    sd,
    simulated_speedup,
    upstream_ms,
    upstream_run,
    within_20,
)
from experiments.report.doc_views import UPSTREAM_RUN, profile_ms

CLAIMS: list[Claim] = [
    # docs/performance.md: make bench-upstream
    *(
        claim(
            "docs/performance.md",
            rf"^\| {model} \| {procs} \| {topo} \| (\d+\.\d) \| (\d+\.\d) \| (\d+\.\d) \| \**(\d\.\d\d)\** \|",
            V(upstream_ms(model, procs, "ours"), "{:.1f}"),
            V(upstream_ms(model, procs, "0.2.3"), "{:.1f}"),
            V(upstream_ms(model, procs, "torch-ddp"), "{:.1f}"),
            V(ratio(upstream_ms(model, procs, "ours"), upstream_ms(model, procs, "0.2.3")), F2),
        )
        for model, procs, topo in (
            ("gpt", 2, "ring"),
            ("gpt", 4, "one-peer-exp"),
            ("mlp", 2, "ring"),
            ("mlp", 4, "one-peer-exp"),
        )
    ),
    # docs/cluster.md
    claim(
        "docs/cluster.md",
        r"\((\d+) of (\d+) cells within 20%,\s+predicted/measured (\d\.\d\d) to (\d\.\d\d),",
        V(within_20("simulated_cal_ratio"), "{}"),
        V(cells("simulated_cal_ratio"), "{}"),
        V(
            lambda s: min(
                r["simulated_cal_ratio"] for r in s.json(WIRE) if r.get("simulated_cal_ratio")
            ),
            F2,
        ),
        V(
            lambda s: max(
                r["simulated_cal_ratio"] for r in s.json(WIRE) if r.get("simulated_cal_ratio")
            ),
            F2,
        ),
    ),
    claim(
        "docs/cluster.md",
        r"`complete` and (\d+) MB per host link\s+against (\d+) MB",
        V(chooser_mb(CHOOSE_25G, "hierarchical"), F0),
        V(chooser_mb(CHOOSE_25G, "complete"), F0),
    ),
    # docs/results/noniid/README.md and the non-IID section of docs/results/README.md
    *(
        claim(
            NONIID_PAGE,
            rf"^\| {a} \| {t}(?: \(H=8\))? \| {o} \| (\d+\.\d\d) ± (\d+\.\d\d) \| ([\u2212-]\d+\.\d\d) \|",
            V(noniid(a, t, o, 0), F2),
            V(noniid(a, t, o, 1), F2),
            V(noniid(a, t, o, 2), F2),
        )
        for a, t, o in NONIID_ROWS
    ),
    *(
        claim(
            NONIID_PAGE,
            rf"^\| {a} \| allreduce \| sgd \| (\d+\.\d\d) ± (\d+\.\d\d) \| 0 \|",
            V(noniid(a, "allreduce", "sgd", 0), F2),
            V(noniid(a, "allreduce", "sgd", 1), F2),
        )
        for a in ("0.1", "1.0")
    ),
    claim(
        NONIID_PAGE,
        r"(\d+)% of it on the\s+ring \((\d+\.\d) → (\d+\.\d) points\), (\d+)% on one-peer-exp "
        r"\((\d+\.\d) → (\d+\.\d) points\) and (\d+)% for local SGD with\s+H = 8 "
        r"\((\d+\.\d) → (\d+\.\d) points\)",
        *(
            v
            for t in ("ring", "one-peer-exp", "local-sgd")
            for v in (
                V(closed("0.1", t), F0),
                V(neg(noniid("0.1", t, "sgd", 2)), "{:.1f}"),
                V(neg(noniid("0.1", t, "qgm_sgd", 2)), "{:.1f}"),
            )
        ),
    ),
    claim(
        NONIID_PAGE,
        r"\(std (\d+\.\d) → (\d+\.\d) on the ring,\s+(\d+\.\d) → (\d+\.\d) for local SGD\)",
        V(noniid("0.1", "ring", "sgd", 1), "{:.1f}"),
        V(noniid("0.1", "ring", "qgm_sgd", 1), "{:.1f}"),
        V(noniid("0.1", "local-sgd", "sgd", 1), "{:.1f}"),
        V(noniid("0.1", "local-sgd", "qgm_sgd", 1), "{:.1f}"),
    ),
    *(
        claim(
            page,
            r"ring and one-peer-exp \((\d\.\d\d) and (\d\.\d\d)\)",
            V(neg(noniid("1.0", "ring", "sgd", 2)), F2),
            V(neg(noniid("1.0", "one-peer-exp", "sgd", 2)), F2),
        )
        for page in (NONIID_PAGE,)
    ),
    claim(
        RES,
        r"\(alpha 1\.0\):\*\* plain momentum is about 1 point behind all-reduce on the ring and "
        r"one-peer-exp\s+\((\d\.\d\d) and (\d\.\d\d) points\) and (\d\.\d\d) with local SGD; QGM "
        r"is (\d\.\d\d) to (\d\.\d\d) points",
        V(neg(noniid("1.0", "ring", "sgd", 2)), F2),
        V(neg(noniid("1.0", "one-peer-exp", "sgd", 2)), F2),
        V(neg(noniid("1.0", "local-sgd", "sgd", 2)), F2),
        V(
            diff(
                noniid("1.0", "one-peer-exp", "sgd", 2), noniid("1.0", "one-peer-exp", "qgm_sgd", 2)
            ),
            F2,
        ),
        V(diff(noniid("1.0", "ring", "sgd", 2), noniid("1.0", "ring", "qgm_sgd", 2)), F2),
    ),
    claim(
        NONIID_PAGE,
        r"and QGM is (\d\.\d\d) to (\d\.\d\d) points \*worse\* there",
        V(
            diff(
                noniid("1.0", "one-peer-exp", "sgd", 2), noniid("1.0", "one-peer-exp", "qgm_sgd", 2)
            ),
            F2,
        ),
        V(diff(noniid("1.0", "ring", "sgd", 2), noniid("1.0", "ring", "qgm_sgd", 2)), F2),
    ),
    claim(
        RES,
        r"Ring: (\d+)% of the gap \((\d+\.\d) to (\d+\.\d) points\)\.\n\s+- One-peer-exp: (\d+)% "
        r"\((\d+\.\d) to (\d+\.\d) points\)\.\n\s+- Local SGD: (\d+)% \((\d+\.\d) to (\d+\.\d) points\)",
        *(
            v
            for t in ("ring", "one-peer-exp", "local-sgd")
            for v in (
                V(closed("0.1", t), F0),
                V(neg(noniid("0.1", t, "sgd", 2)), "{:.1f}"),
                V(neg(noniid("0.1", t, "qgm_sgd", 2)), "{:.1f}"),
            )
        ),
    ),
    claim(
        RES,
        r"on the ring the standard deviation falls from (\d\.\d) to (\d\.\d) points",
        V(noniid("0.1", "ring", "sgd", 1), "{:.1f}"),
        V(noniid("0.1", "ring", "qgm_sgd", 1), "{:.1f}"),
    ),
    # docs/results/compression/summary.md (written by the sweep) and README.md
    *(
        claim(
            COMP_SUMMARY,
            rf"^\| {t} \| {LEVEL[c]} \| 3 \| (\d\.\d{{4}}) ± (\d\.\d{{4}}) \| ([+-]\d\.\d\d) \| ([\d,]+) \| "
            r"(\d\.\d{3})x \| (\d+) ± (\d+) \| (\d\.\d\d)x \|",
            V(comp(t, c), "{:.4f}"),
            V(sd(f"{COMP}/{t}_{c}_seed*", "eval/acc"), "{:.4f}"),
            V(lambda s, t=t, c=c: 100 * (comp(t, c)(s) - comp(t, "none")(s)), "{:+.2f}"),
            V(comp(t, c, "comm/bytes_per_step"), F0),
            V(
                ratio(comp(t, c, "comm/bytes_per_step"), comp(t, "none", "comm/bytes_per_step")),
                F3,
            ),
            V(comp(t, c, "perf/samples_per_s"), "{:.0f}"),
            V(sd(f"{COMP}/{t}_{c}_seed*", "perf/samples_per_s"), "{:.0f}"),
            V(ratio(comp(t, c, "perf/samples_per_s"), comp(t, "none", "perf/samples_per_s")), F2),
        )
        for t in ("ring", "one-peer-exp")
        for c in ("none", "bf16", "int8", "randk")
    ),
    claim(
        COMP_PAGE,
        r"\*\*int8 meets the goal\*\*: (\d\.\d{3})x the bytes of uncompressed gossip \(([\d,]+) against "
        r"([\d,]+)\s+bytes per step\)",
        V(
            ratio(
                comp("ring", "int8", "comm/bytes_per_step"),
                comp("ring", "none", "comm/bytes_per_step"),
            ),
            F3,
        ),
        V(comp("ring", "int8", "comm/bytes_per_step"), F0),
        V(comp("ring", "none", "comm/bytes_per_step"), F0),
    ),
    claim(
        COMP_PAGE,
        r"on `ring`\s+\((\d\.\d{4}) both\) and (\d\.\d\d) points lower on `one-peer-exp` \((\d\.\d{4}) against "
        r"(\d\.\d{4})\)",
        V(comp("ring", "int8"), "{:.4f}"),
        V(
            lambda s: 100 * (comp("one-peer-exp", "none")(s) - comp("one-peer-exp", "int8")(s)),
            F2,
        ),
        V(comp("one-peer-exp", "int8"), "{:.4f}"),
        V(comp("one-peer-exp", "none"), "{:.4f}"),
    ),
    claim(
        COMP_PAGE,
        r"link sets the step time: (\d+) to (\d+) samples/s uncompressed,\s+(\d\.\d)x with bf16, "
        r"(\d\.\d\d) to (\d\.\d\d)x with int8",
        V(comp("one-peer-exp", "none", "perf/samples_per_s"), "{:.0f}"),
        V(comp("ring", "none", "perf/samples_per_s"), "{:.0f}"),
        V(
            ratio(
                comp("ring", "bf16", "perf/samples_per_s"),
                comp("ring", "none", "perf/samples_per_s"),
            ),
            "{:.1f}",
        ),
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
    # docs/network-and-simulation.md: the simulator against the reference paper
    *(
        claim(
            "docs/network-and-simulation.md",
            rf"^\| {label} \| {method} \| (\d+\.\d) \| (\d+\.\d) \| {tail}",
            V(calibration(profile, method, "measured_ms"), "{:.1f}"),
            V(calibration(profile, method, "predicted_ms"), "{:.1f}"),
            *(
                (V(lambda s, p=profile, m=method: 100 * calibration(p, m, "error")(s), "{:+.1f}"),)
                if tail != "fitted"
                else ()
            ),
        )
        for label, profile, method, tail in (
            ("A40, 25 GbE", "a40_ethernet_25g", "allreduce", "fitted"),
            ("A40, 25 GbE", "a40_ethernet_25g", "alternating-exp-ring", r"\*\*([+-]\d+\.\d)%\*\*"),
            ("A100, InfiniBand", "a100_infiniband_hdr", "allreduce", r"([+-]\d+\.\d)%"),
            ("A100, InfiniBand", "a100_infiniband_hdr", "alternating-exp-ring", r"([+-]\d+\.\d)%"),
        )
    ),
    claim(
        "docs/network-and-simulation.md",
        r"The predicted speedup on 25 GbE is (\d\.\d\d)x, against (\d\.\d\d)x measured",
        V(
            ratio(
                calibration("a40_ethernet_25g", "allreduce", "predicted_ms"),
                calibration("a40_ethernet_25g", "alternating-exp-ring", "predicted_ms"),
            ),
            F2,
        ),
        V(
            ratio(
                calibration("a40_ethernet_25g", "allreduce", "measured_ms"),
                calibration("a40_ethernet_25g", "alternating-exp-ring", "measured_ms"),
            ),
            F2,
        ),
    ),
    claim(
        "docs/network-and-simulation.md",
        r"Only the Ethernet efficiency is fitted \((\d\.\d{3}),",
        V(calibration("a40_ethernet_25g", "allreduce", "efficiency"), F3),
    ),
    # docs/performance.md: make bench
    claim(
        "docs/performance.md",
        r"the wrapper runs at (\d\.\d\d)-(\d\.\d\d)x torch DDP\s+on the MLP at 4 processes \(one-peer-exp "
        r"(\d\.\d\d)x\) and (\d\.\d\d)-(\d\.\d\d)x at 2, and at\s+(\d\.\d\d)-(\d\.\d\d)x on ResNet-18",
        V(bench_vs_ddp("mlp", 4), F2),
        V(bench_vs_ddp("mlp", 4, pick=max), F2),
        V(bench_vs_ddp("mlp", 4, "decent/one-peer-exp"), F2),
        V(bench_vs_ddp("mlp", 2), F2),
        V(bench_vs_ddp("mlp", 2, pick=max), F2),
        V(bench_vs_ddp("resnet18", None), F2),
        V(bench_vs_ddp("resnet18", None, pick=max), F2),
    ),
    # docs/network-and-simulation.md: the ResNet-50 simulation
    claim(
        "docs/network-and-simulation.md",
        r"ring and alternating-exp-ring reach (\d\.\d\d) to (\d\.\d\d)x the all-reduce throughput;\n"
        r"- one-peer-exp \((\d\.\d\d) to (\d\.\d\d)x\) and random-matching \((\d\.\d\d) to (\d\.\d\d)x\) fall "
        r"behind, because 8 GPUs share one NIC;\n- on 100 Gb/s InfiniBand, every topology gains (\d\.\d\d) to "
        r"(\d\.\d\d)x",
        *(
            V(simulated_speedup(profile, methods, pick), F2)
            for profile, methods in (
                ("ethernet_25g", ("ring", "alternating-exp-ring")),
                ("ethernet_25g", ("one-peer-exp",)),
                ("ethernet_25g", ("random-matching",)),
                ("infiniband_100g", ()),
            )
            for pick in (min, max)
        ),
    ),
    # docs/performance.md: the first make bench-upstream run (results.json)
    *(
        claim(
            "docs/performance.md",
            rf"^\| {procs} \| {topo} \| (\d+\.\d) \| (\d+\.\d) \| (\d+\.\d) \| (\d+\.\d) \| \*\*(\d\.\d\d)\*\* \|"
            r"[^|]*\| \**(\d\.\d\d)\** \|",
            *(
                V(upstream_run(procs, impl), "{:.1f}")
                for impl in ("ours", "0.2.3", "torch-ddp", "before")
            ),
            V(ratio(upstream_run(procs, "ours"), upstream_run(procs, "0.2.3")), F2),
            V(ratio(upstream_run(procs, "ours"), upstream_run(procs, "torch-ddp")), F2),
        )
        for procs, topo in ((2, "ring"), (4, "one-peer-exp"))
    ),
    claim(
        "docs/performance.md",
        r"the ratios of\s+median steps \((\d\.\d\d), (\d\.\d\d)\) match the ratios of CPU time \((\d\.\d\d), "
        r"(\d\.\d\d)\)\. Ours spends\s+(\d+) ms of CPU per rank and step, torch DDP (\d+) ms",
        V(ratio(upstream_run(4, "ours"), upstream_run(4, "0.2.3")), F2),
        V(ratio(upstream_run(4, "ours"), upstream_run(4, "torch-ddp")), F2),
        V(ratio(upstream_run(4, "ours", "cpu_step_s"), upstream_run(4, "0.2.3", "cpu_step_s")), F2),
        V(
            ratio(
                upstream_run(4, "ours", "cpu_step_s"), upstream_run(4, "torch-ddp", "cpu_step_s")
            ),
            F2,
        ),
        V(upstream_run(4, "ours", "cpu_step_s"), "{:.0f}"),
        V(upstream_run(4, "torch-ddp", "cpu_step_s"), "{:.0f}"),
    ),
    # docs/performance.md: the changes, as the profile (results.json) measured them
    *(
        claim(
            "docs/performance.md",
            rf"{label}: (\d+\.\d) -> (\d+\.\d) ms",
            V(lambda s, k=key: profile_ms(s, UPSTREAM_RUN, 4, "before", k), "{:.1f}"),
            V(lambda s, k=key: profile_ms(s, UPSTREAM_RUN, 4, "ours", k), "{:.1f}"),
        )
        for label, key in (("Mix", "mix"), ("Optimizer", "optimizer"))
    ),
    claim(
        "docs/performance.md",
        r"\(glibc `mallopt`\): ([\d,]+) -> ([\d,]+) minor page faults per step",
        V(lambda s: upstream_run(4, "before", "faults_per_step")(s) / 1e3, "{:,.0f}"),
        V(lambda s: upstream_run(4, "ours", "faults_per_step")(s) / 1e3, "{:,.0f}"),
    ),
]
