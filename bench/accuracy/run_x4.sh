#!/usr/bin/env bash
# Issue 8's runs on a 4-GPU machine (nvidia-h200-x4): every plan of
# bench/accuracy/plans-x4 with `partita exec --backend cuda`, then each
# x4 plan's losses against the one-GPU reference of its model (ref-*),
# iteration by iteration: within 2e-2 relative (bf16 products; the
# layouts differ only in the order of fp32 sums), the first iteration
# within 2e-3.
# Usage: bench/accuracy/run_x4.sh BUILD_DIR RUNS_DIR
set -u
build=${1:?usage: run_x4.sh BUILD_DIR RUNS_DIR}
runs=${2:?usage}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$runs"
data="$runs/corpus"
[ -f "$data.idx" ] || "$partita" prep "$root/data/corpus.txt" -o "$data" >/dev/null
for plan in "$here"/plans-x4/*.json; do
    name=$(basename "$plan" .json)
    if "$partita" exec "$plan" --data "$data" --backend cuda --iters "${ITERS:-8}" \
        --log-interval 100 -o "$runs/$name.run.json" >"$runs/$name.log" 2>&1; then
        echo "OK   $name $(grep -o 'median step time [^,]*' "$runs/$name.log")"
    else
        echo "FAIL $name: $(tail -n 3 "$runs/$name.log" | tr '\n' ' ')"
    fi
done
python3 - "$runs" <<'PY'
import json, os, sys
runs = sys.argv[1]
refs = {"x4-01-xl-pp4-uneven": "ref-xl", "x4-02-xl26h-tp2-pp2": "ref-xl26h",
        "x4-03-xl-dp2-pp2": "ref-xl", "x4-04-xl24h-tp4": "ref-xl24h",
        "x4-05-hetero-xl-pp4": "ref-xl"}
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
