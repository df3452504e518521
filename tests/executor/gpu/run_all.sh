#!/usr/bin/env bash
# Every GPU check of the cuda backend in one call, for the GPU machine:
# the nine test programs of one GPU, a small `partita profile`
# (profile_smoke.sh), then the benchmark against PyTorch
# (bench/exec_vs_torch/run.sh). Logs go to LOG_DIR; a summary comes last.
#
# Usage: tests/executor/gpu/run_all.sh BUILD_DIR [LOG_DIR]
#   BUILD_DIR  a meson build made with -Dcuda=enabled (binaries built on
#              the build machine run unchanged on the GPU machine)
# Environment: SKIP_BENCH=1 runs the tests only; STAGE_ARGS overrides the
# arguments of test_cuda_stage ("MODEL.json SEQ MBS"); the benchmark's own
# variables (CONFIGS, WARMUP, STEPS, MODES) pass through.
# TEST_LIMIT_S (300) and BENCH_LIMIT_S (900): a row still running after
# that long is killed and fails (tests/executor/gpu/gpu_rows.sh); each
# row says what it waits on before it starts, the last line is
# "run_all.sh: PASS" or "run_all.sh: FAIL".
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

# shellcheck source=tests/executor/gpu/gpu_rows.sh
source "$here/gpu_rows.sh"
# each test program's row is killed after TEST_LIMIT_S (300) seconds
limit=${TEST_LIMIT_S:-300}
run() { # NAME COMMAND...
    local name=$1; shift
    gpu_row "$name" "$limit" "$@"
}

gpu="$build/tests/executor/gpu"
run test_cuda_ops "$gpu/test_cuda_ops"
run test_cuda_attention "$gpu/test_cuda_attention"
run test_cuda_llama_ops "$gpu/test_cuda_llama_ops"
run test_cuda_llama_stage "$gpu/test_cuda_llama_stage"
# shellcheck disable=SC2086
run test_cuda_training "$gpu/test_cuda_training"
# shellcheck disable=SC2086
run test_cuda_stage "$gpu/test_cuda_stage" ${STAGE_ARGS:-}
run test_cuda_tensor_parallel "$gpu/test_cuda_tensor_parallel"
run test_cuda_zero "$gpu/test_cuda_zero"
run test_staged_comm "$gpu/test_staged_comm"
run profile_smoke "$here/profile_smoke.sh" "$build" "$logs/profile_smoke"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    gpu_row benchmark "${BENCH_LIMIT_S:-900}" \
        "$root/bench/exec_vs_torch/run.sh" "$build" "$logs/bench"
fi

gpu_summary run_all.sh
