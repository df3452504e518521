#!/usr/bin/env bash
# End-to-end tests of Llama-family models (issue 35: RMSNorm, SwiGLU,
# rotary positions, grouped-query attention, untied head) through the
# partita command: plan on a bundled mixed cluster, estimate, export to
# Megatron-LM and DeepSpeed, exec on the cpu backend and what exec
# refuses, profile a Llama layer on the cpu backend (its shape keyed
# apart from a GPT-2 layer's), derive a profile from it; e2e.sh's
# conventions.
# usage: llama.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

# A plan of tests/data/models/llama-tiny.json on one node of
# tp x dp x pp "gpus"; EXTRA adds plan fields.
write_llama_plan() { # FILE TP DP PP [EXTRA]
  local gpus=$(( $2 * $3 * $4 ))
  cat >"$1" <<JSON
{ "model": "$source_root/tests/data/models/llama-tiny.json",
  "cluster": { "name": "one-box", "nodes": [
      { "name": "box", "gpu": "A100-FASOP", "gpus": $gpus,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] },
  "gbs": 4, "mbs": 1, "tp": $2, "dp": $3, "pp": $4${5:-} }
JSON
}

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
exec-cpu)
  # exec trains a tiny Llama (tests/data/models/llama-tiny.json) on the
  # cpu backend, one stage and tp 2 x pp 2 with sequence parallelism, its
  # loss falling; tp 2 x pp 2 saves checkpoints and resumes from them
  # (the same losses bit for bit: executor_run_llama)
  partita prep "$source_root/data/corpus.txt" -o in-corpus >/dev/null \
    || fail "prep of the corpus failed"
  write_llama_plan in-plan.json 1 1 1
  run 0 partita exec in-plan.json --data in-corpus --backend cpu --iters 6 --log-interval 1
  expect_in out.txt "iteration        6/       6 |"
  expect_in out.txt "| lm loss: 5\.[0-9]*E+00 |"
  expect_in run.json '"norm": "rmsnorm"'
  expect_in run.json '"kv_heads": 2'
  first=$(grep -m1 '^iteration' out.txt | sed 's/.*lm loss: \([^ ]*\).*/\1/')
  last=$(grep '^iteration' out.txt | tail -1 | sed 's/.*lm loss: \([^ ]*\).*/\1/')
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' \
    || fail "loss did not fall: $first -> $last"
  write_llama_plan in-split.json 2 1 2 ', "partition": "3-1", "sequence_parallel": true'
  run 0 partita exec in-split.json --data in-corpus --iters 4 --save ckpt --save-interval 2 -o first.json
  expect_in out.txt "checkpoint: iteration 4 saved to ckpt"
  expect_in first.json '"rank": 3'
  run 0 partita exec in-split.json --data in-corpus --iters 6 --load ckpt -o second.json
  expect_in out.txt "iteration        6/       6"
  grep -q "iteration        4/" out.txt && fail "a resumed run repeated iteration 4"
  expect_in second.json '"first_iteration": 5'
  ;;
exec-refuses)
  # tp 4 over 2 key/value heads is not run (one line, exit 2); the cuda
  # backend trains Llama layers (tests/executor/gpu/test_cuda_llama_stage)
  write_llama_plan in-tp4.json 4 1 1
  run 2 partita exec in-tp4.json --data in-none
  expect_in err.txt "kv_heads 2: tp 4 does not divide them"
  [ "$(wc -l <err.txt)" -eq 1 ] || fail "more than one line: $(cat err.txt)"
  ;;
profile-llama)
  # issue 35, item 4: partita profile measures llama-tiny's embedding,
  # layer and untied head on the cpu backend; the profile's shape carries
  # the layer's architecture, tp 4 (over 2 key/value heads) is skipped
  # with a note, and the estimate of a Llama plan takes the measured
  # Llama entries, never a GPT-2 layer's of the same widths
  llama="$source_root/tests/data/models/llama-tiny.json"
  cat >in-gpt-twin.json <<JSON
{ "name": "gpt-twin", "layers": 4, "hidden": 64, "heads": 4, "ffn_hidden": 96,
  "seq": 16, "vocab": 257, "tied_embeddings": false }
JSON
  cat >in-box.json <<JSON
{ "name": "cpu-box", "nodes": [
    { "name": "box", "gpu": "cpu", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 10, "latency_us": 5 } } ] }
JSON
  cat >in-plan.json <<JSON
{ "model": "$llama", "cluster": "in-box.json",
  "gbs": 4, "mbs": 1, "tp": 2, "dp": 1, "pp": 2 }
