#!/usr/bin/env bash
# The plan-quality runs (bench/accuracy/plan_quality.sh, issue 38 item 5)
# without a GPU: a tiny GPT on clusters/h200x4-hetero.json, every plan
# (the best, its next two, the best plain 1F1B, the even partition, plain
# dp) planned, estimated and trained on the cpu backend's threads; the
# table holds the six rows and both verdicts (whatever they say: the cpu's
# times are not the cluster's).
# Usage: plan_quality.sh BUILD_DIR
set -u
build=${1:?usage: plan_quality.sh BUILD_DIR}
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin plan-quality
cat >tiny.json <<'JSON'
{"name": "tiny", "layers": 8, "hidden": 16, "heads": 2, "seq": 16, "vocab": 257}
JSON
run 0 env BACKEND=cpu MODEL="$scratch/tiny.json" GBS=16 ITERS=2 \
    bash "$root/bench/accuracy/plan_quality.sh" "$build" out "$root/profiles"
for name in best top2 top3 plain even dp; do
    expect_in out.txt "^| $name | "
    [ -s "out/q-$name.run.json" ] || fail "no run.json for $name"
done
expect_in out.txt "^| even | 1 x 2 x 2, 8 | - | 4-4 |"
expect_in out.txt "^best measured fastest: \(PASS\|FAIL\)"
expect_in out.txt "^measured speed-up over dp / estimated: "
# a cluster that is no file and no bundled name: one line, status 1
run 1 env BACKEND=cpu MODEL="$scratch/tiny.json" CLUSTER=no-such-cluster \
    GBS=16 ITERS=2 bash "$root/bench/accuracy/plan_quality.sh" "$build" out2 \
    "$root/profiles"
expect_in out.txt "^FAIL plan best: "
echo "PASS [$case_name]"
