#!/usr/bin/env bash
# Communication that stays on the device (issue 16), on ONE GPU (an H100
# or H200), in one call of under 9 minutes: the checks, then plans for 2
# and 4 "GPUs" run on slices of the GPU over the device exchange, paced to
# emulated NVLink (450 GB/s, 5 us), each against `partita estimate` of
# the emulated cluster. Logs, profiles, plans and run.json files go to
# LOG_DIR; a summary table comes last.
#
#   1. test_device_exchange: the device exchange itself (crossing sends,
#      collectives blocking and on the stream, pacing within a tolerance,
#      aborts and timeouts);
#   2. test_cuda_tensor_parallel: the tp 2 pair over the host-staged comm
#      and over the device exchange (bf16 sums on the stream) against the
#      unsplit stage;
#   3. run_parallel.sh SHARED=1 SHARED_COMM=auto: `partita exec` of a
#      small GPT on one GPU, then pp 2, dp 2 (its sums in buckets during
#      the last backward), dp 2 with ZeRO-1, tp 2 and tp 2 with sequence
#      parallelism on two slices, and tp 2 x pp 2 with sequence
#      parallelism on four, over the device exchange, losses against one
#      GPU (and tp2-sp's against tp2's); pp 2 and dp 2 again
#      over the host-staged comm: the same losses bit for bit;
#   4. profiles of the slices (`partita profile` at 64 and 32 SMs, and
#      the whole GPU, for the shapes the plans use, with the profiler's
#      device warm-up and its 9 timing rounds, as the accuracy suite's
#      profiles are taken; QUICK=1 adds `--quick`), alone and beside
#      busy neighbours (`--beside`: the other slices of the plan's split
#      computing meanwhile); the clusters of plans of several slices name
#      the latter, so the estimates price what the slices compute in the
#      run (docs/profiles.md, "Slices beside busy neighbours");
#   5. the benchmark: GPT-2 1.5B with 26 heads (models/gpt2-xl-26h.json)
#      on the whole GPU (the baseline), alone on one slice of 64 SMs
#      (beside an idle slice), then tp 2, dp 2 and pp 2 on two
#      slices of 64 SMs, pp 4 on four of 32; the 24-head shape
#      (models/gpt2-xl-24h.json) on the whole GPU and as tp 4. Every run
#      gets `partita estimate` of its plan; a second table holds rank 0's
#      forward and backward against its stage's estimate (from the
#      profile of its slice beside busy neighbours; one-slice-64's alone:
#      slices share the GPU's memory bandwidth and L2). Targets: tokens/s over the baseline's (one
#      rank, whole GPU) tp 2 >= 0.80, dp 2 >= 0.95, pp 2 >= 0.90; every
#      step within 10 % of its estimate. Last, the README's pipeline on
#      one GPU (GPT-2 124M, pp 2 on 80 + 40 SMs, links of 25 GB/s and
#      20 us) against its estimate with its slices' profiles.
#
# Usage: tests/executor/gpu/run_devcomm.sh BUILD_DIR LOG_DIR
#   BUILD_DIR  a meson build made with -Dcuda=enabled (NCCL not needed)
# Environment: ITERS (4) and WARMUP (2) iterations of the benchmark runs;
# ROWS the benchmark rows (default all, in the order above); BUDGET_S
# (420): no benchmark row starts after the batch has run this long (a row
# is killed after 110 s), so that the whole stays under 9 minutes;
# SKIP_TESTS=1 runs the benchmark only, SKIP_BENCH=1 the checks only; QUICK=1 profiles with `--quick`
# (no device warm-up, 3 rounds: faster, but its backward came out 8 %
# under the runs' on 2026-11-25); STAGE_SETS (1: the profiles' sets of
# stages, `--stage-sets`) and PROCESSES (1, `--processes`): the budgets
# were sized for one set in one process, the profiler's defaults are 3
# sets in each of 4 processes; PROFILE_ARGS, more options of
# every `partita profile` (--graph, say). Each row says what it waits on
# and is killed at its own limit (tests/executor/gpu/gpu_rows.sh); the
# last line is "run_devcomm.sh: PASS" or "...: FAIL". Exit status 0 when
# every check passed and every row ran (a missed
# target is reported, not a failure), else 1.
set -u
build=$(cd "${1:?usage: run_devcomm.sh BUILD_DIR LOG_DIR}" && pwd)
mkdir -p "${2:?usage: run_devcomm.sh BUILD_DIR LOG_DIR}"
logs=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
partita="$build/cli/partita"
iters=${ITERS:-4}
quick=""
[ "${QUICK:-0}" = 1 ] && quick=--quick
warmup=${WARMUP:-2}
budget=${BUDGET_S:-420}
rows=${ROWS:-"one-gpu-26h one-slice-64 tp2 dp2 pp2 pp4 one-gpu-24h tp4 readme-pp2"}
export PARTITA_SOURCE="$root"
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SECONDS=0

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP run_devcomm.sh: no GPU visible"
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv |
    tee "$logs/nvidia-smi.txt"
