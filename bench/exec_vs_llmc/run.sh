#!/usr/bin/env bash
# Partita's cuda backend against llm.c (the C/CUDA GPT-2 trainer) on the
# same GPU, in one run, under each precision recipe of issue 34 (Megatron-
# LM's: fp32 main gradients; llm.c's: bf16 gradients), each held to its
# own targets: GPT-2 124M / 350M at micro-batch 16, 774M / 1.5B
# at 8, sequence 1024, bf16, AdamW, no recompute, random tokens. Prints
# tokens/s, the ratio Partita / llm.c and each program's peak device
# memory (the GPU's used memory sampled by nvidia-smi every 100 ms, less
# what was in use before: the CUDA context counts for both), with
# torch.compile beside them when asked. llm.c comes from outside the
# project (shared/tools/README.md says how it was built); this script
# never builds it.
#
# Usage: bench/exec_vs_llmc/run.sh BUILD_DIR LLMC_BINARY [LOG_DIR]
# Environment:
#   CONFIGS   "model:mbs ..." (default: the four GPT-2 sizes)
#   WARMUP, STEPS   steps per run (default 5 and 20)
#   RECIPES   "megatron llmc" (default: both): Partita's recipes, each a
#             row of its own; megatron = fp32 main gradients (targets
#             >= 0.99x llm.c's tokens/s, memory <= 1.05x), llmc = bf16
#             gradients (>= 1.02x, memory <= 1.00x)
#   TORCH=1   add torch.compile (bench/exec_vs_torch/torch_gpt.py)
#   PARTITA_CUDA_DETERMINISTIC=1   Partita with cuDNN's deterministic
#             attention backward, as llm.c runs it (default: dQ summed
#             in fp32 with atomics, Megatron-LM's default; the table's
#             last line says which)
#   ROUNDS    runs of each program per config (default 1), alternating
#             Partita's recipes and llm.c round by round; each column is
#             the median of its rounds' tokens/s (memory: the largest),
#             and every round's tokens/s are printed above the table
#             (llm.c's own run-to-run spread is about 1-2 %)
#   TRACE="model:mbs ..."   also trace every kernel of both programs at
#             these configs (bench/kernel_trace: CUPTI through
#             CUDA_INJECTION64_PATH) and print kernel_table.py's table;
#             Partita runs the last recipe of RECIPES there; every kernel
#             by name goes to LOG_DIR/kernel-names-MODEL.md
set -u
build=${1:?usage: run.sh BUILD_DIR LLMC_BINARY [LOG_DIR]}
llmc=${2:?usage: run.sh BUILD_DIR LLMC_BINARY [LOG_DIR]}
logs=${3:-$build/bench-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
configs=${CONFIGS:-"gpt2-124m:16 gpt2-350m:16 gpt2-774m:8 gpt2-xl:8"}
warmup=${WARMUP:-5}
steps=${STEPS:-20}
trace_configs=${TRACE:-}
rounds=${ROUNDS:-1}
recipes=${RECIPES:-"megatron llmc"}
for recipe in $recipes; do
    case $recipe in
    megatron|llmc) ;;
    *) echo "FAIL run.sh: RECIPES: unknown recipe '$recipe' (megatron, llmc)"; exit 1 ;;
    esac
done
# grad_of RECIPE: the grad precision exec_bench takes for it
grad_of() { [ "$1" = llmc ] && echo bf16 || echo fp32; }
# targets RECIPE: "min_speed max_memory"
targets_of() { [ "$1" = llmc ] && echo "1.02 1.00" || echo "0.99 1.05"; }
export NCCL_NVLS_ENABLE=0
mkdir -p "$logs"
bench="$build/bench/exec_vs_torch/exec_bench"
tracer="$build/bench/kernel_trace/libkernel_trace.so"
for program in "$bench" "$llmc"; do
    [ -x "$program" ] || { echo "FAIL run.sh: $program is missing"; exit 1; }
done

# llm.c reads its own token files: 256 int32 of header (magic 20240520,
# version 1, token count) and uint16 tokens.
tokens="$logs/llmc-tokens"
mkdir -p "$tokens"
python3 - "$tokens" <<'PY' || { echo "FAIL run.sh: token files"; exit 1; }
import struct, sys, random
random.seed(1234)
for name, count in (("train.bin", 16 * 1024 * 64 + 1), ("val.bin", 16 * 1024 * 2 + 1)):
    header = struct.pack("<256i", 20240520, 1, count, *([0] * 253))
    body = struct.pack(f"<{count}H", *(random.randrange(50257) for _ in range(count)))
    open(f"{sys.argv[1]}/{name}", "wb").write(header + body)
PY

# used_mib: the GPU's memory in use now, MiB
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1; }

