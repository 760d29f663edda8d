"""Language-model training through run(cfg): config checks, metrics, bit-exact resume.

In-process runs use world size 1; the multi-rank job under torchrun is in
``tests/e2e/test_lm_training.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from experiments.train.checkpoint import latest_checkpoint, load_shard
from experiments.train.optim import build_scheduler_fn
from experiments.train.run import ConfigError, run, validate
from experiments.train.trainer import per_worker_batch
from tests.experiments.train.lm_corpus import (
    LM_EVAL_KEYS,
    LM_SUMMARY_KEYS,
    LM_TRAIN_KEYS,
    lm_overrides,
    write_corpus,
)
from tests.support.launch import compose_config

QUICK = ["logger=none", "log.progress=false", "log.every=4", "log.consensus_every=0"]
TRAIN_KEYS = LM_TRAIN_KEYS | {"step", "epoch", "time_s", "train/lr", "perf/samples_per_s"}
SUMMARY_KEYS = LM_SUMMARY_KEYS | {"train/loss", "consensus/distance", "train/steps"}


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


def _cfg(root: Path, *overrides: str):
    return compose_config(*QUICK, *lm_overrides(root), *overrides)


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- checks before any collective


@pytest.mark.parametrize(
    ("overrides", "world_size", "needle"),
    [
        (["dataset.block_size=32"], 1, "dataset.block_size=32 is invalid; it must be <= the model"),
        (["train.global_batch_size=10"], 4, "train.global_batch_size=10 is invalid"),
        (["dataset.root=/nonexistent/tokens"], 1, "holds no train.bin"),
        (["scheduler=cosine_warmup", "scheduler.warmup_steps=-1"], 1, "scheduler.warmup_steps"),
        (["log.peak_flops=0"], 1, "log.peak_flops=0"),
        (["model.compile=fast"], 1, "model.compile=fast is invalid"),
    ],
)
def test_validate_rejects_lm_configs_with_one_line(
    corpus, overrides, world_size, needle, monkeypatch
):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError) as info:
        validate(_cfg(corpus, *overrides), world_size)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_language_model_and_an_image_dataset_do_not_mix(corpus, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="^dataset=digits is invalid with model=gpt; a language"):
        validate(compose_config(*QUICK, "model=gpt"), 1)
    tokens = compose_config(*QUICK, "dataset=tokens", f"dataset.root={corpus}")
    with pytest.raises(ConfigError, match="^dataset=tokens is invalid with model=small_cnn; "):
        validate(tokens, 1)


def test_unknown_vocabulary_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    root = write_corpus(tmp_path / "novocab", vocab_in_meta=False)
    with pytest.raises(ConfigError, match="^vocab_size unknown: .*set dataset.vocab_size"):
        validate(_cfg(root), 1)
    validate(_cfg(root, "dataset.vocab_size=32"), 1)  # given on the command line: fine


def test_dataset_block_size_may_be_shorter_than_the_model(corpus, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    validate(_cfg(corpus, "dataset.block_size=8"), 1)


def test_global_batch_size_is_split_over_the_workers():
    train = compose_config("train.global_batch_size=480").train
    assert per_worker_batch(train, 16) == 30 and per_worker_batch(train, 480) == 1
    assert per_worker_batch(compose_config().train, 16) == compose_config().train.batch_size
    with pytest.raises(ConfigError, match="^train.global_batch_size=480 is invalid; .* 7$"):
        per_worker_batch(train, 7)


def test_warmup_steps_override_warmup_epochs():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    by_steps = compose_config("scheduler=cosine_warmup", "scheduler.warmup_steps=3").scheduler
    scheduler = build_scheduler_fn(by_steps, steps_per_epoch=100, total_steps=10)(optimizer)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.01) and lrs[3] == pytest.approx(1.0)  # 3 steps, not 100
    assert lrs[1] < lrs[2] < lrs[3]


# ---------------------------------------------------------------- in-process runs


def test_lm_run_logs_token_metrics_and_learns(corpus, tmp_path, world_of_one):
    run_dir = tmp_path / "run"
    summary = run(_cfg(corpus, "train.max_steps=16"), run_dir=run_dir)
    assert set(summary) >= SUMMARY_KEYS
    assert summary["model"] == "gpt" and summary["dataset"] == "tokens"
    assert summary["tokens"] == 16 * 8 * 16 and summary["train/steps"] == 16
    assert summary["eval/ppl"] == pytest.approx(math.exp(summary["eval/loss"]))
    entropy = json.loads((corpus / "meta.json").read_text())["unigram_entropy"]
    assert summary["unigram_entropy"] == pytest.approx(entropy)
    # the chain is learnable: the model beats the unigram entropy within 16 steps
    assert summary["eval/loss"] < entropy - 0.3
    lines = _lines(run_dir)
    assert all("tokens" in line for line in lines)
    train = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train] == [4, 8, 12, 16]
    assert all(set(line) >= TRAIN_KEYS and "train/acc" not in line for line in train)
    assert [line["tokens"] for line in train] == [s * 8 * 16 for s in (4, 8, 12, 16)]
    evals = [line for line in lines if "eval/loss" in line]
    assert [line["step"] for line in evals] == [8, 16]  # every epoch of 8 steps
    assert all(set(line) >= LM_EVAL_KEYS and "eval/acc" not in line for line in evals)
    assert evals[-1]["eval/loss"] == summary["eval/loss"]
    # one worker: the averaged model is the worker's own
    assert evals[-1]["eval/loss_local"] == evals[-1]["eval/loss"]
    # MFU is 6 N (tokens/s of one rank) / log.peak_flops
    from experiments.models.gpt import build_gpt

    model = build_gpt(compose_config(*lm_overrides(corpus)).model, vocab_size=32)
    line = train[-1]
    assert line["perf/tokens_per_s"] == pytest.approx(line["perf/samples_per_s"] * 16)
    expected = model.flops_per_token() * line["perf/tokens_per_s"] / 312e12
    assert line["perf/mfu"] == pytest.approx(expected)


def test_lm_resume_repeats_the_windows_and_the_curve(corpus, tmp_path, world_of_one):
    common = ["checkpoint.every_steps=4", "log.every=2"]
    straight = run(_cfg(corpus, *common, "train.max_steps=14"), run_dir=tmp_path / "a")
    first = run(_cfg(corpus, *common, "train.max_steps=6"), run_dir=tmp_path / "b")
    assert first["train/steps"] == 6
    shard = load_shard(latest_checkpoint(tmp_path / "b" / "checkpoints"), 0)
    assert shard["loader"] == {"epoch": 0, "batch": 6}  # beside every key shards always had
    assert {"model", "training", "rng", "step", "epoch", "batch", "window", "history"} <= set(shard)
    resumed = run(_cfg(corpus, *common, "train.max_steps=14"), run_dir=tmp_path / "b")
    assert resumed["resumed_from_step"] == 6 and resumed["train/steps"] == 14
    for key in ("eval/loss", "eval/loss_local", "eval/ppl", "train/loss", "tokens"):
        assert resumed[key] == straight[key], key
    keys = ("tokens", "train/loss", "train/lr", "eval/loss", "eval/loss_local", "eval/ppl")

    def after(run_dir: Path) -> list[dict]:
        return [
            {k: line[k] for k in keys if k in line} for line in _lines(run_dir) if line["step"] > 6
        ]

    assert after(tmp_path / "b") == after(tmp_path / "a")
    info_a = latest_checkpoint(tmp_path / "a" / "checkpoints")
    info_b = latest_checkpoint(tmp_path / "b" / "checkpoints")
    sa, sb = load_shard(info_a, 0), load_shard(info_b, 0)
    assert sa["loader"] == sb["loader"] == {"epoch": 1, "batch": 6}
    for key in sa["model"]:
        assert torch.equal(sa["model"][key], sb["model"][key]), key


@pytest.mark.parametrize(
    "mode",
    [
        "off",
        pytest.param("per_block", marks=pytest.mark.slow),
        pytest.param("whole", marks=pytest.mark.slow),
    ],
)
def test_lm_resume_under_every_compile_mode(mode, corpus, tmp_path, world_of_one):
    """A compiled run saves the bare model's keys and resumes where the straight run ends.

    Eager and block-by-block compiled runs repeat it bit for bit. A model
    compiled whole does not repeat even two straight runs bit for bit on CPU
    (its first, compiling call rounds differently from the cached one), so
    there the models agree to float32 rounding.
    """
    common = ["checkpoint.every_steps=3", "log.every=3", f"model.compile={mode}"]
    straight = run(_cfg(corpus, *common, "train.max_steps=6"), run_dir=tmp_path / "a")
    run(_cfg(corpus, *common, "train.max_steps=3"), run_dir=tmp_path / "b")
    shard = load_shard(latest_checkpoint(tmp_path / "b" / "checkpoints"), 0)
    assert not any(k.startswith("_orig_mod.") for k in shard["model"])
    resumed = run(_cfg(corpus, *common, "train.max_steps=6"), run_dir=tmp_path / "b")
    assert resumed["resumed_from_step"] == 3 and resumed["train/steps"] == 6
    sa = load_shard(latest_checkpoint(tmp_path / "a" / "checkpoints"), 0)["model"]
    sb = load_shard(latest_checkpoint(tmp_path / "b" / "checkpoints"), 0)["model"]
    assert sa.keys() == sb.keys()
    if mode == "whole":
        for k in sa:
            torch.testing.assert_close(sb[k], sa[k], rtol=1e-5, atol=1e-6)
        assert resumed["eval/loss"] == pytest.approx(straight["eval/loss"], abs=1e-5)
        return
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for key in ("eval/loss", "train/loss", "tokens"):
        assert resumed[key] == straight[key], key


def test_checkpoint_keys_of_a_compiled_model_from_older_runs_still_load() -> None:
    from experiments.train.step import plain_keys

    state = {"_orig_mod.wte.weight": torch.ones(2), "_orig_mod.h.0.ln.bias": torch.zeros(1)}
    assert list(plain_keys(state)) == ["wte.weight", "h.0.ln.bias"]
    plain = {"wte.weight": torch.ones(2)}
    assert plain_keys(plain) is plain
