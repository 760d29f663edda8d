"""Text from a trained language model: ``python -m experiments.sample RUN_DIR``.

Examples::

    python -m experiments.sample outputs/2025-01-01/12-00-00
    python -m experiments.sample RUN_DIR --prompt "def main(" --tokens 300 --temperature 0.7
    python -m experiments.sample RUN_DIR --rank 3 --seed 7 --top-k 50 --device cuda

What it does. It reads the run's config from ``RUN_DIR/.hydra/config.yaml`` (the one
``train.py`` saved), finds the newest complete checkpoint in ``RUN_DIR/checkpoints`` and
loads its averaged model: the mean of every rank's shard, as the trainer's ``eval/loss``
sees it, or the one the checkpoint stores under :data:`AVERAGED_KEY`; ``--rank R`` loads
worker ``R``'s own model instead. The model is rebuilt from the config's ``model``
section with the vocabulary of its ``dataset`` section. The tokenizer is the data's
(:func:`experiments.data.tokenizer.load_tokenizer`): the BPE that ``prepare_tokens``
saved, or nanoGPT's ``stoi`` / ``itos`` from ``meta.pkl``.

Generation. From the prompt (by default a newline, or token 0 where a newline does not
encode), one token at a time: the context is cropped to the run's window (the model's
block size unless ``dataset.block_size`` was shorter), the last position's logits are
divided by ``--temperature``, all but the ``--top-k`` largest are dropped, and the next
token is drawn from the softmax by a ``torch.Generator`` seeded with ``--seed``, so the
same seed gives the same text. Ids the tokenizer cannot decode (a vocabulary padded to a
multiple of 64) are never drawn. The prompt and what follows are printed to stdout.

Errors (no run directory, no saved config, no checkpoint, no decoder, a prompt the
vocabulary cannot encode) are one line on stderr, with exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn

from experiments.data.tokenizer import Tokenizer, load_tokenizer
from experiments.data.tokens import token_sizes
from experiments.models import build_model
from experiments.models.schema import LANGUAGE_MODELS
from experiments.train.checkpoint import CheckpointInfo, latest_checkpoint, load_shard
from experiments.train.reshard import global_average_from_checkpoint

__all__ = [
    "AVERAGED_KEY",
    "CONFIG_FILE",
    "CHECKPOINT_DIR",
    "Sampler",
    "load_config",
    "model_state",
    "load_sampler",
    "generate",
    "main",
]

CONFIG_FILE = Path(".hydra") / "config.yaml"
"""Where ``train.py`` (Hydra) saves a run's config, under the run directory."""

AVERAGED_KEY = "averaged_model"
"""A key of rank 0's shard that, where present, holds the averaged model ready-made."""

CHECKPOINT_DIR = "checkpoints"
"""The trainer's checkpoint folder under a run directory (``trainer.CHECKPOINT_DIR``).

Named here, not imported: the trainer's module brings the whole training loop with it."""

_COMPILED_PREFIX = "_orig_mod."  # the state dict keys of a model under model.compile=whole


def load_config(run_dir: Path) -> DictConfig:
    """The config a language-model run was trained with.

    Args:
        run_dir: The run directory.

    Returns:
        The config ``train.py`` saved there.

    Raises:
        FileNotFoundError: One line, if the directory or its saved config is missing.
        ValueError: One line, if the config does not parse or names no language model.
    """
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} not found")
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no {CONFIG_FILE}, the config train.py saves; give the directory "
            "of a run that train.py made"
        )
    try:
        cfg = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"{path} does not parse: {reason}") from None
    if not isinstance(cfg, DictConfig) or "model" not in cfg or "dataset" not in cfg:
        raise ValueError(f"{path} has no model and dataset sections")
    name = str(cfg.model.get("name"))
    if name not in LANGUAGE_MODELS:
        raise ValueError(
            f"{run_dir} trained model={name}, not a language model "
            f"({', '.join(sorted(LANGUAGE_MODELS))}); there is nothing to sample"
        )
    return cfg


