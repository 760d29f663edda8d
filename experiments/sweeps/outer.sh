#!/usr/bin/env bash
# Outer optimizer (DiLoCo: local-sgd + outer Nesterov SGD lr 0.7 momentum 0.9) against plain
# local-sgd with the same H, allreduce and one-peer-exp, 4 CPU gloo workers, 3 seeds, the same
# step budget per task:
#   digits IID and digits Dirichlet alpha=0.1 (small_cnn, 20 epochs), and the tiny GPT
#   (experiment=lm_quick, 128 steps) on the embedded corpus.
# H in {8, 32} on digits; H=8 only on the LM (LM_HS="8 32" adds H=32: its 128 steps hold just
# four outer steps at H=32). About 60 minutes on 2 cores shared with other jobs.
# SlowMo over gossip (one-peer-exp, slow momentum 0.5, slow lr 1, every 8 steps) on digits.
# PART=base runs the configurations without an outer optimizer, PART=outer the DiLoCo and SlowMo
# ones (PART=slowmo only SlowMo), PART=all (default) all; SKIP_RUNS=1 only rebuilds the reports in docs/results/outer/ from
# the runs' files committed there (runs/<task>/<configuration>/seed<k>/).
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
OUT=${OUT:-multirun/outer}
DOCS=${DOCS:-docs/results/outer}
PART=${PART:-all}
DATA=data/stdlib-bpe
SUB='hydra.sweep.subdir=seed${train.seed}'
run() {  # run <task> <config name> <overrides...>
  local task=$1 name=$2
  shift 2
  local common=(log.progress=false train.seed=0,1,2 "$SUB" hydra.sweep.dir="$OUT/$task/$name")
  case $task in
    digits) common+=(logger=none dataset=digits log.consensus_every=10) ;;
    noniid) common+=(logger=none dataset=digits dataset.partition=dirichlet dataset.alpha=0.1
                     log.consensus_every=10) ;;
    lm) common+=(experiment=lm_quick) ;;
  esac
  OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m \
    "${common[@]}" "$@"
}
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  test -f "$DATA/train.bin" || .venv/bin/python -m experiments.data.prepare_tokens --stdlib \
    --out "$DATA" --max-bytes 2000000 --vocab-size 1024
  for task in ${TASKS:-digits noniid lm}; do
    hs=${HS:-8 32}
    [ "$task" = lm ] && hs=${LM_HS:-8}
    if [ "$PART" != outer ] && [ "$PART" != slowmo ]; then
      run "$task" allreduce topology=allreduce
      run "$task" one-peer-exp topology=one-peer-exp
      for h in $hs; do
        run "$task" "local-sgd-H$h" topology=local-sgd topology.kwargs.period="$h"
      done
    fi
    if [ "$PART" != base ] && [ "$task" != lm ]; then  # SlowMo over gossip: one-peer-exp
      run "$task" slowmo-one-peer-exp-H8 topology=one-peer-exp outer=slowmo outer.every=8
    fi
    if [ "$PART" != base ] && [ "$PART" != slowmo ]; then
      for h in $hs; do
        run "$task" "diloco-H$h" topology=local-sgd topology.kwargs.period="$h" outer=diloco \
          outer.every="$h"
      done
    fi
  done
fi
# the runs' small files go next to the report, so that it can be redrawn from the repository
for summary in "$OUT"/*/*/seed*/summary.json; do
  [ -f "$summary" ] || continue
  dir=${summary%/summary.json}
  dest="$DOCS/runs/${dir#"$OUT"/}"
  mkdir -p "$dest/.hydra"
  cp "$dir/summary.json" "$dir/metrics.jsonl" "$dest/"
  cp "$dir/.hydra/overrides.yaml" "$dest/.hydra/"
done
for task in digits noniid lm; do
  if compgen -G "$DOCS/runs/$task/*/seed0" >/dev/null; then
    .venv/bin/python -m experiments.report "$DOCS/runs/$task" --out "$DOCS/$task"
  fi
done
# summary.md: the final metric per configuration (mean +- std over seeds) and the bytes each rank
# sends per step, computed from the model size and the schedule (see the table's note)
.venv/bin/python - "$DOCS/runs" "$DOCS/summary.md" <<'PY'
import json, statistics, sys
from pathlib import Path

