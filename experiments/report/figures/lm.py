"""The figures of the language-model pages lm, streaming and outer (see
:mod:`experiments.report.figures`; lm_gap's are in :mod:`~experiments.report.figures.lm_gap`).

An id names its study, arm and statistic: ``stream.f4-int8.mean`` is the mean final
``eval/loss`` of the streaming study's int8 arm, ``outer.diloco-h16.outer-lr0.5`` one run of the
outer study's lr grid, ``stream.link.ARM.speedup`` a row of the slow-link timing,
``lm.complete.gap.step64`` the lm study's gap to ``allreduce`` at one logged step.
"""

from __future__ import annotations

from experiments.report.doc_data import DataError, Source
from experiments.report.figures.families import (
    L3,
    each,
    extremes,
    gaps,
    grid,
    mean_sd,
    slot_cells,
    slots,
    stats,
    table,
)
from experiments.report.figures.sources import (
    DILOCO,
    DILOCO_T,
    INT8,
    LINK,
    LM,
    OUTER,
    STREAM,
    Figure,
    Fn,
    diff,
    gpt_tiny_params,
    link_arm,
    logged,
    mean,
    ratio,
    run,
)

MB = "comm/bytes_per_step"
PEAK = "comm/peak_bytes_per_step"
F4 = f"{STREAM}/streaming-f4/final"
SLOWMO = f"{STREAM}/slowmo-ope-f4/final"
SCALED = f"{STREAM}/slowmo-ope-f4-scaled/final"


def _mean_mb(runs: str, key: str = MB) -> Fn:
    """The mean over seeds of bytes per step, in MB."""
    return lambda s: s.mean(runs, key) / 1e6


def _h64_speed(s: Source) -> float:
    """The H=64 arms' mean tokens/s over ``allreduce``'s (both arms ran on the same host)."""
    key = "perf/tokens_per_s"
    h64 = [s.mean(f"{OUTER}/{arm}-H64/final", key) for arm in ("local-sgd", "diloco")]
    return sum(h64) / len(h64) / s.mean(f"{OUTER}/allreduce-adamw/final", key)


def _along(arm: str, step: int) -> Fn:
    """An lm arm's mean ``eval/loss`` over its seeds at ``step`` less ``allreduce``'s (the
    report's table along training)."""

    def at(s: Source, runs: str) -> float:
        seeds = sorted(p.name for p in (s.root / runs).glob("seed*"))
        if not seeds:
            raise DataError(runs, "no seed folder")
        values = [logged(f"{runs}/{x}/metrics.jsonl", step, "eval/loss")(s) for x in seeds]
        return sum(values) / len(values)

    return lambda s: at(s, f"{LM}/{arm}/final") - at(s, f"{LM}/allreduce-adamw/final")


def _tokens_s(s: Source) -> list[float]:
    """The headline arms' mean tokens/s."""
    return [s.mean(f"{LM}/{arm}/final", "perf/tokens_per_s") for arm in LM_ARMS]


LM_ARMS = (
    "allreduce-adamw",
    "complete-adamw-lr0.004",
    "one-peer-exp-adamw-lr0.004",
    "complete-adamw",
    "one-peer-exp-adamw",
    "one-peer-exp-accum",
)


def _outer(arm: str) -> dict[str, Figure]:
    """An arm of the outer study (``outer.local-sgd-h16``...): its seeds, its gap to
    ``allreduce`` and its mean and peak MB per step."""
    runs, prefix = f"{OUTER}/{arm}/final", f"outer.{arm.lower()}"
    return {
        **stats(prefix, runs),
        f"{prefix}.vs-allreduce": Figure(
            diff(mean(runs), mean(f"{OUTER}/allreduce-adamw/final")), "{:+.3f}"
        ),
        f"{prefix}.mb": Figure(_mean_mb(runs), "{:.2f}"),
        f"{prefix}.peak-mb": Figure(_mean_mb(runs, PEAK), "{:.2f}"),
    }


DILOCO_ARMS = ("diloco-H16", "streaming-f4", "streaming-f4-int8")


def _end_s(arm: str) -> Fn:
    """When an arm's 512 steps end on the slow link: 512 of its median steps."""
    return lambda s: 512 * link_arm(arm, "step_s")(s)


