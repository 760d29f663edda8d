"""A section's ``_target_``: typed by its group's schema, imported, checked, called; one line."""

from __future__ import annotations

import sys

import pytest
import torch
from omegaconf import OmegaConf

from experiments.instantiate import Target, locate
from experiments.schema import ConfigError, is_target, target_section
from experiments.train.config import TopologyTargetConfig


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.strip()
    return text


def test_a_target_section_keeps_framework_keys_apart_from_the_arguments() -> None:
    raw = {"_target_": "pkg.mod.Hub", "hub": 1, "name": "mine", "bucket_size_in_mb": 4}
    typed = target_section(raw, "topology", TopologyTargetConfig)
    assert typed.name == "pkg.mod.Hub" and typed.bucket_size_in_mb == 4.0
    # a key the framework does not read is an argument, even one called name
    assert dict(typed.kwargs) == {"hub": 1, "name": "mine"}
    assert typed.local_world_size is None and typed.sync_buffer_in_global_avg is True
    assert target_section(typed, "topology", TopologyTargetConfig) is typed
    assert is_target(raw) and is_target(OmegaConf.create(raw)) and not is_target({"name": "ring"})


@pytest.mark.parametrize(
    ("raw", "needles"),
    [
        ({"_target_": "pkg mod"}, ("topology._target_=pkg mod", "dotted import path")),
        ({"_target_": 3}, ("topology._target_=3", "dotted import path")),
        (
            {"_target_": "pkg.Hub", "bucket_size_in_mb": "big"},
            ("topology.bucket_size_in_mb=big", "a number"),
        ),
    ],
)
def test_a_bad_target_section_is_one_line(raw: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        target_section(raw, "topology", TopologyTargetConfig)
    text = _one_line(info)
    assert all(n in text for n in needles), text


def test_locate_finds_classes_functions_and_methods() -> None:
    assert locate("k", "torch.optim.SGD") is torch.optim.SGD
    assert locate("k", "torch.nn.functional.relu") is torch.nn.functional.relu
    assert locate("k", "torch.Tensor.add") is torch.Tensor.add


@pytest.mark.parametrize(
    ("path", "cause"),
    [
        ("no_such_pkg.mod.Name", "No module named 'no_such_pkg'"),
        ("torch.nn.Lineer", "has no attribute 'Lineer'"),
        ("tests.support.no_module.Name", "has no attribute 'no_module'"),
        # a module, not a package: the name it lacks, not its missing __path__
        ("experiments.models.vision.CNN", "has no attribute 'CNN'"),
    ],
)
def test_a_target_that_does_not_import_is_one_line(path: str, cause: str) -> None:
    text = _does_not_import(path)
    assert f"model._target_={path} does not import" in text and cause in text, text
    assert "PYTHONPATH" in text


def _does_not_import(path: str) -> str:
    """``locate``'s one line for a ``path`` that does not import."""
    with pytest.raises(ConfigError) as info:
        locate("model._target_", path)
    return _one_line(info)


def test_the_reason_is_what_failed_inside_the_import(tmp_path, monkeypatch, caplog) -> None:
    """Hydra's lookup error, over several lines, becomes its cause: the module's own error,
    a dependency a submodule lacks, not the attribute Hydra looked for before importing."""
    (tmp_path / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "pkg_x").mkdir()
    (tmp_path / "pkg_x" / "__init__.py").write_text("")
    (tmp_path / "pkg_x" / "sub.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "(RuntimeError: boom at import)" in _does_not_import("boom.M")
        assert "No module named 'no_such_dependency'" in _does_not_import("pkg_x.sub.M")
        assert "module 'pkg_x' has no attribute 'nope'" in _does_not_import("pkg_x.nope.M")
    finally:
        for name in ("boom", "pkg_x", "pkg_x.sub"):
            sys.modules.pop(name, None)
    # hydra.utils.get_object logs each failed lookup over several lines; not here
    assert not [r for r in caplog.records if r.name == "hydra.utils"]


def test_a_module_that_fails_to_import_says_why(tmp_path, monkeypatch) -> None:
    (tmp_path / "halfbaked.py").write_text("import no_such_dependency\nclass M: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        locate("model._target_", "halfbaked.M")
    assert "No module named 'no_such_dependency'" in _one_line(info)
    sys.modules.pop("halfbaked", None)


def test_unknown_and_missing_arguments_are_named_with_their_value() -> None:
    with pytest.raises(ConfigError) as info:
        Target.load("optim", "torch.optim.SGD", {"lr": 0.1, "momentm": 0.9}).check(positional=1)
    text = _one_line(info)
    assert text.startswith("optim.momentm=0.9 is not an argument of torch.optim.SGD")
    assert "momentum" in text and "params" not in text  # the framework passes the parameters
    with pytest.raises(ConfigError) as info:
        Target.load("model", "torch.nn.Linear", {"out_features": 3}).check()
    assert "model._target_=torch.nn.Linear needs the argument in_features" in _one_line(info)
    # what the framework passes counts; **kwargs takes any key
    Target.load("model", "torch.nn.Linear", {"out_features": 3}).check(extra=["in_features"])
    Target.load("model", "builtins.dict", {"anything": 1}).check()


def test_fill_passes_what_the_signature_names_and_the_config_leaves_out() -> None:
    target = Target.load("model", "torch.nn.Linear", {"out_features": 3})
    values = {"in_features": 4, "out_features": 9, "num_classes": 10, "bias": None}
    # out_features is the config's, num_classes no parameter, bias unknown but optional
    assert target.fill(values) == {"in_features": 4}
    with pytest.raises(ConfigError) as info:
        target.fill({"in_features": None})
    assert "needs the argument in_features, which the data does not give" in _one_line(info)
    assert "set model.in_features" in str(info.value)


def test_call_is_hydra_instantiate_and_a_raise_is_one_line() -> None:
    layer = Target.load("model", "torch.nn.Linear", {"out_features": 3}).call(in_features=4)
    assert isinstance(layer, torch.nn.Linear) and layer.weight.shape == (3, 4)
    nested = Target.load(
        "model",
        "torch.nn.Sequential",
        {"_args_": [{"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 2}]},
    ).call()
    assert isinstance(nested[0], torch.nn.Linear)  # nested targets are built too
    with pytest.raises(ConfigError) as info:
        Target.load("optim", "torch.optim.SGD", {"lr": -1.0}).call([torch.zeros(2)])
    text = _one_line(info)
    assert text == "optim._target_=torch.optim.SGD raised ValueError: Invalid learning rate: -1.0"
    assert isinstance(info.value.__cause__, ValueError)


def test_a_module_is_no_target() -> None:
    with pytest.raises(ConfigError) as info:
        Target.load("model", "torch.nn", {})
    assert "model._target_=torch.nn is of type module; it must name a class or function" in str(
        info.value
    )
