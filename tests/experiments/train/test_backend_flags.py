"""``train.cudnn_benchmark`` and ``train.tf32``: read and checked everywhere, applied on CUDA."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from experiments.train.config import ConfigError
from experiments.train.run import set_backend_flags, validate
from tests.support.launch import compose_config

FLAGS = ("cudnn_benchmark", "tf32")


def _torch_flags() -> tuple[bool, bool, bool]:
    return (
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


@pytest.fixture
def restore_torch_flags():
    saved = _torch_flags()
    yield
    b = torch.backends
    b.cudnn.benchmark, b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = saved


def test_keys_default_on_and_are_a_no_op_on_the_cpu(restore_torch_flags) -> None:
    cfg = compose_config("train.cudnn_benchmark=false")
    assert cfg.train.tf32 is True and cfg.train.cudnn_benchmark is False
    before = _torch_flags()
    assert set_backend_flags(cfg.train, torch.device("cpu")) == {}
    assert _torch_flags() == before


@pytest.mark.parametrize("key", FLAGS)
def test_a_non_bool_is_rejected_with_one_line(key) -> None:
    cfg = OmegaConf.create(OmegaConf.to_container(compose_config(), resolve=False))
    cfg.train[key] = "maybe"
    with pytest.raises(ConfigError, match=rf"train\.{key}=maybe .*true or false"):
        validate(cfg, 1)
    with pytest.raises(Exception, match=key):
        compose_config(f"train.{key}=maybe")  # the schema refuses it at compose time


@pytest.mark.gpu
@pytest.mark.parametrize("value", [True, False])
def test_cuda_gets_the_flags(value, restore_torch_flags) -> None:
    cfg = compose_config(f"train.cudnn_benchmark={value}", f"train.tf32={not value}")
    flags = set_backend_flags(cfg.train, torch.device("cuda", 0))
    assert _torch_flags() == (value, not value, not value)
    assert flags == {
        "cudnn.benchmark": value,
        "cuda.matmul.allow_tf32": not value,
        "cudnn.allow_tf32": not value,
    }
