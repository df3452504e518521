#!/usr/bin/env bash
# Issue 17's measurements in one call of the GPU machine (one H200, under
# 10 minutes): the profiler's repeatability (tests/executor/gpu/
# profile_repeat.sh: GPT-2 124M profiled in three processes), the
# one-GPU accuracy suite (run_one_gpu.sh: whole GPU, and slices over the
# device exchange), then profiles of the whole GPU and of its 40- and
# 16-SM slices with the back-to-back profiler, for the suite's shapes
# (no NCCL curves: the slices' links are the cluster's, emulated). Each
# part has its own time limit; what it wrote is packed into OUT_DIR
# (repeat.tgz, runs.tgz, profiles.tgz) beside the log.
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
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "== profile_repeat.sh ($SECONDS s)"
timeout -k 5 "${REPEAT_S:-100}" "$root/tests/executor/gpu/profile_repeat.sh" \
    "$build" "$work/repeat"
echo "rc $?"
echo "== run_one_gpu.sh ($SECONDS s)"
ITERS=${ITERS:-4} BUDGET=${SUITE_BUDGET:-260} PLAN_TIMEOUT=${PLAN_TIMEOUT:-50} \
    HOST_FALLBACK=1 timeout -k 5 $(( ${SUITE_BUDGET:-260} + 30 )) \
    "$here/run_one_gpu.sh" "$build" "$work/runs"
echo "rc $?"
mkdir -p "$work/profiles"
models=$root/models/gpt2-xl.json,$root/models/gpt2-xl-26h.json,$root/models/gpt2-350m.json,$root/models/gpt2-774m.json
for sms in 40 16 all; do
    echo "== profile, SMs: $sms ($SECONDS s)"
    if [ "$sms" = all ]; then
        limit=() name=H200
    else
        limit=(--sm-limit "$sms") name=H200-${sms}SM
    fi
    timeout -k 5 "${PROFILE_S:-55}" "$partita" profile --model "$models" \
        ${limit[@]+"${limit[@]}"} --tp 1,2,4 --mbs 1,2,4,8 --no-comm \
        -o "$work/profiles/$name.json" >"$work/profiles/$name.log" 2>&1
    echo "rc $? $(tail -n 1 "$work/profiles/$name.log")"
done
rm -f "$work/runs/corpus"*
(cd "$work" && tar czf "$out/repeat.tgz" repeat; tar czf "$out/runs.tgz" runs;
 tar czf "$out/profiles.tgz" profiles)
echo "== done ($SECONDS s)"
