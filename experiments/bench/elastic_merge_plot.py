"""One elastic run's membership and consensus distance at every quorum, as JSON and a plot.

``python -m experiments.bench.elastic_merge_plot RUN_DIR --out PREFIX`` reads the
hosts' ``metrics.jsonl`` of a ``fault_tolerance=torchft`` run (one folder per
replica id under ``RUN_DIR``) and writes ``PREFIX.json``: per host, at each
quorum it took part in, the step, the time, the members and the consensus
distance over them, and its changes of membership (who left, who joined, whom
it healed from). ``--from-json PREFIX.json`` draws ``PREFIX.png`` from that
file alone, so the committed plot comes from the committed data: the members
(top) and the consensus distance (bottom) against the step, one line a host,
a killed host's gap showing as its line stopping and starting again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def extract(run_dir: Path) -> dict[str, Any]:
    """Per host (folder with a ``metrics.jsonl``): its quorums and its changes of membership."""
    hosts: dict[str, Any] = {}
    for folder in sorted(p for p in Path(run_dir).iterdir() if (p / "metrics.jsonl").exists()):
        quorums, changes = [], []
        for raw in (folder / "metrics.jsonl").read_text().splitlines():
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if "consensus/distance" in line:
                quorums.append(
                    {
                        "step": line["step"],
                        "time": line.get("time"),
                        "members": line.get("elastic/members"),
                        "consensus": line["consensus/distance"],
                    }
                )
            if "elastic/change" in line:
                change = line["elastic/change"]
                changes.append(
                    {k: change.get(k) for k in ("step", "left", "joined", "healed_from")}
                )
        hosts[folder.name] = {"quorums": quorums, "changes": changes}
    if not hosts:
        raise ValueError(f"run_dir={str(run_dir)!r} holds no host folder with a metrics.jsonl")
    return {"run_dir": Path(run_dir).name, "hosts": hosts}


def _with_gaps(quorums: list[dict[str, Any]]) -> tuple[list, list, list]:
    """Steps, members and distances, with a break where a host missed quorums (it was dead)."""
    diffs = sorted(b["step"] - a["step"] for a, b in zip(quorums, quorums[1:]))
    usual = diffs[(len(diffs) - 1) // 2] if diffs else 0
    steps: list[Any] = []
    members: list[Any] = []
    consensus: list[Any] = []
    for i, q in enumerate(quorums):
        if i and usual and q["step"] - quorums[i - 1]["step"] > 2 * usual:
            steps.append(float("nan"))
            members.append(float("nan"))
            consensus.append(float("nan"))
        steps.append(q["step"])
        members.append(q["members"])
        consensus.append(q["consensus"])
    return steps, members, consensus


def plot(data: dict[str, Any], png: Path) -> None:
    """Members and consensus distance at each quorum against the step, one line a host."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 5))
    for name, host in data["hosts"].items():
        steps, members, consensus = _with_gaps(host["quorums"])
        top.step(steps, members, where="post", label=name)
        bottom.plot(steps, consensus, marker=".", linewidth=0.8, label=name)
        for change in host["changes"]:
            if change.get("healed_from"):
                bottom.axvline(change["step"], color="grey", linestyle=":", linewidth=0.8)
    top.set_ylabel("members")
    top.legend(ncol=4, fontsize=8)
    bottom.set_yscale("log")
    bottom.set_ylabel("consensus distance")
    bottom.set_xlabel("step (dotted: a host healed)")
    fig.suptitle(data["run_dir"], fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", nargs="?", type=Path, help="the run directory (hosts' folders)")
    p.add_argument("--out", type=Path, help="PREFIX: writes PREFIX.json and PREFIX.png")
    p.add_argument("--from-json", type=Path, help="draw PREFIX.png from PREFIX.json alone")
    args = p.parse_args(argv)
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
        png = args.from_json.with_suffix(".png")
    else:
        if args.run_dir is None or args.out is None:
            p.error("give RUN_DIR and --out PREFIX, or --from-json PREFIX.json")
        data = extract(args.run_dir)
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
        png = args.out.with_suffix(".png")
    plot(data, png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
