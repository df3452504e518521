#!/usr/bin/env bash
# End-to-end tests of `partita exec` and `partita report` on bundled
# files and tiny plans (split from e2e.sh, whose conventions they keep).
# usage: exec_report.sh PARTITA CASE   (run by meson, one test per case)
# PARTITA_WRAPPER, when set, runs partita under it (valgrind, say).
set -u
# fail, run, expect_in, prep_corpus, write_tiny_plan, no_leftovers; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"
models="$source_root/models"
clusters="$source_root/clusters"

case "$case_name" in
exec-tiny)
  prep_corpus
  write_tiny_plan in-plan.json
  run 0 partita exec in-plan.json --data in-corpus --backend cpu --iters 6 --log-interval 3
  expect_in out.txt "iteration        3/       6 | elapsed time per iteration (ms): "
  expect_in out.txt "iteration        6/       6 |"
  expect_in out.txt "| tokens/s: "
  expect_in out.txt "| TFLOP/s per GPU: "
  expect_in out.txt "| lm loss: 5\.[0-9]*E+00 |"
  expect_in out.txt "| grad norm: "
  expect_in out.txt "| learning rate: "
  expect_in out.txt "| memory (GiB): "
  [ "$(grep -c '^iteration' out.txt)" = 2 ] || fail "expected 2 log lines"
  [ -s run.json ] || fail "run.json not written"
  expect_in run.json '"format": "partita-run/1"'
  expect_in run.json '"name": "cpu ('
  expect_in run.json '"kind": "fwd"'
  expect_in run.json '"kind": "bwd"'
  expect_in run.json '"kind": "optimizer"'
  expect_in run.json '"microbatch": -1'
  expect_in run.json '"step_time_s"'
  expect_in run.json '"tokens_per_s"'
  expect_in run.json '"tflops_per_gpu"'
  expect_in run.json '"peak_memory_gib"'
  expect_in run.json '"jansson"'
  expect_in run.json '"hidden": 16'
  [ "$(grep -c '"learning_rate"' run.json)" = 6 ] || fail "expected 6 iterations in run.json"
  ;;
exec-resume)
  prep_corpus
  write_tiny_plan in-plan.json
  run 0 partita exec in-plan.json --data in-corpus --iters 4 --save ckpt --save-interval 2 -o first.json
  expect_in out.txt "checkpoint: iteration 2 saved to ckpt"
  expect_in out.txt "checkpoint: iteration 4 saved to ckpt"
  [ -s ckpt/manifest.json ] || fail "no checkpoint written"
  run 0 partita exec in-plan.json --data in-corpus --iters 6 --load ckpt -o second.json
  expect_in out.txt "checkpoint: loading ckpt (every blob read and checked"
  # the checking's progress: at least its last line, every blob counted
  expect_in out.txt "checkpoint: checked 0.0 of 0.0 GiB (\([0-9]*\) of \1 blobs) in [0-9]* s"
  expect_in out.txt "checkpoint: restored 0.0 of 0.0 GiB (3 of 3 blobs) in [0-9]* s"
  expect_in out.txt "iteration        6/       6"
  grep -q "iteration        4/" out.txt && fail "a resumed run repeated iteration 4"
  expect_in second.json '"resumed_from": "ckpt"'
  expect_in second.json '"first_iteration": 5'
  # a checkpoint is refused for a model of another shape
  sed 's/"hidden": 16/"hidden": 24/' in-plan.json >in-wide.json
  run 2 partita exec in-wide.json --data in-corpus --iters 8 --load ckpt -o wide.json
  expect_in err.txt "model.hidden is 16"
  [ ! -e wide.json ] || fail "run.json written by a refused run"
  ;;
