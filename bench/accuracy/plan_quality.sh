#!/usr/bin/env bash
# Plan quality on the heterogeneous 2 x H200 machine (GPU 1 throttled to
# 40 SMs, clusters/h200x2-hetero.json): GPT-2 1.5B, gbs 32. Plans with
# Partita's exact partition (dp solver), then takes the same degrees and
# micro-batch with (a) Megatron's default even partition and (b) FASOP's
# greedy min-max partition (--solver greedy), runs the three with
# `partita exec --backend cuda` and prints the measured step times and
# speed-ups. Needs the measured profiles H200 and H200-40SM (PROFILES).
#
# Usage: bench/accuracy/plan_quality.sh BUILD_DIR OUT_DIR PROFILES_DIR
set -u
build=${1:?usage: plan_quality.sh BUILD_DIR OUT_DIR PROFILES_DIR}
out=${2:?usage}
profiles=${3:?usage}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
iters=${ITERS:-8}
export NCCL_NVLS_ENABLE=0
mkdir -p "$out"
data="$out/corpus"
[ -f "$data.idx" ] || "$partita" prep "$root/data/corpus.txt" -o "$data" >/dev/null
# exec runs neither interleaving nor sequence parallelism yet
common=(--model gpt2-xl --cluster "$root/clusters/h200x2-hetero.json" --gbs 32
        --no-recompute --no-distributed-optimizer --no-interleave
        --no-sequence-parallel --profiles "$profiles" --quiet)
"$partita" plan "${common[@]}" -o "$out/q-partita.json" >"$out/q-partita.plan.log" 2>&1 ||
    { echo "FAIL plan: $(tail -n 3 "$out/q-partita.plan.log")"; exit 1; }
"$partita" plan "${common[@]}" --solver greedy -o "$out/q-greedy.json" >"$out/q-greedy.plan.log" 2>&1 ||
    { echo "FAIL plan --solver greedy: $(tail -n 3 "$out/q-greedy.plan.log")"; exit 1; }
# the same degrees as Partita's plan, with the greedy and the even
# partitions of its pipeline
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
chosen = json.load(open(f"{out}/q-partita.json"))
greedy = json.load(open(f"{out}/q-greedy.json"))
pp, layers = chosen["pp"], 48
even = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
for name, partition in (("even", "-".join(map(str, even))),
                        ("fasop", greedy["partition"] if greedy["pp"] == pp
                         and greedy["mbs"] == chosen["mbs"] else None)):
    if partition is None:
        print(f"note: the greedy search chose other degrees "
              f"(pp {greedy['pp']}, mbs {greedy['mbs']}); its partition "
              f"is not comparable")
        continue
    plan = dict(chosen)
    plan["partition"] = partition
    for key in ("estimate", "alternatives", "events", "stages"):
        plan.pop(key, None)
    json.dump(plan, open(f"{out}/q-{name}.json", "w"), indent=2)
print("partita:", chosen["pp"], chosen["dp"], chosen["tp"], chosen["mbs"],
      chosen.get("partition"))
PY
for name in partita even fasop; do
    plan="$out/q-$name.json"
    [ -f "$plan" ] || continue
    "$partita" estimate "$plan" --profiles "$profiles" >"$out/q-$name.estimate.txt" 2>&1
    if "$partita" exec "$plan" --data "$data" --backend cuda --iters "$iters" \
        --log-interval "$iters" -o "$out/q-$name.run.json" >"$out/q-$name.log" 2>&1; then
        echo "OK   $name $(grep -o '"partition": "[^"]*"' "$plan") $(grep -o 'median step time [^,]*' "$out/q-$name.log")"
    else
        echo "FAIL $name: $(tail -n 2 "$out/q-$name.log" | tr '\n' ' ')"
    fi
done
