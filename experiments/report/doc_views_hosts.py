"""The docs' tables of sharded replicas and elastic hosts, generated from their committed files.

- ``sharded-memory``: peak memory per rank of ``make bench-sharded``
  (``docs/results/sharded/bench.json``, one row per rank and arm);
- ``sharded-testbed``: gossip between sharded replicas against HSDP on the testbed
  (``docs/results/sharded/study.json``, one row per run);
- ``elastic``: one host killed and restarted under ``fault_tolerance=torchft``
  (``docs/results/elastic/*.json`` of ``experiments.bench.elastic_faults``, a column per file);
- ``elastic-compare``: the same kill under elastic gossip, today's restart from a
  checkpoint, torchft's DDP and DiLoCo (``docs/results/elastic/compare/*.json`` of
  ``experiments.bench.elastic_compare``, a row per method, a band over seeds);
- ``elastic-cost``: what membership costs a step, the elastic wrapper beside the
  wrapper on one testbed link (``docs/results/elastic/cost-*.json`` of
  ``experiments.bench.elastic_cost``, a row per rate).

The functions that read one figure (``peak_mb``, ``tokens_per_s``, ``elastic_runs`` ...) are
also the sources of the spans in :mod:`experiments.report.figures.hosts` and
:mod:`experiments.report.figures.elastic` and of the README's results at a glance, so that a
table, a sentence and the glance row read the same numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from experiments.report.doc_data import DataError, Source, md_table

SHARDED = "docs/results/sharded"
MEMORY = f"{SHARDED}/bench.json"
MEMORY_GLIBC = f"{SHARDED}/bench_glibc.json"
STUDY = f"{SHARDED}/study.json"
ELASTIC = "docs/results/elastic"
# the arms of the study, as its rows name them, and how the tables name them
STUDY_ARMS = ("ring", "one-peer-exp", "allreduce")
HSDP = "allreduce"


def _arm(row: dict[str, Any]) -> str:
    return str(row.get("arm", "unsharded" if row["shards"] == 1 else "gossip"))


def _ranks(src: Source, file: str, arm: str, shards: int) -> list[dict[str, Any]]:
    """The rows (one per rank) of ``arm`` with ``shards`` shards in a sharded-memory bench file.

    Files written before the bench had HSDP arms carry no ``arm``: their rows are the wrapper's
    (``unsharded`` with 1 shard, ``gossip`` with more)."""
    rows = [r for r in src.json(file)["rows"] if r["shards"] == shards and _arm(r) == arm]
    if not rows:
        raise DataError(file, f"no rows arm={arm} shards={shards}")
    return rows


def peak_mb(
    arm: str, shards: int, file: str = MEMORY, pick: Callable = statistics.mean
) -> Callable[[Source], float]:
    """``pick`` (mean, max) over the ranks of their peak resident MB."""
    return lambda s: float(pick(r["peak_mb"] for r in _ranks(s, file, arm, shards)))


def state_mb(arm: str, shards: int, file: str = MEMORY) -> Callable[[Source], float]:
    """The model state a rank holds (parameters, optimizer states, gossip buffer), in MiB."""
    keys = ("param_bytes", "optim_bytes", "comm_bytes")
    return lambda s: statistics.mean(
        sum(r[k] for k in keys) / 2**20 for r in _ranks(s, file, arm, shards)
    )


def params_m(s: Source, file: str = MEMORY) -> float:
    """The bench model's parameters, in millions."""
    return float(s.key(file, "rows.0.model_params")) / 1e6


_MEMORY_LABEL = {"unsharded": "unsharded wrapper", "gossip": "gossip between replicas"}


def sharded_memory(src: Source, file: str = MEMORY) -> str:
    """Per arm and shard count: peak MB per rank (mean and max over the ranks), the model state
    per rank, and the median step over the ranks, in the order of the shard count."""
    rows = src.json(file)["rows"]
    order = {"unsharded": 0, "gossip": 1, "hsdp": 2}
    keys = sorted({(r["shards"], _arm(r)) for r in rows}, key=lambda k: (k[0], order.get(k[1], 3)))
    out = []
    for shards, arm in keys:
        ranks = _ranks(src, file, arm, shards)
        replicas = ranks[0]["replicas"]
        label = _MEMORY_LABEL.get(arm, "HSDP")
        if arm == "hsdp" and replicas == 1:
            label = "HSDP (one replica: plain FSDP)"
        out.append(
            [
                label,
                f"{shards} x {replicas}",
                f"{peak_mb(arm, shards, file)(src):.1f} ({peak_mb(arm, shards, file, max)(src):.1f})",
                f"{state_mb(arm, shards, file)(src):.1f}",
                f"{statistics.median(r['step_s'] for r in ranks):.2f}",
            ]
        )
    header = ["arm", "shards x replicas", "peak MB per rank, mean (max)"]
    header += ["model state MB per rank (params + AdamW + gossip buffer)", "step s"]
    return md_table(header, ["---", "---", "---:", "---:", "---:"], out)


