#!/usr/bin/env bash
# Every GPU test script on a machine of 2 or 4 GPUs (issue 38: nothing
# hangs, nothing arrives wrong), one row per script, each under a hard
# time limit, with NCCL_NVLS_ENABLE=0; one PASS / FAIL line per row and
# a summary, the last line "run_multi_gpu.sh: PASS" or "...: FAIL". Every
# script's own rows are limited too (tests/executor/gpu/gpu_rows.sh), so
# a hang is a FAIL that names its row, never a call that runs out.
#
# The scripts (SCRIPTS picks some, in this order):
#   nccl      test_nccl_parallel: crossing sends, collectives, a silent
#             peer, green contexts, a failing rank, 1F1B / GPipe /
#             interleaved over NCCL (pp 4 with four GPUs)      ~2 min
#   parallel  run_parallel.sh SKIP_BENCH=1: partita exec of every
#             schedule and layout of two GPUs against one GPU's losses,
#             resume, heterogeneous                            ~3 min
#   parallel4 (GPUS 4 only) run_parallel.sh GPUS=4 with the rows of four
#             GPUs: pp 4 1F1B and GPipe, tp 2 x pp 2, dp 2 x pp 2, tp 4,
#             dp 4 against one GPU's losses                    ~3 min
#   asym4     (GPUS 4 only) run_parallel.sh GPUS=4 with the plans whose
#             stages run their own tp and dp (issue 36): asym-merge,
#             asym-merge-zero1, asym-split, asym-pp3 against one GPU's
#             losses                                           ~2 min
#   asym1     run_parallel.sh SHARED=1 SHARED_COMM=auto with the same
#             plans on four slices of GPU 0 (the device exchange)  ~2 min
#   all       run_all.sh SKIP_BENCH=1: the one-GPU test programs ~3 min
#   mpi       run_mpi.sh BUILD system: one process per GPU, a killed
#             rank ending the job naming it                    ~3 min
#   devcomm   run_devcomm.sh SKIP_BENCH=1: the device exchange on slices
#             of GPU 0, its checks (its benchmark, a measurement of
#             nearly 9 minutes, takes a call of its own)       ~4 min
# A device call lasts at most 10 minutes: run them in three calls
# (SCRIPTS="nccl parallel", SCRIPTS="parallel4 mpi" or "mpi" on two GPUs,
# SCRIPTS="all devcomm"); BUDGET_S (570) stops starting scripts, and
# shortens the last one's limit, so a call ends by itself.
#
# Build for it on the build machine (sm_90, NCCL, MPI, cuDNN; the GPU
# machine has CUDA 13, NCCL, Open MPI and cuDNN but no GLPK):
#   meson setup .devbuild -Dbuildtype=release -Dcuda=enabled \
#       -Dnccl=enabled -Dmpi=enabled -Dtests=enabled
#   ninja -C .devbuild
#   mkdir -p .devbuild/lib && cp -L $(ldd .devbuild/cli/partita |
#       awk '/glpk|colamd|amd|ltdl|suitesparse/ {print $3}') .devbuild/lib/
# and carry .devbuild with the working tree (the scripts put BUILD/lib on
# LD_LIBRARY_PATH). Then, on the GPU machine, from the repository root:
#   SCRIPTS="nccl parallel" tests/executor/gpu/run_multi_gpu.sh .devbuild 4 LOGS
#   SCRIPTS="parallel4 mpi" tests/executor/gpu/run_multi_gpu.sh .devbuild 4 LOGS
#   SCRIPTS="all devcomm"   tests/executor/gpu/run_multi_gpu.sh .devbuild 4 LOGS
# (on nvidia-h200-x2 the same with 2, and SCRIPTS=mpi in the second).
#
# Usage: tests/executor/gpu/run_multi_gpu.sh BUILD_DIR GPUS [LOG_DIR]
#   GPUS  2 or 4: the GPUs the rows use (the machine must have them)
# Environment: SCRIPTS (nccl parallel parallel4 all mpi devcomm, without
# parallel4 on two GPUs; asym4 and asym1 only when named); BUDGET_S (570);
# ITERS (20) for run_parallel.sh's loss rows. Exit status 0 when every
# row passed, else 1.
set -u
usage="usage: run_multi_gpu.sh BUILD_DIR GPUS [LOG_DIR]"
build=$(cd "${1:?$usage}" && pwd)
want=${2:?$usage}
logs=${3:-$build/gpu-multi-logs}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
export NCCL_NVLS_ENABLE=0
export PARTITA_SOURCE
PARTITA_SOURCE=$(cd "$here/../../.." && pwd)
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# shellcheck source=tests/executor/gpu/gpu_rows.sh
source "$here/gpu_rows.sh"
SECONDS=0

