#!/usr/bin/env bash
# Issue 17 item 2's minute, for the GPU machine: `partita profile
# --missing-only` adds a model's shape to a copy of the committed profile
# of the GPU at hand (profiles/H100.json or H200.json, which lack it),
# once at the default lists (every tp the heads allow x micro-batches 1,
# 2, 4, 8, 16) and once at one point (--tp 2 --mbs 4), with the default
# repeatable measurement (8 processes). Prints each wall-clock time
# against the 60 s target, in nccl-tests' table shape.
#
# Usage: bench/profile/missing_only.sh BUILD_DIR [OUT_DIR]
#   BUILD_DIR  a meson build made with -Dcuda=enabled (partita and
#              partita-exec in BUILD_DIR/cli; a lib/ beside cli/ goes on
#              LD_LIBRARY_PATH)
# Environment: MODEL (default gpt2-124m), TARGET_S (60).
# Exit status: 0 when both come in under the target, 1 otherwise, 77
# without a GPU.
set -u
build=$(cd "${1:?usage: missing_only.sh BUILD_DIR [OUT_DIR]}" && pwd)
out=${2:-$build/missing-only}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
model=${MODEL:-gpt2-124m}
target=${TARGET_S:-60}
export NCCL_NVLS_ENABLE=0 PARTITA_SOURCE="$root"
if [ -d "$build/lib" ]; then
    export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP missing_only: no GPU"
    exit 77
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 |
    grep -o 'H[0-9]00' | head -1)
if [ -z "$gpu" ] || [ ! -f "$root/profiles/$gpu.json" ]; then
    echo "SKIP missing_only: no committed profile for this GPU"
    exit 77
fi
mkdir -p "$out"
status=0
printf '# %s, model %s, target %s s\n' "$(nvidia-smi --query-gpu=name \
    --format=csv,noheader | head -1)" "$model" "$target"
printf '# %-22s %8s %8s %10s %8s\n' case points wall_s measured of_target
for run in "default lists:" "one point:--tp 2 --mbs 4"; do
    name=${run%%:*}
    args=${run#*:}
    file="$out/${name// /-}.json"
    cp "$root/profiles/$gpu.json" "$file"
    start=$(date +%s.%N)
    # shellcheck disable=SC2086 # args is a list of words
    if ! "$partita" profile --model "$model" --missing-only $args \
            -o "$file" >"$out/${name// /-}.log" 2>"$out/${name// /-}.err"; then
        echo "FAIL missing_only: $name: $(tail -1 "$out/${name// /-}.err")"
        status=1
        continue
    fi
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    line=$(grep '^# added' "$out/${name// /-}.log")
    points=$(echo "$line" | sed -n 's/^# added \([0-9]*\) point.*/\1/p')
    measured=$(echo "$line" | sed -n 's/.*measured in \([0-9.]* m*s\)).*/\1/p' | tr -d ' ')
    ratio=$(awk -v w="$wall" -v t="$target" 'BEGIN{printf "%.2f", w / t}')
    printf '  %-22s %8s %8s %10s %8s\n' "$name" "$points" "$wall" \
        "$measured" "$ratio"
    if awk -v w="$wall" -v t="$target" 'BEGIN{exit !(w >= t)}'; then
        status=1
    fi
done
if [ $status -eq 0 ]; then
    echo "PASS missing_only: every case under $target s"
else
    echo "FAIL missing_only: a case took $target s or more (logs in $out)"
fi
exit $status
