"""A user's model, ``model._target_: their_pkg.module.Name``: called with its arguments.

The target (a class or a function) is called through ``hydra.utils.instantiate`` with the
section's keys. Where its signature names ``num_classes``, ``in_channels``, ``image_size``,
``vocab_size`` or ``block_size`` and the section leaves it out, the data's value is passed,
as the built-in models get theirs (:func:`~experiments.data.target.model_values`: classes, and
the channels and side of ``(C, H, H)`` images, or the vocabulary and the window length of
token data). A required one the data cannot give is a one-line error asking for the key.

:func:`check_target_model` builds it once on the ``meta`` device, where no memory is
allocated and no weights are drawn (on the CPU if the constructor cannot run there), so a
target that does not import, a misspelt key, a constructor that raises or a result that is
no ``nn.Module`` stops every rank with one line before any process group exists.

Example::

    section = {"_target_": "their_pkg.models.MLP", "hidden": 64}
    model = build_target_model(section, {"num_classes": 10, "in_channels": 1, "image_size": 8})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from experiments.instantiate import Target
from experiments.models.schema import model_section
from experiments.schema import ConfigError

__all__ = ["DATA_VALUES", "build_target_model", "check_target_model"]

DATA_VALUES = ("num_classes", "in_channels", "image_size", "vocab_size", "block_size")
"""The arguments a model's target may get from the data."""


def _prepared(section: Any, values: Mapping[str, int | None]) -> tuple[Any, Target, dict[str, Any]]:
    m = model_section(section)
    target = Target.of("model", m)
    fill = target.fill({k: values.get(k) for k in DATA_VALUES})
    target.check(extra=fill)
    return m, target, fill


def _module(target: Target, built: Any) -> nn.Module:
    if not isinstance(built, nn.Module):
        raise target.returned(built, "a torch.nn.Module")
    return built


def build_target_model(section: Any, values: Mapping[str, int | None]) -> nn.Module:
    """Build the user's model, freshly initialised, on the CPU.

    Args:
        section: The ``model`` section with a ``_target_``.
        values: The data's ``num_classes``, ``in_channels``, ``image_size``, ``vocab_size``
            and ``block_size`` (``None`` or absent: unknown).

    Returns:
        The model (in ``torch.channels_last`` with ``model.channels_last``).

    Raises:
        ConfigError: One line naming the key and its value (see the module's docstring).
    """
    m, target, fill = _prepared(section, values)
    model = _module(target, target.call(**fill))
    if m.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def check_target_model(section: Any, values: Mapping[str, int | None]) -> None:
    """Build the user's model on the ``meta`` device (else on the CPU) and drop it.

    Args:
        section: The ``model`` section with a ``_target_``.
        values: The data's values, as for :func:`build_target_model`.

    Raises:
        ConfigError: One line naming the key and its value.
    """
    _, target, fill = _prepared(section, values)
    try:
        with torch.device("meta"):
            built = target.call(**fill)
    except ConfigError:  # some constructors need real tensors: the CPU tells
        built = target.call(**fill)
    _module(target, built)
