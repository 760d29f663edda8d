"""Models for the experiments, chosen by name from the ``model`` config section.

:data:`MODELS` maps every name to its builder; the vision models come from
:mod:`experiments.models.vision`, and another family joins by adding its builders to the
mapping. The section's keys and defaults are those of the schemas in
:mod:`experiments.models.schema`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from experiments.models.schema import model_section
from experiments.models.vision import VISION_MODELS, ModelBuilder, SmallCNN, VisionTransformer
from experiments.schema import is_int, require

__all__ = ["MODELS", "ModelBuilder", "SmallCNN", "VisionTransformer", "build_model"]

MODELS: Mapping[str, ModelBuilder] = {**VISION_MODELS}
"""The builder of every model name, in the order of the ``ModelName`` enum."""


def build_model(
    cfg: Mapping[str, Any] | None, *, num_classes: int, in_channels: int, image_size: int
) -> nn.Module:
    """Build the model named by ``cfg["name"]``.

    Args:
        cfg: The model config section (a dict or an OmegaConf ``DictConfig``): ``name`` (one
            of :data:`MODELS`, default ``small_cnn``) and the keys of its schema in
            :mod:`experiments.models.schema` (``channels_last``; ``norm`` for ``small_cnn``;
            ``patch_size``, ``dim``, ``depth``, ``heads``, ``mlp_ratio`` for ``vit_small``);
            left-out keys take the schema's defaults.
        num_classes: Number of output logits.
        in_channels: Channels of the input images.
        image_size: Side of the square input images.

    Returns:
        The freshly initialised model, on the CPU.

    Raises:
        ValueError: A one-line :class:`~experiments.train.config.ConfigError` if the name or
            a key is unknown, a size is not a positive integer, or a ``vit_small`` key is
            inconsistent (``patch_size`` must divide ``image_size``, ``heads`` must divide
            ``dim``).
    """
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
    if section.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model
