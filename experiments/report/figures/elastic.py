"""The figures of the elastic hosts' pages and of the recovery guide's comparison under one kill
(see :mod:`experiments.report.figures`).

Ids: ``elastic.cost.RATE.*`` (what membership costs a step, ``cost-RATE.json``),
``elastic.loopback.*`` (the loopback fault runs), ``elastic.compare.TASK.METHOD.*`` (the
side-by-side comparison, ``compare/TASK-METHOD-sSEED-KIND.json``; ``gossip`` is elastic gossip's
``ring`` and ``one-peer-exp`` runs together), and ``recovery.*``: the testbed's fault runs and the
comparison's figures that ``docs/recovery.md`` quotes (the compare page quotes them by the same
ids). The readers are the views' own (:mod:`experiments.report.doc_views_hosts`), so that a
sentence and its table agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_hosts import (
    COMPARE,
    ELASTIC,
    compare_runs,
    cost_steps,
    cost_value,
    crashed,
    elastic_field,
    elastic_worst,
    final_metric,
)
from experiments.report.figures.families import picked
from experiments.report.figures.sources import F0, Figure, Fn

SEEDS = [0, 1, 2]
LOOPBACK = ("loopback-ring", "loopback-one-peer-exp")
# the testbed's runs, of the current path (the loopback ones are of ElasticGossip)
TESTBED = (
    "testbed-ring-kill-at-quorum",
    "testbed-one-peer-exp-kill-at-quorum",
    "testbed-ring-kill-mid-interval",
)
# the methods whose survivors finished (torchft's DDP wrapper crashed them)
FINISHED = ("gossip-ring", "gossip-one-peer-exp", "restart", "torchft-allreduce", "torchft-diloco")
GOSSIP = ("gossip-ring", "gossip-one-peer-exp")
SAID = {
    "torchft-diloco": "torchft's DiLoCo",
    "gossip-one-peer-exp": "elastic gossip's one-peer-exp",
    "gossip-ring": "elastic gossip's ring",
}


def _runs(s: Source, task: str, methods: tuple[str, ...], fault: bool = True) -> list[dict]:
    """The runs of ``methods`` on ``task``, every seed found."""
    return [r for m in methods for r in compare_runs(s, task, m, fault, SEEDS)]


def _in_quorum(run: dict[str, Any]) -> bool:
    """Whether the kill fell inside a quorum: a survivor waited ``timeout_s`` (above 10 s)."""
    return float(run["survivor_gap_s"]) > 10


def _gossip(s: Source, task: str, in_quorum: bool | None = None) -> list[dict]:
    """Elastic gossip's fault runs on ``task`` whose kill fell inside a quorum (``in_quorum``),
    between quorums (not), or all (None)."""
    runs = _runs(s, task, GOSSIP)
    return [r for r in runs if in_quorum is None or _in_quorum(r) == in_quorum]


def cmp(method: str, key: str, pick: Callable, task: str = "digits") -> Fn:
    """``pick`` (min, max) over the fault runs of ``method`` of one measure."""
    return lambda s: pick(float(r[key]) for r in compare_runs(s, task, method, True, SEEDS))


def one_value(method: str, key: str, task: str = "digits") -> Fn:
    """A measure that is the same in every fault run of ``method`` (else an error)."""

    def value(s: Source) -> float:
        values = {float(r[key]) for r in compare_runs(s, task, method, True, SEEDS)}
        if len(values) != 1:
            raise DataError(COMPARE, f"{method}'s {key} differs between seeds: {sorted(values)}")
        return values.pop()

    return value


def gossip(key: str, pick: Callable, in_quorum: bool | None = None, task: str = "digits") -> Fn:
    """``pick`` of a measure over elastic gossip's fault runs (those of ``in_quorum``; a run
    without the measure, e.g. no rejoin, left out). Between quorums no run may lose a step."""

    def value(s: Source) -> float:
        runs = _gossip(s, task, in_quorum)
        if in_quorum is False and any(r["survivor_steps_lost"] for r in runs):
            raise DataError(COMPARE, "a gossip run with its kill between quorums lost a step")
        return pick(float(r[key]) for r in runs if r.get(key) is not None)

    return value


def gossip_count(in_quorum: bool | None, task: str = "digits") -> Fn:
    """How many of elastic gossip's fault runs had their kill inside a quorum, between, or all."""
    return lambda s: float(len(_gossip(s, task, in_quorum)))


def lost_word(fn: Fn) -> Callable[[Source], str]:
    """``no`` where ``fn`` (steps lost) is 0, else the number."""
    return lambda s: "no" if fn(s) == 0 else f"{fn(s):.0f}"


def rejoin(pick: Callable, names: tuple[str, ...]) -> Fn:
    """``pick`` over the fault runs ``names`` of the restarted host's way back (s)."""
    return lambda s: pick(elastic_field(n, "rejoin_s")(s) for n in names)