exec-save-refuses)
  # issue 18, item 4: a fresh run does not replace another run's
  # checkpoint unless told to, and the generation before is kept
  prep_corpus
  write_tiny_plan in-plan.json
  run 0 partita exec in-plan.json --data in-corpus --iters 10 --save ckpt -o first.json
  cp ckpt/manifest.json in-manifest-before.json
  run 2 partita exec in-plan.json --data in-corpus --iters 3 --save ckpt -o second.json
  expect_in err.txt "ckpt: the folder already holds a checkpoint"
  expect_in err.txt "\-\-overwrite"
  [ "$(wc -l <err.txt)" = 1 ] || fail "expected one line: $(cat err.txt)"
  grep -q '^iteration' out.txt && fail "trained before refusing"
  cmp -s ckpt/manifest.json in-manifest-before.json || fail "the checkpoint changed"
  [ ! -e second.json ] || fail "a refused run wrote run.json"
  run 0 partita exec in-plan.json --data in-corpus --iters 3 --save ckpt --overwrite -o third.json
  python3 - <<'PY' || fail "the generations are not the expected ones"
import glob, json
gens = sorted(glob.glob("ckpt/gen-*"))
assert len(gens) == 2, gens
its = [json.load(open(g + "/meta.json"))["iteration"] for g in gens]
assert its == [10, 3], its
PY
  # the older generation resumes from its folder
  old=$(ls -d ckpt/gen-* | head -1)
  run 0 partita exec in-plan.json --data in-corpus --iters 11 --load "$old" -o resumed.json
  expect_in resumed.json '"first_iteration": 11'
  run 2 partita exec in-plan.json --data in-corpus --overwrite
  expect_in err.txt "\-\-overwrite needs \-\-save"
  run 2 partita exec in-plan.json --data in-corpus --save ckpt --keep-checkpoints 0
  expect_in err.txt "keep-checkpoints"
  ;;
exec-signal)
  # issue 18, item 6: SIGTERM during a run says at once that it stops,
  # then which iteration it came during; run.json holds what finished, the
  # checkpoint is that iteration's, the exit status is 128 + 15
  prep_corpus
  # 16 micro-batches an iteration: the signal mostly lands inside one,
  # which a one-stage run abandons (either way the checks below hold)
  write_layout_plan in-plan.json 1 1 1 1
  sed -i 's/"gbs": 4/"gbs": 16/' in-plan.json
  # the binary itself (not the wrapper function), so the signal reaches it
  "$partita_binary" exec in-plan.json --data in-corpus --iters 1000000 --log-interval 1 --save ckpt >out.txt 2>err.txt &
  pid=$!
  for _ in $(seq 1 200); do
    grep -q '^iteration        2/' out.txt && break
    sleep 0.05
  done
  kill -TERM "$pid"
  wait "$pid"
  status=$?
  [ "$status" = 143 ] || { cat out.txt err.txt; fail "exit $status after SIGTERM, expected 143"; }
  expect_in err.txt "partita exec: SIGTERM received: stopping"
  expect_in out.txt "exec: stopped early: SIGTERM during iteration [0-9]* of 1000000"
  expect_in run.json '"stopped_early": true'
  expect_in run.json '"stop_reason": "SIGTERM during iteration'
  [ -s ckpt/manifest.json ] || fail "no checkpoint written on SIGTERM"
  python3 - <<'PY' || fail "run.json and the checkpoint disagree"
import glob, json
run = json.load(open("run.json"))
last = run["iterations"][-1]["iteration"]
training = run["training"]
assert training["last_checkpoint_iteration"] == last, (training, last)
interrupted = training["interrupted_iteration"]
assert interrupted is None or interrupted == last + 1, (interrupted, last)
gen = sorted(glob.glob("ckpt/gen-*"))[-1]
assert json.load(open(gen + "/meta.json"))["iteration"] == last
PY
  # the checkpoint resumes
  last=$(python3 -c "import json; print(json.load(open('run.json'))['iterations'][-1]['iteration'])")
  run 0 partita exec in-plan.json --data in-corpus --iters $((last + 1)) --load ckpt -o resumed.json
  expect_in resumed.json "\"first_iteration\": $((last + 1))"
  ;;
exec-nan)
  # issue 18, item 5: a loss that turns NaN ends the run with run.json of
  # the iterations done and the reason, exit 1; the last good checkpoint
  # stays (a state that is not finite is never saved over it)
  prep_corpus
  write_tiny_plan in-plan.json
  run 0 partita exec in-plan.json --data in-corpus --iters 2 --save ckpt -o first.json
  # AdamW's second moments made negative: iteration 3's update takes their
  # square root, so the parameters turn NaN and iteration 4's loss too
  python3 - <<'PY' || fail "could not spoil the checkpoint"