FIGURES: dict[str, Figure] = {
    # lm: the tiny GPT, the AccumAdamW recipe, the single-seed lr pick
    "lm-quick.gpt-tiny.params": Figure(gpt_tiny_params, "{:,}"),
    **{
        f"lm.accum-adamw.accum{n}.seed0": Figure(run(f"{LM}/{rel}"), L3)
        for n, rel in (
            (8, "one-peer-exp-accum8/stage1/0"),
            (1, "one-peer-exp-accum/stage1/0"),
            (4, "one-peer-exp-accum/stage1/1"),
        )
    },
    "lm.accum-adamw.behind-adamw": Figure(
        diff(
            mean(f"{LM}/one-peer-exp-accum/final"), mean(f"{LM}/one-peer-exp-adamw-lr0.004/final")
        ),
        "{:.2f}",
    ),
    "lm.complete.tune.lr8e-3": Figure(run(f"{LM}/complete-adamw/stage1/3"), L3),
    "lm.one-peer-exp.tune.lr8e-3": Figure(run(f"{LM}/one-peer-exp-adamw/stage1/3"), L3),
    **stats("lm.complete.lr8e-3", f"{LM}/complete-adamw/final", "{:.2f}", names="seed1 seed2"),
    **stats(
        "lm.one-peer-exp.lr8e-3", f"{LM}/one-peer-exp-adamw/final", "{:.2f}", names="seed1 seed2"
    ),
    **{
        f"lm.{name}.gap.step{step}": Figure(_along(arm, step), "{:+.3f}")
        for name, arm in (
            ("complete", "complete-adamw-lr0.004"),
            ("one-peer-exp", "one-peer-exp-adamw-lr0.004"),
        )
        for step in (64, 128, 256, 512)
    },
    "lm.one-peer-exp.behind-complete": Figure(
        diff(
            mean(f"{LM}/one-peer-exp-adamw-lr0.004/final"),
            mean(f"{LM}/complete-adamw-lr0.004/final"),
        ),
        "{:.2f}",
    ),
    "lm.complete.gap": Figure(
        diff(mean(f"{LM}/complete-adamw-lr0.004/final"), mean(f"{LM}/allreduce-adamw/final")),
        "{:.2f}",
    ),
    **extremes("lm.tokens-s-k", "{:.0f}", lambda s: [t / 1e3 for t in _tokens_s(s)]),
    "lm.allreduce.sd": Figure(lambda s: s.sd(f"{LM}/allreduce-adamw/final"), L3),
    **grid("lm.allreduce.lr", f"{LM}/allreduce-adamw/stage1", "1e-3 2e-3 4e-3 8e-3"),
    # streaming
    **stats("stream.allreduce", f"{STREAM}/allreduce-adamw/final"),
    **stats("stream.diloco", DILOCO),
    **stats("stream.f4", F4),
    **stats("stream.f4-int8", INT8),
    **stats("stream.slowmo-f4", SLOWMO),
    **stats("stream.slowmo-f4-scaled", SCALED),
    **{
        f"stream.{arm}.{name}": Figure(_mean_mb(runs, key), "{:.3g}")
        for arm, runs in (
            ("allreduce", f"{STREAM}/allreduce-adamw/final"),
            ("diloco", DILOCO),
            ("f4", F4),
            ("f4-int8", INT8),
            ("slowmo-f4", SLOWMO),
            ("slowmo-f4-scaled", SCALED),
        )
        for name, key in (("mb", MB), ("peak-mb", PEAK))
        if (arm, name) != ("allreduce", "peak-mb")  # all-reduce sends the same bytes every step
    },
    **gaps("stream.f4-vs-diloco", DILOCO, F4, minus=True, names="seed0 seed1 seed2 mean"),
    **gaps("stream.f4-int8-vs-diloco", DILOCO, INT8, minus=True, names="seed0 seed1 seed2"),
    **gaps("stream.f4-int8-vs-f4", F4, INT8, minus=True, names="seed0 seed1 seed2 mean"),
    **gaps(
        "stream.slowmo-scaled-vs-unscaled", SLOWMO, SCALED, minus=True, names="seed0 seed1 seed2"
    ),
    **grid(
        "stream.slowmo-f4-scaled.outer-lr",
        f"{STREAM}/slowmo-ope-f4-scaled/stage1",
        "0.5 1.0 1.5",
        "outer.lr",
    ),
    "stream.f4-int8.behind-diloco-h16-lr2e-3": Figure(diff(mean(INT8), mean(DILOCO_T)), "{:.2f}"),
    "stream.f4-int8.ahead-of-diloco": Figure(diff(mean(DILOCO), mean(INT8)), "{:.2f}"),
    **each(
        "stream.f4-int8",
        "{:.3f}",
        peak_vs_diloco=ratio(mean(INT8, PEAK), mean(DILOCO, PEAK)),
        mean_vs_diloco=ratio(mean(INT8, MB), mean(DILOCO, MB)),
    ),
    "stream.f4.peak-vs-diloco": Figure(ratio(mean(F4, PEAK), mean(DILOCO, PEAK)), "{:.3f}"),
    "stream.link.target": Figure(lambda s: float(s.key(LINK, "target")), L3),
    **{
        f"stream.link.{arm}.{name}": Figure(fn, fmt)
        for arm in (
            "allreduce-adamw",
            "diloco-H16",
            "streaming-f4",
            "streaming-f4-int8",
            "slowmo-ope-f4",
        )
        for name, fn, fmt in (
            ("step-s", link_arm(arm, "step_s"), L3),
            ("tokens-s", link_arm(arm, "tokens_per_s"), "{:,.0f}"),
            ("time-to-target-s", link_arm(arm, "time_to_target", 1), "{:.0f}"),
            ("time-to-target-step", link_arm(arm, "time_to_target", 0), "{:.0f}"),
            (
                "speedup",
                ratio(
                    link_arm("allreduce-adamw", "time_to_target", 1),
                    link_arm(arm, "time_to_target", 1),
                ),
                "{:.2f}",
            ),
        )
    },
    # the link model: bytes at the link's 50 Mb/s, plus 10 ms per message (two buckets' here)
    "stream.diloco.round-s": Figure(lambda s: 8 * s.mean(DILOCO, PEAK) / 50e6, "{:.1f}"),
    "stream.f4.fits-above-mbit": Figure(
        lambda s: 8 * s.mean(F4, PEAK) / (link_arm("streaming-f4", "step_s")(s) - 0.020) / 1e6,
        "{:.0f}",
    ),
    **{
        f"stream.link.{arm}.end-s": Figure(_end_s(arm), "{:.0f}")
        for arm in ("allreduce-adamw", "slowmo-ope-f4")
    },
    **extremes(
        "stream.link.diloco-arms.end-s",
        "{:.0f}",
        lambda s: [_end_s(a)(s) for a in DILOCO_ARMS],
    ),
    # outer
    **stats("outer.allreduce", f"{OUTER}/allreduce-adamw/final", names="seed1 mean sd"),
    **{
        k: v
        for arm in ("local-sgd-H16", "diloco-H16", "local-sgd-H64", "diloco-H64")
        for k, v in _outer(arm).items()
    },
    "outer.allreduce.mb": Figure(_mean_mb(f"{OUTER}/allreduce-adamw/final"), "{:.2f}"),
    **grid(
        "outer.diloco-h16.outer-lr", f"{OUTER}/diloco-H16/stage1", "0.3 0.5 0.7 1.0", "outer.lr"
    ),
    **grid(
        "outer.diloco-h64.outer-lr", f"{OUTER}/diloco-H64/stage1", "0.3 0.5 0.7 1.0", "outer.lr"
    ),
    **gaps(
        "outer.diloco-vs-local.h16",
        f"{OUTER}/local-sgd-H16/final",
        f"{OUTER}/diloco-H16/final",
        names="seed0 seed1 seed2",
    ),
    **gaps(
        "outer.diloco-vs-local.h64",
        f"{OUTER}/local-sgd-H64/final",
        f"{OUTER}/diloco-H64/final",
        names="seed0 seed1 seed2",
    ),
    **{
        f"outer.{arm}.h64-minus-h16": Figure(
            diff(mean(f"{OUTER}/{arm}-H64/final"), mean(f"{OUTER}/{arm}-H16/final")),
            "{:.2f}",
            minus=True,
        )
        for arm in ("local-sgd", "diloco")
    },
    # the H=64 runs ran on a slower host: their tokens/s against allreduce's, and the inverse
    **each(
        "outer.h64.tokens-s",
        "{:.2f}",
        vs_allreduce=_h64_speed,
        slower=lambda s: 1 / _h64_speed(s),
    ),
    **each(
        "outer.diloco-behind-local",
        "{:.2f}",
        h16=diff(mean(f"{OUTER}/diloco-H16/final"), mean(f"{OUTER}/local-sgd-H16/final")),
        h64=diff(mean(f"{OUTER}/diloco-H64/final"), mean(f"{OUTER}/local-sgd-H64/final")),
    ),
}


