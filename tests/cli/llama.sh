#!/usr/bin/env bash
# End-to-end tests of Llama-family models (issue 35: RMSNorm, SwiGLU,
# rotary positions, grouped-query attention, untied head) through the
# partita command: plan on a bundled mixed cluster, estimate, export to
# Megatron-LM and DeepSpeed, and exec's refusal; e2e.sh's conventions.
# usage: llama.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

case "$case_name" in
plan-llama3-70b)
  # the README's example: Llama-3-70B on 80 A100s and 80 V100s (derived
  # profiles: every part priced by their rooflines)
  run 0 partita plan --model llama3-70b --cluster mixed-160 --gbs 512 -o plan.json
  expect_in out.txt "# model llama3-70b: 70553706496 parameters (70.55 billion), rmsnorm, swiglu, rope positions (base 500000), 8 of 64 heads for keys and values, no biases, untied head"
  expect_in out.txt "priced by its roofline"
  expect_in plan.json '"parameters": 70553706496'
  expect_in plan.json '"kv_heads": 8'
  expect_in plan.json '"norm": "rmsnorm"'
  # every tp in the ranking divides the 8 key/value heads or is a multiple
  grep '^ *[0-9]' out.txt | awk '{ if (64 % $2 != 0) exit 1 }' \
    || fail "a ranked tp does not divide the 64 heads"
  run 0 partita estimate plan.json
  expect_in out.txt "# model llama3-70b: 70553706496 parameters"
  run 0 partita export plan.json --to megatron -o launch.sh
  bash -n launch.sh || fail "launch.sh is not valid bash"
  for flag in "--normalization RMSNorm --norm-epsilon 1e-05" "--swiglu" \
              "--position-embedding-type rope --rotary-base 500000" \
              "--group-query-attention --num-query-groups 8" \
              "--untie-embeddings-and-output-weights" "--disable-bias-linear" \
              "--ffn-hidden-size 28672" "--num-attention-heads 64" \
              "--seq-length 8192"; do
    expect_in launch.sh "    $flag"
  done
  expect_in launch.sh "HuggingFaceTokenizer"
  run 0 partita export plan.json --to deepspeed -o ds.json
  expect_in ds.json '"--normalization rmsnorm"'
  expect_in ds.json '"--num-key-value-heads 8"'
  ;;
plan-qwen-tp)
  # 28 heads and 4 key/value heads: tp 8 splits neither, so the planner
  # never ranks it; the q, k, v biases go to Megatron-LM as --add-qkv-bias
  run 0 partita plan --model qwen2.5-7b --cluster h200x8 --gbs 64 -o plan.json
  expect_in out.txt "7615616512 parameters"
  expect_in out.txt "biases on q, k, v only"
  grep '^ *[0-9]' out.txt | awk '{ if ($2 == 8) exit 1 }' \
    || fail "tp 8 ranked for 28 heads"
  run 0 partita export plan.json --to megatron -o launch.sh
  expect_in launch.sh "    --disable-bias-linear --add-qkv-bias"
  expect_in launch.sh "--num-query-groups 4"
  ;;
exec-refuses)
  # exec trains GPT-2's layer only: one line, exit 2, naming the model
  # file and the field
  run 0 partita plan --model llama3.2-1b --cluster h200x8 --gbs 64 -o plan.json
  run 2 partita exec plan.json --data in-none
  expect_in err.txt "models/llama3.2-1b.json): kv_heads 8: exec trains GPT-2's layer only"
  [ "$(wc -l <err.txt)" -eq 1 ] || fail "more than one line: $(cat err.txt)"
  run 2 partita profile --model llama3.2-1b
  expect_in err.txt "llama3.2-1b.json: kv_heads: profile measures GPT-2's layer only"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
