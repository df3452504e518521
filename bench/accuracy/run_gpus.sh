#!/usr/bin/env bash
# Issue 8's runs on a 4- or 8-GPU machine (nvidia-h200-x4, -x8): every
# plan of PLANS_DIR (bench/accuracy/plans-x4 or plans-x8) with `partita
# exec --backend cuda`, the one-GPU references (ref-*) first, then each
# multi-GPU plan's losses against the reference PLANS_DIR/refs.txt names
# for it ("plan reference" per line), iteration by iteration: within 2e-2
# relative (bf16 products; the layouts differ only in the order of fp32
# sums), the first iteration within 2e-3.
# Usage: bench/accuracy/run_gpus.sh BUILD_DIR RUNS_DIR PLANS_DIR
# Environment: ITERS iterations per run (8).
set -u
build=${1:?usage: run_gpus.sh BUILD_DIR RUNS_DIR PLANS_DIR}
runs=${2:?usage: run_gpus.sh BUILD_DIR RUNS_DIR PLANS_DIR}
plans=${3:?usage: run_gpus.sh BUILD_DIR RUNS_DIR PLANS_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$runs"
data="$runs/corpus"
[ -f "$data.idx" ] || "$partita" prep "$root/data/corpus.txt" -o "$data" >/dev/null
for plan in "$plans"/ref-*.json "$plans"/x*.json; do
    name=$(basename "$plan" .json)
    if "$partita" exec "$plan" --data "$data" --backend cuda --iters "${ITERS:-8}" \
        --log-interval 100 -o "$runs/$name.run.json" >"$runs/$name.log" 2>&1; then
        echo "OK   $name $(grep -o 'median step time [^,]*' "$runs/$name.log")"
    else
        echo "FAIL $name: $(tail -n 3 "$runs/$name.log" | tr '\n' ' ')"
    fi
done
python3 - "$runs" "$plans/refs.txt" <<'PY'
import json, os, sys
runs, refs_file = sys.argv[1], sys.argv[2]
refs = dict(line.split() for line in open(refs_file) if line.strip())
def losses(name):
    path = f"{runs}/{name}.run.json"
    if not os.path.exists(path):
        return None
    return [i["loss"] for i in json.load(open(path))["iterations"]]
for plan, ref in refs.items():
    got, want = losses(plan), losses(ref)
    if got is None or want is None:
        print(f"FAIL losses {plan}: a run is missing"); continue
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    first = abs(got[0] - want[0]) / abs(want[0])
    ok = worst <= 2e-2 and first <= 2e-3
    print(f"{'PASS' if ok else 'FAIL'} losses {plan} vs {ref}: first "
          f"{first:.2e}, largest {worst:.2e} over {len(got)} iterations")
PY
