"""Compose every option of every config group, every experiment, and the error cases."""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import experiments.train.config as config_module
from decent_dp.topo import TopologyReg

CONF = Path(__file__).resolve().parents[3] / "conf"
GROUPS = (
    "model",
    "dataset",
    "optim",
    "scheduler",
    "topology",
    "network",
    "compression",
    "logger",
    "outer",
    "fault_tolerance",
    "engine",
)
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
# options that are presets of a named model: their name is the model's, not the file's
PRESETS = {("model", "gpt_tiny"): "gpt", ("model", "gpt2_124m"): "gpt"}


@pytest.fixture(autouse=True)
def _clear_hydra():
    yield
    GlobalHydra.instance().clear()


def _compose(overrides: list[str] = (), conf: Path = CONF, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _error_text(exc: BaseException) -> str:
    parts = []
    while exc is not None:
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def test_default_config_composes():
    cfg = _compose()
    assert cfg.model.name == "small_cnn"
    assert cfg.dataset.name == "digits"
    assert cfg.optim.name == "sgd"
    assert cfg.scheduler.name == "cosine_warmup"
    assert cfg.topology.name == "one-peer-exp"
    assert cfg.network.name == "none"
    assert cfg.logger.name == "wandb" and cfg.logger.mode == "offline"
    assert cfg.train.max_steps is None and cfg.train.batch_size > 0
    assert cfg.checkpoint.every_steps == 0
    assert cfg.dist.backend is None
    # names are str enums that print as their value
    assert f"{cfg.topology.name}" == "one-peer-exp" and str(cfg.topology.name) == "one-peer-exp"


def test_group_options_exist():
    assert _options("model") == sorted(
        ["small_cnn", "resnet18_cifar", "resnet50", "vit_small", "gpt", "gpt_tiny", "gpt2_124m"]
    )
    assert _options("dataset") == sorted(
        ["digits", "cifar10", "cifar100", "imagenet", "synthetic", "tokens"]
    )
    assert _options("optim") == sorted(
        ["sgd", "qgm_sgd", "adam", "adamw", "accum_adam", "accum_adamw", "lagged_v_adamw"]
    )
    assert _options("scheduler") == sorted(["cosine_warmup", "constant", "step"])
    assert _options("topology") == sorted([*TopologyReg.names(), "allreduce"])
    assert _options("network") == sorted(["none", "ethernet_25g", "infiniband_100g", "custom"])
    assert _options("logger") == ["none", "wandb"]
    assert _options("compression") == ["bf16", "int8", "none", "randk"]
    assert {"digits_quick", "cifar10_resnet18", "imagenet_resnet50"} <= set(EXPERIMENTS)
    assert {"lm_quick", "gpt2_owt", "gpt2_owt_allreduce"} <= set(EXPERIMENTS)


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    # every option's name is its file name, but for the presets of a model
    assert cfg[group].name == PRESETS.get((group, option), option)
    # the whole config resolves and every other group keeps its default
    container = OmegaConf.to_container(cfg, resolve=True)
    assert set(container) == {*GROUPS, "train", "log", "checkpoint", "dist"}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_is_a_diff(experiment):
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    cfg = _compose([f"experiment={experiment}"])
    OmegaConf.to_container(cfg, resolve=True)


def test_imagenet_recipe():
    cfg = _compose(["experiment=imagenet_resnet50"])
    assert cfg.model.name == "resnet50" and cfg.dataset.name == "imagenet"
    assert cfg.topology.name == "alternating-exp-ring"
    assert cfg.optim.name == "accum_adam" and cfg.optim.lr == 1.5e-3 and cfg.optim.accum_iter == 8
    assert cfg.scheduler.name == "cosine_warmup" and cfg.scheduler.warmup_epochs == 5
    assert cfg.train.epochs == 90 and cfg.train.label_smoothing == 0.1
    assert cfg.train.batch_size * 32 == 1024  # per-worker batch for 32 workers
    base = _compose(["experiment=imagenet_resnet50_allreduce"])
    assert base.topology.name == "allreduce"
    assert base.optim.name == "adam" and base.optim.lr == 1e-3
    assert (
        base.train.epochs == 90
        and base.train.batch_size == 32
        and base.train.label_smoothing == 0.1
    )


def test_gpt2_owt_recipes():
    cfg = _compose(["experiment=gpt2_owt"])
    assert cfg.model.name == "gpt" and cfg.dataset.name == "tokens"
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) == (12, 12, 768, 1024, 50304)
    assert m.bias is False and m.dropout == 0.0
    assert cfg.dataset.root == "data/openwebtext" and cfg.dataset.block_size is None
    assert cfg.topology.name == "alternating-exp-ring"
    o = cfg.optim
    assert o.name == "accum_adamw" and list(o.betas) == [0.9, 0.98] and o.accum_iter == 8
    assert o.lr == 6e-4 and o.weight_decay == 0.1
    s = cfg.scheduler
    assert s.name == "cosine_warmup" and s.warmup_steps == 2000 and s.eta_min == 6e-5
    t = cfg.train
    assert t.max_steps == 600_000 and t.global_batch_size == 480 and t.grad_clip_norm == 1.0
    assert t.amp == "bf16"
    base = _compose(["experiment=gpt2_owt_allreduce"])
    assert base.topology.name == "allreduce"
    assert base.optim.name == "adamw" and list(base.optim.betas) == [0.9, 0.95]
    assert base.optim.lr == 6e-4 and base.optim.weight_decay == 0.1
    # the rest of the recipe is the same
    for section in ("model", "dataset", "scheduler", "train", "log", "checkpoint"):
        assert base[section] == cfg[section], section


