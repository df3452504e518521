#!/usr/bin/env bash
# End-to-end cases of issue 33 ("Bad input and faults, second round"):
# each refusal is one line naming the file and the reason, exit status 2,
# and loses nothing. usage: bad_input.sh PARTITA CASE (one meson test per
# case, e2e.sh's conventions; docs/reliability.md lists them).
set -u
# fail, run, expect_in, write_layout_plan; e2e_begin
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_begin "$@"
tiny="$source_root/docs/examples/plan-tiny-cpu.json"

one_line() {
  [ "$(wc -l <err.txt)" = 1 ] || fail "expected one line: $(cat err.txt)"
}
# same_bytes FILE COPY: FILE still holds what COPY saved
same_bytes() { cmp -s "$1" "$2" || fail "$1 changed"; }
prep_corpus() {
  partita prep "$source_root/data/corpus.txt" -o corpus >/dev/null \
    || fail "prep of the corpus failed"
}

case "$case_name" in
readers-bounded)
  # item 1: no reader reads without end or takes a failed read for the
  # end of its file; a line past the bound is refused at once
  run 2 partita prep /dev/zero -o zero
  expect_in err.txt "/dev/zero:1: the line is longer than"
  one_line
  run 2 partita prep --jsonl /dev/zero -o zero
  expect_in err.txt "/dev/zero:1: the line is longer than"
  [ ! -e zero.bin ] && [ ! -e zero.idx ] || fail "prep left a dataset"
  run 2 partita report "$tiny" --megatron-log /dev/zero -o rep
  expect_in err.txt "/dev/zero:1: the line is longer than"
  one_line
  run 2 partita report "$tiny" --deepspeed-log /dev/zero -o rep
  expect_in err.txt "/dev/zero:1: the line is longer than"
  run 2 partita estimate /dev/zero
  expect_in err.txt "/dev/zero: larger than"
  # a read that fails in the middle (the kernel's EIO on /proc/self/mem)
  run 2 partita prep /proc/self/mem -o mem
  expect_in err.txt "/proc/self/mem: read error after line 0: Input/output error"
  run 2 partita report "$tiny" --megatron-log /proc/self/mem -o rep
  expect_in err.txt "/proc/self/mem: read error after line 0"
  run 2 partita estimate /proc/self/mem
  expect_in err.txt "/proc/self/mem: read error after 0 bytes"
  [ ! -e mem.bin ] && [ ! -e rep ] || fail "an output was left"
  ;;
output-is-input)
  # item 3: an output with an input's name replaced it silently
  prep_corpus
  cp "$tiny" p.json; cp p.json in-p.json
  run 2 partita exec p.json --data corpus --iters 2 -o p.json
  expect_in err.txt "p.json: the output is the plan it reads"
  one_line; same_bytes p.json in-p.json
  ln -s p.json link.json
  run 2 partita exec p.json --data corpus --iters 2 -o link.json
  expect_in err.txt "link.json: the output is the same file as the plan p.json"
  cp corpus.idx in-corpus.idx
  run 2 partita exec p.json --data corpus --iters 2 -o corpus.idx
  expect_in err.txt "corpus.idx: the output is the dataset it reads"
  same_bytes corpus.idx in-corpus.idx
  run 2 partita export p.json --to megatron -o p.json
  expect_in err.txt "the output is the plan it reads"
  run 2 partita estimate p.json -o p.json
  expect_in err.txt "the output is the plan it reads"
  same_bytes p.json in-p.json
  cp "$source_root/models/gpt2-124m.json" m.json; cp m.json in-m.json
  run 2 partita plan --model m.json --cluster h200x1 --gbs 8 --quiet -o m.json
  expect_in err.txt "m.json: the output is the model it reads"
  one_line; same_bytes m.json in-m.json
  cp "$source_root/data/corpus.txt" x.bin; cp x.bin in-x.bin
  run 2 partita prep x.bin -o x
  expect_in err.txt "x.bin: the output is the input it reads"
  same_bytes x.bin in-x.bin
  mkdir rep; cp p.json rep/trace.json
  run 2 partita report rep/trace.json -o rep
  expect_in err.txt "rep/trace.json: the output is the plan it reads"
  ;;
report-other-plan)
  # item 2: a run of a model twice as wide was compared with the plan,
  # since only tp, dp, pp, gbs and mbs were checked
  prep_corpus
  sed 's/"hidden": 64/"hidden": 128/' "$tiny" >o.json
  run 0 partita exec "$tiny" --data corpus --iters 3 -o run.json
  run 2 partita report o.json run.json --any-device -o rep
  expect_in err.txt "run.json: plan.model.hidden: the run's plan has 64, the plan being reported has 128"
  one_line
  [ ! -e rep ] || fail "a refused report wrote its folder"
  sed 's/"pp": 1/"pp": 1, "recompute": "full"/' "$tiny" >r.json
  run 2 partita report r.json run.json --any-device -o rep
  expect_in err.txt "plan.recompute"
  run 0 partita report "$tiny" run.json --any-device -o rep
  ;;
