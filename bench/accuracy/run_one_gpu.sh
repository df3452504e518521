#!/usr/bin/env bash
# The accuracy suite on ONE H200 (issue 17): every plan of
# bench/accuracy/plans-1gpu (or those named), run with `partita exec
# --backend cuda`, whole-GPU plans on the whole GPU, the others in slices
# of it: their clusters (clusters/h200-slices-*.json) put every rank on
# device 0 in a CUDA green context of its own SMs (40 or 16, the
# H200-40SM and H200-16SM profiles), and the ranks talk over the device
# exchange (--gpu-comm auto), which paces every transfer to the link the
# cluster gives (docs/executor.md, "Emulated links"), so their step times
# are held against the estimate of the cluster they emulate. With
# HOST_FALLBACK=1 a sliced plan that fails over the exchange runs again
# over the host-staged comm (--gpu-comm host: its memory is comparable,
# its step time not; the log says so). Few iterations and small batches:
# the whole suite stays inside a time budget (plans past it are skipped,
# saying so); after two sliced plans failed over the exchange, the rest
# go straight to the host-staged comm.
#
# Writes RUNS/NAME.run.json and RUNS/NAME.log per plan, RUNS/suite.log
# (one line per plan: OK with its time and median step, FAIL with the
# log's last lines, SKIP with the reason) and, when the build has the
# comparison (BUILD/bench/accuracy), RUNS/accuracy.md: estimated against
# measured step time and memory, and each memory term per stage.
#
# Without a GPU (or on another GPU than an H200, or with DRY_RUN=1)
# nothing runs: every plan is still loaded and estimated (`partita
# estimate`, which must succeed) and reported as SKIP with the reason, so
# the suite is checked anywhere (tests/bench/accuracy_suite.sh).
#
# Usage: bench/accuracy/run_one_gpu.sh BUILD_DIR RUNS_DIR [PLAN_NAME ...]
# Environment: ITERS (3: the first is warm-up, the median of the rest is
# the step time), BUDGET (450 s for every run together), PLAN_TIMEOUT
# (120 s per plan), PLANS (bench/accuracy/plans-1gpu), EXEC_OPTIONS
# (more options for every `partita exec`), GPU_COMM (auto: the sliced
# plans' comm), HOST_FALLBACK (0), DRY_RUN=1 (estimate only).
set -u
build=${1:?usage: run_one_gpu.sh BUILD_DIR RUNS_DIR [PLAN_NAME ...]}
runs=${2:?usage: run_one_gpu.sh BUILD_DIR RUNS_DIR [PLAN_NAME ...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
plans=${PLANS:-$here/plans-1gpu}
partita="$build/cli/partita"
iters=${ITERS:-3}
budget=${BUDGET:-450}
plan_timeout=${PLAN_TIMEOUT:-120}
read -r -a exec_options <<<"${EXEC_OPTIONS:-}"
export NCCL_NVLS_ENABLE=0
# libraries the GPU machine lacks may sit in BUILD_DIR/lib
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$runs"
log="$runs/suite.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for plan in "$plans"/*.json; do
        names+=("$(basename "$plan" .json)")
    done
fi

# Why nothing can run here, or "" when this is an H200.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
no_run=""
if [ "${DRY_RUN:-0}" = 1 ]; then
    no_run="DRY_RUN=1"
elif [ -z "$gpu_name" ]; then
    no_run="no GPU visible (nvidia-smi lists none)"
elif ! echo "$gpu_name" | grep -q H200; then
    no_run="the plans' clusters are slices of an H200, this GPU is $gpu_name"
elif [ ! -x "$partita" ]; then
    no_run="$partita is not built"
fi
say "# run_one_gpu.sh: ${#names[@]} plans of $plans, $iters iterations each, budget $budget s; GPU: ${gpu_name:-none}"

# The rank count of a plan (each stage's own tp x dp where "stages" gives
# them), and its estimate's step time (the estimate must succeed
# everywhere).
ranks_of() {
    python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
own = p.get('stages') or [{}] * p['pp']
print(sum(s.get('tp', p['tp']) * s.get('dp', p['dp']) for s in own))" "$1"
}
status=0
if [ -n "$no_run" ]; then
    for name in "${names[@]}"; do
        plan="$plans/$name.json"
        if out=$("$partita" estimate "$plan" 2>&1); then
            say "SKIP $name: $no_run (estimated: $(echo "$out" | grep -o 'step time [^|]*' | sed 's/ *$//'), $(ranks_of "$plan") ranks)"
        else
            say "FAIL $name: partita estimate: $(echo "$out" | tail -n 1)"
            status=1
        fi
    done
    exit $status
fi

# run_plan LIMIT [COMM OPTIONS]: one `partita exec` of $plan into
# RUNS/$name.run.json and RUNS/$name.log; returns its exit status.
run_plan() {
    local limit=$1; shift
    timeout "$limit" "$partita" exec "$plan" --data "$data" --backend cuda \
        --iters "$iters" --log-interval "$iters" "$@" \
        ${exec_options[@]+"${exec_options[@]}"} \
        -o "$runs/$name.run.json" >"$runs/$name.log" 2>&1
}

gpu_comm=${GPU_COMM:-auto}
exchange_failures=0
data="$runs/corpus"
start_all=$(date +%s)
if [ ! -f "$data.idx" ]; then
    "$partita" prep "$root/data/corpus.txt" -o "$data" >"$runs/prep.log" 2>&1 ||
        { say "FAIL prep: see $runs/prep.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$runs/nvidia-smi.txt" 2>&1
for name in "${names[@]}"; do
    plan="$plans/$name.json"
    elapsed=$(( $(date +%s) - start_all ))
    left=$(( budget - elapsed ))
    if [ "$left" -le 5 ]; then
        say "SKIP $name: the time budget of $budget s is spent"
        continue
    fi
    limit=$(( left < plan_timeout ? left : plan_timeout ))
    comm=()
    sliced=0
    [ "$(ranks_of "$plan")" -gt 1 ] && { comm=(--gpu-comm "$gpu_comm"); sliced=1; }
    start=$(date +%s.%N)
    run_plan "$limit" ${comm[@]+"${comm[@]}"}
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $sliced = 1 ] && [ "$gpu_comm" != host ] &&
        [ "${HOST_FALLBACK:-0}" = 1 ] && ! grep -q "splits into" "$runs/$name.log"; then
        say "NOTE $name: over $gpu_comm it failed (exit $rc): $(tail -n 2 "$runs/$name.log" | tr '\n' ' ')"
        exchange_failures=$((exchange_failures + 1))
        if [ "$exchange_failures" -ge 2 ] && [ "$gpu_comm" != host ]; then
            gpu_comm=host
            say "NOTE: two sliced plans failed over the exchange: the rest run over the host-staged comm"
        fi
        mv "$runs/$name.log" "$runs/$name.exchange.log"
        left=$(( budget - ($(date +%s) - start_all) ))
        limit=$(( left < plan_timeout ? left : plan_timeout ))
        if [ "$limit" -gt 5 ]; then
            run_plan "$limit" --gpu-comm host
            rc=$?
            [ $rc -eq 0 ] && say "NOTE $name: ran over the host-staged comm instead (step time not comparable)"
        fi
    fi
    if [ $rc -eq 124 ] && [ $sliced = 1 ] && [ "$gpu_comm" != host ]; then
        exchange_failures=$((exchange_failures + 1)) # a hang counts too
        [ "$exchange_failures" -ge 2 ] && gpu_comm=host
    fi
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    if [ $rc -eq 0 ]; then
        say "$(printf 'OK   %-30s %6.1f s  %s' "$name" "$took" \
            "$(grep -o 'median step time [^,]*' "$runs/$name.log")")"
    elif [ $rc -eq 124 ]; then
        say "FAIL $name: stopped after $limit s (PLAN_TIMEOUT or the budget)"
        status=1
    elif grep -q "splits into" "$runs/$name.log"; then
        say "SKIP $name: $(grep -o 'need[s]* partitions[^"]*splits into [0-9]*' "$runs/$name.log" | head -n 1)"
    else
        say "FAIL $name (exit $rc): $(tail -n 2 "$runs/$name.log" | tr '\n' ' ')"
        status=1
    fi
done
say "# runs took $(( $(date +%s) - start_all )) s"
if [ -x "$build/bench/accuracy" ]; then
    mkdir -p "$runs/charts"
    "$build/bench/accuracy" "$plans" "$runs" "$runs/accuracy.md" "$runs/charts" \
        >>"$log" 2>&1 && say "# comparison: $runs/accuracy.md"
fi
exit $status
