#!/usr/bin/env bash
# End-to-end tests of the partita command on the bundled files.
# usage: e2e.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in, write_layout_plan, write_small_pool; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"
models="$source_root/models"
clusters="$source_root/clusters"

# The first data row of the ranking table: its step time column.
best_step_time() { grep -m1 '^ *1 ' out.txt | awk '{print $(NF-5)}'; }

# A model small enough for the cpu backend to profile in a second.
write_profile_model() { # FILE
  cat >"$1" <<JSON
{ "name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "seq": 32,
  "vocab": 512 }
JSON
}

case "$case_name" in
help)
  run 0 partita --help;           expect_in out.txt "usage: partita"
  run 0 partita plan --help;      expect_in out.txt "--gbs"
  run 0 partita estimate --help;  expect_in out.txt "--json"
  run 0 partita --version;        expect_in out.txt "partita"
  run 2 partita frobnicate;       expect_in err.txt "unknown command"
  run 2 partita
  ;;
plan-hetero)
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster "$clusters/hetero.json" --quiet
  expect_in out.txt "scored"
  expect_in out.txt "partition"
  [ -s plan.json ] || fail "plan.json not written"
  expect_in plan.json '"format": "partita-plan/1"'
  expect_in plan.json '"events"'
  expect_in plan.json '"alternatives"'
  run 0 partita estimate plan.json
  expect_in out.txt "step time"
  expect_in out.txt "memory per GPU by term (GiB)"
  ;;
plan-default-cluster)
  # the default cluster is the bundled hetero.json
  run 0 partita plan --model "$models/gpt2-xl.json" --gbs 64 -o here.json --quiet
  expect_in out.txt "cluster hetero"
  [ -s here.json ] || fail "here.json not written"
  ;;
plan-ilp-agrees)
  run 0 partita plan --model gpt2-xl --gbs 64 --solver dp --quiet -o dp.json
  dp=$(best_step_time)
  run 0 partita plan --model gpt2-xl --gbs 64 --solver ilp --quiet -o ilp.json
  ilp=$(best_step_time)
  [ -n "$dp" ] && [ "$dp" = "$ilp" ] || fail "dp best $dp s, ilp best $ilp s"
  run 0 partita plan --model gpt2-xl --gbs 64 --solver greedy --quiet -o greedy.json
  greedy=$(best_step_time)
  awk -v a="$dp" -v b="$greedy" 'BEGIN { exit !(a <= b + 1e-4) }' \
    || fail "exact $dp s slower than greedy $greedy s"
  ;;
plan-bert)
  run 0 partita plan --model bert-large --gbs 256 --cluster fasop-bert --quiet
  expect_in out.txt "bert"
  ;;
plan-cost)
  run 0 partita plan --model gpt2-xl --gbs 64 --objective cost --quiet
  expect_in out.txt "objective \$ per step"
  ;;
plan-pareto)
  write_small_pool
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster in-pool.json --pareto --quiet -o front.json
  expect_in out.txt "front"
  expect_in front.json '"pareto"'
  run 0 partita estimate front.json
  ;;
estimate-hand-plan)
  run 0 partita estimate "$source_root/docs/examples/plan-gpt2xl-hetero.json"
  expect_in out.txt "0-11-8-8-8-8-5-0"
  expect_in out.txt "forward"
  # dp overlap: switched on and said so; a fraction outside 0..1 refused
  run 0 partita estimate --dp-overlap 1 "$source_root/docs/examples/plan-gpt2xl-hetero.json"
  expect_in out.txt "dp overlap: gradients reduced in 25 MiB buckets"
  run 2 partita estimate --dp-overlap 1.5 "$source_root/docs/examples/plan-gpt2xl-hetero.json"
  expect_in err.txt "--dp-overlap: expected a fraction from 0 to 1, got '1.5'"
  ;;
estimate-json)
  cp "$source_root/docs/examples/plan-gpt2xl-hetero.json" in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 0 partita estimate --json in-plan.json
  expect_in out.txt '"estimate"'
  expect_in out.txt '"timeline"'
  expect_in out.txt '"fwd": {'
  cp out.txt in-estimated.json
  run 0 partita estimate in-estimated.json
  # the timeline once per stage (8 lanes of 4 ranks), per rank on request
  # (32 lanes, each its stage's); model and cluster inline either way
  run 0 partita estimate --json --per-rank-timeline in-plan.json
  python3 - in-estimated.json out.txt <<'PY' || fail "unexpected timeline lanes"
import json, sys
per_stage = json.load(open(sys.argv[1]))
per_rank = json.load(open(sys.argv[2]))
for plan in per_stage, per_rank:
    assert isinstance(plan["model"], dict) and isinstance(plan["cluster"], dict)
    assert plan["origin"]["model"].endswith("models/gpt2-xl.json"), plan["origin"]
stages = per_stage["estimate"]["timeline"]
assert [lane["ranks"] for lane in stages] == [[4 * s, 4 * s + 3] for s in range(8)]
ranks = per_rank["estimate"]["timeline"]
assert [lane["ranks"] for lane in ranks] == [[r, r] for r in range(32)]
for lane in ranks:
    assert lane["events"] == stages[lane["stage"]]["events"]
fwd = stages[1]["events"]["fwd"]
assert fwd["microbatch"] == list(range(16)), fwd["microbatch"]
assert len(fwd["start_s"]) == len(fwd["end_s"]) == 16
assert all(e > s for s, e in zip(fwd["start_s"], fwd["end_s"]))
PY
  run 2 partita estimate --per-rank-timeline in-plan.json
  expect_in err.txt "give --json too"
  ;;
estimate-inline)
  cat >in-inline.json <<JSON
{ "model": { "name": "tiny", "layers": 4, "hidden": 1600, "heads": 16,
             "seq": 1024, "vocab": 50257 },
  "cluster": { "name": "one-a100", "nodes": [
      { "name": "a100", "gpu": "A100-FASOP", "gpus": 2,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 },
        "inter_node": { "bandwidth_Gbps": 40, "latency_us": 20 } } ] },
  "gbs": 8, "mbs": 1, "tp": 1, "dp": 1, "pp": 2, "partition": [3, 1] }
JSON
  run 0 partita estimate in-inline.json
  expect_in out.txt "3-1"
  ;;
