#!/usr/bin/env bash
# Throughput of 1.5B GPTs on two or four GPUs of one machine, `partita
# exec` on the cuda backend over NCCL, against the one-GPU run of the same
# model: GPT-2 XL (models/gpt2-xl.json) on one GPU, dp = 2 and pp = 2
# (1F1B, 16 micro-batches: a bubble of 1/17); the 26-head 1.5B shape
# (models/gpt2-xl-26h.json: GPT-2 XL's 25 heads do not split over tp = 2)
# on one GPU and tp = 2. With 4 GPUs also dp = 4, pp = 4 (32
# micro-batches), and a 13B-shaped layer stack (8 of GPT-3 13B's layers
# with 40 heads, seq 2048, micro-batches of 2) on one GPU, tp = 2 and
# tp = 4. Every plan of N GPUs does per GPU the work of its one-GPU plan,
# so the ratio of its tokens/s to N times the one-GPU figure is its
# scaling efficiency. Targets (issue 38): dp 2 and dp 4 0.97, pp 2 0.9,
# pp 4 0.88, the 1.5B tp 2 0.85, the 13B stack's tp 2 0.90 and tp 4 0.80.
# The plans are in bench/parallel/plans/; docs/benchmarks.md has the
# results.
#
# Usage: bench/parallel/run.sh BUILD_DIR [LOG_DIR]
# Environment: ITERS iterations per run (7), WARMUP iterations left out of
# the timing (2), ROWS which plans (default: one-gpu dp2 pp2 one-gpu-26h
# tp2, and where 4 GPUs are visible dp4 pp4 one-gpu-13b tp2-13b tp4-13b
# too). Each run takes 30 to 50 s, most of it initialising 1.5 billion
# parameters on the host (the 13B stack's 2.6 billion: about a minute).
set -u
build=$(cd "${1:?usage: run.sh BUILD_DIR [LOG_DIR]}" && pwd)
logs=${2:-$build/bench-parallel-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
iters=${ITERS:-7}
warmup=${WARMUP:-2}
rows=${ROWS:-}
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
if [ -z "$rows" ]; then
    rows="one-gpu dp2 pp2 one-gpu-26h tp2"
    [ "$gpus" -ge 4 ] && rows="$rows dp4 pp4 one-gpu-13b tp2-13b tp4-13b"
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
        one-gpu-13b) table_rows+=("$name:-:-") ;;
        dp2) table_rows+=("$name:one-gpu:0.97") ;;
        pp2) table_rows+=("$name:one-gpu:0.9") ;;
        tp2) table_rows+=("$name:one-gpu-26h:0.85") ;;
        dp4) table_rows+=("$name:one-gpu:0.97:4") ;;
        pp4) table_rows+=("$name:one-gpu:0.88:4") ;;
        tp2-13b) table_rows+=("$name:one-gpu-13b:0.90") ;;
        tp4-13b) table_rows+=("$name:one-gpu-13b:0.80:4") ;;
        *) table_rows+=("$name:-:-") ;;
    esac
done
echo
python3 "$here/table.py" "$warmup" "$logs" "${table_rows[@]}" |
    tee "$logs/table.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