import glob, json, os, struct, zlib
gen = sorted(glob.glob("ckpt/gen-*"))[-1]
path = gen + "/adam_v"
count = len(open(path, "rb").read()) // 4
spoiled = struct.pack("<%df" % count, *([-1.0] * count))
open(path, "wb").write(spoiled)
for manifest in ("ckpt/manifest.json", gen + "/generation.json"):
    if not os.path.exists(manifest):
        continue
    m = json.load(open(manifest))
    for blob in m["blobs"]:
        if blob["name"] == "adam_v":
            blob["crc32"] = "%08x" % zlib.crc32(spoiled)
    json.dump(m, open(manifest, "w"))
PY
  cp -r ckpt in-spoiled
  run 1 partita exec in-plan.json --data in-corpus --iters 10 --log-interval 1 --load ckpt -o nan.json
  expect_in err.txt "iteration 4: the loss (-\?nan) or the gradient norm"
  expect_in out.txt "exec: stopped early: iteration 4: the loss"
  python3 - nan.json <<'PY' || fail "run.json of the iterations done is not as expected"
import json, sys
run = json.load(open(sys.argv[1]))
assert [i["iteration"] for i in run["iterations"]] == [3], run["iterations"]
assert run["training"]["stopped_early"] is True
assert "not finite" in run["training"]["stop_reason"], run["training"]
PY
  # saving after iteration 3 would write NaN parameters: refused, the
  # checkpoint of iteration 2 stays
  cp ckpt/manifest.json in-manifest-before.json
  run 1 partita exec in-plan.json --data in-corpus --iters 10 --log-interval 1 --load ckpt --save ckpt --save-interval 1 -o saved.json
  expect_in err.txt "params holds a value that is not finite"
  expect_in err.txt "the checkpoint before it stays"
  cmp -s ckpt/manifest.json in-manifest-before.json || fail "the checkpoint was replaced"
  expect_in saved.json '"stopped_early": true'
  ;;
exec-bad)
  prep_corpus
  write_tiny_plan in-tp4.json 4
  sed -i 's/"tp": 1, "dp": 1, "pp": 4/"tp": 4, "dp": 1, "pp": 1/' in-tp4.json
  run 2 partita exec in-tp4.json --data in-corpus
  expect_in err.txt "tp 4 must divide the 2 heads"
  write_tiny_plan in-plan.json
  run 2 partita exec in-plan.json --data in-missing
  expect_in err.txt "in-missing.idx"
  write_tiny_plan in-small-vocab.json 1 100
  run 2 partita exec in-small-vocab.json --data in-corpus
  expect_in err.txt "vocab 100"
  expect_in err.txt "token 256"
  run 2 partita exec in-plan.json --data in-corpus --iters 0
  expect_in err.txt "\-\-iters"
  run 2 partita exec in-plan.json --data in-corpus --iters ten
  expect_in err.txt "'ten'"
  run 2 partita exec in-plan.json --data in-corpus --backend tpu
  expect_in err.txt "tpu"
  run 2 partita exec in-plan.json
  expect_in err.txt "\-\-data"
  run 2 partita exec in-plan.json --data in-corpus --load in-no-checkpoint
  expect_in err.txt "manifest.json"
  run 2 partita exec in-plan.json --data in-corpus --comm-timeout 0
  expect_in err.txt "\-\-comm-timeout: expected a positive number of seconds"
  run 0 partita exec --help
  expect_in out.txt "usage: partita exec"
  expect_in out.txt "\-\-comm-timeout S"
  no_leftovers
  ;;
report-run)
  report_fixtures="$source_root/tests/data/report"
  # the fixture is a cpu run of an A100 plan: compared only when asked
  run 0 partita report "$report_fixtures/plan.json" "$report_fixtures/run.json" -o out/nested --any-device
  for file in report.md trace.json timeline.png timeline.svg stages.png \
              stages.svg memory.png memory.svg step_time.png step_time.svg; do
    [ -s "out/nested/$file" ] || fail "out/nested/$file missing or empty"
  done
  [ -z "$(ls -A out/nested | grep '^\.')" ] || fail "temporary files left in out/nested"
  [ ! -s out.txt ] || fail "report printed on standard output"
  expect_in out/nested/report.md "| step time |"
  expect_in out/nested/report.md "| 0 | A100-FASOP | 2 | forward |"
  expect_in out/nested/report.md "step_time.png"
  head -c 8 out/nested/timeline.png | grep -q PNG || fail "timeline.png is not a PNG"
  expect_in out/nested/timeline.svg "<svg"
  if command -v python3 >/dev/null; then
    python3 - out/nested/trace.json <<'PY' || fail "trace.json is not the expected trace"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
