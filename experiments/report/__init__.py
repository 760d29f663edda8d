"""Report over finished runs: markdown tables and plots, seeds drawn as bands.

``python -m experiments.report SWEEP_OR_RUN_DIR... [--target-acc 0.9] [--out DIR]
[--tune KEY [--metric NAME]]`` (or ``make report``) finds every run directory under the
given directories (a directory holding ``metrics.jsonl`` and/or ``summary.json``, searched
recursively) and writes ``report.md`` and PNG plots into ``--out``, or into the first
given directory.

Runs that differ only in their seed form one *configuration*: Hydra's task overrides
(``.hydra/overrides.yaml``) minus ``train.seed``, plus the summary's topology, optim,
model, dataset, network and world size; without the overrides file, any other summary
field that varies across the runs too (:mod:`experiments.report.configs`). Every plot
draws a configuration as the mean over its seeds with a min-max band; the first field
that varies across configurations (the topology when it varies) is the colour, the second
the line style, and the legend names each value once.

Vision runs get, per configuration, the final ``eval/acc`` and ``eval/acc_local``, the
time ``time_s`` to reach ``--target-acc``, samples/s and the speedup over the ``allreduce``
runs of the same world size, dataset, model and network, and the mean and final consensus
distance, with four plots:

* ``consensus_vs_step.png``: consensus distance against steps (log y), exact values at
  evaluations and the count-sketch estimate (``consensus/distance_sketch``) thin;
* ``loss_vs_time.png``: training loss against wall-clock seconds;
* ``acc_vs_epoch.png``: accuracy of the globally averaged model against epochs;
* ``throughput.png``: mean samples/s of every configuration.

Language-model runs (``eval/ppl``, ``perf/tokens_per_s`` or a ``tokens`` count) get the final
``eval/loss`` and its gap to ``allreduce`` in nats, ``eval/ppl``, ``eval/loss_local``,
tokens/s and its ratio to ``allreduce``, with ``loss_vs_tokens.png`` and ``loss_vs_time.png``
(``eval/loss`` of the averaged model, ``train/loss`` thin). A sweep with both kinds reports
each in its own section (the language-model plots then start with ``lm_``). A table of
every run follows. Rows of emulated networks read ``(emulated <network>)`` and rows on
synthetic data ``(synthetic)``.

``--tune optim.lr`` (any override key) puts a ``Tuned: optim.lr`` section first: runs that
differ only in that key and the seed form a group, and each group's row gives the value
with the best mean final ``eval/loss`` (language models) or ``eval/acc`` (image runs; or
``--metric``), its mean ± std and seeds, every value tried, and ``edge: widen the grid``
when the best is the smallest or largest value tried. ``tuned.json`` holds the same for
scripts and ``tune_optim_lr.png`` plots the metric against the key; for a shell script,
``python -m experiments.report.tune DIR... --key optim.lr --best`` prints the best value
alone (:mod:`experiments.report.tune`).

``report_markdown`` gives the text of ``report.md`` alone, drawing and writing nothing (``make
check-docs`` compares the committed reports with it).

A run without a readable ``summary.json`` or without any valid metrics line is
skipped with a warning; single malformed lines are skipped too.
"""

from experiments.report.build import (
    LM_PLOTS,
    PLOTS,
    REPORT_FILE,
    build_report,
    main,
    report_markdown,
)
from experiments.report.configs import Band, Config, Factor, Section, band, make_section
from experiments.report.runs import Run, find_run_dirs, load_run

__all__ = [
    "Band",
    "Config",
    "Factor",
    "LM_PLOTS",
    "PLOTS",
    "REPORT_FILE",
    "Run",
    "Section",
    "band",
    "build_report",
    "find_run_dirs",
    "load_run",
    "main",
    "make_section",
    "report_markdown",
]
