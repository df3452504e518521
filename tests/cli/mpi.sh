#!/usr/bin/env bash
# partita exec with one process per rank under mpirun, against the
# threads launch of the same plans (e2e.sh's exec-pp2 and exec-tp2).
# usage: mpi.sh PARTITA CASE MPI_BUILT(yes|no)   (run by meson)
# Exit 77 (skipped) when this partita has no MPI or mpirun is missing.
set -u
partita="$1"
case_name="$2"
[ "${3:-no}" = yes ] || { echo "SKIP: partita built without MPI"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
source_root="${PARTITA_SOURCE:?PARTITA_SOURCE must be set}"
work=$(mktemp -d)
mpirun_pid=""
cleanup() {
  [ -n "$mpirun_pid" ] && kill -9 "$mpirun_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 1

# Open MPI inside containers and CI: shared memory without the ptrace
# single copy, more processes than cores, root allowed; MPI's own
# allocations are not ours to leak-check.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# fail, run, expect_in, write_layout_plan, write_gpus_plan, same_losses
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mpi() { # N ARGS...: partita under mpirun with N processes
  local count="$1"; shift
  timeout 120 mpirun --oversubscribe -np "$count" "$partita" "$@"
}

"$partita" prep "$source_root/data/corpus.txt" -o in-corpus >/dev/null ||
  fail "prep of the corpus failed"


# run.json holds every rank's events and device.
every_rank_recorded() { # RUN_JSON RANKS
  python3 - "$1" "$2" <<'PY' || fail "$1 does not hold every rank"
import json, sys
run = json.load(open(sys.argv[1])); ranks = int(sys.argv[2])
event_ranks = {e["rank"] for e in run["events"]}
assert event_ranks == set(range(ranks)), event_ranks
assert len(run["devices"]) == ranks, run["devices"]
PY
}

# Threads and processes on one plan: same losses, every rank in run.json.
compare_launches() { # PLAN RANKS ITERS
  run 0 "$partita" exec "$1" --data in-corpus --iters "$3" \
    --log-interval 1 --save ckpt-threads -o run-threads.json
  cp out.txt threads.log
  run 0 mpi "$2" exec "$1" --data in-corpus --iters "$3" --log-interval 1 \
    --save ckpt-mpi -o run-mpi.json
  cp out.txt mpi.log
  expect_in mpi.log "ran as $2 processes (MPI)"
  same_losses threads.log mpi.log
  every_rank_recorded run-mpi.json "$2"
  for blob in ckpt-threads/gen-*/*.rank*; do
    [ -f ckpt-mpi/gen-*/"$(basename "$blob")" ] ||
      fail "the checkpoint of the processes lacks $(basename "$blob")"
  done
}

# Starts a long run in the background, waits for its first log line and
# returns the pid of rank $1's process in rank_pid.
start_long_run() { # RANK
  mpi 2 exec in-pp2.json --data in-corpus --iters 1000000 --log-interval 1 \
    --comm-timeout 3 -o run.json >out.txt 2>err.txt &
  mpirun_pid=$!
  for _ in $(seq 300); do
    grep -q '^iteration' out.txt 2>/dev/null && break
    sleep 0.1
  done
  # the rank's process: a partita of this directory with that MPI rank
  rank_pid=""
  local process
  for process in $(pgrep -f -- "$partita exec in-pp2.json"); do
    [ "$(readlink "/proc/$process/cwd")" = "$work" ] || continue
    if tr '\0' '\n' <"/proc/$process/environ" 2>/dev/null |
        grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      rank_pid=$process
    fi
  done
  [ -n "$rank_pid" ] || fail "no process of rank $1 found"
}

# Waits for the background run; it must end, failed, within limit_s.
expect_ended_within() { # LIMIT_S
  local started=$SECONDS
  while kill -0 "$mpirun_pid" 2>/dev/null; do
    [ $((SECONDS - started)) -le "$1" ] ||
      fail "the run did not end within $1 s"
    sleep 0.2
  done
  wait "$mpirun_pid" && fail "the run succeeded"
  mpirun_pid=""
}

write_layout_plan in-pp2.json 1 1 1 2 ', "partition": "3-1"'
case "$case_name" in
pp2)
  compare_launches in-pp2.json 2 4
  # every blob of the checkpoint is the same bytes as the threads run's
  # (the generation's copy of its manifest may list them in another order)
  for blob in ckpt-threads/gen-*/*; do
    [ "$(basename "$blob")" = generation.json ] && continue
    cmp -s "$blob" ckpt-mpi/gen-*/"$(basename "$blob")" ||
      fail "checkpoint blob $(basename "$blob") differs"
  done
  ;;
