"""The ``model`` group's schemas, each checking the values a type cannot express.

``conf/model/<name>.yaml`` starts its defaults list with ``/schema/model/<schema>@_here_``,
and :data:`SCHEMAS` names the schema of every model, so that :func:`model_section` fills a
plain dict (as tests and benchmarks pass to :func:`experiments.models.build_model`) with the
same defaults. The language model's schema, :class:`~experiments.models.gpt.GPTConfig`, lives
beside its builder in :mod:`experiments.models.gpt` and is listed here under ``gpt``.
``experiments.train.config`` imports this module, registers its schemas in
Hydra's ConfigStore and re-exports its names; import them from there.

A section with ``_target_`` instead of ``name`` is a user's model
(:mod:`experiments.models.target`): :class:`ModelTargetConfig` keeps ``channels_last`` for the
framework and every other key as an argument of the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig

from experiments.models.gpt import GPTConfig, gpt_section
from experiments.schema import name_enum, require, require_number, typed_section

__all__ = [
    "ModelName",
    "NormName",
    "ModelConfig",
    "ModelTargetConfig",
    "SmallCNNConfig",
    "VitConfig",
    "GPTConfig",
    "LANGUAGE_MODELS",
    "SCHEMAS",
    "check_model",
    "model_section",
]

ModelName = name_enum(
    "ModelName", ["small_cnn", "resnet18_cifar", "resnet50", "vit_small", "gpt"], __name__
)
NormName = name_enum("NormName", ["group", "batch"], __name__)


@dataclass
class ModelConfig:
    """``model`` group, and ``model=resnet18_cifar`` / ``resnet50``: a name from ``MODELS``.

    Attributes:
        name: Registered model name.
        channels_last: Convert the model (and the input batches) to
            ``torch.channels_last``, which speeds up convolutions on GPUs.
    """

    name: ModelName = MISSING  # type: ignore[valid-type]
    channels_last: bool = False


@dataclass
class SmallCNNConfig(ModelConfig):
    """``model=small_cnn``: ``norm`` is ``group`` (GroupNorm) or ``batch`` (BatchNorm)."""

    norm: NormName = NormName["group"]  # type: ignore[valid-type]


@dataclass
class VitConfig(ModelConfig):
    """``model=vit_small``: a small Vision Transformer; ``patch_size`` must divide the image size."""

    patch_size: int = 4
    dim: int = 192
    depth: int = 6
    heads: int = 3
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        for key in ("patch_size", "dim", "depth", "heads"):
            require_number(f"model.{key}", getattr(self, key), above=0, kind="integer")
        require_number("model.mlp_ratio", self.mlp_ratio, above=0, kind="number")
        heads = f"divisible by model.heads={self.heads}"
        require("model.dim", self.dim, self.dim % self.heads == 0, heads)


@dataclass
class ModelTargetConfig:
    """A user's model, ``_target_: their_pkg.module.Name``, called with its arguments.

    Attributes:
        _target_: The class or function returning an ``nn.Module``, as a dotted import path.
        name: Set to the ``_target_`` path, for logs and summaries.
        channels_last: Convert the model and its input batches to ``torch.channels_last``,
            as for the built-in models.
        kwargs: The target's own arguments (every other key of the section).
    """

    _target_: str = MISSING
    name: str = MISSING
    channels_last: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)


LANGUAGE_MODELS = frozenset({"gpt"})
"""The model names that read token sequences (``dataset=tokens``) instead of images."""

# every model name takes ModelConfig, unless it has keys of its own
_OWN_KEYS: dict[str, type] = {
    "small_cnn": SmallCNNConfig,
    "vit_small": VitConfig,
    "gpt": GPTConfig,
}
SCHEMAS = {m.value: _OWN_KEYS.get(m.value, ModelConfig) for m in ModelName}
"""The schema of every model name, in the order of :data:`ModelName`."""


def model_section(section: Any, *, image_size: int | None = None) -> DictConfig:
    """The ``model`` section with its schema's defaults, checked by its schema.

    Args:
        section: A dict, a ``DictConfig`` or ``None`` (``small_cnn`` with its defaults).
        image_size: Side of the input images, when known: ``vit_small``'s ``patch_size``
            must divide it.

    Returns:
        A ``DictConfig`` of the schema that ``section``'s name selects
        (:class:`ModelTargetConfig` for a ``_target_``).

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    m = typed_section(section, "model", SCHEMAS, "small_cnn", target=ModelTargetConfig)
    if m.name == "gpt":
        return gpt_section(m)
    if m.name == "vit_small" and image_size is not None:  # the data's side: another group's
        divides = image_size % m.patch_size == 0
        require("model.patch_size", m.patch_size, divides, f"a divisor of image_size={image_size}")
    return m


def check_model(section: Any, *, image_size: int | None = None) -> None:
    """Check the ``model`` section's values beyond their types.

    Args:
        section: A dict or ``DictConfig``; left-out keys take their schema's defaults.
        image_size: Side of the input images, when known (see :func:`model_section`).

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    model_section(section, image_size=image_size)