plan-every-profile)
  # every committed profile prices a plan (specs.json is the spec table
  # the derived profiles come from, not a profile)
  for file in "$source_root"/profiles/*.json; do
    gpu=$(basename "$file" .json)
    [ "$gpu" = specs ] && continue
    cat >in-cluster.json <<JSON
{ "name": "two-$gpu", "nodes": [
    { "name": "node", "count": 2, "gpu": "$gpu", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 },
      "inter_node": { "bandwidth_Gbps": 50, "latency_us": 20 } } ] }
JSON
    run 0 partita plan --model gpt2-xl --gbs 32 --cluster in-cluster.json \
      --quiet -o in-plan.json
    expect_in out.txt "scored"
  done
  ;;
plan-mixed-derived)
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster mixed-derived --quiet \
    -o in-plan.json
  expect_in out.txt "cluster mixed-derived"
  for gpu in A10 RTX3090 A100-40GB V100-32GB; do
    expect_in out.txt "note: $gpu: derived profile"
  done
  run 0 partita estimate in-plan.json
  expect_in out.txt "step time"
  ;;
derive-profile)
  run 0 partita profile --derive A10 --help
  expect_in out.txt "--derive GPU"
  mkdir in-profiles
  run 0 partita profile --derive A100-80GB \
    --from "$source_root/profiles/A100-FASOP.json,A10-FASOP" --points \
    --compare A100-FASOP --link-GBps 230 --link-latency-us 5 \
    -o in-profiles/A100-80GB.json
  expect_in out.txt "rms log error"
  expect_in out.txt "| A100-FASOP | h 1600, s 1024, V 50257 | 4 | 1 | layer |"
  expect_in in-profiles/A100-80GB.json '"source": "derived"'
  expect_in in-profiles/A100-80GB.json '"fitted_on"'
  # the fresh profile is the one a plan finds first
  sed -e 's/"gpu": "A100-40GB"/"gpu": "A100-80GB"/' \
    "$clusters/mixed-derived.json" >in-cluster.json
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster in-cluster.json \
    --profiles in-profiles --quiet -o in-plan.json
  expect_in out.txt "A100-80GB"
  run 2 partita profile --derive B300 --from A10-FASOP
  expect_in err.txt "no such GPU"
  run 2 partita profile --derive A10
  expect_in err.txt "required"
  run 2 partita profile --derive A10 --from no-such-profile
  expect_in err.txt "no-such-profile"
  run 2 partita profile --derive A10 --from A10-FASOP --compare A10-FASOP
  expect_in err.txt "link-GBps"
  ;;
bad-json)
  printf '{ "model": "x", ' >in-bad.json
  run 2 partita estimate in-bad.json
  expect_in err.txt "in-bad.json"
  ;;
bad-gpu)
  sed 's/"A10-FASOP"/"B300-IMAGINARY"/' "$clusters/hetero.json" >in-cluster.json
  run 2 partita plan --model gpt2-xl --gbs 64 --cluster in-cluster.json --quiet
  expect_in err.txt "B300-IMAGINARY"
  no_leftovers
  ;;
bad-zero-gpus)
  sed 's/"gpus": 4/"gpus": 0/' "$clusters/hetero.json" >in-cluster.json
  run 2 partita plan --model gpt2-xl --gbs 64 --cluster in-cluster.json --quiet
  expect_in err.txt "gpus"
  no_leftovers
  ;;
bad-no-fit)
  run 2 partita plan --model gpt-175b --gbs 64 --quiet
  expect_in err.txt "no plan fits"
  expect_in err.txt "GiB"
  no_leftovers
  ;;
bad-partition)
  sed 's/0-11-8-8-8-8-5-0/0-11-8-8-8-8-5-1/' \
    "$source_root/docs/examples/plan-gpt2xl-hetero.json" >in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 2 partita estimate in-plan.json
  expect_in err.txt "partition"
  ;;
bad-gbs)
  sed 's/"gbs": 64/"gbs": 63/' \
    "$source_root/docs/examples/plan-gpt2xl-hetero.json" >in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 2 partita estimate in-plan.json
  expect_in err.txt "gbs"
  ;;
bad-arguments)
  run 2 partita plan --gbs 64
  expect_in err.txt "required"
  run 2 partita plan --model gpt2-xl --gbs -4
  run 2 partita plan --model gpt2-xl --gbs 64 --solver magic
  expect_in err.txt "magic"
  run 2 partita plan --model no-such-model --gbs 64
  expect_in err.txt "no-such-model"
  run 2 partita estimate
  run 2 partita estimate /nonexistent/plan.json
  expect_in err.txt "/nonexistent/plan.json"
  no_leftovers
  ;;
bad-messages)
  # issue 18, items 13 and 14: a path named once, a directory said to be
  # one, numbers as written, control characters of files never sent to
  # the terminal
  run 2 partita exec in-missing.json --data in-corpus
  [ "$(grep -o 'in-missing.json' err.txt | wc -l)" = 1 ] || fail "the path is not named once: $(cat err.txt)"
  mkdir in-dir
  run 2 partita plan --model in-dir --gbs 8 --quiet
  expect_in err.txt "in-dir: is a directory, not a JSON file"
  sed 's/"gpus": 4,/"gpus": 48.0,/' "$clusters/hetero.json" >in-cluster.json
  run 2 partita plan --model gpt2-xl --gbs 64 --cluster in-cluster.json --quiet
  expect_in err.txt "gpus: must be an integer in \[1, 1024\], got 48.0\|gpus: must be a positive integer, got 48.0"
  printf '{ "name": "x\\u001b[2J", "layers": 2, "hidden": 16, "heads": 2, "seq": 16, "vocab": 257 }\n' >in-model.json
  run 2 partita plan --model in-model.json --gbs 8 --quiet
  expect_in err.txt "name: must not contain control characters (byte 2 is 0x1b)"
  printf '{ "name": "m", "\\u001b[31mlayers": 2 }\n' >in-model2.json
  run 2 partita plan --model in-model2.json --gbs 8 --quiet
  expect_in err.txt '\\x1b\[31mlayers: unknown key'
  ! grep -q "$(printf '\033')" err.txt || fail "an escape character reached the terminal"
  no_leftovers
  ;;
bad-profiles)
  # issue 18, items 7 and 8: a --profiles folder that is not there, and a
  # profile whose gpu is not its file name, are refused, not guessed
  run 2 partita plan --model gpt2-xl --gbs 64 --quiet --profiles /nonexistent
  expect_in err.txt "\-\-profiles /nonexistent: cannot read the folder"
  mkdir in-profiles
  cp "$source_root/profiles/A10-FASOP.json" in-profiles/A100-FASOP.json
  run 2 partita plan --model gpt2-xl --gbs 64 --quiet --profiles in-profiles
  expect_in err.txt 'in-profiles/A100-FASOP.json: gpu: is "A10-FASOP"'
  expect_in err.txt 'profile of GPU "A100-FASOP"'
  run 2 partita estimate "$source_root/docs/examples/plan-gpt2xl-hetero.json" --profiles in-profiles
  expect_in err.txt 'gpu: is "A10-FASOP"'
  no_leftovers
  ;;
bad-huge-values)
  # issue 18, item 9: values beyond physical sense are refused naming the
  # field and the range (1e308 used to become inf, then "out of memory")
  sed 's/"price_per_hour": 8.144/"price_per_hour": 1e308/' "$clusters/hetero.json" >in-cluster.json
  grep -q 1e308 in-cluster.json || fail "could not write the cluster"
  run 2 partita plan --model gpt2-xl --gbs 64 --cluster in-cluster.json --quiet
  expect_in err.txt "nodes\[1\].price_per_hour: must be a number in \[0, 1e+06\], got 1e+308"
  mkdir in-profiles
  sed 's/"memory_gib": [0-9.]*/"memory_gib": 1e308/' "$source_root/profiles/A10-FASOP.json" >in-profiles/A10-FASOP.json
  grep -q 1e308 in-profiles/A10-FASOP.json || fail "could not write the profile"
  run 2 partita plan --model gpt2-xl --gbs 64 --quiet --profiles in-profiles
  expect_in err.txt "memory_gib: must be a number in \[0.001, 100000\], got 1e+308"
  no_leftovers
  ;;
plan-threads-capped)
  # issue 18, item 10: more threads than cores are capped, and said so
  run 0 partita plan --model gpt2-xl --gbs 64 --quiet --threads 100000 -o plan.json
  expect_in err.txt "partita plan: \-\-threads 100000 is more than the [0-9]* cores here: using [0-9]*"
  ;;
bad-huge-gbs)
  # issue 18, item 11: a schedule of more steps than the cost model
  # simulates is refused at once, naming the bound
  sed 's/"gbs": 64/"gbs": 100000000/' \
    "$source_root/docs/examples/plan-gpt2xl-hetero.json" >in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 2 partita estimate in-plan.json
  expect_in err.txt "gbs 100000000 / (dp 4 x mbs 1) = 25000000 micro-batches"
  expect_in err.txt "simulates at most 262144"
  run 2 partita report in-plan.json -o report
  expect_in err.txt "simulates at most"
  no_leftovers
  ;;
output-unwritable)
  run 2 partita plan --model gpt2-xl --gbs 64 --quiet -o /nonexistent-dir/plan.json
  expect_in err.txt "/nonexistent-dir/plan.json"
  ;;
