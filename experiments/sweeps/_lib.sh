# Sourced by sweep scripts, from the repository root once they run there (not a sweep itself).
#   . experiments/sweeps/_lib.sh

# best DIR KEY: the best value of KEY over the runs under DIR, then where it sits in the grid:
# "low" or "high" at an edge, else "inside" (the tuning report's rule: best mean final metric)
best() {
  .venv/bin/python -m experiments.report.tune "$1" --key "$2" --best --edge
}

# keep_runs DEST_OF SUMMARY...: copy each run's small files (summary.json, metrics.jsonl,
# .hydra/overrides.yaml) into the folder that the function DEST_OF prints for the run's path
# relative to $OUT; a pattern that matched nothing (no sweep output here) is passed over
keep_runs() {
  local dest_of=$1 summary dir dest
  shift
  for summary in "$@"; do
    [ -f "$summary" ] || continue
    dir=${summary%/summary.json}
    dest=$("$dest_of" "${dir#"$OUT"/}")
    mkdir -p "$dest/.hydra"
    cp "$dir/summary.json" "$dir/metrics.jsonl" "$dest/"
    cp "$dir/.hydra/overrides.yaml" "$dest/.hydra/"
  done
}

# widen NAME OVERRIDE...: one more optim.lr beyond the edge that the best of $OUT/NAME/stage1
# sits on (half the lowest or twice the highest), run by $TUNE; nothing when it is inside
widen() {
  local name=$1 v side
  shift
  read -r v side < <(best "$OUT/$name/stage1" optim.lr)
  [ "$side" != inside ] || return 0
  v=$(.venv/bin/python -c "import sys; v = float(sys.argv[1]); print(v / 2 if sys.argv[2] == 'low' else v * 2)" "$v" "$side")
  echo "$name: the best optim.lr is at an edge of the grid; adding $v"
  STAGE=1 SUBDIR="lr$v" $TUNE "$name" optim.lr "$v" "$@"
}
