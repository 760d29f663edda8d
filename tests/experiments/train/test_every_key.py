"""Every ``train``, ``log`` and ``checkpoint`` key changes the run, or is refused in one line, on every path.

The keys come from the schema dataclasses (``tests/support/key_walk.py``): a new key
with no probe fails here. The paths are ``fault_tolerance`` none or torchft (two
elastic hosts on a lighthouse of the test's own), ``train.shard_size`` 1 or 2, with and
without ``outer=diloco``; each path's runs are real ``run(cfg)`` jobs of 4 steps.
The elastic path without an outer optimizer, the one that was a loop of its own,
walks in ``make test``; the others are ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.experiments.train.lm_corpus import lm_overrides, write_corpus
from tests.support import key_walk as kw

pytest.importorskip("torchft")


def test_every_key_of_the_walked_groups_has_a_probe() -> None:
    keys = kw.schema_keys()
    assert "train.shard_size" in keys and "checkpoint.on_signal" in keys
    missing = sorted(set(keys) - set(kw.PROBES))
    assert not missing, f"keys with no probe in tests/support/key_walk.py: {missing}"
    assert not set(kw.PROBES) - set(keys), "probes of keys the schemas no longer have"


def test_the_elastic_path_refuses_sharding_for_every_key_in_one_line() -> None:
    route = kw.ROUTES["torchft+shard2"]
    base = kw.refusal(route, (), 2)
    assert base is not None
    assert base.startswith("train.shard_size=2 cannot be elastic with fault_tolerance=torchft")
    for key in set(kw.schema_keys()) - {"train.shard_size"}:  # the path's own key
        reason = kw.refusal(route, kw.PROBES[key].variant, 2)
        assert reason is not None and "\n" not in reason, key
        assert "cannot be elastic with fault_tolerance=torchft" in reason, (key, reason)


def _walk(name: str, tmp_path: Path) -> None:
    route = kw.ROUTES[name]
    corpus = write_corpus(tmp_path / "corpus")
    lm = tuple(o for o in lm_overrides(corpus) if not o.startswith("train.max_steps"))
    seen = kw.walk(route, kw.schema_keys(), tmp_path / "runs", lm)
    silent = []
    for key in kw.schema_keys():
        if seen[key][0] == "refused":
            line = seen[key][1]
            probe = kw.PROBES[key]
            named = {key, *(o.split("=")[0] for o in probe.on(route) + probe.base)}
            assert "\n" not in line, (key, line)
            assert any(n in line for n in named), (key, line)  # the key (or what it needs)
            assert any(m in line for m in route.markers()), (key, line)  # and the path
            continue
        before, after, error = seen[key]
        if before == after:
            silent.append(f"{key}: {before!r} both ways ({error})")
    assert not silent, f"{name}: keys that changed nothing: {silent}"


def test_every_key_on_the_elastic_path(tmp_path: Path) -> None:
    _walk("torchft", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["none", "none+diloco", "shard2", "shard2+diloco", "torchft+diloco"]
)
def test_every_key_on_the_other_paths(name: str, tmp_path: Path) -> None:
    _walk(name, tmp_path)