# the GPU type the cluster files name ("H200"), and its sliced types
gpu_type=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /[0-9]/) { print $i; exit } }')
echo "# GPU type: $gpu_type; slices $gpu_type-64SM (2) and $gpu_type-32SM (4)"

# shellcheck source=tests/executor/gpu/gpu_rows.sh
source "$here/gpu_rows.sh"
# step NAME SECONDS COMMAND...: one row (gpu_rows.sh), killed after
# SECONDS
step() {
    gpu_row "$@"
}

# ----------------------------------------------------------------- checks
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    echo "== test_device_exchange"
    step test_device_exchange 120 "$build/tests/executor/gpu/test_device_exchange"
    echo "== test_cuda_tensor_parallel"
    step test_cuda_tensor_parallel 150 \
        "$build/tests/executor/gpu/test_cuda_tensor_parallel"
    echo "== partita exec over the device exchange against one GPU"
    step exec-losses 240 env SHARED=1 SHARED_COMM=auto ITERS=20 \
        LOSS_ROWS="pp2 dp2 dp2-zero1 tp2 tp2-sp tp2-pp2-sp" SKIP_RESUME=1 \
        SKIP_HETERO=1 \
        SKIP_BENCH=1 "$here/run_parallel.sh" "$build" "$logs/losses"
    # pp 2 and dp 2 move and sum fp32 in the same order over either comm
    # (the dp sums bucket by bucket during the last backward over the
    # exchange, after it over the host): the same losses, bit for bit
    for name in pp2 dp2; do
        step "exec-$name-host" 60 "$partita" exec \
            "$logs/losses/plans/$name.json" --data "$logs/losses/corpus" \
            --backend cuda --gpu-comm host --iters 20 --log-interval 10 \
            -o "$logs/$name-host.run.json" &&
            step "same-$name" 10 python3 "$here/parallel_checks.py" losses \
                "$logs/$name-host.run.json" "$logs/losses/$name.run.json" \
                "$name: device exchange against host-staged" 0 0
    done
fi

# SKIP_BENCH=1: the checks only (run_multi_gpu.sh's row)
[ "${SKIP_BENCH:-0}" = 1 ] && gpu_summary run_devcomm.sh

# --------------------------------------------------------------- profiles
data="$logs/corpus"
"$partita" prep "$root/data/corpus.txt" -o "$data" >"$logs/prep.log" 2>&1 ||
    { echo "FAIL partita prep"; cat "$logs/prep.log"; exit 1; }
