"""Sampling a two-rank run: the averaged model is the mean of the workers' own models.

Two gloo ranks on a ring train a tiny GPT on a nanoGPT character folder the test writes
(``meta.pkl`` only, no extra keys), as ``torchrun --nproc_per_node=2 train.py model=gpt
dataset=tokens dataset.root=DIR`` would; then ``python -m experiments.sample`` writes
from the average and from each rank. World size 1 is in the fast suite
(``tests/experiments/test_sample.py``).
"""

from __future__ import annotations

import sys

import pytest
import torch

from experiments.sample import model_state
from experiments.train.checkpoint import latest_checkpoint, load_shard
from tests.experiments.data.nanogpt_files import VERSE, write_char_folder
from tests.experiments.train.lm_corpus import lm_overrides
from tests.support.launch import QUIET, launch, torchrun

JOB = [*QUIET, "topology=ring", "log.every=4", "log.consensus_every=0"]


@pytest.mark.slow
def test_two_ranks_sample_from_their_average_and_from_each_rank(tmp_path):
    root = write_char_folder(tmp_path / "chars")
    run_dir = tmp_path / "run"
    overrides = [*lm_overrides(root), "train.max_steps=8", "checkpoint.every_steps=8"]
    proc = torchrun(2, *JOB, *overrides, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = latest_checkpoint(run_dir / "checkpoints")
    assert info is not None and info.world_size == 2
    own = [load_shard(info, r)["model"] for r in range(2)]
    averaged = model_state(info)
    for key, value in averaged.items():
        assert torch.allclose(value, (own[0][key] + own[1][key]) / 2, atol=1e-6), key
    # workers on a ring hold different models, so the average is neither of them
    assert not all(torch.equal(averaged[k], own[0][k]) for k in averaged)
    for extra in ([], ["--rank", "0"], ["--rank", "1"]):
        args = [sys.executable, "-m", "experiments.sample", str(run_dir), "--tokens", "50"]
        out = launch([*args, "--seed", "1", *extra])
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("\n") and len(out.stdout) == 1 + 50 + 1
        assert set(out.stdout) <= set(VERSE)
    bad = launch([sys.executable, "-m", "experiments.sample", str(run_dir), "--rank", "2"])
    assert bad.returncode == 1 and "rank 2 is not in the checkpoint" in bad.stderr
    assert bad.stderr.count("\n") == 1
