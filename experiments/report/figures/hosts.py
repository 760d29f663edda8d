"""The figures of sharded replicas, and the recovery guide's comparison under one kill (see :mod:`experiments.report.figures`)."""

from __future__ import annotations

import math

from experiments.report.claims.hosts import (
    _between,
    _cmp,
    _lowest_acc,
    _none_lost,
    _one_value,
    _rejoin,
    _restart_extra,
)
from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_hosts import HSDP, STUDY, elastic_worst, params_m, peak_mb, study
from experiments.report.figures.sources import Figure, Fn, diff, ratio

RUNS = "docs/results/sharded/runs"


def _same_tokens(s: Source) -> int:
    """The tokens of every run of the testbed study (one value, or the runs differ)."""
    tokens = {int(r["tokens"]) for r in s.json(STUDY)}
    if len(tokens) != 1:
        raise DataError(STUDY, f"the runs' tokens differ: {sorted(tokens)}")
    return tokens.pop()


def _mb(shape: str, arm: str, key: str = "tx_bytes_per_host_per_step") -> Fn:
    """MB per step of one arm of the testbed study (mean over its seeds)."""
    fn = study(shape, arm, key)
    return lambda s: fn(s) / 1e6


FIGURES: dict[str, Figure] = {
    "res.torch-s-hsdp-a": Figure(params_m, "{:.1f}"),
    "sharded.on-one-gpt-of": Figure(params_m, "{:.1f}"),
    "sharded.the-peak-falls-from": Figure(peak_mb("unsharded", 1), "{:,.0f}"),
    "sharded.peak-falls-from-to": Figure(peak_mb("gossip", 2), "{:,.0f}"),
    "sharded.falls-from-to-to": Figure(peak_mb("gossip", 4), "{:,.0f}"),
    "sharded.by-about-that-buffer": Figure(
        diff(peak_mb("gossip", 2), peak_mb("hsdp", 2)), "{:,.0f}"
    ),
    "sharded.buffer-mb-with-shards": Figure(
        diff(peak_mb("gossip", 4), peak_mb("hsdp", 4)), "{:,.0f}"
    ),
    "sharded.it-at-this-size": Figure(
        peak_mb("unsharded", 1, "docs/results/sharded/bench_glibc.json"), "{:.1f}"
    ),
    "sharded.it-at-this-size-2": Figure(
        peak_mb("gossip", 2, "docs/results/sharded/bench_glibc.json"), "{:.1f}"
    ),
    "sharded.at-this-size-and": Figure(
        peak_mb("gossip", 4, "docs/results/sharded/bench_glibc.json"), "{:.1f}"
    ),
    "sharded.tokens-in-every-arm": Figure(_same_tokens, "{:,}"),
    "sharded.tokens-in-every-arm-2": Figure(
        lambda s: s.run(f"{RUNS}/2x2/ring/seed0", "train/steps"), "{:,.0f}"
    ),
    "sharded.arm-steps-on-hosts": Figure(
        lambda s: s.run(f"{RUNS}/4x2/ring/seed0", "train/steps"), "{:,.0f}"
    ),
    "sharded.half-the-model-here": Figure(
        _mb("2x2", "ring", "comm_bytes_per_step_per_rank"), "{:.2f}"
    ),
    "sharded.two-ranks-send-about": Figure(_mb("2x2", "ring"), "{:,.0f}"),
    "sharded.twice-gossip-is-faster": Figure(
        ratio(study("2x2", "ring", "tokens_per_s"), study("2x2", "allreduce", "tokens_per_s")),
        "{:.1f}",
    ),
    "sharded.bytes-per-link-about": Figure(
        ratio(study("4x2", "ring", "tokens_per_s"), study("4x2", "allreduce", "tokens_per_s")),
        "{:,.0f}",
    ),
    "sharded.sends-more-per-host": Figure(_mb("4x2", HSDP), "{:.1f}"),
    "sharded.per-host-mb-against": Figure(_mb("4x2", "ring"), "{:.1f}"),
    "sharded.lower-at-equal-tokens": Figure(study("2x2", "allreduce", "eval_loss"), "{:.2f}"),
    "sharded.at-equal-tokens-against": Figure(study("2x2", "ring", "eval_loss"), "{:.2f}"),
    "sharded.tokens-against-on-hosts": Figure(study("4x2", "allreduce", "eval_loss"), "{:.2f}"),
    "sharded.against-on-hosts-against": Figure(
        lambda s: min(study("4x2", a, "eval_loss")(s) for a in ("ring", "one-peer-exp")), "{:.2f}"
    ),
    "sharded.against-on-hosts-against-2": Figure(
        lambda s: max(study("4x2", a, "eval_loss")(s) for a in ("ring", "one-peer-exp")), "{:.2f}"
    ),
    "recovery.s-mb-s-links": Figure(_none_lost),
    "recovery.the-survivors-for-about": Figure(elastic_worst("survivor_gap_s", False), "{:,.0f}"),
    "recovery.them-for-timeout-s": Figure(elastic_worst("survivor_gap_s", True), "{:,.0f}"),
    "recovery.restarted-host-took-part": Figure(
        _rejoin(
            min,
            (
                "testbed-ring-kill-at-quorum",
                "testbed-one-peer-exp-kill-at-quorum",
                "testbed-ring-kill-mid-interval",
            ),
        ),
        "{:,.0f}",
    ),
    "recovery.host-took-part-to": Figure(
        _rejoin(
            max,
            (
                "testbed-ring-kill-at-quorum",
                "testbed-one-peer-exp-kill-at-quorum",
                "testbed-ring-kill-mid-interval",
            ),
        ),
        "{:,.0f}",
    ),
    "recovery.started-again-they-paused": Figure(_cmp("restart", "survivor_gap_s", min), "{:,.0f}"),
    "recovery.again-they-paused-to": Figure(_cmp("restart", "survivor_gap_s", max), "{:,.0f}"),
    "recovery.every-host-computed-the": Figure(
        _one_value("restart", "survivor_steps_lost"), "{:,.0f}"
    ),
    "recovery.and-the-run-took": Figure(_restart_extra(min), "{:,.0f}"),
    "recovery.the-run-took-to": Figure(_restart_extra(max), "{:,.0f}"),
    "recovery.paused-the-survivors-about": Figure(_between("survivor_gap_s", max), "{:,.0f}"),
    "recovery.all-reduce-s-timeout": Figure(
        _cmp("torchft-allreduce", "survivor_gap_s", max), "{:,.0f}"
    ),
    "recovery.s-diloco-paused-about": Figure(
        _cmp("torchft-diloco", "survivor_gap_s", max), "{:,.0f}"
    ),
    "recovery.on-this-small-task": Figure(
        lambda s: math.floor(_lowest_acc(s) * 100) / 100, "{:.2f}"
    ),
}

TABLES: dict[str, str] = {}