import experiments.train.config  # noqa: F401  (registers the schemas)
from decent_dp.topo import TopologyReg
from experiments.models import build_model
from hydra import compose, initialize_config_dir

out, dest = Path(sys.argv[1]), Path(sys.argv[2])
TASKS = {"digits": ("digits, IID", "eval/acc"), "noniid": ("digits, Dirichlet alpha=0.1", "eval/acc"),
         "lm": ("tiny GPT (lm_quick)", "eval/loss")}


def compose_config(*overrides):
    with initialize_config_dir(config_dir=str(Path("conf").resolve()), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def params(task):
    if task == "lm":
        meta = json.loads(Path("data/stdlib-bpe/meta.json").read_text())
        m = build_model(compose_config("experiment=lm_quick").model, vocab_size=meta["vocab_size"])
    else:
        m = build_model(compose_config().model, num_classes=10, in_channels=1, image_size=8)
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


def share(k):  # what one rank sends in a bandwidth-optimal (ring) all-reduce of k ranks
    return 2 * (k - 1) / k if k > 1 else 0.0


def per_step(name, n):
    """Model copies a rank sends per step, averaged over the schedule (rank 0's groups)."""
    if name == "allreduce":
        return share(n)
    if name == "one-peer-exp":
        topo = TopologyReg.create("one-peer-exp", n)
        return statistics.mean(share(len(next(e for e in r if 0 in e.ranks).ranks))
                               for r in topo.rounds)
    h = int(name.rsplit("-H", 1)[1])
    if name.startswith("slowmo-one-peer-exp"):  # every H-th round becomes a world all-reduce
        return per_step("one-peer-exp", n) * (h - 1) / h + share(n) / h
    return share(n) / h  # local-sgd-H, diloco-H: one all-reduce every H steps


lines = []
for task, (title, key) in TASKS.items():
    cells = sorted(p for p in (out / task).glob("*") if p.is_dir())
    if not cells:
        continue
    size = params(task)
    lines += [f"### {title}: {size:,} parameters (float32), 4 workers", "",
              f"| configuration | seeds | final {key} (mean ± std) | vs allreduce | bytes/step/rank |",
              "|---|---:|---:|---:|---:|"]
    rows, base = [], None
    for cell in cells:
        vals = [json.loads(s.read_text())[key] for s in sorted(cell.glob("seed*/summary.json"))]
        if not vals:
            continue
        n = json.loads(next(cell.glob("seed*/summary.json")).read_text())["world_size"]
        m, sd = statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0
        rows.append((cell.name, len(vals), m, sd, per_step(cell.name, n) * 4 * size))
        if cell.name == "allreduce":
            base = m
    order = {"allreduce": 0, "one-peer-exp": 1}
    for name, k, m, sd, nbytes in sorted(rows, key=lambda r: (order.get(r[0], 2), r[0])):
        scale = 100 if key == "eval/acc" else 1
        gap = "" if base is None else (f"{100 * (m - base):+.2f} pts" if scale == 100
                                       else f"{m - base:+.3f} nats")
        digits = 2 if scale == 100 else 3
        lines.append(f"| {name} | {k} | {scale * m:.{digits}f} ± {scale * sd:.{digits}f} | {gap} | "
                     f"{nbytes / 1e3:,.1f} kB |")
    lines.append("")
lines += ["bytes/step/rank: what one rank sends per step in a bandwidth-optimal all-reduce of a",
          "group of k ranks, 2(k-1)/k x the model's float32 bytes, averaged over the schedule:",
          "allreduce 1.5x the model every step (k=4); one-peer-exp 1x (pairs, k=2);",
          "local-sgd and DiLoCo with period H one world all-reduce every H steps, 1.5/H x. DiLoCo's",
          "outer round is local-sgd's averaging round, so both send the same bytes; SlowMo over",
          "one-peer-exp replaces every 8th pair round by a world all-reduce, (7/8) 1x + (1/8) 1.5x."]
dest.parent.mkdir(parents=True, exist_ok=True)
dest.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
