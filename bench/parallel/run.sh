#!/usr/bin/env bash
# Throughput of 1.5B GPTs on two GPUs of one machine, `partita exec` on the
# cuda backend over NCCL, against the one-GPU run of the same model: GPT-2
# XL (models/gpt2-xl.json) on one GPU, dp = 2 and pp = 2 (1F1B, 16
# micro-batches: a bubble of 1/17); the 26-head 1.5B shape
# (models/gpt2-xl-26h.json: GPT-2 XL's 25 heads do not split over tp = 2)
# on one GPU and tp = 2. Every 2-GPU plan does per GPU the work of the
# one-GPU plan (micro-batches of 4, gbs 64 against 32), so the ratio of its
# tokens/s to twice the one-GPU figure is its scaling efficiency. Targets:
# dp and pp at least 0.9, tp at least 0.8. The plans are in
# bench/parallel/plans/; docs/benchmarks.md has the results.
#
# Usage: bench/parallel/run.sh BUILD_DIR [LOG_DIR]
# Environment: ITERS iterations per run (7), WARMUP iterations left out of
# the timing (2), ROWS which plans (default all: one-gpu dp2 pp2
# one-gpu-26h tp2). Each run takes 30 to 50 s, most of it initialising
# 1.5 billion parameters on the host.
set -u
build=$(cd "${1:?usage: run.sh BUILD_DIR [LOG_DIR]}" && pwd)
logs=${2:-$build/bench-parallel-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
iters=${ITERS:-7}
warmup=${WARMUP:-2}
rows=${ROWS:-"one-gpu dp2 pp2 one-gpu-26h tp2"}
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
# libraries the GPU machine lacks (GLPK and its dependencies) may sit in
# BUILD_DIR/lib (docs/cuda-backend.md, "Build and hook-up")
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -lt 2 ]; then
    echo "SKIP bench/parallel: needs 2 GPUs, $gpus visible"
    exit 0
fi
data="$logs/corpus"
[ -s "$data.bin" ] || "$partita" prep "$root/data/corpus.txt" -o "$data" \
    >"$logs/prep.log" 2>&1 || { echo "FAIL partita prep"; exit 1; }

status=0
for name in $rows; do
    start=$SECONDS
    echo "== $name ($iters iterations)"
    if "$partita" exec "$here/plans/$name.json" --data "$data" \
        --backend cuda --iters "$iters" --log-interval "$iters" \
        -o "$logs/$name.run.json" >"$logs/$name.log" 2>&1; then
        grep '^exec:' "$logs/$name.log" | head -2
    else
        echo "FAIL $name (see $logs/$name.log)"; tail -3 "$logs/$name.log"
        status=1
    fi
    echo "   $((SECONDS - start)) s"
done

table_rows=()
for name in $rows; do
    case $name in
        one-gpu|one-gpu-26h) table_rows+=("$name:-:-") ;;
        dp2|pp2) table_rows+=("$name:one-gpu:0.9") ;;
        tp2) table_rows+=("$name:one-gpu-26h:0.8") ;;
        *) table_rows+=("$name:-:-") ;;
    esac
done
echo
python3 "$here/table.py" "$warmup" "$logs" "${table_rows[@]}" |
    tee "$logs/table.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
