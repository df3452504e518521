#!/usr/bin/env bash
# Repeatable profile entries (issue 17, item 4), for the GPU machine: the
# same small model profiled three times, by three commands (each its own
# processes: 8 by default; no NCCL curves),
# then every entry of each pair compared (`partita profile --compare`,
# 3 % per entry). Prints each comparison's summary and the worst entry
# over all three; exit 0 when every entry agrees within 3 %.
#
# Usage: tests/executor/gpu/profile_repeat.sh BUILD_DIR [OUT_DIR]
#   BUILD_DIR  a meson build made with -Dcuda=enabled
# Environment: MODEL (default models/gpt2-124m.json, whose entries are
# mostly under 0.5 ms), TP (1,2,4), MBS (1,2,4), TOLERANCE (3), TIMING
# (`partita profile --timing`: gated, the default, graph or host; GRAPH=1
# is TIMING=graph), SETS (the sets of stages, `--stage-sets`; default the
# profiler's), ESETS (the embedding's, `--embedding-sets`), PROCESSES
# (`--processes`: a profile the mean of that many; default the
# profiler's), ROUNDS (`--rounds`), ROUND_MS (`--round-ms`). Each run
# says how many parts were timed each way
# (provenance.runs).
set -u
build=$(cd "${1:?usage: profile_repeat.sh BUILD_DIR [OUT_DIR]}" && pwd)
out=${2:-$build/profile-repeat}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
partita="$build/cli/partita"
model=${MODEL:-$root/models/gpt2-124m.json}
tolerance=${TOLERANCE:-3}
export PARTITA_SOURCE="$root"
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP profile_repeat: no GPU"
    exit 77
fi
mkdir -p "$out"
status=0
for run in 1 2 3; do
    start=$SECONDS
    if ! "$partita" profile --model "$model" --tp "${TP:-1,2,4}" \
            --mbs "${MBS:-1,2,4}" --no-comm --gpu-name repeat \
            ${GRAPH:+--timing graph} ${TIMING:+--timing "$TIMING"} \
            ${SETS:+--stage-sets "$SETS"} ${ESETS:+--embedding-sets "$ESETS"} \
            ${PROCESSES:+--processes "$PROCESSES"} \
            ${ROUNDS:+--rounds "$ROUNDS"} ${ROUND_MS:+--round-ms "$ROUND_MS"} \
            -o "$out/run$run.json" >"$out/run$run.log" 2>"$out/run$run.err"; then
        echo "FAIL profile_repeat: run $run did not write a profile:"
        tail -5 "$out/run$run.err"
        exit 1
    fi
    parts=$(tr -d '\n ' <"$out/run$run.json" |
        sed -n 's/.*"gated_parts":\([0-9]*\),"graph_parts":\([0-9]*\),"queued_parts":\([0-9]*\).*/\1 gated, \2 graphed, \3 queued/p')
    echo "# run $run: $((SECONDS - start)) s, parts ${parts:-not counted} ($out/run$run.json)"
done
worst_line=""
worst=0
for pair in "1 2" "1 3" "2 3"; do
    set -- $pair
    log="$out/compare-$1-$2.log"
    "$partita" profile --compare "$out/run$1.json" "$out/run$2.json" \
        --tolerance "$tolerance" >"$log" 2>&1 || status=1
    summary=$(grep -m1 '^# [0-9]* entries' "$log")
    echo "# run $1 vs run $2: ${summary#\# }"
    # the largest difference of this pair, "largest difference X % (entry)"
    percent=$(sed -n 's/.*largest difference \([0-9.]*\) %.*/\1/p' "$log" | head -1)
    if [ -n "$percent" ] && awk -v a="$percent" -v b="$worst" 'BEGIN{exit !(a>b)}'; then
        worst=$percent
        worst_line="run $1 vs run $2: $(sed -n 's/.*\(largest difference [^;]*\).*/\1/p' "$log" | head -1)"
    fi
done
echo "# worst entry over the three pairs: ${worst_line:-none differs}"
if [ $status -eq 0 ]; then
    echo "PASS profile_repeat: every entry of three processes within $tolerance %"
else
    echo "FAIL profile_repeat: some entries differ by more than $tolerance % (logs in $out)"
    grep -h ' over$' "$out"/compare-*.log | head -20
fi
exit $status
