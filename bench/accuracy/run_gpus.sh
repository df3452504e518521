#!/usr/bin/env bash
# Issue 8's runs on a 4- or 8-GPU machine (nvidia-h200-x4, -x8): every
# plan of PLANS_DIR (bench/accuracy/plans-x4 or plans-x8) with `partita
# exec --backend cuda`, the one-GPU references (ref-*) first, then each
# multi-GPU plan's losses against the reference PLANS_DIR/refs.txt names
# for it ("plan reference" per line), iteration by iteration: within 2e-2
# relative (bf16 products; the layouts differ only in the order of fp32
# sums), the first iteration within 2e-3.
# Usage: bench/accuracy/run_gpus.sh BUILD_DIR RUNS_DIR PLANS_DIR
# Environment: ITERS iterations per run (8). SHARED=1 runs every plan on
# ONE GPU instead (what a one-GPU machine allows): each plan's cluster is
# rewritten so that all its ranks sit on device 0 in disjoint slices of
# its SMs (an H200 splits into 15 partitions of 8 SMs: whole-GPU ranks
# share what the throttled ranks, 2 partitions each, leave; memory caps
# kept), and
# the ranks talk over the host-staged comm (--gpu-comm host). The losses
# check the layouts on the cuda backend; step times are not those of the
# multi-GPU machine.
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
comm=()
if [ "${SHARED:-0}" = 1 ]; then
    comm=(--gpu-comm host)
    mkdir -p "$runs/shared-plans"
    python3 - "$runs/shared-plans" "$plans"/x*.json <<'PY'
import json, math, os, sys
out = sys.argv[1]
PARTITIONS, SLOW, GRANULE = 15, 2, 8
for path in sys.argv[2:]:
    here = os.path.dirname(os.path.abspath(path))
    plan = json.load(open(path))
    plan["model"] = os.path.normpath(os.path.join(here, plan["model"]))
    cluster = json.load(open(os.path.join(here, plan["cluster"])))
    ranks = plan["tp"] * plan["dp"] * plan["pp"]
    nodes = cluster["nodes"]
    def gpus(n):
        return n["gpus"] * n.get("count", 1)
    slow = sum(gpus(n) for n in nodes
               if any(d.get("sm_limit") for d in n.get("devices", [])))
    fast_share = (PARTITIONS - SLOW * slow) // max(ranks - slow, 1)
    for n in nodes:
        throttled = any(d.get("sm_limit") for d in n.get("devices", []))
        sms = GRANULE * (SLOW if throttled else fast_share)
        caps = [d.get("memory_limit_gib", 0) for d in n.get("devices", [])]
        n["devices"] = [dict({"index": 0, "sm_limit": sms},
                             **({"memory_limit_gib": caps[i]}
                                if i < len(caps) and caps[i] else {}))
                        for i in range(n["gpus"])]
    cluster["name"] += "-on-one-gpu"
    plan["cluster"] = cluster
    json.dump(plan, open(os.path.join(out, os.path.basename(path)), "w"),
              indent=1)
PY
fi
for plan in "$plans"/ref-*.json "$plans"/x*.json; do
    name=$(basename "$plan" .json)
    if [ "${SHARED:-0}" = 1 ] && [ -f "$runs/shared-plans/$name.json" ]; then
        plan="$runs/shared-plans/$name.json"
    fi
    if "$partita" exec "$plan" --data "$data" --backend cuda --iters "${ITERS:-8}" \
        --log-interval 100 ${comm[@]+"${comm[@]}"} \
        -o "$runs/$name.run.json" >"$runs/$name.log" 2>&1; then
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
