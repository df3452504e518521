#!/usr/bin/env bash
# End-to-end tests of `partita profile --layer-stack K` on the cpu backend
# (the layer timed as the mean layer of a stage of K layers): accepted and
# recorded in the provenance for every point, cut to the model's layers,
# the same profile as without it at K = 1 (times and provenance aside),
# with tp 2, a Llama-family layer, --processes, --missing-only and
# --compare; bad values refused. No time is asserted. e2e.sh's
# conventions.
# usage: profile_stack.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, run_profile, expect_in; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"

# A GPT-2-like model of LAYERS layers small enough for the cpu backend to
# profile in a second.
write_stack_model() { # FILE LAYERS
  cat >"$1" <<JSON
{ "name": "tiny", "layers": $2, "hidden": 64, "heads": 4, "seq": 32,
  "vocab": 512 }
JSON
}

# Checks that PROFILE asked for a stack of ASKED layers and that every
# point of its shapes stacked LAYERS: one provenance entry per point.
expect_stacked() { # PROFILE ASKED LAYERS
  python3 - "$@" <<'PY' || fail "$1: layers stacked are not $3 at every point"
import json, sys
profile = json.load(open(sys.argv[1]))
asked, layers = int(sys.argv[2]), int(sys.argv[3])
runs = profile["provenance"]["runs"]
assert runs["layer_stack"] == asked, runs["layer_stack"]
points = {(c["tp"], c["mbs"]) for s in profile["shapes"] for c in s["costs"]}
stacked = {(e["tp"], e["mbs"]): e["layers"] for e in runs["layers_stacked"]}
assert set(stacked) == points, (stacked, points)
assert all(v == layers for v in stacked.values()), stacked
for s in profile["shapes"]:
    for c in s["costs"]:
        assert c["layer"]["forward_s"] > 0 and c["layer"]["backward_s"] > 0
PY
}

case "$case_name" in
profile-stack)
  # a stack of 2 of 4 layers at tp 1 and 2, in two processes: every point
  # has its layer entries and says it stacked 2
  write_stack_model in-tiny.json 4
  run 0 partita profile --help
  expect_in out.txt "--layer-stack K"
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1,2 --mbs 1,2 --processes 2 --layer-stack 2 -o stack.json
  [ "$(grep -c '"mbs"' stack.json)" = 8 ] || fail "expected 4 points and 4 provenance entries"
  expect_stacked stack.json 2 2
  expect_in stack.json 'the mean layer of a stack'
  expect_in out.txt "layers stacked"
  # more layers than the model holds: cut to its 4, with a note
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1 --mbs 1 --layer-stack 8 -o cut.json
  expect_stacked cut.json 8 4
  expect_in cut.json "a layer stack of the model's 4 layers, not 8"
  ;;
profile-stack-one)
  # --layer-stack 1 is the profile without the option: the same fields in
  # the same order, the same points, times and provenance aside
  write_stack_model in-tiny.json 2
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1,2 --mbs 1,2 -o plain.json
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1,2 --mbs 1,2 --layer-stack 1 -o one.json
  expect_in one.json '"layer_stack": 1'
  ! grep -q layers_stacked one.json || fail "one.json lists layers stacked"
  python3 - plain.json one.json <<'PY' || fail "--layer-stack 1 changed the profile"
import json, sys
def masked(value, key=""):
    if isinstance(value, dict):
        return {k: masked(v, k) for k, v in value.items() if k != "provenance"}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if key.endswith("_s") or key.endswith("_spread") or key.endswith("_s_per_param"):
        return 0
    return value
a, b = (json.dumps(masked(json.load(open(f)))) for f in sys.argv[1:])
assert a == b, (a, b)
PY
  ;;
profile-stack-llama)
  # a Llama-family layer (grouped-query attention split at tp 2) stacked
  run_profile partita profile --model "$source_root/tests/data/models/llama-tiny.json" --backend cpu --quick --tp 1,2 --mbs 1 --layer-stack 3 -o llama.json
  expect_stacked llama.json 3 3
  ;;
profile-stack-missing)
  # --missing-only adds points stacked otherwise than the profile's: said,
  # and recorded in the additions' provenance; --compare says the two
  # profiles' layer entries are not alike
  write_stack_model in-tiny.json 2
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1 --mbs 1 -o cpu.json
  cp cpu.json lone.json
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1,2 --mbs 1 --layer-stack 2 --missing-only -o cpu.json
  expect_in err.txt "cpu.json's layer entries were measured with --layer-stack 1, the points added with 2"
  expect_in out.txt "added 1 points to cpu.json"
  python3 - cpu.json <<'PY' || fail "the addition's provenance lacks its layer stack"
import json, sys
additions = json.load(open(sys.argv[1]))["provenance"]["additions"]
runs = additions[-1]["runs"]
assert runs["layer_stack"] == 2
assert [(e["tp"], e["layers"]) for e in runs["layers_stacked"]] == [(2, 2)]
PY
  run_profile partita profile --model in-tiny.json --backend cpu --quick --tp 1 --mbs 1 --layer-stack 2 -o stacked.json
  run 0 partita profile --compare lone.json stacked.json --tolerance 1000000
  expect_in out.txt "layer entries: A's the mean layer of a stack of 1, B's of 2"
  run 0 partita profile --compare lone.json lone.json
  ! grep -q "layer entries" out.txt || fail "a profile compared with itself differs in its stack"
  ;;
profile-stack-bad)
  # bad values: exit 2, one line naming the option, nothing written
  write_stack_model in-tiny.json 2
  for value in 0 -3 two 1.5 257 1e9 ''; do
    run 2 partita profile --model in-tiny.json --backend cpu --quick --layer-stack "$value" -o never.json
    expect_in err.txt "^partita profile: --layer-stack: expected"
    [ "$(wc -l <err.txt)" = 1 ] || fail "'$value': more than one line: $(cat err.txt)"
    [ ! -e never.json ] || fail "never.json written for '$value'"
  done
  run 2 partita profile --model in-tiny.json --backend cpu --quick --layer-stack
  expect_in err.txt "layer-stack"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