TABLES: dict[str, str] = {
    "stream.arms": table(
        "arm | outer lr (grid) | final eval/loss, 3 seeds | per seed | vs DiLoCo, per seed"
        " | mean MB/step | peak MB/step",
        "---|---|---:|---|---|---:|---:",
        [
            [
                label,
                grid_,
                mean_sd(f"stream.{arm}"),
                slots(f"stream.{arm}"),
                vs,
                *slot_cells(f"stream.{arm}", "mb mb" if arm == "allreduce" else "mb peak-mb"),
            ]
            for label, grid_, arm, vs in (
                ("`allreduce`", "–", "allreduce", ""),
                ("DiLoCo, F=1", "0.5 (0.3, 0.5, 0.7, 1.0)", "diloco", "0"),
                (
                    "streaming DiLoCo, F=4, float32",
                    "0.5 (0.3, 0.5, 0.7)",
                    "f4",
                    slots("stream.f4-vs-diloco"),
                ),
                (
                    "streaming DiLoCo, F=4, int8",
                    "0.5 (0.3, 0.5, 0.7)",
                    "f4-int8",
                    slots("stream.f4-int8-vs-diloco"),
                ),
                (
                    "streaming SlowMo over `one-peer-exp`, F=4",
                    "1.0 (0.5, 1.0, 1.5)",
                    "slowmo-f4",
                    "",
                ),
                (
                    "the same, SlowMo's own update scaled by the inner lr"
                    " (`outer.scale_by_inner_lr=true`)",
                    "1.0 (0.5, 1.0, 1.5)",
                    "slowmo-f4-scaled",
                    "",
                ),
            )
        ],
    ),
    "stream.link": table(
        "arm | s/step on the link | tokens/s on the link"
        " | time to {{stream.link.target}} (DiLoCo's final mean) | vs `allreduce`",
        "---|---:|---:|---:|---:",
        [
            [
                label,
                *slot_cells(f"stream.link.{arm}", "step-s tokens-s"),
                "{{"
                + f"stream.link.{arm}.time-to-target-s"
                + "}} s (step {{"
                + f"stream.link.{arm}.time-to-target-step"
                + "}})",
                "{{" + f"stream.link.{arm}.speedup" + "}}×",
            ]
            for label, arm in (
                ("`allreduce`", "allreduce-adamw"),
                ("DiLoCo, F=1", "diloco-H16"),
                ("streaming, F=4, float32", "streaming-f4"),
                ("streaming, F=4, int8", "streaming-f4-int8"),
                ("SlowMo over `one-peer-exp`, F=4", "slowmo-ope-f4"),
            )
        ],
    ),
    "outer.arms": table(
        "arm (4 workers) | seeds | final eval/loss | gap to allreduce"
        " | bytes per step and rank (mean / peak)",
        "---|---:|---:|---:|---:",
        [
            [
                "`allreduce`, AdamW 4e-3",
                "3",
                mean_sd("outer.allreduce"),
                "0",
                "{{outer.allreduce.mb}} MB / {{outer.allreduce.mb}} MB",
            ],
            *(
                [
                    label,
                    "3",
                    f"{mean_sd('outer.' + arm)} ({slots('outer.' + arm)})",
                    "{{" + f"outer.{arm}.vs-allreduce" + "}}",
                    "{{" + f"outer.{arm}.mb" + "}} MB / {{" + f"outer.{arm}.peak-mb" + "}} MB",
                ]
                for label, arm in (
                    ("`local-sgd` H=16", "local-sgd-h16"),
                    ("DiLoCo H=16, outer lr 0.5", "diloco-h16"),
                    ("`local-sgd` H=64", "local-sgd-h64"),
                    ("DiLoCo H=64, outer lr 0.5", "diloco-h64"),
                )
            ),
        ],
    ),
}