def healed_step(names: tuple[str, ...]) -> Fn:
    """The step the restarted host healed to, the same in each of the fault runs ``names``."""

    def value(s: Source) -> float:
        steps = {
            elastic_field(n, "healed_after")(s)
            + float(s.key(f"{ELASTIC}/{n}.json", "args.kill_step"))
            for n in names
        }
        if len(steps) != 1:
            raise DataError(
                ELASTIC, f"the restarted hosts healed at different steps: {sorted(steps)}"
            )
        return steps.pop()

    return value


def restart_extra(pick: Callable) -> Fn:
    """``pick`` over the seeds of the restarted job's wall time less the uninterrupted one's."""

    def value(s: Source) -> float:
        out = []
        for seed in SEEDS:
            (fault,) = compare_runs(s, "digits", "restart", True, [seed])
            (clean,) = compare_runs(s, "digits", "restart", False, [seed])
            out.append(float(fault["wall_s"]) - float(clean["wall_s"]))
        return pick(out)

    return value


def load(pick: Callable) -> Fn:
    """``pick`` over every comparison run's 1-minute load average, at its start and its end."""

    def value(s: Source) -> float:
        files = sorted((s.root / COMPARE).glob("*.json"))
        if not files:
            raise DataError(COMPARE, "no runs")
        return pick(x for f in files for x in s.json(f"{COMPARE}/{f.name}")["load_avg_1m"])

    return value


def below_band(s: Source) -> str:
    """The methods whose digits fault runs' mean accuracy is below their uninterrupted seeds'
    range (``none``)."""
    below = []
    for method in FINISHED:
        fault = [final_metric(r, "eval/acc_local") for r in _runs(s, "digits", (method,))]
        clean = [final_metric(r, "eval/acc_local") for r in _runs(s, "digits", (method,), False)]
        if statistics.mean(fault) < min(clean):
            below.append(SAID.get(method, method))
    return ", ".join(below) or "none"


def lowest_acc(s: Source) -> float:
    """The lowest final ``eval/acc_local`` of any host of any digits run that finished, rounded
    down to 2 decimals."""
    runs = _runs(s, "digits", FINISHED) + _runs(s, "digits", FINISHED, False)
    lowest = min(
        h["eval/acc_local"]
        for r in runs
        for h in r["hosts"].values()
        if h.get("eval/acc_local") is not None
    )
    return math.floor(lowest * 100) / 100


def gpt_spread(s: Source) -> float:
    """The widest range of one method's final eval loss over its GPT runs, with and without
    the fault (the methods that finished)."""
    widest = 0.0
    for method in FINISHED:
        runs = _runs(s, "gpt", (method,)) + _runs(s, "gpt", (method,), False)
        values = [final_metric(r, "eval/loss_local") for r in runs]
        widest = max(widest, max(values) - min(values))
    return widest


def counted(task: str, method: str, test: Callable[[dict], bool] | None = None) -> Fn:
    """How many fault runs of ``method`` pass ``test`` (None: all of them)."""
    return lambda s: float(
        sum(test is None or test(r) for r in compare_runs(s, task, method, True, SEEDS))
    )


def _lost_a_step(run: dict[str, Any]) -> bool:
    return int(run["survivor_steps_lost"]) > 0


def _digits(method: str) -> str:
    return f"elastic.compare.digits.{method}"


def _gpt(method: str) -> str:
    return f"elastic.compare.gpt.{method}"


def _cost(rate: str) -> dict[str, Figure]:
    """What membership costs a step at ``rate``: each arm's median step between quorums (ms),
    the elastic arm's quorum step (s) and the load average at the end of the run."""
    prefix = f"elastic.cost.{rate}"
    return {
        **{
            f"{prefix}.{arm}.median-ms": Figure(
                lambda s, a=arm: cost_steps(rate, a, statistics.median)(s) * 1e3, F0
            )
            for arm in ("wrapper", "elastic")
        },
        f"{prefix}.elastic.quorum-s": Figure(cost_steps(rate, "elastic", max), "{:.2f}"),
        f"{prefix}.load": Figure(cost_value(rate, "load_avg_1m"), "{:.1f}"),
    }