def _runs(src: Source, shape: str, arm: str, file: str = STUDY) -> list[dict[str, Any]]:
    runs = [r for r in src.json(file) if r["shape"] == shape and r["arm"] == arm]
    if not runs:
        raise DataError(file, f"no run shape={shape} arm={arm}")
    return runs


def study(
    shape: str, arm: str, key: str, pick: Callable = statistics.mean, file: str = STUDY
) -> Callable[[Source], float]:
    """``pick`` over the seeds of one arm's ``key`` in the testbed study (``study.json``)."""
    return lambda s: float(pick([float(r[key]) for r in _runs(s, shape, arm, file)]))


def tokens_per_s(shape: str, arm: str) -> Callable[[Source], float]:
    """Mean tokens/s over the seeds of one arm of the testbed study."""
    return study(shape, arm, "tokens_per_s")


def _band(values: list[float], fmt: str) -> str:
    if len(values) < 2:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


_STUDY_LABEL = {"allreduce": "HSDP (`allreduce`)"}


def sharded_testbed(src: Source, file: str = STUDY) -> str:
    """Per shape and arm: seeds, tokens, tokens/s (mean ± sd over the seeds) and its ratio to
    HSDP's, MB per host link and per rank per step, and the final eval loss."""
    out = []
    for shape in sorted({r["shape"] for r in src.json(file)}):
        hsdp = study(shape, HSDP, "tokens_per_s", file=file)(src)
        for arm in STUDY_ARMS:
            runs = _runs(src, shape, arm, file)
            tps = [float(r["tokens_per_s"]) for r in runs]
            comm = runs[0]["comm_bytes_per_step_per_rank"]
            out.append(
                [
                    shape,
                    _STUDY_LABEL.get(arm, f"gossip, `{arm}`"),
                    str(len(runs)),
                    f"{runs[0]['tokens']:,}",
                    _band(tps, "{:,.0f}"),
                    f"{statistics.mean(tps) / hsdp:.2f}x",
                    f"{statistics.mean(r['tx_bytes_per_host_per_step'] for r in runs) / 1e6:.2f}",
                    "-" if comm is None else f"{comm / 1e6:.2f}",
                    _band([float(r["eval_loss"]) for r in runs], "{:.3f}"),
                ]
            )
    header = ["hosts x shards", "arm", "seeds", "tokens", "tokens/s", "vs HSDP"]
    header += ["MB sent per host link per step", "wrapper's MB per rank per step"]
    header.append("final eval loss")
    return md_table(header, ["---", "---", "---:", *["---:"] * 6], out)


def elastic_run(name: str, part: str = "fault") -> Callable[[Source], dict[str, Any]]:
    """One part (``fault``, ``uninterrupted``) of a run of ``elastic_faults`` in ``ELASTIC``."""

    def value(s: Source) -> dict[str, Any]:
        rel = f"{ELASTIC}/{name}.json"
        got = s.key(rel, part)
        if not isinstance(got, dict):
            raise DataError(rel, f"'{part}' is not a run")
        return got

    return value


def elastic_field(name: str, key: str) -> Callable[[Source], float]:
    """A figure of the fault run ``name``: ``survivor_gap_s``, ``survivor_steps_lost``,
    ``rejoin_s``, or ``healed_to_step`` less ``kill_step`` (``healed_after``)."""

    def value(s: Source) -> float:
        if key == "healed_after":
            kill = float(s.key(f"{ELASTIC}/{name}.json", "args.kill_step"))
            return float(_joiner(elastic_run(name)(s), name)["healed_to_step"]) - kill
        return float(s.key(f"{ELASTIC}/{name}.json", f"fault.{key}"))

    return value