JSON
  sed "s|$llama|in-gpt-twin.json|" in-plan.json >in-gpt-plan.json
  # a profile of the GPT-2 layer of llama-tiny's widths prices no Llama
  # layer: the cpu profile has no efficiency model, so the estimate stops
  run_profile partita profile --model in-gpt-twin.json --backend cpu --quick --tp 1,2 --mbs 1 -o cpu.json
  run 2 partita estimate in-plan.json --profiles .
  expect_in err.txt "profile cpu: holds no layer shape hidden 64, ffn_hidden 96, seq 16, vocab 257 (rmsnorm swiglu rope kv 2/4 nobias)"
  run 0 partita estimate in-gpt-plan.json --profiles .
  expect_in out.txt "3 of 3 profile entries measured"
  # --missing-only adds the Llama layer as a shape of its own
  run_profile partita profile --model in-gpt-twin.json,"$llama" --backend cpu --quick --tp 1,2,4 --mbs 1 --missing-only -o cpu.json
  expect_in err.txt "model llama-tiny: tp 1 2 missing from cpu.json"
  expect_in out.txt "# llama-tiny: 2 points (rmsnorm swiglu rope kv 2/4 nobias)"
  expect_in err.txt "model llama-tiny: tp 4 not measured: it does not divide the key/value heads (4 heads, 2 for keys and values)"
  [ "$(grep -c '"hidden"' cpu.json)" = 2 ] || fail "expected 2 shapes in cpu.json"
  expect_in cpu.json '"kv_heads": 2'
  expect_in cpu.json '"norm": "rmsnorm"'
  expect_in cpu.json '"mlp": "swiglu"'
  expect_in cpu.json '"positions": "rope"'
  run 0 partita estimate in-plan.json --profiles .
  expect_in out.txt "3 of 3 profile entries measured"
  run 0 partita estimate in-gpt-plan.json --profiles .
  expect_in out.txt "3 of 3 profile entries measured"
  # the comparison names the Llama shape's entries apart
  run 0 partita profile --compare cpu.json cpu.json
  expect_in out.txt "h64 s16 rmsnorm swiglu rope kv 2/4 nobias tp 2 mbs 1 layer forward"
  expect_in out.txt "h64 s16 tp 2 mbs 1 layer forward"
  # a whole measurement of llama-tiny: every tp its key/value heads
  # allow, every micro-batch
  run_profile partita profile --model "$llama" --backend cpu --quick --tp 1,2,4 --mbs 1,2 -o whole.json
  [ "$(grep -c '"mbs"' whole.json)" = 4 ] || fail "expected 4 points in whole.json"
  expect_in whole.json '"model": "llama-tiny"'
  expect_in whole.json 'tp 4 skipped: it does not divide the key/value heads'
  expect_in out.txt "written to whole.json"
  ;;
derive-llama)
  # a derived profile fitted on a measured profile that holds a Llama
  # layer: the fit prices it with its own kernels (the points table lists
  # it), and the derived profile prices a Llama plan by its roofline
  llama="$source_root/tests/data/models/llama-tiny.json"
  cat >in-gpt.json <<JSON
{ "name": "gpt-small", "layers": 2, "hidden": 96, "heads": 4, "seq": 32,
  "vocab": 257 }
JSON
  run_profile partita profile --model in-gpt.json,"$llama" --backend cpu --quick --tp 1,2 --mbs 1 --gpu-name H200 -o in-H200.json
  mkdir in-profiles
  run 0 partita profile --derive A10 --from in-H200.json --points -o in-profiles/A10.json
  expect_in out.txt "rms log error"
  expect_in out.txt "| H200 | 64 (rmsnorm swiglu rope kv 2/4 nobias) | 16 | 2 | 1 | layer fwd |"
  expect_in out.txt "| H200 | 96 | 32 | 1 | 1 | layer bwd |"
  expect_in in-profiles/A10.json '"source": "derived"'
  cat >in-plan.json <<JSON
{ "model": "$llama",
  "cluster": { "name": "a10-box", "nodes": [
      { "name": "box", "gpu": "A10", "gpus": 4,
        "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 } } ] },
  "gbs": 4, "mbs": 1, "tp": 2, "dp": 1, "pp": 2 }
JSON
  run 0 partita estimate in-plan.json --profiles in-profiles
  expect_in out.txt "derived profile without measured times for hidden 64, ffn_hidden 96, seq 16, vocab 257 (rmsnorm swiglu rope kv 2/4 nobias); priced by its roofline"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