FIGURES: dict[str, Figure] = {
    # docs/results/elastic/README.md
    **_cost("1gbit"),
    **_cost("100mbit"),
    "elastic.loopback.pause-s": Figure(
        lambda s: max(elastic_field(n, "survivor_gap_s")(s) for n in LOOPBACK), F0
    ),
    **picked("elastic.loopback.rejoin-s", F0, lambda pick: rejoin(pick, LOOPBACK)),
    **{
        f"elastic.{name.replace('-', '.', 1)}.healed-after": Figure(
            elastic_field(name, "healed_after"), F0
        )
        for name in LOOPBACK
    },
    "elastic.testbed.in-quorum.healed-step": Figure(healed_step(TESTBED[:2]), F0),
    # docs/results/elastic/compare/README.md: digits
    "elastic.compare.load.min": Figure(lambda s: math.floor(load(min)(s)), F0),
    "elastic.compare.load.max": Figure(lambda s: math.ceil(load(max)(s)), F0),
    f"{_digits('restart')}.resumed-step": Figure(one_value("restart", "resumed_from_step"), F0),
    f"{_digits('gossip')}.runs": Figure(gossip_count(None), F0),
    f"{_digits('gossip')}.between-quorums": Figure(gossip_count(False), F0),
    f"{_digits('gossip')}.in-quorum": Figure(gossip_count(True), F0),
    **picked(
        f"{_digits('gossip')}.rejoin-between-s",
        F0,
        lambda pick: gossip("rejoin_s", pick, False),
    ),
    f"{_digits('gossip')}.pause-in-quorum-s": Figure(gossip("survivor_gap_s", max, True), F0),
    f"{_digits('torchft-ddp')}.runs": Figure(counted("digits", "torchft-ddp"), F0),
    f"{_digits('torchft-ddp')}.crashed": Figure(counted("digits", "torchft-ddp", crashed), F0),
    f"{_digits('torchft-ddp')}.pause-s": Figure(
        lambda s: max(
            float(r["survivor_gap_s"])
            for r in compare_runs(s, "digits", "torchft-ddp", True, SEEDS)
            if not crashed(r)
        ),
        F0,
    ),
    f"{_digits('torchft-allreduce')}.runs": Figure(counted("digits", "torchft-allreduce"), F0),
    f"{_digits('torchft-allreduce')}.in-quorum": Figure(
        counted("digits", "torchft-allreduce", _in_quorum), F0
    ),
    f"{_digits('torchft-allreduce')}.pause-s.min": Figure(
        cmp("torchft-allreduce", "survivor_gap_s", min), F0
    ),
    "elastic.compare.digits.below-band": Figure(below_band),
    # the tiny GPT
    f"{_gpt('gossip')}.lost": Figure(lost_word(gossip("survivor_steps_lost", max, task="gpt"))),
    f"{_gpt('gossip')}.runs": Figure(gossip_count(None, "gpt"), F0),
    f"{_gpt('gossip')}.in-quorum": Figure(gossip_count(True, "gpt"), F0),
    **picked(
        f"{_gpt('gossip')}.pause-in-quorum-s",
        F0,
        lambda pick: gossip("survivor_gap_s", pick, True, "gpt"),
    ),
    f"{_gpt('gossip')}.rejoin-s": Figure(gossip("rejoin_s", max, True, "gpt"), F0),
    f"{_gpt('torchft-diloco')}.pause-s": Figure(
        cmp("torchft-diloco", "survivor_gap_s", max, "gpt"), F0
    ),
    f"{_gpt('torchft-diloco')}.lost": Figure(
        lost_word(cmp("torchft-diloco", "survivor_steps_lost", max, "gpt"))
    ),
    f"{_gpt('restart')}.steps-recomputed": Figure(
        one_value("restart", "survivor_steps_lost", "gpt"), F0
    ),
    f"{_gpt('restart')}.resumed-step": Figure(one_value("restart", "resumed_from_step", "gpt"), F0),
    **picked(
        f"{_gpt('restart')}.pause-s",
        F0,
        lambda pick: cmp("restart", "survivor_gap_s", pick, "gpt"),
    ),
    f"{_gpt('torchft-allreduce')}.pause-s.min": Figure(
        cmp("torchft-allreduce", "survivor_gap_s", min, "gpt"), F0
    ),
    f"{_gpt('torchft-allreduce')}.runs": Figure(counted("gpt", "torchft-allreduce"), F0),
    f"{_gpt('torchft-allreduce')}.runs-healed": Figure(
        counted("gpt", "torchft-allreduce", _lost_a_step), F0
    ),
    f"{_gpt('torchft-allreduce')}.steps-healed": Figure(
        cmp("torchft-allreduce", "survivor_steps_lost", max, "gpt"), F0
    ),
    "elastic.compare.gpt.spread": Figure(gpt_spread, "{:.1f}"),
    # docs/recovery.md (the testbed's fault runs; the comparison's, also on the compare page)
    "recovery.testbed.survivors-lost": Figure(lost_word(elastic_worst("survivor_steps_lost"))),
    "recovery.testbed.pause-between-quorums-s": Figure(elastic_worst("survivor_gap_s", False), F0),
    "recovery.testbed.pause-inside-quorum-s": Figure(elastic_worst("survivor_gap_s", True), F0),
    **picked("recovery.testbed.rejoin-s", F0, lambda pick: rejoin(pick, TESTBED)),
    **picked(
        "recovery.restart.pause-s",
        F0,
        lambda pick: cmp("restart", "survivor_gap_s", pick),
    ),
    "recovery.restart.steps-recomputed": Figure(one_value("restart", "survivor_steps_lost"), F0),
    **picked("recovery.restart.extra-s", F0, lambda pick: restart_extra(pick)),
    "recovery.elastic.pause-between-quorums-s": Figure(gossip("survivor_gap_s", max, False), F0),
    "recovery.torchft-allreduce.pause-s": Figure(
        cmp("torchft-allreduce", "survivor_gap_s", max), F0
    ),
    "recovery.torchft-diloco.pause-s": Figure(cmp("torchft-diloco", "survivor_gap_s", max), F0),
    "recovery.lowest-acc": Figure(lowest_acc, "{:.2f}"),
}
