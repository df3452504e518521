#!/usr/bin/env bash
# End-to-end tests of what `partita plan` is asked beyond the search
# itself (issue 36): plans that stay small (the compact timeline, the
# full one on request), and degrees and nodes a user fixes or limits
# (--tp, --pp, --dp, --mbs, --nodes), in the search and in --pareto, and
# their refusals; e2e.sh's conventions.
# usage: plan_options.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in, write_small_pool; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

# ranked_column_in FILE COLUMN "VALUES": every row of the ranking has one
# of VALUES (space-separated) in COLUMN (2 tp, 3 dp, 4 pp, 5 mbs).
ranked_column_in() {
  grep '^ *[0-9]' "$1" | awk -v c="$2" -v allowed=" $3 " '
    { n++; if (index(allowed, " " $c " ") == 0) bad = bad " " $c }
    END { if (n == 0 || bad != "") { print "column " c ":" bad; exit 1 } }' \
    || { cat "$1"; fail "column $2 of the ranking is not among $3"; }
}

case "$case_name" in
plan-1024-stays-small)
  # GPT-3 175B on 1,024 GPUs of four types at gbs 1536 (mbs 1: hundreds
  # of micro-batches a replica): plan.json under 1 MB, its timeline
  # compact; the full timeline, on request, is what made it 1.3 MB
  run 0 partita plan --model gpt-175b --cluster mixed-1024 --gbs 1536 \
    --quiet -o plan.json
  size=$(stat -c %s plan.json)
  [ "$size" -lt 1048576 ] || fail "plan.json of 1,024 GPUs is $size bytes"
  expect_in plan.json '"elided": {'
  run 0 partita estimate --json --full-timeline plan.json
  full=$(stat -c %s out.txt)
  [ "$full" -gt "$size" ] || fail "the full timeline ($full) is not larger"
  ! grep -q '"elided"' out.txt || fail "the full timeline elides events"
  ;;
plan-constraints)
  # GPT-2 XL on hetero (one A100 node, seven A10 nodes of 4 GPUs): every
  # ranked plan holds to the degrees fixed or limited
  run 0 partita plan --model gpt2-xl --gbs 64 --tp 2 --quiet -o plan.json
  expect_in out.txt "gbs 64, objective step time, --tp 2"
  ranked_column_in out.txt 2 "2"
  expect_in plan.json '"tp": 2,'
  run 0 partita plan --model gpt2-xl --gbs 64 --pp 2,4 --mbs 1,2 --quiet \
    -o plan.json
  ranked_column_in out.txt 4 "2 4"
  ranked_column_in out.txt 5 "1 2"
  run 0 partita plan --model gpt2-xl --gbs 64 --dp 4 --tp 1 --quiet \
    -o plan.json
  ranked_column_in out.txt 3 "4"
  ranked_column_in out.txt 4 "8"
  run 0 partita estimate plan.json
  ;;
plan-nodes)
  # a part of hetero: its A100 node and three of its A10 nodes, numbered
  # as the cluster numbers them, so the plan runs on the cluster's file
  run 0 partita plan --model gpt2-xl --gbs 64 --nodes a100:1,a10:3 \
    --quiet -o plan.json
  expect_in out.txt "(4 of its 8 nodes: --nodes a100:1,a10:3, 16 GPUs)"
  python3 - plan.json <<'PY' || fail "the plan is not on the part asked"
import json, sys
plan = json.load(open(sys.argv[1]))
order = plan["node_order"]
assert sorted(order) == sorted(["a100[0]", "a10[0]", "a10[1]", "a10[2]"]), order
assert plan["tp"] * plan["dp"] * plan["pp"] == 16, plan
for alternative in plan["alternatives"]:
    assert len(alternative["node_order"]) == 4, alternative
