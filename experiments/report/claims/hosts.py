"""Claims of the elastic hosts' results pages (see :mod:`experiments.report.claims`), and the
readers of the fault runs that ``docs/recovery.md``'s figures share with them
(:mod:`experiments.report.figures.hosts`). The sources are the views' own readers
(:mod:`experiments.report.doc_views_hosts`), so that a sentence and its table agree."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from experiments.report.claims.base import F0, Claim, Fn, V, claim
from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_hosts import (
    COMPARE,
    compare_runs,
    cost_steps,
    cost_value,
    crashed,
    elastic_field,
    elastic_worst,
    final_metric,
)

ELASTIC_PAGE = "docs/results/elastic/README.md"
COMPARE_PAGE = "docs/results/elastic/compare/README.md"
LOOPBACK = ("loopback-ring", "loopback-one-peer-exp")
F1 = "{:.1f}"


def _cost_ms(rate: str, arm: str, pick: Callable[[list[float]], float]) -> Fn:
    """``pick`` (median, max) of an arm's steps in the membership-cost bench at ``rate``, in ms."""
    fn = cost_steps(rate, arm, pick)
    return lambda s: fn(s) * 1e3


def _rejoin(pick: Callable, names: tuple[str, ...]) -> Fn:
    """``pick`` over the fault runs ``names`` of the restarted host's way back (s)."""
    return lambda s: pick(elastic_field(n, "rejoin_s")(s) for n in names)


def _none_lost(s: Source) -> str:
    """``no`` where no survivor of any fault run lost a step, else the most any lost."""
    lost = elastic_worst("survivor_steps_lost")(s)
    return "no" if lost == 0 else f"{lost:.0f}"


SEEDS = [0, 1, 2]


def _cmp(
    method: str, key: str, pick: Callable, seeds: list[int] = SEEDS, task: str = "digits"
) -> Fn:
    """``pick`` (min, max) over the fault runs of ``method`` of one measure."""
    return lambda s: pick(float(r[key]) for r in compare_runs(s, task, method, True, seeds))


def _one_value(method: str, key: str) -> Fn:
    """A measure that is the same in every digits fault run of ``method`` (else an error)."""

    def value(s: Source) -> float:
        values = {float(r[key]) for r in compare_runs(s, "digits", method, True, SEEDS)}
        if len(values) != 1:
            raise DataError(COMPARE, f"{method}'s {key} differs between seeds: {sorted(values)}")
        return values.pop()

    return value


def _gossip_runs(s: Source) -> list[dict]:
    """The digits fault runs of elastic gossip, ``ring`` and ``one-peer-exp``, every seed."""
    runs = compare_runs(s, "digits", "gossip-ring", True, SEEDS)
    return runs + compare_runs(s, "digits", "gossip-one-peer-exp", True, SEEDS)


def _in_quorum(run: dict) -> bool:
    """Whether the kill fell inside a quorum: a survivor waited ``timeout_s`` (above 10 s)."""
    return float(run["survivor_gap_s"]) > 10


def _between(key: str, pick: Callable) -> Fn:
    """``pick`` of a measure over the elastic gossip runs whose kill fell between quorums."""

    def value(s: Source) -> float:
        runs = [r for r in _gossip_runs(s) if not _in_quorum(r)]
        if any(r["survivor_steps_lost"] for r in runs):
            raise DataError(COMPARE, "a gossip run with its kill between quorums lost a step")
        return pick(float(r[key]) for r in runs)

    return value


def _gossip_count(in_quorum: bool | None) -> Fn:
    """How many gossip fault runs had their kill inside a quorum, between, or all (None)."""
    return lambda s: float(
        sum(in_quorum is None or _in_quorum(r) == in_quorum for r in _gossip_runs(s))
    )


def _inside_gap(s: Source) -> float:
    """The survivors' pause of the gossip runs whose kill fell inside a quorum (one value)."""
    gaps = {round(float(r["survivor_gap_s"])) for r in _gossip_runs(s) if _in_quorum(r)}
    if len(gaps) != 1:
        raise DataError(COMPARE, f"the in-quorum pauses differ: {sorted(gaps)}")
    return float(gaps.pop())


