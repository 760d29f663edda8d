"""A language model trained end to end: ``train.py model=gpt dataset=tokens`` under torchrun.

Two gloo ranks train a tiny GPT on a tiny token directory that the test writes, as a
user would run ``torchrun --nproc_per_node=2 train.py model=gpt dataset=tokens
dataset.root=DIR``; the metrics file, the summary and the last line are checked. The
resume test (interrupted at step k, resumed to n, compared with a straight run) is
``slow``, as is the one-line error of a directory without a vocabulary size; the same
checks run in process, world size 1, in the fast suite
(``tests/experiments/train/test_lm.py``).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from tests.experiments.train.lm_corpus import (
    LM_EVAL_KEYS,
    LM_SUMMARY_KEYS,
    LM_TRAIN_KEYS,
    lm_overrides,
    write_corpus,
)
from tests.support.launch import QUIET, torchrun

JOB = [*QUIET, "topology=ring", "log.every=4", "log.consensus_every=0"]
LAST_LINE = re.compile(
    r"val loss (\d+\.\d{3}) nats vs unigram entropy (\d+\.\d{3}) nats of the corpus"
)


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_two_ranks_train_a_gpt_on_a_token_directory(tmp_path):
    root = write_corpus(tmp_path / "corpus")
    run_dir = tmp_path / "run"
    # 8 windows of 16 tokens per rank and step: 4 steps per epoch of 1024 tokens
    proc = torchrun(2, *JOB, *lm_overrides(root), "train.max_steps=12", f"hydra.run.dir={run_dir}")
    _ok(proc)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) >= LM_SUMMARY_KEYS and summary["world_size"] == 2
    assert summary["tokens"] == 12 * 2 * 8 * 16
    assert summary["eval/ppl"] == pytest.approx(math.exp(summary["eval/loss"]))
    lines = _lines(run_dir)
    assert all("tokens" in line for line in lines)
    train = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train] == [4, 8, 12]
    assert all(set(line) >= LM_TRAIN_KEYS for line in train)
    evals = [line for line in lines if "eval/loss" in line]
    assert [line["step"] for line in evals] == [4, 8, 12]
    assert all(set(line) >= LM_EVAL_KEYS for line in evals)
    # two workers on a ring hold different models: both losses, and a distance, are real
    assert evals[-1]["consensus/distance"] > 0
    assert evals[-1]["eval/loss"] != evals[-1]["eval/loss_local"]
    # all ranks' tokens per second, and MFU from one rank's share
    last = train[-1]
    assert last["perf/tokens_per_s"] == pytest.approx(last["perf/samples_per_s"] * 16)
    assert 0 < last["perf/mfu"] < 1
    # rank 0's last line compares the loss with the corpus's unigram entropy
    found = LAST_LINE.findall(proc.stdout + proc.stderr)
    assert len(found) == 1
    loss, entropy = map(float, found[0])
    assert loss == pytest.approx(summary["eval/loss"], abs=5e-4)
    assert entropy == pytest.approx(summary["unigram_entropy"], abs=5e-4)
    assert loss < entropy


@pytest.mark.slow  # validate() is checked in process in tests/experiments/train/test_lm.py
def test_no_vocabulary_stops_every_rank_with_one_line(tmp_path):
    root = write_corpus(tmp_path / "corpus", vocab_in_meta=False)
    proc = torchrun(2, *JOB, *lm_overrides(root), f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error")]
    assert len(errors) == 1, proc.stderr[-4000:]
    assert "ConfigError: vocab_size unknown" in errors[0] and "dataset.vocab_size" in errors[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_two_ranks_resume_bit_exactly(tmp_path):
    root = write_corpus(tmp_path / "corpus")
    common = [*JOB, *lm_overrides(root), "checkpoint.every_steps=3", "log.every=2"]
    straight, parted = tmp_path / "a", tmp_path / "b"
    _ok(torchrun(2, *common, "train.max_steps=10", f"hydra.run.dir={straight}"))
    # k = 6 ends a log window, so the lines after it cover the same steps in both runs
    _ok(torchrun(2, *common, "train.max_steps=6", f"hydra.run.dir={parted}"))
    _ok(torchrun(2, *common, "train.max_steps=10", f"hydra.run.dir={parted}"))
    a = json.loads((straight / "summary.json").read_text())
    b = json.loads((parted / "summary.json").read_text())
    assert b["resumed_from_step"] == 6
    for key in ("eval/loss", "eval/loss_local", "eval/ppl", "train/loss", "tokens"):
        assert b[key] == a[key], key
    keys = ("tokens", "train/loss", "train/lr", "eval/loss", "eval/loss_local", "eval/ppl")

    def after(run_dir: Path) -> list[dict]:
        rows = [line for line in _lines(run_dir) if line["step"] > 6]
        return [{k: line[k] for k in keys if k in line} for line in rows]

    assert after(parted) == after(straight)
