#!/usr/bin/env bash
# End-to-end tests of DeepSpeed's levers (issue 21: ZeRO-2, ZeRO-3,
# optimizer offload) through the partita command: plan, estimate, export
# and exec on the cpu backend; e2e.sh's conventions, a file of its own.
# usage: zero.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in, write_layout_plan, prep_corpus; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

case "$case_name" in
plan-zero-levers)
  # DeepSpeed's levers: searched only when nothing fits without them (GPT-2
  # XL on one A10: optimizer offload), always on request; plan.json
  # records them, estimate prices and names them, export writes them for
  # DeepSpeed and refuses them for Megatron; bad values are refused
  cat >in-one-a10.json <<'JSON'
{ "name": "one-a10", "nodes": [ { "name": "a10", "gpu": "A10-FASOP", "gpus": 1,
  "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 } } ] }
JSON
  run 2 partita plan --model gpt2-xl --cluster in-one-a10.json --gbs 8 --zero-levers never -o never.json
  expect_in err.txt "no plan fits gpt2-xl"
  [ ! -e never.json ] || fail "a plan that does not fit was written"
  run 0 partita plan --model gpt2-xl --cluster in-one-a10.json --gbs 8 -o offload.json
  expect_in out.txt "ZeRO-2, ZeRO-3 and optimizer offload searched too"
  expect_in out.txt " off "
  expect_in offload.json '"offload_optimizer": true'
  run 0 partita estimate offload.json
  expect_in out.txt "optimizer offload on (host memory "
  expect_in out.txt "GiB per GPU)"
  # the A10's profile measured no host rates: the cost model's constants
  expect_in out.txt "# offload on A10-FASOP: host link 25 GB/s each way (assumed), CPU AdamW 1.08e+09 parameters/s per GPU (calibrated"
  # the H200's did (docs/cost-model.md, section 11)
  run 0 partita estimate "$source_root/bench/accuracy/plans-1gpu/22-whole-350m-mbs4-offload.json"
  expect_in out.txt "# offload on H200: host link 53 GB/s each way (measured by its profile), CPU AdamW 1.06e+09 parameters/s per GPU (measured on its profile's host)"
  run 0 partita plan --model gpt2-xl --cluster hetero --gbs 64 --zero-levers always --no-interleave -o zero3.json
  expect_in out.txt " zero3"
  expect_in out.txt "the best plan's ZeRO-3 memory is the shards and unit buffers partita exec holds"
  expect_in zero3.json '"zero": 3'
  expect_in zero3.json '"distributed_optimizer": true'
  run 0 partita estimate zero3.json -o again.json
  expect_in again.json '"zero": 3'
  run 0 partita export zero3.json --to deepspeed -o ds.json
  python3 - ds.json <<'PY' || fail "the ds_config does not hold ZeRO-3"
import json, sys
assert json.load(open(sys.argv[1]))["zero_optimization"]["stage"] == 3
PY
  run 0 partita export offload.json --to deepspeed -o ds-offload.json
  expect_in ds-offload.json '"device": "cpu"'
  cat >in-pp-zero2.json <<JSON
{ "model": "$source_root/models/gpt2-xl.json",
  "cluster": "$source_root/clusters/hetero.json",
  "gbs": 64, "mbs": 1, "tp": 1, "dp": 4, "pp": 8, "zero": 2 }
JSON
  run 0 partita export in-pp-zero2.json --to deepspeed -o ds-pp.json
  expect_in ds-pp.json "pipeline engine runs ZeRO stage 1 at most"
  # (a hand-written ZeRO-3 plan: the searched one may split the 25
  # heads' model over tp 2, which Megatron refuses first)
  cat >in-zero3.json <<JSON
{ "model": "$source_root/models/gpt2-xl.json",
  "cluster": "$source_root/clusters/hetero.json",
  "gbs": 64, "mbs": 1, "tp": 1, "dp": 4, "pp": 8, "zero": 3 }
JSON
  run 2 partita export in-zero3.json --to megatron -o megatron.sh
  expect_in err.txt "Megatron-LM has the distributed optimizer (ZeRO-1) only"
  run 2 partita plan --model gpt2-xl --cluster hetero --gbs 64 --zero-levers sometimes
  expect_in err.txt "--zero-levers: unknown value 'sometimes'"
  run 2 partita plan --model gpt2-xl --cluster hetero --gbs 64 --max-zero 4
  expect_in err.txt "--max-zero must be 1, 2 or 3"
  sed 's/"zero": 3/"zero": 5/' zero3.json >in-bad.json
  run 2 partita estimate in-bad.json
  expect_in err.txt "in-bad.json: zero: must be at most 3, got 5"
  sed 's/"distributed_optimizer": true/"distributed_optimizer": false/' zero3.json >in-mismatch.json
  run 2 partita estimate in-mismatch.json
  expect_in err.txt "zero: 3 shards the optimizer state over dp, but distributed_optimizer is false"
  ;;
exec-zero23-offload)
  # ZeRO-2 and ZeRO-3 over 2 "gpus" train as plain data parallelism does
  # (the sums in another order: equal to the printed digits), ZeRO-3 as
  # ZeRO-2 exactly; optimizer offload as the backend's AdamW exactly, and
  # its checkpoint resumes
  prep_corpus
  for name in dp2:0 zero2:2 zero3:3; do
    file=in-${name%%:*}.json
    write_layout_plan "$file" 1 1 2 1 ", \"zero\": ${name##*:}"
    run 0 partita exec "$file" --data in-corpus --iters 3 --log-interval 1 -o "${name%%:*}.json"
    grep -o 'lm loss: [0-9.E+-]*' out.txt >"${name%%:*}-loss.txt"
    [ "$(wc -l <"${name%%:*}-loss.txt")" = 3 ] || fail "expected 3 loss lines"
  done
  cmp -s dp2-loss.txt zero2-loss.txt ||
    { paste dp2-loss.txt zero2-loss.txt; fail "ZeRO-2 changed the losses"; }
  cmp -s zero2-loss.txt zero3-loss.txt ||
    { paste zero2-loss.txt zero3-loss.txt; fail "ZeRO-3 changed ZeRO-2's losses"; }
  # ZeRO-2's and ZeRO-3's checkpoints (the cpu backend's sharded
  # gradients are never saved; under ZeRO-3 each rank saves its
  # parameters' shard) resume as ZeRO-1's does (equal to the printed
  # digits)
  for name in zero1:1 zero2:2 zero3:3; do
    file=in-${name%%:*}.json
    write_layout_plan "$file" 1 1 2 1 ", \"zero\": ${name##*:}"
    run 0 partita exec "$file" --data in-corpus --iters 3 --log-interval 1 --save "ckpt-${name%%:*}" -o "${name%%:*}-3.json"
    run 0 partita exec "$file" --data in-corpus --iters 5 --log-interval 1 --load "ckpt-${name%%:*}" -o "${name%%:*}-resumed.json"
    expect_in "${name%%:*}-resumed.json" '"first_iteration": 4'
    grep -o 'lm loss: [0-9.E+-]*' out.txt | tail -2 >"${name%%:*}-tail.txt"
  done
  cmp -s zero1-tail.txt zero2-tail.txt ||
    { paste zero1-tail.txt zero2-tail.txt; fail "the ZeRO-2 run resumed to other losses than ZeRO-1's"; }
  cmp -s zero1-tail.txt zero3-tail.txt ||
    { paste zero1-tail.txt zero3-tail.txt; fail "the ZeRO-3 run resumed to other losses than ZeRO-1's"; }
  run 0 partita estimate in-zero3.json
  expect_in out.txt "ZeRO stage 3, optimizer offload off"
  write_layout_plan in-pp2.json 1 1 1 2 ', "partition": "3-1"'
  write_layout_plan in-offload.json 1 1 1 2 ', "partition": "3-1", "offload_optimizer": true'
  run 0 partita exec in-pp2.json --data in-corpus --iters 3 --log-interval 1 --save ckpt-pp2 -o pp2.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt >pp2-loss.txt
  run 0 partita exec in-offload.json --data in-corpus --iters 3 --log-interval 1 --save ckpt -o offload.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt >offload-loss.txt
  cmp -s pp2-loss.txt offload-loss.txt ||
    { paste pp2-loss.txt offload-loss.txt; fail "offload changed the losses"; }
  # the AdamW moments went to the checkpoint and came back: the resumed
  # run goes on as the resumed run without offload does
  run 0 partita exec in-pp2.json --data in-corpus --iters 5 --log-interval 1 --load ckpt-pp2 -o pp2-5.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt | tail -2 >pp2-tail.txt
  partita exec in-offload.json --data in-corpus --iters 5 --log-interval 1 --load ckpt -o resumed2.json >out.txt 2>err.txt ||
    { cat err.txt; fail "the offload run did not resume"; }
  expect_in resumed2.json '"first_iteration": 4'
  grep -o 'lm loss: [0-9.E+-]*' out.txt | tail -2 >resumed-tail.txt
  cmp -s pp2-tail.txt resumed-tail.txt ||
    { paste pp2-tail.txt resumed-tail.txt; fail "the offload run resumed to other losses"; }
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