def _restart_extra(pick: Callable) -> Fn:
    """``pick`` over the seeds of the restarted job's wall time less the uninterrupted one's."""

    def value(s: Source) -> float:
        out = []
        for seed in SEEDS:
            (fault,) = compare_runs(s, "digits", "restart", True, [seed])
            (clean,) = compare_runs(s, "digits", "restart", False, [seed])
            out.append(float(fault["wall_s"]) - float(clean["wall_s"]))
        return pick(out)

    return value


def _restart_resumed(s: Source) -> float:
    steps = {r["resumed_from_step"] for r in compare_runs(s, "digits", "restart", True, SEEDS)}
    if len(steps) != 1:
        raise DataError(COMPARE, f"the restarts resumed from different steps: {sorted(steps)}")
    return float(steps.pop())


def _load(pick: Callable) -> Fn:
    """``pick`` over every comparison run's 1-minute load average, at its start and its end."""

    def value(s: Source) -> float:
        files = sorted((s.root / COMPARE).glob("*.json"))
        if not files:
            raise DataError(COMPARE, "no runs")
        loads = [x for f in files for x in s.json(f"{COMPARE}/{f.name}")["load_avg_1m"]]
        return pick(loads)

    return value


_DIGITS_FINISHED = (
    "gossip-ring",
    "gossip-one-peer-exp",
    "restart",
    "torchft-allreduce",
    "torchft-diloco",
)
_SAID = {
    "torchft-diloco": "torchft's DiLoCo",
    "gossip-one-peer-exp": "elastic gossip's `one-peer-exp`",
    "gossip-ring": "elastic gossip's `ring`",
}


def _below_band(s: Source) -> str:
    """The methods whose fault runs' mean metric is below their uninterrupted seeds' range."""
    below = []
    for method in _DIGITS_FINISHED:
        fault = [
            final_metric(r, "eval/acc_local")
            for r in compare_runs(s, "digits", method, True, SEEDS)
        ]
        clean = [
            final_metric(r, "eval/acc_local")
            for r in compare_runs(s, "digits", method, False, SEEDS)
        ]
        if sum(fault) / len(fault) < min(clean):
            below.append(_SAID.get(method, method))
    return ", ".join(below) or "none"


def _gpt(method: str, key: str, pick: Callable) -> Fn:
    """``pick`` over the tiny GPT's fault runs of ``method`` of one measure."""
    return _cmp(method, key, pick, task="gpt")


def _gpt_gossip_runs(s: Source, in_quorum: bool | None = None) -> list[dict]:
    """The tiny GPT's gossip fault runs, ``ring`` and ``one-peer-exp``: those whose kill fell
    inside a quorum (``in_quorum``), between quorums (not), or all (None)."""
    runs = compare_runs(s, "gpt", "gossip-ring", True, SEEDS)
    runs += compare_runs(s, "gpt", "gossip-one-peer-exp", True, SEEDS)
    return [r for r in runs if in_quorum is None or _in_quorum(r) == in_quorum]


def _gpt_gossip(key: str, pick: Callable, in_quorum: bool | None = None) -> Fn:
    """``pick`` of a measure over those runs (a run without it, e.g. no rejoin, left out)."""
    return lambda s: pick(
        float(r[key]) for r in _gpt_gossip_runs(s, in_quorum) if r.get(key) is not None
    )


def _gpt_spread(s: Source) -> float:
    """The widest range of one method's final eval loss over its GPT runs, with and without
    the fault (the methods that finished)."""
    widest = 0.0
    for method in _DIGITS_FINISHED:
        runs = compare_runs(s, "gpt", method, True, SEEDS) + compare_runs(
            s, "gpt", method, False, SEEDS
        )
        values = [final_metric(r, "eval/loss_local") for r in runs]
        widest = max(widest, max(values) - min(values))
    return widest