interleaved)
  # Megatron's interleaved 1F1B as processes: the threads launch's losses
  # and checkpoint, every chunk's blobs the same bytes
  write_layout_plan in-v2.json 1 1 2 2 ', "virtual_stages": 2'
  compare_launches in-v2.json 4 3
  expect_in ckpt-mpi/manifest.json 'params.rank3.chunk1'
  for blob in ckpt-threads/gen-*/*.rank*; do
    cmp -s "$blob" ckpt-mpi/gen-*/"$(basename "$blob")" ||
      fail "checkpoint blob $(basename "$blob") differs"
  done
  ;;
tp2)
  write_layout_plan in-tp2.json 1 2 1 2 ', "partition": "1-3"'
  compare_launches in-tp2.json 4 3
  ;;
dp2)
  write_layout_plan in-dp2.json 1 1 2 2 ', "partition": "2-2"'
  compare_launches in-dp2.json 4 3
  # resumed by the threads launch from the processes' checkpoint
  run 0 "$partita" exec in-dp2.json --data in-corpus --iters 5 \
    --log-interval 1 --load ckpt-mpi -o run-resumed.json
  expect_in out.txt "iteration        5/"
  ;;
dp2-zero1|dp2-zero3)
  # the distributed optimizer: MPI's reduce-scatter and all-gather; under
  # ZeRO-3 on the cpu backend the gradients and parameters held as each
  # rank's shard, every unit gathered and reduce-scattered over MPI. The
  # threads' losses and blobs; the replicated optimizer's losses too
  write_layout_plan in-dp2.json 1 1 2 2 ', "partition": "2-2"'
  zero=', "distributed_optimizer": true'
  [ "$case_name" = dp2-zero3 ] && zero=', "zero": 3'
  write_layout_plan in-zero.json 1 1 2 2 ", \"partition\": \"2-2\"$zero"
  compare_launches in-zero.json 4 3
  run 0 "$partita" exec in-dp2.json --data in-corpus --iters 3 \
    --log-interval 1 -o run-plain.json
  cp out.txt plain.log
  same_losses plain.log mpi.log
  # the processes' checkpoint lists each shard at its size: it loads
  run 0 "$partita" exec in-zero.json --data in-corpus --iters 5 \
    --log-interval 1 --load ckpt-mpi -o run-resumed.json
  expect_in out.txt "iteration        5/"
  ;;
asymmetric|asymmetric-zero1)
  # stages of their own degrees (issue 36): stage 0 tp 1 x dp 2, stage 1
  # tp 2 x dp 1 (each micro-batch's two samples merged, its activation
  # scattered over two shards) as processes, the threads launch's losses;
  # and the one-stage run's
  zero=""
  [ "$case_name" = asymmetric-zero1 ] && zero=', "distributed_optimizer": true'
  write_gpus_plan in-asym.json 4 1 1 2 2 \
    ", \"partition\": \"2-2\", \"stages\": [{}, {\"tp\": 2, \"dp\": 1}]$zero"
  compare_launches in-asym.json 4 3
  write_layout_plan in-one.json 1 1 1 1
  run 0 "$partita" exec in-one.json --data in-corpus --iters 3 \
    --log-interval 1 -o run-one.json
  cp out.txt one.log
  same_losses one.log mpi.log
  ;;
size-mismatch)
  run 2 mpi 3 exec in-pp2.json --data in-corpus --iters 2 -o run.json
  expect_in err.txt "3 processes were started"
  expect_in err.txt "= 2 ranks"
  [ ! -e run.json ] || fail "a refused run wrote run.json"
  ;;
rank-killed)
  start_long_run 1
  kill -9 "$rank_pid"
  expect_ended_within 10
  grep -q "rank 1" out.txt err.txt || { cat out.txt err.txt; fail "no message names rank 1"; }
  [ ! -e run.json ] || fail "a failed run wrote run.json"
  ;;
rank-silent)
  # a stopped process never answers: its peer's wait times out (3 s)
  start_long_run 1
  kill -STOP "$rank_pid"
  expect_ended_within 15
  kill -9 "$rank_pid" 2>/dev/null
  expect_in err.txt "timed out after 3 s"
  grep -q "rank 0: .*ranks 0, 1\|rank 0: .*rank 1" err.txt ||
    { cat err.txt; fail "the timeout does not name the silent rank"; }
  [ ! -e run.json ] || fail "a failed run wrote run.json"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok [$case_name]"
