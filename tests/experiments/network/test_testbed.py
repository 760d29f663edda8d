"""The testbed: hosts as network namespaces with capped links, built, used and torn down for real.

Every test that builds uses its own name prefix and tears down in ``finally``;
on a machine without root or without the kernel's features they skip with the
testbed's own one-line reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.network import testbed as tb
from experiments.network.testbed.launch import wire_summary
from experiments.network.wire import WireCounter
from tests.support.launch import ROOT, clean_env

PREFIX = "ddpt"


def _need_testbed() -> None:
    why = tb.missing()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def bed2():
    """Two hosts at 20 Mb/s, torn down after the test whatever happens."""
    _need_testbed()
    spec = tb.Spec(hosts=2, rate_bps=tb.parse_rate("20mbit"), prefix=PREFIX)
    try:
        yield tb.up(spec)
    finally:
        tb.down(PREFIX)


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _in(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True).stdout


# ------------------------------------------------------------------ pure
@pytest.mark.parametrize(
    ("text", "bps"),
    [("5mbit", 5_000_000), ("100M", 100_000_000), ("1gbit", 10**9), ("500kbit", 500_000),
     ("2.5mbit", 2_500_000), ("1000", 1000), (12_000, 12_000)],
)  # fmt: skip
def test_parse_rate(text, bps):
    assert tb.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["fast", "5 tbit", "-3mbit", ""])
def test_parse_rate_refuses_with_one_line(text):
    with pytest.raises(tb.TestbedError, match="is invalid") as info:
        tb.parse_rate(text)
    assert "\n" not in str(info.value) and "5mbit" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"hosts": 0}, "hosts=0"), ({"hosts": 251}, "hosts=251"),
     ({"hosts": 2, "procs_per_host": 0}, "procs_per_host=0"),
     ({"hosts": 2, "rate_bps": 10}, "rate_bps=10"), ({"hosts": 2, "queue_ms": 0}, "queue_ms=0"),
     ({"hosts": 2, "nic_queue_ms": -1}, "nic_queue_ms=-1"),
     ({"hosts": 2, "prefix": "Bad-Name"}, "prefix='Bad-Name'")],
)  # fmt: skip
def test_spec_refuses_bad_values_with_one_line(kwargs, word):
    with pytest.raises(tb.TestbedError) as info:
        tb.Spec(**kwargs)
    assert word in str(info.value) and "\n" not in str(info.value)


def test_spec_names_and_addresses():
    spec = tb.Spec(hosts=3, prefix="abc")
    assert spec.namespaces() == ["abc-sw", "abc-h0", "abc-h1", "abc-h2"]
    assert [tb.address(i) for i in range(3)] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    # the token bucket holds 1 ms at the line rate, and never less than two frames
    assert tb.Spec(hosts=1, rate_bps=10**9).burst_bytes == 125_000
    assert tb.Spec(hosts=1, rate_bps=10**6).burst_bytes == 3028


def test_host_command_merges_a_users_rdzv_conf_with_is_host():
    from experiments.network.testbed.launch import host_command

    spec = tb.Spec(hosts=2, prefix="abc")
    args = ["--rdzv_conf=read_timeout=120,is_host=1", "--max-restarts=1"]
    for i in range(2):
        cmd = host_command(spec, i, ["train.py"], port=1, run_id="r", torchrun_args=args)
        assert cmd[:4] == ["ip", "netns", "exec", f"abc-h{i}"]
        confs = [a for a in cmd if a.startswith("--rdzv_conf")]
        assert confs == [f"--rdzv_conf=is_host={int(i == 0)},read_timeout=120"]
        assert f"--local_addr={tb.address(i)}" in cmd and cmd[-2:] == [
            "--max-restarts=1",
            "train.py",
        ]


def test_wire_counter_is_off_without_an_interface(monkeypatch):
    monkeypatch.delenv("DECENT_DP_WIRE_IFNAME", raising=False)
    counter = WireCounter.from_env()
    assert not counter.active and counter.pop() == {}


def test_wire_counter_refuses_an_unknown_interface():
    with pytest.raises(ValueError, match="no-such-if0"):
        WireCounter("no-such-if0")


def test_wire_counter_counts_loopback_traffic_scaled_to_hosts():
    import socket

    counter = WireCounter("lo", local_rank=0, local_world_size=3)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    client.sendall(b"x" * 100_000)
    got = 0
    while got < 100_000:
        got += len(peer.recv(65536))
    for s in (client, peer, server):
        s.close()
    line = counter.pop()
    # loopback counts each byte once sent and once received; three processes share the host
    assert line["wire/tx_bytes_per_step"] >= 3 * 100_000
    assert WireCounter("lo", local_rank=1).pop() == {
        "wire/tx_bytes_per_step": 0.0,
        "wire/rx_bytes_per_step": 0.0,
    }


def test_wire_summary_reads_the_trainers_lines(tmp_path):
    hosts = [dict.fromkeys(("tx_bytes", "rx_bytes", "tx_drops", "rx_drops"), v) for v in (10, 30)]
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"wire/tx_bytes_per_step": 4.0},
                {"eval/acc": 1.0},
                {"wire/tx_bytes_per_step": 6.0},
            ]
        )  # fmt: skip
    )
    out = wire_summary(hosts, tmp_path)
    assert out["tx_bytes_per_host"] == 20 and out["drops"] == 80
    assert out["tx_bytes_per_step"] == 5.0 and "rx_bytes_per_step" not in out


# ------------------------------------------------------------------ needs root and the kernel
def test_missing_names_what_is_missing_in_one_line(monkeypatch):
    from experiments.network.testbed import hosts

    monkeypatch.setattr(hosts.sys, "platform", "linux")
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    assert hosts._probe() == "the testbed needs root (network namespaces, veth, tc); run it as root"
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert hosts._probe() == "the testbed needs `ip` (Debian package iproute2); it is not on PATH"


def test_up_is_safe_idempotent_and_down_removes_everything(bed2):
    spec = bed2
    assert set(spec.namespaces()) <= _netns()
    assert tb.up(spec) == spec  # the same spec again: nothing rebuilt
    for i in range(2):
        ns = tb.host_ns(i, PREFIX)
        assert _in(ns, "ip", "route", "show", "default").strip() == ""  # nothing can leave
        assert _in(ns, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "0"
        assert f"inet {tb.address(i)}/24" in _in(ns, "ip", "-4", "addr", "show", "eth0")
        nic = _in(ns, "tc", "qdisc", "show", "dev", "eth0")
        assert "rate 20Mbit" in nic and "lat 604ms" in nic  # 1000 frames at 20 Mb/s
    # the root namespace got no interface of the testbed's
    assert "198.18." not in subprocess.run(["ip", "addr"], capture_output=True, text=True).stdout
    removed = tb.down(PREFIX)
    assert sorted(removed) == sorted(spec.namespaces())
    assert not set(spec.namespaces()) & _netns()
    assert tb.down(PREFIX) == []


def test_up_refuses_a_namespace_it_did_not_make():
    _need_testbed()
    foreign = f"{PREFIX}x-h0"
    subprocess.run(["ip", "netns", "add", foreign], check=True)
    try:
        with pytest.raises(tb.TestbedError, match=f"{foreign} exists and was not made"):
            tb.up(tb.Spec(hosts=1, prefix=f"{PREFIX}x"))
        assert foreign in _netns()  # left alone
        assert f"{PREFIX}x-sw" not in _netns()  # and nothing half-built stays
    finally:
        subprocess.run(["ip", "netns", "del", foreign], check=False)
        tb.down(f"{PREFIX}x")


def test_a_failed_build_is_torn_down(monkeypatch):
    _need_testbed()
    from experiments.network.testbed import hosts

    def broken(ns, dev, spec, nic):
        raise tb.TestbedError("tc failed on purpose")

    monkeypatch.setattr(hosts, "_cap", broken)
    with pytest.raises(tb.TestbedError, match="on purpose"):
        tb.up(tb.Spec(hosts=2, prefix=f"{PREFIX}f"))
    assert not {ns for ns in _netns() if ns.startswith(f"{PREFIX}f-")}
    assert tb.read_state(f"{PREFIX}f") is None


@pytest.mark.slow  # make test's 5-minute budget
def test_two_hosts_all_reduce_across_the_capped_wire(bed2, tmp_path):
    """A 2-host all-reduce is right, crosses the link, and takes at least the link's time."""
    numel = 250_000  # 1 MB: 0.4 s at 20 Mb/s
    script = str(ROOT / "tests/support/testbed_allreduce.py")
    result = tb.launch(bed2, [script, str(numel)], tmp_path, timeout_s=120, quiet=True,
                       env=clean_env(), port=29411)  # fmt: skip
    assert result["exit_codes"] == [0, 0]
    rows = [json.loads(line) for i in range(2)
            for line in (tmp_path / "testbed" / f"host{i}.log").read_text().splitlines()
            if line.startswith("{")]  # fmt: skip
    assert len(rows) == 2 and all(r["ok"] for r in rows)
    payload = numel * 4
    # a 2-rank ring all-reduce sends half the tensor twice each way
    for host in result["per_host"]:
        assert payload <= host["tx_bytes"] < 1.5 * payload
    s_over_b = payload * 8 / bed2.rate_bps
    assert min(r["seconds"] for r in rows) >= 0.9 * s_over_b


