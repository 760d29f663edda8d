"""Image classifiers: the vision models that ``experiments.models.build_model`` builds.

Every builder in :data:`VISION_MODELS` takes the checked ``model`` section and returns a
fresh, randomly initialised ``nn.Module`` that maps ``(B, in_channels, image_size,
image_size)`` images to ``(B, num_classes)`` logits:

* ``small_cnn``: two 3x3 convolutions, a pool and a two-layer head (about 53k parameters
  for 8x8 digits); the default model. Normalisation is GroupNorm by default because it
  keeps no running statistics, so averaging the parameters of decentralized workers
  averages the whole model (``norm: batch`` switches to BatchNorm).
* ``resnet18_cifar``: torchvision's ResNet-18 with a 3x3 stride-1 stem and no max-pool, the
  usual variant for 32x32 images.
* ``resnet50``: torchvision's ResNet-50, untrained.
* ``vit_small``: a small pre-norm Vision Transformer (keys ``patch_size``, ``dim``, ``depth``,
  ``heads``, ``mlp_ratio``).

Every model accepts ``channels_last: true`` to use ``torch.channels_last`` memory format
(applied by ``build_model``). The keys and their defaults are those of the schemas in
:mod:`experiments.models.schema`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from experiments.models.schema import check_model

__all__ = ["VISION_MODELS", "ModelBuilder", "SmallCNN", "VisionTransformer"]


def _norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    # 8 groups of 4-8 channels is the usual GroupNorm sweet spot for widths 32-64.
    return nn.GroupNorm(min(8, channels), channels)


class SmallCNN(nn.Module):
    """A small convolutional classifier sized for 8x8 digits, usable at any image size.

    ``conv3x3(32) -> norm -> ReLU -> conv3x3(64) -> norm -> ReLU -> max-pool 2 ->
    adaptive avg-pool 2x2 -> linear(128) -> ReLU -> linear(num_classes)``. The adaptive pool
    makes the head independent of the input size.

    Args:
        num_classes: Number of output logits.
        in_channels: Channels of the input images.
        norm: ``"group"`` (GroupNorm, no running statistics) or ``"batch"`` (BatchNorm).

    Raises:
        ValueError: If ``norm`` is not one of ``"group"`` or ``"batch"``.

    Example::

        model = SmallCNN(num_classes=10, in_channels=1)
        logits = model(torch.randn(4, 1, 8, 8))  # (4, 10)
    """

    def __init__(self, num_classes: int, in_channels: int = 1, norm: str = "group") -> None:
        super().__init__()
        check_model({"name": "small_cnn", "norm": norm})
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=3, padding=1, bias=False),
            _norm_layer(norm, 32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, kernel_size=3, padding=1, bias=False),
            _norm_layer(norm, 64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 2 * 2, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Return the logits for a batch of images ``(B, C, H, W)``."""
        return self.head(self.features(x))


class _Block(nn.Module):
    """A pre-norm Transformer encoder block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """A small Vision Transformer classifier.

    Non-overlapping ``patch_size`` patches are embedded by a strided convolution, a learned
    class token is prepended, a learned positional embedding is added, ``depth`` pre-norm
    blocks (``nn.MultiheadAttention`` with ``batch_first=True`` and a GELU MLP) follow, and
    a linear head reads the normalised class token.

    Args:
        num_classes: Number of output logits.
        in_channels: Channels of the input images.
        image_size: Side of the (square) input images.
        patch_size: Side of a patch; must divide ``image_size``.
        dim: Embedding width; must be divisible by ``heads``.
        depth: Number of Transformer blocks.
        heads: Attention heads per block.
        mlp_ratio: Hidden width of the MLP relative to ``dim``.

    Raises:
        ValueError: If a size is not positive, ``patch_size`` does not divide
            ``image_size`` or ``heads`` does not divide ``dim``.

    Example::

        vit = VisionTransformer(num_classes=10, in_channels=3, image_size=32, patch_size=4)
        logits = vit(torch.randn(2, 3, 32, 32))  # (2, 10)
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        image_size: int,
        patch_size: int = 4,
        dim: int = 192,
        depth: int = 6,
        heads: int = 3,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        sizes = {"patch_size": patch_size, "dim": dim, "depth": depth, "heads": heads}
        check_model({"name": "vit_small", **sizes, "mlp_ratio": mlp_ratio}, image_size=image_size)
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.blocks = nn.Sequential(*(_Block(dim, heads, mlp_ratio) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        # A zero head starts every class at equal odds.
        nn.init.zeros_(self.head.weight)

    def forward(self, x: Tensor) -> Tensor:
        """Return the logits for a batch of images ``(B, C, H, W)``."""
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embed
        tokens = self.norm(self.blocks(tokens))
        return self.head(tokens[:, 0])


ModelBuilder = Callable[..., nn.Module]
"""``builder(section, *, num_classes, in_channels, image_size) -> nn.Module``."""


def _small_cnn(m: DictConfig, *, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    return SmallCNN(num_classes, in_channels, norm=str(m.norm))


def _resnet18_cifar(
    m: DictConfig, *, num_classes: int, in_channels: int, image_size: int
) -> nn.Module:
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    # 32x32 inputs cannot afford the ImageNet stem's 4x downsampling.
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


def _resnet50(m: DictConfig, *, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    from torchvision.models import resnet50

    model = resnet50(weights=None, num_classes=num_classes)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


def _vit_small(m: DictConfig, *, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    return VisionTransformer(
        num_classes,
        in_channels,
        image_size,
        patch_size=m.patch_size,
        dim=m.dim,
        depth=m.depth,
        heads=m.heads,
        mlp_ratio=m.mlp_ratio,
    )


VISION_MODELS: dict[str, ModelBuilder] = {
    "small_cnn": _small_cnn,
    "resnet18_cifar": _resnet18_cifar,
    "resnet50": _resnet50,
    "vit_small": _vit_small,
}
"""The builder of every vision model name."""