if [ "$want" != 2 ] && [ "$want" != 4 ]; then
    echo "FAIL run_multi_gpu.sh: GPUS must be 2 or 4, got $want"
    exit 1
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -lt "$want" ]; then
    echo "FAIL run_multi_gpu.sh: asked for $want GPUs, $gpus visible"
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "# $want of $gpus GPUs; NCCL_NVLS_ENABLE=0; logs in $logs"

budget=${BUDGET_S:-570}
# script NAME LIMIT_S COMMAND...: a row limited to LIMIT_S, or to what is
# left of the budget; not started with less than a minute left
script() {
    local name=$1 limit=$2; shift 2
    local left=$((budget - SECONDS))
    if [ "$left" -lt 60 ]; then
        gpu_note "$name" FAIL "not run: $SECONDS s of BUDGET_S $budget spent (run it in another call)"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    gpu_row "$name" "$limit" "$@"
    # a script's own summary, for the record
    sed -n '/^Summary of /,$p' "$logs/$name.log"
}

gpu_tests="$build/tests/executor/gpu"
default_scripts="nccl parallel all mpi devcomm"
[ "$want" = 4 ] && default_scripts="nccl parallel parallel4 all mpi devcomm"
four_rows="pp4 pp4-gpipe tp2-pp2 dp2-pp2 tp4 dp4"
asym_rows="asym-merge asym-merge-zero1 asym-split asym-pp3"
for name in ${SCRIPTS:-$default_scripts}; do
    case $name in
    nccl)
        script nccl 300 "$gpu_tests/test_nccl_parallel" ;;
    parallel)
        script parallel 560 env GPUS=2 SKIP_BENCH=1 SKIP_NCCL_TEST=1 \
            ITERS="${ITERS:-20}" "$here/run_parallel.sh" "$build" \
            "$logs/parallel" ;;
    parallel4|asym4)
        if [ "$want" != 4 ]; then
            gpu_note "$name" FAIL "needs GPUS 4"
            continue
        fi
        rows=$four_rows
        [ "$name" = asym4 ] && rows=$asym_rows
        script "$name" 560 env GPUS=4 SKIP_BENCH=1 SKIP_NCCL_TEST=1 \
            SKIP_RESUME=1 SKIP_HETERO=1 LOSS_ROWS="$rows" \
            ITERS="${ITERS:-20}" "$here/run_parallel.sh" "$build" \
            "$logs/$name" ;;
    asym1)
        script asym1 560 env SHARED=1 SHARED_COMM=auto SKIP_BENCH=1 \
            SKIP_RESUME=1 SKIP_HETERO=1 LOSS_ROWS="$asym_rows" \
            ITERS="${ITERS:-20}" "$here/run_parallel.sh" "$build" \
            "$logs/asym1" ;;
    all)
        script all 560 env SKIP_BENCH=1 "$here/run_all.sh" "$build" \
            "$logs/all" ;;
    mpi)
        script mpi 560 "$here/run_mpi.sh" "$build" system "$logs/mpi" ;;
    devcomm)
        script devcomm 560 env SKIP_BENCH=1 "$here/run_devcomm.sh" \
            "$build" "$logs/devcomm" ;;
    *)
        gpu_note "$name" FAIL "no such script (nccl parallel parallel4 asym4 asym1 all mpi devcomm)" ;;
    esac
done

gpu_summary run_multi_gpu.sh