def _joiner(run: dict[str, Any], name: str) -> dict[str, Any]:
    """The restarted host's entry (the one host with a ``rejoin_s``)."""
    found = [h for h in run["hosts"].values() if "rejoin_s" in h]
    if len(found) != 1:
        raise DataError(f"{ELASTIC}/{name}.json", "not exactly one restarted host")
    return found[0]


def _rate(run: dict[str, Any]) -> str:
    """The hosts' mean throughput (samples/s of one host), ``–`` in runs from before it was kept."""
    rate = run.get("samples_per_s")
    return "–" if rate is None else f"{rate:,.0f}"


def _acc(run: dict[str, Any]) -> str:
    values = [h["eval/acc_local"] for h in run["hosts"].values()]
    lo, hi = f"{min(values):.4f}", f"{max(values):.4f}"
    return lo if lo == hi else f"{lo} to {hi}"


def elastic(src: Source, runs: str) -> str:
    """A column per run (``runs``: file names in ``ELASTIC`` without ``.json``): what the kill
    cost the survivors, the restarted host's way back, and the final accuracy of every host."""
    names = runs.split(",")
    cols = []
    for name in names:
        fault = elastic_run(name)(src)
        joiner = _joiner(fault, name)
        col = [
            f"{fault['survivor_gap_s']:.1f} s",
            str(fault["survivor_steps_lost"]),
            f"{fault['rejoin_s']:.1f} s",
            f"`{joiner['healed_from']}` / {joiner['healed_to_step']}",
            _acc(fault),
            _rate(fault),
        ]
        if "uninterrupted" in src.json(f"{ELASTIC}/{name}.json"):
            clean = elastic_run(name, "uninterrupted")(src)
            col += [_acc(clean), _rate(clean)]
        cols.append(col)
    labels = [
        "longest wait between two steps of a survivor",
        "steps a survivor lost",
        "seconds from the restart to the restarted host's first step",
        "it healed from (its neighbour) / at step",
        "`eval/acc_local` at the end, every host (with the fault)",
        "samples/s of a host, the hosts' mean (with the fault)",
        "`eval/acc_local` at the end, every host (uninterrupted)",
        "samples/s of a host, the hosts' mean (uninterrupted)",
    ]
    rows = [[label, *(c[i] if i < len(c) else "–" for c in cols)] for i, label in enumerate(labels)]
    if not any(len(c) == len(labels) for c in cols):
        del rows[-2:]
    topologies = [f"`{src.key(f'{ELASTIC}/{n}.json', 'args.topology')}`" for n in names]
    return md_table(["", *topologies], ["---", *["---:"] * len(names)], rows)


COMPARE = f"{ELASTIC}/compare"
COMPARE_LABEL = {
    "gossip-ring": "elastic gossip, `ring`",
    "gossip-one-peer-exp": "elastic gossip, `one-peer-exp`",
    "restart": "restart from a checkpoint (`fault_tolerance=none`)",
    "torchft-ddp": "torchft `DDP` (all-reduce)",
    "torchft-allreduce": "torchft Manager, `Manager.allreduce` of the gradients",
    "torchft-diloco": "torchft `DiLoCo`",
}


def compare_runs(
    src: Source, task: str, method: str, fault: bool, seeds: list[int]
) -> list[dict[str, Any]]:
    """The runs of ``method`` on ``task`` among ``seeds`` whose files exist (none: an error)."""
    kind = "fault" if fault else "clean"
    rels = [f"{COMPARE}/{task}-{method}-s{seed}-{kind}.json" for seed in seeds]
    found = [src.json(rel) for rel in rels if (src.root / rel).is_file()]
    if not found:
        raise DataError(rels[0], f"no {kind} run of {method} on {task} for seeds {seeds}")
    return found


def final_metric(run: dict[str, Any], key: str) -> float:
    """The mean of ``key`` (an ``eval/*`` value) over the hosts of one run."""
    values = [h[key] for h in run["hosts"].values() if h.get(key) is not None]
    if not values:
        raise DataError(COMPARE, f"a run of {run.get('method')} has no {key}")
    return statistics.mean(values)


def compare_value(
    task: str, method: str, key: str, seeds: str = "0", fault: bool = True
) -> Callable[[Source], float]:
    """The mean over seeds of one measure (``survivor_gap_s``, ``rejoin_s``, ``wall_s``, ...)."""
    picked = [int(x) for x in seeds.split(",")]

    def value(s: Source) -> float:
        runs = compare_runs(s, task, method, fault, picked)
        return statistics.mean(float(r[key]) for r in runs)

    return value


