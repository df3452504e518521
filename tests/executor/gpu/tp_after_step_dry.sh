#!/usr/bin/env bash
# tests/executor/gpu/tp_after_step.sh without a GPU: the rows it would
# run (DRY_RUN=1: per model and seed, the cpu's fp32 step saved at tp 1
# and tp 2, iteration 2 from it on the cpu and on seven cuda paths), its
# plans estimate, and its verdicts (tp_after_step.py) on stand-in runs: a
# cuda row 2e-3 off the cpu's iteration 2 fails, one 1e-4 off passes, a
# missing run fails, the two cpu runs' distance is a note.
# Usage: tp_after_step_dry.sh PARTITA
set -u
partita=${1:?usage: tp_after_step_dry.sh PARTITA}
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin tp-after-step
build=$(cd "$(dirname "$partita")/.." && pwd)
DRY_RUN=1 run 0 bash "$root/tests/executor/gpu/tp_after_step.sh" "$build" logs
[ "$(grep -c '^row ' out.txt)" = 66 ] || fail "expected 66 rows: $(cat out.txt)"
expect_in out.txt "row gpt-wide-short-s1-save1: env .* --backend cpu .* --iters 1 --seed 1 --save "
expect_in out.txt "row gpt-wide-short-s2-tp2-o3: env PARTITA_CUDA_TP_OVERLAP=3 .* --load .*/gpt-wide-short-s2-ckpt2 "
expect_in out.txt "row llama-wide-short-s3-tp2-host: env .* --load .*-ckpt2 --gpu-comm host "
for plan in logs/*-tp[12].json; do
    run 0 "$partita" estimate "$plan"
done
python3 - logs <<'PY' || fail "could not write the stand-in runs"
import json, sys
def write(name, loss2):
    iterations = [{"iteration": 2, "loss": loss2}]
    json.dump({"iterations": iterations}, open(f"{sys.argv[1]}/{name}.run.json", "w"))
write("m-s1-cpu1", 6.0)
write("m-s1-cpu2", 6.0006)
write("m-s1-tp1", 6.012)
write("m-s1-tp1-epilogue", 6.0006)
write("m-s1-tp2-inline", 6.0012)
write("m-s1-tp2-o1", 5.988)
write("m-s1-tp2-o3", 6.0006)
write("m-s1-tp2-host", 6.0006)
PY
run 0 python3 "$root/tests/executor/gpu/tp_after_step.py" logs 1 m
expect_in out.txt "^NOTE m-s1-cpu iteration 2: tp 1 6.000000, tp 2 6.000600 (1.0e-04 relative)"
expect_in out.txt "^FAIL m-s1-tp1-forward iteration 2: 6.012000 against the cpu's 6.000000 (2.0e-03 relative, at most 1e-03)"
expect_in out.txt "^PASS m-s1-tp1-epilogue-forward "
expect_in out.txt "^PASS m-s1-tp2-inline-forward iteration 2: 6.001200 against the cpu's 6.000600 (1.0e-04 relative"
expect_in out.txt "^FAIL m-s1-tp2-o1-forward "
expect_in out.txt "^FAIL m-s1-tp2-fuse0-forward no iteration-2 loss"
echo "PASS [$case_name]"