foreign-manifest)
  # item 4: a folder with another program's manifest.json was taken for
  # a checkpoint, and --overwrite replaced their file
  prep_corpus
  mkdir s; echo '{"name":"app"}' >s/manifest.json; cp s/manifest.json in-m.json
  run 2 partita exec "$tiny" --data corpus --iters 2 --save s
  expect_in err.txt "s/manifest.json: not a Partita checkpoint"
  one_line
  run 2 partita exec "$tiny" --data corpus --iters 2 --save s --overwrite
  expect_in err.txt "never saved into, even with --overwrite"
  run 2 partita exec "$tiny" --data corpus --iters 2 --load s
  expect_in err.txt "s/manifest.json: not a Partita checkpoint"
  same_bytes s/manifest.json in-m.json
  [ "$(ls s)" = manifest.json ] || fail "files were added to s: $(ls s)"
  ;;
two-runs-one-folder)
  # item 7: two runs saving into one folder removed each other's
  # unfinished generations; the second is now refused, naming the first
  prep_corpus
  # the binary itself (not the wrapper function), so $! is its process
  "$partita_binary" exec "$tiny" --data corpus --iters 1000000 \
    --log-interval 1 --save ckpt -o first.json >first.txt 2>&1 &
  first=$!
  # a failing check must not leave it training for a million iterations
  trap 'kill "$first" 2>/dev/null; rm -rf "$work"' EXIT
  trap 'exit 1' TERM INT
  # the first holds the lock before its first iteration is logged
  for _ in $(seq 1 1200); do
    grep -q '^iteration' first.txt && break
    kill -0 "$first" 2>/dev/null || { cat first.txt; fail "the first run ended"; }
    sleep 0.1
  done
  grep -q '^iteration' first.txt || fail "the first run logged no iteration"
  run 2 partita exec "$tiny" --data corpus --iters 3 --save ckpt -o second.json
  expect_in err.txt "ckpt: process $first (partita-exec) is saving checkpoints into this folder"
  one_line
  run 2 partita exec "$tiny" --data corpus --iters 3 --save ckpt --overwrite
  expect_in err.txt "is saving checkpoints into this folder"
  [ ! -e second.json ] || fail "the refused run wrote run.json"
  kill -TERM "$first"
  wait "$first"
  [ $? = 143 ] || fail "the first run did not stop on SIGTERM as usual"
  # the lock went with its process: the folder resumes and saves again
  last=$(python3 -c 'import json; print(json.load(open("first.json"))["training"]["last_checkpoint_iteration"])')
  run 0 partita exec "$tiny" --data corpus --iters $((last + 1)) --load ckpt --save ckpt -o third.json
  # the folders a lock made go with a run refused before saving
  run 2 partita exec "$tiny" --data missing --iters 2 --save new/deeper/ckpt
  [ ! -e new ] || fail "a refused run left the folders of its lock"
  ;;
inconsistent-checkpoint)
  # item 8: every CRC right, the parts in disagreement: optimizer_steps
  # set to 0 resumed iteration 4's weights as iteration 1
  prep_corpus
  run 0 partita exec "$tiny" --data corpus --iters 4 --save ckpt -o first.json
  cp -r ckpt in-good
  # edit BLOB at OFFSET to the little-endian VALUE, then fix its CRC in
  # both manifests, as a careful hand (or a blob of another save) would
  edit_blob() { # BLOB OFFSET VALUE
    rm -rf ckpt; cp -r in-good ckpt
    python3 - "$@" <<'PY'
import glob, json, struct, sys, zlib
blob, offset, value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gen = glob.glob("ckpt/gen-*")[0]
data = bytearray(open(f"{gen}/{blob}", "rb").read())
data[offset:offset + 8] = struct.pack("<Q", value)
open(f"{gen}/{blob}", "wb").write(data)
for manifest in ("ckpt/manifest.json", f"{gen}/generation.json"):
    m = json.load(open(manifest))
    for b in m["blobs"]:
        if b["name"] == blob:
            b["crc32"] = "%08x" % zlib.crc32(bytes(data))
    json.dump(m, open(manifest, "w"), indent=2)
PY
  }
  edit_blob optimizer_steps 0 0
  run 2 partita exec "$tiny" --data corpus --iters 6 --load ckpt -o second.json
  expect_in err.txt "ckpt: the checkpoint disagrees with itself: meta.json: iteration is 4, but optimizer_steps holds 0"
  one_line
  [ ! -e second.json ] || fail "a refused resume wrote run.json"
  edit_blob rng 0 7
  run 2 partita exec "$tiny" --data corpus --iters 6 --load ckpt
  expect_in err.txt "meta.json: seed is [0-9]*, but rng holds 7"
  # the data position's epoch (bytes 8-15 after the 8-byte tag)
  edit_blob data_position 8 1
  run 2 partita exec "$tiny" --data corpus --iters 6 --load ckpt
  expect_in err.txt "data_position: epoch 1, sample 32, but 4 optimizer steps of 8 samples end at epoch 0, sample 32"
  one_line
  rm -rf ckpt; cp -r in-good ckpt
  run 0 partita exec "$tiny" --data corpus --iters 6 --load ckpt -o third.json
  expect_in third.json '"first_iteration": 5'
  ;;
