#!/usr/bin/env bash
# tests/executor/gpu/tp_after_step.sh without a GPU: the rows it would
# run (DRY_RUN=1: tp 1, tp 2 in line, =1, =3, host comm, unfused, and
# the cpu row of the short model), its plans estimate, and its verdicts
# (tp_after_step.py) on stand-in runs: a tp 2 row 3e-4 off tp 1 fails, one
# 2e-5 off passes, a missing run fails, the cpu row is a note.
# Usage: tp_after_step_dry.sh PARTITA
set -u
partita=${1:?usage: tp_after_step_dry.sh PARTITA}
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin tp-after-step
build=$(cd "$(dirname "$partita")/.." && pwd)
DRY_RUN=1 run 0 bash "$root/tests/executor/gpu/tp_after_step.sh" "$build" logs
[ "$(grep -c '^row ' out.txt)" = 25 ] || fail "expected 25 rows: $(cat out.txt)"
expect_in out.txt "row gpt-wide-tp2-o3: env PARTITA_CUDA_TP_OVERLAP=3 "
expect_in out.txt "row llama-wide-tp2-host: env .* --gpu-comm host "
expect_in out.txt "row gpt-wide-short-cpu: env .* --backend cpu "
for plan in logs/*-tp[12].json; do
    run 0 "$partita" estimate "$plan"
done
python3 - logs <<'PY' || fail "could not write the stand-in runs"
import json, sys
def write(name, losses):
    iterations = [{"iteration": i + 1, "loss": l} for i, l in enumerate(losses)]
    json.dump({"iterations": iterations}, open(f"{sys.argv[1]}/{name}.run.json", "w"))
write("m-tp1", [5.0, 9.0, 6.0])
write("m-tp2-inline", [5.0, 9.0027, 6.0])
write("m-tp2-o1", [5.0, 9.0027, 6.0])
write("m-tp2-o3", [5.0, 9.00018, 6.00012])
write("m-tp2-host", [5.0, 9.0, 6.0])
write("m-cpu", [5.0, 9.01, 6.0])
PY
run 0 python3 "$root/tests/executor/gpu/tp_after_step.py" logs m
expect_in out.txt "^FAIL m-tp2-inline-after-step iterations 2, 3: 9.00270, 6.00000 against tp 1's 9.00000, 6.00000 (3.0e-04 relative, at most 1.5e-04)"
expect_in out.txt "^PASS m-tp2-o3-after-step "
expect_in out.txt "^PASS m-tp2-host-after-step "
expect_in out.txt "^FAIL m-tp2-fuse0-after-step no losses of iterations 2 and 3"
expect_in out.txt "^NOTE m-cpu-after-step "
echo "PASS [$case_name]"
