#!/usr/bin/env bash
# Where the decentralized optimizer's gap comes from, on experiment=lm_small (4 CPU gloo
# workers, 512 steps, 4.19M tokens), each arm tuned by experiments/sweeps/tune.sh like the arms
# of experiments/sweeps/lm_small.sh: a 1-seed grid, then seeds 1 and 2 at its best. The value
# that an earlier study already ran (optim.lr 4e-3, seed 0) is copied in from its committed
# runs, not run again: the losses are deterministic per seed.
#   PART=local   the local arms' inner learning rate at H=16: local-sgd over {5e-4, 1e-3, 2e-3,
#                4e-3, 8e-3}, DiLoCo (outer lr 0.5) over {1e-3, 2e-3, 4e-3, 8e-3}, then 3 seeds
#                at each best (SKIP_SEEDS=1: the grids only; at 4e-3 the seeds are committed)
#   PART=outer   DiLoCo's outer lr at the inner lr PART=local chose: {0.3, 0.5, 0.7, 1.0} (0.5 is
#                PART=local's run), then 3 seeds at the best
#   PART=state   second moments shared (optim.state_sync): complete and one-peer-exp with
#                exp_avg_sq averaged every K in {1, 4, 16} steps (seed 0), at the lr 4e-3
#                of allreduce and of both arms without it, then 3 seeds at each best K;
#                complete K=1 (v the workers' mean, m local) is the upper bound
#   PART=moments complete with Adam's first moment shared every step, and with both moments
#                (optim.state_sync.exp_avg=1, exp_avg_sq=1), at lr 4e-3, 3 seeds each
#   PART=lagged  complete with LaggedVAdamW (v fed by the previous gradient), that gradient mixed
#                with every worker's (optim.state_sync.grad_prev=1; lr tuned, 3 seeds) and not
#                (=0, lr 4e-3, seed 0); with Adam's first moment shared as well (lr 4e-3 and 2e-3)
#   PART=delay   allreduce with AdamW one step late (optim=lagged_v_adamw optim.lag_m=true):
#                every step takes the gradient of the iterate before the last, the staleness
#                of a decentralized step without its averaging; lr over {1e-3, 2e-3, 4e-3,
#                8e-3}, one more past an edge, then 3 seeds
#   PART=sgd     complete and allreduce with SGD (momentum 0.9), optim.lr over
#                {0.25, 0.5, 1, 2} and up to two halvings below the lowest while the best sits
#                there, then 3 seeds at each best
#   PART=batch   allreduce and complete with 8 and 128 windows per worker (lm_small has 32) at
#                the same tokens: 2048 and 128 steps; optim.lr over 4 values (at 128 windows
#                2e-3 beat 4e-3 on seed 0, so its grid reaches down to 1e-3), one more past
#                an edge, then 3 seeds at each best
#   PART=stall   seeds 0 and 1 of local-sgd and DiLoCo at H=16 for 128 steps, logged every 2nd
#                step with the consensus distance and the update's size (log.update_norm)
#   PART=repro   the headline arms' runs (seed 0, or REPRO_SEEDS) rerun with their own
#                overrides: each must land within 0.01 nats (docs/results/lm_gap/rerun)
#   PART=report  copy the runs' small files to docs/results/lm_gap/runs and draw the reports
# About 3 minutes per run on 2 cores. OUT (multirun/lm_gap); DOCS (docs/results/lm_gap);
# ONLY (space-separated arm names to run, e.g. ONLY="local-sgd-H16-lr").
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
export OUT=${OUT:-multirun/lm_gap}
DOCS=${DOCS:-docs/results/lm_gap}
PART=${PART:-all}
ONLY=${ONLY:-}
DATA=data/stdlib-bpe-all
TUNE=experiments/sweeps/tune.sh
OUTER=docs/results/outer/lm_small/runs
LM=docs/results/lm/runs
test -f "$DATA/train.bin" || .venv/bin/python -m experiments.data.prepare_tokens --stdlib \
  --out "$DATA" --max-bytes 16000000 --vocab-size 1024