complete = [e for e in events if e["ph"] == "X"]
tids = {e["tid"] for e in complete}
assert tids == {1, 2}, tids
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
assert names == {"estimated", "measured"}, names
# the measured forward of micro-batch 0 lasts hundreds of ms: us units
fwd = [e for e in complete if e["tid"] == 2 and e["name"] == "fwd 0"][0]
assert fwd["dur"] > 1000, fwd
PY
  else
    expect_in out/nested/trace.json '"traceEvents"'
    expect_in out/nested/trace.json '"ph":"X"'
  fi
  ;;
report-other-device)
  # issue 18, item 12: a run on the cpu backend is not compared with the
  # estimate of the plan's GPUs (+287,904 %) unless --any-device is given
  report_fixtures="$source_root/tests/data/report"
  run 0 partita report "$report_fixtures/plan.json" "$report_fixtures/run.json" -o out
  expect_in err.txt "run.json: not compared: it ran on the cpu reference backend, the plan is for A100-FASOP GPUs"
  [ "$(grep -c 'not compared' err.txt)" = 1 ] || fail "expected one line saying why"
  expect_in out/report.md "Run not compared: "
  ! grep -q 'step_time.png' out/report.md || fail "the run was compared"
  ! grep -q '| [+-][0-9][0-9,.]* % |' out/report.md || fail "an error in % was shown"
  [ ! -e out/step_time.png ] || fail "a step time chart of the run was drawn"
  run 0 partita report "$report_fixtures/plan.json" "$report_fixtures/run.json" -o out --any-device
  expect_in out/report.md "The run used the cpu reference backend"
  grep -q '| [+-][0-9][0-9,.]* % |' out/report.md || fail "--any-device did not compare the run"
  [ -s out/step_time.png ] || fail "--any-device drew no step time chart"
  ;;
report-gnuplot-hangs)
  # issue 18, item 17: a gnuplot that hangs is stopped after
  # PARTITA_GNUPLOT_TIMEOUT, and no chart of an older report stays
  report_fixtures="$source_root/tests/data/report"
  run 0 partita report "$report_fixtures/plan.json" "$report_fixtures/run.json" -o out --any-device
  [ -s out/step_time.png ] && [ -s out/timeline.svg ] || fail "charts not drawn"
  printf '#!/bin/sh\nsleep 300\n' >in-hang.sh
  chmod +x in-hang.sh
  PARTITA_GNUPLOT="$work/in-hang.sh" PARTITA_GNUPLOT_TIMEOUT=1 run 0 partita report "$report_fixtures/plan.json" -o out
  expect_in err.txt "in-hang.sh' did not finish in 1 s: stopped"
  expect_in out/report.md "Charts are missing"
  [ -z "$(ls -A out | grep -v -e '^report.md$' -e '^trace.json$')" ] || fail "charts of the older report left: $(ls -A out)"
  run 0 partita report "$report_fixtures/plan.json" "$report_fixtures/run.json" -o out --any-device
  [ -s out/step_time.png ] || fail "charts not drawn"
  run 0 partita report "$report_fixtures/plan.json" -o out
  [ ! -e out/step_time.png ] && [ ! -e out/step_time.svg ] || fail "the older report's step_time chart stayed"
  [ -s out/timeline.png ] || fail "timeline not drawn"
  PARTITA_GNUPLOT_TIMEOUT=soon run 2 partita report "$report_fixtures/plan.json" -o out
  expect_in err.txt "PARTITA_GNUPLOT_TIMEOUT: expected seconds"
  ;;
