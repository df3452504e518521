#!/usr/bin/env bash
# One small profile on the GPU, for run_all.sh: `partita profile` of
# GPT-2 124M at tp 1, micro-batches 1 and 2, two sets of the embedding's
# stage (so a stage is made again after one was timed and released) and
# default timing, then checks the profile holds both points and that the
# embedding's rounds were replayed as CUDA graphs (provenance.runs.
# graph_parts): the path that broke when the token upload's event was
# recorded inside the profiler's capture (2026-11-29, ninth session).
#
# Usage: tests/executor/gpu/profile_smoke.sh BUILD_DIR OUT_DIR
set -u
build=$(cd "${1:?usage: profile_smoke.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: profile_smoke.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
"$build/cli/partita" profile --model "$root/models/gpt2-124m.json" --tp 1 \
    --mbs 1,2 --no-comm --stage-sets 1 --embedding-sets 2 --processes 1 \
    -o "$out/profile.json" || { echo "FAIL: partita profile"; exit 1; }
python3 - "$out/profile.json" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
points = [c for s in profile["shapes"] for c in s["costs"]]
graphed = profile["provenance"]["runs"]["graph_parts"]
print(f"{len(points)} points, {graphed} parts graphed")
if len(points) != 2 or graphed == 0:
    print("FAIL: expected 2 points and graphed embedding rounds")
    sys.exit(1)
print("PASS profile_smoke")
PY
