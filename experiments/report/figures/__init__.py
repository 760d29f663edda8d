"""The docs' figures: one table naming where each comes from and how it is written.

A figure in prose is a span on its page, ``<!-- v:gap.w32.gap.mean -->+0.194<!-- /v -->``; a table
of figures is a generated block, ``<!-- data: figures id=gap.batch -->`` ... ``<!-- /data -->``.
:data:`FIGURES` maps each span's id to a :class:`Figure`: a function of a
:class:`~experiments.report.doc_data.Source` (which records the files it read) and a format.
:data:`TABLES` maps a table's id to its markdown, each ``{{figure-id}}`` in it a figure of
:data:`FIGURES`. ``python -m experiments.report.check_docs --write`` fills every span and
table from the data; the check (``make check-docs``) regenerates them and diffs.

An id says what the figure is without opening Python: study, arm or setting, statistic, as in
``gap.complete.seed1`` (the lm_gap study's ``complete`` arm, seed 1's final loss),
``gap.w8.gap.mean`` (the 8-window gap paired by seed, its mean) or ``wire.4x1.5mbit.ring.sps``.
One quantity has one id, whichever pages quote it. The figures are declared by study, in
``results`` (the wire and hierarchical studies, the CPU sweeps, the README), ``lm`` (lm,
streaming, outer), ``lm_gap``, ``other`` (compression, non-IID, performance, cluster, network and
simulation), ``wire`` (pair exchange, emulator with hosts, simulator), ``hosts`` (sharded
replicas) and ``elastic`` (elastic hosts, and the recovery guide's comparison under one kill);
the functions they call are in :mod:`~experiments.report.figures.sources`, and
:mod:`~experiments.report.figures.families` builds the repeated ones (an arm's seeds, mean
and sd; an lr grid; a gap paired by seed) and the table rows of them. To add a figure: give it
an id and a :class:`Figure` in its study's module, then write ``<!-- v:ID --><!-- /v -->`` where
it goes and run ``--write``.
"""

from __future__ import annotations

import re

from experiments.report.doc_data import DataError, Source
from experiments.report.figures import elastic, hosts, lm, lm_gap, other, results, wire
from experiments.report.figures.sources import Figure

__all__ = ["FIGURES", "TABLES", "Figure", "figure", "table"]

FIGURES: dict[str, Figure] = {
    **results.FIGURES,
    **lm.FIGURES,
    **lm_gap.FIGURES,
    **other.FIGURES,
    **wire.FIGURES,
    **hosts.FIGURES,
    **elastic.FIGURES,
}
TABLES: dict[str, str] = {
    **results.TABLES,
    **lm.TABLES,
    **lm_gap.TABLES,
    **other.TABLES,
    **wire.TABLES,
    **hosts.TABLES,
}

_SLOT = re.compile(r"\{\{([\w.-]+)\}\}")


def figure(src: Source, name: str) -> str:
    """Figure ``name`` as the page writes it, read through ``src``.

    Raises:
        DataError: the id is unknown, or its data is missing or does not parse.
    """
    if name not in FIGURES:
        raise DataError("-", f"unknown figure '{name}' (declare it in experiments/report/figures/)")
    return FIGURES[name].write(src)


def table(src: Source, id: str) -> str:  # noqa: A002 - the marker's argument is ``id=``
    """The view ``figures``: table ``id`` of :data:`TABLES` with each slot's figure filled in."""
    if id not in TABLES:
        raise DataError("-", f"unknown table '{id}' (declare it in experiments/report/figures/)")
    return _SLOT.sub(lambda m: figure(src, m[1]), TABLES[id])
