#!/usr/bin/env bash
# bench/profile/llama_shapes.sh without a GPU (DRY_RUN=1): the profile
# calls it would make, as the bundled H200.json's Llama-3 shapes were
# measured: tp 1 inside the executor's steps in a call of its own, the
# other tps in the stepped chain; TP1_OPTIONS empty puts every tp in one
# call, a TP without 1 makes no tp-1 call.
# Usage: llama_shapes.sh   (PARTITA_SOURCE names the source tree)
set -u
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin llama-shapes
script="$root/bench/profile/llama_shapes.sh"
mkdir -p build
run 0 env DRY_RUN=1 MODELS="llama3.2-1b llama3-8b" bash "$script" build out
[ "$(grep -c '^partita profile' out.txt)" = 4 ] || fail "expected 4 calls: $(cat out.txt)"
expect_in out.txt "^partita profile --model llama3.2-1b --missing-only --tp 1 --mbs 1,2,4,8 --no-comm --timing exec --layer-stack 8 "
expect_in out.txt "^partita profile --model llama3.2-1b --missing-only --tp 2,4,8 --mbs 1,2,4,8 --no-comm --timing step --layer-stack 8 "
expect_in out.txt "^partita profile --model llama3-8b --missing-only --tp 1 --mbs 1,2,4 --no-comm --timing exec "
run 0 env DRY_RUN=1 TP1_OPTIONS= MODELS=llama3-8b bash "$script" build out
[ "$(grep -c '^partita profile' out.txt)" = 1 ] || fail "expected 1 call: $(cat out.txt)"
expect_in out.txt "^partita profile --model llama3-8b --missing-only --tp 1,2,4,8 --mbs 1,2,4 --no-comm --timing step "
run 0 env DRY_RUN=1 TP=2,4 MODELS=llama3-8b bash "$script" build out
[ "$(grep -c '^partita profile' out.txt)" = 1 ] || fail "expected 1 call: $(cat out.txt)"
expect_in out.txt "^partita profile --model llama3-8b --missing-only --tp 2,4 "
echo "PASS [llama-shapes]"