messages)
  # item 9: what the messages said wrong
  sed 's/"name": "box"/"name": "béx"/' "$tiny" >bx.json
  run 2 partita estimate bx.json
  expect_in err.txt "node name \"béx\" may hold only .* found 'é'"
  # a GPU without a profile in an inline cluster: the plan is named, and
  # the folder looked in is said for what it is
  sed 's/"A100-FASOP"/"NOPROF"/' "$tiny" >np.json
  run 2 partita estimate np.json
  expect_in err.txt "partita estimate: np.json: .*no profile for GPU \"NOPROF\".*(beside the folder of the file holding the cluster)"
  # a directory where a file is expected
  mkdir lg
  run 2 partita report "$tiny" --megatron-log lg -o rep
  expect_in err.txt "lg: is a directory, not a file"
  prep_corpus
  run 0 partita exec "$tiny" --data corpus --iters 2 --save ckpt -o run.json
  gen=$(ls -d ckpt/gen-*)
  cp -r ckpt in-ckpt
  rm "$gen/adam_v"; mkdir "$gen/adam_v"
  run 2 partita exec "$tiny" --data corpus --iters 3 --load ckpt
  expect_in err.txt "$gen/adam_v: is a directory, not the blob the manifest records"
  one_line
  rm -rf ckpt; cp -r in-ckpt ckpt
  rm "$gen/generation.json"
  run 2 partita exec "$tiny" --data corpus --iters 3 --load "$gen"
  expect_in err.txt "$gen: no generation.json: this generation was not committed"
  # a full standard output: the reason, and the exit status the help
  # promises for an output that cannot be written
  partita export "$tiny" --to megatron >/dev/full 2>err.txt
  status=$?
  [ "$status" = 2 ] || fail "export onto a full standard output: exit $status"
  expect_in err.txt "standard output: write failed: No space left on device"
  # a run.json with an iteration twice, as a Megatron log with one is
  python3 - <<'PY'
import json
run = json.load(open("run.json"))
run["iterations"][1]["iteration"] = run["iterations"][0]["iteration"]
json.dump(run, open("twice.json", "w"))
PY
  run 2 partita report "$tiny" twice.json --any-device -o rep
  expect_in err.txt "twice.json: iterations\[1\].iteration: 1 after iteration 1: iterations must increase"
  one_line
  # a disk too full for the charts: said so, exit 2, rather than a
  # warning that blames gnuplot (a stand-in gnuplot meets the full disk)
  printf '#!/bin/sh\necho "charts.gp, line 9: cannot write step_time.png: No space left on device" >&2\nexit 1\n' >in-full.sh
  chmod +x in-full.sh
  PARTITA_GNUPLOT="$work/in-full.sh" run 2 partita report "$tiny" -o full
  expect_in err.txt "full: no space left on the disk: the charts could not be written"
  one_line
  [ ! -e full/report.md ] || fail "report.md written beside charts that failed"
  ;;
grad-precision-cuda)
  # issue 34: what llm.c's recipe (bf16 gradients) does not run on the
  # cuda backend is refused in one line before anything is allocated,
  # in any build (the check precedes the backend's)
  prep_corpus
  bf16=', "precision": "bf16", "grad_precision": "bf16"'
  write_layout_plan zero2.json 2 1 2 1 "$bf16, \"zero\": 2"
  run 2 partita exec zero2.json --data corpus --backend cuda --iters 1
  expect_in err.txt "grad_precision bf16 on the cuda backend: zero 2 is not supported"
  one_line
  write_layout_plan offload.json 2 1 1 1 "$bf16, \"offload_optimizer\": true"
  run 2 partita exec offload.json --data corpus --backend cuda --iters 1
  expect_in err.txt "grad_precision bf16 on the cuda backend: offload_optimizer is not supported"
  one_line
  write_layout_plan dp2.json 2 1 2 1 "$bf16"
  run 2 partita exec dp2.json --data corpus --backend cuda --iters 1 \
    --gpu-comm host
  expect_in err.txt "grad_precision bf16 on the cuda backend: --gpu-comm host sums fp32 only"
  one_line
  # the cpu reference runs the recipe under ZeRO-2 (its rounding of fp32)
  run 0 partita exec zero2.json --data corpus --iters 1 -o zero2.run.json
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
exit 0