. experiments/sweeps/_lib.sh  # best, keep_runs, widen
chosen() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }
seed_from() {  # seed_from NAME RUN: RUN (a committed run's folder) becomes one of NAME's grid
  mkdir -p "$OUT/$1/stage1"
  [ -e "$OUT/$1/stage1/committed" ] || cp -r "$2" "$OUT/$1/stage1/committed"
}
H16=(experiment=lm_small topology=local-sgd topology.kwargs.period=16)
if [ "$PART" = local ] || [ "$PART" = all ]; then
  if chosen local-sgd-H16-lr; then
    seed_from local-sgd-H16-lr "$OUTER/local-sgd-H16/stage1/0"
    STAGE=1 $TUNE local-sgd-H16-lr optim.lr 5e-4,1e-3,2e-3 "${H16[@]}"
    # 4e-3 was the best, at the grid's top: one more value above it
    STAGE=1 SUBDIR=lr0.008 $TUNE local-sgd-H16-lr optim.lr 8e-3 "${H16[@]}"
    [ -n "${SKIP_SEEDS:-}" ] || STAGE=2 $TUNE local-sgd-H16-lr optim.lr - "${H16[@]}"
  fi
  if chosen diloco-H16-lr; then
    seed_from diloco-H16-lr "$OUTER/diloco-H16/stage1/1"  # outer.lr 0.5, optim.lr 4e-3
    STAGE=1 $TUNE diloco-H16-lr optim.lr 1e-3,2e-3,8e-3 "${H16[@]}" outer=diloco outer.lr=0.5
    [ -n "${SKIP_SEEDS:-}" ] || STAGE=2 $TUNE diloco-H16-lr optim.lr - "${H16[@]}" outer=diloco outer.lr=0.5
  fi
fi
if { [ "$PART" = outer ] || [ "$PART" = all ]; } && chosen diloco-H16-outer; then
  inner=$(cat "$OUT/diloco-H16-lr/best.txt")
  seed_from diloco-H16-outer "$OUT/diloco-H16-lr/final/seed0"  # outer.lr 0.5 at that inner lr
  DILOCO=("${H16[@]}" outer=diloco optim.lr="$inner")
  STAGE=1 $TUNE diloco-H16-outer outer.lr 0.3,0.7,1.0 "${DILOCO[@]}"
  best=$(.venv/bin/python -m experiments.report.tune "$OUT/diloco-H16-outer/stage1" --key outer.lr --best)
  if [ "$best" = 0.5 ]; then  # PART=local ran its seeds already: the same runs
    mkdir -p "$OUT/diloco-H16-outer/final" && echo 0.5 > "$OUT/diloco-H16-outer/best.txt"
    cp -rn "$OUT"/diloco-H16-lr/final/seed* "$OUT/diloco-H16-outer/final/"
  elif [ -z "${SKIP_SEEDS:-}" ]; then
    STAGE=2 $TUNE diloco-H16-outer outer.lr - "${DILOCO[@]}"
  fi
fi
if [ "$PART" = state ] || [ "$PART" = all ]; then
  # K over {1, 4, 16} with seed 0 for each topology, then seeds 1 and 2 at each one's best K
  for topo in complete one-peer-exp; do
    chosen "$topo-v" || continue
    STAGE=1 $TUNE "$topo-v" optim.state_sync.exp_avg_sq 1,4,16 experiment=lm_small \
      topology="$topo" optim.lr=0.004
  done
  for topo in complete one-peer-exp; do
    chosen "$topo-v" || continue
    STAGE=2 $TUNE "$topo-v" optim.state_sync.exp_avg_sq - experiment=lm_small \
      topology="$topo" optim.lr=0.004
  done
fi
if [ "$PART" = moments ] || [ "$PART" = all ]; then
  # complete with Adam's first moment shared every step (complete-m), or both moments
  # (complete-mv): the mean of the workers' m is then allreduce's m, the step's only local
  # parts are the fresh gradient's (1 - beta1) share and v's spread; at lr 4e-3, 3 seeds
  M=(experiment=lm_small topology=complete optim.lr=0.004)
  MV=("${M[@]}" optim.state_sync.exp_avg_sq=1)
  if chosen complete-m; then STAGE=1 $TUNE complete-m optim.state_sync.exp_avg 1 "${M[@]}"; fi
  if chosen complete-mv; then STAGE=1 $TUNE complete-mv optim.state_sync.exp_avg 1 "${MV[@]}"; fi
  if [ -z "${SKIP_SEEDS:-}" ]; then
    if chosen complete-m; then STAGE=2 $TUNE complete-m optim.state_sync.exp_avg - "${M[@]}"; fi
    if chosen complete-mv; then STAGE=2 $TUNE complete-mv optim.state_sync.exp_avg - "${MV[@]}"; fi
  fi