PY
  run 0 partita estimate plan.json
  expect_in out.txt "16 GPUs"
  # and with a degree: the constraints hold together
  run 0 partita plan --model gpt2-xl --gbs 64 --nodes a10:2 --tp 4 \
    --quiet -o plan.json
  ranked_column_in out.txt 2 "4"
  # priced as FASOP prices GPT-2 XL, but not runnable by exec: said
  expect_in out.txt "# note: partita exec cannot run this plan: model gpt2-xl"
  expect_in out.txt "tp 4 must divide the 25 heads"
  run 0 partita estimate plan.json
  expect_in out.txt "# note: partita exec cannot run this plan"
  expect_in plan.json '"a10\[1\]"'
  ;;
plan-constraints-pareto)
  # the front of a pool of 2 + 2 nodes: under --tp 4 every point has tp
  # 4; --nodes a100:1,a10:2 makes the pool 1 + 2 (5 sub-clusters)
  write_small_pool
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster in-pool.json \
    --pareto --tp 4 --quiet -o front.json
  expect_in out.txt "pool small-pool, gbs 64, --tp 4"
  python3 - front.json <<'PY' || fail "a point of the front has another tp"
import json, sys
front = json.load(open(sys.argv[1]))["pareto"]
assert front and all(point["tp"] == 4 for point in front), front
PY
  run 0 partita plan --model gpt2-xl --gbs 64 --cluster in-pool.json \
    --pareto --nodes a100:1,a10:2 --quiet -o front.json
  expect_in out.txt "searched 5 sub-clusters"
  python3 - front.json <<'PY' || fail "a point of the front is not in the part"
import json, sys
front = json.load(open(sys.argv[1]))["pareto"]
for point in front:
    assert point["nodes_used"]["a100"] <= 1 and point["nodes_used"]["a10"] <= 2
    assert "a10[2]" not in point["node_order"], point
PY
  run 0 partita estimate front.json
  ;;
plan-constraints-bad)
  # one line naming the option and why, exit status 2, no file written
  write_small_pool
  refused() { # MESSAGE ARGUMENTS...
    local message="$1"; shift
    run 2 partita plan --model gpt2-xl --gbs 64 --quiet -o refused.json "$@"
    expect_in err.txt "$message"
    [ "$(wc -l <err.txt)" -eq 1 ] || { cat err.txt; fail "more than one line"; }
    [ ! -e refused.json ] || fail "refused.json written for $*"
  }
  refused "partita plan: --tp: 3 is not a power of two" --tp 3
  refused "partita plan: --tp: expected a comma-separated list of integers" \
    --tp 2,x
  refused "partita plan: --pp: expected a comma-separated list" --pp 0
  refused "partita plan: --mbs: expected a comma-separated list" --mbs ""
  refused "partita plan: --tp 16: no plan with that fills cluster hetero's 32 GPUs" \
    --tp 16
  refused "partita plan: --pp 3: no plan with that" --tp 2 --pp 3
  refused "partita plan: --tp 8 --pp 2 --dp 4: no plan with these together" \
    --tp 8 --pp 2 --dp 4
  refused "partita plan: --nodes: cluster hetero has no node type 'h100' (its types: a100, a10)" \
    --nodes h100:2
  refused "partita plan: --nodes: a100:2 asks for more nodes than the 1 of type a100" \
    --nodes a100:2
  refused "partita plan: --nodes: expected TYPE:COUNT" --nodes a100
  refused "partita plan: --nodes: a10:x: expected a count of nodes" \
    --nodes a10:x
  refused "partita plan: --nodes: node type a10 is named twice" \
    --nodes a10:1,a10:2
  refused "partita plan: --nodes: a100:0 leaves no node to plan on" \
    --nodes a100:0
  refused "partita plan: --tp 16: no plan with that fills cluster hetero's 16 GPUs" \
    --nodes a10:4 --tp 16
  refused "no sub-cluster of small-pool can train gpt2-xl with gbs 64 and --tp 16" \
    --cluster in-pool.json --pareto --tp 16
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
