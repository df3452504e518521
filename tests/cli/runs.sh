#!/usr/bin/env bash
# End-to-end tests of issue 39 through the partita command: a plan's
# runtime fields (runtime, attention, overlap_grad_reduce, tf32), runs
# tables and plan=log pairs estimated (`estimate --runs`) and fitted
# (`profile --from-logs`), a measured profile's own roofline
# (`profile --fit-roofline`), Megatron's selective recompute and
# --overlap-param-gather, and the
# clusters' NICs and type links; e2e.sh's
# conventions, a file of its own.
# usage: runs.sh PARTITA CASE   (run by meson, one test per case)
set -u
# fail, run, expect_in; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

write_table() {
  cat >in-runs.csv <<'CSV'
id,gbs,mbs,hidden,heads,layers,seq,tp,dp,pp,measured_ms
small,64,4,1024,16,12,1024,1,8,1,400
wide,64,2,2048,16,12,1024,2,4,1,900
piped,64,2,2048,16,12,1024,2,2,2,1100
CSV
  cat >in-cluster.json <<'JSON'
{ "name": "a100s", "nodes": [ { "name": "a100", "count": 4, "gpu": "A100-80GB",
  "gpus": 8, "intra_node": { "bandwidth_GBps": 229, "latency_us": 5 },
  "inter_node": { "bandwidth_Gbps": 100, "latency_us": 20 } } ] }
JSON
}

case "$case_name" in
runs-estimate)
  # every run of a table estimated, its error and the summary; --where
  write_table
  run 0 partita estimate --runs in-runs.csv --cluster in-cluster.json --runtime megatron --attention unfused
  expect_in out.txt "3 runs, profile A100-80GB"
  expect_in out.txt "  piped "
  expect_in out.txt "# mean |error|"
  expect_in out.txt "0 refused"
  run 0 partita estimate --runs in-runs.csv --cluster in-cluster.json --where id=wide
  expect_in out.txt "1 runs"
  ;;
runs-fit)
  # a derived profile calibrated on the table: written atomically, its
  # provenance keeps the transferred roofline
  write_table
  run 0 partita profile --from-logs in-runs.csv --cluster in-cluster.json --base "$source_root/profiles/A100-80GB.json" -o cal.json
  expect_in out.txt "# calibrated roofline: GEMM efficiency"
  expect_in out.txt "# wrote cal.json"
  expect_in cal.json '"transferred_roofline"'
  expect_in cal.json '"run_count": 3'
  run 0 partita estimate --runs in-runs.csv --cluster in-cluster.json --profile cal.json
  ;;
runs-log)
  # a plan and the Megatron-LM log of its launch as one run
  cat >in-plan.json <<'JSON'
{ "format": "partita-plan/1",
  "model": { "name": "gpt2-xl", "layers": 48, "hidden": 1600, "heads": 25,
             "ffn_hidden": 6400, "seq": 1024, "vocab": 50257,
             "tied_embeddings": true },
  "cluster": { "name": "a10x8", "nodes": [ { "name": "a10", "count": 8,
      "gpu": "A10", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 },
      "inter_node": { "bandwidth_Gbps": 40, "latency_us": 20 } } ] },
  "gbs": 64, "mbs": 1, "tp": 1, "dp": 4, "pp": 8,
  "partition": "8-6-6-6-6-6-5-5" }
JSON
  log="$source_root/docs/examples/megatron-gpt2xl-hetero.synthetic.log"
  run 0 partita estimate --runs "in-plan.json=$log"
  expect_in out.txt "megatron-gpt2xl-hetero.synthetic.log"
  expect_in out.txt "1.1305"
  run 0 partita profile --from-logs "in-plan.json=$log" -o a10.json
  expect_in a10.json '"calibrated_on"'
  ;;
