#!/usr/bin/env bash
# Issue 38's measurements on the 4-GPU machine (nvidia-h200-x4), by parts
# (PARTS, in this order; default all), each under its own time limit, so
# that three device calls of under 10 minutes hold them
# (PARTS="scripts", "suite", "quality scaling curves"):
#   scripts  item 1 and 3: every row of run_parallel.sh with GPUS=4
#            (test_nccl_parallel, the layouts against one GPU, GPipe,
#            the failing rank; no benchmark) and run_mpi.sh (one process
#            a rank against threads, 2 and 4 GPUs) with the Open MPI that
#            bundle_mpi.sh copied to BUNDLE_DIR (default BUILD_DIR/ompi);
#   suite    item 4: the accuracy suite's 4-GPU plans (bench/accuracy/
#            plans 21-26, bench/accuracy/run.sh) and bench/accuracy/
#            plans-x4 with their losses against one GPU (run_gpus.sh);
#   quality  item 5: bench/accuracy/plan_quality.sh on h200x4-hetero, the
#            planner's best against its next two, the best plain 1F1B,
#            the even partition and plain dp;
#   scaling  item 2: bench/parallel/run.sh's 4-GPU rows and their
#            baselines (one-gpu dp4 pp4 one-gpu-13b tp2-13b tp4-13b);
#   curves   item 6: `partita profile --quick` of GPT-2 124M on the 4 GPUs:
#            all-reduce, reduce-scatter, all-gather and send/recv over 2
#            and 4 GPUs, with compute_lost.
# Each part's output is packed into OUT_DIR/PART.tgz as soon as it ends,
# its log's last lines printed. The comparing half runs anywhere after:
# build/bench/accuracy bench/accuracy/plans RUNS table.md charts.
#
# Usage: tests/executor/gpu/four_gpu_call.sh BUILD_DIR OUT_DIR
# Environment: PARTS; BUNDLE_DIR; ITERS (8, for the suite and quality);
# SCRIPTS_S, SUITE_S, QUALITY_S, SCALING_S, CURVES_S (each part's limit
# in seconds: 540, 540, 300, 360, 120).
set -u
build=$(cd "${1:?usage: four_gpu_call.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: four_gpu_call.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
parts=${PARTS:-scripts suite quality scaling curves}
bundle=${BUNDLE_DIR:-$build/ompi}
export NCCL_NVLS_ENABLE=0 PARTITA_SOURCE="$root"
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SECONDS=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
[ "$gpus" -ge 4 ] || echo "note: $gpus GPUs visible; the 4-GPU rows skip themselves"
pack() { (cd "$work" && tar czf "$out/$1.tgz" --exclude='corpus*' "$1"); }
# limited SECONDS LOG COMMAND...: COMMAND under a time limit, its output
# in LOG, the last lines shown
limited() {
    local limit=$1 log=$2; shift 2
    echo "-- waiting on: $* (at most $limit s, log $log)"
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    echo "rc $? ($SECONDS s)"
    tail -n 6 "$log"
}
for part in $parts; do
    echo "== $part ($SECONDS s)"
    dir="$work/$part"
    mkdir -p "$dir"
    case $part in
    scripts)
        limit=${SCRIPTS_S:-540}
        GPUS=4 SKIP_BENCH=1 limited $((limit * 5 / 9)) "$dir/parallel.log" \
            "$here/run_parallel.sh" "$build" "$dir/parallel"
        ITERS=10 limited $((limit * 4 / 9)) "$dir/mpi.log" \
            "$here/run_mpi.sh" "$build" "$bundle" "$dir/mpi" ;;
    suite)
        limit=${SUITE_S:-540}
        ITERS=${ITERS:-8} limited $((limit / 2)) "$dir/plans.log" \
            "$root/bench/accuracy/run.sh" "$build" "$dir/runs" \
            21-4h200-xl-dp4 22-4h200-xl26h-dp2-tp2 23-4h200-xl-pp4 \
            24-4h200-xl24h-tp4 25-hetero4-xl-dp2-pp2-v6 \
            26-4h200-774m-pp2-dp2-zero1
        ITERS=${ITERS:-8} limited $((limit / 2)) "$dir/x4.log" \
            "$root/bench/accuracy/run_gpus.sh" "$build" "$dir/runs-x4" \
            "$root/bench/accuracy/plans-x4" ;;
    quality)
        ITERS=${ITERS:-8} limited "${QUALITY_S:-300}" "$dir/quality.log" \
            "$root/bench/accuracy/plan_quality.sh" "$build" "$dir/q" \
            "$root/profiles" ;;
    scaling)
        ROWS="one-gpu dp4 pp4 one-gpu-13b tp2-13b tp4-13b" \
            limited "${SCALING_S:-360}" "$dir/scaling.log" \
            "$root/bench/parallel/run.sh" "$build" "$dir/parallel" ;;
    curves)
        limited "${CURVES_S:-120}" "$dir/curves.log" "$build/cli/partita" \
            profile --model "$root/models/gpt2-124m.json" --tp 1 --mbs 1 \
            --quick -o "$dir/H200-x4.json" ;;
    *) echo "unknown part $part" ;;
    esac
    pack "$part"
done
echo "== done ($SECONDS s)"
