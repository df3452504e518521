#!/usr/bin/env bash
# End-to-end tests of plans whose stages run their own tp and dp (issue
# 36): estimated, run by exec on the cpu backend (the one-stage run's
# losses) and reported, what exec cannot run of them refused in one
# line, and refused by export naming the stage unless --symmetric asks
# for the nearest symmetric plan; e2e.sh's conventions.
# usage: asymmetric.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in, write_layout_plan, write_gpus_plan, same_losses,
# prep_corpus; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

# gpt2-xl on hetero (an A100 node, then seven A10 nodes, 4 GPUs each):
# pp 4, plan-wide tp 1 x dp 8; stage 0 tp 4 x dp 2 over the A100 node and
# an A10 node, stage 3 tp 2 x dp 4. STAGES replaces "stages".
default_stages='[{"tp": 4, "dp": 2}, {}, {}, {"tp": 2, "dp": 4}]'
write_hetero_plan() { # FILE PP PARTITION [STAGES]
  local stages="${4:-$default_stages}"
  cat >"$1" <<JSON
{ "model": "$source_root/models/gpt2-xl.json",
  "cluster": "$source_root/clusters/hetero.json",
  "gbs": 64, "mbs": 1, "tp": 1, "dp": 8, "pp": $2, "partition": "$3",
  "stages": $stages }
JSON
}

one_line() {
  [ "$(wc -l <err.txt)" -eq 1 ] || fail "more than one line: $(cat err.txt)"
}

case "$case_name" in
estimate-asymmetric)
  write_hetero_plan in-plan.json 4 15-11-11-11
  run 0 partita estimate in-plan.json
  expect_in out.txt "stages of their own degrees (tp x dp, samples a replica's micro-batch): 4 x 2 (4), 1 x 8 (1), 1 x 8 (1), 2 x 4 (2)"
  expect_in out.txt "32 GPUs"
  run 0 partita estimate --json in-plan.json
  python3 - out.txt <<'PY' || fail "the estimate's JSON"
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["stages"][0] == {"tp": 4, "dp": 2}, plan["stages"]
assert plan["stages"][1] == {"tp": 1, "dp": 8}, plan["stages"]
stages = plan["estimate"]["stages"]
assert [s["ranks"] for s in stages] == [[0, 7], [8, 15], [16, 23], [24, 31]]
assert stages[0]["tp"] == 4 and "tp" not in stages[1]
assert plan["estimate"]["step_time_s"] > 0
PY
  # a stage's dp that cannot split the micro-batch of 8 samples
  write_hetero_plan in-bad.json 4 15-11-11-11 \
    '[{"tp": 4, "dp": 2}, {"dp": 3}, {}, {"tp": 2, "dp": 4}]'
  run 2 partita estimate in-bad.json
  expect_in err.txt "in-bad.json: stages\[1\].dp: 3 replicas cannot share a micro-batch of dp x mbs = 8 x 1 = 8 samples"
  one_line
  # report lays each stage's ranks out at its own tp x dp
  run 0 partita report in-plan.json -o report
  expect_in report/report.md "Stages of their own degrees (tp x dp, samples a replica's micro-batch): stage 0 4 x 2 (4); stage 1 1 x 8 (1); stage 2 1 x 8 (1); stage 3 2 x 4 (2)"
  expect_in report/report.md "| 3 | 24-31 | A10-FASOP |"
  ;;
exec-asymmetric)
  # stage 0 tp 1 x dp 2, stage 1 tp 2 x dp 1 on 4 cpu ranks: each
  # micro-batch's two samples merged onto stage 1's one replica, its
  # activation scattered over two shards, the gradients back; the
  # one-stage run's losses
  prep_corpus
  write_gpus_plan in-plan.json 4 1 1 2 2 \
    ', "partition": "2-2", "stages": [{}, {"tp": 2, "dp": 1}]'
  write_layout_plan in-one.json 1 1 1 1
  run 0 partita exec in-one.json --data in-corpus --backend cpu --iters 3 \
    --log-interval 1 -o run-one.json
  cp out.txt one.log
  run 0 partita exec in-plan.json --data in-corpus --backend cpu --iters 3 \
    --log-interval 1 -o run.json
  expect_in out.txt "exec: 3 iterations on 4 ranks (pp 2, each stage its tp x dp)"
  expect_in out.txt "stages of their own degrees (tp x dp, samples a replica's micro-batch): 1 x 2 (1), 2 x 1 (2)"
  same_losses one.log out.txt
  python3 - run.json <<'PY' || fail "run.json does not hold every rank"