runs-bad)
  # one line naming the file, the line and the reason; exit 2; no output
  write_table
  printf 'id,gbs,mbs,hidden,heads,layers,seq,tp,dp,pp,measured_ms\nx,64,four,1024,16,12,1024,1,8,1,400\n' >in-bad.csv
  run 2 partita estimate --runs in-bad.csv --cluster in-cluster.json
  expect_in err.txt "in-bad.csv:2: column mbs: 'four' is not a number"
  printf 'hidden,heads\n1,2\n' >in-short.csv
  run 2 partita estimate --runs in-short.csv --cluster in-cluster.json
  expect_in err.txt "in-short.csv: the header has no column layers"
  run 2 partita estimate --runs in-runs.csv
  expect_in err.txt "needs the cluster its runs ran on (--cluster FILE)"
  run 2 partita estimate --runs in-runs.csv --cluster in-cluster.json --where id=none
  expect_in err.txt "no run matches the filter"
  printf 'id,gbs,mbs,hidden,heads,layers,seq,tp,dp,pp,measured_ms\nx,60,4,1024,16,12,1024,1,8,1,400\n' >in-gbs.csv
  run 2 partita estimate --runs in-gbs.csv --cluster in-cluster.json
  expect_in err.txt "in-gbs.csv:2:"
  expect_in err.txt "gbs"
  run 2 partita profile --from-logs in-runs.csv --cluster in-cluster.json -o /nonexistent-dir/x.json
  [ ! -e /nonexistent-dir/x.json ] || fail "wrote into a missing folder"
  ;;
runtime-fields)
  # a plan priced for Megatron-LM: estimate says so, exec refuses it, the
  # fields are written back; tf32 only with fp32; NICs and type links
  write_table
  cat >in-plan.json <<'JSON'
{ "format": "partita-plan/1",
  "model": { "name": "m", "layers": 12, "hidden": 2048, "heads": 16, "seq": 1024, "vocab": 50257 },
  "cluster": { "name": "two", "nodes": [
      { "name": "a100", "count": 2, "gpu": "A100-80GB", "gpus": 8,
        "intra_node": { "bandwidth_GBps": 229, "latency_us": 5 },
        "inter_node": { "bandwidth_Gbps": 400, "latency_us": 10, "nics": 2 } } ],
    "links": [ { "between": ["a100", "a100"], "bandwidth_Gbps": 50, "latency_us": 30 } ] },
  "gbs": 32, "mbs": 2, "tp": 16, "dp": 1, "pp": 1,
  "runtime": "megatron", "attention": "unfused", "precision": "fp32", "tf32": true }
JSON
  run 0 partita estimate in-plan.json --json
  expect_in out.txt '"runtime": "megatron"'
  expect_in out.txt '"attention": "unfused"'
  expect_in out.txt '"tf32": true'
  expect_in out.txt '"nics": 2'
  expect_in out.txt '"between"'
  run 0 partita estimate in-plan.json
  expect_in out.txt "priced for the Megatron-LM runtime: unfused attention"
  sed 's/"precision": "fp32", //' in-plan.json >in-tf32.json
  run 2 partita estimate in-tf32.json
  expect_in err.txt "tf32: only with precision fp32"
  run 2 partita exec in-plan.json --data nothing --iters 1 -o run.json
  expect_in err.txt "runtime: megatron"
  [ ! -e run.json ] || fail "exec wrote a run of a plan it refused"
  ;;
selective-recompute)
  # Megatron's selective recompute: kept activations fall, the backward
  # grows, export writes the flag, exec refuses it, the field round-trips
  for how in none selective full; do
    cat >in-$how.json <<JSON
{ "format": "partita-plan/1",
  "model": { "name": "m", "layers": 12, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 50257 },
  "cluster": { "name": "one", "nodes": [ { "name": "a100", "count": 1, "gpu": "A100-80GB", "gpus": 8,
        "intra_node": { "bandwidth_GBps": 229, "latency_us": 5 } } ] },
  "gbs": 64, "mbs": 4, "tp": 1, "dp": 8, "pp": 1, "precision": "fp16",
  "runtime": "megatron", "attention": "unfused", "recompute": "$how" }
JSON
    run 0 partita estimate in-$how.json --json
    cp out.txt est-$how.json
  done
  python3 - <<'PY' || fail "selective recompute is not priced between none and full"
