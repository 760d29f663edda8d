"""The elastic overlap bench on the testbed, briefly (slow, root): both paths run and are timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchft")

from experiments.bench import elastic_overlap  # noqa: E402
from experiments.network import testbed as tb  # noqa: E402


@pytest.mark.slow
def test_both_elastic_paths_train_on_capped_links_and_are_timed(tmp_path: Path) -> None:
    why = tb.missing()
    if why is not None:
        pytest.skip(why)
    out = tmp_path / "overlap.json"
    elastic_overlap.main(
        ["--rate", "1gbit", "--hosts", "2", "--mb", "0.5", "--steps", "8", "--warmup", "2"]
        + ["--reps", "1", "--quorum-every", "4", "--port", "29890", "--out", str(out)]
    )
    result = json.loads(out.read_text())
    assert [r["path"] for r in result["runs"]] == ["backward", "step"]
    assert all(r["steps"] == 6 and r["step_s"] > 0 for r in result["runs"])
    assert result["step_over_backward"] == pytest.approx(
        result["step_s"]["step"] / result["step_s"]["backward"]
    )
