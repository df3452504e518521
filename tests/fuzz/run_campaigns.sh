#!/bin/sh
# Builds the fuzz harnesses with clang's libFuzzer (plus ASan and UBSan)
# and runs campaigns that grow the saved corpora. Not part of `make test`,
# which only replays tests/fuzz/corpus/ (suite fuzz-replay).
#
#   tests/fuzz/run_campaigns.sh [-t SECONDS] [-j PARALLEL] [-b] [HARNESS...]
#
#   -t  seconds per harness (libFuzzer -max_total_time), default 600
#   -j  harnesses run at once, default 2
#   -b  build only
#   -m  merge only: minimise the saved corpus with what new/ holds
#   HARNESS  model cluster profile plan partition estimate idx checkpoint
#            run train_log line_reader prep (default all)
#
# Work goes to $FUZZ_WORK (default /tmp/partita-fuzz): bin/ (binaries),
# new/<harness>/ (inputs found), crashes/<harness>/, logs/<harness>.log.
# At the end each harness's saved corpus is minimised in place with
# -merge=1 -use_counters=0 over saved + new inputs (one input per newly
# covered edge, not per hit-count bucket, which keeps a few dozen files
# per harness); seed-* and crash-* files are always kept; crashes are left in crashes/ for a
# person to fix and then copy into the corpus as regression inputs.
set -eu

SECONDS_PER_HARNESS=600
PARALLEL=2
BUILD_ONLY=0
MERGE_ONLY=0
while getopts t:j:bm option; do
  case $option in
    t) SECONDS_PER_HARNESS=$OPTARG ;;
    j) PARALLEL=$OPTARG ;;
    b) BUILD_ONLY=1 ;;
    m) MERGE_ONLY=1 ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${FUZZ_WORK:-/tmp/partita-fuzz}
CC=${CC_FUZZ:-clang}
HARNESSES=${*:-model cluster profile plan partition estimate idx checkpoint run train_log line_reader prep}
# The harnesses' scratch directories go under $WORK/tmp: libFuzzer ends a
# campaign without running atexit handlers, so they are not removed.
mkdir -p "$WORK/bin" "$WORK/logs" "$WORK/tmp"
export TMPDIR="$WORK/tmp"

# The library sources each harness needs (the fuzzer instruments them).
COMMON_SOURCES="$ROOT/common/errors.c $ROOT/common/units.c
  $ROOT/common/json_check.c $ROOT/common/model.c $ROOT/common/cluster.c
  $ROOT/common/profile.c $ROOT/common/plan.c $ROOT/common/clock.c
  $ROOT/common/atomic_file.c $ROOT/common/run_json.c $ROOT/common/json_write.c
  $ROOT/common/file_reader.c $ROOT/common/memory_terms.c"
sources_of() {
  case $1 in
    estimate) echo "$COMMON_SOURCES $ROOT/costmodel/*.c" ;;
    idx) echo "$COMMON_SOURCES $ROOT/executor/data/dataset.c" ;;
    prep) echo "$COMMON_SOURCES $ROOT/executor/data/dataset.c $ROOT/executor/data/prep.c" ;;
    checkpoint) echo "$COMMON_SOURCES $ROOT/executor/run/checkpoint_store.c" ;;
    run) echo "$COMMON_SOURCES $ROOT/costmodel/*.c $ROOT/report/run_record.c $ROOT/report/compare.c" ;;
    train_log) echo "$COMMON_SOURCES $ROOT/costmodel/*.c $ROOT/report/run_record.c $ROOT/report/train_log.c $ROOT/report/megatron_log.c $ROOT/report/deepspeed_log.c" ;;
    *) echo "$COMMON_SOURCES" ;;
  esac
}

for harness in $HARNESSES; do
  [ "$MERGE_ONLY" = 1 ] && break
  echo "building fuzz_$harness"
  # jansson is linked statically so the binary runs on a machine without
  # libjansson (campaigns may run on another host).
  # shellcheck disable=SC2046
  "$CC" -std=c17 -g -O1 -D_GNU_SOURCE -I"$ROOT" \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -DFUZZ_PROFILE_DIR="\"${FUZZ_PROFILE_DIR:-$ROOT/profiles}\"" \
    "$HERE/fuzz_$harness.c" "$HERE/support.c" $(sources_of "$harness") \
    "$ROOT/tests/fault_injection.c" -Wl,--wrap=read,--wrap=rename \
    -Wl,-Bstatic -ljansson -Wl,-Bdynamic -lm -lpthread \
    -o "$WORK/bin/fuzz_$harness"
done
[ "$BUILD_ONLY" = 1 ] && exit 0

run_one() {
  harness=$1
  mkdir -p "$WORK/new/$harness" "$WORK/crashes/$harness"
  # -timeout: an input slower than 10 s is reported as a hang.
  # -rss_limit_mb: the readers must not balloon on small inputs.
  "$WORK/bin/fuzz_$harness" "$WORK/new/$harness" "$HERE/corpus/$harness" \
    -max_total_time="$SECONDS_PER_HARNESS" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$WORK/crashes/$harness/" \
    >"$WORK/logs/$harness.log" 2>&1 || true
  echo "fuzz_$harness finished: $(grep -E '^stat::number_of_executed_units' \
    "$WORK/logs/$harness.log" || echo 'no final stats (crash?)')"
}

running=0
for harness in $HARNESSES; do
  [ "$MERGE_ONLY" = 1 ] && break
  run_one "$harness" &
  running=$((running + 1))
  if [ "$running" -ge "$PARALLEL" ]; then
    wait
    running=0
  fi
done
wait

for harness in $HARNESSES; do
  merged="$WORK/merged/$harness"
  rm -rf "$merged"
  mkdir -p "$merged"
  mkdir -p "$WORK/new/$harness"
  "$WORK/bin/fuzz_$harness" -merge=1 -use_counters=0 "$merged" "$HERE/corpus/$harness" \
    "$WORK/new/$harness" >"$WORK/logs/$harness.merge.log" 2>&1
  # Seeds keep their names; new entries keep libFuzzer's hash names.
  for file in "$HERE/corpus/$harness"/*; do
    name=$(basename "$file")
    case $name in
      seed-*|crash-*) ;;
      *) rm -f "$file" ;;
    esac
  done
  for file in "$merged"/*; do
    [ -e "$file" ] || continue
    sum=$(sha1sum "$file" | cut -c1-40)
    if ! cmp -s "$file" "$HERE/corpus/$harness/$(basename "$file")" &&
       ! ls "$HERE/corpus/$harness"/seed-* "$HERE/corpus/$harness"/crash-* \
           2>/dev/null | xargs -r sha1sum | grep -q "^$sum"; then
      cp "$file" "$HERE/corpus/$harness/$sum"
    fi
  done
  echo "corpus/$harness: $(ls "$HERE/corpus/$harness" | wc -l) files"
done
