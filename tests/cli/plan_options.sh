#!/usr/bin/env bash
# End-to-end tests of what `partita plan` is asked beyond the search
# itself (issue 36): plans that stay small (the compact timeline, the
# full one on request), and degrees and nodes a user fixes or limits
# (--tp, --pp, --dp, --mbs, --nodes), in the search and in --pareto, and
# their refusals; e2e.sh's conventions.
# usage: plan_options.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

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
*)
  fail "unknown case $case_name"
  ;;
esac
