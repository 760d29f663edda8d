"""The tables that the docs generate from committed data, one function per kind of table.

Each view takes a :class:`~experiments.report.doc_data.Source` and the marker's arguments (all
strings) and returns the markdown between a page's ``<!-- data: VIEW ... -->`` and
``<!-- /data -->``. ``python -m experiments.report.check_docs --write`` puts it there; the check
compares it with what is written. :data:`VIEWS` maps the marker's name to the function, this
module's and those of :mod:`~experiments.report.doc_views_hosts` (sharded replicas, elastic
hosts), :mod:`~experiments.report.doc_views_packed` (packed workers against processes),
:mod:`~experiments.report.doc_views_wire` (pair exchange, emulator, simulator) and
:mod:`~experiments.report.doc_views_workers` (the optimizer gap at 4 to 64 workers).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from experiments.report import doc_views_hosts as hosts
from experiments.report import doc_views_packed as packed
from experiments.report import doc_views_wire as wire
from experiments.report import doc_views_workers as workers
from experiments.report.doc_data import DataError, Source, md_table
from experiments.report.doc_views_wire import grid, rate_label

WIRE = "docs/results/network/table.json"
HIER = "docs/results/hierarchical/table.json"
LM = "docs/results/lm/runs"
GAP = "docs/results/lm_gap/runs"
COMPRESSION = "docs/results/compression/runs"
UPSTREAM = "docs/results/bench-upstream/gpt.json"


def lr_label(value: str) -> str:
    """An lr as the docs write it: ``0.004`` -> ``4e-3``."""
    mantissa, _, exponent = f"{float(value):.0e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def _arm_present(src: Source, rel: str, arm: str) -> None:
    rows = src.json(rel)
    if not any(r.get("arm") == arm for r in rows):
        raise DataError(rel, f"no arm '{arm}'")


def _sps(src: Source, rel: str, shape: str, rate: str, arm: str) -> float | None:
    """Samples/s of a cell; None where this arm was not run at this rate (it was elsewhere)."""
    try:
        return src.wire(rel, shape, rate, arm)
    except DataError as err:
        if not err.why.startswith("no row"):
            raise
        _arm_present(src, rel, arm)
        return None


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _ratio(a: float | None, b: float | None, bold: bool = False) -> str:
    if a is None or b is None:
        return "–"
    text = f"{a / b:.2f}x"
    return f"**{text}**" if bold else text


def wire_rates(
    src: Source,
    file: str = WIRE,
    shape: str = "4x1",
    rates: str = "5mbit,10mbit,100mbit,1gbit",
    arms: str = "allreduce,ring",
    ratio: str = "ring/allreduce",
    emulated: str = "yes",
) -> str:
    """Samples/s at one shape, a row per rate, a column per arm, then ``ratio`` measured and
    emulated (the emulator's step times, ``network=custom`` at the same rate)."""
    arm_list = arms.split(",")
    top, _, bottom = ratio.partition("/")
    header = ["link", *(f"`{a}`" for a in arm_list), f"`{top}` / `{bottom}`"]
    if emulated == "yes":
        header.append("the same, emulated")
    rows = []
    for rate in rates.split(","):
        src.wire(file, shape, rate, bottom)  # the rate must be in the file
        row = [rate_label(rate), *(_n(_sps(src, file, shape, rate, a)) for a in arm_list)]
        row.append(
            _ratio(src.wire(file, shape, rate, top), src.wire(file, shape, rate, bottom), True)
        )
        if emulated == "yes":
            em_top = src.wire(file, shape, rate, top, "emulated_step_s")
            em_bottom = src.wire(file, shape, rate, bottom, "emulated_step_s")
            row.append(_ratio(em_bottom, em_top))
        rows.append(row)
    return md_table(header, ["---", *["---:"] * (len(header) - 1)], rows)


def wire_shapes(src: Source, file: str = HIER, ratios: str = "", **cells: str) -> str:
    """Samples/s of several shapes (``shapes``, ``rates``, ``arms``:
    :func:`~experiments.report.doc_views_wire.grid`), a row per shape and rate, a column per arm
    and per ratio of ``ratios`` (``a/b,...``)."""
    shapes, rates, arms = grid(cells)
    ratio_list = [r.split("/") for r in ratios.split(",") if r]
    header = ["shape", "link", *(f"`{a}`" for a in arms)]
    header += [f"`{a}` / `{b}`" for a, b in ratio_list]
    rows = []
    for shape in shapes:
        hosts, _, procs = shape.partition("x")
        for rate in rates:
            row = [f"{hosts} hosts x {procs}", rate_label(rate)]
            row += [_n(src.wire(file, shape, rate, a)) for a in arms]
            row += [
                _ratio(src.wire(file, shape, rate, a), src.wire(file, shape, rate, b))
                for a, b in ratio_list
            ]
            rows.append(row)
    return md_table(header, ["---", "---", *["---:"] * (len(header) - 2)], rows)


def _ms(src: Source, runs: str) -> str:
    values = src.seeds(runs)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


_LM_ROWS = [
    ("`allreduce`, AdamW (betas 0.9/0.95)", "allreduce-adamw", True),
    ("`complete`, AdamW", "complete-adamw-lr0.004", True),
    ("`one-peer-exp`, AdamW", "one-peer-exp-adamw-lr0.004", True),
    ("`complete`, AdamW, the 1-seed pick", "complete-adamw", False),
    ("`one-peer-exp`, AdamW, the 1-seed pick", "one-peer-exp-adamw", False),
    ("`one-peer-exp`, AccumAdamW (betas 0.9/0.98)", "one-peer-exp-accum", True),
]


def lm_tuned(src: Source, runs: str = LM, rows: str = "all") -> str:
    """The tuned ``lm_small`` arms: lr (from the runs' overrides), final eval/loss over the
    seeds, and the gap to ``allreduce``'s mean."""
    base = statistics.mean(src.seeds(f"{runs}/allreduce-adamw/final"))
    out = []
    for label, name, headline in _LM_ROWS:
        if rows != "all" and not headline:
            continue
        final = f"{runs}/{name}/final"
        if "accum" in name:
            label += f", `accum_iter` {src.override(final, 'optim.accum_iter')} (its grid's best)"
        gap = statistics.mean(src.seeds(final)) - base
        gap_text = "0" if name == "allreduce-adamw" else f"{gap:+.3f}"
        lr = lr_label(src.override(final, "optim.lr"))
        out.append([label, lr, _ms(src, final), gap_text])
    header = [
        "arm (4 workers, 3 seeds)",
        "`optim.lr`",
        "final eval/loss (nats)",
        "gap to allreduce",
    ]
    return md_table(header, ["---", "---:", "---:", "---:"], out)


def outer_h(src: Source, runs: str = "docs/results/outer/lm_small/runs") -> str:
    """DiLoCo against plain ``local-sgd`` at H=16 and H=64, mean ± sd over seeds."""

    def cell(name: str) -> str:
        values = src.seeds(f"{runs}/{name}/final")
        return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"

    rows = [
        ["DiLoCo", cell("diloco-H16"), cell("diloco-H64")],
        ["plain `local-sgd`, same H and bytes", cell("local-sgd-H16"), cell("local-sgd-H64")],
    ]
    return md_table(["arm", "H=16", "H=64"], ["---", "---:", "---:"], rows)


def step_s(src: Source, file: str, model: str, procs: int, impl: str) -> float:
    """The median step (s) of ``impl`` for ``model`` on ``procs`` processes in a bench JSON."""
    for i, config in enumerate(src.json(file)["configs"]):
        if config["model"] == model and config["procs"] == procs:
            for j, row in enumerate(config["rows"]):
                if row["impl"] == impl:
                    return float(src.key(file, f"configs.{i}.rows.{j}.median_step_s"))
    raise DataError(file, f"no row model={model} procs={procs} impl={impl}")


_MODEL_LABEL = {"mlp": "mlp ({:.1f}M, SGD)", "gpt": "gpt ({:.1f}M, the paper's GPT-2 recipe)"}


def upstream(src: Source, file: str = UPSTREAM) -> str:
    """Median step beside decent-dp 0.2.3 and torch DDP, from ``make bench-upstream``'s JSON."""
    rows = []
    for config in src.json(file)["configs"]:
        model, procs = config["model"], config["procs"]
        ours, old, ddp = (
            step_s(src, file, model, procs, i) for i in ("ours", "0.2.3", "torch-ddp")
        )
        label = _MODEL_LABEL.get(model, "{}").format(config["rows"][0]["params_m"])
        rows.append(
            [label, str(procs), f"{ours * 1e3:.1f}", f"{old * 1e3:.1f}", f"{ddp * 1e3:.1f}"]
            + [f"{ours / old:.2f}", f"{ours / ddp:.2f}"]
        )
    header = ["model", "procs", "ours (ms)", "0.2.3 (ms)", "torch DDP (ms)", "ours / 0.2.3"]
    header.append("ours / torch DDP")
    return md_table(header, ["---", *["---:"] * 6], rows)


UPSTREAM_RUN = "docs/results/bench-upstream/results.json"
_PROFILE_ROWS = [
    ("compute (forward, backward)", "compute"),
    ("gradient accumulation", "grad_accumulate"),
    ("mix (mixing passes, launch copy)", "mix"),
    ("optimizer", "optimizer"),
    ("wait for gossip / all-reduce", "wait"),
    ("zeroing", "zero"),
    ("launch", "launch"),
    ("Python and other", "python_other"),
    ("CPU, main thread", "cpu_main_thread"),
    ("CPU, other threads (gloo)", "cpu_other_threads"),
]
_PROFILE_IMPLS = {"before": "before", "ours": "ours", "0.2.3": "0.2.3", "torch-ddp": "torch DDP"}


def profile_ms(src: Source, file: str, procs: int, impl: str, key: str) -> float:
    """A category of ``make bench-upstream --profile`` (ms per step, mean over ranks)."""
    for config in src.json(file)["configs"]:
        if config["procs"] == procs:
            # an implementation's name may hold dots (0.2.3): no dotted key path
            value = config.get("profile", {}).get(impl, {}).get(key)
            if value is None:
                raise DataError(file, f"no profile {impl} {key} at procs={procs}")
            return float(value)
    raise DataError(file, f"no config procs={procs}")


def profile(src: Source, file: str = UPSTREAM_RUN, procs: str = "4") -> str:
    """Where a step goes: the profiler's ms per step of each category, a column per
    implementation, then the minor page faults per step of the timed rounds."""
    n = int(procs)
    rows = []
    for label, key in _PROFILE_ROWS:
        row = [label]
        for impl in _PROFILE_IMPLS:
            value = profile_ms(src, file, n, impl, key)
            # torch DDP waits for its all-reduce inside its own hooks, which the profile counts
            # under Python and other: its wait is not a category of its own
            if key == "wait" and impl == "torch-ddp" and value == 0:
                row.append("in Python/other")
            else:
                row.append(f"{value:.1f}")
        rows.append(row)
    config = next(c for c in src.json(file)["configs"] if c["procs"] == n)
    faults = {r["impl"]: r["faults_per_step"] for r in config["rows"]}
    rows.append(["minor page faults per step", *(f"{faults[i]:,.0f}" for i in _PROFILE_IMPLS)])
    header = ["", *_PROFILE_IMPLS.values()]
    return md_table(header, ["---", *["---:"] * len(_PROFILE_IMPLS)], rows)


def _acc(src: Source, topology: str, compression: str) -> float:
    return src.mean(f"{COMPRESSION}/{topology}_{compression}_seed*", "eval/acc")


def glance(src: Source) -> str:
    """The README's results at a glance: one row per headline, each linking to its page."""
    r5 = [src.wire(WIRE, "4x1", "5mbit", a) for a in ("ring", "allreduce")]
    none_b = src.mean(f"{COMPRESSION}/ring_none_seed*", "comm/bytes_per_step")
    int8_b = src.mean(f"{COMPRESSION}/ring_int8_seed*", "comm/bytes_per_step")
    acc = {(t, c): _acc(src, t, c) for t in ("ring", "one-peer-exp") for c in ("int8", "none")}
    h = {
        a: src.wire(HIER, "4x2", "10mbit", a) for a in ("hierarchical", "allreduce", "one-peer-exp")
    }
    base32 = src.mean(f"{GAP}/allreduce-adamw/final")
    gap32 = src.mean(f"{GAP}/complete-adamw-lr0.004/final") - base32
    gap8 = src.paired_gap(f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final")
    steps = {
        (m, p): step_s(src, UPSTREAM, m, p, "ours") / step_s(src, UPSTREAM, m, p, "0.2.3")
        for m, p in (("mlp", 2), ("mlp", 4), ("gpt", 2), ("gpt", 4))
    }
    rows = [
        [
            "gossip against all-reduce on a capped wire",
            f"4 hosts x 1, 5 Mb/s, digits: `ring` {r5[0]:,.0f} samples/s, `allreduce` "
            f"{r5[1]:,.0f}: **{r5[0] / r5[1]:.2f}x**",
            "[network](docs/results/network/README.md)",
        ],
        [
            "`int8` compressed gossip",
            f"**{int8_b / none_b:.3f}x** the bytes; final accuracy `ring` "
            f"{acc['ring', 'int8']:.4f} (exact {acc['ring', 'none']:.4f}), `one-peer-exp` "
            f"{acc['one-peer-exp', 'int8']:.4f} ({acc['one-peer-exp', 'none']:.4f}), 3 seeds",
            "[compression](docs/results/compression/README.md)",
        ],
        [
            "`hierarchical` on hosts of 2",
            f"4 hosts x 2, 10 Mb/s: {h['hierarchical']:,.0f} samples/s, "
            f"**{h['hierarchical'] / h['allreduce']:.2f}x** `allreduce`, "
            f"{h['hierarchical'] / h['one-peer-exp']:.2f}x flat `one-peer-exp`",
            "[hierarchical](docs/results/hierarchical/README.md)",
        ],
        [
            "the gap to `allreduce`, tiny GPT, each arm tuned",
            f"`complete` (AdamW) ends **{gap32:+.3f}** nats behind at 32 windows per worker; "
            f"{statistics.mean(gap8):+.3f} ± {statistics.stdev(gap8):.3f} at 8 (3 seeds)",
            "[lm_gap](docs/results/lm_gap/README.md)",
        ],
        [
            "step time beside decent-dp 0.2.3 (CPU)",
            f"ours / 0.2.3: mlp **{steps['mlp', 2]:.2f}** and {steps['mlp', 4]:.2f} "
            f"(2 and 4 procs), gpt {steps['gpt', 2]:.2f} and {steps['gpt', 4]:.2f}",
            "[performance](docs/performance.md#side-by-side-with-decent-dp-023-make-bench-upstream)",
        ],
        *hosts.glance_rows(src),
        workers.glance_row(src),
    ]
    return md_table(["result", "measured", "page"], ["---", "---", "---"], rows)


_TOPOLOGY_LABEL = {"base-k": "base-k (k=1)", "local-sgd": "local-sgd (H=8)"}


def by_topology(src: Source, runs: str = "docs/results/lm_quick/runs") -> str:
    """Runs of several topologies in one folder (one run per folder, its topology in its
    ``summary.json``), grouped by topology: final eval/loss over seeds, the gap to
    ``allreduce``, tokens/s and its ratio to ``allreduce``'s, best loss first."""
    groups: dict[str, list[dict]] = {}
    for name in sorted(p.parent.name for p in (src.root / runs).glob("*/summary.json")):
        summary = src.json(f"{runs}/{name}/summary.json")
        groups.setdefault(summary["topology"], []).append(summary)
    src.read[:] = [runs]
    if "allreduce" not in groups:
        raise DataError(runs, "no allreduce run")

    def stat(topology: str, key: str) -> list[float]:
        return [float(r[key]) for r in groups[topology]]

    base = statistics.mean(stat("allreduce", "eval/loss"))
    base_tps = statistics.mean(stat("allreduce", "perf/tokens_per_s"))
    order = sorted(groups, key=lambda t: (t != "allreduce", statistics.mean(stat(t, "eval/loss"))))
    rows = []
    for topology in order:
        loss, tps = (
            stat(topology, "eval/loss"),
            statistics.mean(stat(topology, "perf/tokens_per_s")),
        )
        gap = statistics.mean(loss) - base
        rows.append(
            [
                _TOPOLOGY_LABEL.get(topology, topology),
                f"{statistics.mean(loss):.3f} ± {statistics.stdev(loss):.3f}",
                "0" if topology == "allreduce" else f"{gap:+.3f}",
                f"{tps:,.0f}",
                f"{tps / base_tps:.2f}x",
            ]
        )
    header = ["topology", "final eval/loss (nats)", "gap to allreduce", "tokens/s (4 workers)"]
    header.append("vs allreduce")
    return md_table(header, ["---", "---:", "---:", "---:", "---:"], rows)


def choose(src: Source, file: str = "docs/results/cluster/choose_2x8_10gbit_gpt2_124m.json") -> str:
    """The chooser's ranking (``python -m experiments.network.choose --json``) and its pick."""
    data = src.json(file)
    pick = src.key(file, "pick")
    rows = []
    for row in data["rows"]:
        if row["topology"] == pick:
            note = "**pick**"
        elif not row.get("candidate", True):
            note = "listed, not a candidate (--topologies)"
        else:
            note = row.get("reason") or ""
        rows.append(
            [
                str(row["rank"]),
                row["topology"],
                f"{row['step_s']:.3f} s",
                str(row["period"]),
                f"{row['rate_per_step']:.4f}",
                f"{row['host_link_bytes'] / 1e6:,.2f}",
                note,
            ]
        )
    header = ["rank", "topology", "step, predicted", "period", "consensus rate per step"]
    header += ["MB per host link per step", None]
    table = md_table(header, ["---:", "---", "---:", "---:", "---:", "---:", "---"], rows)
    return f"{table}\n\n> pick: {src.key(file, 'why')}"


def bench(src: Source, file: str = "docs/results/bench.json") -> str:
    """``make bench``'s rows: median step, its ratio to torch DDP and to ``local``, the wrapper's
    timers and its extra memory, in the file's order."""
    rows = src.json(file)

    def base(row: dict, variant: str) -> float:
        for other in rows:
            if (other["model"], other["world_size"], other["variant"]) == (
                row["model"],
                row["world_size"],
                variant,
            ):
                return float(other["median_step_s"])
        raise DataError(
            file, f"no row model={row['model']} world_size={row['world_size']} {variant}"
        )

    def ms(row: dict, key: str) -> str:
        return "" if row.get(key) is None else f"{row[key] * 1e3:.1f}"

    out = []
    for row in rows:
        step = float(row["median_step_s"])
        mem = row.get("extra_memory_x_params")
        out.append(
            [
                f"{row['model']} ({row['params_m']:.1f}M)",
                str(row["world_size"]),
                row["variant"],
                f"{step * 1e3:.1f}",
                f"{step / base(row, 'torch-ddp'):.2f}",
                f"{step / base(row, 'local'):.2f}",
                ms(row, "wait_s_per_step"),
                ms(row, "mix_s_per_step"),
                ms(row, "optim_s_per_step"),
                "" if mem is None else f"{mem:.2f}",
            ]
        )
    header = ["model", "procs", "variant", "median step (ms)", "vs torch DDP", "vs local"]
    header += ["wait (ms)", "mix (ms)", "optim (ms)", "extra mem (x params)"]
    return md_table(header, ["---", "---:", "---", *["---:"] * 7], out)


def mutate(src: Source, out: str = "docs/results/mutate") -> str:
    """``make mutate``'s summaries, one row per module (``docs/testing.md``)."""
    files = sorted((src.root / out).glob("*.json"))
    if not files:
        raise DataError(out, "no summary (*.json)")
    rows = []
    for path in files:
        s = src.json(f"{out}/{path.name}")
        c = s["counts"]
        tests = ", ".join(f"`{Path(t).name}`" for t in s["tests"])
        rows.append(
            [f"`{s['module']}`", str(s["mutants"])]
            + [str(c[k]) for k in ("killed", "survived", "timeout", "incompetent", "skipped")]
            + [tests, str(s["baseline_s"])]
        )
    header = ["module", "mutants", "killed", "survived", "timeout", "incompetent", "skipped"]
    header += ["tests", "s per run"]
    return md_table(header, ["---", *["---:"] * 6, "---", "---:"], rows)


VIEWS: dict[str, Callable[..., str]] = {
    "bench": bench,
    "choose": choose,
    "by-topology": by_topology,
    "wire-rates": wire_rates,
    "wire-shapes": wire_shapes,
    "lm-tuned": lm_tuned,
    "outer-h": outer_h,
    "upstream": upstream,
    "glance": glance,
    "profile": profile,
    "mutate": mutate,
    **hosts.VIEWS,
    **packed.VIEWS,
    **wire.VIEWS,
    **workers.VIEWS,
}