fi
if [ "$PART" = lagged ] || [ "$PART" = all ]; then
  # complete with LaggedVAdamW: v fed by the previous step's gradient, mixed with every worker's
  # first (optim.state_sync.grad_prev=1, complete-lagged-v1): allreduce's v, one step late; and
  # the lag alone at lr 4e-3 (complete-lagged-v0). lm_small's AdamW hyper-parameters; v1's lr
  # over {2e-3, 4e-3} and past an edge, then 3 seeds
  L=(experiment=lm_small topology=complete optim=lagged_v_adamw)
  if chosen complete-lagged-v1; then
    STAGE=1 $TUNE complete-lagged-v1 optim.lr 4e-3,2e-3 "${L[@]}" optim.state_sync.grad_prev=1
  fi
  if chosen complete-lagged-v0; then
    STAGE=1 $TUNE complete-lagged-v0 optim.lr 4e-3 "${L[@]}" optim.state_sync.grad_prev=0
  fi
  # and Adam's first moment shared too (complete-lagged-m1): each worker's step is then
  # (b1 m + (1 - b1) g_i) / sqrt(v from the mean gradient), allreduce's step but for g_i's share
  if chosen complete-lagged-m1; then
    STAGE=1 $TUNE complete-lagged-m1 optim.lr 4e-3,2e-3 "${L[@]}" optim.state_sync.grad_prev=1 \
      optim.state_sync.exp_avg=1
  fi
  if chosen complete-lagged-v1; then
    widen complete-lagged-v1 "${L[@]}" optim.state_sync.grad_prev=1
    [ -n "${SKIP_SEEDS:-}" ] || STAGE=2 $TUNE complete-lagged-v1 optim.lr - "${L[@]}" \
      optim.state_sync.grad_prev=1
  fi
fi
if { [ "$PART" = delay ] || [ "$PART" = all ]; } && chosen allreduce-delayed; then
  # a one-step-stale gradient alone: allreduce's mean gradient fed to AdamW one step late.
  # Under complete, a worker's gradient is taken where its neighbours' last steps are missing
  D=(experiment=lm_small topology=allreduce optim=lagged_v_adamw optim.lag_m=true)
  STAGE=1 $TUNE allreduce-delayed optim.lr 1e-3,2e-3,4e-3,8e-3 "${D[@]}"
  widen allreduce-delayed "${D[@]}"
  [ -n "${SKIP_SEEDS:-}" ] || STAGE=2 $TUNE allreduce-delayed optim.lr - "${D[@]}"
fi
if [ "$PART" = sgd ] || [ "$PART" = all ]; then
  # lm_small sets AdamW's betas, which SGD's schema refuses: the same job spelled out, SGD in it
  SGD=(model=gpt_tiny dataset=tokens optim=sgd scheduler=cosine_warmup logger=none
    dataset.root=data/stdlib-bpe-all dataset.block_size=64 dataset.tokens_per_epoch=262144
    dataset.eval_tokens=32768 scheduler.warmup_steps=32 scheduler.eta_min=0.0
    train.batch_size=32 train.max_steps=512 train.grad_clip_norm=1.0 log.every=16
    log.consensus_every=0 optim.momentum=0.9 optim.weight_decay=0)
  for topo in allreduce complete; do  # both grids first, then the seeds
    chosen "$topo-sgd" || continue
    STAGE=1 $TUNE "$topo-sgd" optim.lr 0.25,0.5,1.0,2.0 "${SGD[@]}" topology="$topo"
  done
  for topo in allreduce complete; do  # up to two halvings or doublings past an edge
    chosen "$topo-sgd" || continue
    widen "$topo-sgd" "${SGD[@]}" topology="$topo"
    widen "$topo-sgd" "${SGD[@]}" topology="$topo"
  done
  for topo in allreduce complete; do
    chosen "$topo-sgd" || continue
    [ -n "${SKIP_SEEDS:-}" ] || STAGE=2 $TUNE "$topo-sgd" optim.lr - "${SGD[@]}" topology="$topo"
  done