def test_gpt2_owt_decays_matrices_only():
    import torch

    from experiments.models.gpt import build_gpt
    from experiments.train.optim import build_optim_fn

    cfg = _compose(["experiment=gpt2_owt"])
    model = build_gpt({"name": "gpt", "n_layer": 1, "n_embd": 64, "bias": True}, vocab_size=64)
    optimizer = build_optim_fn(cfg.optim)(list(model.named_parameters()))
    decay = {g["weight_decay"]: g["params"] for g in optimizer.param_groups}
    assert set(decay) == {0.1, 0.0}
    assert all(p.ndim >= 2 for p in decay[0.1]) and all(p.ndim < 2 for p in decay[0.0])
    assert type(optimizer).__name__ == "AccumAdamW" and isinstance(optimizer, torch.optim.Optimizer)


def test_lm_quick_recipe():
    cfg = _compose(["experiment=lm_quick"])
    assert cfg.model.name == "gpt" and cfg.model.n_layer == 4 and cfg.model.n_embd == 128
    assert cfg.dataset.name == "tokens" and cfg.dataset.root == "data/stdlib-bpe"
    assert cfg.optim.name == "adamw" and cfg.scheduler.name == "cosine_warmup"
    assert cfg.logger.name == "none" and cfg.scheduler.warmup_steps is not None
    steps_per_epoch = cfg.dataset.tokens_per_epoch // (
        cfg.train.batch_size * cfg.dataset.block_size * 4
    )
    assert 2 <= cfg.train.max_steps // steps_per_epoch <= 8  # a few evaluations on 4 workers


def test_lm_small_is_eight_times_lm_quick_with_evaluations_at_each_eighth():
    quick, small = _compose(["experiment=lm_quick"]), _compose(["experiment=lm_small"])

    def tokens(cfg):
        return cfg.train.batch_size * cfg.dataset.block_size * 4 * cfg.train.max_steps

    assert tokens(small) == 8 * tokens(quick) == 4_194_304
    assert small.model == quick.model  # gpt_tiny, no smaller
    assert small.dataset.root == "data/stdlib-bpe-all" and small.scheduler.eta_min == 0.0
    per_step = small.train.batch_size * small.dataset.block_size * 4
    evals = tokens(small) // small.dataset.tokens_per_epoch
    assert evals == 16 and small.dataset.tokens_per_epoch % per_step == 0
    # DiLoCo at H=16 gets at least 30 outer rounds
    assert small.train.max_steps // 16 >= 30


def test_cifar_experiment_and_command_line_root():
    cfg = _compose(["experiment=cifar10_resnet18", "dataset.root=/data/cifar"])
    assert cfg.model.name == "resnet18_cifar" and cfg.dataset.name == "cifar10"
    assert cfg.dataset.root == "/data/cifar" and cfg.topology.name == "ring"


def test_command_line_group_overrides_an_experiment():
    cfg = _compose(["experiment=cifar10_resnet18", "topology=allreduce"])
    assert cfg.topology.name == "allreduce"