profiles="$logs/profiles"
mkdir -p "$profiles"
both="$root/models/gpt2-xl-26h.json,$root/models/gpt2-xl-24h.json"
# profile NAME MODELS TP_LIST [--sm-limit N]: the points the plans use
profile() {
    local name=$1 models=$2 tp=$3; shift 3
    if [ "${REUSE_PROFILES:-0}" = 1 ] && [ -s "$profiles/$name.json" ]; then
        echo "== partita profile $name: kept from an earlier call"
        return 0
    fi
    echo "== partita profile $name (tp $tp, mbs 4)"
    step "profile-$name" 120 "$partita" profile --model "$models" \
        --gpu-name "$name" --tp "$tp" --mbs 4 $quick --no-comm "$@" \
        --stage-sets "${STAGE_SETS:-1}" --processes "${PROCESSES:-1}" \
        ${PROFILE_ARGS:-} -o "$profiles/$name.json"
}
profile "$gpu_type" "$both" 1
profile "$gpu_type-64SM" "$root/models/gpt2-xl-26h.json" 1,2 --sm-limit 64
profile "$gpu_type-32SM" "$both" 1,4 --sm-limit 32
# the README's pipeline on one GPU: GPT-2 124M on 80 + 40 SMs
profile "$gpu_type-80SM" "$root/models/gpt2-124m.json" 1 --sm-limit 80
profile "$gpu_type-40SM" "$root/models/gpt2-124m.json" 1 --sm-limit 40
# each slice of a plan of several beside its busy neighbours (the names
# cluster() and the README's plan below give them)
profile "$gpu_type-64SM-beside-64" "$root/models/gpt2-xl-26h.json" 1,2 \
    --sm-limit 64 --beside 64
profile "$gpu_type-32SM-beside-32-32-32" "$both" 1,4 --sm-limit 32 \
    --beside 32,32,32
profile "$gpu_type-80SM-beside-40" "$root/models/gpt2-124m.json" 1 \
    --sm-limit 80 --beside 40
profile "$gpu_type-40SM-beside-80" "$root/models/gpt2-124m.json" 1 \
    --sm-limit 40 --beside 80

# ------------------------------------------------------------------ plans
mkdir -p "$logs/plans"
# cluster SLICES SM_LIMIT: one node of SLICES "GPUs", each a slice of
# GPU 0 (SM_LIMIT 0: the whole GPU), linked by emulated NVLink; their type
# is the slice's profile beside its SLICES - 1 busy neighbours
cluster() {
    local slices=$1 sms=$2 type=$gpu_type devices="" i
    [ "$sms" -gt 0 ] && type="$gpu_type-${sms}SM"
    [ "$sms" -gt 0 ] && [ "$slices" -gt 1 ] && type+="-beside"
    for ((i = 0; i < slices; i++)); do
        [ "$sms" -gt 0 ] && [ $i -gt 0 ] && type+="-$sms"
        [ $i -gt 0 ] && devices+=", "
        if [ "$sms" -gt 0 ]; then
            devices+="{ \"index\": 0, \"sm_limit\": $sms }"
        else
            devices+="{ \"index\": 0 }"
        fi
    done
    printf '{ "name": "one-%s-%dx%s", "nodes": [ { "name": "gpu0", "gpu": "%s", "gpus": %d, "intra_node": { "bandwidth_GBps": 450, "latency_us": 5 }, "inter_node": { "bandwidth_GBps": 450, "latency_us": 5 }, "devices": [ %s ] } ] }' \
        "$gpu_type" "$slices" "$sms" "$type" "$slices" "$devices"
}
# plan NAME MODEL SLICES SM_LIMIT "tp dp pp" GBS [PARTITION]
plan() {
    local name=$1 model=$2 slices=$3 sms=$4 degrees=$5 gbs=$6
    local partition=${7:-} extra=""
    read -r tp dp pp <<<"$degrees"
    [ -n "$partition" ] && extra=", \"partition\": \"$partition\""
    cat >"$logs/plans/$name.json" <<JSON
{ "format": "partita-plan/1",
  "model": "$root/models/$model.json",
  "cluster": $(cluster "$slices" "$sms"),
  "gbs": $gbs, "mbs": 4, "tp": $tp, "dp": $dp, "pp": $pp,
  "schedule": "1f1b", "precision": "bf16"$extra }
JSON
}
# per slice, the baseline's 8 micro-batches of 4; the head costs about 2.4
# layers, so the last stage holds fewer
plan one-gpu-26h gpt2-xl-26h 1 0 "1 1 1" 32
# one rank on a 64-SM slice beside an idle one: against dp2's ranks (the
# same work per micro-batch, each beside a busy slice), what a neighbour
# costs
plan one-slice-64 gpt2-xl-26h 1 64 "1 1 1" 32
plan tp2 gpt2-xl-26h 2 64 "2 1 1" 64
plan dp2 gpt2-xl-26h 2 64 "1 2 1" 64
plan pp2 gpt2-xl-26h 2 64 "1 1 2" 64 23-21
plan pp4 gpt2-xl-26h 4 32 "1 1 4" 128 12-12-11-9
plan one-gpu-24h gpt2-xl-24h 1 0 "1 1 1" 32
plan tp4 gpt2-xl-24h 4 32 "4 1 1" 64
# the README's example (docs/examples/plan-pp2-one-h200.json) with its
# slices' own profiles, each beside the other busy (the file names the
# whole-GPU type for 80 SMs)
sed -e "s|\"../../models/|\"$root/models/|" \
    -e "s|\"gpu\": \"H200\"|\"gpu\": \"$gpu_type-80SM-beside-40\"|" \
    -e "s|\"gpu\": \"H200-40SM\"|\"gpu\": \"$gpu_type-40SM-beside-80\"|" \
    "$root/docs/examples/plan-pp2-one-h200.json" >"$logs/plans/readme-pp2.json"

