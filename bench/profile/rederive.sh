#!/usr/bin/env bash
# The derived profiles made again from their measured sources, after a
# source changed (issue 35, item 4: profiles/H200.json gains the Llama
# shapes of bench/profile/llama_shapes.sh, and the roofline is fitted on
# them too, each shape with its own layer's kernels). As
# docs/profiles.md ("Re-deriving") says, with the commands the bundled
# files' provenance records: A10, RTX3090, A100-40GB, V100-16GB and
# V100-32GB by `partita profile --derive` from H100, H200, H200-40SM and
# H200-16SM; A100-80GB derived so, then calibrated on the published
# Megatron-DeepSpeed runs (docs/profiles.md, "Calibrated on training
# runs"). Writes profiles/ in place (git diff shows what moved) and
# prints each fit's error; then run `meson test costmodel_roofline
# common_profile_write bench_published_runs e2e-plan-every-profile
# e2e-plan-mixed-derived e2e-derive-profile` and bench/published/run.sh.
# CPU only. A source's head timed fused (head.fused, docs/profiles.md)
# is fitted by the fused head's kernels (costmodel/roofline.c); the
# derived files hold no measured points, so no head.fused of their own.
#
# Usage: bench/profile/rederive.sh BUILD_DIR [DATE]   (DATE: YYYY-MM-DD
# for the provenance, default today, UTC; with the sources unchanged and
# the committed date it rewrites the bundled files as they are, the
# --date in their command line aside)
set -euo pipefail
build=$(cd "${1:?usage: rederive.sh BUILD_DIR [DATE]}" && pwd)
dated=()
[ -n "${2:-}" ] && dated=(--date "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
partita="$build/cli/partita"
runs=../../shared/reference/published-runs/megatron-deepspeed-a100.csv
sources=profiles/H100.json,profiles/H200.json,profiles/H200-40SM.json,profiles/H200-16SM.json
cd "$root"
[ -f "profiles/$runs" ] || { echo "no published runs at profiles/$runs" >&2; exit 77; }
for gpu in A10 RTX3090 A100-40GB V100-16GB V100-32GB; do
    "$partita" profile --derive "$gpu" --from "$sources" \
        ${dated[@]+"${dated[@]}"} -o "profiles/$gpu.json" | grep '^| all ' | sed "s/^/$gpu: /"
done
"$partita" profile --derive A100-80GB --from "$sources" \
    ${dated[@]+"${dated[@]}"} -o profiles/A100-80GB-transferred.json | grep '^| all ' | sed 's/^/A100-80GB: /'
(cd profiles && "$partita" profile --from-logs "$runs" \
    --cluster ../clusters/a100-published.json --precision fp16 \
    --recompute full --runtime megatron --attention unfused \
    --base A100-80GB-transferred.json -o A100-80GB.json.new) | grep '^# [bcw]'
mv profiles/A100-80GB.json.new profiles/A100-80GB.json
rm profiles/A100-80GB-transferred.json
git -C "$root" diff --stat -- profiles
