#!/usr/bin/env bash
# Tensor parallelism against tp 1 after the first optimizer step, on one
# GPU (tp 2 as two 40-SM slices over the device exchange). The
# thirty-first session found that on 1664-wide GPT-2 layers tp 1 and tp 2
# with its sums in line (the default; =1 and =2 alike) part from
# iteration 2 on (3e-4 in loss on two layers at lr 1e-4, 3e-3 on GPT-2
# 1.5B-26h at lr 1e-5), while =3 follows tp 1 to 2e-5; iteration 1
# agrees everywhere (the biases are zero and the norms the identity
# there), putting the norms' parameters and the row-parallel biases back
# to their first values closes the gap, and the cpu backend's fp32 steps
# side with tp 2 in line (docs/records/gpu-runs.md, thirty-first session;
# docs/cuda-backend.md, "Known defect"). Every unit test of tp compares
# one step from the initial parameters, which cannot see it. This script
# is the check: per model, a run of 3 iterations (lr 1e-4) at tp 1 on
# the whole GPU and at tp 2 in line, =1, =3, over the host-staged fp32
# comm and without fused epilogues; each tp 2 row passes when its
# iterations 2 and 3 are within 1.5e-4 (relative) of tp 1's, so any
# disagreement fails, whichever side is wrong. The models: 1664-wide
# GPT-2 and Llama layers (the Llama without biases and with RMSNorm:
# whether the biases carry it), 64-wide GPT-2 layers (where no gap was
# seen), and one short 1664-wide GPT-2 layer that the cpu backend also
# trains (fp32: which side is right; its distance is reported, not
# judged).
#
# Usage: tests/executor/gpu/tp_after_step.sh BUILD_DIR [LOG_DIR]
#   DRY_RUN=1 prints the rows without running them; MODELS picks models
#   (default "gpt-wide llama-wide gpt-narrow gpt-wide-short").
set -u
build=$(cd "${1:?usage: tp_after_step.sh BUILD_DIR [LOG_DIR]}" && pwd)
logs=${2:-$build/tp-after-step-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
dry=${DRY_RUN:-0}
models=${MODELS:-"gpt-wide llama-wide gpt-narrow gpt-wide-short"}
mkdir -p "$logs"
export PARTITA_SOURCE="$root" NCCL_NVLS_ENABLE=0
# shellcheck source=tests/executor/gpu/gpu_rows.sh
source "$here/gpu_rows.sh"
partita="$build/cli/partita"

# the plans: MODEL-tp1.json (whole GPU) and MODEL-tp2.json (two slices)
python3 - "$logs" "$root" <<'EOF' || exit 1
import json, sys
logs, root = sys.argv[1], sys.argv[2]
gpt = {"layers": 2, "hidden": 1664, "heads": 26, "seq": 1024, "vocab": 257}
models = {
    "gpt-wide": (gpt, 16, 4),
    "llama-wide": (dict(gpt, kv_heads=26, ffn_hidden=4480, norm="rmsnorm",
                        mlp="swiglu", positions="rope", bias=False), 16, 4),
    "gpt-narrow": (dict(gpt, hidden=64, heads=4), 16, 4),
    "gpt-wide-short": (dict(gpt, layers=1, seq=64), 4, 2),
}
for name, (shape, gbs, mbs) in models.items():
    for tp, cluster in ((1, "h200x1"), (2, "h200-slices-2x40")):
        plan = {"format": "partita-plan/1", "model": dict(shape, name=name),
                "cluster": f"{root}/clusters/{cluster}.json", "gbs": gbs,
                "mbs": mbs, "tp": tp, "dp": 1, "pp": 1,
                "schedule": "1f1b", "precision": "bf16"}
        json.dump(plan, open(f"{logs}/{name}-tp{tp}.json", "w"), indent=1)
EOF
[ -s "$logs/corpus.idx" ] || "$partita" prep "$root/data/corpus.txt" \
    -o "$logs/corpus" >/dev/null || exit 1

step_options=(--data "$logs/corpus" --iters 3 --lr 1e-4 --warmup 0
              --log-interval 1)
row() { # NAME PLAN BACKEND "EXEC OPTIONS" ENV...
    local name=$1 plan=$2 backend=$3 options=$4; shift 4
    # shellcheck disable=SC2206 # the options are words
    local command=(env "$@" "$partita" exec "$logs/$plan.json"
                   --backend "$backend" "${step_options[@]}" $options
                   -o "$logs/$name.run.json")
    if [ "$dry" = 1 ]; then
        echo "row $name: ${command[*]}"
        return 0
    fi
    gpu_row "$name" 120 "${command[@]}"
}

for model in $models; do
    row "$model-tp1" "$model-tp1" cuda ""
    row "$model-tp2-inline" "$model-tp2" cuda ""
    row "$model-tp2-o1" "$model-tp2" cuda "" PARTITA_CUDA_TP_OVERLAP=1
    row "$model-tp2-o3" "$model-tp2" cuda "" PARTITA_CUDA_TP_OVERLAP=3
    row "$model-tp2-host" "$model-tp2" cuda "--gpu-comm host"
    row "$model-tp2-fuse0" "$model-tp2" cuda "" PARTITA_CUDA_FUSE=0
    if [ "$model" = gpt-wide-short ]; then
        row "$model-cpu" "$model-tp1" cpu ""
    fi
done
[ "$dry" = 1 ] && exit 0

# the verdicts: every tp 2 row against tp 1's iterations 2 and 3
while read -r verdict name text; do
    gpu_note "$name" "$verdict" "$text"
done < <(python3 "$here/tp_after_step.py" "$logs" $models)
gpu_summary tp_after_step.sh
