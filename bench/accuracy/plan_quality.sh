#!/usr/bin/env bash
# Plan quality measured (issue 38, item 5): on an emulated mixed machine
# (default clusters/h200x4-hetero.json: two whole H200s and two limited to
# 40 SMs), `partita plan`'s best plan against the plans a user would
# otherwise run, each estimated and run with `partita exec`:
#   best       the planner's choice (every lever it has);
#   top2 top3  its next two alternatives (plan.json "alternatives");
#   plain      the best plan without interleaving (`--no-interleave`:
#              plain 1F1B, as FASOP and Metis plan);
#   even       plain's degrees and placement with Megatron-LM's default
#              even partition of the layers;
#   dp         plain data parallelism (`--tp 1 --pp 1`: every GPU a
#              replica; the planner still picks its micro-batch).
# Prints one row a plan (estimated and measured step, their ratio, the
# speed-up over dp estimated and measured) and two verdicts: the best plan
# is measured fastest of them all, and its measured speed-up over dp is
# at least 95 % of its estimated one. Plans that turn out identical are
# run once each all the same (the rows show it).
#
# Usage: bench/accuracy/plan_quality.sh BUILD_DIR OUT_DIR PROFILES_DIR
#   PROFILES_DIR  profiles for the cluster's GPU types (profiles/: H200
#                 and H200-40SM are bundled)
# Environment: CLUSTER (h200x4-hetero; a bundled name or a file), MODEL
# (gpt2-xl-26h), GBS (64), ITERS (8: the first is warm-up, the median of
# the rest is the step), BACKEND (cuda; cpu runs the same plans on
# threads, as tests/bench/plan_quality.sh does without a GPU), PLAN_ARGS
# (more `partita plan` options for every plan, e.g. "--max-mbs 8").
# Exit status 0 when every plan ran (the verdicts are the table's), 1
# when one failed or could not be planned.
set -u
build=${1:?usage: plan_quality.sh BUILD_DIR OUT_DIR PROFILES_DIR}
out=${2:?usage: plan_quality.sh BUILD_DIR OUT_DIR PROFILES_DIR}
profiles=${3:?usage: plan_quality.sh BUILD_DIR OUT_DIR PROFILES_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
cluster=${CLUSTER:-h200x4-hetero}
model=${MODEL:-gpt2-xl-26h}
gbs=${GBS:-64}
iters=${ITERS:-8}
backend=${BACKEND:-cuda}
read -r -a extra <<<"${PLAN_ARGS:-}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$out"
data="$out/corpus"
[ -f "$data.idx" ] || "$partita" prep "$root/data/corpus.txt" -o "$data" >/dev/null ||
    { echo "FAIL prep: the corpus"; exit 1; }
[ -f "$root/clusters/$cluster.json" ] && cluster="$root/clusters/$cluster.json"
common=(--model "$model" --cluster "$cluster" --gbs "$gbs" --profiles "$profiles"
        --quiet "${extra[@]}")

# plan NAME OPTIONS...: q-NAME.json, or a failure naming the plan
plan() {
    local name=$1; shift
    "$partita" plan "${common[@]}" "$@" -o "$out/q-$name.json" \
        >"$out/q-$name.plan.log" 2>&1 && return 0
    echo "FAIL plan $name: $(tail -n 2 "$out/q-$name.plan.log" | tr '\n' ' ')"
    return 1
}
echo "== plans: $model on $(basename "$cluster" .json), gbs $gbs"
plan best && plan plain --no-interleave && plan dp --tp 1 --pp 1 || exit 1
# the alternatives and the even partition as plans of their own
python3 - "$out" <<'PY' || { echo "FAIL plan_quality.sh: derived plans"; exit 1; }
import json, sys
out = sys.argv[1]
best = json.load(open(f"{out}/q-best.json"))
plain = json.load(open(f"{out}/q-plain.json"))
PLAN_KEYS = ("estimate", "alternatives", "events", "stages")

def bare(plan):
    return {k: v for k, v in plan.items() if k not in PLAN_KEYS}

for rank, alt in enumerate(best.get("alternatives", [])[:2], start=2):
    plan = bare(best)
    plan.update({k: v for k, v in alt.items() if k in plan})
    if "stages" in alt:  # a plan of stages of their own degrees
        plan["stages"] = alt["stages"]
    json.dump(plan, open(f"{out}/q-top{rank}.json", "w"), indent=1)
layers = sum(int(n) for n in str(plain["partition"]).split("-"))
pp = plain["pp"]
even = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
plan = bare(plain)
plan["partition"] = "-".join(map(str, even))
plan["virtual_stages"] = 1
json.dump(plan, open(f"{out}/q-even.json", "w"), indent=1)
PY

# the estimate and the measured step of each plan
names=(best top2 top3 plain even dp)
status=0
for name in "${names[@]}"; do
    planfile="$out/q-$name.json"
    [ -f "$planfile" ] || { echo "skip $name: no such alternative"; continue; }
    "$partita" estimate "$planfile" --profiles "$profiles" --json \
        >"$out/q-$name.estimate.json" 2>"$out/q-$name.estimate.log" ||
        { echo "FAIL estimate $name: $(tail -n 1 "$out/q-$name.estimate.log")"; status=1; continue; }
    echo "== $name: waiting on partita exec (at most 300 s, log $out/q-$name.log)"
    if timeout 300 "$partita" exec "$planfile" --data "$data" --backend "$backend" \
        --iters "$iters" --log-interval "$iters" -o "$out/q-$name.run.json" \
        >"$out/q-$name.log" 2>&1; then
        echo "OK   $name $(grep -o 'median step time [^,]*' "$out/q-$name.log")"
    else
        echo "FAIL $name: $(tail -n 2 "$out/q-$name.log" | tr '\n' ' ')"
        status=1
    fi
done

python3 - "$out" "${names[@]}" <<'PY' || status=1
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for name in names:
    est, run = f"{out}/q-{name}.estimate.json", f"{out}/q-{name}.run.json"
    if not (os.path.exists(est) and os.path.exists(run)):
        continue
    plan = json.load(open(est))
    measured = json.load(open(run))["step_time_s"]
    rows[name] = (plan, plan["estimate"]["step_time_s"], measured)
if "best" not in rows or "dp" not in rows:
    sys.exit("FAIL plan_quality.sh: the best plan or plain dp did not run")
dp_est, dp_meas = rows["dp"][1], rows["dp"][2]
print("| plan | tp x dp x pp, mbs | levers | partition | step est. (ms) | "
      "step meas. (ms) | meas. / est. | speed-up over dp est. | meas. |")
print("|---|---|---|---|---:|---:|---:|---:|---:|")
for name, (plan, est, meas) in rows.items():
    zero = plan.get("zero_stage", 1 if plan.get("distributed_optimizer") else 0)
    levers = "+".join(x for x in (
        f"zero{zero}" if zero else "",
        "sp" if plan.get("sequence_parallel") else "",
        f"v{plan['virtual_stages']}" if plan.get("virtual_stages", 1) > 1 else "",
        f"recompute {plan['recompute']}" if plan.get("recompute", "none") != "none"
        else "") if x) or "-"
    print(f"| {name} | {plan['tp']} x {plan['dp']} x {plan['pp']}, {plan['mbs']} | "
          f"{levers} | {plan['partition']} | {est * 1e3:.1f} | {meas * 1e3:.1f} | "
          f"{meas / est:.3f} | {dp_est / est:.2f}x | {dp_meas / meas:.2f}x |")
best_meas = rows["best"][2]
others = {n: r[2] for n, r in rows.items() if n != "best"}
fastest = all(best_meas <= m for m in others.values())
runner_up = min(others, key=others.get)
share = (dp_meas / best_meas) / (dp_est / rows["best"][1])
print(f"best measured fastest: {'PASS' if fastest else 'FAIL'} "
      f"({best_meas * 1e3:.1f} ms; the fastest other, {runner_up}: "
      f"{others[runner_up] * 1e3:.1f} ms)")
print(f"measured speed-up over dp / estimated: {share:.3f} "
      f"({'PASS' if share >= 0.95 else 'FAIL'}, >= 0.95)")
PY
exit $status