def model_state(info: CheckpointInfo, rank: int | None = None) -> dict[str, Any]:
    """The model state of a checkpoint: the averaged model, or one rank's.

    Args:
        info: The checkpoint.
        rank: ``None`` for the averaged model (the one rank 0's shard stores under
            :data:`AVERAGED_KEY` if any, else the mean over every rank's shard), or a
            rank whose own model to take.

    Returns:
        The model's state dict, on the CPU.

    Raises:
        ValueError: One line, if the rank is not in the checkpoint or a shard is bad.
    """
    if rank is not None:
        return _model_of(load_shard(info, rank), info, rank)
    first = load_shard(info, 0)
    if AVERAGED_KEY in first:
        return dict(first[AVERAGED_KEY])
    if info.world_size == 1:  # one worker: its model is the average
        return _model_of(first, info, 0)
    del first
    return global_average_from_checkpoint(info, key="model")


def _model_of(shard: dict[str, Any], info: CheckpointInfo, rank: int) -> dict[str, Any]:
    if "model" not in shard:
        raise ValueError(f"shard {rank} of {info.path} has no model; it has {sorted(shard)}")
    return dict(shard["model"])


@dataclass
class Sampler:
    """A trained language model with its tokenizer, ready to write.

    Attributes:
        model: The model, in eval mode, on ``device``.
        tokenizer: The run's tokenizer.
        context: The longest context the model is given (the run's window).
        step: The training step of the checkpoint.
        device: Where the model runs.
    """

    model: nn.Module
    tokenizer: Tokenizer
    context: int
    step: int
    device: torch.device

    def prompt_ids(self, prompt: str | None) -> list[int]:
        """The ids of ``prompt``; by default a newline, or token 0 if it does not encode.

        Raises:
            ValueError: One line, if the prompt is empty or has characters the
                vocabulary lacks.
        """
        if prompt is None:
            try:
                ids = self.tokenizer.encode("\n")
            except ValueError:
                ids = []
            return ids or [0]
        if prompt == "":
            raise ValueError("--prompt is empty; give at least one character, or leave it out")
        try:
            ids = self.tokenizer.encode(prompt)
        except ValueError as exc:
            raise ValueError(f"--prompt cannot be encoded: {exc}") from None
        if not ids:
            raise ValueError(f"--prompt {prompt!r} encodes to no token")
        return ids

    def write(
        self,
        prompt: str | None = None,
        tokens: int = 256,
        *,
        temperature: float = 0.8,
        top_k: int | None = 200,
        seed: int = 0,
    ) -> str:
        """The prompt and ``tokens`` tokens the model writes after it, decoded.

        Args:
            prompt: The text to continue; ``None`` for the default (see :meth:`prompt_ids`).
            tokens: How many tokens to generate.
            temperature: Divides the logits; below 1 sharpens, above 1 flattens.
            top_k: Draw only among the ``top_k`` likeliest tokens; ``None`` for all.
            seed: Seeds the draws; the same seed gives the same text.

        Returns:
            The decoded text, the prompt included.
        """
        generator = torch.Generator(device=self.device).manual_seed(seed)
        ids = generate(
            self.model,
            self.prompt_ids(prompt),
            tokens,
            context=self.context,
            temperature=temperature,
            top_k=top_k,
            generator=generator,
            vocab_limit=self.tokenizer.vocab_size,
        )
        return self.tokenizer.decode(ids)


def _section(cfg: DictConfig, key: str, run_dir: Path) -> dict[str, Any]:
    """A section of the saved config as a plain dict, its interpolations resolved."""
    try:
        section = OmegaConf.to_container(cfg[key], resolve=True)
    except OmegaConfBaseException as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"the {key} section of {run_dir / CONFIG_FILE}: {reason}") from None
    if not isinstance(section, dict):
        raise ValueError(f"the {key} section of {run_dir / CONFIG_FILE} is not a mapping")
    return {str(k): v for k, v in section.items()}


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here")
    return device


