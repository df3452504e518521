#!/usr/bin/env bash
# Profiles of the slices of one H200 with their neighbours busy, for the
# one-GPU accuracy suite (issue 17): every GPU type of the bundled
# clusters/h200-slices-*.json (a node's `gpu` or `gpu_at_rest`) that is
# named "<GPU>-<N>SM[-place-<P>]-beside-<M>-...[-idle]" is measured with
# `partita profile --sm-limit N --beside M,... [--place P]
# [--idle-neighbours]` (the slice at place P of the split; the other
# slices each run the same model's layers while the slice is timed, as
# the other ranks of a plan on slices of one GPU do, or rest under
# -idle; docs/profiles.md, "Slices beside busy neighbours" and "The
# split, measured"), for the models, tp and micro-batches of the plans
# of bench/accuracy/plans-1gpu that use it (a stage of its own degrees,
# issue 36, adds its tp and its replicas' micro-batch). Writes
# OUT_DIR/<type>.json and .log; one line per profile. With MISSING_ONLY=1 each profile starts
# as a copy of the committed profiles/<type>.json (unless OUT_DIR holds
# it already) and only the shapes and tp it lacks are measured and added
# (`--missing-only`): how the Llama plans' shapes join the suite's
# profiles (PLANS=bench/accuracy/plans-llama, docs/accuracy.md).
#
# Usage: bench/accuracy/profile_beside.sh BUILD_DIR OUT_DIR [TYPE ...]
# Environment: PROFILE_S (60: the time limit of one profile, sized for
# one set of stages in one process), STAGE_SETS (1: `partita profile
# --stage-sets`), PROCESSES (1: `--processes`), PROFILE_OPTIONS (more
# options for every `partita profile`, e.g. `--timing host`), PLANS
# (bench/accuracy/plans-1gpu), MISSING_ONLY=1 (above), DRY_RUN=1 (print
# the commands only).
set -u
build=$(cd "${1:?usage: profile_beside.sh BUILD_DIR OUT_DIR [TYPE ...]}" && pwd)
out=${2:?usage: profile_beside.sh BUILD_DIR OUT_DIR [TYPE ...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
plans=${PLANS:-$here/plans-1gpu}
mkdir -p "$out"
# One line per type: NAME SM_LIMIT BESIDE MODELS TP MBS, from the plans
# whose cluster names it (models as files, lists comma-separated).
jobs=$(python3 - "$plans" "$root" "$@" <<'EOF'
import json, os, re, sys
plans, root, wanted = sys.argv[1], sys.argv[2], set(sys.argv[3:])
types = {}
for name in sorted(os.listdir(plans)):
    if not name.endswith(".json"):
        continue
    path = os.path.join(plans, name)
    plan = json.load(open(path))
    # model and cluster as files beside the plan, or inline as `partita
    # plan` writes them (the model then by its bundled name)
    cluster = plan["cluster"]
    if not isinstance(cluster, dict):
        cluster = json.load(open(os.path.normpath(os.path.join(plans, cluster))))
    model = plan["model"]
    model = model["name"] if isinstance(model, dict) else \
        os.path.normpath(os.path.join(plans, model))
    for gpu in [n[k] for n in cluster["nodes"] for k in ("gpu", "gpu_at_rest") if k in n]:
        m = re.fullmatch(r"[A-Za-z0-9]+-(\d+)SM(?:-place-(\d+))?-beside((?:-\d+)+)(-idle)?", gpu)
        if not m or (wanted and gpu not in wanted):
            continue
        t = types.setdefault(gpu, {"sms": m.group(1),
            "beside": m.group(3)[1:].replace("-", ","),
            "flags": (["--place", m.group(2)] if m.group(2) else []) +
                     (["--idle-neighbours"] if m.group(4) else []),
            "models": [], "tp": set(), "mbs": set()})
        if model not in t["models"]:
            t["models"].append(model)
        # each stage's own tp and its replicas' micro-batch (issue 36)
        for stage in plan.get("stages") or [{}]:
            dp = stage.get("dp", plan["dp"])
            t["tp"].add(stage.get("tp", plan["tp"]))
            t["mbs"].add(plan["mbs"] * plan["dp"] // dp)
for gpu, t in types.items():
    # the plan's micro-batch and its neighbours, for the interpolation
    mbs = sorted({b for m in t["mbs"] for b in (m // 2 or 1, m, 2 * m) if b <= 8})
    print(gpu, t["sms"], t["beside"], ",".join(t["models"]),
          ",".join(map(str, sorted(t["tp"]))), ",".join(map(str, mbs)),
          " ".join(t["flags"]))
EOF
) || exit 1
status=0
while read -r gpu sms beside models tp mbs flags; do
    [ -n "$gpu" ] || continue
    read -r -a extra <<<"$flags ${PROFILE_OPTIONS:-}"
    if [ "${MISSING_ONLY:-0}" = 1 ]; then
        extra+=(--missing-only)
        if [ ! -f "$out/$gpu.json" ] && [ "${DRY_RUN:-0}" != 1 ]; then
            cp "$root/profiles/$gpu.json" "$out/$gpu.json" || { status=1; continue; }
        fi
    fi
    cmd=("$build/cli/partita" profile --model "$models" --sm-limit "$sms"
         --beside "$beside" --tp "$tp" --mbs "$mbs" --no-comm "${extra[@]}"
         --stage-sets "${STAGE_SETS:-1}" --processes "${PROCESSES:-1}"
         --gpu-name "$gpu" -o "$out/$gpu.json")
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "${cmd[*]}"
        continue
    fi
    start=$SECONDS
    timeout -k 5 "${PROFILE_S:-60}" "${cmd[@]}" >"$out/$gpu.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    echo "$gpu: rc $rc, $((SECONDS - start)) s: $(tail -n 1 "$out/$gpu.log")"
done <<<"$jobs"
exit $status