def _gpt_allreduce_lost(s: Source) -> str:
    runs = compare_runs(s, "gpt", "torchft-allreduce", True, SEEDS)
    lost = [int(r["survivor_steps_lost"]) for r in runs]
    return f"{sum(x > 0 for x in lost)} of the {len(lost)} seeds|{max(lost)}"


def _ddp_crashed(s: Source) -> float:
    runs = compare_runs(s, "digits", "torchft-ddp", True, SEEDS)
    return float(sum(crashed(r) for r in runs))


def _lowest_acc(s: Source) -> float:
    """The lowest final ``eval/acc_local`` of any host of any digits run that finished."""
    methods = (
        "gossip-ring",
        "gossip-one-peer-exp",
        "restart",
        "torchft-allreduce",
        "torchft-diloco",
    )
    values = []
    for method in methods:
        for fault in (True, False):
            for r in compare_runs(s, "digits", method, fault, SEEDS):
                values += [
                    h["eval/acc_local"] for h in r["hosts"].values() if "eval/acc_local" in h
                ]
    return min(values)


_ALL = (  # the testbed's runs, of the current path (the loopback ones are of ElasticGossip)
    "testbed-ring-kill-at-quorum",
    "testbed-one-peer-exp-kill-at-quorum",
    "testbed-ring-kill-mid-interval",
)