@pytest.mark.slow
def test_a_failing_host_stops_the_others_and_is_named(bed2, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, sys, time\n"
        "if os.environ['TESTBED_HOST'] == '1':\n"
        "    sys.exit('host one gives up')\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(tb.TestbedError, match=r"host 1 exited with 1: .*") as info:
        tb.launch(bed2, [str(bad)], tmp_path / "out", timeout_s=100, quiet=True,
                  env=clean_env(), port=29412)  # fmt: skip
    assert "\n" not in str(info.value)
    data = json.loads((tmp_path / "out" / "testbed.json").read_text())
    assert data["exit_codes"][1] == 1 and data["exit_codes"][0] != 0  # stopped, not left running


@pytest.mark.slow
def test_train_on_the_testbed_counts_the_wire(tmp_path):
    """train.py on 2 hosts: the link's bytes per step stand beside the library's count."""
    _need_testbed()
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments.network.testbed", "--prefix", PREFIX, "run",
           "--hosts", "2", "--rate", "50mbit", "--out", str(out), "--timeout-s", "300", "--port", "29413",
           "--", "topology=ring", "train.max_steps=10", "log.every=10", "log.consensus_sketch=0",
           "log.consensus_every=0", "logger=none", "log.progress=false"]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not {ns for ns in _netns() if ns.startswith(f"{PREFIX}-")}  # torn down after
    summary = json.loads((out / "summary.json").read_text())
    wire, lib = summary["wire"], summary["comm/bytes_per_step"]
    # gossip plus headers, acks, the metrics line's and the stop check's tiny all-reduces
    assert lib <= wire["tx_bytes_per_step"] < 1.25 * lib
    assert wire["drops"] == 0
