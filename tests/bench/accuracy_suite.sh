#!/usr/bin/env bash
# The one-GPU accuracy suite without a GPU (docs/accuracy.md, "The suite
# on one H200"): bench/accuracy/plans-1gpu holds at least 16 plans and
# every kind issue 17 asks for; every plan of it and of plans/ loads and
# estimates; run_one_gpu.sh (DRY_RUN) reports each plan as skipped with
# its estimate; and a tiny copy of a sliced plan, trained on the cpu
# backend, goes through bench/accuracy, whose memory-term table shows
# the terms of a run that carries them. The Llama plans
# (bench/accuracy/plans-llama, issue 35 item 7) likewise: their kinds,
# their estimates, a tiny copy of the pp 2 plan run and compared; and
# the plans of stages of their own degrees (bench/accuracy/plans-asym,
# issue 36 item 5) beside their symmetric rivals.
# Usage: accuracy_suite.sh PARTITA ACCURACY
set -u
partita=${1:?usage: accuracy_suite.sh PARTITA ACCURACY}
accuracy=${2:?usage: accuracy_suite.sh PARTITA ACCURACY}
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
suite="$root/bench/accuracy/plans-1gpu"
build=$(cd "$(dirname "$partita")/.." && pwd)
case_name=accuracy-suite
source "$root/tests/cli/lib.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1

