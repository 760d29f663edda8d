"""What a job learns: image classification or language modelling, chosen by the model.

The trainer's loop, the step, the checkpoints and the gossip are the same for both; a
:class:`Task` holds the few things that differ:

- how the data and the model are built (classes and image shape, or the vocabulary);
- the training loss: cross-entropy with ``train.label_smoothing`` on the logits of an
  image, or the mean next-token cross-entropy, which the model computes from
  ``model(x, y)`` (or the task from its logits);
- what a sample is (an image; a sequence of ``block_size`` tokens), so that throughput
  can also be counted in tokens (``perf/tokens_per_s``, ``perf/mfu``, ``tokens``);
- the evaluation metrics: ``eval/acc``, ``eval/acc_local`` and ``eval/loss`` for images,
  ``eval/loss``, ``eval/loss_local`` and ``eval/ppl`` for tokens.

:func:`task_for` picks the task of a config: a language model (``model=gpt``) needs
``dataset=tokens`` and every other model needs an image dataset; :meth:`Task.check`
finds a mismatch, and a dataset block size above the model's or an unknown vocabulary,
before any collective. A user's dataset (``dataset._target_``) says its task with
``dataset.task`` (``classification`` or ``language_model``), and a user's model
(``model._target_``) learns the task of its data; such a language model is called as
``model(x)`` and returns logits, from which the task computes the loss.

Example::

    task = task_for(cfg)
    task.check(cfg)  # one-line ConfigError, the same on every rank
    data = task.build_data(cfg.dataset, cfg.model, rank=0, world_size=1, batch_size=32,
                           seed=0, device=torch.device("cpu"))
    model = task.build_model(cfg.model)
    loss, correct, count = task.forward(model, *next(iter(data.train)))
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from experiments.data import build_data
from experiments.data.tokens import token_sizes
from experiments.models import build_model
from experiments.models.schema import LANGUAGE_MODELS
from experiments.schema import ConfigError, is_target

__all__ = [
    "Task",
    "ImageClassification",
    "LanguageModeling",
    "task_for",
    "data_task",
    "model_block",
]


def data_task(dataset_cfg: Any) -> str:
    """What a dataset is for: ``language_model`` (``tokens``, or a target saying so) or ``classification``."""
    if is_target(dataset_cfg):
        return str(dataset_cfg.get("task", "classification"))
    return "language_model" if str(dataset_cfg.name) == "tokens" else "classification"


def model_block(model_cfg: Any) -> int | None:
    """``gpt``'s block size, a target model's ``block_size`` argument, else ``None``."""
    if is_target(model_cfg):
        block = dict(model_cfg.get("kwargs") or {}).get("block_size")
        return None if block is None else int(block)
    return int(model_cfg.block_size) if str(model_cfg.name) in LANGUAGE_MODELS else None


class Task:
    """The base: what differs between the tasks a job can learn.

    Args:
        train_cfg: The ``train`` config section (``label_smoothing``).

    Attributes:
        tokens_per_sample: Tokens in one sample; 0 when samples are not token sequences.
        eval_width: How many sums :meth:`eval_sums` returns.
        data: The data of this rank, once :meth:`build_data` ran.
        flops_per_token: Training FLOPs per token of the model (``6 N``), once
            :meth:`build_model` ran; 0 when the task does not count tokens.
    """

    tokens_per_sample = 0
    eval_width = 0

    def __init__(self, train_cfg: Any) -> None:
        self.label_smoothing = float(train_cfg.label_smoothing)
        self.data: Any = None
        self.flops_per_token = 0

    def check(self, cfg: Any) -> None:
        """Check what the dataset and the model must agree on (no communication).

        Raises:
            ConfigError: One line, the same on every rank.
        """

    def build_data(self, dataset_cfg: Any, model_cfg: Any, **placement: Any) -> Any:
        """Build (and keep) this rank's data.

        Args:
            dataset_cfg: The ``dataset`` section.
            model_cfg: The ``model`` section (a language model's block size is the default).
            **placement: ``rank``, ``world_size``, ``batch_size``, ``seed`` and ``device``,
                as :func:`experiments.data.build_data` takes them.

        Returns:
            The data (also in ``self.data``).
        """
        self.data = build_data(self._dataset_section(dataset_cfg, model_cfg), **placement)
        return self.data

    def _dataset_section(self, dataset_cfg: Any, model_cfg: Any) -> Any:
        return dataset_cfg

    def build_model(self, model_cfg: Any) -> nn.Module:
        """The freshly initialised model for the data, on the CPU."""
        raise NotImplementedError

    def forward(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One training forward: ``(mean loss, correct predictions, predictions counted)``."""
        raise NotImplementedError

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One evaluation batch's sums (float64, on the device) from the logits ``out``."""
        raise NotImplementedError

    def eval_totals(self, avg: list[float], own: list[float]) -> list[float]:
        """What is summed over ranks, from the averaged model's and the own model's sums."""
        raise NotImplementedError

    def eval_metrics(self, totals: list[float]) -> dict[str, float]:
        """The evaluation metrics from the totals summed over ranks."""
        raise NotImplementedError

    def eval_message(self, result: dict[str, float]) -> str:
        """One evaluation, in words, for the log."""
        raise NotImplementedError

    def summary(self, last_eval: dict[str, float], tokens: dict[str, Any]) -> dict:
        """The task's keys of the job's summary (none beyond the usual ones by default).

        Args:
            last_eval: The newest evaluation's metrics.
            tokens: ``tokens``, ``perf/tokens_per_s`` and ``perf/mfu`` of the run, for a
                task that counts tokens.

        Returns:
            The keys to add.
        """
        return {}

    def final_message(self, summary: dict[str, Any]) -> str | None:
        """The last line rank 0 logs, from the summary; ``None``: the usual accuracy line."""
        return None

    @property
    def synthetic(self) -> bool:
        """Whether the data is synthetic (marked so in the summary)."""
        return bool(getattr(self.data, "synthetic", False))


class ImageClassification(Task):
    """Images to classes: label-smoothed cross-entropy, ``eval/acc`` and ``eval/acc_local``."""

    eval_width = 3  # correct, loss sum, count

    def __init__(self, train_cfg: Any) -> None:
        super().__init__(train_cfg)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=self.label_smoothing)

    def check(self, cfg: Any) -> None:
        if data_task(cfg.dataset) == "language_model":
            what = "dataset=tokens" if not is_target(cfg.dataset) else "dataset.task=language_model"
            raise ConfigError(
                f"{what} is invalid with model={cfg.model.name}; it needs a language "
                f"model: one of {', '.join(sorted(LANGUAGE_MODELS))}, or a model._target_"
            )

    def build_model(self, model_cfg: Any) -> nn.Module:
        d = self.data
        return build_model(
            model_cfg, num_classes=d.num_classes, in_channels=d.in_channels, image_size=d.image_size
        )

    def forward(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        out = model(x)
        loss = self.criterion(out.float(), y)
        return loss, (out.detach().argmax(dim=1) == y).sum(), y.numel()

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(out.float(), y, reduction="sum").double()
        correct = (out.argmax(dim=1) == y).sum().double()
        return torch.stack([correct, loss, loss.new_tensor(float(y.numel()))])

    def eval_totals(self, avg: list[float], own: list[float]) -> list[float]:
        return [avg[0], avg[1], avg[2], own[0]]

    def eval_metrics(self, totals: list[float]) -> dict[str, float]:
        c_avg, l_avg, n, c_own = totals
        n = max(n, 1.0)
        return {"eval/acc": c_avg / n, "eval/acc_local": c_own / n, "eval/loss": l_avg / n}

    def eval_message(self, result: dict[str, float]) -> str:
        return f"eval/acc {result['eval/acc']:.4f} eval/acc_local {result['eval/acc_local']:.4f}"


class LanguageModeling(Task):
    """Token windows to next tokens: mean token cross-entropy, ``eval/loss`` and ``eval/ppl``.

    A sample is a window of ``block_size`` tokens: the dataset's ``block_size`` if set,
    else the model's. ``train.label_smoothing`` does not apply to next-token prediction.

    Args:
        train_cfg: The ``train`` config section.
        targets_in_forward: Call the model as ``model(x, y)``, which may return
            ``(logits, loss)`` (the built-in ``gpt``); else as ``model(x)``, returning logits.
    """

    eval_width = 2  # loss sum, tokens

    def __init__(self, train_cfg: Any, *, targets_in_forward: bool = True) -> None:
        super().__init__(train_cfg)
        self.targets_in_forward = targets_in_forward

    def check(self, cfg: Any) -> None:
        if data_task(cfg.dataset) != "language_model":
            raise ConfigError(
                f"dataset={cfg.dataset.name} is invalid with model={cfg.model.name}; a language "
                "model needs dataset=tokens or a dataset._target_ with dataset.task=language_model"
            )
        if not is_target(cfg.dataset):
            token_sizes(cfg.dataset, model_block(cfg.model))

    def _dataset_section(self, dataset_cfg: Any, model_cfg: Any) -> Any:
        if is_target(dataset_cfg):
            return dataset_cfg
        block, _ = token_sizes(dataset_cfg, model_block(model_cfg))
        return {**dict(dataset_cfg), "block_size": block}

    def build_data(self, dataset_cfg: Any, model_cfg: Any, **placement: Any) -> Any:
        data = super().build_data(dataset_cfg, model_cfg, **placement)
        self.tokens_per_sample = int(data.block_size)
        return data

    def build_model(self, model_cfg: Any) -> nn.Module:
        data = self.data
        model = build_model(model_cfg, vocab_size=data.vocab_size, block_size=data.block_size)
        bare = getattr(model, "_orig_mod", model)  # under model.compile=whole
        counted = getattr(bare, "flops_per_token", None)
        params = sum(p.numel() for p in bare.parameters())
        self.flops_per_token = int(counted()) if callable(counted) else 6 * params
        return model

    def forward(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        out = model(x, y) if self.targets_in_forward else model(x)
        loss = out[1] if isinstance(out, tuple) else self._token_loss(out, y, "mean")
        # no token accuracy: 0 predictions counted, so train/acc is left out of the lines
        return loss, loss.new_zeros(()), 0

    @staticmethod
    def _token_loss(logits: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
        flat = logits.float().reshape(-1, logits.shape[-1])
        return nn.functional.cross_entropy(flat, y.reshape(-1), reduction=reduction)

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self._token_loss(out, y, "sum").double()
        return torch.stack([loss, loss.new_tensor(float(y.numel()))])

    def eval_totals(self, avg: list[float], own: list[float]) -> list[float]:
        return [avg[0], avg[1], own[0]]

    def eval_metrics(self, totals: list[float]) -> dict[str, float]:
        l_avg, n, l_own = totals
        n = max(n, 1.0)
        loss = l_avg / n
        return {"eval/loss": loss, "eval/loss_local": l_own / n, "eval/ppl": math.exp(loss)}

    def eval_message(self, result: dict[str, float]) -> str:
        return (
            f"eval/loss {result['eval/loss']:.4f} eval/loss_local "
            f"{result['eval/loss_local']:.4f} eval/ppl {result['eval/ppl']:.2f}"
        )

    def summary(self, last_eval: dict[str, float], tokens: dict[str, Any]) -> dict:
        return {
            "eval/loss_local": last_eval.get("eval/loss_local"),
            "eval/ppl": last_eval.get("eval/ppl"),
            **tokens,
            "unigram_entropy": self.data.unigram_entropy,
        }

    def final_message(self, summary: dict[str, Any]) -> str | None:
        entropy = summary.get("unigram_entropy")
        loss = f"val loss {summary['eval/loss']:.3f} nats"
        if entropy is None:
            return f"{loss} (the corpus's unigram entropy is unknown: no meta.json gives it)"
        return f"{loss} vs unigram entropy {entropy:.3f} nats of the corpus"


def task_for(cfg: Any) -> Task:
    """The task of a composed config: :class:`LanguageModeling` for a language model.

    Args:
        cfg: The composed config (a registered ``model.name`` chooses, a ``model._target_``
            takes its data's task; ``train`` configures).

    Returns:
        A fresh task, before any data or model is built.
    """
    if is_target(cfg.model):
        if data_task(cfg.dataset) == "language_model":
            return LanguageModeling(cfg.train, targets_in_forward=False)
        return ImageClassification(cfg.train)
    if str(cfg.model.name) in LANGUAGE_MODELS:
        return LanguageModeling(cfg.train)
    return ImageClassification(cfg.train)