def test_slurm_launcher_config():
    cfg = _compose(["hydra/launcher=slurm"], hydra_cfg=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.nodes >= 1 and launcher.tasks_per_node >= 1 and launcher.gpus_per_node >= 1
    assert launcher.timeout_min > 0


def test_hydra_settings():
    cfg = _compose(hydra_cfg=True)
    assert cfg.hydra.job.chdir is False
    run_dir = OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"]
    sweep_dir = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["dir"]
    assert run_dir.startswith("outputs/") and sweep_dir.startswith("multirun/")
    # same timestamp as the resolver gives, so run and sweep dirs are well-formed
    datetime.datetime.strptime(run_dir, "outputs/%Y-%m-%d/%H-%M-%S")


@pytest.mark.parametrize("group", GROUPS + ("experiment",))
def test_unknown_option_lists_available_ones(group):
    with pytest.raises(Exception) as info:
        _compose([f"{group}=no_such_option"])
    text = _error_text(info.value)
    assert "no_such_option" in text
    options = _options(group) if group != "experiment" else EXPERIMENTS
    for option in options:
        assert option in text


@pytest.mark.parametrize(
    "override",
    ["optim.lrr=0.1", "train.batchsize=8", "topology.nam=ring", "model.depth=2", "logger.projct=x"],
)
def test_unknown_key_fails_the_schema(override):
    with pytest.raises(Exception) as info:
        _compose([override])
    assert override.split("=")[0] in _error_text(info.value)


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("topology.name=star", "one-peer-exp"),
        ("train.amp=fp32", "bf16"),
        ("train.nan_policy=ignore", "skip"),
        ("optim.name=lion", "adamw"),
        ("dataset.partition=shards", "dirichlet"),
        ("model.name=resnet9", "vit_small"),
    ],
)
def test_unknown_name_lists_known_names(override, allowed):
    with pytest.raises(Exception) as info:
        _compose([override])
    text = _error_text(info.value)
    assert override.split("=")[1] in text and allowed in text


def test_wrong_type_fails():
    with pytest.raises(Exception) as info:
        _compose(["train.batch_size=many"])
    assert "batch_size" in _error_text(info.value)


@pytest.fixture
def conf_copy(tmp_path):
    dst = tmp_path / "conf"
    shutil.copytree(CONF, dst)
    return dst


def test_unknown_topology_in_custom_yaml_fails_at_compose(conf_copy):
    (conf_copy / "topology" / "star.yaml").write_text(
        "defaults:\n  - /schema/topology/topology@_here_\n  - _self_\nname: star\n"
    )
    with pytest.raises(Exception) as info:
        _compose(["topology=star"], conf=conf_copy)
    text = _error_text(info.value)
    assert "star" in text
    for name in TopologyReg.names():
        assert name in text


def test_misspelt_key_in_custom_yaml_fails_at_compose(conf_copy):
    (conf_copy / "optim" / "fast_sgd.yaml").write_text(
        "defaults:\n  - /schema/optim/sgd@_here_\n  - _self_\nname: sgd\nlr: 0.5\nmomentm: 0.9\n"
    )
    with pytest.raises(Exception) as info:
        _compose(["optim=fast_sgd"], conf=conf_copy)
    assert "momentm" in _error_text(info.value)
    (conf_copy / "optim" / "fast_sgd.yaml").write_text(
        "defaults:\n  - /schema/optim/sgd@_here_\n  - _self_\nname: sgd\nlr: 0.5\n"
    )
    assert _compose(["optim=fast_sgd"], conf=conf_copy).optim.lr == 0.5


def test_enums_match_the_registries():
    from experiments.data import DATASETS
    from experiments.models import MODELS

    assert [m.value for m in config_module.ModelName] == list(MODELS)
    assert [t.value for t in config_module.TopologyName] == [*TopologyReg.names(), "allreduce"]
    assert [d.value for d in config_module.DatasetName] == list(DATASETS)


def test_network_presets_match_netem():
    from experiments.network.netem import PROFILES

    for name, profile in PROFILES.items():
        cfg = _compose([f"network={name}"])
        assert cfg.network.latency_ms == profile.latency_ms
        assert cfg.network.bandwidth_gbps == profile.bandwidth_gbps


def test_plain_strips_enums():
    cfg = _compose()
    container = config_module.plain(OmegaConf.to_container(cfg, resolve=True))
    assert type(container["topology"]["name"]) is str
    assert type(container["train"]["amp"]) is str and container["train"]["amp"] == "off"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_time_is_agreed_through_the_agent_store(monkeypatch):
    import torch.distributed as dist

    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"test-{os.getpid()}")
    first = time.time() - 3600.0
    # the first rank's clock wins; later ranks (and restarts) read it back
    assert config_module._agreed_timestamp(first) == first
    assert config_module._agreed_timestamp(first + 5.0) == first
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"other-{os.getpid()}")
    assert config_module._agreed_timestamp(first + 7.0) == first + 7.0
    del store


