#!/usr/bin/env bash
# Issue 35, item 4, for the GPU machine (one H200): the bundled
# Llama-family shapes added to the H200's profile with `partita profile
# --missing-only`, each its own shape keyed by its layer's architecture
# (docs/profiles.md, "Llama-family layers"): Llama-3.2-1B whole, and the
# layers of Llama-3-8B, Mistral-7B, Llama-2-7B and Qwen2.5-7B, each at its
# bundled sequence (8192 for the Llama 3 shapes, 4096 for the others), at
# tp 1, 2, 4 and 8 (shard 0 of the group computed alone, as every
# profile's tp points are; a tp that does not divide the heads or the
# key/value heads is skipped with a note: Qwen2.5-7B's 28 heads at tp 8).
# Measured as profiles/H200.json's Llama-3 shapes were (tp 1 inside the
# executor's own steps, TP1_OPTIONS; the other tps in the stepped chain,
# PROFILE_OPTIONS; 7 rounds of 10 ms, one set of stages, one process),
# into a copy of it:
# OUT_DIR/H200.json, which then holds the committed shapes unchanged
# and the Llama ones added (provenance.additions says how each was
# measured). A model's shape it already holds is not measured again, so
# a second call with the same OUT_DIR goes on where the first stopped.
# Then every Llama plan of bench/accuracy/plans-llama on the whole GPU is
# estimated against it: its embedding, layer and head must be measured.
#
# Usage: bench/profile/llama_shapes.sh BUILD_DIR OUT_DIR
#   BUILD_DIR  a cuda build: BUILD_DIR/cli/partita (and partita-exec beside
#              it); BUILD_DIR/lib, when there, goes on LD_LIBRARY_PATH
# Environment: MODELS (default "llama3.2-1b llama3-8b mistral-7b
# llama2-7b qwen2.5-7b"), TP (1,2,4,8), MBS_SMALL (1,2,4,8: Llama-3.2-1B),
# MBS_LARGE (1,2,4: the 7-8B layers, whose micro-batch of 4 at sequence
# 8192 is already 32,768 tokens), MODEL_S (180: the time limit of one
# profile call), BUDGET_S (300: no model is started past it),
# PROFILE_OPTIONS ("--timing step --layer-stack 8 --rounds 7 --round-ms
# 10 --stage-sets 1 --processes 1", as the bundled Llama-3.2-1B and
# Llama-3-8B shapes' tp 2-8 points were measured in the tenth session; the
# others of the seventh session were "--timing host ..."), TP1_OPTIONS
# ("--timing exec --layer-stack 8 --rounds 7 --round-ms 10 --stage-sets 1
# --processes 1": tp 1 timed inside the executor's own steps, in a call
# of its own before the other tps, as the twelfth session measured those
# two shapes' tp-1 points, the stepped chain's clock being about 10 %
# higher; empty: tp 1 with PROFILE_OPTIONS in the one call), DRY_RUN=1
# (print the profile calls only; no GPU needed). Exit status: 0 when
# every model was added (or held already) and the estimates are
# measured, 1 otherwise, 77 without an H200.
set -u
build=$(cd "${1:?usage: llama_shapes.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: llama_shapes.sh BUILD_DIR OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
partita="$build/cli/partita"
models=${MODELS:-llama3.2-1b llama3-8b mistral-7b llama2-7b qwen2.5-7b}
read -r -a options <<<"${PROFILE_OPTIONS:---timing step --layer-stack 8 --rounds 7 --round-ms 10 --stage-sets 1 --processes 1}"
read -r -a tp1_options <<<"${TP1_OPTIONS---timing exec --layer-stack 8 --rounds 7 --round-ms 10 --stage-sets 1 --processes 1}"
export NCCL_NVLS_ENABLE=0 PARTITA_SOURCE="$root"
[ -d "$build/lib" ] &&
    export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# calls: one "TP|OPTIONS" line per profile call of a model: tp 1 on its
# own with TP1_OPTIONS (when TP holds 1 and TP1_OPTIONS is not empty),
# the other tps with PROFILE_OPTIONS
calls() {
    local tps=${TP:-1,2,4,8} rest
    if [ ${#tp1_options[@]} -gt 0 ] && [[ ",$tps," == *",1,"* ]]; then
        echo "1|${tp1_options[*]}"
        rest=$(echo ",$tps," | sed 's/,1,/,/; s/^,//; s/,$//')
        [ -n "$rest" ] && echo "$rest|${options[*]}"
    else
        echo "$tps|${options[*]}"
    fi
}
if [ "${DRY_RUN:-0}" = 1 ]; then
    for model in $models; do
        mbs=${MBS_LARGE:-1,2,4}
        [ "$model" = llama3.2-1b ] && mbs=${MBS_SMALL:-1,2,4,8}
        calls | while IFS='|' read -r tps opts; do
            echo "partita profile --model $model --missing-only --tp $tps --mbs $mbs --no-comm $opts -o $out/H200.json"
        done
    done
    exit 0
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if ! echo "$gpu_name" | grep -q H200; then
    echo "SKIP llama_shapes: the profile is H200.json, this GPU is '${gpu_name:-none}'"
    exit 77
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
profile="$out/H200.json"
[ -f "$profile" ] || cp "$root/profiles/H200.json" "$profile"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "# into $profile: $models (${options[*]})"
SECONDS=0
status=0
for model in $models; do
    if [ "$SECONDS" -ge "${BUDGET_S:-300}" ]; then
        echo "$model: SKIP, the budget of ${BUDGET_S:-300} s is spent"
        status=1
        continue
    fi
    mbs=${MBS_LARGE:-1,2,4}
    [ "$model" = llama3.2-1b ] && mbs=${MBS_SMALL:-1,2,4,8}
    name=$(basename "$model" .json)
    start=$SECONDS
    rc=0
    : >"$out/$name.log"
    : >"$out/$name.err"
    while IFS='|' read -r tps opts; do
        read -r -a call_options <<<"$opts"
        timeout -k 5 "${MODEL_S:-180}" "$partita" profile --model "$model" \
            --missing-only --tp "$tps" --mbs "$mbs" --no-comm \
            "${call_options[@]}" -o "$profile" >>"$out/$name.log" 2>>"$out/$name.err" ||
            rc=$?
    done < <(calls)
    [ $rc -eq 0 ] || status=1
    # the points added (or "nothing to measure"), and any tp skipped
    echo "$name: rc $rc, $((SECONDS - start)) s: $(grep -E '^# (added|.*nothing to measure)' "$out/$name.log" | tr '\n' ' ')$( [ $rc -eq 0 ] || echo " $(tail -n 1 "$out/$name.err")")"
    grep -h 'not measured\|skipped' "$out/$name.err" "$out/$name.log" |
        sed 's/^/    /' | sort -u
done
# every whole-GPU Llama plan of the accuracy suite priced from measured
# entries (the suite's estimates then compare measured with measured)
for plan in "$root"/bench/accuracy/plans-llama/L0[12]-whole-*.json; do
    line=$("$partita" estimate "$plan" --profiles "$out" 2>&1 | grep 'profile entries measured')
    echo "$(basename "$plan" .json): ${line:-no estimate}"
    case $line in "# 3 of 3 "*) ;; *) status=1 ;; esac
done
python3 - "$profile" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
for s in p["shapes"]:
    arch = " ".join(f"{k} {json.dumps(s[k])}" for k in ("kv_heads", "norm", "mlp", "positions", "bias", "qkv_bias") if k in s)
    tps = sorted({c["tp"] for c in s["costs"]})
    print(f"# shape hidden {s['hidden']} seq {s['seq']} vocab {s['vocab']}: "
          f"{len(s['costs'])} points, tp {tps}{'; ' + arch if arch else ''}")
EOF
echo "# done in $SECONDS s"
exit $status