def load_sampler(run_dir: Path, *, rank: int | None = None, device: str = "cpu") -> Sampler:
    """The newest checkpoint of a run, with its model rebuilt and its tokenizer.

    Args:
        run_dir: The run directory (``train.py``'s output directory).
        rank: ``None`` for the averaged model, else that rank's own.
        device: Where the model runs.

    Returns:
        The :class:`Sampler`.

    Raises:
        FileNotFoundError: One line, for a missing run directory, saved config or checkpoint.
        ValueError: One line, for a run without a decoder, a bad rank, a bad shard, or a
            checkpoint whose model does not fit the config.
    """
    cfg = load_config(run_dir)
    where = _device(device)
    info = latest_checkpoint(run_dir / CHECKPOINT_DIR)
    if info is None:
        raise FileNotFoundError(
            f"{run_dir / CHECKPOINT_DIR} holds no complete checkpoint; train with "
            "checkpoint.every_steps=N to save some"
        )
    model_cfg, data_cfg = _section(cfg, "model", run_dir), _section(cfg, "dataset", run_dir)
    tokenizer = load_tokenizer(Path(str(data_cfg.get("root"))))
    block = model_cfg.get("block_size")
    context, vocab = token_sizes(data_cfg, None if block is None else int(block))
    # sampling runs eagerly: compiling would cost more than the few forwards it makes
    model = build_model({**model_cfg, "compile": "off"}, vocab_size=vocab)
    state = model_state(info, rank)
    state = {k.removeprefix(_COMPILED_PREFIX): v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise ValueError(
            f"the model of {info.path} does not fit {run_dir / CONFIG_FILE}: {first}"
        ) from None
    model.to(where).eval()
    return Sampler(model, tokenizer, context, info.step, where)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: Sequence[int],
    tokens: int,
    *,
    context: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    vocab_limit: int | None = None,
) -> list[int]:
    """Continue ``prompt`` by ``tokens`` ids drawn one at a time from the model.

    Args:
        model: Maps ``(1, T)`` ids to ``(1, T, V)`` logits (or a tuple starting with them).
        prompt: The ids to start from, at least one.
        tokens: How many ids to add.
        context: The model sees at most the last ``context`` ids.
        temperature: Divides the logits, ``> 0``.
        top_k: Keep only the ``top_k`` largest logits; ``None`` keeps all.
        generator: The source of the draws (on the model's device).
        vocab_limit: Draw only ids below it (those the tokenizer can decode).

    Returns:
        The prompt followed by the new ids.

    Raises:
        ValueError: If ``prompt`` is empty, or ``tokens``, ``context``, ``temperature``
            or ``top_k`` is out of range.
    """
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    if tokens < 0 or context < 1 or not temperature > 0 or (top_k is not None and top_k < 1):
        raise ValueError(
            f"tokens={tokens} (>= 0), context={context} (>= 1), temperature={temperature} "
            f"(> 0) and top_k={top_k} (>= 1 or None) must all be in range"
        )
    device = next(model.parameters()).device
    idx = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    for _ in range(tokens):
        out = model(idx[:, -context:])
        logits = out[0] if isinstance(out, tuple) else out
        logits = logits[:, -1, :vocab_limit].float() / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return idx[0].tolist()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.sample",
        description="Print text written by a trained language model (its newest checkpoint).",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's output directory")
    parser.add_argument("--prompt", help="text to continue (default: a newline)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens to write (default 256)")
    parser.add_argument("--temperature", type=float, default=0.8, help="> 0 (default 0.8)")
    parser.add_argument("--top-k", type=int, default=200, help="0 for all (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    parser.add_argument("--rank", type=int, help="this worker's own model, not the average")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    return parser


def _check_args(args: argparse.Namespace) -> None:
    if args.tokens < 1:
        raise ValueError(f"--tokens={args.tokens} must be >= 1")
    if not args.temperature > 0:
        raise ValueError(f"--temperature={args.temperature} must be > 0")
    if args.top_k < 0:
        raise ValueError(f"--top-k={args.top_k} must be >= 0 (0 keeps every token)")
    if args.rank is not None and args.rank < 0:
        raise ValueError(f"--rank={args.rank} must be >= 0")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (errors are one line on stderr)."""
    args = _parser().parse_args(argv)
    try:
        _check_args(args)
        sampler = load_sampler(Path(args.run_dir), rank=args.rank, device=args.device)
        text = sampler.write(
            args.prompt,
            args.tokens,
            temperature=args.temperature,
            top_k=args.top_k or None,
            seed=args.seed,
        )
    except (ValueError, OSError) as exc:
        print(f"sample: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