# -------------------------------------------------------------- benchmark
bench="$logs/bench"
mkdir -p "$bench"
ran=()
for name in $rows; do
    if [ "$SECONDS" -ge "$budget" ]; then
        echo "SKIP $name: the batch has run $SECONDS s (BUDGET_S $budget)"
        gpu_note "bench-$name" FAIL "not run: out of time ($SECONDS s)"
        continue
    fi
    row_iters=$iters
    [ "$name" = readme-pp2 ] && row_iters=$((iters * 3))
    echo "== $name ($row_iters iterations)"
    "$partita" estimate "$logs/plans/$name.json" --json \
        --profiles "$profiles" >"$bench/$name.estimate.json" \
        2>"$bench/$name.estimate.log" ||
        { echo "NOTE $name: no estimate"; tail -2 "$bench/$name.estimate.log"; }
    step "bench-$name" 110 "$partita" exec "$logs/plans/$name.json" \
        --data "$data" --backend cuda --iters "$row_iters" \
        --log-interval "$row_iters" --comm-timeout 120 \
        -o "$bench/$name.run.json" && ran+=("$name")
done

table_rows=()
for name in $rows; do
    case $name in
        one-gpu-26h|one-gpu-24h|one-slice-64) table_rows+=("$name:-:-:1") ;;
        tp2) table_rows+=("$name:one-gpu-26h:0.80:1") ;;
        dp2) table_rows+=("$name:one-gpu-26h:0.95:1") ;;
        pp2) table_rows+=("$name:one-gpu-26h:0.90:1") ;;
        pp4) table_rows+=("$name:one-gpu-26h:-:1") ;;
        readme-pp2) table_rows+=("$name:-:-:1") ;;
        tp4) table_rows+=("$name:one-gpu-24h:-:1") ;;
        *) table_rows+=("$name:-:-:1") ;;
    esac
done
echo
echo "Benchmark on one $gpu_type: ratio = tokens/s over the one rank on the"
echo "whole GPU; then rank 0's phases against its slice's profile"
python3 "$root/bench/parallel/table.py" "$warmup" "$bench" \
    "${table_rows[@]}" | tee "$logs/table.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || gpu_note table FAIL "table.py failed"

gpu_summary run_devcomm.sh
