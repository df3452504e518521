#!/usr/bin/env bash
# The measured profiles of the bundled GPU types, for the GPU machines:
# the two GPT-2 1.5B shapes profiled by `partita profile`: GPT-2 XL
# (models/gpt2-xl.json; its 25 heads split over no tp > 1, so tp 1 only)
# and gpt2-xl-26h (26 heads of 64: tp 1 and 2), one shape each.
#   on 2 x H200: H200.json (full GPU, NCCL curves over the two GPUs),
#                H200-repeat.json and the repeatability check
#                (`partita profile --compare`, 3 % per entry),
#                H200-40SM.json and H200-16SM.json (green contexts; curves
#                between two GPUs both held to those SMs);
#   on 1 x H100: H100.json, H100-repeat.json and the same check (no
#                curves: one GPU, the cluster file's link figures apply).
# Each profile's JSON, its table (NAME.log) and progress (NAME.err) go
# to OUT_DIR; a summary with timings comes last. Copy the JSON files that
# pass into profiles/.
#
# Usage: bench/profile/run.sh OUT_DIR [PARTITA_BINARY]
#   PARTITA_BINARY  a partita built with -Dcuda=enabled (default
#                   build-prof-cuda/cli/partita); when its build directory
#                   has a lib/ folder (GLPK and friends, absent on the GPU
#                   machine), it goes on LD_LIBRARY_PATH.
# Environment: PROFILE_ARGS adds arguments to every profile (say
# "--quick"); MODELS overrides the comma-separated model files.
# Exit status: 0 when every profile was written and the repeat agrees.
set -u
out=${1:?usage: run.sh OUT_DIR [PARTITA_BINARY]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita=${2:-$root/build-prof-cuda/cli/partita}
model=${MODELS:-$root/models/gpt2-xl.json,$root/models/gpt2-xl-26h.json}
extra=${PROFILE_ARGS:-}
export NCCL_NVLS_ENABLE=0
export PARTITA_SOURCE="$root"
build_lib="$(dirname "$(dirname "$partita")")/lib"
if [ -d "$build_lib" ]; then
    export LD_LIBRARY_PATH="$build_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ ! -x "$partita" ]; then
    echo "FAIL run.sh: $partita is missing (build cli/partita with -Dcuda=enabled)"
    exit 1
fi
mkdir -p "$out"
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu_count=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm \
    --format=csv >"$out/nvidia-smi.txt" 2>&1
echo "# $gpu_count x $gpu_name; partita: $partita"

status=0
summary=()
script_start=$SECONDS
# profile NAME ARGS...: one profile into OUT_DIR/NAME.json
profile() {
    local name=$1; shift
    local start=$SECONDS
    echo "== $name: partita profile --model $model $* $extra"
    # shellcheck disable=SC2086
    "$partita" profile --model "$model" "$@" $extra -o "$out/$name.json" \
        >"$out/$name.log" 2>"$out/$name.err"
    local rc=$?
    local verdict=PASS
    if [ $rc -ne 0 ]; then verdict=FAIL; status=1; tail -5 "$out/$name.err"; fi
    grep -E '^# (profile|optimizer|note|measured)' "$out/$name.log"
    summary+=("$(printf '%-14s %-4s exit %d, %4d s' "$name" "$verdict" $rc \
        $((SECONDS - start)))")
}
# compare A B: the repeatability check, 3 % per entry
compare() {
    local start=$SECONDS
    "$partita" profile --compare "$out/$1.json" "$out/$2.json" --tolerance 3 \
        >"$out/compare-$1.log" 2>&1
    local rc=$?
    local verdict=PASS
    if [ $rc -ne 0 ]; then verdict=FAIL; status=1; fi
    grep ' over$\| only in ' "$out/compare-$1.log" | head -40
    tail -1 "$out/compare-$1.log"
    summary+=("$(printf '%-14s %-4s exit %d, %4d s  (%s)' "compare $1" \
        "$verdict" $rc $((SECONDS - start)) "$(tail -1 "$out/compare-$1.log")")")
}

case "$gpu_name" in
*H200*)
    profile H200 --gpu-name H200
    profile H200-repeat --gpu-name H200
    compare H200 H200-repeat
    profile H200-40SM --sm-limit 40
    profile H200-16SM --sm-limit 16
    ;;
*H100*)
    profile H100 --gpu-name H100
    profile H100-repeat --gpu-name H100
    compare H100 H100-repeat
    ;;
*)
    name=$(echo "$gpu_name" | tr ' /' '__')
    profile "${name:-gpu}"
    ;;
esac

echo
echo "# summary ($gpu_count x $gpu_name), $((SECONDS - script_start)) s in all"
for line in "${summary[@]}"; do echo "  $line"; done
exit $status