output-checked-first)
  # issue 18, item 3: an output that cannot be written is refused before
  # any work (no search, no training), exit 2, one line naming it
  prep_corpus
  write_tiny_plan in-plan.json
  touch in-file
  run 2 partita plan --model gpt2-xl --gbs 64 -o in-missing/plan.json
  expect_in err.txt "in-missing/plan.json: cannot write there"
  [ ! -s out.txt ] || fail "plan searched before refusing its output"
  run 2 partita plan --model gpt2-xl --gbs 64 -o in-file/plan.json
  expect_in err.txt "in-file is not a folder"
  run 2 partita exec in-plan.json --data in-corpus --iters 3 --save in-file/ckpt
  expect_in err.txt "in-file/ckpt: cannot write there: in-file is not a folder"
  [ "$(wc -l <err.txt)" = 1 ] || fail "expected one line: $(cat err.txt)"
  grep -q '^iteration' out.txt && fail "exec trained before refusing --save"
  [ ! -e run.json ] || fail "run.json written by a refused run"
  run 2 partita exec in-plan.json --data in-corpus --iters 3 -o in-missing/run.json
  expect_in err.txt "in-missing/run.json: cannot write there"
  run 2 partita exec in-plan.json --data in-corpus --iters 3 -o .
  expect_in err.txt "is a directory"
  run 2 partita estimate in-plan.json -o in-missing/estimated.json
  expect_in err.txt "in-missing/estimated.json"
  run 2 partita report in-plan.json -o in-file/report
  expect_in err.txt "in-file is not a folder"
  run 2 partita profile --derive A10 --from A10-FASOP -o in-missing/A10.json
  expect_in err.txt "in-missing/A10.json: cannot write there"
  no_leftovers
  ;;
output-stdout)
  # issue 18, item 2: -o - is standard output (the tables and the log go
  # to standard error); no file named '-' is made
  run 0 partita plan --model gpt2-xl --gbs 64 --quiet -o -
  python3 -c "import json, sys; p = json.load(open(sys.argv[1])); assert p['format'] == 'partita-plan/1'" out.txt \
    || fail "plan -o - did not print plan.json alone"
  expect_in err.txt "# scored"
  expect_in err.txt "wrote standard output"
  cp out.txt in-plan.json
  run 0 partita estimate in-plan.json -o -
  python3 -c "import json, sys; assert 'estimate' in json.load(open(sys.argv[1]))" out.txt \
    || fail "estimate -o - did not print the plan"
  run 0 partita estimate in-plan.json -o in-estimated.json
  expect_in out.txt "# step time"
  expect_in in-estimated.json '"estimate"'
  prep_corpus
  write_tiny_plan in-tiny.json
  run 0 partita exec in-tiny.json --data in-corpus --iters 2 --log-interval 1 -o -
  python3 -c "import json, sys; assert json.load(open(sys.argv[1]))['format'] == 'partita-run/1'" out.txt \
    || fail "exec -o - did not print run.json alone"
  expect_in err.txt "iteration        2/       2"
  expect_in err.txt "exec: wrote standard output"
  [ ! -e ./- ] || fail "a file named '-' was written"
  ;;
output-special)
  # issue 18, item 1: a symbolic link keeps pointing at its target, which
  # gets the plan; a FIFO and a device are written through, not replaced
  echo old >in-target.json
  ln -s in-target.json in-link.json
  run 0 partita plan --model gpt2-xl --gbs 64 --quiet -o in-link.json
  [ -L in-link.json ] || fail "the symbolic link was replaced"
  expect_in in-target.json '"format": "partita-plan/1"'
  mkfifo in-fifo
  cat in-fifo >in-from-fifo.json &
  reader=$!
  run 0 partita plan --model gpt2-xl --gbs 64 --quiet -o in-fifo
  wait "$reader"
  [ -p in-fifo ] || fail "the FIFO was replaced"
  expect_in in-from-fifo.json '"format": "partita-plan/1"'
  run 0 partita estimate in-target.json -o /dev/null
  [ -c /dev/null ] || fail "/dev/null is no longer a device"
  no_leftovers
  ;;
prep)
  run 0 partita prep "$source_root/data/corpus.txt" -o corpus
  expect_in out.txt "documents"
  [ -s corpus.bin ] && [ -s corpus.idx ] || fail "corpus.bin/.idx not written"
  printf '{"text": "hello"}\n{"text": "world"}\n' >in.jsonl
  run 0 partita prep --jsonl in.jsonl -o small
  expect_in out.txt "2 documents"
  printf '{"text": "hello"}\n{"txt": "world"}\n' >in-bad.jsonl
  run 2 partita prep --jsonl in-bad.jsonl -o bad
  expect_in err.txt "in-bad.jsonl:2"
  [ ! -e bad.bin ] && [ ! -e bad.idx ] || fail "partial output left behind"
  run 2 partita prep /nonexistent.txt -o nothing
  run 2 partita prep "$source_root/data/corpus.txt"
  # issue 18, item 15: a prefix ending in '/' or naming a folder would
  # write the hidden files dir/.bin and dir/.idx
  mkdir outdir
  run 2 partita prep "$source_root/data/corpus.txt" -o outdir/
  expect_in err.txt "outdir/: the output prefix ends in '/'"
  run 2 partita prep "$source_root/data/corpus.txt" -o outdir
  expect_in err.txt "outdir: the output prefix is a folder"
  [ -z "$(ls -A outdir)" ] || fail "prep wrote into the folder"
  ;;