import json
e = {h: json.load(open('est-%s.json' % h))['estimate']['stages'][0]
     for h in ('none', 'selective', 'full')}
mem = {h: e[h]['peak_memory_gib'] for h in e}
bwd = {h: e[h]['backward_s'] for h in e}
assert mem['full'] < mem['selective'] < mem['none'], mem
assert bwd['none'] < bwd['selective'] < bwd['full'], bwd
PY
  expect_in est-selective.json '"recompute": "selective"'
  run 0 partita export in-selective.json --to megatron -o launch.sh
  expect_in launch.sh "--recompute-granularity selective"
  sed 's/"runtime": "megatron", "attention": "unfused", //' in-selective.json >in-partita.json
  run 2 partita exec in-partita.json --data nothing --iters 1 -o run.json
  expect_in err.txt "recompute: selective"
  [ ! -e run.json ] || fail "exec wrote a run of a plan it refused"
  ;;
overlap-param-gather)
  # Megatron's --overlap-param-gather hides the distributed optimizer's
  # all-gather under the next forward; refused without it or under Partita
  for o in false true; do
    cat >in-$o.json <<JSON
{ "format": "partita-plan/1",
  "model": { "name": "m", "layers": 12, "hidden": 2048, "heads": 16, "seq": 1024, "vocab": 50257 },
  "cluster": { "name": "four", "nodes": [ { "name": "a100", "count": 4, "gpu": "A100-80GB", "gpus": 8,
        "intra_node": { "bandwidth_GBps": 229, "latency_us": 5 },
        "inter_node": { "bandwidth_Gbps": 100, "latency_us": 20 } } ] },
  "gbs": 128, "mbs": 4, "tp": 1, "dp": 32, "pp": 1, "precision": "fp16",
  "runtime": "megatron", "distributed_optimizer": true, "overlap_param_gather": $o }
JSON
    run 0 partita estimate in-$o.json --json
    cp out.txt est-$o.json
  done
  python3 - <<'PY' || fail "the overlapped gather does not shorten the step"
import json
t = {o: json.load(open('est-%s.json' % o))['estimate']['step_time_s']
     for o in ('false', 'true')}
assert t['true'] < t['false'], t
PY
  expect_in est-true.json '"overlap_param_gather": true'
  run 0 partita export in-true.json --to megatron -o launch.sh
  expect_in launch.sh "--overlap-param-gather"
  sed 's/"distributed_optimizer": true, //' in-true.json >in-bad.json
  run 2 partita estimate in-bad.json
  expect_in err.txt "overlap_param_gather: only with distributed_optimizer"
  ;;
fit-roofline)
  # a measured profile gains a roofline fitted on its own times, its
  # measured times untouched; a shape it lacks is then priced by it
  cp "$source_root/profiles/H200.json" in-h200.json
  cp in-h200.json before.json
  run 0 partita profile --fit-roofline in-h200.json -o out-h200.json
  expect_in out.txt "roofline fitted on"
  cmp -s in-h200.json before.json || fail "the source profile changed"
  expect_in out-h200.json '"roofline_fit"'
  expect_in out-h200.json '"gemm_efficiency"'
  run 0 partita profile --fit-roofline -o in-h200.json
  expect_in in-h200.json '"roofline_fit"'
  # a derived profile already has one; -o is required
  run 2 partita profile --fit-roofline "$source_root/profiles/A10.json" -o a10.json
  expect_in err.txt 'source is "derived"'
  [ ! -e a10.json ] || fail "wrote a profile it refused"
  run 2 partita profile --fit-roofline in-h200.json
  expect_in err.txt "needs -o"
  mkdir -p prof && cp out-h200.json prof/H200.json
  run 0 partita estimate "$source_root/bench/accuracy/plans-shapes/05-13b-8l.json" --profiles prof
  expect_in out.txt "priced by its roofline"
  expect_in out.txt "fitted on its own measured times"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo "ok [$case_name]"
