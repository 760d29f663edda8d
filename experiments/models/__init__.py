"""Models for the experiments, chosen by name from the ``model`` config section.

:data:`MODELS` maps every name to its builder; the vision models come from
:mod:`experiments.models.vision` and the ``gpt`` language model from
:mod:`experiments.models.gpt`, and another family joins by adding its builders to the
mapping. A vision builder takes the images' shape (``num_classes``, ``in_channels``,
``image_size``); a language model's takes the data's ``vocab_size``. The section's keys and defaults are those of the schemas in
:mod:`experiments.models.schema`. A section with ``_target_`` in place of ``name`` is a
user's model (:mod:`experiments.models.target`), given those of the data's values that its
signature names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from experiments.models.gpt import build_gpt
from experiments.models.schema import LANGUAGE_MODELS, model_section
from experiments.models.target import build_target_model
from experiments.models.vision import VISION_MODELS, ModelBuilder, SmallCNN, VisionTransformer
from experiments.schema import is_int, is_target, require

__all__ = ["MODELS", "ModelBuilder", "SmallCNN", "VisionTransformer", "build_model"]

MODELS: Mapping[str, ModelBuilder] = {**VISION_MODELS, "gpt": build_gpt}
"""The builder of every model name, in the order of the ``ModelName`` enum."""


def build_model(
    cfg: Mapping[str, Any] | None,
    *,
    num_classes: int | None = None,
    in_channels: int | None = None,
    image_size: int | None = None,
    vocab_size: int | None = None,
    block_size: int | None = None,
) -> nn.Module:
    """Build the model named by ``cfg["name"]``.

    Args:
        cfg: The model config section (a dict or an OmegaConf ``DictConfig``): ``name`` (one
            of :data:`MODELS`, default ``small_cnn``) and the keys of its schema in
            :mod:`experiments.models.schema` (``channels_last``; ``norm`` for ``small_cnn``;
            ``patch_size``, ``dim``, ``depth``, ``heads``, ``mlp_ratio`` for ``vit_small``;
            those of :class:`~experiments.models.gpt.GPTConfig` for ``gpt``); left-out keys
            take the schema's defaults.
        num_classes: Number of output logits (vision models).
        in_channels: Channels of the input images (vision models).
        image_size: Side of the square input images (vision models).
        vocab_size: The data's vocabulary size (language models).
        block_size: The data's tokens per sample (given to a ``_target_`` that takes it).

    Returns:
        The freshly initialised model, on the CPU.

    Raises:
        ValueError: A one-line :class:`~experiments.train.config.ConfigError` if the name or
            a key is unknown, a size is not a positive integer, or a ``vit_small`` key is
            inconsistent (``patch_size`` must divide ``image_size``, ``heads`` must divide
            ``dim``), or for a ``_target_`` as :func:`~experiments.models.target.build_target_model`.
    """
    if is_target(cfg):
        values = {
            "num_classes": num_classes,
            "in_channels": in_channels,
            "image_size": image_size,
            "vocab_size": vocab_size,
            "block_size": block_size,
        }
        return build_target_model(cfg, values)
    name = str(dict(cfg or {}).get("name") or "small_cnn")
    if name in LANGUAGE_MODELS:
        return MODELS[name](model_section(cfg), vocab_size=vocab_size)
    for key, value in (
        ("num_classes", num_classes),
        ("in_channels", in_channels),
        ("image_size", image_size),
    ):
        require(key, value, is_int(value) and value > 0, "an integer > 0")
    section = model_section(cfg, image_size=int(image_size))
    model = MODELS[str(section.name)](
        section,
        num_classes=int(num_classes),
        in_channels=int(in_channels),
        image_size=int(image_size),
    )
    if section.get("channels_last", False):
        model = model.to(memory_format=torch.channels_last)
    return model