plan-schedule-levers)
  # Megatron's interleaved 1F1B and sequence parallelism: planned,
  # written, estimated, run and resumed by exec
  run 0 partita plan --model gpt-13b --gbs 64 --cluster h200x8 --top 32 --quiet
  expect_in out.txt " v5 "
  grep -Eq ' ([a-z0-9]+\+)?sp ' out.txt || fail "no sequence-parallel plan among the top 32: $(cat out.txt)"
  expect_in plan.json '"virtual_stages": 5'
  run 0 partita estimate plan.json
  expect_in out.txt "virtual stages 5 a rank (interleaved 1F1B on)"
  run 0 partita plan --model gpt-13b --gbs 64 --cluster h200x8 --top 8 --quiet \
    --no-interleave --no-sequence-parallel -o plain.json
  expect_in plain.json '"virtual_stages": 1'
  expect_in plain.json '"sequence_parallel": false'
  if grep -q -e " v[0-9] " -e "+sp" out.txt; then fail "levers used though disabled"; fi
  write_layout_plan in-sp.json 1 2 1 2 ', "sequence_parallel": true'
  run 0 partita estimate in-sp.json
  expect_in out.txt "sequence parallel on"
  expect_in out.txt "sequence parallelism in Partita's executor adds"
  write_layout_plan in-v2.json 2 1 1 2 ', "virtual_stages": 2'
  run 0 partita estimate --json in-v2.json
  expect_in out.txt '"virtual_stages": 2'
  # exported: Megatron's flags, or a layout of pp x v virtual stages
  run 0 partita export plan.json --to megatron -o launch.sh
  expect_in launch.sh "    --num-virtual-stages-per-pipeline-rank 5"
  run 0 partita export in-sp.json --to megatron -o launch-sp.sh
  expect_in launch-sp.sh "    --sequence-parallel"
  cat >in-layout.json <<JSON
{ "model": { "name": "tiny", "layers": 8, "hidden": 16, "heads": 2,
             "seq": 16, "vocab": 257 },
  "cluster": { "name": "one-box", "nodes": [
      { "name": "box", "gpu": "A100-FASOP", "gpus": 4,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] },
  "gbs": 8, "mbs": 1, "tp": 1, "dp": 1, "pp": 4, "partition": "2-4-0-2",
  "virtual_stages": 2 }
JSON
  run 0 partita export in-layout.json --to megatron -o launch-layout.sh
  expect_in launch-layout.sh "--pipeline-model-parallel-layout 'Et|t\*2||t|t|t\*2||tL'"
  if grep -q -- "--num-virtual-stages" launch-layout.sh; then fail "v given twice"; fi
  run 0 partita export in-layout.json --to deepspeed -o ds.json
  expect_in ds.json "virtual_stages 2: DeepSpeed's pipeline engine runs the plain 1F1B only"
  # exec: the interleaved 1F1B, the plain 1F1B's losses
  prep_corpus
  run 0 partita exec in-v2.json --data in-corpus --iters 3 -o run-v2.json
  expect_in out.txt "iteration        3/       3 |"
  write_layout_plan in-plain.json 2 1 1 2
  run 0 partita exec in-plain.json --data in-corpus --iters 3 -o run-plain.json
  python3 - <<'PY' || fail "the interleaved losses differ from the plain 1F1B's"
import json
a = json.load(open("run-v2.json")); b = json.load(open("run-plain.json"))
assert [i["loss"] for i in a["iterations"]] == [i["loss"] for i in b["iterations"]]
# every rank's chunk forwards of the recorded iteration: m v = 2 x 2
for rank in (0, 1):
    assert sum(e["rank"] == rank and e["kind"] == "fwd" for e in a["events"]) == 4
PY
  # checkpoints of it: every chunk of every rank saved; the generation of
  # iteration 2 resumed gives the straight run's iteration 3 bit for bit
  run 0 partita exec in-v2.json --data in-corpus --iters 3 --save ckpt \
    --save-interval 2 -o saved-v2.json
  expect_in ckpt/manifest.json 'params.rank1.chunk1'
  old=$(ls -d ckpt/gen-* | head -1)
  expect_in "$old/meta.json" '"virtual_stages": 2'
  run 0 partita exec in-v2.json --data in-corpus --iters 3 --load "$old" \
    -o resumed-v2.json
  python3 - <<'PY' || fail "the resumed interleaved run differs from the straight one"
import json
a = json.load(open("run-v2.json")); b = json.load(open("resumed-v2.json"))
assert b["training"]["first_iteration"] == 3, b["training"]
assert a["iterations"][2]["loss"] == b["iterations"][0]["loss"]
assert a["iterations"][2]["grad_norm"] == b["iterations"][0]["grad_norm"]
PY
  # ...and not under the plain 1F1B: one line, exit 2
  run 2 partita exec in-plain.json --data in-corpus --iters 4 --load ckpt
  expect_in err.txt "virtual_stages is 2, the plan has virtual_stages 1"
  [ "$(wc -l <err.txt)" = 1 ] || fail "expected one line: $(cat err.txt)"
  rm -rf run-v2.json run-plain.json saved-v2.json resumed-v2.json ckpt
  # ZeRO-2/3 with interleaving: refused before any rank starts
  write_layout_plan in-v2z.json 1 1 2 2 \
    ', "virtual_stages": 2, "distributed_optimizer": true, "zero": 2'
  run 2 partita exec in-v2z.json --data in-corpus --iters 1 -o run-v2z.json
  expect_in err.txt "virtual_stages: exec runs ZeRO-2 without the interleaved 1F1B only yet"
  [ ! -e run-v2z.json ] || fail "a refused run wrote run-v2z.json"
  # sequence parallelism on the cpu backend: the plain tp's losses
  run 0 partita exec in-sp.json --data in-corpus --iters 3 -o run-sp.json
  write_layout_plan in-tp.json 1 2 1 2
  run 0 partita exec in-tp.json --data in-corpus --iters 3 -o run-tp.json
  python3 - <<'PY' || fail "the sequence-parallel losses differ from the plain tp's"
import json
a = json.load(open("run-sp.json")); b = json.load(open("run-tp.json"))
for x, y in zip(a["iterations"], b["iterations"]):
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(y["loss"]), (x, y)
PY
  rm -f run-sp.json run-tp.json
  # the cuda backend takes it too: without GPUs (or CUDA) here the run is
  # refused for that, not for sequence parallelism
  run 2 partita exec in-sp.json --data in-corpus --iters 1 --backend cuda
  ! grep -q "sequence_parallel" err.txt ||
    fail "the cuda backend refused sequence parallelism: $(cat err.txt)"
  [ ! -e run.json ] || fail "a refused run wrote run.json"
  ;;
bad-schedule-levers)
  write_layout_plan in-a.json 1 1 1 2 ', "virtual_stages": 0'
  run 2 partita estimate in-a.json
  expect_in err.txt "in-a.json: virtual_stages: must be"
  write_layout_plan in-b.json 4 1 1 2 ', "virtual_stages": 2'
  run 2 partita estimate in-b.json
  expect_in err.txt "in-b.json: virtual_stages: 2 needs the micro-batches per iteration (gbs / (dp x mbs) = 1) to be a multiple of pp (2)"
  write_layout_plan in-c.json 2 1 1 2 ', "virtual_stages": 2, "partition": "1-3"'
  run 2 partita estimate in-c.json
  expect_in err.txt "in-c.json: partition: stage 0 holds 1 layers, not a multiple of virtual_stages 2"
  write_layout_plan in-d.json 1 1 1 2 ', "sequence_parallel": true'
  run 2 partita estimate in-d.json
  expect_in err.txt "in-d.json: sequence_parallel: needs tp >= 2"
  write_layout_plan in-e.json 1 1 1 1 ', "sequence_parallel": "on"'
  run 2 partita estimate in-e.json
  expect_in err.txt "in-e.json: sequence_parallel: must be true or false"
  ;;
profile-cpu)
  # partita profile on the cpu backend: the profile of a tiny model loads
  # in the reader and prices the model for the planner
  write_profile_model in-tiny.json
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1,2,4 --mbs 1,2,4 -o cpu.json
  [ -s cpu.json ] || fail "cpu.json not written"
  expect_in cpu.json '"source": "measured"'
  expect_in cpu.json '"forward_spread"'
  expect_in cpu.json '"command": "partita profile --model in-tiny.json'
  expect_in cpu.json '"date_utc"'
  expect_in cpu.json 'link figures apply'
  [ "$(grep -c '"mbs"' cpu.json)" = 9 ] || fail "expected 9 points in cpu.json"
  expect_in err.txt "tp 4, micro-batch 4: embedding"
  expect_in out.txt "written to cpu.json"
  # --quick measures one set of stages; --stage-sets asks for more, and the
  # profile says how many its medians pool
  expect_in cpu.json '"stage_sets": 1'
  expect_in cpu.json '"queued_parts": 27'
  run_profile partita profile --model in-tiny.json --backend cpu --quick --stage-sets 2 --tp 1 --mbs 1 -o cpu-sets.json
  expect_in cpu-sets.json '"stage_sets": 2'
  expect_in cpu-sets.json '"embedding_sets": 2'
  run_profile partita profile --model in-tiny.json --backend cpu --quick --stage-sets 2 --embedding-sets 4 --tp 1 --mbs 1 -o cpu-esets.json
  expect_in cpu-esets.json '"embedding_sets": 4'
  expect_in err.txt "the embedding made again (4 of 4 sets)"
  # --processes measures in fresh processes, one after the other, and the
  # profile's entries are the means of theirs
  run_profile partita profile --model in-tiny.json --backend cpu --quick --processes 3 --tp 1,2 --mbs 1,2 -o cpu-procs.json
  expect_in cpu-procs.json '"processes": 3'
  expect_in err.txt "process 3 of 3"
  [ "$(grep -c '"mbs"' cpu-procs.json)" = 4 ] || fail "expected 4 points in cpu-procs.json"
  run 2 partita profile --model in-tiny.json --backend cpu --quick --processes 17 -o never.json
  expect_in err.txt "--processes: expected a number above 0, at most 16"
  [ ! -e never.json ] || fail "never.json written"
  [ -z "$(ls -A | grep tmp)" ] || fail "temporary files left: $(ls -A)"
  # --rounds and --round-ms: the rounds of each part and their length,
  # recorded in the provenance; each progress line says the seconds so far
  run_profile partita profile --model in-tiny.json --backend cpu --quick --rounds 4 --round-ms 2 --tp 1 --mbs 1 -o cpu-rounds.json
  expect_in cpu-rounds.json '"rounds": 4'
  expect_in cpu-rounds.json '"round_s": 0.002'
  expect_in cpu-rounds.json '"hold_s": 0'
  # the host's AdamW and copy rates (an offloaded optimizer's price) too
  expect_in cpu-rounds.json '"host_adamw_s_per_param": '
  expect_in cpu-rounds.json '"host_copy_s_per_param": '
  # --hold-ms: recorded (the cpu backend holds nothing)
  run_profile partita profile --model in-tiny.json --backend cpu --quick --hold-ms 250 --tp 1 --mbs 1 -o cpu-hold.json
  expect_in cpu-hold.json '"hold_s": 0.25'
  # --timing step: the cpu backend queues every part on the host clock
  run_profile partita profile --model in-tiny.json --backend cpu --quick --timing step --tp 1 --mbs 1 -o cpu-step.json
  expect_in cpu-step.json '"queued_parts": 3'
  # --timing exec: likewise (the executor's steps are timed on cuda only)
  run_profile partita profile --model in-tiny.json --backend cpu --quick --timing exec --tp 1 --mbs 1 -o cpu-exec.json
  expect_in cpu-exec.json '"queued_parts": 3'
  grep -Eq '^\[[#.]+\] +[0-9]+/[0-9]+ +[0-9]+\.[0-9] s  tp 1, micro-batch 1' err.txt || fail "no seconds on the progress line: $(cat err.txt)"
  cat >in-box.json <<JSON
{ "name": "cpu-box", "nodes": [
    { "name": "box", "gpu": "cpu", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 10, "latency_us": 5 } } ] }
