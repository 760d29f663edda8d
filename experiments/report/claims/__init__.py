"""Figures of the elastic pages' prose, each tied to its data by a pattern on its page.

Every other figure of the docs is a span or a generated table (:mod:`experiments.report.figures`);
the elastic pages' figures stay claims until those pages are turned into spans too. A
:class:`Claim` names a page and a pattern; each of the pattern's groups captures one figure as
written, and the claim's :class:`Value` of the same position says where it comes from (a function
of a :class:`~experiments.report.doc_data.Source`) and how it is rounded (a format string). The
check (``make check-docs``) compares the two, and fails where the pattern is no longer on its
page.
"""

from __future__ import annotations

from experiments.report.claims import hosts
from experiments.report.claims.base import Claim, V, Value, claim

__all__ = ["CLAIMS", "Claim", "V", "Value", "claim"]

CLAIMS: list[Claim] = [*hosts.CLAIMS]
