"""TinyMLP: a two-layer perceptron over flattened images."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["TinyMLP"]


class TinyMLP(nn.Module):
    """``Flatten -> Linear(hidden) -> ReLU -> Linear(num_classes)``.

    ``in_channels``, ``image_size`` and ``num_classes`` are left out of its YAML file: the
    framework passes the data's.

    Args:
        in_channels: Channels of the input images.
        image_size: Side of the square input images.
        num_classes: Number of output logits.
        hidden: Width of the hidden layer.

    Raises:
        ValueError: If ``hidden`` is not positive.

    Example::

        model = TinyMLP(in_channels=1, image_size=8, num_classes=4)
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int, hidden: int = 64):
        super().__init__()
        if hidden < 1:
            raise ValueError(f"hidden={hidden} is invalid; it must be >= 1")
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(B, C, S, S)`` images to ``(B, num_classes)`` logits."""
        return self.net(x)