JSON
  run 0 partita plan --model in-tiny.json --cluster in-box.json --gbs 8 --profiles . --quiet -o plan.json
  expect_in out.txt "scored"
  run 0 partita estimate plan.json --profiles .
  # two models, two shapes; a tp the heads do not allow is skipped with a
  # note, the rest measured
  sed 's/"hidden": 64, "heads": 4/"hidden": 48, "heads": 2/' in-tiny.json >in-tiny2.json
  run_profile partita profile --model in-tiny.json,in-tiny2.json --backend cpu --quick --tp 1,4 --mbs 1 --gpu-name tiny-cpu
  expect_in tiny-cpu.json '"gpu": "tiny-cpu"'
  [ "$(grep -c '"hidden"' tiny-cpu.json)" = 2 ] || fail "expected 2 shapes in tiny-cpu.json"
  expect_in tiny-cpu.json 'tiny: tp 4 skipped: it does not divide the heads (2 heads'
  run 2 partita profile --model in-tiny.json,in-tiny.json --backend cpu --quick
  expect_in err.txt "the same hidden"
  ;;
profile-missing)
  # --missing-only: measures only the shapes and tp a profile lacks (cpu
  # backend), adds them with their provenance, and does nothing when
  # nothing is missing; the estimate then finds them measured
  write_profile_model in-tiny.json
  sed 's/"hidden": 64, "heads": 4/"hidden": 96, "heads": 4/' in-tiny.json >in-wide.json
  # (one micro-batch: a busy cpu's times need not grow with it)
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1 --mbs 1 -o cpu.json
  run_profile partita profile --model in-tiny.json,in-wide.json --backend cpu --quick --tp 1,2 --mbs 1 --missing-only -o cpu.json
  expect_in err.txt "model tiny: tp 2 missing from cpu.json"
  expect_in err.txt "tp 1 2 missing from cpu.json"
  expect_in out.txt "added 3 points to cpu.json"
  [ "$(grep -c '"hidden"' cpu.json)" = 2 ] || fail "expected 2 shapes in cpu.json"
  [ "$(grep -c '"mbs"' cpu.json)" = 4 ] || fail "expected 4 points in cpu.json"
  expect_in cpu.json '"additions"'
  expect_in cpu.json 'missing-only'
  cp cpu.json in-before.json
  run_profile partita profile --model in-tiny.json,in-wide.json --backend cpu --quick --tp 1,2 --mbs 1 --missing-only -o cpu.json
  expect_in out.txt "nothing to measure"
  cmp -s cpu.json in-before.json || fail "cpu.json changed with nothing missing"
  # a profile of another GPU is left as it was
  sed 's/"gpu": "cpu"/"gpu": "other"/' in-before.json >other.json
  cp other.json in-other.json
  run 2 partita profile --model in-tiny.json --backend cpu --quick --tp 1,4 --mbs 1 --missing-only -o other.json
  expect_in err.txt "a profile of other; this device profiles as cpu"
  cmp -s other.json in-other.json || fail "other.json changed"
  run 2 partita profile --model in-tiny.json --backend cpu --missing-only
  expect_in err.txt "name it with -o"
  run 2 partita profile --model in-tiny.json --backend cpu --missing-only -o in-absent.json
  expect_in err.txt "in-absent.json"
  ;;
profile-host-rates)
  # --host-rates: the host's AdamW and copies alone, written into the
  # profile -o names with a provenance entry, every other entry as it was;
  # refused without -o, with --missing-only, or on a file it cannot read
  write_profile_model in-tiny.json
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1 --mbs 1 -o cpu.json
  python3 - cpu.json >in-before.txt <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for k in ("host_adamw_s_per_param", "host_copy_s_per_param", "provenance"):
    p.pop(k, None)
print(json.dumps(p, sort_keys=True))
PY
  run_profile partita profile --model in-tiny.json --backend cpu --quick --host-rates -o cpu.json
  expect_in out.txt "# host AdamW "
  expect_in out.txt "written to cpu.json"
  expect_in cpu.json "--host-rates"
  python3 - cpu.json in-before.txt <<'PY' || fail "--host-rates changed more than the host rates"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["host_adamw_s_per_param"] > 0 and p["host_copy_s_per_param"] > 0
entry = p["provenance"]["additions"][-1]
assert entry["host_adamw_s_per_param"] == p["host_adamw_s_per_param"]
for k in ("host_adamw_s_per_param", "host_copy_s_per_param", "provenance"):
    p.pop(k, None)
assert json.dumps(p, sort_keys=True) == open(sys.argv[2]).read().strip()
PY
  cp cpu.json in-kept.json
  run 2 partita profile --model in-tiny.json --backend cpu --host-rates
  expect_in err.txt "--host-rates writes into a profile: name it with -o"
  run 2 partita profile --model in-tiny.json --backend cpu --host-rates --missing-only -o cpu.json
  expect_in err.txt "--host-rates measures the host alone: not with --missing-only"
  run 2 partita profile --model in-tiny.json --backend cpu --host-rates -o in-absent.json
  expect_in err.txt "in-absent.json"
  cmp -s cpu.json in-kept.json || fail "cpu.json changed by a refused run"
  ;;
profile-bad)
  write_profile_model in-tiny.json
  run 2 partita profile --backend cpu --model in-missing.json
  expect_in err.txt "in-missing.json"
  run 2 partita profile --backend cpu --model in-tiny.json --tp 1,3
  expect_in err.txt "tp 3 is not a power of two"
  run 2 partita profile --backend cpu --model in-tiny.json --tp 2,1
  expect_in err.txt "ascend"
  run 2 partita profile --backend cpu --model in-tiny.json --tp one
  expect_in err.txt "'one'"
  run 2 partita profile --backend cpu --model in-tiny.json --mbs 1,,2
  expect_in err.txt "\-\-mbs"
  run 2 partita profile --backend cpu --model in-tiny.json -o in-missing-dir/p.json
  expect_in err.txt "in-missing-dir"
  [ ! -e in-missing-dir ] || fail "a directory was made"
  run 2 partita profile --backend cpu --model in-tiny.json --sm-limit 16
  expect_in err.txt "cuda backend"
  run 2 partita profile --backend cpu --model in-tiny.json --beside 16
  expect_in err.txt "\-\-beside needs \-\-sm-limit"
  run 2 partita profile --backend cpu --model in-tiny.json --sm-limit 16 --beside 16,x
  expect_in err.txt "\-\-beside"
  run 2 partita profile --backend cpu --model in-tiny.json --sm-limit 16 --place 1
  expect_in err.txt "\-\-place and \-\-idle-neighbours need \-\-beside"
  run 2 partita profile --backend cpu --model in-tiny.json --sm-limit 16 --idle-neighbours
  expect_in err.txt "need \-\-beside"
  run 2 partita profile --backend cpu --model in-tiny.json --sm-limit 16 --beside 16 --place x
  expect_in err.txt "\-\-place: expected a slice index"
  run 2 partita profile --backend cpu --model in-tiny.json --timing fast
  expect_in err.txt "\-\-timing: expected gated, graph, host, step or exec, got 'fast'"
  run 2 partita profile --backend cpu --model in-tiny.json --embedding-sets 0
  expect_in err.txt "\-\-embedding-sets: expected a number above 0"
  run 2 partita profile --backend cpu --model in-tiny.json --stage-sets 3 --embedding-sets 2
  expect_in err.txt "2 sets of the embedding, fewer than the 3 sets of stages"
  run 2 partita profile --backend cpu --model in-tiny.json --stage-sets 0
  expect_in err.txt "\-\-stage-sets: expected a number above 0"
  run 2 partita profile --backend cpu --model in-tiny.json --stage-sets 2.5
  expect_in err.txt "\-\-stage-sets: expected a whole number"
  run 2 partita profile --backend cpu --model in-tiny.json --rounds 0
  expect_in err.txt "\-\-rounds: expected a number above 0, at most 256, got '0'"
  run 2 partita profile --backend cpu --model in-tiny.json --rounds 1.5
  expect_in err.txt "\-\-rounds: expected a whole number"
  run 2 partita profile --backend cpu --model in-tiny.json --round-ms 5ms
  expect_in err.txt "\-\-round-ms: expected a number above 0, at most 1000, got '5ms'"
  run 2 partita profile --backend cpu --model in-tiny.json --hold-ms -1
  expect_in err.txt "\-\-hold-ms: expected a number above 0, at most 10000, got '-1'"
  run 2 partita profile --backend cpu --model in-tiny.json --stage-sets 40 --rounds 7
  expect_in err.txt "7 timing rounds of 40 sets of stages"
  run 2 partita profile --backend tpu --model in-tiny.json
  expect_in err.txt "tpu"
  run 2 partita profile
  expect_in err.txt "\-\-model is required"
  run 0 partita profile --help
  expect_in out.txt "usage: partita profile"
  no_leftovers
  ;;
