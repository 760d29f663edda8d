"""Models."""

from experiments.models.vision import build_model

__all__ = ["build_model"]
