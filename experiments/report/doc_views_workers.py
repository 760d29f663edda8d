"""The docs' views of the optimizer gap at 4 to 64 packed workers (``docs/results/workers/``).

Each view reads ``docs/results/workers/runs.json`` through
:class:`~experiments.report.workers.Study`:

- ``workers-status``: how many runs and which arms have every seed;
- ``workers-corpus``: the corpus, and the share of it the largest budget draws;
- ``workers-gap budget=B``: each arm's tuned point, final loss and gap to ``allreduce``;
- ``workers-fit``: the gap's growth per doubling of the workers, with its scatter;
- ``workers-tuned``: each arm's best beta1 and learning rate beside ``allreduce``'s;
- ``workers-closing``: at 32 and 64 workers, what the tuned beta1, ``complete`` and a
  periodic average each close of ``one-peer-exp``'s gap at beta1 = 0.9;
- ``workers-findings``: the page's answers, as sentences whose words follow the numbers.

An arm without every seed shows a dash, so that a page of a study still running reads
what is there and no more.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from experiments.report.doc_data import DataError, Source, md_table
from experiments.report.workers import BASE, Study

RUNS = "docs/results/workers/runs.json"
SEEDS = 3
DASH = "–"


def _study(src: Source, file: str) -> Study:
    data = src.json(file)
    if not isinstance(data, dict) or "study" not in data or "runs" not in data:
        raise DataError(file, "no 'study' and 'runs'")
    return Study(data)


def _pm(values: Sequence[float], fmt: str = "{:+.3f}") -> str:
    if len(values) < SEEDS:
        return DASH
    return f"{fmt.format(statistics.fmean(values))} ± {statistics.stdev(values):.3f}"


def _lr(value: float) -> str:
    return f"{value:g}"


def workers_status(src: Source, file: str = RUNS) -> str:
    """The runs so far, and the arms of each budget with every seed at their tuned point."""
    study = _study(src, file)
    parts = []
    for budget in study.budgets():
        arms = study.arms()
        done = [a["name"] for a in arms if study.done(budget, a["name"], SEEDS)]
        parts.append(
            f"{budget} ({study.tokens_per_param(budget):.1f} tokens per parameter): "
            f"{len(done)} of {len(arms)} arms"
        )
    return f"{len(study.runs)} runs; arms tuned with {SEEDS} seeds: " + "; ".join(parts) + "."


def workers_corpus(src: Source, file: str = RUNS) -> str:
    """The corpus and how much of it the largest budget draws, from the study's settings."""
    study = _study(src, file)
    corpus = study.settings["corpus"]
    train = corpus.get("train_tokens")
    if not isinstance(train, int):
        raise DataError(file, "study.corpus has no train_tokens")
    largest = max(b["steps"] for b in study.settings["budgets"].values())
    drawn = largest * study.settings["tokens_per_step"] / train
    return (
        f"{train:,} training and {corpus['val_tokens']:,} held-out tokens of Python sources "
        f"({corpus['vocab_size']:,}-token byte-level BPE); the largest budget draws "
        f"{100 * drawn:.0f}% of the training tokens' count, in random windows. Source: "
        f"{corpus['source']}."
    )


def workers_gap(src: Source, file: str = RUNS, budget: str = "small") -> str:
    """A row per arm: workers, tuned lr and beta1, final loss and its gap, paired by seed."""
    study = _study(src, file)
    if budget not in study.budgets():
        raise DataError(file, f"no budget {budget!r}")
    rows = []
    for arm in study.arms():
        name = arm["name"]
        point = study.tuned(budget, name)
        finals = list(study.finals(budget, name, point).values())
        gaps = study.gaps(budget, name) if name != BASE else {}
        edge = ", ".join(study.on_edge(budget, name)) or ""
        rows.append(
            [
                f"`{name}`",
                str(arm["workers"]),
                _lr(point[0]) if point else DASH,
                f"{point[1]:g}" if point else DASH,
                edge or ("no" if point else DASH),
                _pm(finals, "{:.3f}"),
                _pm(list(gaps.values())) if name != BASE else "0",
                " ".join(f"{g:+.3f}" for g in gaps.values()) if len(gaps) >= SEEDS else DASH,
            ]
        )
    header = ["arm", "N", "lr", "β1", "best on an edge", "eval/loss", "gap", "gap per seed"]
    return md_table(header, ["---", "---:", "---:", "---:", "---", "---:", "---:", "---"], rows)