# 1. the suite's size and kinds
python3 - "$suite" <<'PY' || fail "the suite lacks a kind of plan"
import glob, json, os, sys
plans = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/*.json"))]
def hetero(p):
    here = sys.argv[1]
    c = json.load(open(os.path.join(here, p["cluster"])))
    return len({n["gpu"] for n in c["nodes"]}) > 1
kinds = {"16 plans": len(plans) >= 16,
         "tp 2": any(p["tp"] == 2 for p in plans),
         "tp 4": any(p["tp"] == 4 for p in plans),
         "pp 8": any(p["pp"] == 8 for p in plans),
         "dp": any(p["dp"] > 1 for p in plans),
         "ZeRO-1": any(p.get("distributed_optimizer") for p in plans),
         "ZeRO-2": any(p.get("zero") == 2 for p in plans),
         "ZeRO-3": any(p.get("zero") == 3 for p in plans),
         "offload": any(p.get("offload_optimizer") for p in plans),
         "recompute": any(p.get("recompute") == "full" for p in plans),
         "GPipe": any(p.get("schedule") == "gpipe" for p in plans),
         "interleaved 1F1B": any(p.get("virtual_stages", 1) > 1 for p in plans),
         "sequence parallel": any(p.get("sequence_parallel") for p in plans),
         "heterogeneous": any(hetero(p) for p in plans)}
missing = [k for k, ok in kinds.items() if not ok]
print("missing:", missing) if missing else None
sys.exit(1 if missing else 0)
PY

# 2. every plan estimates (the older suite's too)
for plan in "$root"/bench/accuracy/plans/*.json; do
    run 0 "$partita" estimate "$plan"
    expect_in out.txt "memory per GPU by term"
done

# 3. the script, estimating only
DRY_RUN=1 run 0 "$root/bench/accuracy/run_one_gpu.sh" "$build" runs
plans=$(ls "$suite"/*.json | wc -l)
[ "$(grep -c '^SKIP .*: DRY_RUN=1 (estimated: step time' out.txt)" = "$plans" ] ||
    fail "run_one_gpu.sh did not report every plan as skipped with its estimate"
[ -s runs/suite.log ] || fail "no runs/suite.log"

# 4. a tiny copy of the pp 2 sliced plan on the cpu backend, compared
mkdir -p tiny-plans tiny-runs
python3 - "$suite/06-2x40-xl-pp2-even.json" tiny-plans/tiny-pp2.json <<'PY'
import json, os, sys
plan = json.load(open(sys.argv[1]))
plan["cluster"] = os.path.normpath(os.path.join(os.path.dirname(sys.argv[1]),
                                                plan["cluster"]))
plan["model"] = {"name": "tiny", "layers": 4, "hidden": 16, "heads": 2,
                 "seq": 16, "vocab": 257}
plan.update(gbs=4, mbs=1, partition="2-2")
json.dump(plan, open(sys.argv[2], "w"), indent=1)
PY
run 0 "$partita" prep "$root/data/corpus.txt" -o corpus
run 0 "$partita" exec tiny-plans/tiny-pp2.json --data corpus --backend cpu \
    --iters 2 -o tiny-runs/tiny-pp2.run.json
expect_in tiny-runs/tiny-pp2.run.json '"memory_terms_gib"'
run 0 "$accuracy" tiny-plans tiny-runs table.md charts-dir
expect_in table.md "1 of 1 plans measured"
expect_in table.md "No run carries memory terms"
# the same run carrying terms (the estimate's, scaled by 1.02): the term
# table shows them, and the total's error
run 0 "$partita" estimate --json tiny-plans/tiny-pp2.json
python3 - tiny-runs/tiny-pp2.run.json out.txt <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
est = json.load(open(sys.argv[2]))["estimate"]
terms = []
for stage in est["stages"]:
    t = {k: v * 1.02 for k, v in stage["memory_terms_gib"].items()}
    t["context"] = None
    terms.append(t)
run["memory_terms_gib"] = terms
run["peak_memory_gib"] = [sum(v for v in t.values() if v is not None)
                          for t in terms]
json.dump(run, open(sys.argv[1], "w"))
PY
mkdir -p charts-dir
run 0 "$accuracy" tiny-plans tiny-runs table.md charts-dir
expect_in table.md "Memory per stage, term by term"
expect_in table.md "| tiny-pp2 | 1 |"
expect_in table.md " / - |"
expect_in table.md "-2.0 %"

# 5. the Llama plans (issue 35, item 7; bench/accuracy/plans-llama): at
# least 6, every one a Llama-family model, the kinds the issue asks for
python3 - "$root/bench/accuracy/plans-llama" <<'PY' || fail "plans-llama lacks a kind of plan"
import glob, json, os, sys
here = sys.argv[1]
plans = [json.load(open(f)) for f in sorted(glob.glob(here + "/*.json"))]
def model(p):
    return json.load(open(os.path.join(here, p["model"])))
def sliced(p):
    c = json.load(open(os.path.join(here, p["cluster"])))
    return any("sm_limit" in d for n in c["nodes"] for d in n.get("devices", []))
def gqa(m):
    return m.get("kv_heads", m["heads"]) < m["heads"]
kinds = {"6 plans": len(plans) >= 6,
         "every model Llama-shaped": all(model(p).get("norm") == "rmsnorm" and
                                         model(p).get("mlp") == "swiglu" for p in plans),
         "one GPU": any(not sliced(p) for p in plans),
         "slices": any(sliced(p) for p in plans),
         "tp with GQA": any(p["tp"] > 1 and gqa(model(p)) for p in plans),
         "pp": any(p["pp"] > 1 for p in plans),
         "ZeRO": any(p.get("distributed_optimizer") or p.get("zero") for p in plans),
         "untied head": any(not model(p).get("tied_embeddings", True) for p in plans)}
missing = [k for k, ok in kinds.items() if not ok]
print("missing:", missing) if missing else None
sys.exit(1 if missing else 0)
PY
for plan in "$root"/bench/accuracy/plans-llama/*.json; do
    run 0 "$partita" estimate "$plan"
    expect_in out.txt "memory per GPU by term"
done
# a tiny copy of the pp 2 Llama plan (tied embeddings across the two
# stages) trained on the cpu backend and compared
mkdir -p llama-plans llama-runs
python3 - "$root/bench/accuracy/plans-llama/L04-2x40-1b-pp2.json" \
    "$root/tests/data/models/llama-tiny.json" llama-plans/tiny-llama-pp2.json <<'PY'
import json, os, sys
plan = json.load(open(sys.argv[1]))
plan["cluster"] = os.path.normpath(os.path.join(os.path.dirname(sys.argv[1]),
                                                plan["cluster"]))
model = json.load(open(sys.argv[2]))
model.update(name="tiny-llama", tied_embeddings=True)
model.pop("notes", None)
plan["model"] = model
plan.update(gbs=4, mbs=1, partition="2-2")
json.dump(plan, open(sys.argv[3], "w"), indent=1)
PY
run 0 "$partita" exec llama-plans/tiny-llama-pp2.json --data corpus \
    --backend cpu --iters 2 -o llama-runs/tiny-llama-pp2.run.json
run 0 "$accuracy" llama-plans llama-runs llama-table.md charts-dir
expect_in llama-table.md "1 of 1 plans measured"
expect_in llama-table.md "tiny-llama on h200-slices-2x40: tp 1 dp 1 pp 2"

# 6. stages of their own degrees on four and eight slices of one GPU
# (issue 36, item 5; bench/accuracy/plans-asym): symmetric and asymmetric
# plans, each estimated (the runner counts an asymmetric plan's ranks
# from its stages), and a tiny copy of an asymmetric one run on the cpu
# backend and compared
python3 - "$root/bench/accuracy/plans-asym" <<'PY' || fail "plans-asym lacks a kind of plan"
import glob, json, sys
plans = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/*.json"))]
own = [p for p in plans if p.get("stages")]
assert own and len(own) < len(plans), "both kinds"
for p in own:  # the stages' tp x dp fill the cluster's GPUs
    gpus = sum(n["gpus"] * n.get("count", 1) for n in p["cluster"]["nodes"])
    assert sum(s["tp"] * s["dp"] for s in p["stages"]) == gpus, p["stages"]
PY
for plan in "$root"/bench/accuracy/plans-asym/*.json; do
    run 0 "$partita" estimate "$plan"
    expect_in out.txt "memory per GPU by term"
done
run 0 env DRY_RUN=1 PLANS="$root/bench/accuracy/plans-asym" \
    "$root/bench/accuracy/run_one_gpu.sh" "$build" dry-asym
expect_in out.txt "xl26h-gbs16-asymmetric-best: DRY_RUN=1 (estimated: step time [0-9]* ms, 4 ranks)"
mkdir -p asym-plans asym-runs
python3 - "$root/bench/accuracy/plans-asym/xl26h-gbs16-asymmetric-best.json" \
    asym-plans/tiny-asym.json <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
plan["model"] = {"name": "tiny", "layers": 6, "hidden": 64, "heads": 4,
                 "seq": 16, "vocab": 257}
plan.update(gbs=4, partition="2-2-2")
json.dump(plan, open(sys.argv[2], "w"), indent=1)
PY
run 0 "$partita" exec asym-plans/tiny-asym.json --data corpus \
    --backend cpu --iters 2 -o asym-runs/tiny-asym.run.json
expect_in out.txt "stages of their own degrees"
run 0 "$accuracy" asym-plans asym-runs asym-table.md charts-dir
expect_in asym-table.md "1 of 1 plans measured"
# the committed GPU runs of these plans (twenty-seventh session): each
# stage's memory terms come from that stage's own ranks (stage 2 of the
# Llama pp 3 plan at gbs 8, tp 4 / 2 / 2, holds ranks 6-7: its terms
# were once read from past the run's 8 ranks)
run 0 "$accuracy" "$root/bench/accuracy/plans-asym" \
    "$root/docs/accuracy/runs-2026-12-01-s27-asym" s27-table.md charts-dir
expect_in s27-table.md "8 of 8 plans measured"
grep -q "^| llama1b-pp8-gbs8-asymmetric-best | 2 | 0.49 / 0.49 |" s27-table.md ||
    fail "the asymmetric plan's last stage lacks its own ranks' terms"
echo "PASS [$case_name]"
