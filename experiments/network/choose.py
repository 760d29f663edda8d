"""Which topology for this cluster: every topology ranked by step time, mixing and bytes.

``python -m experiments.network.choose --nodes N --procs-per-node P --link RATE --model
NAME_OR_MB`` (or ``make choose ARGS=...``) predicts, for ``allreduce`` (torch DDP) and every
registered topology on ``N`` nodes of ``P`` processes:

* the step time, from the scale simulator (:func:`experiments.network.simulate.simulate`),
  with the link's terms calibrated where measurements exist (:func:`link_terms`). It is the
  model's prediction, never a measurement, and the output states the model's error against
  measured step times from the committed validation (:func:`model_error`);
* the consensus rate per step, ``(1 - period contraction) / period``
  (:func:`rate_per_step`): the share of the workers' disagreement one period removes,
  spread over its steps. For a period of one round it is the spectral gap
  ``1 - max(|λ2|, |λn|)``; ``local-sgd`` with period 8 reads 1/8, not 1 as ``complete``;
* the bytes one node's link sends per step (:func:`host_link_bytes`), by the simulator's
  cost model: a group that spans nodes is a ring that leaves each of its nodes once.

It then names a pick and says why: among the candidates whose step is within
``--tolerance`` (10%) of the fastest candidate's, the one that mixes most per step; a tie
goes to the faster. ``local-sgd`` is listed but is no candidate unless ``--topologies``
names it: its step is short because most of its steps do not communicate, and whether a
model trains well that way (its period, an outer optimizer) is a question the network
cannot answer. ``--json`` prints the same as one JSON object.

Example::

    python -m experiments.network.choose --nodes 2 --procs-per-node 8 --link 25gbit \\
        --model resnet50
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from decent_dp.topo import Edge, TopologyReg
from decent_dp.topo.hosts import host_size
from experiments.network.choose_inputs import (
    FABRICS,
    FABRICS_OF,
    MB,
    bad,
    bits_per_s,
    integer,
    link_terms,
    model_bytes,
    model_error,
    model_names,
    positive,
)
from experiments.network.netem import PROFILES
from experiments.network.sim_config import ALLREDUCE, load_config
from experiments.network.simulate import HIERARCHICAL, simulate
from experiments.report.doc_data import md_table

__all__ = ["MAX_WORLD", "choose", "host_link_bytes", "main", "rate_per_step", "table"]

MAX_WORLD = 1024  # the spectral analysis is dense: n x n matrices
NOT_CANDIDATES = ("local-sgd",)
EXACT = 1e-12


# --- mixing and bytes -----------------------------------------------------------------------


def rate_per_step(contraction: float, period: int) -> float:
    """``(1 - contraction) / period``: a period's share of the disagreement removed, per step.

    A contraction below 1e-12 is an exact period (0). For ``period`` 1 and a symmetric
    mixing matrix this is the spectral gap ``1 - max(|λ2|, |λn|)``.
    """
    return (1.0 - (0.0 if contraction < EXACT else contraction)) / period


def host_link_bytes(
    rounds: Sequence[Sequence[Edge]], local: int, nbytes: float, three_phase: bool = False
) -> float:
    """Bytes the busiest node's link sends per step, averaged over the period.

    A group that spans nodes runs as a ring over its ``k`` members, which leaves each of its
    nodes once: ``2 (k-1)/k nbytes`` on each of their links. A group inside one node sends
    nothing between nodes. With ``three_phase`` (``hierarchical``) an edge of ``h`` whole
    nodes sends ``2 (h-1)/h nbytes``: the ``L`` chunk rings of ``1/L`` of the model each.

    Args:
        rounds: The topology's rounds.
        local: Ranks per node; rank ``r`` is on node ``r // local``.
        nbytes: Bytes each member exchanges.
        three_phase: Edges of several nodes run in the three phases of ``hierarchical``.
    """
    per_round = []
    for edges in rounds:
        sent: dict[int, float] = {}
        for edge in edges:
            nodes = {r // local for r in edge.ranks}
            if len(nodes) < 2:
                continue
            k = len(nodes) if three_phase and local > 1 else len(edge.ranks)
            for node in nodes:
                sent[node] = sent.get(node, 0.0) + 2.0 * (k - 1) / k * nbytes
        per_round.append(max(sent.values(), default=0.0))
    return sum(per_round) / len(per_round)


# --- the ranking ----------------------------------------------------------------------------


def _check_names(names: Sequence[str]) -> list[str]:
    known = [ALLREDUCE, *TopologyReg.names()]
    for name in names:
        if name not in known:
            raise bad("--topologies", ",".join(names), f"known: {', '.join(known)}")
    return list(names)


def choose(
    nodes: int | str,
    procs_per_node: int | str,
    link: str,
    model: str,
    *,
    compute_ms: float | str | None = None,
    fabric: str | None = None,
    intra: str | None = None,
    inter: str = "one-peer-exp",
    tolerance: float = 0.10,
    candidates: Sequence[str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Every topology on the cluster, ranked, and the pick with its reason.

    Args:
        nodes: Nodes ``N`` (one link each).
        procs_per_node: Processes (GPUs) per node ``P``.
        link: The link between nodes: a rate (``10mbit``, ``25gbit``) or a network name
            (``ethernet_25g``, ``infiniband_100g``).
        model: A model option of the framework or a size in MB.
        compute_ms: One step's compute on one worker; ``conf/simulate.yaml``'s by default.
        fabric: ``ethernet`` or ``infiniband``; a network name implies its own.
        intra: The link inside a node (a rate); ``conf/simulate.yaml``'s by default.
        inter: ``hierarchical``'s topology between nodes.
        tolerance: How much slower than the fastest candidate a step may be and still count
            as near-equal.
        candidates: The names the pick is made from; every fitting name but ``local-sgd``
            when ``None``.
        progress: Show a progress bar on stderr once the simulation takes over a second.

    Returns:
        ``inputs``, ``link``, ``model``, ``model_error``, ``rows`` (ranked; each with
        ``topology``, ``fits``, ``reason``, ``step_s``, ``period``, ``rate_per_step``,
        ``host_link_bytes``, ``candidate``), ``pick`` and ``why``.

    Raises:
        ValueError: One line naming a bad value and what is allowed.
    """
    nodes, per_node = integer("--nodes", nodes, 1), integer("--procs-per-node", procs_per_node, 1)
    n = nodes * per_node
    if not 2 <= n <= MAX_WORLD:
        raise bad("--nodes x --procs-per-node", n, f"the workers must number 2 to {MAX_WORLD}")
    rate_bps, fabric = _link(link, fabric)
    if not 0 <= tolerance < 1:
        raise bad("--tolerance", tolerance, "it must be in [0, 1)")
    if inter not in TopologyReg.names() or inter == HIERARCHICAL:
        known = [x for x in TopologyReg.names() if x != HIERARCHICAL]
        raise bad("--inter", inter, f"known: {', '.join(known)}")
    cfg = load_config()
    if compute_ms is not None:
        cfg.compute_s = positive("--compute-ms", compute_ms) / 1e3
    if intra is not None:
        cfg.intra.bandwidth_gbps = bits_per_s("--intra", intra) / 1e9
    chosen = _check_names(candidates) if candidates is not None else None
    names = [ALLREDUCE, *TopologyReg.names()]
    counting = str(model) in model_names()  # building a model can take seconds
    bar = tqdm(total=len(names) - 1 + counting, desc="choose", delay=1.0, file=sys.stderr,
               disable=None if progress else True, leave=False)  # fmt: skip
    with bar:
        bar.set_postfix_str(f"counting {model}'s parameters" if counting else "")
        nbytes, about = model_bytes(str(model))
        bar.update(counting)
        terms = link_terms(rate_bps, fabric)
        cfg.update(
            world_sizes=[n], local_world_size=per_node, model_bytes=nbytes,
            hierarchical_inter=inter, calibration=None, sensitivity=None,
            profiles=[{"name": "custom", "label": "link", "bandwidth_gbps": rate_bps / 1e9,
                       **{k: terms[k] for k in ("latency_ms", "efficiency", "collective_ms")}}],
        )  # fmt: skip
        rows = _rows(cfg, names, n, per_node, nbytes, bar)
    for row in rows:
        wanted = (
            row["topology"] not in NOT_CANDIDATES if chosen is None else row["topology"] in chosen
        )
        row["candidate"] = row["fits"] and wanted
    ranked, why = _rank(rows, tolerance)
    return {
        "inputs": {
            "nodes": nodes, "procs_per_node": per_node, "world_size": n, "link": link,
            "rate_bps": rate_bps, "fabric": fabric, "compute_s": float(cfg.compute_s),
            "backward_frac": float(cfg.backward_frac), "intra_gbps": float(cfg.intra.bandwidth_gbps),
            "inter": inter, "tolerance": tolerance, "candidates": chosen,
        },
        "link": terms,
        "model": {"bytes": nbytes, "about": about},
        "model_error": model_error(terms["calibrated_on"]),
        "rows": ranked,
        "pick": ranked[0]["topology"] if ranked and ranked[0]["candidate"] else None,
        "why": why,
    }  # fmt: skip