def test_launch_time_without_torchrun_is_the_local_clock(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert config_module._agreed_timestamp(123.5) == 123.5
    stamp = config_module.launch_time("%Y-%m-%d")
    assert stamp == config_module.launch_time("%Y-%m-%d")  # fixed for the process
    datetime.datetime.strptime(stamp, "%Y-%m-%d")


def test_config_object_is_every_section_as_its_dataclass():
    from experiments.train.outer import OuterConfig

    cfg = _compose(["outer=diloco", "model=vit_small", "optim=adamw", "compression=int8"])
    c = config_module.config_object(cfg)
    assert isinstance(c, config_module.MainConfig)
    assert isinstance(c.model, config_module.VitConfig) and c.model.dim == cfg.model.dim
    assert isinstance(c.optim, config_module.AdamWConfig)
    assert isinstance(c.optim.state_sync, config_module.StateSyncConfig)
    assert isinstance(c.outer, OuterConfig) and c.outer.lr == 0.7
    assert isinstance(c.train, config_module.TrainConfig) and c.train.amp == "off"
    # a plain DictConfig (no schema) is typed by the schema of each section's name
    untyped = OmegaConf.create(OmegaConf.to_container(cfg))
    assert config_module.config_object(untyped) == c
    # an optional group left out stays None
    del untyped["outer"]
    assert config_module.config_object(untyped).outer is None


@pytest.mark.parametrize(
    ("schema", "values", "line"),
    [
        ("TrainConfig", {"batch_size": 0}, "train.batch_size=0 is invalid; it must be an integer > 0"),
        ("TrainConfig", {"max_steps": 0}, "train.max_steps=0 is invalid; it must be an integer > 0"),
        ("TrainConfig", {"label_smoothing": 1.0}, "train.label_smoothing=1.0 is invalid; it must be in [0, 1)"),
        ("LogConfig", {"consensus_sketch": -1}, "log.consensus_sketch=-1 is invalid; it must be an integer >= 0 (0 = no sketch)"),
        ("CheckpointConfig", {"keep": 0}, "checkpoint.keep=0 is invalid; it must be >= 1"),
        ("DistConfig", {"backend": "mpi"}, "dist.backend=mpi is invalid; it must be nccl, gloo or null (auto)"),
        ("TopologyConfig", {"name": "ring", "bucket_size_in_mb": 0}, "topology.bucket_size_in_mb=0 is invalid; it must be > 0"),
        ("CompressionConfig", {"name": "randk", "ratio": 0}, "compression.ratio=0 is invalid; it must be in (0, 1]"),
        ("NetworkConfig", {"name": "custom", "latency_ms": 0.1}, "network=custom: network 'custom' needs bandwidth_gbps; it is missing"),
        ("CosineWarmupConfig", {"name": "cosine_warmup", "warmup_decay": 0}, "scheduler.warmup_decay=0 is invalid; it must be in (0, 1]"),
        ("StepConfig", {"name": "step", "gamma": 0}, "scheduler.gamma=0 is invalid; it must be > 0"),
    ],
)  # fmt: skip
def test_each_schema_checks_its_values_when_built(schema, values, line):
    with pytest.raises(config_module.ConfigError) as info:
        getattr(config_module, schema)(**values)
    assert str(info.value) == line


def test_the_outer_and_fault_tolerance_schemas_check_their_values_when_built():
    from experiments.train.fault_tolerance import FaultToleranceConfig
    from experiments.train.outer import OuterConfig

    with pytest.raises(
        config_module.ConfigError,
        match=r"^outer.fragments=2 is invalid; it must be 1 with outer=none$",
    ):
        OuterConfig(fragments=2)
    with pytest.raises(
        config_module.ConfigError,
        match=r"^outer.every=0 is invalid; it must be an integer >= 1 or null$",
    ):
        OuterConfig(name="diloco", every=0)
    OuterConfig(name="diloco", every=None)  # null: the topology's period (outer_every's rule)
    FaultToleranceConfig(min_replicas=0)  # fault_tolerance=none reads none of its keys
    with pytest.raises(
        config_module.ConfigError, match=r"^fault_tolerance.min_replicas=0 is invalid"
    ):
        FaultToleranceConfig(name="torchft", min_replicas=0)