def _spread(values: list[float], fmt: str) -> str:
    """One value (or the same as written for every seed), or the mean and the range."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    if lo == hi:
        return lo
    return f"{fmt.format(statistics.mean(values))} ({lo} to {hi})"


def crashed(run: dict[str, Any]) -> bool:
    """Whether a survivor of a fault run did not finish (``restart``: the job did not)."""
    hosts = run["hosts"]
    survivors = [h for h in hosts.values() if "gap_s" in h] or list(hosts.values())
    return any(h.get("steps") != run["steps"] for h in survivors)


def elastic_compare(src: Source, task: str, methods: str, seeds: str, metric: str) -> str:
    """A row per method: the survivors' longest pause, the steps a survivor lost (``restart``:
    done again), the seconds until the restarted host took part, ``metric`` at the end (mean of
    the hosts; with the fault and uninterrupted, mean and range over the seeds found), and the
    wall time of both. Where the survivors of every fault run crashed, the row says so."""
    picked = [int(x) for x in seeds.split(",")]
    fmt = "{:.4f}" if "acc" in metric else "{:.3f}"
    rows = []
    for method in methods.split(","):
        fault = compare_runs(src, task, method, True, picked)
        clean = compare_runs(src, task, method, False, picked)

        def nums(runs: list[dict[str, Any]], key: str) -> list[float]:
            return [float(r[key]) for r in runs if r.get(key) is not None]

        clean_metric = _spread([final_metric(r, metric) for r in clean], fmt)
        clean_wall = _spread(nums(clean, "wall_s"), "{:.0f}")
        # samples/s of a host, where the runs kept it (train.py's; not the torchft clients)
        rates = nums(clean, "samples_per_s")
        clean_rate = _spread(rates, "{:,.0f}") if len(rates) == len(clean) else "–"
        if all(crashed(r) for r in fault):
            at = sorted(
                {h["step_at_kill"] for r in fault for h in r["hosts"].values() if "gap_s" in h}
            )
            rows.append(
                [
                    COMPARE_LABEL.get(method, method),
                    f"{len(fault)} / {len(clean)}",
                    "crashed",
                    f"all after step {', '.join(str(a) for a in at)}",
                    "–",
                    "–",
                    clean_metric,
                    f"– / {clean_wall}",
                    clean_rate,
                ]
            )
            continue
        # where some crashed, the measures are those of the runs that did not
        down = sum(crashed(r) for r in fault)
        fault_runs = f"{len(fault)} ({down} crashed)" if down else f"{len(fault)}"
        fault = [r for r in fault if not crashed(r)]
        rejoin = nums(fault, "rejoin_s")
        rows.append(
            [
                COMPARE_LABEL.get(method, method),
                f"{fault_runs} / {len(clean)}",
                _spread(nums(fault, "survivor_gap_s"), "{:.1f}"),
                _spread(nums(fault, "survivor_steps_lost"), "{:.0f}"),
                _spread(rejoin, "{:.1f}") if len(rejoin) == len(fault) else "–",
                _spread([final_metric(r, metric) for r in fault], fmt),
                clean_metric,
                f"{_spread(nums(fault, 'wall_s'), '{:.0f}')} / {clean_wall}",
                clean_rate,
            ]
        )
    header = [
        "method",
        "seeds (fault / clean)",
        "survivors' longest pause (s)",
        "steps a survivor lost",
        "restart to taking part (s)",
        f"`{metric}` with the fault",
        f"`{metric}` uninterrupted",
        "wall time, fault / clean (s)",
        "samples/s of a host, uninterrupted",
    ]
    return md_table(header, ["---", *["---:"] * 8], rows)


COST = f"{ELASTIC}/cost-{{}}.json"


def cost_value(rate: str, key: str) -> Callable[[Source], float]:
    """A figure of the membership-cost bench at ``rate``: ``ratio``, ``wrapper_step_s``, ..."""
    return lambda s: float(s.key(COST.format(rate), key))


def cost_steps(
    rate: str, arm: str, pick: Callable[[list[float]], float]
) -> Callable[[Source], float]:
    """``pick`` (median, max) of each host's measured steps of ``arm`` at ``rate``, the slowest
    host's per repetition, and the median over the repetitions (seconds)."""

    def value(s: Source) -> float:
        run = s.json(COST.format(rate))
        warmup = int(run["args"]["warmup"])
        reps = sorted({r["rep"] for r in run["records"]})
        per_rep = [
            max(
                pick(r["step_s"][warmup:])
                for r in run["records"]
                if (r["rep"], r["arm"]) == (rep, arm)
            )
            for rep in reps
        ]
        return float(statistics.median(per_rep))

    return value