def _link(link: str, fabric: str | None) -> tuple[float, str]:
    """The link's rate in bits per second and its fabric."""
    if link in PROFILES:  # a network name carries its rate and fabric
        named = FABRICS_OF[link]
        if fabric is not None and fabric != named:
            raise bad("--fabric", fabric, f"--link={link} is {named}")
        return PROFILES[link].bandwidth_gbps * 1e9, named
    rate_bps = bits_per_s("--link", link)
    if fabric is not None and fabric not in FABRICS:
        raise bad("--fabric", fabric, f"known: {', '.join(FABRICS)}")
    return float(rate_bps), fabric or "ethernet"


def _rows(
    cfg: Any, names: Sequence[str], n: int, local: int, nbytes: float, bar: tqdm
) -> list[dict[str, Any]]:
    """One simulation per name (the first also gives ``allreduce``), with mixing and bytes."""
    rows: list[dict[str, Any]] = []
    for name in (x for x in names if x != ALLREDUCE):
        bar.set_postfix_str(f"simulating {name}")
        bar.update()
        cfg.topologies = [name]
        by_method = {r["method"]: r for r in simulate(cfg)}
        if not rows and ALLREDUCE in names:
            world = [[Edge(range(n), 1.0 / n)]]
            rows.append(
                _row(ALLREDUCE, by_method[ALLREDUCE], 1.0, host_link_bytes(world, local, nbytes))
            )
        sim = by_method[name]
        if not sim["fits"]:
            rows.append(_row(name, sim, None, None))
            continue
        kwargs = {"inter": cfg.hierarchical_inter} if name == HIERARCHICAL else {}
        topo = TopologyReg.create(name, n, local, **kwargs)
        sent = host_link_bytes(topo.rounds, local, nbytes, host_size(topo) > 1)
        rows.append(_row(name, sim, rate_per_step(sim["contraction"], sim["period"]), sent))
    return rows