fi
if [ "$PART" = batch ] || [ "$PART" = all ]; then
  # the batch per worker at lm_small's 4.19M tokens: W windows per worker for 16384/W steps, a
  # sixteenth of them warm-up (W=32 is lm_small itself, tuned in ../lm); AdamW as lm_small
  batch_job() {  # batch_job W: the overrides of W windows per worker
    local steps=$((16384 / $1))
    echo "experiment=lm_small train.batch_size=$1 train.max_steps=$steps" \
      "scheduler.warmup_steps=$((steps / 16))"
  }
  declare -A BATCH_LRS=([8]=5e-4,1e-3,2e-3,4e-3 [128]=1e-3,2e-3,4e-3,8e-3)
  for w in 128 8; do  # every grid first, then one value past any edge, then the seeds
    for topo in allreduce complete; do
      chosen "$topo-w$w" || continue
      # shellcheck disable=SC2046  # the job's overrides are words
      STAGE=1 $TUNE "$topo-w$w" optim.lr "${BATCH_LRS[$w]}" $(batch_job $w) topology="$topo"
    done
  done
  for w in 128 8; do
    for topo in allreduce complete; do
      chosen "$topo-w$w" || continue
      # shellcheck disable=SC2046
      widen "$topo-w$w" $(batch_job $w) topology="$topo"
    done
  done
  for w in 128 8; do
    for topo in allreduce complete; do
      chosen "$topo-w$w" || continue
      # shellcheck disable=SC2046
      [ -n "${SKIP_SEEDS:-}" ] || STAGE=2 $TUNE "$topo-w$w" optim.lr - $(batch_job $w) \
        topology="$topo"
    done
  done
fi
if [ "$PART" = stall ] || [ "$PART" = all ]; then
  # seeds 0 and 1 of local-sgd and DiLoCo at H=16, lr 4e-3, logged every 2nd step with the
  # update's size, stopped after step 128: what seed 1's stall looks like
  for arm in local-sgd diloco; do
    for seed in 0 1; do
      extra=()
      [ "$arm" = diloco ] && extra=(outer=diloco outer.lr=0.5)
      d="$OUT/stall/$arm-seed$seed"
      rm -rf "$d"
      OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 train.py \
        "${H16[@]}" optim.lr=0.004 train.seed="$seed" "${extra[@]}" log.every=2 \
        log.update_norm=true log.progress=false hydra.run.dir="$d" &
      pid=$!
      until grep -q '"step": 128,' "$d/metrics.jsonl" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do
        sleep 2
      done
      kill $pid 2>/dev/null || true
      pkill -f "hydra.run.dir=$d" || true
      wait $pid 2>/dev/null || true
    done
  done
fi
if [ "$PART" = repro ]; then
  # the headline values rerun with their own overrides (experiments.report.rerun): each must
  # land within 0.01 nats of its committed value; REPRO_SEEDS (0) picks the seeds
  runs=()
  for seed in ${REPRO_SEEDS:-0}; do
    for arm in "$LM/allreduce-adamw" "$LM/complete-adamw-lr0.004" "$LM/one-peer-exp-adamw-lr0.004" \
      "$DOCS/runs/complete-v" "$DOCS/runs/local-sgd-H16-lr" "$DOCS/runs/diloco-H16-lr" \
      "$DOCS/runs/allreduce-sgd" "$DOCS/runs/complete-sgd"; do
      [ ! -d "$arm/final/seed$seed" ] || runs+=("$arm/final/seed$seed")
    done
  done
  .venv/bin/python -m experiments.report.rerun "${runs[@]}" --tol 0.01 --work "$OUT/rerun" \
    --out "$DOCS/rerun"
