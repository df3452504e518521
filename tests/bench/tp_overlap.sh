#!/usr/bin/env bash
# bench/parallel/tp_overlap.sh without a GPU (DRY_RUN=1): the one-GPU
# rows one on each GPU, every tp row with the in-line sums and each
# variant's settings, MODELS and VARIANTS taken as asked.
# Usage: tp_overlap.sh
set -u
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin tp-overlap
script="$root/bench/parallel/tp_overlap.sh"
mkdir build
DRY_RUN=1 run 0 bash "$script" build logs
expect_in out.txt "run one-gpu-13b: ITERS=5 ROWS=one-gpu-13b CUDA_VISIBLE_DEVICES=0"
expect_in out.txt "run one-gpu-26h: ITERS=6 ROWS=one-gpu-26h CUDA_VISIBLE_DEVICES=1"
expect_in out.txt "run 13b-inline: ITERS=5 ROWS=tp2-13b"
expect_in out.txt "run 13b-lean8: ITERS=5 ROWS=tp2-13b PARTITA_CUDA_TP_OVERLAP=1 PARTITA_CUDA_TP_SM_MARGIN=8 PARTITA_NCCL_LEAN_CTAS=8"
expect_in out.txt "run 26h-margin8: ITERS=6 ROWS=tp2 PARTITA_CUDA_TP_OVERLAP=1 PARTITA_CUDA_TP_SM_MARGIN=8"
expect_in out.txt "run 13b-halves8: ITERS=5 ROWS=tp2-13b PARTITA_CUDA_TP_OVERLAP=2 PARTITA_CUDA_TP_SM_MARGIN=8"
expect_in out.txt "run 26h-halves3: ITERS=6 ROWS=tp2 PARTITA_CUDA_TP_OVERLAP=3 PARTITA_CUDA_TP_SM_MARGIN=8"
[ "$(grep -c '^run ' out.txt)" = 12 ] || fail "expected 12 runs: $(cat out.txt)"
DRY_RUN=1 MODELS=13b ITERS=3 VARIANTS="m4=PARTITA_CUDA_TP_OVERLAP=1,PARTITA_CUDA_TP_SM_MARGIN=4" \
    run 0 bash "$script" build logs
expect_in out.txt "run one-gpu-13b: ITERS=3 ROWS=one-gpu-13b CUDA_VISIBLE_DEVICES=0"
expect_in out.txt "run 13b-m4: ITERS=3 ROWS=tp2-13b PARTITA_CUDA_TP_OVERLAP=1 PARTITA_CUDA_TP_SM_MARGIN=4"
[ "$(grep -c '^run ' out.txt)" = 3 ] || fail "expected 3 runs: $(cat out.txt)"
echo "PASS [$case_name]"