profile-compare)
  write_profile_model in-tiny.json
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1,2 --mbs 1,2 -o p.json
  run 0 partita profile --compare p.json p.json
  expect_in out.txt "0 differ by more than 3 %"
  expect_in out.txt "times of 0.5 ms or more: 0 differ by more than 3 %, largest difference 0.00 %"
  expect_in out.txt "tp 2 mbs 2 head backward"
  # the cpu never fuses the head: no head.fused written; a copy whose
  # tp-1 heads say fused is named so, entry by entry
  grep -q '"fused"' p.json && fail "a cpu profile says its head was fused"
  python3 - p.json in-fused.json <<'PY' || fail "could not mark the heads"
import json, sys
profile = json.load(open(sys.argv[1]))
for shape in profile["shapes"]:
    for point in shape["costs"]:
        if point["tp"] == 1:
            point["head"]["fused"] = True
json.dump(profile, open(sys.argv[2], "w"), indent=1)
PY
  run 0 partita profile --compare p.json in-fused.json
  expect_in out.txt "tp 1 mbs 2 head forward (fused in B only)"
  # the optimizer figure 1.5 times larger: one entry over (a figure made
  # larger by a digit put before it could pass the reader's sanity bound
  # on a slow machine)
  python3 - p.json in-perturbed.json <<'PY' || fail "could not perturb the profile"
