#!/usr/bin/env bash
# End-to-end tests of the partita command on the bundled files.
# usage: e2e.sh PARTITA CASE   (run by meson, one test per case)
set -u
partita="$1"
case_name="$2"
source_root="${PARTITA_SOURCE:?PARTITA_SOURCE must be set}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

fail() { echo "FAIL [$case_name]: $*"; exit 1; }
# run EXPECTED_STATUS CMD...: runs, keeps output in out.txt / err.txt
run() {
  local expected="$1"; shift
  "$@" >out.txt 2>err.txt
  local status=$?
  if [ "$status" != "$expected" ]; then
    echo "--- stdout"; cat out.txt; echo "--- stderr"; cat err.txt
    fail "'$*' exited $status, expected $expected"
  fi
}
expect_in() { grep -q -- "$2" "$1" || { cat "$1"; fail "'$2' not in $1"; }; }
no_leftovers() {
  local left
  left=$(ls -A | grep -v -e '^out.txt$' -e '^err.txt$' -e '^in' || true)
  [ -z "$left" ] || fail "files left behind: $left"
}
models="$source_root/models"
clusters="$source_root/clusters"

# The first data row of the ranking table: its step time column.
best_step_time() { grep -m1 '^ *1 ' out.txt | awk '{print $(NF-5)}'; }

write_small_pool() {
  cat >in-pool.json <<JSON
{ "name": "small-pool",
  "nodes": [
    { "name": "a100", "count": 2, "gpu": "A100-FASOP", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 },
      "inter_node": { "bandwidth_Gbps": 40, "latency_us": 20 },
      "price_per_hour": 32.7726 },
    { "name": "a10", "count": 2, "gpu": "A10-FASOP", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 },
      "inter_node": { "bandwidth_Gbps": 40, "latency_us": 20 },
      "price_per_hour": 8.144 } ] }
JSON
}

case "$case_name" in
help)
  run 0 "$partita" --help;           expect_in out.txt "usage: partita"
  run 0 "$partita" plan --help;      expect_in out.txt "--gbs"
  run 0 "$partita" estimate --help;  expect_in out.txt "--json"
  run 0 "$partita" --version;        expect_in out.txt "partita"
  run 2 "$partita" frobnicate;       expect_in err.txt "unknown command"
  run 2 "$partita"
  ;;
plan-hetero)
  run 0 "$partita" plan --model gpt2-xl --gbs 64 --cluster "$clusters/hetero.json" --quiet
  expect_in out.txt "searched"
  expect_in out.txt "partition"
  [ -s plan.json ] || fail "plan.json not written"
  expect_in plan.json '"format": "partita-plan/1"'
  expect_in plan.json '"events"'
  expect_in plan.json '"alternatives"'
  run 0 "$partita" estimate plan.json
  expect_in out.txt "step time"
  ;;
plan-default-cluster)
  # the default cluster is the bundled hetero.json
  run 0 "$partita" plan --model "$models/gpt2-xl.json" --gbs 64 -o here.json --quiet
  expect_in out.txt "cluster hetero"
  [ -s here.json ] || fail "here.json not written"
  ;;
plan-ilp-agrees)
  run 0 "$partita" plan --model gpt2-xl --gbs 64 --solver dp --quiet -o dp.json
  dp=$(best_step_time)
  run 0 "$partita" plan --model gpt2-xl --gbs 64 --solver ilp --quiet -o ilp.json
  ilp=$(best_step_time)
  [ -n "$dp" ] && [ "$dp" = "$ilp" ] || fail "dp best $dp s, ilp best $ilp s"
  run 0 "$partita" plan --model gpt2-xl --gbs 64 --solver greedy --quiet -o greedy.json
  greedy=$(best_step_time)
  awk -v a="$dp" -v b="$greedy" 'BEGIN { exit !(a <= b + 1e-4) }' \
    || fail "exact $dp s slower than greedy $greedy s"
  ;;
plan-bert)
  run 0 "$partita" plan --model bert-large --gbs 256 --cluster fasop-bert --quiet
  expect_in out.txt "bert"
  ;;
plan-cost)
  run 0 "$partita" plan --model gpt2-xl --gbs 64 --objective cost --quiet
  expect_in out.txt "objective \$ per step"
  ;;