def elastic_cost(src: Source, rates: str) -> str:
    """A row per link rate: the model, the quorum interval, each arm's step time and the ratio
    (median of the repetitions, and their range)."""
    rows = []
    for rate in rates.split(","):
        run = src.json(COST.format(rate))
        args, ratios = run["args"], [r["ratio"] for r in run["reps"]]
        rows.append(
            [
                rate,
                f"{args['hosts']} hosts, {float(args['mb']):g} MiB, quorum every {args['quorum_every']}",
                f"{run['wrapper_step_s'] * 1e3:.1f}",
                f"{run['elastic_step_s'] * 1e3:.1f}",
                f"**{run['ratio']:.2f}x** ({min(ratios):.2f} to {max(ratios):.2f})",
                f"{len(ratios)}",
            ]
        )
    header = ["link", "job", "wrapper, ms a step", "elastic, ms a step", "ratio", "repetitions"]
    return md_table(header, ["---", "---", "---:", "---:", "---:", "---:"], rows)


_KILLED_IN_QUORUM = ("testbed-ring-kill-at-quorum", "testbed-one-peer-exp-kill-at-quorum")
# the testbed's runs, of the current path (the loopback ones are of ElasticGossip)
_KILLED_BETWEEN = ("testbed-ring-kill-mid-interval",)


def elastic_worst(key: str, in_quorum: bool | None = None) -> Callable[[Source], float]:
    """The largest ``key`` of the fault runs: those whose kill fell inside a quorum
    (``in_quorum``), between quorums (not ``in_quorum``), or all (None)."""
    if in_quorum is None:
        names = _KILLED_IN_QUORUM + _KILLED_BETWEEN
    else:
        names = _KILLED_IN_QUORUM if in_quorum else _KILLED_BETWEEN
    return lambda s: max(elastic_field(n, key)(s) for n in names)


def glance_rows(src: Source) -> list[list[str]]:
    """The README's results-at-a-glance rows of sharded replicas and elastic hosts."""
    gossip, hsdp = (tokens_per_s("2x2", a)(src) for a in ("ring", HSDP))
    loss_gossip, loss_hsdp = (study("2x2", a, "eval_loss")(src) for a in ("ring", HSDP))
    one, two = peak_mb("unsharded", 1)(src), peak_mb("gossip", 2)(src)
    lost = elastic_worst("survivor_steps_lost")(src)
    between = elastic_worst("survivor_gap_s", False)(src)
    inside = elastic_worst("survivor_gap_s", True)(src)
    runs = _KILLED_IN_QUORUM + _KILLED_BETWEEN
    sizes = {src.key(f"{ELASTIC}/{n}.json", "args.hosts") for n in runs}
    if len(sizes) != 1:
        raise DataError(ELASTIC, f"the fault runs' host counts differ: {sorted(sizes)}")
    hosts = sizes.pop()
    return [
        [
            "sharded replicas (FSDP2 inside, gossip between)",
            f"testbed, 2 hosts x 2 shards, 100 Mb/s, tiny GPT: `ring` {gossip:,.0f} tokens/s, "
            f"HSDP {hsdp:,.0f}: **{gossip / hsdp:.2f}x**, but HSDP ends lower at equal tokens "
            f"({loss_hsdp:.2f} against {loss_gossip:.2f} nats, untuned); a {params_m(src):.1f}M GPT's peak "
            f"memory per rank {two:.0f} MB with 2 shards against {one:.0f} MB unsharded",
            "[sharded](docs/results/sharded/README.md)",
        ],
        [
            "a host killed and restarted (`fault_tolerance=torchft`)",
            f"{hosts} hosts, {len(runs)} runs: the survivors lost **{lost:.0f}** steps; their "
            f"longest pause "
            f"{between:.1f} s for a kill between quorums, {inside:.1f} s (`timeout_s`) inside one",
            "[elastic](docs/results/elastic/README.md)",
        ],
    ]


VIEWS: dict[str, Callable[..., str]] = {
    "sharded-memory": sharded_memory,
    "sharded-testbed": sharded_testbed,
    "elastic": elastic,
    "elastic-compare": elastic_compare,
    "elastic-cost": elastic_cost,
}
