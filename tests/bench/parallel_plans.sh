#!/usr/bin/env bash
# bench/parallel's plans without a GPU: each loads, fits and is estimated
# (`partita estimate`), and run.sh's rows name only plans that exist.
# Usage: parallel_plans.sh PARTITA
set -u
partita=${1:?usage: parallel_plans.sh PARTITA}
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin parallel-plans
plans="$root/bench/parallel/plans"
count=0
for plan in "$plans"/*.json; do
    run 0 "$partita" estimate "$plan"
    expect_in out.txt "step time"
    count=$((count + 1))
done
[ "$count" -ge 10 ] || fail "only $count plans in $plans"
for row in one-gpu dp2 pp2 one-gpu-26h tp2 dp4 pp4 one-gpu-13b tp2-13b tp4-13b; do
    [ -f "$plans/$row.json" ] || fail "run.sh's row $row has no plan"
    grep -q " $row)\| $row|\||$row)" "$root/bench/parallel/run.sh" ||
        fail "run.sh gives row $row no target"
done
echo "PASS [$case_name]"
