"""``python -m experiments.sample``: text from the newest checkpoint of tiny trained runs.

One ``train.py`` sweep (world size 1, a few steps, a checkpoint at the end) is run once
for the module, over three folders: a nanoGPT character folder (``meta.pkl``), a folder
of ``prepare_tokens`` (its BPE), and ids with a ``meta.json`` that gives the vocabulary
but no tokenizer, which has no decoder. The average over ranks is checked on a checkpoint
of three gloo ranks whose models differ; a trained two-rank run is in
``tests/e2e/test_sample.py`` (slow). ``generate`` is checked on models whose logits are
known: the context it crops, and the distribution at a temperature.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import experiments.train.config  # noqa: F401 - registers the schemas compose_config needs
from experiments import sample
from experiments.data.prepare_tokens import EOT, prepare
from experiments.data.tokenizer import CharTokenizer, load_tokenizer
from experiments.sample import AVERAGED_KEY, generate, load_sampler, main, model_state
from experiments.train.checkpoint import latest_checkpoint, load_shard, save_checkpoint
from tests.experiments.data.nanogpt_files import VERSE, write_bare_folder, write_char_folder
from tests.experiments.train.lm_corpus import lm_overrides
from tests.support.launch import QUIET, compose_config, launch

JOB = [*QUIET, "log.every=4", "log.consensus_every=0", "train.max_steps=8"]
JOB += ["checkpoint.every_steps=8"]
WORDS = ["alpha", "beta", "gamma", "delta", "stone", "river", "lamp", "quay", "night", "boat"]


def _train(*overrides: str, multirun: bool = False) -> None:
    mode = ["-m"] if multirun else []
    proc = launch([sys.executable, "train.py", *mode, *JOB, *overrides], timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _bpe_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    docs = [(f"d{i}", " ".join(rng.choice(WORDS, size=400)) + "\n") for i in range(6)]
    prepare(docs, root, source="word salad", vocab_size=300, val_fraction=0.34, progress=False)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``char``, ``bpe`` and ``bare``: the run directories of three tiny trainings."""
    # one sweep, so that one process starts: each job takes its vocabulary from its folder
    tmp = tmp_path_factory.mktemp("sample")
    with pytest.MonkeyPatch.context() as patch:  # no tokenizer thread pool before forks
        patch.setenv("TOKENIZERS_PARALLELISM", "false")
        bpe = _bpe_folder(tmp / "bpe")
    chars = write_char_folder(tmp / "chars")
    bare = write_bare_folder(tmp / "ids", vocab=50)
    (bare / "meta.json").write_text('{"vocab_size": 50}')
    job = [o for o in lm_overrides(chars) if not o.startswith("dataset.root=")]
    folders = f"dataset.root={chars},{bpe},{bare}"
    _train(*job, folders, f"hydra.sweep.dir={tmp / 'sweep'}", multirun=True)
    return {name: tmp / "sweep" / str(i) for i, name in enumerate(("char", "bpe", "bare"))}


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sample: error: "), err
    return err[0]


def test_char_run_writes_its_characters_deterministically(runs):
    sampler = load_sampler(runs["char"])
    assert isinstance(sampler.tokenizer, CharTokenizer) and sampler.step == 8
    assert sampler.context == 16
    text = sampler.write("the river ", 60, seed=1)
    # one character per token, every one from the corpus
    assert text.startswith("the river ") and len(text) == len("the river ") + 60
    assert set(text) <= set(VERSE)
    assert sampler.write("the river ", 60, seed=1) == text
    assert sampler.write("the river ", 60, seed=2) != text
    assert sampler.write("the river ", 60, seed=1, temperature=2.0) != text
    # top-k 1 leaves one candidate: the draw no longer depends on the seed
    greedy = sampler.write("the river ", 30, seed=1, top_k=1)
    assert sampler.write("the river ", 30, seed=2, top_k=1) == greedy
    # a prompt longer than the context is cropped to the last 16 tokens, not refused
    long = VERSE[:40]
    assert sampler.write(long, 5, seed=1).startswith(long)
    # the default prompt is a newline, as in nanoGPT
    assert sampler.write(None, 10, seed=1).startswith("\n")


def test_one_worker_s_own_model_is_the_average(runs):
    info = latest_checkpoint(runs["char"] / "checkpoints")
    own, averaged = model_state(info, 0), model_state(info)
    assert own.keys() == averaged.keys()
    assert all(torch.equal(own[k], averaged[k]) for k in own)
    a = load_sampler(runs["char"]).write("the ", 40, seed=5)
    assert load_sampler(runs["char"], rank=0).write("the ", 40, seed=5) == a