# measure LOG COMMAND...: runs COMMAND with its output in LOG while
# sampling the GPU every 100 ms; sets peak_gib (memory over the idle
# level) and gpu_state: the median SM clock (MHz) and power draw (W)
# over the samples drawing at least 70 % of the run's highest power (the
# training steps, not the start-up). Identical kernels of both programs
# ran 1-8 % apart on 2026-11-30: the clocks say whether the GPU ran both
# at one speed.
measure() {
    local log=$1; shift
    local idle samples=$logs/memory.samples
    idle=$(used_mib)
    nvidia-smi --query-gpu=memory.used,clocks.sm,power.draw \
        --format=csv,noheader,nounits -i 0 -lms 100 >"$samples" 2>/dev/null &
    local sampler=$!
    "$@" >"$log" 2>&1
    local status=$?
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    peak_gib=$(awk -F', *' -v idle="$idle" 'BEGIN { m = 0 } $1 + 0 > m { m = $1 + 0 }
        END { printf "%.2f", (m - idle) / 1024 }' "$samples")
    local top clock power busy
    top=$(awk -F', *' 'BEGIN { m = 0 } $3 + 0 > m { m = $3 + 0 } END { print m }' "$samples")
    busy=$(awk -F', *' -v top="$top" '$3 + 0 >= 0.7 * top' "$samples")
    clock=$(echo "$busy" | awk -F', *' '{ print $2 }' | median_lines %.0f) || clock=-
    power=$(echo "$busy" | awk -F', *' '{ print $3 }' | median_lines %.0f) || power=-
    gpu_state="SM clock $clock MHz, power $power W (medians of $(echo "$busy" | grep -c .) samples at >= 70 % of the top power)"
    return $status
}

# llm.c's median step time (ms) over its steps after the first WARMUP,
# from its "step N/M | ... | T ms |" lines
llmc_step_ms() {
    sed -n 's/^step *\([0-9]*\)\/[0-9]* |.*| *\([0-9.]*\) ms |.*/\1 \2/p' "$1" |
        awk -v w="$warmup" '$1 > w { print $2 }' | median_lines %g
}

value() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# median_lines FORMAT: the median of the numbers on standard input, one a
# line, printed with FORMAT (none: nothing, status 1)
median_lines() {
    sort -n | awk -v f="$1" '{ v[NR] = $1 } END { if (NR == 0) exit 1;
        printf f, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# median VALUES...: their median, rounded (nothing: empty)
median() { [ $# -gt 0 ] && printf '%s\n' "$@" | median_lines %.0f; }
# largest VALUES...: the largest (memory over the rounds)
largest() { printf '%s\n' "$@" | sort -g | tail -1; }

status=0
table=()
for config in $configs; do
    model=${config%%:*}
    mbs=${config##*:}
    json="$root/models/$model.json"
    layers=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['layers'])" "$json")
    seq=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['seq'])" "$json")
    declare -A p_tps=() p_mem=()
    l_tps="" l_mem="" t_tps="" l_all=""
    for round in $(seq "$rounds"); do
        for recipe in $recipes; do
            echo "== partita $model mbs $mbs, recipe $recipe"
            plog="$logs/partita-$model-$recipe.log"
            if measure "$plog" env PARTITA_CUDA_RECOMPUTE=none \
                "$bench" "$json" "$mbs" "$warmup" "$steps" "$(grad_of "$recipe")"; then
                grep '^#' "$plog"
                echo "# partita: $gpu_state"
                p_tps[$recipe]="${p_tps[$recipe]:-} $(value tokens_per_s "$(grep '^RESULT' "$plog")")"
                p_mem[$recipe]="${p_mem[$recipe]:-} $peak_gib"
            else
                echo "FAIL partita $model $recipe"; tail -3 "$plog"; status=1
            fi
        done
        echo "== llm.c $model mbs $mbs"
        # -r 0: no recompute; -v, -m, -s: evaluate once on one batch, no
        # sampling until the last step
        llmc_args=(-e "d$layers" -b "$mbs" -t "$seq" -r 0 -v 100000 -m 1 -s 0
                   -i "$tokens/train.bin" -j "$tokens/val.bin")
        if measure "$logs/llmc-$model.log" "$llmc" "${llmc_args[@]}" \
            -x $((warmup + steps)) &&
            step_ms=$(llmc_step_ms "$logs/llmc-$model.log"); then
            one=$(awk -v b="$mbs" -v t="$seq" -v ms="$step_ms" 'BEGIN { printf "%.0f", b * t / (ms / 1e3) }')
            l_all="$l_all $one"
            l_mem="$l_mem $peak_gib"
            echo "# llm.c: median step $step_ms ms, $one tokens/s, peak $peak_gib GiB, $gpu_state"
        else
            echo "FAIL llm.c $model"; tail -3 "$logs/llmc-$model.log"; status=1
        fi
    done
    # each column's median over the rounds (one round: its value)
    echo "# $model rounds (tokens/s): llm.c$l_all$(for r in $recipes; do printf '; %s%s' "$r" "${p_tps[$r]:-}"; done)"
    l_tps=$(median $l_all)
    [ -n "$l_mem" ] && l_mem=$(largest $l_mem)
    for recipe in $recipes; do
        [ -n "${p_tps[$recipe]:-}" ] && p_tps[$recipe]=$(median ${p_tps[$recipe]})
        [ -n "${p_mem[$recipe]:-}" ] && p_mem[$recipe]=$(largest ${p_mem[$recipe]})
    done
    if [ "${TORCH:-0}" = 1 ]; then
        echo "== torch.compile $model mbs $mbs"
        if PYTHONUNBUFFERED=1 python3 "$root/bench/exec_vs_torch/torch_gpt.py" \
            --model "$json" --mbs "$mbs" --mode compile --warmup "$warmup" \
            --steps "$steps" >"$logs/torch-$model.log" 2>&1; then
            t_tps=$(value tokens_per_s "$(grep '^RESULT' "$logs/torch-$model.log")")
        else
            echo "FAIL torch $model"; tail -3 "$logs/torch-$model.log"
        fi
    fi
    for recipe in $recipes; do
        tps=${p_tps[$recipe]:-} mem=${p_mem[$recipe]:-}
        ratio=- mem_ratio=- verdict=-
        [ -n "$tps" ] && [ -n "$l_tps" ] &&
            ratio=$(awk -v a="$tps" -v b="$l_tps" 'BEGIN { printf "%.3f", a / b }')
        [ -n "$mem" ] && [ -n "$l_mem" ] &&
            mem_ratio=$(awk -v a="$mem" -v b="$l_mem" 'BEGIN { printf "%.3f", a / b }')
        read -r min_speed max_memory <<<"$(targets_of "$recipe")"
        if [ "$ratio" != - ] && [ "$mem_ratio" != - ]; then
            verdict=$(awk -v r="$ratio" -v m="$mem_ratio" -v s="$min_speed" -v x="$max_memory" \
                'BEGIN { print (r >= s && m <= x) ? "PASS" : "FAIL" }')
        fi
        table+=("$(printf '| %-10s | %3s | %-8s | %9s | %9s | **%s** | %6s GiB | %6s GiB | %s | %s (>= %s, <= %s) | %9s |' \
            "$model" "$mbs" "$recipe" "${l_tps:--}" "${tps:--}" "$ratio" "${l_mem:--}" \
            "${mem:--}" "$mem_ratio" "$verdict" "$min_speed" "$max_memory" "${t_tps:--}")")
    done
    unset p_tps p_mem
    if [[ " $trace_configs " == *" $config "* ]]; then
        if [ ! -f "$tracer" ]; then
            echo "SKIP trace $model: $tracer was not built (no CUPTI)"
            continue
        fi
        echo "== kernel trace $model mbs $mbs"
        KERNEL_TRACE_OUT="$logs/trace-partita-$model.tsv" CUDA_INJECTION64_PATH="$tracer" \
            PARTITA_CUDA_RECOMPUTE=none "$bench" "$json" "$mbs" 3 5 "$(grad_of "${recipes##* }")" \
            >"$logs/trace-partita-$model.log" 2>&1
        KERNEL_TRACE_OUT="$logs/trace-llmc-$model.tsv" CUDA_INJECTION64_PATH="$tracer" \
            "$llmc" "${llmc_args[@]}" -x 8 >"$logs/trace-llmc-$model.log" 2>&1
        python3 "$root/bench/kernel_trace/kernel_table.py" --model "$json" --mbs "$mbs" \
            "llm.c=$logs/trace-llmc-$model.tsv" "Partita=$logs/trace-partita-$model.tsv" |
            tee "$logs/kernel-table-$model.md" || status=1
        # every kernel by name, to its own file (long)
        python3 "$root/bench/kernel_trace/kernel_table.py" --model "$json" --mbs "$mbs" \
            --by-name "llm.c=$logs/trace-llmc-$model.tsv" \
            "Partita=$logs/trace-partita-$model.tsv" \
            >"$logs/kernel-names-$model.md" || status=1
    fi
done

echo
echo "Training throughput against llm.c on $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1),"
echo "seq 1024, bf16, AdamW, no recompute; tokens/s (higher is better); peak device memory over idle"
echo "| model | mbs | recipe | llm.c | Partita | Partita / llm.c | llm.c memory | Partita memory | memory ratio | targets | torch.compile |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for row in "${table[@]}"; do echo "$row"; done
echo "(recipes: megatron = bf16 activations, fp32 main gradients; llmc = bf16 gradients; targets of issue 34 per row)"
if [ "${PARTITA_CUDA_DETERMINISTIC:-0}" = 1 ]; then
    echo "(Partita's attention backward: cuDNN's deterministic one, as llm.c's)"
else
    echo "(Partita's attention backward: dQ summed in fp32 with atomics, Megatron-LM's default; llm.c's: cuDNN's deterministic one; PARTITA_CUDA_DETERMINISTIC=1 for the same)"
fi
exit $status