def _row(name: str, sim: dict[str, Any], rate: float | None, sent: float | None) -> dict[str, Any]:
    return {
        "topology": name,
        "fits": bool(sim["fits"]),
        "reason": sim.get("reason") or "",
        "step_s": sim.get("t_iter_s"),
        "period": sim.get("period") or (1 if name == ALLREDUCE else None),
        "rate_per_step": rate,
        "host_link_bytes": sent,
    }


def _rank(rows: list[dict[str, Any]], tolerance: float) -> tuple[list[dict[str, Any]], str]:
    """The rows in the order of the rule (near-fastest by mixing, then by step), and why."""
    cands = [r for r in rows if r["candidate"]]
    others = [r for r in rows if r["fits"] and not r["candidate"]]
    unfit = [r for r in rows if not r["fits"]]
    by_step = sorted(others, key=lambda r: r["step_s"])
    if not cands:
        return by_step + unfit, "no candidate fits this cluster"
    fastest = min(cands, key=lambda r: r["step_s"])
    limit = fastest["step_s"] * (1 + tolerance)
    near = sorted(
        (r for r in cands if r["step_s"] <= limit), key=lambda r: (-r["rate_per_step"], r["step_s"])
    )
    far = sorted((r for r in cands if r["step_s"] > limit), key=lambda r: r["step_s"])
    for i, r in enumerate(near + far + by_step + unfit, 1):
        r["rank"] = i
    return near + far + by_step + unfit, _why(near, far, fastest, tolerance)


def _why(near: list[dict[str, Any]], far: list[dict[str, Any]], fastest: dict[str, Any],
         tolerance: float) -> str:  # fmt: skip
    pick = near[0]
    name, step, rate = pick["topology"], pick["step_s"], pick["rate_per_step"]
    traffic = f"{pick['host_link_bytes'] / MB:,.1f} MB per host link per step"
    if len(near) == 1:
        after = f"; next {far[0]['topology']} at {far[0]['step_s']:.3f} s" if far else ""
        return (
            f"{name}: the fastest predicted step ({step:.3f} s) by more than {tolerance:.0%}"
            f"{after}; it mixes {rate:.3f} per step and sends {traffic}."
        )
    same = [r["topology"] for r in near[1:] if math.isclose(r["rate_per_step"], rate)]
    less = [r for r in near[1:] if not math.isclose(r["rate_per_step"], rate)]
    lead = (
        f"{name}: {len(near)} candidates step within {tolerance:.0%} of the fastest "
        f"({fastest['topology']}, {fastest['step_s']:.3f} s), and {name} mixes the most per "
        f"step among them ({rate:.3f}"
    )
    if less:
        lead += f"; next {less[0]['topology']} {less[0]['rate_per_step']:.3f}"
    lead += ")"
    if same:
        lead += f", at {step:.3f} s the fastest of those that mix as much ({', '.join(same)})"
    return f"{lead}; it sends {traffic}."


