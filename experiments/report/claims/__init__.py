"""Figures in the docs' prose, each tied to the committed file it comes from.

A :class:`Claim` names a page and a pattern; each of the pattern's groups captures one figure as
written, and the claim's :class:`Value` of the same position says where it comes from (a function
of a :class:`~experiments.report.doc_data.Source`) and how it is rounded (a format string). The
check (``make check-docs``) compares the two, and fails where the pattern is no longer on its
page. Tables generated from data are not claims: they are views (``doc_views``).

``base`` holds the types and the sources; ``results``, ``lm``, ``other``, ``hosts`` (sharded
replicas and elastic hosts) and ``wire`` (pair exchange, emulator with hosts) the claims, by page.
To add a figure: write the sentence, then a claim on its page whose pattern matches it with the
number as a group, e.g. ``claim(PAGE, r"ends at (\\d\\.\\d{3}) nats", V(mean(DIR), "{:.3f}"))``.
"""

from __future__ import annotations

from experiments.report.claims import hosts, lm, other, results, wire
from experiments.report.claims.base import Claim, V, Value, claim, mean

__all__ = ["CLAIMS", "Claim", "V", "Value", "claim", "mean"]

CLAIMS: list[Claim] = [*results.CLAIMS, *lm.CLAIMS, *other.CLAIMS, *hosts.CLAIMS, *wire.CLAIMS]