import json, sys
run = json.load(open(sys.argv[1]))
assert run["plan"]["stages"] == [{"tp": 1, "dp": 2}, {"tp": 2, "dp": 1}]
assert {e["rank"] for e in run["events"]} == {0, 1, 2, 3}
assert {e["stage"] for e in run["events"] if e["rank"] >= 2} == {1}
assert len(run["peak_memory_gib"]) == 4
PY
  # report reads it: each stage's ranks, the run's memory by rank
  run 0 partita report in-plan.json run.json --any-device --per-rank -o report
  expect_in report/report.md "| 3 | 1 | A100-FASOP |"
  ;;
exec-asymmetric-refusals)
  prep_corpus
  # the tied embedding between stages of different degrees is summed
  # from ZeRO-1's shards in fp32 only
  write_gpus_plan in-plan.json 4 1 1 2 2 \
    ', "partition": "2-2", "stages": [{}, {"tp": 2, "dp": 1}], "distributed_optimizer": true, "grad_precision": "bf16"'
  run 2 partita exec in-plan.json --data in-corpus --backend cpu --iters 1 \
    -o run.json
  expect_in err.txt "in-plan.json: grad_precision: bf16 with the distributed optimizer and tied embeddings between a first stage of tp 1 x dp 2 and a last of tp 2 x dp 1"
  one_line
  [ ! -e run.json ] || fail "a refused run wrote run.json"
  # a checkpoint of stages of their own degrees resumes under them only
  write_gpus_plan in-asym.json 4 1 1 2 2 \
    ', "partition": "2-2", "stages": [{}, {"tp": 2, "dp": 1}]'
  run 0 partita exec in-asym.json --data in-corpus --backend cpu --iters 2 \
    --save ckpt -o run.json
  write_layout_plan in-sym.json 1 1 2 2 ', "partition": "2-2"'
  run 2 partita exec in-sym.json --data in-corpus --backend cpu --iters 3 \
    --load ckpt -o resumed.json
  expect_in err.txt "the checkpoint is of another layout: meta.json: stages have their own tp and dp"
  one_line
  ;;
export-asymmetric)
  write_hetero_plan in-plan.json 4 15-11-11-11
  run 2 partita export in-plan.json --to megatron -o launch.sh
  expect_in err.txt "in-plan.json: stages\[0\]: tp 4 x dp 2 is its own (the plan's: tp 1 x dp 8): Megatron-LM runs one tp and one dp for every stage"
  one_line
  [ ! -e launch.sh ] || fail "a refused export wrote launch.sh"
  run 2 partita export in-plan.json --to deepspeed
  expect_in err.txt "stages\[0\]: tp 4 x dp 2 is its own (the plan's: tp 1 x dp 8): DeepSpeed runs one tp and one dp"
  one_line
  # --symmetric: tp 1 x dp 8 changes the fewest stages (2 of 4)
  run 0 partita export in-plan.json --to megatron --symmetric -o launch.sh
  expect_in err.txt "the nearest symmetric plan: tp 1 x dp 8 at every stage (2 of 4 stages change their tp, 2 their dp), mbs 1, 8 micro-batches"
  expect_in launch.sh "    --tensor-model-parallel-size 1"
  expect_in launch.sh "    --micro-batch-size 1"
  # most stages at tp 2 x dp 4: that one, each micro-batch's 8 samples
  # kept (mbs 2, 8 micro-batches); gpt2-xl's 25 heads would not split
  # over tp 2, so its 24-head variant
  write_hetero_plan in-two.json 4 13-13-13-13 \
    '[{"tp": 2, "dp": 4}, {"tp": 2, "dp": 4}, {"tp": 1, "dp": 8}, {"tp": 2, "dp": 4}]'
  sed -i 's/gpt2-xl.json/gpt2-xl-24h.json/' in-two.json
  run 0 partita export in-two.json --to megatron --symmetric -o launch.sh
  expect_in err.txt "tp 2 x dp 4 at every stage (1 of 4 stages change their tp, 1 their dp), mbs 2, 8 micro-batches"
  expect_in launch.sh "    --tensor-model-parallel-size 2"
  expect_in launch.sh "    --micro-batch-size 2"
  # with 25 heads only tp 1 splits them: tp 1 x dp 8 though 3 stages
  # change their tp
  write_hetero_plan in-25.json 4 12-12-12-12 \
    '[{"tp": 2, "dp": 4}, {"tp": 2, "dp": 4}, {"tp": 1, "dp": 8}, {"tp": 2, "dp": 4}]'
  run 0 partita export in-25.json --to megatron --symmetric -o launch.sh
  expect_in err.txt "tp 1 x dp 8 at every stage (3 of 4 stages change their tp, 3 their dp), mbs 1, 8 micro-batches"
  # pp 3 cannot fill 32 GPUs symmetrically
  write_hetero_plan in-three.json 3 16-16-16 \
    '[{"tp": 4, "dp": 2}, {}, {"tp": 2}]'
  run 2 partita export in-three.json --to megatron --symmetric -o out.sh
  expect_in err.txt "in-three.json: stages: no symmetric plan keeps the 3 stages on the 32 GPUs of node_order"
  one_line
  [ ! -e out.sh ] || fail "a refused export wrote out.sh"
  # a symmetric plan exports alike with or without --symmetric
  run 0 partita export "$source_root/docs/examples/plan-gpt2xl-hetero.json" \
    --to deepspeed -o plain.json
  run 0 partita export "$source_root/docs/examples/plan-gpt2xl-hetero.json" \
    --to deepspeed --symmetric -o again.json
  cmp -s plain.json again.json || fail "--symmetric changed a symmetric plan"
  ;;
