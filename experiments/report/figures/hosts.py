"""The figures of sharded replicas (see :mod:`experiments.report.figures`).

Ids: ``sharded.*`` (the sharded replicas' benchmark and testbed study). The elastic hosts' are
in :mod:`~experiments.report.figures.elastic`.
"""

from __future__ import annotations

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_hosts import HSDP, STUDY, params_m, peak_mb, study
from experiments.report.figures.families import extremes
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


GLIBC = "docs/results/sharded/bench_glibc.json"

FIGURES: dict[str, Figure] = {
    "sharded.gpt.params-m": Figure(params_m, "{:.1f}"),
    **{
        f"sharded.{arm}.p{n}.peak-mb": Figure(peak_mb(arm, n), "{:,.0f}")
        for arm, n in (("unsharded", 1), ("gossip", 2), ("gossip", 4))
    },
    **{
        f"sharded.gossip-over-hsdp.p{n}.peak-mb": Figure(
            diff(peak_mb("gossip", n), peak_mb("hsdp", n)), "{:,.0f}"
        )
        for n in (2, 4)
    },
    **{
        f"sharded.glibc.{arm}.p{n}.peak-mb": Figure(peak_mb(arm, n, GLIBC), "{:.1f}")
        for arm, n in (("unsharded", 1), ("gossip", 2), ("gossip", 4))
    },
    "sharded.tokens": Figure(_same_tokens, "{:,}"),
    **{
        f"sharded.{shape}.steps": Figure(
            lambda s, sh=shape: s.run(f"{RUNS}/{sh}/ring/seed0", "train/steps"), "{:,.0f}"
        )
        for shape in ("2x2", "4x2")
    },
    "sharded.2x2.ring.rank-mb": Figure(
        _mb("2x2", "ring", "comm_bytes_per_step_per_rank"), "{:.2f}"
    ),
    "sharded.2x2.ring.host-mb": Figure(_mb("2x2", "ring"), "{:,.0f}"),
    "sharded.2x2.ring-vs-hsdp.tokens-s": Figure(
        ratio(study("2x2", "ring", "tokens_per_s"), study("2x2", "allreduce", "tokens_per_s")),
        "{:.1f}",
    ),
    "sharded.4x2.ring-vs-hsdp.tokens-s": Figure(
        ratio(study("4x2", "ring", "tokens_per_s"), study("4x2", "allreduce", "tokens_per_s")),
        "{:,.0f}",
    ),
    **{
        f"sharded.4x2.{name}.host-mb": Figure(_mb("4x2", arm), "{:.1f}")
        for name, arm in (("hsdp", HSDP), ("ring", "ring"))
    },
    **{
        f"sharded.{shape}.{name}.loss": Figure(study(shape, arm, "eval_loss"), "{:.2f}")
        for shape, name, arm in (
            ("2x2", "hsdp", "allreduce"),
            ("2x2", "ring", "ring"),
            ("4x2", "hsdp", "allreduce"),
        )
    },
    **extremes(
        "sharded.4x2.gossip.loss",
        "{:.2f}",
        lambda s: [study("4x2", a, "eval_loss")(s) for a in ("ring", "one-peer-exp")],
    ),
}

TABLES: dict[str, str] = {}
