#!/usr/bin/env bash
# The layer stack on a GPU (docs/profiles.md, "Layer stack"): `partita
# profile` of GPT-2 1.5B at tp 1, micro-batches 1 and 8, the layer timed
# as the mean layer of a stage of 8 layers (--layer-stack 8), one process,
# no curves; prints each point's entries and layers stacked beside what
# exec_bench's stacks gave on one H200 (2026-11-29). Asserts no time:
# it fails only when the profile is not written or lacks a point or its
# record of the layers stacked.
#
# Usage: tests/executor/gpu/layer_stack.sh BUILD_DIR OUT_DIR [K]
set -u
build=$(cd "${1:?usage: layer_stack.sh BUILD_DIR OUT_DIR [K]}" && pwd)
out=${2:?usage: layer_stack.sh BUILD_DIR OUT_DIR [K]}
stack=${3:-8}
root=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
"$build/cli/partita" profile --model "$root/models/gpt2-xl.json" --tp 1 \
    --mbs 1,8 --layer-stack "$stack" --no-comm --stage-sets 1 \
    --processes 1 -o "$out/layer-stack.json" ||
    { echo "FAIL: partita profile"; exit 1; }
python3 - "$out/layer-stack.json" "$stack" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
asked = int(sys.argv[2])
runs = profile["provenance"]["runs"]
stacked = {(e["tp"], e["mbs"]): e["layers"] for e in runs.get("layers_stacked", [])}
points = [c for s in profile["shapes"] for c in s["costs"]]
print(f"--layer-stack {runs['layer_stack']}: {len(points)} points; "
      f"{runs['gated_parts']} parts gated, {runs['graph_parts']} graphed, "
      f"{runs['queued_parts']} queued")
print("  tp  mbs  layers  layer fwd ms  layer bwd ms")
for c in points:
    layers = stacked.get((c["tp"], c["mbs"]), 1)
    print(f"  {c['tp']:2d}  {c['mbs']:3d}  {layers:6d}  "
          f"{c['layer']['forward_s'] * 1e3:12.3f}  "
          f"{c['layer']['backward_s'] * 1e3:12.3f}")
print("reference, one H200, mbs 8 (exec_bench slopes per layer, 8 -> 48 "
      "layers): forward ~1.005 ms, backward ~2.296 ms; the lone layer "
      "profiled 0.885 / 2.057 ms")
for note in profile["provenance"]["skipped"]:
    print(f"note: {note}")
if runs["layer_stack"] != asked or len(points) != 2 or \
        sorted(stacked) != sorted((c["tp"], c["mbs"]) for c in points):
    print("FAIL: expected 2 points, each with its layers stacked")
    sys.exit(1)
print("PASS layer_stack (times printed, not checked)")
PY