CLAIMS: list[Claim] = [
    # docs/results/elastic/README.md
    claim(
        ELASTIC_PAGE,
        r"the longest pause of any survivor, about (\d) s",
        V(lambda s: max(elastic_field(n, "survivor_gap_s")(s) for n in LOOPBACK), F0),
    ),
    claim(
        ELASTIC_PAGE,
        r"\*\*Rejoining took (\d+) to (\d+) s\*\*",
        V(_rejoin(min, LOOPBACK), F0),
        V(_rejoin(max, LOOPBACK), F0),
    ),
    claim(
        ELASTIC_PAGE,
        r"healed from its neighbour, (\d+) and\s+(\d+) steps after the kill",
        *(V(elastic_field(n, "healed_after"), F0) for n in LOOPBACK),
    ),
    # docs/results/elastic/compare/README.md
    claim(
        COMPARE_PAGE,
        r"within or above the range of its uninterrupted seeds, except ([^,]+),",
        V(_below_band, "{}"),
    ),
    claim(
        COMPARE_PAGE,
        r"a 1-minute load average of\s+(\d+) to (\d+) during the runs",
        V(lambda s: math.floor(_load(min)(s)), F0),
        V(lambda s: math.ceil(_load(max)(s)), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"resumed from the checkpoint of step (\d+)\. The\s+survivors' pause, (\d+) to (\d+) s",
        V(_restart_resumed, F0),
        V(_cmp("restart", "survivor_gap_s", min), F0),
        V(_cmp("restart", "survivor_gap_s", max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"every host computed the (\d+) steps since the checkpoint again",
        V(_one_value("restart", "survivor_steps_lost"), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"The run took (\d+) to (\d+) s longer than\s+uninterrupted",
        V(_restart_extra(min), F0),
        V(_restart_extra(max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"none lost a step\.\*\* In (\d) of its (\d) fault runs",
        V(_gossip_count(False), F0),
        V(_gossip_count(None), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"about (\d) s of\s+pause \(the lighthouse's heartbeat timeout",
        V(_between("survivor_gap_s", max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"took part (\d+) to\s+(\d+) s after it was started",
        V(_between("rejoin_s", min), F0),
        V(_between("rejoin_s", max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"In the other (\d) the victim",
        V(_gossip_count(True), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"the survivors waited `timeout_s` \((\d+) s\) for it",
        V(_inside_gap, F0),
    ),
    claim(
        COMPARE_PAGE,
        r"crashed every survivor\*\* in (\d) of the (\d) seeds",
        V(_ddp_crashed, F0),
        V(lambda s: float(len(compare_runs(s, "digits", "torchft-ddp", True, SEEDS))), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"survived: in \d of the 3\s+seeds every survivor\s+waited (\d+) s",
        V(_cmp("torchft-allreduce", "survivor_gap_s", max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"behaved like elastic gossip between quorums: about (\d) s",
        V(_cmp("torchft-diloco", "survivor_gap_s", max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"every run that finished ends at or above\s+(0\.\d\d) on this small task",
        V(lambda s: math.floor(_lowest_acc(s) * 100) / 100, "{:.2f}"),
    ),
    # docs/results/elastic/compare/README.md, the tiny GPT
    claim(
        COMPARE_PAGE,
        r"Elastic gossip lost (no) step\.\*\* In (\d) of its (\d) fault runs",
        V(lambda s: "no" if _gpt_gossip("survivor_steps_lost", max)(s) == 0 else "some", "{}"),
        V(lambda s: float(len(_gpt_gossip_runs(s, True))), F0),
        V(lambda s: float(len(_gpt_gossip_runs(s))), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"waited out `timeout_s` once, (\d+) to (\d+) s in all; the\s+"
        r"restarted host took part about (\d+) s after its start",
        V(_gpt_gossip("survivor_gap_s", min, True), F0),
        V(_gpt_gossip("survivor_gap_s", max, True), F0),
        V(_gpt_gossip("rejoin_s", max, True), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"outer step, paused about (\d) s and lost (no) step",
        V(_gpt("torchft-diloco", "survivor_gap_s", max), F0),
        V(
            lambda s: (
                "no" if _gpt("torchft-diloco", "survivor_steps_lost", max)(s) == 0 else "some"
            ),
            "{}",
        ),
    ),
    claim(
        COMPARE_PAGE,
        r"computed the (\d+) steps since its checkpoint \(step (\d+)\) again on\s+every host, "
        r"after a pause of (\d+) to (\d+) s",
        V(_gpt("restart", "survivor_steps_lost", max), F0),
        V(_gpt("restart", "resumed_from_step", max), F0),
        V(_gpt("restart", "survivor_gap_s", min), F0),
        V(_gpt("restart", "survivor_gap_s", max), F0),
    ),
    claim(
        COMPARE_PAGE,
        r"waited the all-reduce's timeout \(about (\d+) s\), and\s+in (\d of the \d seeds) a survivor "
        r"was healed from a peer over (\d) step",
        V(_gpt("torchft-allreduce", "survivor_gap_s", min), F0),
        V(lambda s: _gpt_allreduce_lost(s).split("|")[0], "{}"),
        V(lambda s: int(_gpt_allreduce_lost(s).split("|")[1]), "{}"),
    ),
    claim(COMPARE_PAGE, r"differ\s+by up to (\d\.\d) nats", V(_gpt_spread, F1)),
    claim(
        ELASTIC_PAGE,
        r"\(medians of (\d+) and\s+(\d+) ms at 1 Gb/s, (\d+) and (\d+) ms at 100 Mb/s\)",
        V(_cost_ms("1gbit", "wrapper", statistics.median), F0),
        V(_cost_ms("1gbit", "elastic", statistics.median), F0),
        V(_cost_ms("100mbit", "wrapper", statistics.median), F0),
        V(_cost_ms("100mbit", "elastic", statistics.median), F0),
    ),
    claim(
        ELASTIC_PAGE,
        r"the quorum step, (\d\.\d\d) s at\s+1 Gb/s and (\d\.\d\d) s at 100 Mb/s",
        V(cost_steps("1gbit", "elastic", max), "{:.2f}"),
        V(cost_steps("100mbit", "elastic", max), "{:.2f}"),
    ),
    claim(
        ELASTIC_PAGE,
        r"\(load average (\d+\.\d) and (\d+\.\d) at the ends of the runs\)",
        V(cost_value("1gbit", "load_avg_1m"), F1),
        V(cost_value("100mbit", "load_avg_1m"), F1),
    ),
]