def workers_fit(src: Source, file: str = RUNS) -> str:
    """A row per budget and topology: the fit ``gap = a + b log2 N`` over every seed's gap."""
    study = _study(src, file)
    rows = []
    for budget in study.budgets():
        for topology in ("one-peer-exp", "complete"):
            f = study.fit(budget, topology, SEEDS)
            cells = (
                [f"{f.b:+.4f}", f"{f.sd:.4f}", f"{f.at(4):+.3f}", f"{f.at(64):+.3f}", str(f.n)]
                if f
                else [DASH] * 5
            )
            tpp = f"{study.tokens_per_param(budget):.1f}"
            rows.append([budget, tpp, f"`{topology}`", *cells])
    header = ["budget", "tokens/param", "topology", "b: per doubling", "scatter (sd)"]
    header += ["fit at 4", "fit at 64", "gaps"]
    return md_table(header, ["---", "---:", "---", *["---:"] * 5], rows)


def workers_tuned(src: Source, file: str = RUNS) -> str:
    """A row per budget and arm: best beta1, and best lr as a multiple of ``allreduce``'s."""
    study = _study(src, file)
    rows = []
    for budget in study.budgets():
        base = study.tuned(budget, BASE)
        for arm in study.arms():
            point = study.tuned(budget, arm["name"])
            ratio = f"{point[0] / base[0]:.2f}x" if point and base else DASH
            rows.append(
                [
                    budget,
                    f"`{arm['name']}`",
                    f"{point[1]:g}" if point else DASH,
                    _lr(point[0]) if point else DASH,
                    ratio,
                ]
            )
    header = ["budget", "arm", "best β1", "best lr", "lr / allreduce's"]
    return md_table(header, ["---", "---", "---:", "---:", "---:"], rows)


def _closing(study: Study, budget: str, workers: int) -> dict[str, list[float]]:
    ope = f"one-peer-exp-{workers}"
    return {
        "one-peer-exp, β1 = 0.9": list(study.gaps(budget, ope, beta1=0.9).values()),
        "one-peer-exp, β1 tuned": list(study.gaps(budget, ope).values()),
        "complete, β1 tuned": list(study.gaps(budget, f"complete-{workers}").values()),
        "one-peer-exp + average every 8": list(study.gaps(budget, f"average8-{workers}").values()),
    }


def workers_closing(src: Source, file: str = RUNS) -> str:
    """At 32 and 64 workers: each remedy's gap and the share of the beta1 = 0.9 gap it closes."""
    study = _study(src, file)
    rows = []
    for budget in study.budgets():
        for workers in (32, 64):
            arms = _closing(study, budget, workers)
            start = arms["one-peer-exp, β1 = 0.9"]
            for label, gaps in arms.items():
                share = DASH
                if len(gaps) >= SEEDS and len(start) >= SEEDS and statistics.fmean(start) > 0:
                    closed = 1 - statistics.fmean(gaps) / statistics.fmean(start)
                    share = f"{100 * closed:.0f}%"
                rows.append([budget, str(workers), label, _pm(gaps), share])
    header = ["budget", "N", "arm", "gap", "of the β1 = 0.9 gap closed"]
    return md_table(header, ["---", "---:", "---", "---:", "---:"], rows)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if len(values) >= SEEDS else None