import json, sys
profile = json.load(open(sys.argv[1]))
def scale(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "optimizer_s_per_param":
                node[key] = value * 1.5
            else:
                scale(value)
    elif isinstance(node, list):
        for item in node:
            scale(item)
scale(profile)
json.dump(profile, open(sys.argv[2], "w"), indent=1)
PY
  run 1 partita profile --compare p.json in-perturbed.json
  expect_in out.txt "1 differ by more than 3 %"
  expect_in out.txt "optimizer per parameter"
  run 0 partita profile --compare p.json in-perturbed.json --tolerance 100000
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1 --mbs 1 -o q.json
  run 1 partita profile --compare p.json q.json --tolerance 1000
  expect_in out.txt "only in A"
  run 2 partita profile --compare p.json in-missing.json
  expect_in err.txt "in-missing.json"
  run 2 partita profile --compare p.json
  expect_in err.txt "two profile files"
  ;;
plan-moved)
  # a plan written by `partita plan`, copied alone into another folder
  # (its model and cluster files gone), still loads everywhere
  mkdir in-src elsewhere
  cat >in-src/tiny.json <<JSON
{ "name": "tiny", "layers": 4, "hidden": 16, "heads": 2, "seq": 16, "vocab": 257 }
JSON
  cat >in-src/box.json <<JSON
{ "name": "one-box", "nodes": [
    { "name": "box", "gpu": "A100-FASOP", "gpus": 2,
      "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] }
JSON
  run 0 partita plan --model in-src/tiny.json --cluster in-src/box.json --gbs 4 --quiet -o in-src/plan.json
  run 0 partita estimate in-src/plan.json
  grep '^# step time' out.txt >in-step-before.txt
  cp in-src/plan.json elsewhere/plan.json
  rm -r in-src
  expect_in elsewhere/plan.json '"origin": {'
  expect_in elsewhere/plan.json '"model": "in-src/tiny.json"'
  run 0 partita estimate elsewhere/plan.json
  grep '^# step time' out.txt | cmp -s - in-step-before.txt ||
    fail "the moved plan estimates differently: $(grep '^# step time' out.txt)"
  run 0 partita report elsewhere/plan.json -o report-plan
  [ -s report-plan/report.md ] && [ -s report-plan/trace.json ] || fail "report of the moved plan missing"
  prep_corpus
  run 0 partita exec elsewhere/plan.json --data in-corpus --backend cpu --iters 2 -o run.json
  expect_in run.json '"name": "tiny"'
  run 0 partita report elsewhere/plan.json run.json -o report-run
  expect_in report-run/report.md "| step time |"
  # an older plan naming its files by path still resolves them against
  # its own folder
  cp "$source_root/docs/examples/plan-gpt2xl-hetero.json" elsewhere/old.json
  run 2 partita estimate elsewhere/old.json
  expect_in err.txt "elsewhere/old.json: model"
  ;;
plan-1024-gpus)
  # 128 nodes of 8 GPUs of four types (the node kinds of mixed-derived),
  # GPT-3 175B, tp 8 x pp 16 x dp 8: plan.json stays under 1 MB (the
  # timeline compact), the report draws a lane per stage
  python3 - "$clusters/mixed-derived.json" "$models/gpt-175b.json" <<'PY' || fail "could not write the plan"
import json, sys
cluster = json.load(open(sys.argv[1]))
for node in cluster["nodes"]:
    node["gpus"], node["count"] = 8, 32
cluster["name"] = "mixed-1024"
order = ["%s[%d]" % (kind, i) for kind in ("a100", "v100", "a10", "rtx3090")
         for i in range(32)]
plan = {"model": sys.argv[2], "cluster": cluster, "gbs": 1536, "mbs": 1,
        "tp": 8, "dp": 8, "pp": 16, "partition": "-".join(["6"] * 16),
        "node_order": order, "recompute": "full",
        "distributed_optimizer": True}
json.dump(plan, open("in-plan.json", "w"), indent=1)
PY
  run 0 partita estimate in-plan.json
  expect_in out.txt "1024 GPUs"
  run 0 partita estimate --json in-plan.json
  cp out.txt big-plan.json
  size=$(stat -c %s big-plan.json)
  [ "$size" -lt 1048576 ] || fail "plan.json of 1,024 GPUs is $size bytes"
  run 0 partita estimate big-plan.json
  run 0 partita report big-plan.json -o report
  for file in report.md trace.json timeline.png timeline.svg memory.svg; do
    [ -s "report/$file" ] || fail "report/$file missing or empty"
  done
  python3 - big-plan.json report/trace.json report/timeline.svg <<'PY' || fail "the big plan's outputs are not as expected"
import json, re, sys
plan = json.load(open(sys.argv[1]))
lanes = plan["estimate"]["timeline"]
assert [lane["ranks"] for lane in lanes] == [[64 * s, 64 * s + 63] for s in range(16)]
trace = json.load(open(sys.argv[2]))
assert trace["displayTimeUnit"] == "ms"
events = trace["traceEvents"]
complete = [e for e in events if e["ph"] == "X"]
for e in complete:
    assert {"name", "cat", "ts", "dur", "pid", "tid"} <= e.keys(), e
    assert e["dur"] >= 0 and e["ts"] >= 0
assert all(e["ph"] in ("X", "M") for e in events)
processes = {e["pid"] for e in events if e["name"] == "process_name"}
assert processes == set(range(16)), processes
# each kind keeps its first and last 8 events and counts those between
stage_events = sum(len(c["microbatch"]) + c.get("elided", {}).get("count", 0)
                   for lane in lanes for c in lane["events"].values())
fwd = lanes[0]["events"]["fwd"]
assert fwd["microbatch"] == list(range(8)) + list(range(184, 192)), fwd
assert fwd["elided"] == {"after": 8, "count": 176}, fwd["elided"]
assert len(complete) == stage_events, (len(complete), stage_events)
labels = set(re.findall(r"stage \d+ estimated", open(sys.argv[3]).read()))
assert len(labels) == 16, labels
PY
  size=$(stat -c %s report/trace.json)
  [ "$size" -lt 8388608 ] || fail "trace.json of 1,024 GPUs is $size bytes"
  # every event on request
  run 0 partita estimate --json --full-timeline in-plan.json
  python3 - out.txt <<'PY' || fail "the full timeline is not full"
import json, sys
fwd = json.load(open(sys.argv[1]))["estimate"]["timeline"][0]["events"]["fwd"]
assert fwd["microbatch"] == list(range(192)) and "elided" not in fwd, fwd
PY
  run 2 partita estimate --full-timeline in-plan.json
  expect_in err.txt "--full-timeline shapes the --json output"
  ;;
export-megatron)
  # every bundled plan becomes a script bash accepts
  for plan in "$source_root"/docs/examples/*.json; do
    name=$(basename "$plan" .json)
    run 0 partita export "$plan" --to megatron -o "launch-$name.sh"
    expect_in err.txt "wrote launch-$name.sh (Megatron-LM launch script"
    bash -n "launch-$name.sh" || fail "launch-$name.sh is not valid bash"
    [ ! -s out.txt ] || fail "export -o printed on standard output"
  done
  expect_in launch-plan-megatron-175b-a100.sh "    --tensor-model-parallel-size 8"
  expect_in launch-plan-megatron-175b-a100.sh "    --use-distributed-optimizer"
  expect_in launch-plan-megatron-175b-a100.sh "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  expect_in launch-plan-pp2-one-h200.sh "    --decoder-first-pipeline-num-layers 10"
  # standard output by default and with -o -
  run 0 partita export "$source_root/docs/examples/plan-gpt2xl-hetero.json" --to megatron
  cp out.txt stdout.sh
  run 0 partita export "$source_root/docs/examples/plan-gpt2xl-hetero.json" --to megatron -o -
  cmp -s out.txt stdout.sh || fail "-o - differs from standard output"
  cmp -s stdout.sh launch-plan-gpt2xl-hetero.sh || fail "-o FILE differs from standard output"
  # the launch itself, with stand-ins for torchrun and srun that print
  # what they were given
  mkdir bin
  printf '#!/bin/sh\necho "torchrun $*"\n' >bin/torchrun
  printf '#!/bin/sh\necho "srun $*"; cat "$SLURM_HOSTFILE"; echo "WORLD_SIZE=$WORLD_SIZE"\n' >bin/srun
  chmod +x bin/torchrun bin/srun
  PATH="$work/bin:$PATH" NODE_RANK=7 MEGATRON=/opt/megatron run 0 bash launch-plan-gpt2xl-hetero.sh --train-iters 20
  expect_in out.txt "torchrun --nnodes 8 --node-rank 7 --nproc-per-node 4 --master-addr a10-0"
  expect_in out.txt "/opt/megatron/pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 --pipeline-model-parallel-layout E|t\*11|t\*8|t\*8|t\*8|t\*8|t\*5|L"
  expect_in out.txt "--global-batch-size 64 --bf16 --log-interval 10 --log-throughput --train-iters 20"
  PATH="$work/bin:$PATH" LAUNCHER=srun run 0 bash launch-plan-gpt2xl-hetero.sh
  expect_in out.txt "srun --ntasks 32 --distribution arbitrary"
  [ "$(grep -c '^a10-' out.txt)" = 28 ] || fail "expected 28 tasks on the A10 hosts"
  [ "$(grep -c '^a100-0$' out.txt)" = 4 ] || fail "expected 4 tasks on a100-0"
  [ "$(grep -n '^a100-0$' out.txt | head -1 | cut -d: -f1)" -gt "$(grep -n '^a10-6$' out.txt | tail -1 | cut -d: -f1)" ] \
    || fail "the A100 host is not last"
  expect_in out.txt "WORLD_SIZE=32"
  PATH="$work/bin:$PATH" run 1 bash launch-plan-gpt2xl-hetero.sh
  expect_in err.txt "set NODE_RANK"
  rm -rf bin launch-*.sh stdout.sh
  no_leftovers
  ;;
export-deepspeed)
  for plan in "$source_root"/docs/examples/*.json; do
    name=$(basename "$plan" .json)
    run 0 partita export "$plan" --to deepspeed -o "ds-$name.json"
    expect_in err.txt "wrote ds-$name.json (DeepSpeed ds_config"
  done
  python3 - <<'PY' || fail "unexpected ds_config"
import json
big = json.load(open("ds-plan-megatron-175b-a100.json"))
assert big["train_batch_size"] == 1536, big
assert big["train_micro_batch_size_per_gpu"] == 1
assert big["gradient_accumulation_steps"] == 256
assert big["zero_optimization"]["stage"] == 1
assert big["bf16"]["enabled"] is True
assert big["pipeline"]["activation_checkpoint_interval"] == 1
assert len(big["partita"]["hostfile"]) == 96
assert big["partita"]["hostfile"][95] == "a100-95 slots=4"
het = json.load(open("ds-plan-gpt2xl-hetero.json"))
assert het["partita"]["pipeline"]["parts"] == [0, 1, 12, 20, 28, 36, 44, 49, 51]
assert het["partita"]["hostfile"][-1] == "a100-0 slots=4"
assert het["zero_optimization"]["stage"] == 0
one = json.load(open("ds-plan-tiny-cpu.json"))
assert "pipeline" not in one and one["gradient_accumulation_steps"] == 2
PY
  rm -f ds-*.json
  no_leftovers
  ;;
export-bad)
  hetero_plan="$source_root/docs/examples/plan-gpt2xl-hetero.json"
  run 2 partita export "$hetero_plan"
  expect_in err.txt "--to"
  run 2 partita export "$hetero_plan" --to torchtitan
  expect_in err.txt "expected megatron or deepspeed, got 'torchtitan'"
  run 2 partita export --to megatron
  run 2 partita export in-missing.json --to megatron -o out.sh
  expect_in err.txt "in-missing.json"
  echo '{ "gbs": 8, ' >in-truncated.json
  run 2 partita export in-truncated.json --to deepspeed -o out.json
  expect_in err.txt "in-truncated.json"
  # 3 heads cannot be split over tp 2: Megatron-LM would stop at start
  write_layout_plan in-odd.json 1 2 1 2
  sed -i 's/"hidden": 16, "heads": 2/"hidden": 48, "heads": 3/' in-odd.json
  run 2 partita export in-odd.json --to megatron -o out.sh
  expect_in err.txt "in-odd.json: plan.tp: Megatron-LM needs the 3 attention heads divisible by tp 2"
  [ "$(wc -l <err.txt)" = 1 ] || fail "expected one line"
  run 2 partita export "$hetero_plan" --to megatron -o /nonexistent-dir/launch.sh
  expect_in err.txt "/nonexistent-dir/launch.sh"
  # the output is checked before the plan is read (issue 18, item 3)
  run 2 partita export in-missing.json --to megatron -o /nonexistent-dir/launch.sh
  expect_in err.txt "/nonexistent-dir/launch.sh: cannot write there"
  # an existing file is replaced whole or left alone
  echo "keep me" >out.sh
  run 2 partita export in-odd.json --to megatron -o out.sh
  [ "$(cat out.sh)" = "keep me" ] || fail "a refused export touched out.sh"
  rm -f out.sh
  run 0 partita export --help
  expect_in out.txt "usage: partita export"
  no_leftovers
  ;;
report-megatron-log)
  # the README's example: plan on a bundled cluster, export to Megatron-LM,
  # compare the bundled synthetic log with the estimate
  synthetic_log="$source_root/docs/examples/megatron-gpt2xl-hetero.synthetic.log"
  head -1 "$synthetic_log" | grep -q "SYNTHETIC" || fail "the bundled log does not say it is synthetic"
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster hetero --quiet -o plan.json
  run 0 partita export plan.json --to megatron -o launch.sh
  expect_in launch.sh "    --pipeline-model-parallel-size 8"
  run 0 partita report plan.json --megatron-log "$synthetic_log" -o report
  for file in report.md trace.json timeline.png stages.png memory.png step_time.png step_time.svg; do
    [ -s "report/$file" ] || fail "report/$file missing or empty"
  done
  if grep -q warning err.txt; then fail "unexpected warning: $(cat err.txt)"; fi
  expect_in report/report.md "backend megatron-lm, 9 timed log lines"
  expect_in report/report.md "Megatron-LM log: 10 iteration lines (the last of iteration 100 of 100)"
  expect_in report/report.md "9 printed arguments that match the plan"
  expect_in report/report.md "the peak of the 8 of 32 ranks"
  expect_in report/report.md "| step time | "
  expect_in report/report.md "| 1.13 s |"
  # the median of the nine kept lines, 1130.5 ms, as tokens per second
  expect_in report/report.md "| 57971 tokens/s |"
  expect_in report/report.md "| 0 | 0-3 | A100-FASOP |"
  # --warmup-iterations 0 keeps the first line; 50 keeps five
  run 0 partita report plan.json --megatron-log "$synthetic_log" --warmup-iterations 50 -o report50
  expect_in report50/report.md "5 timed log lines"
  expect_in report50/report.md "up to iteration 50, are left out"
  rm -rf report report50 plan.json launch.sh
  no_leftovers
  ;;
report-deepspeed-log)
  cat >in-ds.log <<'LOG'
[2026-08-24 10:00:00,001] [INFO] [engine.py:100:__init__] SYNTHETIC log for the tests
steps: 10 loss: 10.2345 iter time (s): 1.910 samples/sec: 33.508
epoch=0/micro_step=160/global_step=10, RunningAvgSamplesPerSec=33.1, CurrSamplesPerSec=33.5, MemAllocated=3.21GB, MaxMemAllocated=9.87GB
steps: 20 loss: 9.0123 iter time (s): 1.130 samples/sec: 56.637
epoch=0/micro_step=320/global_step=20, RunningAvgSamplesPerSec=50.1, CurrSamplesPerSec=56.6, MemAllocated=3.21GB, MaxMemAllocated=10.12GB
steps: 30 loss: 8.1234 iter time (s): 1.128 samples/sec: 56.738
LOG
  hetero_plan="$source_root/docs/examples/plan-gpt2xl-hetero.json"
  run 0 partita report "$hetero_plan" --deepspeed-log in-ds.log -o report
  expect_in report/report.md "backend deepspeed, 2 timed log lines"
  expect_in report/report.md "3 pipeline-engine step lines"
  expect_in report/report.md "| 1.13 s |"
  [ -s report/memory.png ] && [ -s report/step_time.png ] || fail "charts missing"
  rm -rf report
  no_leftovers
  ;;
report-log-bad)
  synthetic_log="$source_root/docs/examples/megatron-gpt2xl-hetero.synthetic.log"
  hetero_plan="$source_root/docs/examples/plan-gpt2xl-hetero.json"
  # a log cut off inside an iteration line
  head -c 3600 "$synthetic_log" >in-cut.log
  run 2 partita report "$hetero_plan" --megatron-log in-cut.log -o out
  expect_in err.txt "in-cut.log:40: the log ends inside this iteration line (truncated)"
  [ "$(wc -l <err.txt)" = 1 ] || fail "expected one line"
  [ ! -e out ] || fail "a bad log left a report folder"
  sed 's/elapsed time per iteration (ms): 1135.2/elapsed time per iteration (ms): 1,135.2/' \
    "$synthetic_log" >in-malformed.log
  run 2 partita report "$hetero_plan" --megatron-log in-malformed.log -o out
  expect_in err.txt "in-malformed.log:42: elapsed time per iteration (ms): expected a number, got '1,135.2'"
  sed 's/tensor_model_parallel_size ...................... 1/tensor_model_parallel_size ...................... 2/' \
    "$synthetic_log" >in-other.log
  run 2 partita report "$hetero_plan" --megatron-log in-other.log -o out
  expect_in err.txt "in-other.log:23: tensor_model_parallel_size is 2, the plan's tp is 1"
  echo "no iterations here" >in-empty.log
  run 2 partita report "$hetero_plan" --megatron-log in-empty.log -o out
  expect_in err.txt "in-empty.log: no Megatron-LM iteration line"
  run 2 partita report "$hetero_plan" --deepspeed-log "$synthetic_log" -o out
  expect_in err.txt "no DeepSpeed step line"
  run 2 partita report "$hetero_plan" --megatron-log in-missing.log -o out
  expect_in err.txt "in-missing.log"
  run 2 partita report "$hetero_plan" --megatron-log "$synthetic_log" --warmup-iterations 100 -o out
  expect_in err.txt "all 10 timed lines are warm-up"
  run 2 partita report "$hetero_plan" --megatron-log "$synthetic_log" --warmup-iterations -3 -o out
  expect_in err.txt "--warmup-iterations: expected an iteration number"
  run 2 partita report "$hetero_plan" --warmup-iterations 3 -o out
  expect_in err.txt "--warmup-iterations needs --megatron-log or --deepspeed-log"
  run 2 partita report "$hetero_plan" "$source_root/tests/data/report/run.json" --megatron-log "$synthetic_log" -o out
  expect_in err.txt "not both"
  run 2 partita report "$hetero_plan" --megatron-log a.log --deepspeed-log b.log -o out
  expect_in err.txt "give one training log"
  [ ! -e out ] || fail "a refused report left a folder"
  no_leftovers
  ;;
no-gpu-stack)
  # plan, estimate, report, prep and profile --derive/--compare run in
  # `partita`, which must never load the CUDA runtime, cuBLAS, NCCL or
  # MPI (they cost ~100 ms and ~200 MB at start); exec and the measuring
  # profile run in partita-exec, beside it (cli/hand_over.c).
  gpu_stack='libcuda|libcudart|libcublas|libnccl|libmpi|libopen-pal|libopen-rte|libpmix'
  command -v ldd >/dev/null || fail "ldd is missing"
  plan_command="plan --model gpt2-xl --gbs 64 --cluster $clusters/hetero.json --quiet -o p.json"
  if ! ldd "$partita_binary" >ldd.txt 2>&1; then
    # linked statically (meson's static_partita): no library is mapped
    # at all; it still plans and estimates
    expect_in ldd.txt "not a dynamic executable"
    for command in "$plan_command" "estimate p.json"; do
      # shellcheck disable=SC2086 # the command's words
      partita $command >out.txt 2>err.txt \
        || fail "partita $command failed: $(cat err.txt)"
    done
  else
    expect_in ldd.txt "libjansson"
    if grep -E "$gpu_stack" ldd.txt; then fail "partita links the GPU stack"; fi
    # and at run time, libraries opened later included (the loader's own
    # list of every library it maps)
    for command in "$plan_command" "estimate p.json"; do
      # shellcheck disable=SC2086 # the command's words
      LD_DEBUG=libs LD_DEBUG_OUTPUT="$work/loader" partita $command >out.txt 2>err.txt \
        || fail "partita $command failed: $(cat err.txt)"
      cat "$work"/loader.* >ld.txt; rm -f "$work"/loader.*
      expect_in ld.txt "libjansson"
      if grep -E "$gpu_stack" ld.txt; then fail "partita $command loaded the GPU stack"; fi
    done
  fi
  # partita-exec is looked for beside partita: without it, one clear line
  cp "$partita_binary" ./partita-alone
  run 1 ./partita-alone exec p.json --data x
  expect_in err.txt "partita exec: cannot find partita-exec"
  rm -f ./partita-alone p.json ld.txt ldd.txt
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
