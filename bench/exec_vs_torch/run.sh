#!/usr/bin/env bash
# Partita's cuda backend against PyTorch (eager and torch.compile) on the
# same GPU, in one run: GPT-2 124M / 350M at micro-batch 16, 774M / 1.5B
# at 8, sequence 1024, synthetic tokens. Prints a table of tokens/s, the
# ratio Partita / torch.compile and peak device memory.
#
# Usage: bench/exec_vs_torch/run.sh BUILD_DIR [LOG_DIR]
# Environment:
#   CONFIGS   "model:mbs ..." (default: the four GPT-2 sizes)
#   WARMUP, STEPS         steps per run (default 5 and 20)
#   MODES     torch modes to run (default "eager compile")
#   PYTHON    the python with torch (default python3)
set -u
build=${1:?usage: run.sh BUILD_DIR [LOG_DIR]}
logs=${2:-$build/bench-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
configs=${CONFIGS:-"gpt2-124m:16 gpt2-350m:16 gpt2-774m:8 gpt2-xl:8"}
warmup=${WARMUP:-5}
steps=${STEPS:-20}
modes=${MODES:-"eager compile"}
python=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
mkdir -p "$logs"
bench="$build/bench/exec_vs_torch/exec_bench"
if [ ! -x "$bench" ]; then
    echo "FAIL run.sh: $bench is missing (build with -Dcuda=enabled)"
    exit 1
fi

# value KEY LINE: the value of KEY=... in a RESULT line
value() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

status=0
table=()
for config in $configs; do
    model=${config%%:*}
    mbs=${config##*:}
    json="$root/models/$model.json"
    log="$logs/partita-$model-mbs$mbs.log"
    echo "== partita $model mbs $mbs"
    if "$bench" "$json" "$mbs" "$warmup" "$steps" >"$log" 2>&1; then
        ours=$(grep '^RESULT' "$log")
        grep '^#' "$log"
    else
        echo "FAIL partita $model (see $log)"; tail -5 "$log"
        ours=""; status=1
    fi
    declare -A torch_tps=() torch_mem=()
    for mode in $modes; do
        tlog="$logs/torch-$mode-$model-mbs$mbs.log"
        echo "== torch $mode $model mbs $mbs"
        if PYTHONUNBUFFERED=1 "$python" "$here/torch_gpt.py" --model "$json" \
            --mbs "$mbs" --mode "$mode" --warmup "$warmup" --steps "$steps" \
            >"$tlog" 2>&1; then
            line=$(grep '^RESULT' "$tlog")
            grep '^#' "$tlog"
            torch_tps[$mode]=$(value tokens_per_s "$line")
            torch_mem[$mode]=$(value peak_gib "$line")
        else
            echo "FAIL torch $mode $model (see $tlog)"; tail -5 "$tlog"
            torch_tps[$mode]=""; torch_mem[$mode]=""
        fi
    done
    p_tps=$(value tokens_per_s "$ours")
    p_mem=$(value peak_gib "$ours")
    c_tps=${torch_tps[compile]:-}
    ratio="-"
    if [ -n "$p_tps" ] && [ -n "$c_tps" ]; then
        ratio=$(awk -v a="$p_tps" -v b="$c_tps" 'BEGIN { printf "%.3f", a / b }')
    fi
    table+=("$(printf '| %-10s | %3s | %12s | %12s | %12s | %7s | %8s | %8s | %8s |' \
        "$model" "$mbs" "${p_tps:--}" "${torch_tps[eager]:--}" "${c_tps:--}" \
        "$ratio" "${p_mem:--}" "${torch_mem[eager]:--}" "${torch_mem[compile]:--}")")
    unset torch_tps torch_mem
done

echo
echo "Training throughput, seq 1024, tokens/s (higher is better); memory in GiB"
echo "(Partita: device memory its stage holds; torch: max_memory_allocated)"
printf '| %-10s | %3s | %12s | %12s | %12s | %7s | %8s | %8s | %8s |\n' \
    model mbs partita torch-eager torch-compile ratio mem-ours mem-eager mem-comp
echo "|------------|-----|--------------|--------------|--------------|---------|----------|----------|----------|"
for row in "${table[@]}"; do echo "$row"; done
echo "(ratio = Partita / torch.compile; the target is >= 1.05)"
exit $status