# --- the command line -----------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    """The result of :func:`choose` as the command prints it: a header, the ranked table, the pick."""
    inp, link = result["inputs"], result["link"]
    lines = [
        f"{inp['nodes']} nodes x {inp['procs_per_node']} processes ({inp['world_size']} workers); "
        f"between nodes {inp['rate_bps'] / 1e9:g} Gb/s {inp['fabric']} (efficiency "
        f"{link['efficiency']:.3f}, {link['collective_ms']:.2f} ms per collective, "
        f"{link['latency_ms']:g} ms per hop: {link['source']}); inside a node "
        f"{inp['intra_gbps']:g} Gb/s",
        f"model {result['model']['about']}; compute {inp['compute_s'] * 1e3:g} ms per step "
        "(--compute-ms)",
        "",
    ]  # fmt: skip
    rows: list[list[str | None]] = []
    for r in result["rows"]:
        if not r["fits"]:
            rows.append([None, r["topology"], f"does not fit: {r['reason']}", *[None] * 4])
            continue
        note = "**pick**" if r["topology"] == result["pick"] else ""
        if not r["candidate"]:
            note = "listed, not a candidate (--topologies)"
        step = [str(r["rank"]), r["topology"], f"{r['step_s']:.3f} s", str(r["period"])]
        rate = [f"{r['rate_per_step']:.4f}", f"{r['host_link_bytes'] / MB:,.2f}"]
        rows.append([*step, *rate, note])
    header = ["rank", "topology", "step, predicted", "period", "consensus rate per step"]
    header += ["MB per host link per step", None]
    lines += [
        md_table(header, ["---:", "---", "---:", "---:", "---:", "---:", "---"], rows),
        "",
        "step: the scale simulator's prediction (experiments/network/sim_model.py), not a "
        f"measurement; its error: {result['model_error']}.",
        "consensus rate per step: (1 - period contraction) / period, the spectral gap for a "
        "period of one round; allreduce keeps one model (1).",
        "MB per host link: what the busiest node's link sends per step, over the period.",
        "",
        f"pick: {result['why']}" if result["pick"] else f"no pick: {result['why']}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.network.choose",
        description="Rank allreduce and every topology for N nodes of P processes on a link: "
        "predicted step time, consensus rate per step, bytes per host link; then a pick.",
    )
    parser.add_argument("--nodes", required=True, help="nodes, one link each")
    parser.add_argument("--procs-per-node", required=True, help="processes (GPUs) per node")
    parser.add_argument(
        "--link", required=True, help="between nodes: a rate (1gbit, 25gbit) or ethernet_25g, "
        "infiniband_100g",
    )  # fmt: skip
    parser.add_argument(
        "--model", required=True, help=f"a size in MB or a model: {', '.join(model_names())}"
    )
    parser.add_argument("--compute-ms", default=None, help="one step's compute (default 100)")
    parser.add_argument("--fabric", default=None, help="ethernet (default) or infiniband")
    parser.add_argument("--intra", default=None, help="inside a node (default 2400gbit, NVLink)")
    parser.add_argument("--inter", default="one-peer-exp", help="hierarchical's between nodes")
    parser.add_argument("--tolerance", default="0.10", help="near-equal steps (default 0.10)")
    parser.add_argument("--topologies", default=None, help="the candidates, comma-separated")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit status (2 for a bad value)."""
    ns = build_parser().parse_args(argv)
    try:
        try:
            tolerance = float(ns.tolerance)
        except ValueError:
            raise bad("--tolerance", ns.tolerance, "it must be a number in [0, 1)") from None
        result = choose(
            ns.nodes, ns.procs_per_node, ns.link, ns.model, compute_ms=ns.compute_ms,
            fabric=ns.fabric, intra=ns.intra, inter=ns.inter, tolerance=tolerance,
            candidates=ns.topologies.split(",") if ns.topologies else None, progress=True,
        )  # fmt: skip
    except ValueError as exc:
        print(f"choose: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if ns.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
