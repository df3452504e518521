#!/usr/bin/env bash
# Tensor parallelism's sums beside the products (issue 38 item 2;
# docs/cuda-backend.md, "Tensor parallelism"): bench/parallel's tp 2 rows
# (the 13B-shaped stack and GPT-2 1.5B-26h) with the sums in line and
# under each setting of VARIANTS, against the one-GPU rows of the same
# call, all in one table (bench/parallel/table.py). The one-GPU rows of
# the two models run at once, one on each GPU; every tp row runs alone.
#
# Usage: bench/parallel/tp_overlap.sh BUILD_DIR [LOG_DIR]
# Environment:
#   VARIANTS  space-separated NAME=VAR=VALUE[,VAR=VALUE...] settings of
#             the tp rows besides the in-line one (default: the option
#             at margin 8, with the backward's sums on a lean
#             communicator of 8 CTAs, =2, the forward's row-parallel
#             products in two halves, and =3, the forward in two halves
#             of the micro-batch, both at margin 8)
#   MODELS    which models: 13b, 26h or both (default "13b 26h")
#   ITERS     iterations of a run (default 5 for the 13B stack, 6 for
#             GPT-2 1.5B-26h), the first 2 left out of the timing
#   DRY_RUN=1 prints each run's settings and row instead of running it
# Each run takes 20 to 35 s on two H200s.
set -u
build=$(cd "${1:?usage: tp_overlap.sh BUILD_DIR [LOG_DIR]}" && pwd)
logs=${2:-$build/bench-tp-overlap-logs}
here=$(cd "$(dirname "$0")" && pwd)
variants=${VARIANTS:-"margin8=PARTITA_CUDA_TP_OVERLAP=1,PARTITA_CUDA_TP_SM_MARGIN=8 lean8=PARTITA_CUDA_TP_OVERLAP=1,PARTITA_CUDA_TP_SM_MARGIN=8,PARTITA_NCCL_LEAN_CTAS=8 halves8=PARTITA_CUDA_TP_OVERLAP=2,PARTITA_CUDA_TP_SM_MARGIN=8 halves3=PARTITA_CUDA_TP_OVERLAP=3,PARTITA_CUDA_TP_SM_MARGIN=8"}
models=${MODELS:-"13b 26h"}
dry=${DRY_RUN:-0}
mkdir -p "$logs/all"

if [ "$dry" != 1 ]; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "$gpus" -lt 2 ]; then
        echo "SKIP bench/parallel/tp_overlap.sh: needs 2 GPUs, $gpus visible"
        exit 0
    fi
fi

one_gpu_row() { [ "$1" = 13b ] && echo one-gpu-13b || echo one-gpu-26h; }
tp_row() { [ "$1" = 13b ] && echo tp2-13b || echo tp2; }
iters_of() { echo "${ITERS:-$([ "$1" = 13b ] && echo 5 || echo 6)}"; }

# run NAME ROW ITERS GPU SETTINGS: one run.sh row into logs/NAME, its
# run.json kept as logs/all/NAME.run.json (SETTINGS: VAR=VALUE,... or -;
# GPU: the device it may see, or - for every one)
run() {
    local name=$1 row=$2 iters=$3 gpu=$4 settings=$5
    local vars=(ITERS="$iters" ROWS="$row")
    [ "$gpu" != - ] && vars+=(CUDA_VISIBLE_DEVICES="$gpu")
    [ "$settings" != - ] && IFS=, read -r -a extra <<<"$settings" &&
        vars+=("${extra[@]}")
    if [ "$dry" = 1 ]; then
        echo "run $name: ${vars[*]}"
        return 0
    fi
    env "${vars[@]}" "$here/run.sh" "$build" "$logs/$name" \
        >"$logs/$name.txt" 2>&1
    grep -h 'exec:.*median' "$logs/$name.txt"
    cp "$logs/$name/$row.run.json" "$logs/all/$name.run.json" 2>/dev/null ||
        echo "FAIL $name (see $logs/$name.txt)"
}

echo "== the one-GPU rows, one on each GPU"
pids=() gpu=0
for model in $models; do
    run "$(one_gpu_row "$model")" "$(one_gpu_row "$model")" \
        "$(iters_of "$model")" "$gpu" - &
    pids+=($!)
    gpu=$((gpu + 1))
done
# the runs' own pids: a bare `wait` would also wait for a process
# substitution of the caller's (a `tee` of this script's output)
wait "${pids[@]}"

rows=()
for model in $models; do
    base=$(one_gpu_row "$model")
    target=$([ "$model" = 13b ] && echo 0.90 || echo 0.85)
    rows+=("$base:-:-")
    for variant in inline $variants; do
        name=${variant%%=*} settings=${variant#*=}
        [ "$variant" = inline ] && settings=-
        echo "== $model, tp 2, $name"
        run "$model-$name" "$(tp_row "$model")" "$(iters_of "$model")" - \
            "$settings"
        rows+=("$model-$name:$base:$target")
    done
done
[ "$dry" = 1 ] && exit 0
python3 "$here/table.py" 2 "$logs/all" "${rows[@]}" | tee "$logs/table.md"
