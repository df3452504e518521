#!/usr/bin/env bash
# bench/norms/run.sh BUILD [SHAPE ...]: norm_bench under each kernel
# choice (VARIANTS; default: the rules' choice, then teams of 1, 2, 4 and
# 8 warps a row, each set as both PARTITA_LAYERNORM_FORWARD and
# PARTITA_LAYERNORM_BACKWARD), then one table of microseconds a call,
# shape and way (fwd, bwd) by variant, with the copy of the same bytes;
# a variant whose output hash differs from the first's is marked *.
# Needs a GPU (docs/benchmarks.md, "The norms' kernels, timed alone").
# CALLS, ROUNDS: the bench's --calls, --rounds.
set -euo pipefail
build=${1:?usage: run.sh BUILD [SHAPE ...]}
shift
bench="$build/bench/norms/norm_bench"
variants=${VARIANTS:-"default team1 team2 team4 team8"}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for variant in $variants; do
    if [ "$variant" = default ]; then
        "$bench" --calls "${CALLS:-200}" --rounds "${ROUNDS:-5}" "$@" \
            | tee "$logs/$variant"
    else
        PARTITA_LAYERNORM_FORWARD=$variant \
            PARTITA_LAYERNORM_BACKWARD=$variant "$bench" \
            --calls "${CALLS:-200}" --rounds "${ROUNDS:-5}" "$@" \
            | tee "$logs/$variant"
    fi
done
# one line per shape and way: us a call under each variant, the copy's
awk -v variants="$variants" -v dir="$logs" '
BEGIN {
    n = split(variants, names, " ")
    for (v = 1; v <= n; v++) {
        file = dir "/" names[v]
        while ((getline line < file) > 0) {
            if (line ~ /^#/) continue
            split(line, f, " ")
            key = f[1] " " f[2] " " f[3] "x" f[4]
            if (!(key in seen)) { seen[key] = 1; order[++shapes] = key }
            us[key, v] = f[5]; hash[key, v] = f[10]; copy[key] = f[7]
        }
    }
    printf "\n%-20s", "shape (us)"
    for (v = 1; v <= n; v++) printf " %9s", names[v]
    printf " %9s\n", "copy"
    for (s = 1; s <= shapes; s++) {
        key = order[s]
        printf "%-20s", key
        for (v = 1; v <= n; v++) {
            mark = hash[key, v] != hash[key, 1] ? "*" : ""
            printf " %9s", us[key, v] mark
        }
        printf " %9s\n", copy[key]
    }
}'