def test_bpe_run_decodes_with_the_tokenizer_prepare_tokens_saved(runs):
    sampler = load_sampler(runs["bpe"])
    root = Path(str(sample.load_config(runs["bpe"]).dataset.root))
    assert sampler.tokenizer.kind == "bpe"
    assert sampler.tokenizer.vocab_size == load_tokenizer(root).vocab_size
    text = sampler.write("stone river", 40, seed=1)
    assert text.startswith("stone river") and len(text) > len("stone river")
    assert sampler.write("stone river", 40, seed=1) == text
    assert sampler.write("stone river", 40, seed=3) != text
    # the ids it drew decode back: the text re-encodes to at least the prompt and more
    assert len(sampler.tokenizer.encode(text)) > len(sampler.tokenizer.encode("stone river"))
    eot = sampler.tokenizer.encode(EOT)
    assert eot and sampler.tokenizer.decode(eot) == EOT  # special tokens stay visible


def test_the_command_line_prints_the_sample(runs):
    args = ["--tokens", "24", "--seed", "3", "--temperature", "0.9", "--top-k", "10"]
    proc = launch([sys.executable, "-m", "experiments.sample", str(runs["char"]), *args])
    assert proc.returncode == 0, proc.stderr
    expected = load_sampler(runs["char"]).write(None, 24, seed=3, temperature=0.9, top_k=10)
    assert proc.stdout == expected + "\n"
    assert proc.stderr == ""


