#!/usr/bin/env bash
# Issue 17's measurements in calls of the GPU machine (one H200, each
# under 10 minutes), by parts (PARTS, in this order; default all):
#   suite   the one-GPU accuracy suite (run_one_gpu.sh: whole GPU, and
#           slices over the device exchange);
#   whole   the profile of the whole GPU (H200.json) for the suite's
#           shapes, no NCCL curves, timed as the bundled one was
#           (WHOLE_OPTIONS, default "--timing exec --layer-stack 16
#           --rounds 15 --round-ms 10": the layer inside the executor's
#           own steps, as the twelfth and seventeenth sessions measured
#           H200.json's GPT-2 layers; WHOLE_S, 300 s: 264 s for five
#           models on an H200, seventeenth session);
#   beside  the profiles of the suite's slices with their neighbours busy
#           and at rest (profile_beside.sh: H200-<N>SM-beside-... and its
#           -idle twin, the `gpu` and `gpu_at_rest` types of
#           clusters/h200-slices-*.json; 16 profiles, about 3 minutes);
#   alone   GPT-2 1.5B profiled on a 40- and a 16-SM slice alone (the
#           neighbours' effect, against beside);
#   slices  the profiles of the 40- and 16-SM slices alone for the
#           suite's shapes (H200-40SM.json, H200-16SM.json);
#   repeat  the profiler's repeatability (tests/executor/gpu/
#           profile_repeat.sh: GPT-2 124M profiled in three processes);
#   llama-beside  the Llama plans' shapes (bench/accuracy/plans-llama)
#           added to the profiles of the slices they run on, beside busy
#           and idle neighbours (profile_beside.sh with MISSING_ONLY=1:
#           copies of the committed profiles, the shapes they lack
#           measured; issue 35, item 7; not in the default PARTS);
#   llama-suite  the Llama plans run as the suite's (run_one_gpu.sh with
#           PLANS=bench/accuracy/plans-llama; not in the default PARTS).
# The Llama plans' whole-GPU shapes are H200.json's, added by
# bench/profile/llama_shapes.sh (issue 35, item 4).
# Each part has its own time limit; what it wrote is packed into OUT_DIR
# (PART.tgz) beside the log as soon as it ends.
# The profiles are measured with one set of stages in one process
# (STAGE_SETS and PROCESSES, 1: the part budgets were sized for one; the
# profiler's defaults are 3 sets in each of 4 processes); PROFILE_OPTIONS
# adds options to every `partita profile` (e.g. `--timing host`, the
# clock the suite's profiles were taken on until 2026-11-28).
#
# Usage: bench/accuracy/one_gpu_call.sh BUILD_DIR OUT_DIR
set -u
build=$(cd "${1:?usage: one_gpu_call.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: one_gpu_call.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
partita="$build/cli/partita"
parts=${PARTS:-suite whole beside alone slices repeat}
M=$root/models
suite_models=$M/gpt2-xl.json,$M/gpt2-xl-26h.json,$M/gpt2-350m.json,$M/gpt2-774m.json
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
pack() { (cd "$work" && tar czf "$out/$1.tgz" "$1"); }
# profile NAME DIR LIMIT ARGS...: one `partita profile` into DIR/NAME.json
profile() {
    local name=$1 dir=$2 limit=$3
    shift 3
    # shellcheck disable=SC2086 # PROFILE_OPTIONS: words on purpose
    timeout -k 5 "$limit" "$partita" profile "$@" --no-comm ${PROFILE_OPTIONS:-} \
        --stage-sets "${STAGE_SETS:-1}" --processes "${PROCESSES:-1}" \
        -o "$dir/$name.json" >"$dir/$name.log" 2>&1
    echo "$name: rc $? ($SECONDS s) $(tail -n 1 "$dir/$name.log")"
}
for part in $parts; do
    echo "== $part ($SECONDS s)"
    mkdir -p "$work/$part"
    case $part in
    suite)
        ITERS=${ITERS:-4} BUDGET=${SUITE_BUDGET:-260} \
            PLAN_TIMEOUT=${PLAN_TIMEOUT:-50} HOST_FALLBACK=1 \
            timeout -k 5 $(( ${SUITE_BUDGET:-260} + 30 )) \
            "$here/run_one_gpu.sh" "$build" "$work/suite"
        echo "rc $?"
        rm -f "$work/suite/corpus"* ;;
    whole)
        # shellcheck disable=SC2086 # WHOLE_OPTIONS: words on purpose
        profile H200 "$work/whole" "${WHOLE_S:-300}" --model "$suite_models" \
            --tp 1,2,4 --mbs 1,2,4,8 ${WHOLE_OPTIONS---timing exec --layer-stack 16 --rounds 15 --round-ms 10} ;;
    beside)
        PROFILE_S=${BESIDE_S:-45} timeout -k 5 "${BESIDE_ALL_S:-300}" \
            "$here/profile_beside.sh" "$build" "$work/beside"
        echo "rc $?" ;;
    alone)
        for sms in 40 16; do
            profile "H200-${sms}SM-xl" "$work/alone" 30 --model "$M/gpt2-xl.json" \
                --sm-limit $sms --tp 1 --mbs 1,2,4 --gpu-name H200-${sms}SM
        done ;;
    slices)
        for sms in 40 16; do
            profile "H200-${sms}SM" "$work/slices" "${PROFILE_S:-60}" \
                --model "$suite_models" --sm-limit $sms --tp 1,2,4 --mbs 1,2,4,8
        done ;;
    repeat)
        timeout -k 5 "${REPEAT_S:-100}" "$root/tests/executor/gpu/profile_repeat.sh" \
            "$build" "$work/repeat"
        echo "rc $?" ;;
    llama-beside)
        MISSING_ONLY=1 PLANS="$here/plans-llama" PROFILE_S=${BESIDE_S:-90} \
            timeout -k 5 "${BESIDE_ALL_S:-300}" \
            "$here/profile_beside.sh" "$build" "$work/llama-beside"
        echo "rc $?" ;;
    llama-suite)
        PLANS="$here/plans-llama" ITERS=${ITERS:-4} \
            BUDGET=${SUITE_BUDGET:-260} PLAN_TIMEOUT=${PLAN_TIMEOUT:-60} \
            HOST_FALLBACK=1 timeout -k 5 $(( ${SUITE_BUDGET:-260} + 30 )) \
            "$here/run_one_gpu.sh" "$build" "$work/llama-suite"
        echo "rc $?"
        rm -f "$work/llama-suite/corpus"* ;;
    *) echo "unknown part $part" ;;
    esac
    pack "$part"
done
echo "== done ($SECONDS s)"
