"""``fault_tolerance=torchft``: the config group, its one-line refusals, and two hosts' replicas.

The two hosts are two spawned processes, each running ``run(cfg)`` as its own
``torchrun --nproc_per_node=1`` would, on a lighthouse on loopback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.schema import ConfigError
from experiments.train.run import validate
from tests.support.launch import compose_config

pytest.importorskip("torchft")

from tests.support.elastic_hosts import FT, run_hosts  # noqa: E402


def test_off_by_default_and_composes_with_its_keys() -> None:
    assert str(compose_config().fault_tolerance.name) == "none"
    cfg = compose_config(*FT, "fault_tolerance.min_replicas=3", "fault_tolerance.replica_id=a")
    ft = cfg.fault_tolerance
    assert (ft.min_replicas, ft.replica_id, ft.timeout_s, ft.quorum_every) == (3, "a", 60.0, 8)
    assert ft.lighthouse.startswith("http://")
    validate(cfg, 1)
    validate(compose_config(*FT, "outer=slowmo", "outer.every=16"), 1)  # a plain outer round
    # outer rounds on the wrapper's path: with compressed gossip too
    validate(compose_config(*FT, "compression=int8", "outer=slowmo", "outer.every=16"), 1)


@pytest.mark.parametrize(
    ("overrides", "world", "message"),
    [
        (
            ("outer=diloco", "outer.fragments=2", "outer.every=16"),
            1,
            r"^outer=diloco with fragments=2",
        ),
        (
            ("outer=slowmo", "outer.every=12"),
            1,
            r"^outer.every=12 is invalid; it must be a multiple of",
        ),
        (("topology=hierarchical",), 1, r"^topology=hierarchical cannot be elastic"),
        (("topology=allreduce",), 1, r"^topology=allreduce cannot be elastic"),
        (
            ("topology=alternating-exp-ring",),
            1,
            r"^topology='alternating-exp-ring' cannot be elastic",
        ),
        (
            ("optim=adamw", "optim.state_sync.exp_avg_sq=1"),
            1,
            r"^optim.state_sync=\{'exp_avg_sq': 1\} cannot",
        ),
        (
            ("fault_tolerance.lighthouse=nowhere",),
            1,
            r"^fault_tolerance.lighthouse=nowhere is invalid",
        ),
        (("fault_tolerance.replica_id='a:b'",), 1, r"^fault_tolerance.replica_id=a:b is invalid"),
        (("fault_tolerance.min_replicas=0",), 1, r"^fault_tolerance.min_replicas=0 is invalid"),
        (
            ("train.global_batch_size=64",),
            1,
            r"^train.global_batch_size=64 cannot be elastic with fault_tolerance=torchft: the hosts",
        ),
        (
            ("train.shard_size=2",),
            2,
            r"^train.shard_size=2 cannot be elastic with fault_tolerance=torchft: a sharded",
        ),
    ],
)
def test_what_cannot_be_elastic_is_one_line(
    overrides: tuple[str, ...], world: int, message: str
) -> None:
    cfg = compose_config(*FT, *overrides)
    with pytest.raises(ConfigError, match=message) as e:
        validate(cfg, world)
    assert "\n" not in str(e.value)


def test_checkpoints_with_the_default_replica_id_warn_in_one_line() -> None:
    """A whole-job restart finds each host's checkpoints under its replica id: the default
    one (the launch's run id or PID) is new at every launch, so nothing would be resumed."""
    import warnings

    with pytest.warns(UserWarning, match=r"^fault_tolerance.replica_id=null with checkpoint") as w:
        validate(compose_config(*FT, "checkpoint.every_steps=10"), 1)
    assert len(w) == 1 and "\n" not in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(
            compose_config(*FT, "checkpoint.every_steps=10", "fault_tolerance.replica_id=a"), 1
        )
        validate(compose_config(*FT), 1)  # no checkpoints: nothing to resume anyway


def test_one_torchrun_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's processes are one replica group; a torchrun over several nodes is refused."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    validate(compose_config(*FT), 4)  # torchrun --nproc_per_node=4 on one host
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(
        ConfigError, match=r"one torchrun per host .* world size of 4 over hosts of 2"
    ):
        validate(compose_config(*FT), 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # a host of two processes: hierarchical's host
    validate(compose_config(*FT, "topology=hierarchical"), 2)
    validate(compose_config(*FT, "outer=slowmo", "outer.every=16"), 2)  # outer rounds too


def test_two_hosts_train_elastically_and_the_second_heals_from_the_first(tmp_path: Path) -> None:
    # compressed gossip and DiLoCo's outer rounds (at the quorum of step 4), on the wrapper's
    # path: elastic too (the checkpoint test runs the exact path)
    out = run_hosts(tmp_path, "compression=int8", "outer=diloco", "outer.every=3")
    for rid in ("h0", "h1"):
        summary = out[rid]
        assert not isinstance(summary, BaseException), summary
        assert summary["steps"] == 6 and summary["members"] == ["h0", "h1"]
        assert 0.0 <= summary["eval/acc_local"] <= 1.0
        lines = [json.loads(x) for x in (tmp_path / rid / "metrics.jsonl").read_text().splitlines()]
        quorums = [x for x in lines if "elastic/members" in x]
        assert [x["step"] for x in quorums] == [1, 4]  # a quorum every 3 steps
        assert quorums[0]["consensus/distance"] == 0.0  # the first quorum aligned the models
        assert all(x["elastic/members"] == 2 for x in quorums)
        train = [x for x in lines if "train/loss" in x]
        assert [x["step"] for x in train] == [3, 6]
        # what every run logs: throughput, bytes, the learning rate
        for x in train:
            assert x["perf/samples_per_s"] > 0 and x["comm/bytes_per_step"] > 0, x
        assert train[0]["train/lr"] > train[1]["train/lr"] >= 0  # the cosine schedule's
        assert [x["step"] for x in lines if "eval/acc" in x] == [6]
        assert (tmp_path / rid / "summary.json").exists()
    # the members' average model, evaluated alike on both
    assert out["h0"]["eval/acc"] == out["h1"]["eval/acc"]
    # everyone starts from rank 0's state: h1 healed from h0
    assert out["h1"]["changes"][0]["healed_from"] == "h0"
    assert out["h0"]["changes"][0]["healed_from"] is None