def workers_findings(src: Source, file: str = RUNS) -> str:
    """The answers to the page's questions, from the numbers (a dash where a run is missing)."""
    study = _study(src, file)
    small, large = study.budgets()[0], study.budgets()[-1]
    lines = []
    for n in (4, 8):
        arm = f"one-peer-exp-{n}"
        a, b = (
            _mean(list(study.gaps(small, arm).values())),
            _mean(list(study.gaps(large, arm).values())),
        )
        if a is None or b is None:
            lines.append(f"- `{arm}`: the gap at both budgets is not measured yet.")
            continue
        verb = "shrinks" if b < a else "does not shrink"
        lines.append(
            f"- At {n} workers the gap of `one-peer-exp` {verb} with the budget: {a:+.3f} at "
            f"{study.tokens_per_param(small):.0f} tokens per parameter, {b:+.3f} at "
            f"{study.tokens_per_param(large):.0f}."
        )
    for budget in study.budgets():
        base = study.tuned(budget, BASE)
        tuned = [
            study.tuned(budget, a["name"])
            for a in study.arms()
            if a["name"] != BASE and a["workers"] >= 4
        ]
        found = [t for t in tuned if t is not None]
        if base is None or not found:
            continue
        larger_b1 = sum(t[1] > base[1] for t in found)
        larger_lr = sum(t[0] > base[0] for t in found)
        lines.append(
            f"- {budget}: `allreduce` is best at β1 = {base[1]:g}, lr {_lr(base[0])}; of "
            f"{len(found)} decentralized arms tuned, {larger_b1} want a larger β1 and "
            f"{larger_lr} a larger lr."
        )
        for topology in ("one-peer-exp", "complete"):
            f = study.fit(budget, topology, SEEDS)
            if f is not None:
                lines.append(
                    f"- {budget}, `{topology}`: the gap grows by {f.b:+.4f} nats per doubling "
                    f"of the workers (scatter {f.sd:.4f} about the fit, {f.n} gaps)."
                )
        lines += _complete_against_ope(study, budget) + _closes_most(study, budget)
    return "\n".join(lines) if lines else "- No arm has every seed yet."


def _complete_against_ope(study: Study, budget: str) -> list[str]:
    """Where ``complete``'s gap is below ``one-peer-exp``'s, worker count by worker count."""
    below, above = [], []
    for n in sorted({a["workers"] for a in study.arms() if a["topology"] == "complete"}):
        c = _mean(list(study.gaps(budget, f"complete-{n}").values()))
        o = _mean(list(study.gaps(budget, f"one-peer-exp-{n}").values()))
        if c is not None and o is not None:
            (below if c < o else above).append(f"{n} ({c:+.3f} against {o:+.3f})")
    if not below and not above:
        return []
    parts = [f"below at {', '.join(below)}" if below else ""]
    parts.append(f"not below at {', '.join(above)}" if above else "")
    return [
        f"- {budget}: `complete`'s gap against `one-peer-exp`'s, at N workers: "
        + "; ".join(p for p in parts if p)
        + "."
    ]


def _closes_most(study: Study, budget: str) -> list[str]:
    """At 32 and 64 workers, the remedy that closes the most of the beta1 = 0.9 gap."""
    lines = []
    for workers in (32, 64):
        arms = {k: _mean(v) for k, v in _closing(study, budget, workers).items()}
        start = arms.pop("one-peer-exp, β1 = 0.9")
        done = {k: v for k, v in arms.items() if v is not None}
        if start is None or start <= 0 or len(done) < len(arms):
            continue
        label, gap = min(done.items(), key=lambda kv: kv[1])
        share = 1 - gap / start
        verb = "closes the most" if share > 0 else "closes none; the least harm comes from"
        lines.append(
            f"- {budget}, {workers} workers: of `one-peer-exp`'s {start:+.3f} at β1 = 0.9, "
            f"{label} {verb}: {100 * share:.0f}% (gap {gap:+.3f})."
        )
    return lines


def glance_row(src: Source, file: str = RUNS) -> list[str]:
    """The README's results-at-a-glance row: ``one-peer-exp``'s gap from 4 to 64 workers."""
    study = _study(src, file)
    parts = []
    for budget in study.budgets():
        at = {n: _mean(list(study.gaps(budget, f"one-peer-exp-{n}").values())) for n in (4, 64)}
        f = study.fit(budget, "one-peer-exp", SEEDS)
        if at[4] is None or at[64] is None or f is None:
            continue
        parts.append(
            f"{study.tokens_per_param(budget):.0f} tokens/param: **{at[4]:+.3f}** at 4 workers, "
            f"**{at[64]:+.3f}** at 64 ({f.b:+.3f} per doubling)"
        )
    measured = "; ".join(parts) if parts else f"running: {workers_status(src, file)}"
    return [
        "the gap of tuned `one-peer-exp` AdamW to `allreduce` at 4 to 64 packed workers",
        measured,
        "[workers](docs/results/workers/README.md)",
    ]


VIEWS: dict[str, Callable[..., str]] = {
    "workers-status": workers_status,
    "workers-corpus": workers_corpus,
    "workers-gap": workers_gap,
    "workers-fit": workers_fit,
    "workers-tuned": workers_tuned,
    "workers-closing": workers_closing,
    "workers-findings": workers_findings,
}
