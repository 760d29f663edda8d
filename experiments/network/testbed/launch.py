"""Run a training job on the testbed: one ``torchrun`` per host, c10d rendezvous on host 0.

Each host's launcher runs inside the host's namespace with ``GLOO_SOCKET_IFNAME``
and ``NCCL_SOCKET_IFNAME`` set to its link, so every byte between hosts crosses
a capped link. Host 0 serves the rendezvous store. The job writes into one
output folder (the hosts share this machine's disk); the launchers' logs go to
``OUT/testbed/host<i>.log``, and ``OUT/testbed.json`` holds what each host's
link carried. Where the job wrote a ``summary.json``, its ``wire`` key gets the
same, beside the library's own ``comm/bytes_per_step``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .hosts import IFACE, Spec, TestbedError, address, host_ns, link_stats, netns_pids

__all__ = [
    "WIRE_IFNAME_ENV",
    "host_command",
    "host_env",
    "launch",
    "threads_per_process",
    "wire_summary",
]

WIRE_IFNAME_ENV = "DECENT_DP_WIRE_IFNAME"
"""The interface whose counters the trainer reads into ``wire/*`` metrics."""
_GRACE_S = 10.0


def host_command(
    spec: Spec,
    i: int,
    args: Sequence[str],
    *,
    port: int,
    run_id: str,
    torchrun_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The command that starts host ``i``'s launcher: ``torchrun ARGS`` inside its namespace.

    A ``--rdzv_conf`` among ``torchrun_args`` is merged with the testbed's own ``is_host``.
    """
    # the rendezvous cannot tell by name which namespace owns the address
    conf = [f"is_host={int(i == 0)}"]
    rest = []
    for arg in torchrun_args:
        key, sep, value = arg.partition("=")
        if sep and key in ("--rdzv_conf", "--rdzv-conf"):
            conf += [kv for kv in value.split(",") if kv and not kv.startswith("is_host=")]
        else:
            rest.append(arg)
    return [
        "ip", "netns", "exec", host_ns(i, spec.prefix),
        python, "-m", "torch.distributed.run",
        f"--nnodes={spec.hosts}",
        f"--nproc_per_node={spec.procs_per_host}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={address(0)}:{port}",
        f"--rdzv_id={run_id}",
        f"--rdzv_conf={','.join(conf)}",
        # every namespace shares the machine's hostname, which resolves to loopback
        f"--local_addr={address(i)}",
        *rest,
        *args,
    ]  # fmt: skip


_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


def host_env(i: int, spec: Spec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Host ``i``'s launcher environment: the caller's, less its own launcher's variables,
    with the link named for gloo, NCCL and the wire counter, and a share of the cores."""
    # a launcher's variables from the caller's own job would confuse the hosts' torchrun
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARS and not k.startswith("TORCHELASTIC_")
    }
    env.update(
        GLOO_SOCKET_IFNAME=IFACE,
        NCCL_SOCKET_IFNAME=IFACE,
        TP_SOCKET_IFNAME=IFACE,
        PYTHONUNBUFFERED="1",
        TESTBED_HOST=str(i),
    )
    env[WIRE_IFNAME_ENV] = IFACE
    # the hosts share this machine's cores: torchrun leaves one process per host its
    # default thread count, and oversubscribed OpenMP threads would slow every step
    env.setdefault("OMP_NUM_THREADS", str(threads_per_process(spec)))
    env.update(extra or {})
    return env


def threads_per_process(spec: Spec) -> int:
    """This machine's cores shared among every process of every host, at least one each."""
    return max(1, (os.cpu_count() or 1) // (spec.hosts * spec.procs_per_host))


def _stop(procs: list[subprocess.Popen[bytes]], spec: Spec) -> None:
    """SIGTERM every launcher's process group, then SIGKILL whatever runs in the hosts.

    torchrun starts each worker in a session of its own, so the last resort
    kills every process in the hosts' namespaces, not only the launchers' groups.
    """
    live = [p for p in procs if p.poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while any(p.poll() is None for p in live) and time.monotonic() < deadline:
        time.sleep(0.1)
    for i in range(spec.hosts):
        for pid in netns_pids(host_ns(i, spec.prefix)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(p.poll() is None for p in live) and time.monotonic() < deadline:
        time.sleep(0.1)


def _delta(before: list[dict[str, int]], after: list[dict[str, int]]) -> list[dict[str, int]]:
    return [{k: a[k] - b[k] for k in a} for b, a in zip(before, after)]


def wire_summary(per_host: list[dict[str, int]], run_dir: Path) -> dict[str, Any]:
    """The ``wire`` entry of ``summary.json``: each host's link totals and the per-step means.

    ``tx_bytes_per_step`` is the trainer's own reading of its host's link over its
    training windows (``wire/tx_bytes_per_step`` on the metrics lines), averaged
    over the lines; the totals also count start-up, evaluation and shutdown.
    """
    hosts = max(len(per_host), 1)
    out: dict[str, Any] = {
        "tx_bytes_per_host": sum(h["tx_bytes"] for h in per_host) / hosts,
        "rx_bytes_per_host": sum(h["rx_bytes"] for h in per_host) / hosts,
        "drops": sum(h["tx_drops"] + h["rx_drops"] for h in per_host),
        "per_host": per_host,
    }
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(raw) for raw in path.read_text().splitlines()] if path.exists() else []
    for key in ("wire/tx_bytes_per_step", "wire/rx_bytes_per_step"):
        values = [float(x[key]) for x in lines if isinstance(x.get(key), int | float)]
        if values:
            out[key.split("/")[1]] = sum(values) / len(values)
    return out


def launch(
    spec: Spec,
    args: Sequence[str],
    out_dir: str | Path,
    *,
    port: int = 29400,
    timeout_s: float | None = None,
    torchrun_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run ``torchrun ... ARGS`` on every host of the testbed that is up and wait for it.

    Args:
        spec: The testbed that is up (:func:`.hosts.current`).
        args: The script and its arguments, e.g. ``["train.py", "topology=ring"]``.
            For ``train.py``, ``hydra.run.dir=OUT`` is added so every host writes
            into ``out_dir``.
        out_dir: The output folder.
        port: The rendezvous port on host 0.
        timeout_s: Stop every host after this long (``None``: no limit).
        torchrun_args: Extra launcher arguments (e.g. ``--max-restarts=2``).
        env: Extra environment for every host.
        python: The interpreter.
        quiet: Print nothing while waiting.

    Returns:
        ``testbed.json``'s content: the spec, each host's exit code and link
        counters over the run, and the wall time.

    Raises:
        TestbedError: A host's launcher failed (the message names the host and
            the last line of its log), or the timeout passed.
    """
    out = Path(out_dir).resolve()
    logs = out / "testbed"
    logs.mkdir(parents=True, exist_ok=True)
    args = list(args)
    if (
        args
        and args[0].endswith("train.py")
        and not any(a.startswith("hydra.run.dir=") for a in args)
    ):
        args.append(f"hydra.run.dir={out}")
    run_id = f"testbed-{uuid.uuid4().hex[:8]}"
    before = link_stats(spec)
    start = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(spec.hosts):
            cmd = host_command(spec, i, args, port=port, run_id=run_id,
                               torchrun_args=torchrun_args, python=python)  # fmt: skip
            with open(logs / f"host{i}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     env=host_env(i, spec, env), start_new_session=True)
                )  # fmt: skip
        failed = _wait(procs, spec, logs, start, timeout_s, quiet)
    except BaseException:
        _stop(procs, spec)
        raise
    elapsed = time.monotonic() - start
    per_host = _delta(before, link_stats(spec))
    result: dict[str, Any] = {
        "spec": asdict(spec),
        "args": args,
        "elapsed_s": elapsed,
        "exit_codes": [p.returncode for p in procs],
        "per_host": per_host,
    }
    (out / "testbed.json").write_text(json.dumps(result, indent=2) + "\n")
    summary = out / "summary.json"
    if summary.exists():
        data = json.loads(summary.read_text())
        data["wire"] = {"rate_bps": spec.rate_bps, "hosts": spec.hosts,
                        "procs_per_host": spec.procs_per_host, **wire_summary(per_host, out)}  # fmt: skip
        summary.write_text(json.dumps(data, indent=2) + "\n")
    if failed is not None:
        raise TestbedError(failed)
    return result


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _wait(
    procs: list[subprocess.Popen[bytes]],
    spec: Spec,
    logs: Path,
    start: float,
    timeout_s: float | None,
    quiet: bool,
) -> str | None:
    """Wait for every launcher; stop the rest once one fails. The failure's line, or ``None``."""
    next_note = start + 10.0
    while True:
        codes = [p.poll() for p in procs]
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            _stop(procs, spec)
            i = bad[0]
            return f"host {i} exited with {codes[i]}: {_last_line(logs / f'host{i}.log')}"
        if all(c == 0 for c in codes):
            return None
        now = time.monotonic()
        if timeout_s is not None and now - start > timeout_s:
            _stop(procs, spec)
            return f"the job ran past its {timeout_s:.0f} s limit; every host was stopped"
        if not quiet and now >= next_note:
            done = sum(c == 0 for c in codes)
            print(f"testbed: {now - start:.0f} s, {done}/{len(procs)} hosts done", file=sys.stderr)
            next_note = now + 10.0
        time.sleep(0.2)