report-plan-only)
  run 0 partita report "$source_root/tests/data/report/plan.json" -o out
  for file in report.md trace.json timeline.png timeline.svg stages.png \
              stages.svg memory.png memory.svg; do
    [ -s "out/$file" ] || fail "out/$file missing or empty"
  done
  [ ! -e out/step_time.png ] || fail "step_time.png drawn without a run"
  expect_in out/report.md "No run given"
  expect_in out/trace.json '"estimated"'
  if grep -q '"measured"' out/trace.json; then fail "measured track without a run"; fi
  # 32 ranks in 8 stages: a lane and a memory row per stage, per rank
  # when asked
  run 0 partita report "$source_root/docs/examples/plan-gpt2xl-hetero.json" -o hetero
  expect_in hetero/report.md "| 7 | 28-31 | A100-FASOP |"
  expect_in hetero/timeline.svg "stage 7 estimated"
  if grep -q "rank 31 estimated" hetero/timeline.svg; then fail "a lane per rank by default"; fi
  [ -s hetero/timeline.png ] || fail "hetero timeline missing"
  run 0 partita report "$source_root/docs/examples/plan-gpt2xl-hetero.json" -o hetero-ranks --per-rank
  expect_in hetero-ranks/report.md "| 31 | 7 |"
  expect_in hetero-ranks/timeline.svg "rank 31 estimated"
  python3 - hetero/trace.json hetero-ranks/trace.json <<'PY' || fail "unexpected trace processes"
import json, sys
for path, count in (sys.argv[1], 8), (sys.argv[2], 32):
    events = json.load(open(path))["traceEvents"]
    names = [e for e in events if e["name"] == "process_name"]
    assert len(names) == count, (path, len(names))
PY
  ;;
report-no-gnuplot)
  report_fixtures="$source_root/tests/data/report"
  PARTITA_GNUPLOT=/nonexistent run 0 partita report "$report_fixtures/plan.json" "$report_fixtures/run.json" -o out --any-device
  expect_in err.txt "warning: no charts"
  expect_in err.txt "/nonexistent"
  [ "$(grep -c warning err.txt)" = 1 ] || fail "expected one warning line"
  [ -s out/report.md ] && [ -s out/trace.json ] || fail "tables or trace missing"
  expect_in out/report.md "Charts are missing"
  expect_in out/report.md "| step time |"
  [ -z "$(ls -A out | grep -v -e '^report.md$' -e '^trace.json$')" ] || fail "stray files: $(ls -A out)"
  mkdir empty-path
  PATH="$work/empty-path" run 0 partita report "$report_fixtures/plan.json" -o out2
  expect_in err.txt "gnuplot"
  [ -s out2/report.md ] && [ -s out2/trace.json ] || fail "tables or trace missing without gnuplot on PATH"
  PARTITA_GNUPLOT=false run 0 partita report "$report_fixtures/plan.json" -o out3
  expect_in err.txt "failed"
  expect_in out3/report.md "Charts are missing"
  ;;
report-bad)
  report_fixtures="$source_root/tests/data/report"
  sed 's/"peak_memory_gib": \[/"peak_memory_gib": [ "lots", /' \
    "$report_fixtures/run.json" >in-bad-run.json
  grep -q '"lots"' in-bad-run.json || fail "could not break the run fixture"
  run 2 partita report "$report_fixtures/plan.json" in-bad-run.json -o out
  expect_in err.txt "in-bad-run.json"
  expect_in err.txt "peak_memory_gib"
  [ ! -e out ] || fail "a bad run left a report folder"
  echo '{ "format": "partita-run/1", ' >in-truncated.json
  run 2 partita report "$report_fixtures/plan.json" in-truncated.json -o out
  expect_in err.txt "in-truncated.json"
  run 2 partita report "$report_fixtures/plan.json" in-missing.json -o out
  expect_in err.txt "in-missing.json"
  write_tiny_plan in-other-plan.json
  run 2 partita report in-other-plan.json "$report_fixtures/run.json" -o out
  expect_in err.txt "plan.gbs"
  run 2 partita report
  run 2 partita report a b c
  run 0 partita report --help
  expect_in out.txt "usage: partita report"
  no_leftovers
  ;;