plan-asymmetric)
  # the asymmetric search on a small cluster where a plan of its own
  # degrees scores below the symmetric best (eight A100s in a node, two
  # A10s in another): ranked with the symmetric plans, its best written
  # and estimated again
  python3 - "$source_root/clusters/mixed-96.json" in-cluster.json <<'PY' \
    || fail "writing the cluster"
import json, sys
mixed = json.load(open(sys.argv[1]))
a100, a10 = dict(mixed["nodes"][0]), dict(mixed["nodes"][2])
a100["count"], a10["count"], a10["gpus"] = 1, 1, 2
json.dump({"name": "a100x8-a10x2", "nodes": [a100, a10]},
          open(sys.argv[2], "w"), indent=1)
PY
  run 0 partita plan --model gpt2-xl --cluster in-cluster.json --gbs 64 \
    --asymmetric --no-interleave --quiet -o plan.json
  expect_in out.txt "plans whose stages run their own tp and dp"
  grep -q '^ *[0-9].* asym ' out.txt || fail "no asymmetric plan ranked"
  # each ranked plan of its own degrees, best or alternative, names its
  # stages in plan.json (their tp x dp filling the GPUs of its order)
  python3 - plan.json out.txt <<'PY' || fail "an asymmetric plan without its stages"
import json, re, sys
plan = json.load(open(sys.argv[1]))
ranked = [l for l in open(sys.argv[2]) if re.match(r"^ +[0-9]+ ", l)]
entries = [plan] + plan["alternatives"]
assert len(entries) == len(ranked), (len(entries), len(ranked))
gpus = {"a100": 8, "a10": 2}
for line, entry in zip(ranked, entries):
    if " asym " not in line:
        assert "stages" not in entry or plan is entry, line
        continue
    stages = entry["stages"]
    assert len(stages) == entry["pp"], entry
    held = sum(gpus[n.split("[")[0]] for n in entry["node_order"])
    assert sum(s["tp"] * s["dp"] for s in stages) == held, entry
PY
  run 0 partita estimate plan.json
  # stopped by its budget: how far from exact it may be
  run 0 partita plan --model gpt2-xl --cluster hetero --gbs 64 \
    --asymmetric --max-tree-nodes 2000 --quiet -o big.json
  expect_in out.txt "NOT EXACT: the asymmetric search stopped after"
  # beside --pareto or a degree option: refused
  run 2 partita plan --model gpt2-xl --cluster h200x4-hetero --gbs 64 \
    --asymmetric --pareto -o big.json
  expect_in err.txt "--asymmetric: not with --pareto yet"
  run 2 partita plan --model gpt2-xl --cluster h200x4-hetero --gbs 64 \
    --asymmetric --tp 2 -o big.json
  expect_in err.txt "--asymmetric: not with --tp 2 yet"
  ;;
plan-asymmetric-exec)
  # the asymmetric search on a tiny model and the 4-GPU mixed cluster,
  # its best plan run by exec on the cpu backend (symmetric since the
  # asymmetric search scores per-step work and keeps only plans below
  # the symmetric best: none here)
  prep_corpus
  cat >in-tiny.json <<'JSON'
{ "name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "seq": 16,
  "vocab": 257 }
JSON
  run 0 partita plan --model in-tiny.json --cluster h200x4-hetero --gbs 16 \
    --asymmetric --no-interleave --quiet -o plan.json
  run 0 partita exec plan.json --data in-corpus --backend cpu --iters 2 \
    -o run.json
  expect_in out.txt "exec: 2 iterations on 4 ranks"
  # the best plan's own "stages" (its estimate's are every plan's)
  if python3 -c 'import json, sys; sys.exit(0 if json.load(open("plan.json")).get("stages") else 1)'; then
    expect_in out.txt "stages of their own degrees"
  fi
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