def test_command_line_flags_in_process(runs, capsys):
    run = str(runs["bpe"])
    assert main([run, "--prompt", "boat", "--tokens", "12", "--rank", "0", "--top-k", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("boat") and out.endswith("\n")
    expected = load_sampler(runs["bpe"], rank=0).write("boat", 12, seed=0, top_k=None)
    assert out == expected + "\n"


def test_a_run_without_a_decoder_is_one_line(runs, capsys):
    line = _error(capsys, str(runs["bare"]))
    assert "ids has no decoder" in line and "tokenizer_file" in line and "meta.pkl" in line


def test_other_errors_are_one_line(runs, tmp_path, capsys):
    assert "run directory" in _error(capsys, str(tmp_path / "missing"))
    assert "has no .hydra/config.yaml" in _error(capsys, str(tmp_path))
    # the same run without its checkpoints
    shutil.copytree(runs["char"], tmp_path / "copy", ignore=shutil.ignore_patterns("checkpoints"))
    assert "holds no complete checkpoint" in _error(capsys, str(tmp_path / "copy"))
    line = _error(capsys, str(runs["char"]), "--prompt", "THE Quay")
    assert "--prompt cannot be encoded" in line and "'E', 'H', 'Q', 'T'" in line
    assert "rank 1 is not in the checkpoint" in _error(capsys, str(runs["char"]), "--rank", "1")
    assert "--temperature=0.0 must be > 0" in _error(
        capsys, str(runs["char"]), "--temperature", "0"
    )
    assert "--prompt is empty" in _error(capsys, str(runs["char"]), "--prompt", "")
    assert "is not a torch device" in _error(capsys, str(runs["char"]), "--device", "gpu0")


@pytest.mark.gpu
def test_sampling_on_cuda_is_seeded_too(runs):
    sampler = load_sampler(runs["char"], device="cuda")
    assert next(sampler.model.parameters()).is_cuda
    text = sampler.write("the ", 40, seed=4)
    assert len(text) == 44 and set(text) <= set(VERSE)
    assert sampler.write("the ", 40, seed=4) == text


def test_a_saved_config_that_is_broken_or_not_a_language_model(tmp_path, capsys):
    config = tmp_path / ".hydra" / "config.yaml"
    config.parent.mkdir()
    config.write_text("model: [unclosed\n  x: : y\n")
    assert "config.yaml does not parse: " in _error(capsys, str(tmp_path))
    OmegaConf.save(compose_config(), config)  # what Hydra saves for the default job
    assert "trained model=small_cnn, not a language model" in _error(capsys, str(tmp_path))


def test_a_stored_average_is_taken_as_it_is(tmp_path):
    own = {"w": torch.ones(3)}
    mean = {"w": torch.full((3,), 0.5)}
    save_checkpoint(tmp_path, 4, {"model": own, AVERAGED_KEY: mean}, {"topology": "ring"})
    info = latest_checkpoint(tmp_path)
    assert torch.equal(model_state(info)["w"], mean["w"])
    assert torch.equal(model_state(info, 0)["w"], own["w"])
    assert load_shard(info, 0)["model"]["w"].sum() == 3


def test_generate_masks_ids_the_tokenizer_cannot_decode():
    class Uniform(torch.nn.Module):
        """Logits that favour id 9, beyond a vocabulary of 4: it must never be drawn."""

        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, idx):
            logits = torch.zeros(*idx.shape, 10)
            logits[..., 9] = 50.0
            return logits

    gen = torch.Generator().manual_seed(0)
    ids = generate(Uniform(), [0], 200, context=4, generator=gen, vocab_limit=4)
    assert len(ids) == 201 and max(ids) < 4 and len(set(ids[1:])) == 4
    assert max(generate(Uniform(), [0], 20, context=4, generator=gen)) == 9
    with pytest.raises(ValueError, match="at least one token"):
        generate(Uniform(), [], 1, context=4)


def test_checkpoint_folder_is_the_trainer_s():
    from experiments.train.trainer import CHECKPOINT_DIR

    assert sample.CHECKPOINT_DIR == CHECKPOINT_DIR


def _save_worker(rank: int, world: int, root: str, states: list[dict[str, torch.Tensor]]) -> int:
    """Each gloo rank saves its own model as its shard of one checkpoint."""
    save_checkpoint(root, 8, {"model": states[rank]}, {"topology": "ring"})
    return rank


def test_the_average_of_three_ranks_is_the_mean_of_their_shards(runs, tmp_path):
    """A checkpoint of three ranks whose models differ: the sampled model is their mean."""
    from tests.support.dist_harness import ok_values, run_distributed

    run = tmp_path / "run"
    shutil.copytree(runs["char"], run, ignore=shutil.ignore_patterns("checkpoints"))
    model = load_sampler(runs["char"]).model
    g = torch.Generator().manual_seed(0)
    states = []
    for _ in range(3):  # moved by parameter, so that tied weights stay tied
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    base = states[0]
    ok_values(run_distributed(_save_worker, 3, str(run / "checkpoints"), states))
    info = latest_checkpoint(run / "checkpoints")
    assert info is not None and info.world_size == 3
    mean = {k: torch.stack([s[k].double() for s in states]).mean(0).float() for k in base}
    loaded = load_sampler(run).model.state_dict()
    for key, value in mean.items():
        torch.testing.assert_close(loaded[key], value, msg=key)
        torch.testing.assert_close(model_state(info)[key], value, msg=key)
    for r in range(3):  # --rank R is that rank's own shard, not the mean
        own = load_sampler(run, rank=r).model.state_dict()
        assert all(torch.equal(own[k], states[r][k]) for k in base)
        assert not all(torch.equal(loaded[k], states[r][k]) for k in base)


class _Counter(torch.nn.Module):
    """Certain to write the id after the last one it sees; remembers what it was shown."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.seen.append(idx[0].tolist())
        logits = torch.full((*idx.shape, self.vocab), -1e4)
        logits[0, -1, (int(idx[0, -1]) + 1) % self.vocab] = 0.0
        return logits


def test_generate_crops_the_context_to_its_last_tokens():
    model = _Counter(vocab=50)
    prompt = list(range(10))
    ids = generate(model, prompt, 6, context=4, generator=torch.Generator().manual_seed(0))
    assert ids == list(range(16))  # each new id follows the true last one
    for i, seen in enumerate(model.seen):
        assert seen == ids[: 10 + i][-4:], (i, seen)


class _Fixed(torch.nn.Module):
    """The same logits at every position: 0, 1, 2, 3."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.arange(4.0).expand(*idx.shape, 4)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_generate_draws_from_the_softmax_of_logits_over_temperature(temperature: float):
    n = 4000
    gen = torch.Generator().manual_seed(1)
    ids = generate(_Fixed(), [0], n, context=2, temperature=temperature, generator=gen)
    counts = torch.bincount(torch.tensor(ids[1:]), minlength=4).double() / n
    expected = torch.softmax(torch.arange(4.0, dtype=torch.float64) / temperature, dim=0)
    # four standard deviations of a frequency over 4000 draws are under 0.032
    torch.testing.assert_close(counts, expected, rtol=0, atol=0.032)