plan-pareto)
  write_small_pool
  run 0 "$partita" plan --model gpt2-xl --gbs 64 --cluster in-pool.json --pareto --quiet -o front.json
  expect_in out.txt "front"
  expect_in front.json '"pareto"'
  run 0 "$partita" estimate front.json
  ;;
estimate-hand-plan)
  run 0 "$partita" estimate "$source_root/docs/examples/plan-gpt2xl-hetero.json"
  expect_in out.txt "0-11-8-8-8-8-5-0"
  expect_in out.txt "forward"
  ;;
estimate-json)
  cp "$source_root/docs/examples/plan-gpt2xl-hetero.json" in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 0 "$partita" estimate --json in-plan.json
  expect_in out.txt '"estimate"'
  expect_in out.txt '"events"'
  expect_in out.txt '"kind": "fwd"'
  cp out.txt in-estimated.json
  run 0 "$partita" estimate in-estimated.json
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
  run 0 "$partita" estimate in-inline.json
  expect_in out.txt "3-1"
  ;;
bad-json)
  printf '{ "model": "x", ' >in-bad.json
  run 2 "$partita" estimate in-bad.json
  expect_in err.txt "in-bad.json"
  ;;
bad-gpu)
  sed 's/"A10-FASOP"/"B300-IMAGINARY"/' "$clusters/hetero.json" >in-cluster.json
  run 2 "$partita" plan --model gpt2-xl --gbs 64 --cluster in-cluster.json --quiet
  expect_in err.txt "B300-IMAGINARY"
  no_leftovers
  ;;
bad-zero-gpus)
  sed 's/"gpus": 4/"gpus": 0/' "$clusters/hetero.json" >in-cluster.json
  run 2 "$partita" plan --model gpt2-xl --gbs 64 --cluster in-cluster.json --quiet
  expect_in err.txt "gpus"
  no_leftovers
  ;;
bad-no-fit)
  run 2 "$partita" plan --model gpt-175b --gbs 64 --quiet
  expect_in err.txt "no plan fits"
  expect_in err.txt "GiB"
  no_leftovers
  ;;
bad-partition)
  sed 's/0-11-8-8-8-8-5-0/0-11-8-8-8-8-5-1/' \
    "$source_root/docs/examples/plan-gpt2xl-hetero.json" >in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 2 "$partita" estimate in-plan.json
  expect_in err.txt "partition"
  ;;
bad-gbs)
  sed 's/"gbs": 64/"gbs": 63/' \
    "$source_root/docs/examples/plan-gpt2xl-hetero.json" >in-plan.json
  sed -i "s|\.\./\.\./|$source_root/|g" in-plan.json
  run 2 "$partita" estimate in-plan.json
  expect_in err.txt "gbs"
  ;;
bad-arguments)
  run 2 "$partita" plan --gbs 64
  expect_in err.txt "required"
  run 2 "$partita" plan --model gpt2-xl --gbs -4
  run 2 "$partita" plan --model gpt2-xl --gbs 64 --solver magic
  expect_in err.txt "magic"
  run 2 "$partita" plan --model no-such-model --gbs 64
  expect_in err.txt "no-such-model"
  run 2 "$partita" estimate
  run 2 "$partita" estimate /nonexistent/plan.json
  expect_in err.txt "/nonexistent/plan.json"
  no_leftovers
  ;;
output-unwritable)
  run 1 "$partita" plan --model gpt2-xl --gbs 64 --quiet -o /nonexistent-dir/plan.json
  expect_in err.txt "/nonexistent-dir/plan.json"
  ;;
prep)
  run 0 "$partita" prep "$source_root/data/corpus.txt" -o corpus
  expect_in out.txt "documents"
  [ -s corpus.bin ] && [ -s corpus.idx ] || fail "corpus.bin/.idx not written"
  printf '{"text": "hello"}\n{"text": "world"}\n' >in.jsonl
  run 0 "$partita" prep --jsonl in.jsonl -o small
  expect_in out.txt "2 documents"
  printf '{"text": "hello"}\n{"txt": "world"}\n' >in-bad.jsonl
  run 2 "$partita" prep --jsonl in-bad.jsonl -o bad
  expect_in err.txt "in-bad.jsonl:2"
  [ ! -e bad.bin ] && [ ! -e bad.idx ] || fail "partial output left behind"
  run 2 "$partita" prep /nonexistent.txt -o nothing
  run 2 "$partita" prep "$source_root/data/corpus.txt"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
