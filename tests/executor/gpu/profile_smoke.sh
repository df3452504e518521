#!/usr/bin/env bash
# One small profile on the GPU, for run_all.sh: `partita profile` of
# GPT-2 124M at tp 1, micro-batches 1 and 2, two sets of the embedding's
# stage (so a stage is made again after one was timed and released) and
# default timing, then checks the profile holds both points and that the
# embedding's rounds were replayed as CUDA graphs (provenance.runs.
# graph_parts): the path that broke when the token upload's event was
# recorded inside the profiler's capture (2026-11-29, ninth session).
# Then the same profile with the layer timed in a stack of 4 layers
# (--layer-stack 4): both points, each recording its 4 layers. Then the
# layer timed inside the executor's own steps (--timing exec) at tp 1 and 2.
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
[ $? = 0 ] || exit 1
# the layer timed in a stack of 4 (docs/profiles.md, "Layer stack"): both
# points measured, each recording its 4 layers, the stack's rounds timed
# on the device (gated or graphed, not queued on the host clock)
"$build/cli/partita" profile --model "$root/models/gpt2-124m.json" --tp 1 \
    --mbs 1,2 --no-comm --stage-sets 1 --processes 1 --layer-stack 4 \
    -o "$out/profile-stack.json" ||
    { echo "FAIL: partita profile --layer-stack 4"; exit 1; }
python3 - "$out/profile-stack.json" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
runs = profile["provenance"]["runs"]
points = [c for s in profile["shapes"] for c in s["costs"]]
stacked = [e["layers"] for e in runs.get("layers_stacked", [])]
print(f"{len(points)} points, layers stacked {stacked}, "
      f"{runs['queued_parts']} parts queued")
if len(points) != 2 or stacked != [4, 4] or runs["queued_parts"] != 0:
    print("FAIL: expected 2 points of 4 layers each, timed on the device")
    sys.exit(1)
print("PASS profile_smoke --layer-stack 4")
PY
[ $? = 0 ] || exit 1
# the layer timed inside the executor's own steps (--timing exec,
# docs/profiles.md, "Executed timing"): at tp 1 and 2, both points of each
# with their layers executed (whole models of 4 and 2 layers, a part
# chain for each micro-batch) and every layer time positive, no note of
# a layer that fell back to the chain; each head executed (tp 1, where
# what the steps leave beside the layers agrees within 5 %) or stepped
"$build/cli/partita" profile --model "$root/models/gpt2-124m.json" --tp 1,2 \
    --mbs 1,2 --no-comm --stage-sets 1 --processes 1 --layer-stack 4 \
    --timing exec -o "$out/profile-exec.json" ||
    { echo "FAIL: partita profile --timing exec"; exit 1; }
python3 - "$out/profile-exec.json" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
runs = profile["provenance"]["runs"]
points = [c for s in profile["shapes"] for c in s["costs"]]
executed, stepped = runs.get("executed_parts", 0), runs.get("stepped_parts", 0)
layers = [(c["tp"], c["mbs"], c["layer"]["forward_s"], c["layer"]["backward_s"])
          for c in points]
print(f"{len(points)} points, {executed} parts executed, {stepped} stepped, "
      f"layers (tp, mbs, fwd s, bwd s) {layers}")
fallbacks = [n for n in profile["provenance"].get("skipped", [])
             if "stepped, not executed" in n]
if (len(points) != 4 or executed < 4 or executed + stepped != 8 or
        fallbacks or any(f <= 0 or b <= 0 for _, _, f, b in layers)):
    print("FAIL: expected 4 points, each layer executed and each head "
          f"executed or stepped (notes: {fallbacks})")
    sys.exit(1)
print("PASS profile_smoke --timing exec")
PY