exec-pp2)
  # a pipeline of two stages (3 + 1 layers) on a node of 2 "gpus": its
  # ranks run as threads on the cpu backend
  prep_corpus
  write_layout_plan in-pp2.json 1 1 1 2 ', "partition": "3-1"'
  run 0 partita exec in-pp2.json --data in-corpus --iters 4 --log-interval 2 --save ckpt
  [ "$(grep -c '^iteration' out.txt)" = 2 ] || fail "expected 2 log lines"
  expect_in out.txt "iteration        4/       4 |"
  expect_in out.txt "| lm loss: 5\.[0-9]*E+00 |"
  expect_in out.txt "2 ranks (pp 2 x dp 1 x tp 1)"
  [ -s run.json ] || fail "run.json not written"
  [ "$(grep -c '"memory_cap_gib"' run.json)" = 2 ] || fail "expected 2 devices in run.json"
  expect_in run.json '"kind": "send_fwd"'
  expect_in run.json '"kind": "recv_bwd"'
  expect_in run.json '"rank": 1'
  [ -s ckpt/manifest.json ] || fail "no checkpoint written"
  expect_in ckpt/manifest.json 'params.rank1'
  run 0 partita exec in-pp2.json --data in-corpus --iters 6 --load ckpt -o resumed.json
  expect_in resumed.json '"first_iteration": 5'
  sed 's/"3-1"/"2-2"/' in-pp2.json >in-other.json
  run 2 partita exec in-other.json --data in-corpus --iters 8 --load ckpt -o other.json
  expect_in err.txt "partition\[0\] is 3 layers"
  # on cuda the plan is checked against this machine's GPUs first: no GPU
  # (or no cuda backend, or one built without NCCL), or GPUs that are not
  # the cluster's A100s
  run 2 partita exec in-pp2.json --data in-corpus --backend cuda -o cuda.json
  grep -q -e "GPU" -e "device" -e "cuda backend is not built" -e "NCCL" err.txt ||
    { cat err.txt; fail "the cuda refusal does not name the GPUs"; }
  ;;
