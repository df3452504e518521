#!/usr/bin/env bash
# Every GPU check of the cuda backend in one call, for the GPU machine:
# the five test programs, then the benchmark against PyTorch
# (bench/exec_vs_torch/run.sh). Logs go to LOG_DIR; a summary comes last.
#
# Usage: tests/executor/gpu/run_all.sh BUILD_DIR [LOG_DIR]
#   BUILD_DIR  a meson build made with -Dcuda=enabled (binaries built on
#              the build machine run unchanged on the GPU machine)
# Environment: SKIP_BENCH=1 runs the tests only; STAGE_ARGS overrides the
# arguments of test_cuda_stage ("MODEL.json SEQ MBS"); the benchmark's own
# variables (CONFIGS, WARMUP, STEPS, MODES) pass through.
# Exit status: 0 when every test passed (skips count as passes), else 1.
set -u
build=$(cd "${1:?usage: run_all.sh BUILD_DIR [LOG_DIR]}" && pwd)
logs=${2:-$build/gpu-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$logs"
export PARTITA_SOURCE="$root"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    >"$logs/nvidia-smi.txt" 2>&1 && cat "$logs/nvidia-smi.txt"

declare -a summary
status=0
run() {
    local name=$1; shift
    local log="$logs/$name.log"
    local start=$SECONDS
    echo "== $name: $*"
    "$@" >"$log" 2>&1
    local rc=$?
    grep -E '^(PASS|FAIL|SKIP|NOTE|ALL|SOME|#)' "$log" | grep -v '^PASS' | tail -60
    local passes fails
    passes=$(grep -c '^PASS' "$log")
    fails=$(grep -c '^FAIL' "$log")
    local verdict=PASS
    if [ $rc -eq 77 ]; then verdict=SKIP
    elif [ $rc -ne 0 ]; then verdict=FAIL; status=1; tail -5 "$log"; fi
    summary+=("$(printf '%-22s %-4s  %4d PASS lines, %3d FAIL lines, exit %3d, %4d s  (%s)' \
        "$name" "$verdict" "$passes" "$fails" "$rc" $((SECONDS - start)) "$log")")
}

gpu="$build/tests/executor/gpu"
run test_cuda_ops "$gpu/test_cuda_ops"
run test_cuda_attention "$gpu/test_cuda_attention"
# shellcheck disable=SC2086
run test_cuda_training "$gpu/test_cuda_training"
# shellcheck disable=SC2086
run test_cuda_stage "$gpu/test_cuda_stage" ${STAGE_ARGS:-}
run test_cuda_tensor_parallel "$gpu/test_cuda_tensor_parallel"
run test_cuda_zero "$gpu/test_cuda_zero"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    echo "== benchmark (bench/exec_vs_torch/run.sh)"
    "$root/bench/exec_vs_torch/run.sh" "$build" "$logs/bench" 2>&1 \
        | tee "$logs/bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo
echo "Summary (logs in $logs):"
for line in "${summary[@]}"; do echo "  $line"; done
[ $status -eq 0 ] && echo "ALL GPU TESTS PASSED" || echo "SOME GPU CHECKS FAILED"
exit $status
