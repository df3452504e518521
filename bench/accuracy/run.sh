#!/usr/bin/env bash
# The accuracy suite's measuring half, on the GPU machine: runs every plan
# of bench/accuracy/plans (or those named) with `partita exec --backend
# cuda` and keeps each run.json as RUNS/NAME.run.json and its log. Plans
# whose cluster needs more GPUs than the machine has are skipped, saying
# so. The comparing half runs anywhere: build/bench/accuracy PLANS RUNS
# docs/accuracy.md docs/accuracy (docs/accuracy.md says how).
#
# Usage: bench/accuracy/run.sh BUILD_DIR RUNS_DIR [PLAN_NAME ...]
# Environment: ITERS (default 8: the first is warm-up, the median of the
# rest is the step time).
set -u
build=${1:?usage: run.sh BUILD_DIR RUNS_DIR [PLAN_NAME ...]}
runs=${2:?usage: run.sh BUILD_DIR RUNS_DIR [PLAN_NAME ...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
iters=${ITERS:-8}
export NCCL_NVLS_ENABLE=0
mkdir -p "$runs"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
data="$runs/corpus"
if [ ! -f "$data.idx" ]; then
    "$partita" prep "$root/data/corpus.txt" -o "$data" >"$runs/prep.log" 2>&1 ||
        { echo "FAIL prep: see $runs/prep.log"; exit 1; }
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for plan in "$here"/plans/*.json; do
        names+=("$(basename "$plan" .json)")
    done
fi
status=0
for name in "${names[@]}"; do
    plan="$here/plans/$name.json"
    needed=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(p['tp']*p['dp']*p['pp'])" "$plan")
    if [ "$needed" -gt "$gpus" ]; then
        echo "SKIP $name: needs $needed GPUs, the machine has $gpus"
        continue
    fi
    start=$(date +%s.%N)
    if "$partita" exec "$plan" --data "$data" --backend cuda --iters "$iters" \
        --log-interval "$iters" -o "$runs/$name.run.json" >"$runs/$name.log" 2>&1; then
        printf 'OK   %-32s %6.1f s  %s\n' "$name" \
            "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{print b - a}')" \
            "$(grep -o 'median step time [^,]*' "$runs/$name.log")"
    else
        echo "FAIL $name (exit $?): $(tail -n 2 "$runs/$name.log" | tr '\n' ' ')"
        status=1
    fi
done
exit $status