fi
if [ "$PART" = report ] || [ "$PART" = all ]; then
  dest_of() { echo "$DOCS/runs/$1"; }
  keep_runs dest_of "$OUT"/*/*/*/summary.json
  for d in "$OUT"/stall/*/; do  # stopped runs: no summary, the metrics only
    [ -f "$d/metrics.jsonl" ] || continue
    mkdir -p "$DOCS/stall/$(basename "$d")/.hydra"
    cp "$d/metrics.jsonl" "$DOCS/stall/$(basename "$d")/"
    cp "$d/.hydra/overrides.yaml" "$DOCS/stall/$(basename "$d")/.hydra/"
  done
  R=(.venv/bin/python -m experiments.report)
  mkdir -p "$DOCS/runs"
  for arm in allreduce-adamw complete-adamw-lr0.004 one-peer-exp-adamw-lr0.004; do
    mkdir -p "$DOCS/runs/$arm" && cp -rn "$LM/$arm/final" "$DOCS/runs/$arm/"
  done
  "${R[@]}" "$DOCS"/runs/{allreduce-adamw,complete-adamw-lr0.004,one-peer-exp-adamw-lr0.004}/final \
    "$DOCS"/runs/*-v/final --out "$DOCS/state_sync"
  "${R[@]}" "$DOCS"/runs/*-v/stage1 --tune optim.state_sync.exp_avg_sq --out "$DOCS/tune_k"
  "${R[@]}" "$DOCS"/runs/*-H16-lr/stage1 --tune optim.lr --out "$DOCS/tune_inner_lr"
  [ ! -d "$DOCS/runs/diloco-H16-outer" ] || "${R[@]}" "$DOCS"/runs/diloco-H16-outer/stage1 \
    --tune outer.lr --out "$DOCS/tune_outer_lr"
  [ ! -d "$DOCS/runs/allreduce-sgd" ] || "${R[@]}" "$DOCS"/runs/*-sgd/stage1 --tune optim.lr \
    --out "$DOCS/tune_sgd"
  [ ! -d "$DOCS/runs/allreduce-delayed" ] || "${R[@]}" "$DOCS"/runs/allreduce-delayed/stage1 \
    --tune optim.lr --out "$DOCS/tune_delayed"
  if compgen -G "$DOCS/runs/*-w*/stage1" >/dev/null; then  # the batch per worker
    "${R[@]}" "$DOCS"/runs/*-w*/stage1 --tune optim.lr --out "$DOCS/tune_batch"
  fi
  if compgen -G "$DOCS/runs/*-w*/final" >/dev/null; then
    "${R[@]}" "$DOCS"/runs/{allreduce-adamw,complete-adamw-lr0.004}/final "$DOCS"/runs/*-w*/final \
      --out "$DOCS/batch"
  fi
  # complete's gap behind allreduce paired by seed: AdamW at 8, 32 and 128 windows per worker,
  # then SGD at 32, each setting drawn once its two arms have their seeds
  pairs=()
  add_pair() {  # add_pair LABEL BASE OTHER: when both arms have a final/
    [ -d "$2" ] && [ -d "$3" ] && pairs+=(--pair "$1" "$2" "$3") || true
  }
  add_pair "AdamW, W=8" "$DOCS/runs/allreduce-w8/final" "$DOCS/runs/complete-w8/final"
  add_pair "AdamW, W=32" "$DOCS/runs/allreduce-adamw/final" \
    "$DOCS/runs/complete-adamw-lr0.004/final"
  add_pair "AdamW, W=128" "$DOCS/runs/allreduce-w128/final" "$DOCS/runs/complete-w128/final"
  add_pair "SGD, W=32" "$DOCS/runs/allreduce-sgd/final" "$DOCS/runs/complete-sgd/final"
  # not complete: allreduce with AdamW one step late, behind allreduce
  add_pair "AdamW one step late, W=32" "$DOCS/runs/allreduce-adamw/final" \
    "$DOCS/runs/allreduce-delayed/final"
  .venv/bin/python -m experiments.report.gap "${pairs[@]}" --out "$DOCS/gap" \
    --title "complete behind allreduce, each tuned (W: windows per worker)"
  .venv/bin/python -m experiments.report.trajectory "$DOCS"/stall/*/ --out "$DOCS/stall" \
    --max-step 128 --mark-every 16
fi