exec-zero1)
  # data parallel over 2 "gpus" with the distributed optimizer (ZeRO-1):
  # each rank keeps half of the AdamW state, the losses are those of the
  # replicated optimizer
  prep_corpus
  write_layout_plan in-dp2.json 1 1 2 1
  write_layout_plan in-zero1.json 1 1 2 1 ', "distributed_optimizer": true'
  run 0 partita exec in-dp2.json --data in-corpus --iters 3 --log-interval 1 -o plain.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt >plain-loss.txt
  run 0 partita exec in-zero1.json --data in-corpus --iters 3 --log-interval 1 --save ckpt -o zero1.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt >zero1-loss.txt
  [ "$(wc -l <zero1-loss.txt)" = 3 ] || fail "expected 3 loss lines"
  cmp -s plain-loss.txt zero1-loss.txt ||
    { paste plain-loss.txt zero1-loss.txt; fail "ZeRO-1 changed the losses"; }
  ! grep -q "ZeRO-1 is not built" zero1.json || fail "exec still says ZeRO-1 is not built"
  generation=$(ls -d ckpt/*/ | tail -1)
  expect_in "$generation/meta.json" '"distributed_optimizer": true'
  params=$(stat -c %s "$generation/params.rank0")
  moments=$(stat -c %s "$generation/adam_m.rank0")
  [ "$moments" -lt "$params" ] || fail "adam_m.rank0 ($moments B) is not a shard of params.rank0 ($params B)"
  run 2 partita exec in-dp2.json --data in-corpus --iters 5 --load ckpt -o other.json
  expect_in err.txt "distributed_optimizer"
  ;;
exec-gpu-comm)
  # --gpu-comm: its values, its refusal on the cpu backend, and ranks that
  # share a GPU (NCCL cannot run them; the host-staged comm can, so on a
  # machine without a GPU only the device check refuses it). Nothing is
  # written.
  prep_corpus
  write_layout_plan in-pp2.json 1 1 1 2 ', "partition": "3-1"'
  run 2 partita exec in-pp2.json --data in-corpus --gpu-comm bogus
  expect_in err.txt "expected auto, nccl or host, got 'bogus'"
  run 2 partita exec in-pp2.json --data in-corpus --gpu-comm host -o cpu.json
  expect_in err.txt "chooses how the ranks of the cuda backend communicate"
  sed 's/"latency_us": 5 }/"latency_us": 5 },\n        "devices": [ { "index": 0, "sm_limit": 88 }, { "index": 0, "sm_limit": 40 } ]/' \
    in-pp2.json >in-shared.json
  expect_in in-shared.json '"sm_limit": 40'
  run 2 partita exec in-shared.json --data in-corpus --backend cuda --gpu-comm nccl -o shared.json
  grep -q -e "ranks 0 and 1 share cuda device 0, and NCCL needs a GPU per rank" \
       -e "built without" -e "cuda backend is not built" err.txt ||
    { cat err.txt; fail "NCCL over ranks sharing a GPU was not refused"; }
  run 2 partita exec in-shared.json --data in-corpus --backend cuda -o shared.json
  grep -q -e "GPU" -e "device" -e "cuda backend is not built" err.txt ||
    { cat err.txt; fail "the cuda refusal does not name the GPUs"; }
  ! grep -q "NCCL" err.txt || { cat err.txt; fail "auto chose NCCL for ranks sharing a GPU"; }
  [ ! -e cpu.json ] && [ ! -e shared.json ] || fail "a refused run wrote its record"
  # the README's example of a pipeline on one H200 split 80 + 40 SMs
  run 0 partita estimate "$source_root/docs/examples/plan-pp2-one-h200.json"
  expect_in out.txt "partition 10-2"
  expect_in out.txt "H200-40SM"
  ;;
exec-recompute)
  # full activation recompute, one stage and a pipeline of two: the same
  # losses as without it, less activation memory, no note that it was
  # not applied
  prep_corpus
  for pp in 1 2; do
    partition=""
    [ "$pp" = 2 ] && partition=', "partition": "3-1"'
    write_layout_plan in-keep.json 2 1 1 "$pp" "$partition"
    write_layout_plan in-recompute.json 2 1 1 "$pp" "$partition, \"recompute\": \"full\""
    run 0 partita exec in-keep.json --data in-corpus --iters 3 --log-interval 1 -o keep.json
    grep -o 'lm loss: [0-9.E+-]*' out.txt >keep-loss.txt
    run 0 partita exec in-recompute.json --data in-corpus --iters 3 --log-interval 1 -o recompute.json
    grep -o 'lm loss: [0-9.E+-]*' out.txt >recompute-loss.txt
    [ "$(wc -l <keep-loss.txt)" = 3 ] || fail "expected 3 loss lines"
    cmp -s keep-loss.txt recompute-loss.txt ||
      { paste keep-loss.txt recompute-loss.txt; fail "recompute changed the losses"; }
    python3 - keep.json recompute.json <<'PY' || fail "recompute did not lower the peak memory"
import json, sys
keep = json.load(open(sys.argv[1]))["peak_memory_gib"]
rc = json.load(open(sys.argv[2]))["peak_memory_gib"]
assert sum(rc) < sum(keep), (keep, rc)
assert not any("recompute" in n for n in json.load(open(sys.argv[2]))["notes"])
PY
  done
  ;;
exec-deterministic)
  # --deterministic (Megatron-LM's --deterministic-mode): on the cpu the
  # same losses (it always is); the run's plan says so; a plan's own
  # "deterministic" is exported to Megatron-LM with the flag and Transformer
  # Engine's switch
  prep_corpus
  write_tiny_plan in-plan.json
  run 0 partita exec in-plan.json --data in-corpus --iters 3 --log-interval 1 -o plain.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt >plain-loss.txt
  run 0 partita exec in-plan.json --data in-corpus --iters 3 --log-interval 1 --deterministic -o det.json
  grep -o 'lm loss: [0-9.E+-]*' out.txt >det-loss.txt
  [ "$(wc -l <det-loss.txt)" = 3 ] || fail "expected 3 loss lines"
  cmp -s plain-loss.txt det-loss.txt || fail "--deterministic changed the cpu losses"
  expect_in det.json '"deterministic": true'
  grep -q '"deterministic"' plain.json && fail "a plain run's plan says deterministic"
  sed 's/"pp": 1 }/"pp": 1, "deterministic": true }/' in-plan.json >in-det.json
  expect_in in-det.json '"deterministic": true'
  run 0 partita export in-det.json --to megatron -o launch.sh
  expect_in launch.sh "--deterministic-mode"
  expect_in launch.sh "export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0"
  run 0 partita export in-plan.json --to megatron -o plain.sh
  grep -q "deterministic" plain.sh && fail "a plain plan exported deterministic"
  # estimate says how a deterministic plan's time is priced
  run 0 partita estimate in-det.json
  expect_in out.txt "# deterministic: cuDNN's deterministic attention backward"
  run 0 partita estimate in-plan.json
  grep -q "# deterministic" out.txt && fail "a plain plan's estimate says deterministic"
  # partita plan --deterministic: every plan says so, and on a shape cuDNN
  # takes, in a stage without the head's logits to lend it, its attention
  # workspace (B x H x T x T bf16) costs more memory
  for how in plain det; do
    flag=""; [ "$how" = det ] && flag="--deterministic"
    run 0 partita plan --model gpt2-350m --cluster h200x8 --gbs 64 --tp 1 --pp 2 --mbs 8 $flag --quiet -o plan-$how.json
  done
  expect_in plan-det.json '"deterministic": true'
  grep -q '"deterministic"' plan-plain.json && fail "a plain plan says deterministic"
  python3 - <<'PY' || fail "the deterministic plan's memory is not the larger"
import json
m = {h: json.load(open('plan-%s.json' % h))['estimate']['stages'][0]['peak_memory_gib']
     for h in ('plain', 'det')}
assert m['det'] > m['plain'], m
PY
  ;;
exec-tp2)
  # Megatron tensor parallelism over 2 "gpus" on the cpu backend, with a
  # pipeline of 2 stages: 4 ranks as threads
  prep_corpus
  write_layout_plan in-tp2.json 1 2 1 2 ', "partition": "1-3"'
  run 0 partita exec in-tp2.json --data in-corpus --iters 3 --log-interval 1 --save ckpt
  expect_in out.txt "4 ranks (pp 2 x dp 1 x tp 2)"
  expect_in out.txt "iteration        3/       3 |"
  [ "$(grep -c '"memory_cap_gib"' run.json)" = 4 ] || fail "expected 4 devices in run.json"
  expect_in ckpt/manifest.json 'params.rank3'
  run 0 partita exec in-tp2.json --data in-corpus --iters 4 --load ckpt -o resumed.json
  expect_in resumed.json '"first_iteration": 4'
  ;;
exec-tp-spans-nodes)
  # nodes of 2 and 4 GPUs, tp 4: stage 0's tp group spans the two small
  # nodes, stage 1 fills the big one. plan, estimate and exec take it.
  prep_corpus
  cat >in-plan.json <<JSON
{ "model": { "name": "tiny", "layers": 4, "hidden": 16, "heads": 4,
             "seq": 16, "vocab": 257 },
  "cluster": { "name": "mixed-sizes", "nodes": [
      { "name": "small", "count": 2, "gpu": "A10-FASOP", "gpus": 2,
        "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 },
        "inter_node": { "bandwidth_Gbps": 50, "latency_us": 20 } },
      { "name": "big", "gpu": "A100-FASOP", "gpus": 4,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 },
        "inter_node": { "bandwidth_Gbps": 400, "latency_us": 20 } } ] },
  "gbs": 4, "mbs": 1, "tp": 4, "dp": 1, "pp": 2, "partition": "1-3",
  "node_order": ["small[0]", "small[1]", "big[0]"] }
JSON
  run 0 partita estimate in-plan.json
  expect_in out.txt "8 GPUs"
  run 0 partita exec in-plan.json --data in-corpus --backend cpu --iters 2 -o run.json
  expect_in out.txt "8 ranks (pp 2 x dp 1 x tp 4)"
  run 0 partita report in-plan.json run.json -o report
  # the planner searches this cluster too (its tp 4 tasks: test_search_tree)
  python3 -c "import json; p = json.load(open('in-plan.json')); json.dump(p['cluster'], open('in-cluster.json', 'w')); json.dump(p['model'], open('in-model.json', 'w'))"
  run 0 partita plan --model in-model.json --cluster in-cluster.json --gbs 4 --quiet -o plan.json
  expect_in out.txt "of 88 tasks"
  run 0 partita estimate plan.json
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"

